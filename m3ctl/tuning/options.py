"""The settings of a new tune study, declared once: :class:`TuneOptions` (types, defaults, units, help).

``m3ctl.api.tune`` takes its defaults from it, ``m3ctl tune``'s options are derived from it (help text, type,
default: m3ctl.cli.options.model_options), and :func:`m3ctl.tuning.study.new_settings` receives its values. The
study's saved form (``tune.json``) is :class:`m3ctl.tuning.study.TuneSettings`; its ``spec`` part is read by
:class:`m3ctl.tuning.search.TuneSpec`, whose own defaults are those of a ``tune.json`` written before a field
existed (e.g. no ``baseline`` then: not measured), not a new study's.

Values are checked by the study (m3ctl.tuning.study.new_settings: one BadInput line naming the option), so this
model declares no ranges: it imports nothing but pydantic (``m3ctl --help`` derives the options from it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Version of the :class:`TuneOptions` schema.
SCHEMA_VERSION: Final = 1


class TuneOptions(BaseModel):
    """What a new study measures and how (the ``m3ctl tune`` options other than where the study lives, the
    host and the output)."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1] = SCHEMA_VERSION
    slo: str = Field(
        "", description='SLO over bench result keys, e.g. "p90_tpot_ms<=20,p90_ttft_ms<=2000" ("" = none).'
    )
    objective: Literal["tput_per_gpu", "output_tput_per_gpu", "tokens_per_usd"] = Field(
        "tput_per_gpu", description="tput_per_gpu, output_tput_per_gpu or tokens_per_usd (needs --usd-per-gpu-hour)."
    )
    usd_per_gpu_hour: float | None = Field(
        None, description="GPU price (USD per GPU-hour) for USD per million tokens and tokens per USD."
    )
    knobs: list[str] = Field(
        default_factory=list, description="Pin or narrow a knob: spec_depth=0-4, max_num_seqs=4,8 (repeatable)."
    )
    ladder: list[int] = Field(
        default_factory=lambda: [1, 2, 4, 8, 16, 32, 64], description="Concurrency ladder bisected per configuration."
    )
    max_trials: int | None = Field(
        None,
        description="Budget: server starts (rejected configurations cost none; 0: none, e.g. to rewrite the outputs of a resumed study); default 12.",
    )
    time_budget_s: float | None = Field(
        None,
        description="Budget: wall seconds, confirmations included (no start begins when the median trial so far plus the time kept for the confirmations would overrun it).",
    )
    seed: int = Field(
        0,
        description="Sampler and workload seed, 0 to 2**32-1 (optuna's sampler seeds numpy's RandomState, which takes that range: https://numpy.org/doc/stable/reference/random/legacy.html).",
    )
    confirm_top: int = Field(
        2,
        description="Successive halving: re-measure the best N on a fresh server (with --resume it replaces the saved value, e.g. 0 while a study is spread over several sessions, then 1 for the last).",
    )
    boundary_margin: float = Field(
        0.10,
        description="Capacity rule margin: a run within this fraction of an SLO limit (met or missed) is repeated; a level holds when the median of its runs meets the SLO and no run misses by more than this (docs/tune.md).",
    )
    boundary_repeats: int = Field(
        2,
        description="A level near the SLO limit takes this many more runs, on the same server with fresh prompts, unless decided sooner (0: one run per level).",
    )
    fast_starts: bool = Field(
        True,
        description="Trial servers share one compile cache per study and model and capture CUDA graphs only up to the ladder's largest batch (measurement-only: not in the tuned command). --no-fast-starts starts every trial as `m3ctl serve` would.",
    )
    max_spec_depth: int = Field(
        4, description="Largest speculation depth searched (at most 32: every depth from 0 is a candidate)."
    )
    baseline: bool = Field(
        True,
        description="Also measure vLLM's defaults (no tuned flags, smallest accepted TP) with the same bisection and SLO, once per study (with --resume: keep the saved choice unless given).",
    )
    port: int | None = Field(
        None, description="API port of the trial servers (default: $M3CTL_PORT, the config file's, else 8000)."
    )
    workload: str = Field(
        "random",
        description="Bench workload of each measurement: random, prefix-repetition, agentic (not dataset: tune takes no dataset file).",
    )
    input_len: int = Field(
        128, description="Input tokens per request (prefix-repetition: suffix; agentic: first user turn)."
    )
    output_len: int = Field(128, description="Output tokens per request.")
    prompts_per_concurrency: int = Field(
        4,
        description="Requests per run = this x concurrency, at least 8 (a run of fewer has no percentiles to speak of).",
    )
    prompt_text: Literal["fresh", "common"] = Field(
        "fresh",
        description="Prompt text of the random workload: fresh (drawn anew every run) or common (the same text in every run and trial, each prompt behind a run tag that keeps it fresh to a prefix cache: configurations compared on the same prompts).",
    )
    warmup: bool = Field(
        True,
        description="Warm up before every measured run at its concurrency (as many fresh requests as the concurrency).",
    )
    profile: str | None = Field(None, description="Kernel profile YAML to use instead of the catalog's.")
    args: dict = Field(default_factory=dict, description="vllm serve flag for every trial (repeatable).")
    extra_args: list[str] = Field(
        default_factory=list, description="Raw vLLM args of every trial (after `--`; no --api-key)."
    )
    skip_checks: bool = Field(False, description="Launch even if a plan rule rejects (failures become crashed trials).")


#: The options ``--resume`` takes again (the others are the saved study's).
RESUME_OPTIONS = ("max_trials", "time_budget_s", "baseline", "confirm_top")


def default(name: str):
    """The default of the option ``name`` (a fresh list/dict for a factory)."""
    f = TuneOptions.model_fields[name]
    return f.get_default(call_default_factory=True)


DEFAULT_LADDER = [1, 2, 4, 8, 16, 32, 64]


@dataclass
class TuneSpec:
    """Search settings (saved in the study dir, reused by ``--resume``; fields added later have defaults,
    so an older ``tune.json`` still loads).

    Units: time in seconds, ``usd_per_gpu_hour`` in USD. ``prompts_per_concurrency`` x concurrency
    requests per search run (at least ``min_prompts``); confirmation runs use ``confirm_factor`` times more.
    ``local_first``: complete-poll pattern search around the incumbent before TPE. ``warm_start``: start each
    configuration's concurrency search at its nearest measured neighbour's SLO-meeting concurrency.
    ``patience``: stop after this many global (TPE) starts in a row without improvement once the local poll
    is complete (None: never). ``baseline``: also measure vLLM's defaults (see the module docstring).
    ``boundary_margin`` (fraction of the limit) and ``boundary_repeats`` (extra runs, 0: never repeat): the
    capacity rule's margin and ``min_repeats - 1`` (m3ctl.loadgen.capacity.CapacityRule.from_spec; module
    docstring, step 2; :func:`measure_level`).
    """

    slo: str = ""
    objective: str = "tput_per_gpu"
    usd_per_gpu_hour: float | None = None
    ladder: list[int] = field(default_factory=lambda: list(DEFAULT_LADDER))
    max_trials: int = 12
    time_budget_s: float | None = None
    seed: int = 0
    confirm_top: int = 2
    confirm_factor: float = 2.0
    prompts_per_concurrency: int = 4
    min_prompts: int = 8
    n_startup_trials: int | None = None
    local_first: bool = True
    warm_start: bool = True
    patience: int | None = 3
    baseline: bool = False
    boundary_margin: float = 0.10
    boundary_repeats: int = 2
    #: The largest run-to-run spread the study has measured (m3ctl.loadgen.capacity.run_spread of each repeated
    #: level, a fraction of the limit): kept up to date by :func:`measure_level` and recomputed from the saved
    #: runs on resume. One run decides a level only with more headroom than this (CapacityRule.one_run_margin).
    observed_spread: float = 0.0
