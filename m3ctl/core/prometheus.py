"""Prometheus text pages (vLLM's ``/metrics``, a DCGM or AMD GPU exporter) read through ``prometheus_client``'s
parser: the one reader of the text exposition format in m3ctl (https://prometheus.io/docs/instrumenting/
exposition_formats/: a trailing timestamp, ``}`` or ``,`` inside a quoted label value, tabs between fields)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from m3ctl.catalog.lazy import lazy_module

if TYPE_CHECKING:
    from prometheus_client import parser
else:
    parser = lazy_module("prometheus_client.parser")  # imported by the first page read (~20 ms otherwise)


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a page as ``(name, labels, value)``. A line the parser refuses is skipped, the others kept
    (the page is read line by line when the whole does not parse)."""
    try:
        fams = list(parser.text_string_to_metric_families(text))
    except ValueError:
        fams = []
        for line in text.splitlines():
            try:
                fams += list(parser.text_string_to_metric_families(line + "\n"))
            except ValueError:
                continue
    return [(s.name, dict(s.labels), float(s.value)) for f in fams for s in f.samples]
