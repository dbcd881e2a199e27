"""Server-side deltas from vLLM's Prometheus ``/metrics``, scraped before and after a run.

Series (vLLM V1 metrics, https://docs.vllm.ai/en/latest/design/metrics.html and
https://docs.vllm.ai/en/latest/usage/metrics.html; observed on vLLM 0.32 CPU, docs/sources.md#cpu-endpoints-and-metrics):
``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` (tokens),
``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
``vllm:spec_decode_num_accepted_tokens_total``, ``vllm:num_preemptions_total``,
``vllm:request_queue_time_seconds`` (histogram ``_sum``/``_count``), ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``. Values are summed over label sets (engines, models).

Derived (vLLM's definitions, vllm/v1/spec_decode/metrics.py): acceptance rate =
accepted / draft tokens; mean acceptance length = 1 + accepted / drafts; per-position acceptance rate =
``vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`` / drafts.

``vllm:cache_config_info`` (a gauge whose labels are the engine's CacheConfig, vllm/v1/metrics/loggers.py
``log_metrics_info``) gives the KV-cache ``block_size`` and whether prefix caching is on.

During the measured phase the gauges ``vllm:num_requests_waiting`` / ``vllm:num_requests_running`` are sampled
(:class:`QueueSampler`), and :func:`queue_trend` says whether the waiting queue grew (a sweep's early stop).
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING

from m3ctl.catalog.lazy import lazy_module
from m3ctl.core.prometheus import samples

if TYPE_CHECKING:
    import httpx
    import numpy as np
else:
    httpx = lazy_module("httpx")
    np = lazy_module("numpy")

SERIES = (
    "prefix_cache_hits_total",
    "prefix_cache_queries_total",
    "spec_decode_num_drafts_total",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
    "num_preemptions_total",
    "request_queue_time_seconds_sum",
    "request_queue_time_seconds_count",
    "prompt_tokens_total",
    "generation_tokens_total",
    "request_success_total",
)


PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"


def parse(text: str) -> dict[str, float]:
    """Sum of each ``vllm:`` series in :data:`SERIES` over its label sets; the per-position accepted tokens
    as ``spec_decode_num_accepted_tokens_per_pos_total[i]`` (summed over the other labels)."""
    out: dict[str, float] = {}
    for full, labels, v in samples(text):
        if not full.startswith("vllm:") or math.isnan(v):
            continue
        name = full[5:]
        if name == PER_POS and "position" in labels:
            name = f"{PER_POS}[{labels['position']}]"
        elif name not in SERIES:
            continue
        out[name] = out.get(name, 0.0) + v
    return out


def cache_config(text: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` (e.g. ``block_size``, ``enable_prefix_caching``); {} if absent."""
    return next((labels for name, labels, _ in samples(text) if name == "vllm:cache_config_info"), {})


def block_size(url: str, headers: dict[str, str] | None = None) -> int | None:
    """The server's KV-cache block size (tokens) from ``/metrics``, or None when it does not say."""
    try:
        r = httpx.get(f"{url}/metrics", headers=headers or {}, timeout=10.0)
    except httpx.HTTPError:
        return None
    v = cache_config(r.text).get("block_size") if r.status_code == 200 else None
    return int(v) if v and v.isdigit() else None


def scrape(url: str, headers: dict[str, str] | None = None) -> dict[str, float] | None:
    """Parsed ``GET {url}/metrics``, or None when the server has no vLLM metrics."""
    try:
        r = httpx.get(f"{url}/metrics", headers=headers or {}, timeout=10.0)
    except httpx.HTTPError:
        return None
    if r.status_code != 200 or "vllm:" not in r.text:
        return None
    return parse(r.text)


def deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """The ``server_metrics`` result block: counters' changes over the run and what follows from them."""
    if before is None or after is None:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in (*SERIES, *after) if k in after}
    q = d.get("prefix_cache_queries_total", 0.0)
    drafts = d.get("spec_decode_num_drafts_total", 0.0)
    dtoks = d.get("spec_decode_num_draft_tokens_total", 0.0)
    acc = d.get("spec_decode_num_accepted_tokens_total", 0.0)
    qn = d.get("request_queue_time_seconds_count", 0.0)
    return {
        "source": "GET /metrics before and after the measured run (vLLM Prometheus counters)",
        "prefix_cache_hit_rate": d.get("prefix_cache_hits_total", 0.0) / q if q else None,
        "prefix_cache_queried_tokens": int(q),
        "spec_decode_acceptance_rate": acc / dtoks if dtoks else None,
        "spec_decode_acceptance_length": 1 + acc / drafts if drafts else None,
        "spec_decode_drafts": int(drafts),
        "spec_decode_acceptance_per_position": [
            d[f"{PER_POS}[{i}]"] / drafts for i in range(sum(1 for k in d if k.startswith(PER_POS)))
        ]
        if drafts and f"{PER_POS}[0]" in d
        else None,
        "preemptions": int(d.get("num_preemptions_total", 0.0)),
        "mean_queue_time_ms": 1000 * d.get("request_queue_time_seconds_sum", 0.0) / qn if qn else None,
        "prompt_tokens": int(d.get("prompt_tokens_total", 0.0)),
        "generation_tokens": int(d.get("generation_tokens_total", 0.0)),
        "requests_finished": int(d.get("request_success_total", 0.0)),
    }


# ---- the server's queue during the run (sweep early stop: m3ctl.loadgen.sweep) ----
#: vLLM's scheduler gauges (https://docs.vllm.ai/en/latest/usage/metrics.html): requests waiting to be scheduled
#: and requests running (in the batch); summed over engines.
GAUGES = ("num_requests_waiting", "num_requests_running")
#: Fewest samples inside the issuing window for a trend.
QUEUE_MIN_SAMPLES = 4
#: The queue "grows" when its last third's mean is above its first third's by at least this fraction of the
#: reference (the level's concurrency; uncapped: the most requests seen running), and at least 1 request ...
QUEUE_RISE_FRACTION = 0.25
#: ... and it ends (its last sample in the window) at or above this fraction of the reference.
QUEUE_END_FRACTION = 0.5


def gauges(text: str) -> dict[str, float]:
    """The :data:`GAUGES` in a ``/metrics`` text, each summed over its label sets (absent: not in the dict)."""
    out: dict[str, float] = {}
    for full, _, v in samples(text):
        name = full[5:] if full.startswith("vllm:") else ""
        if name in GAUGES:
            out[name] = out.get(name, 0.0) + v
    return out


class QueueSampler:
    """Samples the server's :data:`GAUGES` every ``period_s`` in a daemon thread (``GET /metrics``) from
    :meth:`start` to :meth:`stop`; ``samples``: ``(perf_counter time, waiting, running or None)``, the time
    taken when the answer arrived. A sample without ``vllm:num_requests_waiting`` (not vLLM) is left out."""

    def __init__(self, url: str, headers: dict[str, str] | None, period_s: float = 1.0):
        self.url, self.headers, self.period_s = url, headers or {}, period_s
        self.samples: list[tuple[float, float, float | None]] = []
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> QueueSampler:
        self._stop = stop = threading.Event()
        # The client is built here, before the measured phase: building one loads the TLS trust store (tens of
        # ms holding the GIL), which inside the run stalled the bench's event loop (client-saturation verdict).
        client = httpx.Client(headers=self.headers, timeout=max(1.0, 5 * self.period_s))
        self._thread = threading.Thread(target=self._run, args=(client, stop), name="m3ctl-bench-queue", daemon=True)
        self._thread.start()
        return self

    def _run(self, client: httpx.Client, stop: threading.Event) -> None:
        with client as c:
            while not stop.is_set():
                try:
                    r = c.get(f"{self.url}/metrics")
                    g = gauges(r.text) if r.status_code == 200 else {}
                except httpx.HTTPError:
                    g = {}
                if "num_requests_waiting" in g:
                    self.samples.append((time.perf_counter(), g["num_requests_waiting"], g.get("num_requests_running")))
                stop.wait(self.period_s)

    def stop(self) -> list[tuple[float, float, float | None]]:
        if self._stop is not None:
            self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return self.samples


def queue_trend(
    samples: list[tuple[float, float, float | None]], start: float, end: float, concurrency: int | None, period_s: float
) -> dict:
    """The result's ``server_queue`` block: did the server's waiting queue grow while the run issued requests?

    The window is ``start``..``end`` (perf_counter s: the first and the last send, so the drain after the last
    send does not count). ``growing``: at least :data:`QUEUE_MIN_SAMPLES` samples in it, a positive
    least-squares slope, the last third's mean above the first third's by max(1, QUEUE_RISE_FRACTION x
    reference), and the last sample at or above QUEUE_END_FRACTION x reference; the reference is
    ``concurrency``, or for an uncapped load the most requests seen running (at least 1). None: too few
    samples to say. ``samples`` (all of the run's, ``[s from start, waiting, running]``) are kept.
    """
    rel = [[round(t - start, 4), w, r] for t, w, r in samples]
    inside = [(t, w, r) for t, w, r in samples if start <= t <= end]
    out: dict = {
        "source": f"GET /metrics vllm:num_requests_waiting / _running every {period_s:g} s",
        "period_s": period_s,
        "window_s": round(end - start, 4),
        "samples": rel,
        "samples_in_window": len(inside),
        "slope_per_s": None,
        "waiting_first_third": None,
        "waiting_last_third": None,
        "waiting_end": None,
        "reference": None,
        "growing": None,
    }
    if len(inside) < QUEUE_MIN_SAMPLES:
        return out
    ts = [t for t, _, _ in inside]
    ws = [w for _, w, _ in inside]
    k = len(ws) // 3
    first, last = sum(ws[:k]) / k, sum(ws[-k:]) / k
    slope = 0.0
    if max(ts) > min(ts):
        slope = float(np.polyfit(ts, ws, 1)[0])
    ref = float(concurrency) if concurrency else max([1.0, *(r for _, _, r in samples if r is not None)])
    growing = slope > 0 and last - first >= max(1.0, QUEUE_RISE_FRACTION * ref) and ws[-1] >= QUEUE_END_FRACTION * ref
    out.update(
        slope_per_s=slope,
        waiting_first_third=first,
        waiting_last_third=last,
        waiting_end=ws[-1],
        reference=ref,
        growing=growing,
    )
    return out
