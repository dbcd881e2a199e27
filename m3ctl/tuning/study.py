"""Study directory: settings (``tune.json``), the optuna SQLite study (``study.db``), one folder per trial
(``trials/NNNN/``: config, bench JSONs, server.log), ``running.json`` while a server runs, and the outputs
(``result.json``, ``pareto.png``, ``profile.yaml``). :func:`run_tune` starts or resumes a study."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from m3ctl.errors import BadInput, ConfigRejected
from m3ctl.loadgen.workloads import check_prompt_text
from m3ctl.tuning.choice import rule_text as choice_rule_text
from m3ctl.tuning.search import (
    Outcome,
    Tuner,
    TuneResult,
    TuneSpec,
    level_spread,
    load_equivalence,
    pareto,
    write_json,
)
from m3ctl.tuning.space import FLAGS, Space, describe, key_of, plan_kwargs


def prefix_for(study_dir: Path) -> str:
    """Deployment-name prefix of a study (stable across resumes)."""
    return "tune-" + hashlib.sha256(str(Path(study_dir).resolve()).encode()).hexdigest()[:8]


#: Version of ``tune.json`` (``schema_version``; absent in studies of m3ctl <= 0.1: version 1).
SETTINGS_SCHEMA_VERSION: Final = 1


class TuneSettings(BaseModel):
    """A study's ``tune.json``: everything ``--resume`` needs to continue it.

    Attributes:
        model: catalog name, hub id, or a local model directory (stored absolute).
        space: the search space (:meth:`m3ctl.tuning.space.Space.to_json`); pruned: notes on values pruned before launch.
        port: API port of the trial servers.
        profile_file: kernel profile YAML the study was started with (absolute), None for the catalog's.
        spec: :class:`~m3ctl.tuning.search.TuneSpec` fields (SLO, objective, budgets, ladder...).
        plan_base: plan overrides of every trial (``overrides`` vLLM flags, ``extra_args``, ``skip_checks``).
        bench: the bench options of every measurement (workload, input_len, output_len, seed, warmup...).
        fast_starts: the trial servers' start measures (m3ctl.tuning.startup: one compile cache per study and
            model, CUDA-graph capture bounded by the ladder); absent in older studies: on.
    """

    model_config = ConfigDict(extra="allow")
    schema_version: Literal[1] = SETTINGS_SCHEMA_VERSION
    model: str
    space: dict[str, Any]
    port: int = Field(ge=1, le=65535)
    profile_file: str | None = None
    pruned: list[str] = Field(default_factory=list)
    spec: dict[str, Any]
    plan_base: dict[str, Any] = Field(default_factory=dict)
    bench: dict[str, Any] = Field(default_factory=dict)
    fast_starts: bool = True


def save_settings(study_dir: Path, settings: dict[str, Any]) -> None:
    """Write ``tune.json`` (with ``schema_version``) atomically, before any trial starts.

    Raises:
        ConfigRejected: it could not be written (disk full, read-only: the cause, the path, the bytes needed).
    """
    from m3ctl.core.files import WriteFailed  # noqa: PLC0415
    from m3ctl.errors import ConfigRejected  # noqa: PLC0415

    try:
        write_json(study_dir / "tune.json", {"schema_version": SETTINGS_SCHEMA_VERSION, **settings})
    except WriteFailed as e:
        raise ConfigRejected(f"cannot save the study's settings: {e.message}", e.hint) from None


def load_settings(study_dir: Path) -> dict[str, Any]:
    """The study's settings (the ``tune.json`` dict), checked against :class:`TuneSettings` and
    :class:`~m3ctl.tuning.search.TuneSpec`; a ``tune.json`` without ``schema_version`` (m3ctl <= 0.1) loads as 1.

    Raises:
        BadInput: ``study_dir`` holds no study, or its ``tune.json`` is not JSON, of a newer schema_version, or
            not a study's settings (one line naming the first bad key).
    """
    from m3ctl.results import _one_line  # noqa: PLC0415

    p = Path(study_dir) / "tune.json"
    if not p.exists():
        raise BadInput(
            f"{study_dir} is not a tune study (no tune.json)", "start one with `m3ctl tune --study-dir DIR ...`"
        )
    fix = f"restore {p} from a backup, or start a new study with another --study-dir"
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{p} is unreadable or not JSON ({str(e).splitlines()[0]})", fix) from None
    if not isinstance(data, dict):
        raise BadInput(f"{p}: expected a JSON object, got {type(data).__name__}", fix)
    if data.get("schema_version", 1) != SETTINGS_SCHEMA_VERSION:
        raise BadInput(
            f"{p}: schema_version {data.get('schema_version')!r} is not readable by this m3ctl "
            f"(reads {SETTINGS_SCHEMA_VERSION})",
            "upgrade m3ctl",
        )
    try:
        TuneSettings.model_validate(data)
        TuneSpec(**data["spec"])
    except ValidationError as e:
        raise BadInput(_one_line(e, str(p)), fix) from None
    except TypeError as e:  # an unknown or missing TuneSpec field
        raise BadInput(f"{p}: spec: {e}", fix) from None
    data.pop("schema_version", None)
    check_study_db(Path(study_dir) / "study.db")
    return data


def check_study_db(db: Path) -> None:
    """A study's ``study.db``, when there is one, is an SQLite database with optuna's tables (opened read-only:
    nothing is created or changed), so ``--resume`` (dry run included) refuses a corrupt one before any work.

    Raises:
        BadInput: it is not an SQLite file, is truncated, or holds no optuna study.
    """
    import sqlite3  # noqa: PLC0415

    if not db.exists():
        return
    fix = f"restore {db} from a backup, or move it away to start the search over (trials/ and tune.json are kept)"
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error as e:
        raise BadInput(f"{db} is not a readable optuna study (sqlite: {e})", fix) from None
    if "studies" not in tables:
        raise BadInput(f"{db} is not an optuna study (no 'studies' table)", fix)


def resume_settings(
    study_dir: Path,
    *,
    max_trials: int | None = None,
    time_budget_s: float | None = None,
    baseline: bool | None = None,
    confirm_top: int | None = None,
    save: bool = True,
) -> dict[str, Any]:
    """The settings of the study in ``study_dir`` with new budgets: a resumed study may get a larger budget (e.g.
    continued on another machine); ``max_trials`` (server starts) and ``time_budget_s`` (s) count across
    resumes. ``baseline`` turns measuring vLLM's defaults on/off; ``confirm_top`` replaces the number of
    configurations re-measured at the end (0 while a study is spread over several device sessions, then 1 for the
    last, as on the H200: docs/results/h200-scale.md). ``save``: write them back (False: dry run).

    Raises:
        BadInput: as :func:`load_settings`; a negative budget.
    """
    check_budgets(max_trials=max_trials, time_budget_s=time_budget_s, confirm_top=confirm_top)
    settings = load_settings(study_dir)
    if save:
        from m3ctl.core.state import check_output_path  # noqa: PLC0415

        check_output_path(Path(study_dir) / "tune.json", "--resume")
    new = {
        k: v
        for k, v in (
            ("max_trials", max_trials),
            ("time_budget_s", time_budget_s),
            ("baseline", baseline),
            ("confirm_top", confirm_top),
        )
        if v is not None
    }
    if new:
        settings["spec"].update(new)
        if save:
            save_settings(Path(study_dir), settings)
    return settings


def check_budgets(
    *, max_trials: int | None = None, time_budget_s: float | None = None, confirm_top: int | None = None
) -> None:
    """Raises BadInput for a negative budget (before anything starts)."""
    for opt, v, ok in (
        ("--max-trials", max_trials, max_trials is None or max_trials >= 0),
        ("--time-budget", time_budget_s, time_budget_s is None or time_budget_s > 0),
        ("--confirm-top", confirm_top, confirm_top is None or confirm_top >= 0),
    ):
        if not ok:
            raise BadInput(
                f"{opt} {v:g} must be {'> 0 seconds' if opt == '--time-budget' else '>= 0'}", "see `m3ctl tune --help`"
            )


def _opt(name: str):
    """A new study's default for ``name`` (m3ctl.tuning.options.TuneOptions, where they are declared)."""
    from m3ctl.tuning.options import default  # noqa: PLC0415

    return default(name)


def _check_choices(
    slo: str, objective: str, usd_per_gpu_hour: float | None, ladder: list[int] | None, workload: str
) -> list[int]:
    """:func:`new_settings`'s checks of the SLO, objective, ladder and workload; returns the ladder sorted
    (default: TuneOptions'). Raises BadInput naming what is wrong."""
    from m3ctl.loadgen.slo import objective_value, parse_slo  # noqa: PLC0415
    from m3ctl.loadgen.workloads import KINDS  # noqa: PLC0415

    parse_slo(slo)
    objective_value({"total_token_throughput": 1.0, "output_throughput": 1.0}, objective, 1, usd_per_gpu_hour)
    lad = sorted(set(ladder if ladder is not None else _opt("ladder")))
    if not lad or lad[0] < 1:
        raise BadInput(f"bad ladder {lad}", "concurrencies are integers >= 1, e.g. --ladder 1,2,4,8,16")
    if workload not in KINDS:
        raise BadInput(f"unknown workload {workload!r}", f"use one of {', '.join(KINDS)}")
    if workload == "dataset":  # bench's dataset workload reads --dataset-path, which tune does not take
        raise BadInput(
            "tune cannot measure --workload dataset: it needs a dataset file (bench --dataset-path), which tune "
            "does not take",
            f"use one of {', '.join(k for k in KINDS if k != 'dataset')}, or bench the dataset against the "
            "tuned profile's server",
        )
    return lad


#: new_settings' options that _check_numbers checks (passed by name)
_NUMBER_OPTIONS = (
    "input_len",
    "output_len",
    "prompts_per_concurrency",
    "port",
    "boundary_margin",
    "boundary_repeats",
    "max_spec_depth",
    "usd_per_gpu_hour",
)


def _check_numbers(
    lad: list[int],
    *,
    input_len: int,
    output_len: int,
    prompts_per_concurrency: int,
    port: int,
    boundary_margin: float,
    boundary_repeats: int,
    max_spec_depth: int,
    usd_per_gpu_hour: float | None,
) -> None:
    """:func:`new_settings`'s checks of the lengths, counts, port, boundary rule and price (``lad``: the sorted
    ladder). Raises BadInput naming the option."""
    from m3ctl.loadgen import MAX_REQUEST_TOKENS  # noqa: PLC0415
    from m3ctl.loadgen.runner import MAX_PROMPTS  # noqa: PLC0415

    for opt, v, top in (
        ("--input-len", input_len, MAX_REQUEST_TOKENS),
        ("--output-len", output_len, MAX_REQUEST_TOKENS),
        ("--prompts-per-concurrency", prompts_per_concurrency, MAX_PROMPTS),
        ("--port", port, 65535),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= top:
            raise BadInput(f"{opt} {v!r} must be a whole number from 1 to {top:,}", "see `m3ctl tune --help`")
    import math  # noqa: PLC0415

    for opt, given, ok, what in (
        ("--boundary-margin", boundary_margin, 0 <= boundary_margin <= 1, "a fraction from 0 to 1"),
        ("--boundary-repeats", boundary_repeats, boundary_repeats >= 0, "a whole number >= 0"),
        ("--max-spec-depth", max_spec_depth, max_spec_depth >= 0, "a whole number >= 0"),
        (
            "--usd-per-gpu-hour",
            usd_per_gpu_hour,
            usd_per_gpu_hour is None or (math.isfinite(usd_per_gpu_hour) and usd_per_gpu_hour > 0),
            "USD > 0",
        ),
    ):
        if not ok:
            raise BadInput(f"{opt} {given!r} must be {what}", "see `m3ctl tune --help`")
    if lad[-1] * prompts_per_concurrency * 2 > MAX_PROMPTS:  # x2: a confirmation run sends twice as many
        raise BadInput(
            f"--ladder {lad[-1]} x --prompts-per-concurrency {prompts_per_concurrency} (x2 to confirm) "
            f"is more than {MAX_PROMPTS:,} requests in one bench run",
            "lower the ladder's top",
        )


def _no_secrets(overrides: dict[str, Any] | None, extra_args: list[str] | None) -> list[str]:
    """The raw vLLM args to store; BadInput for an ``--api-key`` in them or a secret flag in ``overrides`` (the
    study files would keep it)."""
    from m3ctl.core.secrets import separate, split_api_key  # noqa: PLC0415

    args, key = split_api_key(list(extra_args or []))
    if key:
        raise BadInput(
            "tune starts its own private trial servers: a raw --api-key is not used (nor stored)",
            "drop --api-key from the raw arguments",
        )
    if found := sorted(separate(dict(overrides or {})).origins.values()):  # the study files would keep them
        raise BadInput(
            f"tune stores its settings in the study dir: a secret flag is not taken ({found[0]})",
            "drop it; trial servers get VLLM_API_KEY / HF_TOKEN from the environment",
        )
    return args


def _no_knob_flags(overrides: dict[str, Any] | None) -> None:
    """BadInput for an ``--arg`` that sets a flag tune searches (``--arg tensor-parallel-size=4``): it would stand
    against every trial's own value (the plan refuses a TP given twice); a knob is pinned with ``--knob tp=4``."""
    from m3ctl.catalog.vllm_args import canon_flag  # noqa: PLC0415
    from m3ctl.tuning.space import FLAGS  # noqa: PLC0415

    knob_of = {flag: knob for knob, flag in FLAGS.items()}
    for k in overrides or {}:
        if (knob := knob_of.get(canon_flag(str(k)))) is not None:
            raise BadInput(
                f"--arg {k}: tune searches {knob} and sets --{FLAGS[knob]} on each trial",
                f"pin it with --knob {knob}=VALUE (or narrow it: --knob {knob}=A,B)",
            )


def _check_new_study_dir(study_dir: str | Path) -> None:
    """BadInput when ``study_dir`` already holds a study or its ``tune.json`` cannot be written."""
    if (Path(study_dir) / "tune.json").exists():
        raise BadInput(
            f"{study_dir} already holds a study",
            f"continue it with --resume {study_dir} or choose another --study-dir",
        )
    from m3ctl.core.state import check_output_path  # noqa: PLC0415

    check_output_path(Path(study_dir) / "tune.json", "--study-dir")


def _study_space(
    model: str, inventory, profile_file: str | Path | None, knobs: list[str] | None, lad: list[int], max_spec_depth: int
) -> tuple[Space, Any]:
    """The search space of a new study and what pruning for the ladder removed: from the base profile
    (``profile_file`` or the catalog's for the GPU architecture) and the model's facts, narrowed by ``knobs``."""
    from m3ctl import catalog  # noqa: PLC0415
    from m3ctl.assess.facts import model_facts, read_model_facts  # noqa: PLC0415
    from m3ctl.catalog import load_profile_file, profile_for_arch  # noqa: PLC0415
    from m3ctl.tuning.space import apply_pins, default_space, prune_dominated  # noqa: PLC0415

    base = load_profile_file(Path(profile_file)) if profile_file else profile_for_arch(inventory.arch)
    facts = read_model_facts(model)
    spec_m = catalog.find_model(model, facts.architectures)
    facts = model_facts(spec_m, facts)  # the engine's one record: the search space follows the same facts
    drafter = spec_m.drafter if spec_m else None
    space = default_space(
        base,
        len(inventory.gpus),
        moe=bool(facts.moe),
        attention=facts.attention,
        drafter_method=drafter.method if drafter else None,
        max_spec_depth=max_spec_depth,
        drafter_block_size=drafter.block_size if drafter else None,
    )
    space = apply_pins(space, knobs or [])
    space, pruned = prune_dominated(space, lad)
    return space, pruned


def new_settings(
    model: str,
    inventory,
    *,
    slo: str = _opt("slo"),
    objective: str = _opt("objective"),
    usd_per_gpu_hour: float | None = _opt("usd_per_gpu_hour"),
    knobs: list[str] | None = None,
    ladder: list[int] | None = None,
    max_trials: int | None = _opt("max_trials"),
    time_budget_s: float | None = _opt("time_budget_s"),
    seed: int = _opt("seed"),
    confirm_top: int = _opt("confirm_top"),
    boundary_margin: float = _opt("boundary_margin"),
    boundary_repeats: int = _opt("boundary_repeats"),
    max_spec_depth: int = _opt("max_spec_depth"),
    baseline: bool | None = None,
    fast_starts: bool = _opt("fast_starts"),
    port: int = 8000,
    workload: str = _opt("workload"),
    input_len: int = _opt("input_len"),
    output_len: int = _opt("output_len"),
    prompts_per_concurrency: int = _opt("prompts_per_concurrency"),
    prompt_text: str = _opt("prompt_text"),
    warmup: bool = _opt("warmup"),
    profile_file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    extra_args: list[str] | None = None,
    skip_checks: bool = _opt("skip_checks"),
    study_dir: Path | None = None,
    save: bool = False,
) -> dict[str, Any]:
    """The settings (``tune.json`` shape) of a new study of ``model`` on ``inventory``: the search space from
    the base profile (``profile_file`` or the catalog's for the GPU architecture) and the model's facts,
    narrowed by ``knobs`` (``"spec_depth=0-4"``, ``"max_num_seqs=4,8"``) and pruned for the ``ladder``.
    With ``study_dir``: checked to hold no study yet and to be writable, and (``save``) written there.

    Defaults: :class:`m3ctl.tuning.options.TuneOptions` (declared there once; ``baseline`` None: its default, on).
    Units: ``ladder`` concurrencies (default 1, 2, 4 ... 64), ``time_budget_s`` seconds, ``usd_per_gpu_hour`` USD,
    ``input_len``/``output_len`` tokens, ``boundary_margin`` a fraction of the SLO limit. ``overrides``:
    ``{flag: value}`` vLLM flags of every trial; ``extra_args``: raw vLLM args (no ``--api-key``).

    Raises:
        BadInput: a bad SLO, objective (``tokens_per_usd`` without a price), ladder, workload, knob, budget or
            length; an unreadable profile or model; ``study_dir`` already holds a study or is not writable.
    """
    lad = _check_choices(slo, objective, usd_per_gpu_hour, ladder, workload)
    check_prompt_text(prompt_text, workload)
    check_budgets(max_trials=max_trials, time_budget_s=time_budget_s, confirm_top=confirm_top)
    _check_numbers(lad, **{k: v for k, v in locals().items() if k in _NUMBER_OPTIONS})
    extra_args = _no_secrets(overrides, extra_args)
    _no_knob_flags(overrides)
    if study_dir is not None:
        _check_new_study_dir(study_dir)
    space, pruned = _study_space(model, inventory, profile_file, knobs, lad, max_spec_depth)
    # A local model directory and profile file are stored absolute, so `--resume DIR` works from any directory.
    saved_model = str(Path(model).resolve()) if Path(model).is_dir() else model
    settings = {
        "model": saved_model,
        "space": space.to_json(),
        "port": port,
        "fast_starts": bool(fast_starts),
        "profile_file": str(Path(profile_file).resolve()) if profile_file else None,
        "pruned": pruned,
        "spec": {
            "slo": slo,
            "objective": objective,
            "usd_per_gpu_hour": usd_per_gpu_hour,
            "ladder": lad,
            "max_trials": TuneSpec.max_trials if max_trials is None else max_trials,
            "time_budget_s": time_budget_s,
            "seed": seed,
            "confirm_top": confirm_top,
            "prompts_per_concurrency": prompts_per_concurrency,
            "baseline": _opt("baseline") if baseline is None else baseline,
            "boundary_margin": boundary_margin,
            "boundary_repeats": boundary_repeats,
        },
        "plan_base": {"overrides": dict(overrides or {}), "extra_args": list(extra_args), "skip_checks": skip_checks},
        "bench": {
            "workload": workload,
            "input_len": input_len,
            "output_len": output_len,
            "seed": seed,
            "warmup": warmup,
            "usd_per_gpu_hour": usd_per_gpu_hour,
            **({"prompt_text": prompt_text} if prompt_text != "fresh" else {}),
            "tokenizer": local_tokenizer(model, [*(extra_args or []), *(overrides or {})]),
        },
    }
    if save and study_dir is not None:
        save_settings(Path(study_dir), settings)
    return settings


def local_tokenizer(model: str, server_args: list[str] | None = None) -> str | None:
    """The model directory whose ``tokenizer.json`` builds a study's prompts (the file its trial servers load),
    or None: a hub id, or trial servers given a tokenizer of their own (``--tokenizer`` among ``server_args``,
    the study's raw vLLM args and override flags), whose ``/tokenize`` is then the truth. Local, because an exact-length prompt costs about three
    ``/tokenize`` round trips through the server: 28 ms a prompt against 8 ms with the file, with a vLLM CPU
    server on this repo's 2-core CI machine (benchmarks/prompt_build.py). The counts stay checked against the
    server's ``usage.prompt_tokens`` (m3ctl.loadgen.runner)."""
    if any(str(a).lstrip("-").replace("_", "-").split("=")[0] == "tokenizer" for a in server_args or []):
        return None
    p = Path(model)
    return str(p.resolve()) if (p / "tokenizer.json").is_file() else None


def base_profile(settings: dict[str, Any], inventory):
    """The study's base kernel profile (its ``profile_file``, else the catalog's for the GPU architecture); a
    profile file is also put in ``settings["plan_base"]["profile"]`` so every trial plans with it."""
    from m3ctl.catalog import load_profile_file, profile_for_arch  # noqa: PLC0415

    if settings.get("profile_file"):
        base = load_profile_file(Path(settings["profile_file"]))
        settings["plan_base"]["profile"] = base
        return base
    return profile_for_arch(inventory.arch)


LOCK_FILE = "tune.lock"


@contextlib.contextmanager
def study_lock(study_dir: Path) -> Iterator[None]:
    """Hold the study's lock for the block: an exclusive ``flock`` on ``<study>/tune.lock``, which names its holder
    (``pid N since TIME``). The kernel releases it when the holder exits, however it ends, so the lock of a
    killed tune is taken over by the next one (https://man7.org/linux/man-pages/man2/flock.2.html).

    Raises:
        ConfigRejected: another process holds it (a concurrent ``tune --resume`` of the same study), named with
            its pid (exit 3); nothing of the study was touched.
    """
    import fcntl  # noqa: PLC0415
    import os  # noqa: PLC0415
    import time  # noqa: PLC0415

    from m3ctl.errors import ConfigRejected  # noqa: PLC0415

    study_dir = Path(study_dir)
    study_dir.mkdir(parents=True, exist_ok=True)
    with open(study_dir / LOCK_FILE, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "a process"
            raise ConfigRejected(
                f"study {study_dir} is in use by another m3ctl tune ({holder})",
                "wait for it to end, or stop it (Ctrl-C or kill that pid: it stops its trial "
                f"server), then `m3ctl tune --resume {study_dir}`",
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        f.flush()
        try:
            yield
        finally:
            f.truncate(0)
            fcntl.flock(f, fcntl.LOCK_UN)


def smallest_trial(ev, space: Space) -> int:
    """GPUs of the space's smallest configuration as planned (m3ctl.tuning.parallel.gpus_needed: TP x PP x DP, the
    planner may add PP to fit a TP).

    Raises:
        ConfigRejected: the plan rules reject every configuration of the space (exit 3 before any start: a study
            of vLLM's defaults alone has nothing to tune); names the first configuration's rule and reason.
    """
    from m3ctl.tuning.parallel import gpus_needed  # noqa: PLC0415

    sizes, first = [], None
    for cand in space.grid():
        try:
            sizes.append(gpus_needed(ev, cand))
        except ConfigRejected as e:
            first = first or (cand, e)
    if not sizes and first is not None:
        raise nothing_to_tune(space.size(), describe(first[0], space), first[1].message)
    return min(sizes, default=1)


class NothingToTune(ConfigRejected):
    """The plan rules reject every configuration of the space (exit 3, as any ConfigRejected)."""


def nothing_to_tune(n: int, first: str, reason: str) -> NothingToTune:
    """The error of a space whose every configuration the plan rules reject (``first``: the first one,
    ``reason``: why), for the run and for ``--dry-run`` alike."""
    return NothingToTune(
        f"nothing to tune: the plan rules reject all {n} configurations of the space ({first}: {reason})",
        "change the --knob values (`m3ctl tune --dry-run` lists each configuration's rule) or plan for another host "
        "(--system NAME, --inventory FILE)",
    )


def trial_pool(inventory, space: Space, port: int, parallel_trials: int | str = "auto", need: int | None = None):
    """How many trials of the study run at once on this host and where (:class:`m3ctl.tuning.schedule.Pool`): the
    limit from ``parallel_trials`` (an int >= 1, or ``"auto"``: as many as fit) and the smallest configuration of
    the space (``need`` GPUs, :func:`smallest_trial`; without it its smallest TP x DP), the GPU topology of
    ``inventory``, and one API port per concurrent
    trial (``port`` and the next free ones up). A host without GPUs, or where one trial fits, runs one at a time.

    Raises:
        BadInput: ``parallel_trials`` is not ``auto`` or an integer >= 1.
        ConfigRejected: not enough free ports above ``port`` for the concurrent trials.
    """
    from m3ctl.tuning.schedule import Pool, Topology, parallel_limit  # noqa: PLC0415
    from m3ctl.tuning.server import trial_ports  # noqa: PLC0415

    topo = Topology.of(inventory)
    if need is None:  # the callers pass smallest_trial(ev, space)
        need = min(space.values.get("tp", [1])) * min(space.values.get("dp", [1]))
    try:
        limit, why = parallel_limit(topo, need, parallel_trials)
    except ValueError as e:
        raise BadInput(f"--parallel-trials: {e}", "pass auto or a whole number >= 1") from None
    ports = trial_ports("127.0.0.1", port, limit) if limit > 1 else (port,)
    return Pool(topo=topo, ports=ports, limit=limit, why=why)


def open_tuner(study_dir: Path, space: Space, ev, spec: TuneSpec, on_event=None, pool=None) -> Tuner:
    """The study's :class:`~m3ctl.tuning.search.Tuner` on its optuna SQLite file ``study.db`` (created when new);
    ``pool``: trials at once (:func:`trial_pool`), None: one at a time.

    Raises:
        BadInput: ``study.db`` is not a readable optuna SQLite study (corrupt, truncated, another file, not
            writable); nothing has started.
    """
    db = Path(study_dir) / "study.db"
    try:
        return Tuner(space, ev, spec, storage=f"sqlite:///{db}", on_event=on_event, pool=pool)
    except Exception as e:  # noqa: BLE001 - sqlalchemy/optuna raise many kinds (DatabaseError, RuntimeError...)
        first = (str(e).splitlines() or [type(e).__name__])[0][:160]
        raise BadInput(
            f"{db} is not a readable optuna study ({type(e).__name__}: {first})",
            "restore it from a backup, or move it away to start the search over (the trials/ folder "
            "and tune.json are kept)",
        ) from None


def run_tune(
    study_dir: Path,
    settings: dict[str, Any],
    *,
    inventory,
    registry=None,
    on_event: Callable[[int | None, str, str], None] | None = None,
    on_cleanup: Callable[[list[str]], None] | None = None,
    parallel_trials: int | str = "auto",
) -> tuple[TuneResult, Tuner, Any]:
    """Start or continue the study in ``study_dir`` with ``settings`` (the ``tune.json`` shape:
    ``model``, ``space``, ``spec``, ``plan_base``, ``bench``, ``port``). Leftover servers of a killed
    run are stopped first. Returns the result, the tuner and the evaluator. ``parallel_trials``: trials at once on
    disjoint GPU sets (:func:`trial_pool`; a run setting, not saved: a resumed study may run elsewhere).

    The study is locked for the run (:func:`study_lock`): a second concurrent run of it refuses before touching it.

    Raises:
        ConfigRejected: another process runs this study, or the plan rules reject every configuration of its space
            (:func:`smallest_trial`; a new study's folder is then removed: nothing was measured) (exit 3).
        KeyboardInterrupt: Ctrl-C; the current server is stopped and completed trials are kept.
    """
    sdir = Path(study_dir)
    fresh = not (sdir / "trials").exists() and not (sdir / "study.db").exists()
    try:
        with study_lock(sdir):
            return _run_tune(
                sdir,
                settings,
                inventory=inventory,
                registry=registry,
                on_event=on_event,
                on_cleanup=on_cleanup,
                parallel_trials=parallel_trials,
            )
    except NothingToTune:
        if fresh:  # a refused new study leaves no folder behind
            for f in ("tune.json", "tune.lock"):
                (sdir / f).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                sdir.rmdir()  # only when empty
        raise


def _run_tune(
    study_dir: Path,
    settings: dict[str, Any],
    *,
    inventory,
    registry,
    on_event,
    on_cleanup,
    parallel_trials: int | str = "auto",
) -> tuple[TuneResult, Tuner, Any]:
    from m3ctl.core.state import Registry  # noqa: PLC0415
    from m3ctl.tuning.server import ServerEvaluator, stop_leftovers  # noqa: PLC0415

    study_dir = Path(study_dir)
    registry = registry or Registry()
    prefix = prefix_for(study_dir)
    stopped = stop_leftovers(study_dir, prefix, registry)
    if on_cleanup:
        on_cleanup(stopped)
    space = Space.from_json(settings["space"])
    spec = TuneSpec(**settings["spec"])
    ev = ServerEvaluator(
        inventory,
        settings["model"],
        study_dir,
        spec,
        plan_base=settings.get("plan_base", {}),
        bench=settings.get("bench", {}),
        port=settings["port"],
        name_prefix=prefix,
        registry=registry,
        space=space,
        fast_starts=settings.get("fast_starts", True),
    )
    pool = trial_pool(inventory, space, settings["port"], parallel_trials, need=smallest_trial(ev, space))
    tuner = open_tuner(study_dir, space, ev, spec, on_event, pool=pool if pool.limit > 1 else None)
    try:
        res = tuner.run()
    finally:
        ev.stop_current()
        ev.stop_slots()
        ev.discard_prewarmed()
    return res, tuner, ev


def _dry_run_candidates(ev, space: Space) -> list[dict[str, Any]]:
    """Every configuration of ``space`` in grid order, as :func:`dry_run` lists it: ``status`` "ok" with the trial
    server's ``command``, or "rejected" with the plan ``rule`` and ``reason`` (never launched)."""
    cands = []
    for i, cand in enumerate(space.grid()):
        row: dict[str, Any] = {"config": cand, "describe": describe(cand, space)}
        try:
            row.update(status="ok", command=ev.trial_plan(cand, i).command_line())
        except ConfigRejected as e:
            # No rule (a port in use, a bad mount): the message's head, as recorded before rejections carried it.
            rid = e.rule if e.rule is not None else e.message.split(":", 1)[0]
            row.update(status="rejected", rule=rid, reason=e.message)
        cands.append(row)
    return cands


def _dry_run_order(spec: TuneSpec, with_baseline: bool, feasible: int) -> list[str]:
    """What the study runs in which order, in words (:func:`dry_run`'s ``order``)."""
    if spec.max_trials == 0:  # the trial budget is spent before the baseline's start (Tuner._budget_spent)
        return ["no server start (--max-trials 0): the study is set up and measures nothing"]
    load = (
        "bisected on load against the SLO"
        if spec.slo.strip()
        else "up the concurrency ladder (no SLO: every load meets it)"
    )
    budget = ""
    if spec.time_budget_s:
        budget = f" or {spec.time_budget_s:g} s of wall time" + (
            " less the time kept for the confirmations (each: the study's median start and median run at "
            f"{spec.confirm_factor:g}x the requests, estimated as it goes)"
            if spec.confirm_top
            else ""
        )
    if spec.confirm_top:
        confirm = (
            f"then the best {min(spec.confirm_top, feasible)} re-measured on a fresh server with "
            f"{spec.confirm_factor:g}x the requests"
        )
        if spec.time_budget_s:
            confirm += (
                f", inside the {spec.time_budget_s:g} s: a confirmation that would end past it is skipped, and "
                "the result says so"
            )
    else:
        confirm = "no re-measurement on a fresh server (--confirm-top 0): each configuration is one server's figure"
    return ([f"baseline: vLLM's defaults, {load}"] if with_baseline else []) + [
        f"first configuration (speculation off, largest batch limits in range), {load}",
        (
            f"then a local poll around the best so far and optuna TPE over the {feasible} configurations the "
            f"rules accept, until {spec.max_trials} server starts{budget}"
        ),
        confirm,
    ]


def dry_run(
    study_dir: Path, settings: dict[str, Any], *, inventory, registry=None, parallel_trials: int | str = "auto"
) -> dict[str, Any]:
    """What ``m3ctl tune`` would do with ``settings`` (the ``tune.json`` shape), starting nothing and writing
    nothing: every configuration of the space checked by the plan rules (a rejected one is never launched),
    the configurations pruned before launch, the vLLM-defaults baseline and the first configuration with
    their exact commands (as the trial servers run them: named ``{prefix}-tN``, with the measurement-only
    flags; the tuned command written at the end has neither; ``tN`` in a listed command is the grid position,
    a real trial is numbered when it starts), and the bench run behind each measurement.

    Returns a dict: ``study_dir``, ``spec`` (SLO, objective, budgets, ladder...), ``bench`` (workload),
    ``space`` {values, free, size}, ``pruned`` (notes), ``candidates`` [{config, describe, status "ok" or
    "rejected", rule, reason, command}], ``feasible`` (count), ``baseline`` {config, command} or
    {skipped: why}, ``first`` {config, command} (the anchor: the search's first start) or None,
    ``order`` (what runs in which order), ``prompts_per_run`` {concurrency: requests}, ``boundary`` (the rule for
    repeating a run near the SLO boundary, in words), ``choice`` (what profile.yaml will hold, in words:
    m3ctl.tuning.choice.rule_text), ``runnable`` (False when the rules reject every configuration of the space:
    the run refuses it, :func:`smallest_trial`), ``parallel`` (:func:`parallel_preview`: trials at once, their
    GPU sets and ports, and the start order of the first configurations).
    """
    from m3ctl.core.state import Registry  # noqa: PLC0415
    from m3ctl.tuning.search import num_prompts  # noqa: PLC0415
    from m3ctl.tuning.server import ServerEvaluator  # noqa: PLC0415

    space = Space.from_json(settings["space"])
    spec = TuneSpec(**settings["spec"])
    prefix = prefix_for(study_dir)
    ev = ServerEvaluator(
        inventory,
        settings["model"],
        Path(study_dir),
        spec,
        plan_base=settings.get("plan_base", {}),
        bench=settings.get("bench", {}),
        port=settings["port"],
        name_prefix=prefix,
        registry=registry or Registry(),
        space=space,
        fast_starts=settings.get("fast_starts", True),
    )
    cands = _dry_run_candidates(ev, space)
    out: dict[str, Any] = {
        "study_dir": str(Path(study_dir).resolve()),
        "model": settings["model"],
        "spec": settings["spec"],
        "bench": settings.get("bench", {}),
        "port": settings["port"],
        "space": {"values": space.values, "free": space.free(), "size": space.size()},
        "pruned": settings.get("pruned", []),
        "candidates": cands,
        "feasible": sum(1 for c in cands if c["status"] == "ok"),
        "prompts_per_run": {c: num_prompts(spec, c, 1.0) for c in spec.ladder},
    }
    if spec.baseline:
        base, why = ev.baseline_candidate()
        out["baseline"] = (
            {"config": base, "command": ev.trial_plan(base, "base").command_line()}
            if base is not None
            else {"skipped": why}
        )
    else:
        out["baseline"] = {"skipped": "--no-baseline"}
    first = space.anchor()
    ok = {key_of(c["config"]): c for c in cands if c["status"] == "ok"}
    out["first"] = {"config": first, "command": ok[key_of(first)]["command"]} if key_of(first) in ok else None
    out["order"] = _dry_run_order(spec, "config" in out["baseline"], out["feasible"])
    out["boundary"] = boundary_rule(spec)
    out["choice"] = choice_rule_text(spec.baseline)
    out["runnable"] = bool(out["feasible"])  # the defaults alone are nothing to tune (smallest_trial refuses a run)
    out["starts"] = ev.start_measures_note(first) if key_of(first) in ok else None
    need = smallest_trial(ev, space) if out["feasible"] else 1  # not runnable: the CLI refuses after printing
    pool = trial_pool(inventory, space, settings["port"], parallel_trials, need=need)
    out["parallel"] = parallel_preview(ev, space, cands, pool)
    if out["parallel"]["trials"] > 1:
        out["order"].insert(
            1 if "config" in out["baseline"] else 0,
            f"search trials run up to {out['parallel']['trials']} at a time on disjoint GPU sets, each "
            "on its own port; the baseline and the confirmations run alone",
        )
    return out


def parallel_preview(ev, space: Space, cands: list[dict[str, Any]], pool) -> dict[str, Any]:
    """The dry run's view of parallel trials: ``trials`` (at once), ``why``, ``ports``, ``slots`` (the GPU sets and
    ports a wave of the smallest configurations gets: [{gpus, port}]), ``first_wave`` (what starts at once on an idle
    host: the first configuration and its poll beside it, [{config, describe, gpus, port, compile_group}]) and
    ``queued`` (the rest of that poll in start order, [{config, describe, compile_group}]). ``compile_group``
    numbers the distinct compile keys (ServerEvaluator.compile_key) in order: starts of one group share the
    torch.compile cache. Rejected configurations start nothing and are left out."""
    from m3ctl.tuning.schedule import Pending, first_wave, order_batch, pick_gpus  # noqa: PLC0415
    from m3ctl.tuning.search import mesh  # noqa: PLC0415

    need = min(space.values.get("tp", [1])) * min(space.values.get("dp", [1]))
    out: dict[str, Any] = {"trials": pool.limit, "why": pool.why, "ports": list(pool.ports)}
    wave: list[dict[str, Any]] = []
    busy: set[int] = set()
    for port in pool.ports:
        g = pick_gpus(pool.topo, need, busy) if pool.topo.gpus else ()
        if g is None:
            break
        busy |= set(g)
        wave.append({"gpus": list(g), "port": port})
    out["slots"] = wave
    ok = {key_of(c["config"]): c for c in cands if c["status"] == "ok"}
    first = space.anchor()
    if key_of(first) not in ok:
        out["first_wave"], out["queued"] = [], []
        return out
    poll = [c for c in mesh(space, first) if key_of(c) in ok]
    groups: dict[str, int] = {}
    infos: dict[str, tuple[int, int]] = {}
    for c in [first, *poll]:  # compile groups numbered in the search's order, the first configuration's 0
        infos[key_of(c)] = (ev.gpus_needed(c), groups.setdefault(ev.compile_key(c), len(groups)))

    def info(c: dict[str, Any]) -> tuple[int, int]:
        return infos[key_of(c)]

    # one at a time, the poll runs in knob order (the serial search); in parallel, grouped by compile key
    batch = [first, *(order_batch(poll, lambda c: info(c)[1], pool.limit) if pool.limit > 1 else poll)]
    pending = [Pending(*info(c)) for c in batch]
    started = first_wave(pending, pool.topo, pool.ports) if pool.topo.gpus else [(0, (), pool.ports[0])]
    out["first_wave"] = [
        {
            "config": batch[i],
            "describe": describe(batch[i], space),
            "gpus": list(g),
            "port": p,
            "compile_group": pending[i].key,
        }
        for i, g, p in started
    ]
    done = {i for i, _, _ in started}
    out["queued"] = [
        {"config": c, "describe": describe(c, space), "compile_group": pending[i].key}
        for i, c in enumerate(batch)
        if i not in done
    ]
    return out


def boundary_rule(spec: TuneSpec) -> str:
    """How a load level is decided (the capacity rule, m3ctl.loadgen.capacity, with the study's
    ``boundary_margin`` and ``boundary_repeats``), in words, for --dry-run."""
    if not spec.slo.strip() or spec.boundary_repeats <= 0:
        return (
            "every load level is measured once"
            + ("" if spec.slo.strip() else " (no SLO, no boundary)")
            + ("" if spec.boundary_repeats > 0 or not spec.slo.strip() else " (--boundary-repeats 0)")
        )
    m, n = f"{spec.boundary_margin * 100:g} %", 1 + spec.boundary_repeats
    return (
        f"a run whose binding SLO term is at least {m} from its limit decides its level alone; a run within {m} "
        f"of its limit (met or missed) is repeated on the same server with fresh prompts, up to "
        f"{spec.boundary_repeats} more run(s): the level holds when the median of the {n} runs meets every SLO "
        f"term and no run misses a term by more than {m} (one run near the limit decides by chance: p90 TPOT "
        "of one H200 configuration measured 28.4, 37.9 and 29.1 ms against 30); it misses as soon as one run "
        f"is more than {m} past a limit or a majority of the {n} miss; repeats count in the time budget"
    )


def tuned_flags(cand: dict[str, Any], plan) -> dict[str, Any]:
    """The ``vllm serve`` flags the tuned knobs set, from the plan's typed flags (what the server was given)."""
    args = dict(plan.vllm_args or {})
    out: dict[str, Any] = {}
    for flag in FLAGS.values():
        if flag in args:
            v = args[flag]
            if flag == "speculative-config" and isinstance(v, str):
                v = json.loads(v)
            elif isinstance(v, str) and v.isdigit():
                v = int(v)
            out[flag] = v
    return out


#: Flags of the parallel knobs: written to the profile's ``parallel`` section, not to ``serve_args``.
PARALLEL_FLAGS = (
    "tensor-parallel-size",
    "data-parallel-size",
    "decode-context-parallel-size",
    "enable-expert-parallel",
    "enable-dbo",
)


def profile_yaml(
    base, cand: dict[str, Any], plan, result: Outcome, settings: dict[str, Any], chosen: str = "tuned", reason: str = ""
) -> str:
    """A full profile (the base profile plus the tuned serve_args and the tuned parallel layout in its
    ``parallel`` section) that ``m3ctl serve --profile FILE`` / ``m3ctl plan --profile FILE`` launch as is:
    plan() takes TP/DP/DCP/EP/DBO from ``parallel`` unless the command line sets them.

    ``chosen`` (m3ctl.tuning.choice): ``tuned``, or ``defaults`` when vLLM's defaults won: then the profile is the
    base profile with no tuned flag (named ``<base>-defaults``) and the layout the defaults were measured with;
    the header says ``# chosen: ...`` and ``# reason: ...`` (the profile schema has no field for them)."""
    from m3ctl.catalog import Profile  # noqa: PLC0415
    from m3ctl.core.secrets import separate  # noqa: PLC0415

    d = base.model_dump(mode="json")
    dropped: list[str] = []  # a secret of the base profile is not copied into the study dir
    for fk, ek in (("serve_args", "env"),):
        sep = separate(d.get(fk), d.get(ek))
        d[fk], d[ek], dropped = sep.args, sep.env, sorted(sep.values)
    for fam in list(d.get("family_args", {})):
        sep = separate(d["family_args"][fam], d.get("family_env", {}).get(fam))
        d["family_args"][fam] = sep.args
        if fam in d.get("family_env", {}):
            d["family_env"][fam] = sep.env
        dropped += sorted(sep.values)
    defaults = chosen == "defaults"
    flags = {} if defaults else tuned_flags(cand, plan)
    d["serve_args"] = {**d["serve_args"], **{k: v for k, v in flags.items() if k not in PARALLEL_FLAGS}}
    d["parallel"] = {"tp": plan.tp, "dp": plan.dp, "dcp": plan.dcp, "ep": plan.ep, "dbo": plan.dbo}
    d["name"] = f"{base.name}-defaults" if defaults else f"{base.name}-tuned"
    measured = (
        f"{settings['spec']['objective']} {result.final:.1f} at concurrency {result.concurrency} under SLO "
        f"{settings['spec']['slo'] or 'none'}"
    )
    d["description"] = (
        f"{base.name} with vLLM's defaults (no tuned flag): the defaults won the m3ctl tune; {measured}"
        if defaults
        else f"{base.name} + m3ctl tune: {describe(cand)}; {measured}"
    )
    d["sources"] = {
        **d.get("sources", {}),
        **{k: "m3ctl tune (measured; see result.json in the study dir)" for k in [*flags, "parallel"]},
    }
    Profile.model_validate(d)
    head = (
        f"# Generated by m3ctl tune from profile {base.name!r}. Launch: m3ctl serve --profile THIS_FILE "
        f"--model {settings['model']} (the {'measured' if defaults else 'tuned'} TP/DP/DCP are in the parallel "
        "section; --tp/--dp/--dcp override them)\n"
    )
    head += f"# chosen: {chosen}\n" + (f"# reason: {' '.join(reason.split())}\n" if reason else "")
    if dropped:
        head += (
            f"# Secrets of the base profile are not copied here: set {', '.join(sorted(set(dropped)))} in the "
            "environment of `m3ctl serve` (they reach the server through its environment only)\n"
        )
    return head + yaml.safe_dump(d, sort_keys=False)


def pareto_png(front: list[dict[str, Any]], points: list[dict[str, Any]], path: Path, objective: str) -> None:
    """The study's Pareto chart (:func:`pareto_figure`) as a PNG, written atomically.

    Raises:
        m3ctl.core.files.WriteFailed: it could not be written (nothing partial is left).
    """
    import io  # noqa: PLC0415

    from m3ctl.core.files import write_atomic  # noqa: PLC0415

    fig = pareto_figure(front, points, objective)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_atomic(path, buf.getvalue())


def pareto_figure(front: list[dict[str, Any]], points: list[dict[str, Any]], objective: str):
    """The matplotlib Figure of the study's Pareto chart (the caller closes it): ``points`` (:func:`all_points`)
    drawn by validity class as the bench chart draws runs (m3ctl.loadgen.report.scatter_by_validity: filled =
    valid, hollow = valid with warnings, grey cross = invalid; a legend entry per class present), ``front``
    (m3ctl.tuning.search.pareto, valid runs only) as a line. x: p90 interactivity (tok/s/user), y: the objective."""
    import matplotlib  # noqa: PLC0415

    from m3ctl.loadgen.report import scatter_by_validity  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 4))
    scatter_by_validity(
        ax,
        [p["interactivity"] for p in points],
        [p["objective"] for p in points],
        [p.get("validity", "clean") for p in points],
        s=16,
        zorder=3,
    )
    ax.plot(
        [p["interactivity"] for p in front],
        [p["objective"] for p in front],
        "-",
        c="C0",
        label="Pareto (valid runs)",
        zorder=2,
    )
    ax.set_xlabel("p90 interactivity (tok/s/user = 1000 / p90 TPOT ms)")
    ax.set_ylabel(objective)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def point_class(p) -> str:
    """The validity class (m3ctl.loadgen.report.validity_class) of a tune Point (m3ctl.tuning.search.Point)."""
    from m3ctl.loadgen.report import validity_class  # noqa: PLC0415

    return validity_class(
        {
            "validity": {"valid": p.valid, "reasons": p.reasons, "warnings": p.warnings},
            "completed": p.metrics.get("completed"),
        }
    )


def all_points(
    outcomes: list[Outcome], invalid_objective: Callable[[Outcome, Any], float | None] | None = None
) -> list[dict[str, Any]]:
    """Every measured level with a p90 TPOT, as ``{interactivity, objective, validity}`` (:func:`point_class`).
    An invalid level's objective is 0 in the search; ``invalid_objective(outcome, point)`` gives the value to draw
    it at (None: left out; without the function invalid levels are left out)."""
    out = []
    for o in outcomes:
        for p in o.points:
            tpot = p.metrics.get("p90_tpot_ms")
            if not tpot:
                continue
            y = p.objective if p.valid else (invalid_objective(o, p) if invalid_objective else None)
            if y is not None:
                out.append({"interactivity": 1000.0 / tpot, "objective": y, "validity": point_class(p)})
    return out


def level_rows(points: list) -> list[dict[str, Any]]:
    """Each measured level of an outcome with the capacity rule's verdict, in measurement order:
    ``concurrency``, ``fidelity`` (> 1: a confirmation), ``holds``, ``state`` (met / missed / undecided),
    ``runs`` and ``confidence`` (m3ctl.loadgen.capacity.Verdict). A level of a study made before the rule has no
    verdict: its recorded decision, said so."""
    rows = []
    for p in points:
        v = p.verdict or {}
        rows.append(
            {
                "concurrency": p.concurrency,
                "fidelity": p.fidelity,
                "holds": bool(p.slo_ok),
                "state": v.get("state") or ("met" if p.slo_ok else "missed"),
                "runs": p.n_runs,
                "confidence": v.get("confidence")
                or f"{p.n_runs} run(s), decided when measured (before the capacity rule; see its runs)",
            }
        )
    return rows


def _capacity(tuner: Tuner, out: Outcome) -> dict[str, Any]:
    """``capacity_runs``, ``capacity_spread``, ``capacity_confidence`` and ``levels`` of an outcome (see
    :func:`write_outputs`)."""
    ev = level_spread(tuner.slo, out.points, out.concurrency)
    spread = {k: v for k, v in ev.items() if k not in ("runs", "concurrency")} if ev else {}
    rows = level_rows(out.points)
    at = [r for r in rows if r["concurrency"] == out.concurrency]
    conf = "; ".join(("confirmation: " if r["fidelity"] > 1 else "") + r["confidence"] for r in at) or None
    return {
        "capacity_runs": ev["runs"] if ev else 0,
        "capacity_spread": spread or None,
        "capacity_confidence": conf,
        "levels": rows,
    }


def _remove_stale(path: Path) -> None:
    """Remove ``path`` if it exists. Raises m3ctl.core.files.WriteFailed (0 bytes) when it cannot be removed."""
    from m3ctl.core.files import WriteFailed  # noqa: PLC0415

    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        raise WriteFailed(path, 0, e, f"remove {path} by hand: no configuration met the SLO") from None


def _best_block(best: Outcome, tuner: Tuner, ev) -> dict[str, Any]:
    """result.json's ``best``: the best search configuration, its command and flags, and its capacity."""
    p = ev.plan(best.config, name="m3ctl")
    return {
        "config": best.config,
        "objective": best.final,
        "concurrency": best.concurrency,
        "command": p.command_line(),
        "argv": p.argv,
        "trial": best.trial,
        "flags": tuned_flags(best.config, p),
        "confirmed": best.confirmed is not None,
        **_capacity(tuner, best),
    }


def _baseline_block(b: Outcome, tuner: Tuner, ev) -> dict[str, Any]:
    """result.json's ``baseline`` of a measured vLLM-defaults configuration."""
    return {
        "config": b.config,
        "objective": b.final,
        "search_objective": b.objective,
        "confirmed": b.confirmed,
        "concurrency": b.concurrency,
        "status": b.status,
        "reason": b.reason,
        "command": ev.command(b.config),
        "cost_s": b.cost_s,
        "points": [asdict(p) for p in b.points],
        **_capacity(tuner, b),
    }


def _write_files(
    study_dir: Path,
    out: dict[str, Any],
    profile_text: str | None,
    front: list[dict[str, Any]],
    res: TuneResult,
    ev,
    settings: dict[str, Any],
) -> None:
    """Write result.json (``out``), profile.yaml (``profile_text``; None: remove a stale one) and, with a
    ``front``, pareto.png, each atomically; one that fails does not stop the others.

    Raises:
        m3ctl.core.files.WriteFailed: the first failure, ``out`` as its ``document`` and the other failures as its
            ``others``.
    """
    from m3ctl.core.files import WriteFailed, write_atomic  # noqa: PLC0415

    writes: list[Callable[[], object]] = [lambda: write_json(study_dir / "result.json", out)]
    if profile_text is not None:
        writes.append(lambda: write_atomic(study_dir / "profile.yaml", profile_text))
    else:  # nothing met the SLO: a profile.yaml of an earlier write (a resumed study) would recommend a loser
        writes.append(lambda: _remove_stale(study_dir / "profile.yaml"))
    if front:
        from m3ctl.loadgen.slo import objective_value  # noqa: PLC0415

        def measured(o: Outcome, p) -> float | None:  # an invalid level's objective, from the throughput it measured
            try:
                return objective_value(
                    p.metrics,
                    settings["spec"]["objective"],
                    ev.n_gpus(o.config),
                    settings["spec"].get("usd_per_gpu_hour"),
                )
            except (KeyError, TypeError, ValueError, BadInput):
                return None

        writes.append(
            lambda: pareto_png(
                front, all_points(res.outcomes, measured), study_dir / "pareto.png", settings["spec"]["objective"]
            )
        )
    lost = []
    for write in writes:  # each file whole or not at all; one that fails does not stop the others
        try:
            write()
        except WriteFailed as e:
            lost.append(e)
    if lost:
        lost[0].document = out  # the caller shows the result before the error (nothing measured is lost)
        lost[0].others = lost[1:]
        raise lost[0]


def write_outputs(
    study_dir: Path, res: TuneResult, tuner: Tuner, ev, settings: dict[str, Any], base_profile, want_pareto: bool
) -> dict[str, Any]:
    """``result.json`` (always), ``profile.yaml`` (the chosen configuration: m3ctl.tuning.choice; none when
    nothing met the SLO), ``pareto.png`` (``--pareto``), each written atomically; returns the result.json dict.

    Raises:
        m3ctl.core.files.WriteFailed: a file could not be written (the others were written); the result dict is its
            ``document`` attribute, the other failures its ``others`` (exit 5: measured, shown, not saved).

    result.json (:class:`m3ctl.results.TuneReport`): ``schema_version``, ``launches`` (search starts), ``confirm_launches`` (the confirmations' fresh servers), ``cost_s`` (server time) and ``elapsed_s`` (wall) across all resumes;
    ``interrupted_launches`` {trial: {cost_s}}: starts killed before any run finished (counted in both);
    ``capacity_rule`` {margin, min_repeats, text}: how every level was decided (m3ctl.loadgen.capacity);
    ``chosen`` ``tuned`` | ``defaults`` | ``none`` and ``reason``: what ``profile`` (the profile.yaml path; absent
    for ``none``) holds and why (m3ctl.tuning.choice: never a configuration measured worse than vLLM's defaults);
    ``closest`` (``chosen`` none only) {config, describe, trial, concurrency, misses [{term, key, value, limit,
    over}], text}: the level nearest to the SLO and by how much each term missed there;
    ``best`` (the best search configuration, also when the defaults beat it) {config, objective, concurrency,
    command, argv, trial, flags, capacity_runs, capacity_spread, capacity_confidence, levels};
    ``baseline`` {config, objective (the worse of search and confirmation, like ``best``), search_objective,
    confirmed, concurrency, command, status, reason, cost_s, points, capacity_runs, capacity_spread,
    capacity_confidence, levels} or {skipped: why} when the study measured vLLM's defaults; ``capacity_runs``:
    the valid bench runs at the reported concurrency (repeats near the SLO boundary and confirmation included),
    ``capacity_spread``: their binding SLO term and its min/median/max (m3ctl.tuning.search.level_spread; None
    without an SLO), ``capacity_confidence``: the rule's verdict there in words, ``levels``: every measured level
    with its verdict (:func:`level_rows`); every run of a repeated level and its verdict are in
    ``trials[].points[]`` (``runs``, ``verdict``); ``vs_baseline`` = best / baseline objective (None when either
    is missing or 0); ``fresh_server_spread`` (m3ctl.tuning.choice.fresh_server_spread, or None) and, when the
    tuned configuration is chosen, ``chosen_trial`` (the trial profile.yaml holds).
    """
    from m3ctl.loadgen.capacity import CapacityRule  # noqa: PLC0415
    from m3ctl.results import TUNE_SCHEMA_VERSION, TuneReport  # noqa: PLC0415
    from m3ctl.tuning.choice import choose, fresh_server_spread  # noqa: PLC0415

    spec = settings["spec"]
    out: dict[str, Any] = {
        "schema_version": TUNE_SCHEMA_VERSION,
        "stopped_by": res.stopped_by,
        "launches": res.launches,
        "confirm_launches": res.confirm_starts,
        "cost_s": res.cost_s,
        "elapsed_s": res.elapsed_s,
        "interrupted_launches": tuner.lost,
        "slo": spec["slo"],
        "objective": spec["objective"],
        "capacity_rule": CapacityRule.from_spec(tuner.spec).to_json(),
        "trials": [o.to_json() for o in sorted(res.outcomes, key=lambda o: o.trial or 0)],
    }
    equivalent = load_equivalence(ev)
    choice = choose(
        res.best,
        res.baseline,
        tuner.slo,
        res.outcomes,
        lambda c: describe(c, tuner.space),
        spec["objective"],
        equivalent=equivalent,
    )
    out.update(chosen=choice.chosen, reason=choice.reason)
    out["fresh_server_spread"] = fresh_server_spread(res.outcomes, res.baseline, equivalent)
    if choice.chosen == "tuned" and choice.outcome is not None:
        out["chosen_trial"] = choice.outcome.trial
    if choice.closest is not None:
        out["closest"] = choice.closest
    if res.best is not None:
        out["best"] = _best_block(res.best, tuner, ev)
    profile_text = None
    if choice.outcome is not None:
        o = choice.outcome
        p = ev.plan(o.config, name="m3ctl")
        profile_text = profile_yaml(base_profile, o.config, p, o, settings, choice.chosen, choice.reason)
        out["profile"] = str(study_dir / "profile.yaml")
    b = res.baseline
    if b is not None:
        out["baseline"] = {"skipped": b.reason} if b.status == "skipped" else _baseline_block(b, tuner, ev)
        out["vs_baseline"] = res.best.final / b.final if res.best is not None and b.final > 0 else None
    front = pareto(res.outcomes)
    out["pareto"] = front
    if want_pareto and front:
        out["pareto_png"] = str(study_dir / "pareto.png")
    TuneReport.from_dict(out, "result.json being written")  # the typed shape (m3ctl/results.py) is what is written
    _write_files(study_dir, out, profile_text, front if want_pareto else [], res, ev, settings)
    return out


__all__ = [
    "TuneSettings",
    "base_profile",
    "boundary_rule",
    "check_budgets",
    "dry_run",
    "level_rows",
    "load_settings",
    "new_settings",
    "parallel_preview",
    "plan_kwargs",
    "prefix_for",
    "resume_settings",
    "run_tune",
    "save_settings",
    "trial_pool",
    "write_outputs",
]
