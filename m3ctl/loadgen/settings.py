"""The settings of one bench call (``m3ctl bench``, :func:`m3ctl.api.bench`), checked once: :class:`BenchSettings`.

:func:`check` turns a call's arguments into the run's :class:`~m3ctl.loadgen.config.BenchConfig` (each field's
type, default and bounds declared there), its sweep levels and its endpoint; every value is checked here, before
anything is sent (m3ctl.loadgen.inputs.validate for the combinations of options). m3ctl.loadgen.runner.run then
runs the settings without checking them again.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from m3ctl.errors import BadInput, first_error
from m3ctl.loadgen.config import BenchConfig, check_slo_sweep, check_trace_lengths
from m3ctl.loadgen.inputs import validate
from m3ctl.loadgen.slo import parse_slo
from m3ctl.loadgen.sweep import Level, check_lengths, plan
from m3ctl.loadgen.target import resolve_target


@dataclass
class BenchSettings:
    """A checked bench call.

    Attributes:
        cfg: the run's settings (a sweep's first level; each level replaces its lengths and concurrency).
        levels: the concurrency levels given (``[]``: none, ``[c]``: one run).
        input_lens, output_lens: the length lists of a length sweep, None when one length was given.
        slo: a concurrency sweep's SLO (m3ctl.loadgen.slo), ``""`` without one.
        sync_log: brings the deployment's server log up to date (m3ctl.loadgen.target.BenchTarget.sync_log).
        progress: called with each run's config, returns a context manager yielding its progress sink or None.
    """

    cfg: BenchConfig
    levels: list[int | None] = field(default_factory=list)
    input_lens: list[int] | None = None
    output_lens: list[int] | None = None
    slo: str = ""
    sync_log: Callable[[], None] | None = None
    progress: Callable[[BenchConfig], Any] | None = None

    @property
    def plan(self) -> list[Level]:
        """The levels this call runs (m3ctl.loadgen.sweep.plan); one level: a single run."""
        return plan(
            self.input_lens or [self.cfg.input_len], self.output_lens or [self.cfg.output_len], self.levels or [None]
        )


def _unknown(options: dict[str, Any]) -> None:
    """Raises BadInput naming the first option that is not a BenchConfig field (with a "did you mean")."""
    if unknown := sorted(set(options) - set(BenchConfig.model_fields)):
        close = difflib.get_close_matches(unknown[0], list(BenchConfig.model_fields), n=1)
        raise BadInput(
            f"unknown bench option {unknown[0]!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
            "see m3ctl.loadgen.runner.BenchConfig for the options and their units",
        )


def _levels(concurrency: int | Sequence[int] | None) -> list[int | None]:
    """The concurrency levels of a call. Raises BadInput for a value that is not an integer >= 1."""
    levels: list[int | None] = [concurrency] if isinstance(concurrency, int) else list(concurrency or [])
    if any(not isinstance(c, int) or c < 1 for c in levels):
        raise BadInput(f"bad concurrency {concurrency!r}: values must be integers >= 1", "e.g. concurrency=[1, 2, 4]")
    return levels


def _length_lists(options: dict[str, Any]) -> dict[str, list[int] | None]:
    """``{"input_lens", "output_lens"}``: the lists given as ``input_len`` / ``output_len`` (a length sweep; the
    option keeps the first value), None for a single length. Raises BadInput for an empty list, a length outside
    1..MAX_REQUEST_TOKENS, or lists with a trace."""
    lens: dict[str, list[int] | None] = {"input_lens": None, "output_lens": None}
    for key in ("input_len", "output_len"):
        if isinstance(options.get(key), list | tuple):
            vals = list(options.pop(key))
            if not vals:
                raise BadInput(f"bad {key} {vals!r}: give at least one length", f"e.g. {key}=[512, 4096]")
            check_lengths(key, vals)
            lens[f"{key}s"], options[key] = vals, vals[0]
    check_trace_lengths(bool(options.get("trace_path")), list(lens.values()))
    return lens


def check(
    url: str | None,
    deployment: str | None,
    model: str | None,
    concurrency: int | Sequence[int] | None,
    api_key: str | None,
    num_gpus: int | None,
    warmup: bool | None,
    options: dict[str, Any],
    slo: str = "",
    on_note: Callable[[str], None] | None = None,
    progress: Callable[[BenchConfig], Any] | None = None,
) -> BenchSettings:
    """The checked settings of a bench call (the arguments of :func:`m3ctl.api.bench`; ``options``: BenchConfig
    fields, ``input_len`` / ``output_len`` may be lists). The model id is asked of the server last, once every
    option is checked (several served names: the deployment's model, else the first listed; ``on_note`` gets the
    one line saying so, default: the ``m3ctl.bench`` logger).

    Raises:
        BadInput: an unknown option, a bad value (the first pydantic error as one line), a combination that
            cannot run (m3ctl.loadgen.inputs.validate), an SLO without a concurrency sweep; no endpoint, an
            unknown deployment, no model to pick (m3ctl.loadgen.target).
    """
    options = dict(options)
    _unknown(options)
    levels = _levels(concurrency)
    lens = _length_lists(options)
    if slo and slo.strip():
        parse_slo(slo)
        check_slo_sweep(slo, len(levels))
    # The options are checked before anything is sent: the model id is asked of the server afterwards.
    t = resolve_target(url, deployment=deployment, model=model, num_gpus=num_gpus, api_key=api_key, lookup_model=False)
    try:
        sweep = len(levels) > 1 or any(len(v or ()) > 1 for v in lens.values())
        cfg = BenchConfig(
            url=t.url,
            model=t.model or "?",
            concurrency=levels[0] if levels else None,
            warmup=sweep if warmup is None else warmup,
            model_dir=t.model_dir,
            server_log=t.server_log,
            num_gpus=t.num_gpus,
            num_gpus_source=t.num_gpus_source,
            api_key=t.api_key,
            auth_basic=t.basic_auth,
            deployment=t.deployment,
            **{"deployment_gpus": t.gpus, **options},
        )
    except ValidationError as e:
        err = first_error(e)
        raise BadInput(f"bad bench option {err}", "see m3ctl.loadgen.runner.BenchConfig") from None
    except TypeError as e:
        raise BadInput(f"bad bench option: {e}", "see m3ctl.loadgen.runner.BenchConfig") from None
    validate(cfg)
    if not t.model:  # several served names: the deployment's model, else the first listed (logged)
        picked, note = t.pick_model()
        cfg = cfg.model_copy(update={"model": picked})
        if note and on_note is not None:
            on_note(note)
        elif note:
            logging.getLogger("m3ctl.bench").info(note)
    return BenchSettings(cfg, levels, lens["input_lens"], lens["output_lens"], slo, t.sync_log, progress)
