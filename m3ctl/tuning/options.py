"""The settings of a tune study, declared once: :class:`TuneOptions`. Each field holds its type, default, help
(``description``) and, in ``json_schema_extra``, the rest of what it is: ``cli`` (how ``m3ctl tune`` spells it:
``name``, ``decls``, the parse-time ``parser`` by name, ``min``/``max``, ``metavar``, ``unset`` (default None on
the command line so that only a given value counts), ``type``/``show`` for a comma list; no ``cli``: not a
``m3ctl tune`` option), ``saved`` (where ``tune.json`` keeps it: ``spec``, the search's settings read by
:class:`TuneSpec`; ``bench``, the options of every measurement; ``top``; ``plan_base``; none: it shapes the space
only; ``key``: its name there when it differs; ``omit_default``: left out at its default, as older studies saved
it; ``spec_default``: what a ``spec`` saved before the field existed means, where it is not the default) and
``resume`` (``--resume`` takes it again; the others are the saved study's); ``bound`` (:func:`_bound`): the range a
value must be in, checked by :func:`check_bounds` for the API and the CLI alike and, as the option's ``min``/``max``,
at parse time.

Derived from it: ``m3ctl tune``'s options (m3ctl.cli.options.declared_options), ``m3ctl.api.tune(model,
options=None, **overrides)`` (an override is a field, checked against its type), a new study's saved settings
(m3ctl.tuning.settings.new_settings: :func:`saved_fields`), the search's view :class:`TuneSpec` (its saved
fields are the ``spec`` ones) and :data:`RESUME_OPTIONS`. A new knob is one field here (plus its use where it acts).
Values are checked by the study (m3ctl.tuning.settings.check_options: one BadInput line naming the option, the
ranges from the fields' ``bound``), not by pydantic, whose messages are not the study's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from m3ctl.errors import BadInput, plain_text
from m3ctl.loadgen import MAX_REQUEST_TOKENS
from m3ctl.loadgen.config import (
    MAX_PROMPTS,
    PRECISION_MAX,
    PRECISION_MAX_DURATION_S,
    PRECISION_RANGE,
    STEADY_WAVES,
    parse_precision,
)

#: The default run of a tune measurement, in waves of its concurrency: the bench's default run length
#: (m3ctl.loadgen.config.RUN_LENGTH_RULE: one wave of ramp-up, STEADY_WAVES of steady state, one of drain).
RUN_WAVES: Final = STEADY_WAVES + 2

#: Version of the :class:`TuneOptions` schema.
SCHEMA_VERSION: Final = 1


def _bound(
    lo: float,
    hi: float | None = None,
    *,
    above: bool = False,
    finite: bool = False,
    what: str = "",
    fmt: str = "r",
) -> dict[str, Any]:
    """The range of a number option: from ``lo`` (excluded when ``above``) to ``hi``; ``finite``: no infinity; ``what``
    the message's end (default: "a whole number from LO to HI" / "a whole number >= LO"); ``fmt`` how the value is
    shown in it (``r``: repr, ``g``). None is always in range (the option's "not given"); a bound with the default
    message takes a whole number only (``whole``: an int, not a bool)."""
    whole = not what
    if whole:
        what = f"a whole number from {lo:,} to {hi:,}" if hi is not None else f"a whole number >= {lo:,}"
    return {"lo": lo, "hi": hi, "above": above, "finite": finite, "what": what, "fmt": fmt, "whole": whole}


def _opt(
    default: Any = None,
    help: str = "",
    *,
    cli: dict[str, Any] | None = None,
    saved: str = "",
    bound: dict[str, Any] | None = None,
    **more: Any,
) -> Any:
    """A TuneOptions field: ``default`` (a list or dict: a fresh copy each time), ``help``, its ``cli`` spelling
    (None: not a CLI option), where ``tune.json`` keeps it (``saved``), its range (``bound``: :func:`_bound`; also the
    CLI option's ``min``/``max`` unless a parser checks it) and any other fact (``resume=True``)."""
    extra: dict[str, Any] = {"saved": saved, **more}
    if bound is not None:
        extra["bound"] = bound
        if cli is not None and "parser" not in cli and not bound["above"]:
            cli = {"min": bound["lo"], **({"max": bound["hi"]} if bound["hi"] is not None else {}), **cli}
    if cli is not None:
        extra["cli"] = cli
    if isinstance(default, list | dict):
        return Field(default_factory=lambda: type(default)(default), description=help, json_schema_extra=extra)
    return Field(default, description=help, json_schema_extra=extra)


class TuneOptions(BaseModel):
    """What a new study measures and how (the ``m3ctl tune`` options other than where the study lives, the
    host and the output)."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1] = SCHEMA_VERSION
    slo: str = _opt(
        "",
        'SLO over bench result keys, e.g. "p90_tpot_ms<=20,p90_ttft_ms<=2000" ("" = none).',
        cli={"parser": "slo"},
        saved="spec",
    )
    objective: Literal["tput_per_gpu", "output_tput_per_gpu", "tokens_per_usd"] = _opt(
        "tput_per_gpu",
        "tput_per_gpu, output_tput_per_gpu or tokens_per_usd (needs --usd-per-gpu-hour).",
        cli={},
        saved="spec",
    )
    usd_per_gpu_hour: float | None = _opt(
        None,
        "GPU price (USD per GPU-hour) for USD per million tokens and tokens per USD.",
        cli={"parser": "positive_float", "metavar": "USD"},
        saved="spec bench",
        bound=_bound(0, above=True, finite=True, what="USD > 0"),
    )
    knobs: list[str] = _opt(
        [],
        "Pin or narrow a knob: spec_depth=0-4, max_num_seqs=4,8 (repeatable).",
        cli={"name": "knob", "decls": "--knob"},
    )
    ladder: list[int] = _opt(
        [1, 2, 4, 8, 16, 32, 64],
        "Concurrency ladder bisected per configuration.",
        cli={"type": "str", "parser": "int_list", "show": "comma"},
        saved="spec",
    )
    max_trials: int | None = _opt(
        None,
        "Budget: server starts (rejected configurations cost none; 0: none, e.g. to rewrite the outputs of a resumed study); default 12.",
        cli={},
        saved="spec",
        resume=True,
        spec_default=12,  # a new study's default budget (m3ctl.tuning.settings.new_settings)
        bound=_bound(0, what=">= 0", fmt="g"),
    )
    time_budget_s: float | None = _opt(
        None,
        "Budget: wall seconds, confirmations included (no start begins when the median trial so far plus the time kept for the confirmations would overrun it).",
        cli={"name": "time_budget", "decls": "--time-budget", "parser": "positive_float", "metavar": "SECONDS"},
        saved="spec",
        resume=True,
        bound=_bound(0, above=True, what="> 0 seconds", fmt="g"),
    )
    seed: int = _opt(
        0,
        "Sampler and workload seed, 0 to 2**32-1 (optuna's sampler seeds numpy's RandomState, which takes that range: https://numpy.org/doc/stable/reference/random/legacy.html).",
        cli={},
        saved="spec bench",
        bound=_bound(0, 2**32 - 1),
    )
    confirm_top: int = _opt(
        2,
        "Successive halving: re-measure the best N on a fresh server (with --resume it replaces the saved value, e.g. 0 while a study is spread over several sessions, then 1 for the last).",
        cli={"unset": True},
        saved="spec",
        resume=True,
        bound=_bound(0, what=">= 0", fmt="g"),
    )
    prompts_per_concurrency: int = _opt(
        RUN_WAVES,
        f"Requests per run = this x concurrency (waves of the closed loop), at least 8; default {RUN_WAVES}, the "
        f"run `m3ctl bench` sends without --num-prompts: one wave of ramp-up, {STEADY_WAVES} of steady state (the "
        "objective's interval takes batches of whole request latencies, at least 4 of them) and one of drain; "
        "4 waves gave no interval at all.",
        cli={"max": None},  # the top is the study's check: its message names the requests of one bench run
        saved="spec",
        bound=_bound(1, MAX_PROMPTS),
    )
    baseline: bool = _opt(
        True,
        "Also measure vLLM's defaults (no tuned flags, smallest accepted TP) with the same bisection and SLO, once per study (with --resume: keep the saved choice unless given).",
        cli={"decls": "--baseline/--no-baseline", "unset": True},
        saved="spec",
        resume=True,
        spec_default=False,  # a tune.json written before the baseline existed: not measured then
    )
    boundary_margin: float = _opt(
        0.10,
        "Capacity rule margin: a run within this fraction of an SLO limit (met or missed) is repeated; a level holds when the median of its runs meets the SLO and no run misses by more than this (docs/tune.md).",
        cli={},
        saved="spec",
        bound=_bound(0.0, 1.0, what="a fraction from 0 to 1"),
    )
    boundary_repeats: int = _opt(
        2,
        "A level near the SLO limit takes this many more runs, on the same server with fresh prompts, unless decided sooner (0: one run per level).",
        cli={},
        saved="spec",
        bound=_bound(0),
    )
    fast_starts: bool = _opt(
        True,
        "Trial servers share one compile cache per study and model and capture CUDA graphs only up to the ladder's largest batch (measurement-only: not in the tuned command). --no-fast-starts starts every trial as `m3ctl serve` would.",
        cli={"decls": "--fast-starts/--no-fast-starts"},
        saved="top",
    )
    max_spec_depth: int = _opt(
        4,
        "Largest speculation depth searched (at most 32: every depth from 0 is a candidate).",
        cli={},
        bound=_bound(0, 32),
    )
    port: int | None = _opt(
        None,
        "API port of the trial servers (default: $M3CTL_PORT, the config file's, else 8000).",
        cli={},
        saved="top",
        bound=_bound(1, 65535),
    )
    workload: str = _opt(
        "random",
        "Bench workload of each measurement: random, prefix-repetition, agentic (not dataset: tune takes no dataset file).",
        cli={"parser": "workload"},
        saved="bench",
    )
    input_len: int = _opt(
        128,
        "Input tokens per request (prefix-repetition: suffix; agentic: first user turn).",
        cli={},
        saved="bench",
        bound=_bound(1, MAX_REQUEST_TOKENS),
    )
    output_len: int = _opt(
        128, "Output tokens per request.", cli={}, saved="bench", bound=_bound(1, MAX_REQUEST_TOKENS)
    )
    prompt_text: Literal["fresh", "common"] = _opt(
        "fresh",
        "Prompt text of the random workload: fresh (drawn anew every run) or common (the same text in every run and trial, each prompt behind a run tag that keeps it fresh to a prefix cache: configurations compared on the same prompts).",
        cli={},
        saved="bench",
        omit_default=True,
    )
    warmup: bool = _opt(
        True,
        "Warm up before every measured run at its concurrency (as many fresh requests as the concurrency).",
        cli={"decls": "--warmup/--no-warmup"},
        saved="bench",
    )
    precision: Annotated[float | None, BeforeValidator(parse_precision)] = _opt(
        None,
        "Measure each run until the 95 % interval of the objective's throughput is within this half-width (2% or 0.02), ramp-up and drain left out, or --max-duration ends; instead of a fixed --prompts-per-concurrency (default: fixed).",
        cli={"parser": "precision", "metavar": "PCT"},
        saved="bench",
        omit_default=True,
        bound=_bound(0, PRECISION_MAX, above=True, what=PRECISION_RANGE, fmt="g"),
    )
    max_duration_s: float | None = _opt(
        None,
        f"Time budget of each --precision run (s, default {PRECISION_MAX_DURATION_S:g}): it stops issuing requests then and its figure says the precision was not met.",
        cli={"name": "max_duration", "decls": "--max-duration", "parser": "positive_float", "metavar": "SECONDS"},
        saved="bench",
        omit_default=True,
        bound=_bound(0, above=True, finite=True, what="> 0 seconds", fmt="g"),
    )
    profile: str | Path | None = _opt(
        None,
        "Kernel profile YAML to use instead of the catalog's.",
        cli={"type": "path"},
        saved="top",
        key="profile_file",
    )
    args: dict = _opt(
        {},
        "vllm serve flag for every trial (repeatable).",
        cli={"name": "arg", "decls": "--arg"},
        saved="plan_base",
        key="overrides",
    )
    extra_args: list[str] = _opt([], "Raw vLLM args of every trial (after `--`; no --api-key).", saved="plan_base")
    skip_checks: bool = _opt(
        False, "Launch even if a plan rule rejects (failures become crashed trials).", cli={}, saved="plan_base"
    )

    @field_validator("*", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        """Text the command line could carry: no bytes, no NUL (m3ctl.errors.plain_text), API and CLI alike."""
        return plain_text(v)


def fact(name: str, key: str, missing: Any = None) -> Any:
    """The fact ``key`` (``cli``, ``saved``, ``resume``) of the option ``name`` (``missing`` when it has none)."""
    extra = TuneOptions.model_fields[name].json_schema_extra
    return extra.get(key, missing) if isinstance(extra, dict) else missing


def saved_fields(place: str) -> list[str]:
    """The options ``tune.json`` keeps in ``place`` (``spec``, ``bench``, ``top``, ``plan_base``), in field order."""
    return [n for n in TuneOptions.model_fields if place in str(fact(n, "saved", "")).split()]


#: The options ``--resume`` takes again (the others are the saved study's).
RESUME_OPTIONS = tuple(n for n in TuneOptions.model_fields if fact(n, "resume", False))


def default(name: str):
    """The default of the option ``name`` (a fresh list/dict for a factory)."""
    f = TuneOptions.model_fields[name]
    return f.get_default(call_default_factory=True)


def option_flag(name: str) -> str:
    """How ``m3ctl tune`` spells the option ``name`` (``--time-budget`` for ``time_budget_s``)."""
    cli = fact(name, "cli") or {}
    decls = cli.get("decls")
    if isinstance(decls, str) and decls.startswith("--"):
        return decls.split("/", 1)[0]
    return "--" + str(cli.get("name", name)).replace("_", "-")


def bound_error(name: str, value: Any) -> str | None:
    """Why ``value`` is out of the option ``name``'s range (its ``bound``), as the error says it; None when it is in
    range, None (not given) or the option has no range. A whole-number option takes an int, not a bool."""
    b = fact(name, "bound")
    if b is None or value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and (isinstance(value, int) or not b["whole"])
    if ok:
        ok = (value > b["lo"] if b["above"] else value >= b["lo"]) and (b["hi"] is None or value <= b["hi"])
        ok = ok and (not b["finite"] or math.isfinite(value))
    if ok:
        return None
    shown = format(value, b["fmt"]) if b["fmt"] != "r" and isinstance(value, int | float) else repr(value)
    return f"{option_flag(name)} {shown} must be {b['what']}"


def check_bounds(values: dict[str, Any]) -> None:
    """Check the options of ``values`` (``{field: value}``) against their fields' ranges, in field order.

    Raises:
        BadInput: the first option out of range, one line naming it (``--input-len 0 must be a whole number from 1
            to 10,000,000``).
    """
    for name in TuneOptions.model_fields:
        if name in values and (why := bound_error(name, values[name])) is not None:
            raise BadInput(why, "see `m3ctl tune --help`")


DEFAULT_LADDER = default("ladder")


def spec_default(name: str) -> Any:
    """The value of the ``spec`` option ``name`` in a ``tune.json`` that lacks it (its fact ``spec_default``, else
    the option's default)."""
    return fact(name, "spec_default", default(name))


@dataclass
class SearchSettings:
    """The search's own settings, which no option sets (:class:`TuneSpec` adds the options saved in its ``spec``).

    ``prompts_per_concurrency`` x concurrency requests per search run (at least ``min_prompts``); confirmation runs
    use ``confirm_factor`` times more. ``local_first``: complete-poll pattern search around the incumbent before
    TPE. ``warm_start``: start each configuration's concurrency search at its nearest measured neighbour's
    SLO-meeting concurrency. ``patience``: stop after this many global (TPE) starts in a row without improvement
    once the local poll is complete (None: never).
    """

    confirm_factor: float = 2.0
    min_prompts: int = 8
    n_startup_trials: int | None = None
    local_first: bool = True
    warm_start: bool = True
    patience: int | None = 3
    #: The largest run-to-run spread the study has measured (m3ctl.loadgen.capacity.run_spread of each repeated
    #: level, a fraction of the limit): kept up to date by :func:`measure_level` and recomputed from the saved
    #: runs on resume. One run decides a level only with more headroom than this (CapacityRule.one_run_margin).
    observed_spread: float = 0.0

    if TYPE_CHECKING:  # the saved options (TuneSpec's other fields) are derived from TuneOptions at run time

        def __init__(self, **options: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...


def _spec_field(name: str) -> tuple[str, Any, Any]:
    d = spec_default(name)
    if isinstance(d, list | dict):
        return name, TuneOptions.model_fields[name].annotation, field(default_factory=lambda: type(d)(d))
    return name, TuneOptions.model_fields[name].annotation, field(default=d)


_SPEC_DOC = """The search's view of a study: the ``spec`` of ``tune.json``, that is the options saved there
(:func:`saved_fields` ("spec"), each field's type and default from :class:`TuneOptions`, except where a ``tune.json``
written before a field existed means otherwise: the field's ``spec_default``, ``baseline`` off (not measured then)
and ``max_trials`` 12, a new study's default budget), plus the search's own settings (:class:`SearchSettings`).
Reused by ``--resume``; fields added later have defaults, so an older ``tune.json`` still loads.

Units: time in seconds, ``usd_per_gpu_hour`` in USD. ``boundary_margin`` (fraction of the limit) and
``boundary_repeats`` (extra runs, 0: never repeat): the capacity rule's margin and ``min_repeats - 1``
(m3ctl.loadgen.capacity.CapacityRule.from_spec; :func:`m3ctl.tuning.measure.measure_level`).
"""

if TYPE_CHECKING:
    TuneSpec = SearchSettings
else:
    #: The search's settings: :class:`SearchSettings` plus every option saved in ``spec`` (derived, in field order).
    TuneSpec = make_dataclass(
        "TuneSpec",
        [_spec_field(n) for n in saved_fields("spec")],
        bases=(SearchSettings,),
        namespace={"__doc__": _SPEC_DOC, "__module__": __name__},
    )
