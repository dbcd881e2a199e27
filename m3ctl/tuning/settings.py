"""A study's settings (``tune.json``): a new study's, checked and built from the options
(:class:`m3ctl.tuning.options.TuneOptions`), a resumed study's, loaded and checked, and their saved form
(:class:`TuneSettings`)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import operator
import sqlite3
from collections.abc import Sequence
from dataclasses import fields as dataclass_fields
from pathlib import Path
from types import GenericAlias, UnionType
from typing import Any, Final, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from m3ctl import catalog
from m3ctl.assess.facts import model_facts, read_model_facts
from m3ctl.catalog import load_profile_file, profile_for_arch
from m3ctl.catalog.vllm_args import canon_flag
from m3ctl.core.files import WriteFailed
from m3ctl.core.secrets import separate, split_api_key
from m3ctl.core.state import check_output_path
from m3ctl.errors import BadInput, ConfigRejected, first_error
from m3ctl.loadgen.config import check_max_duration
from m3ctl.loadgen.runner import MAX_PROMPTS
from m3ctl.loadgen.slo import objective_value, parse_slo
from m3ctl.loadgen.workloads import KINDS, check_prompt_text
from m3ctl.results import _one_line
from m3ctl.tuning.measure import write_json
from m3ctl.tuning.options import (
    RESUME_OPTIONS,
    TuneOptions,
    TuneSpec,
    check_bounds,
    default,
    fact,
    saved_fields,
    spec_default,
)
from m3ctl.tuning.plans import TrialPlans, collapse_same_servers
from m3ctl.tuning.space import FLAGS, Space, apply_pins, default_space, prune_dominated


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

    model_config = ConfigDict(extra="allow", defer_build=True)  # built on first use
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


def resume_settings(study_dir: Path, *, save: bool = True, **given: Any) -> dict[str, Any]:
    """The settings of the study in ``study_dir`` with the :data:`~m3ctl.tuning.options.RESUME_OPTIONS` in
    ``given`` (None: not given, the saved value stays): a resumed study may get a larger budget (e.g. continued on
    another machine); ``max_trials`` (server starts) and ``time_budget_s`` (s) count across resumes. ``baseline``
    turns measuring vLLM's defaults on/off; ``confirm_top`` replaces the number of configurations re-measured at
    the end (0 while a study is spread over several device sessions, then 1 for the last, as on the H200:
    docs/results/h200-scale.md). ``save``: write them back (False: dry run).

    Raises:
        BadInput: as :func:`load_settings`; a negative budget; an option ``--resume`` does not take.
    """
    if unknown := sorted(set(given) - set(RESUME_OPTIONS)):
        raise BadInput(f"--resume does not take {unknown[0]!r}", f"it takes {', '.join(RESUME_OPTIONS)}")
    new = {k: v for k, v in given.items() if v is not None}
    check_bounds(new)
    settings = load_settings(study_dir)
    if save:
        check_output_path(Path(study_dir) / "tune.json", "--resume")
    if new:
        settings["spec"].update({k: new[k] for k in RESUME_OPTIONS if k in new})
        if save:
            save_settings(Path(study_dir), settings)
    return settings


def check_budgets(
    *, max_trials: int | None = None, time_budget_s: float | None = None, confirm_top: int | None = None
) -> None:
    """Raises BadInput for a budget out of its option's range (before anything starts)."""
    check_bounds({"max_trials": max_trials, "time_budget_s": time_budget_s, "confirm_top": confirm_top})


def _check_choices(
    slo: str, objective: str, usd_per_gpu_hour: float | None, ladder: list[int] | None, workload: str
) -> list[int]:
    """:func:`new_settings`'s checks of the SLO, objective, ladder and workload; returns the ladder sorted
    (default: TuneOptions'). Raises BadInput naming what is wrong."""

    parse_slo(slo)
    objective_value({"total_token_throughput": 1.0, "output_throughput": 1.0}, objective, 1, usd_per_gpu_hour)
    lad = sorted(set(ladder if ladder is not None else default("ladder")))
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


def _check_numbers(lad: list[int], prompts_per_concurrency: int) -> None:
    """:func:`new_settings`'s check of the ladder's top against the requests one bench run may send (``lad``: the
    sorted ladder); the options' own ranges are their fields' (m3ctl.tuning.options.check_bounds)."""
    if lad[-1] * prompts_per_concurrency * 2 > MAX_PROMPTS:  # x2: a confirmation run sends twice as many
        raise BadInput(
            f"--ladder {lad[-1]} x --prompts-per-concurrency {prompts_per_concurrency} (x2 to confirm) "
            f"is more than {MAX_PROMPTS:,} requests in one bench run",
            "lower the ladder's top",
        )


def _no_secrets(overrides: dict[str, Any] | None, extra_args: list[str] | None) -> list[str]:
    """The raw vLLM args to store; BadInput for an ``--api-key`` in them or a secret flag in ``overrides`` (the
    study files would keep it)."""

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

    check_output_path(Path(study_dir) / "tune.json", "--study-dir")


def _study_space(
    model: str, inventory, profile_file: str | Path | None, knobs: list[str] | None, lad: list[int], max_spec_depth: int
) -> tuple[Space, Any]:
    """The search space of a new study and what pruning for the ladder removed: from the base profile
    (``profile_file`` or the catalog's for the GPU architecture) and the model's facts, narrowed by ``knobs``."""

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


def _as_given(ann: Any) -> Any:
    """The type an option is checked against when given by name: its field's, with a list as any sequence (a
    tuple is a list of values; a string is not)."""
    if get_origin(ann) is list:
        return GenericAlias(Sequence, (get_args(ann)[0],))
    if get_origin(ann) in (Union, UnionType):
        return functools.reduce(operator.or_, [_as_given(a) for a in get_args(ann)])
    return ann


def tune_options(
    options: TuneOptions | None = None, who: str = "m3ctl.tuning.settings.new_settings", **overrides: Any
) -> TuneOptions:
    """``options`` (default: every option's default) with ``overrides``, each a :class:`TuneOptions` field checked
    against its type (None: not given). ``who`` names the caller in an error, e.g. ``m3ctl.tune``.

    Raises:
        BadInput: one line naming the first unknown option or bad value (``who(name=value): why``).
    """
    ref = "m3ctl.api.tune" if who == "m3ctl.tune" else who
    given = {k: v for k, v in overrides.items() if v is not None}
    if unknown := [k for k in given if k not in TuneOptions.model_fields or k == "schema_version"]:
        raise BadInput(f"{who}(): got an unexpected keyword argument {unknown[0]!r}", f"see help({ref})")
    for name, value in given.items():
        hint = f"see help({ref}) for the type and unit of {name}"
        ann = TuneOptions.model_fields[name].annotation
        if isinstance(value, bool) and ann is not bool and bool not in get_args(ann):  # lax pydantic: True is 1
            raise BadInput(f"{who}({name}={value}): a switch where a value is expected", hint)
        try:
            TypeAdapter(_as_given(ann), config=ConfigDict(arbitrary_types_allowed=True)).validate_python(value)
        except ValidationError as e:
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise BadInput(f"{who}({name}={shown}): {e.errors()[0]['msg']}", hint) from None
    base = (options or TuneOptions()).model_dump(exclude_unset=True)
    try:
        return TuneOptions.model_validate({**base, **given})
    except ValidationError as e:  # a field's own check (text: no bytes, no NUL), one line as the others
        err = first_error(e)
        value = given.get(err.where, base.get(err.where))
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise BadInput(f"{who}({err.where}={shown}): {err.msg}", f"see help({ref}) for {err.where}") from None


def _saved(values: dict[str, Any], place: str) -> dict[str, Any]:
    """The options ``tune.json`` keeps in ``place`` (m3ctl.tuning.options.saved_fields), under their saved name
    (fact ``key``); one whose fact ``omit_default`` is set is left out at its default (older studies lack it)."""
    return {
        fact(n, "key") or n: values[n]
        for n in saved_fields(place)
        if not (fact(n, "omit_default") and values[n] == default(n))
    }


def check_options(opts: TuneOptions) -> tuple[list[int], list[str]]:
    """The values of a new study's options: SLO, objective, ladder, workload, prompt text, budgets, lengths, counts,
    port, boundary rule, price, --max-duration (only with --precision), raw args (no secret) and ``--arg`` flags
    (none tune searches). Returns the ladder sorted and the raw vLLM args to store.

    Raises:
        BadInput: one line naming the option and what is wrong.
    """
    lad = _check_choices(opts.slo, opts.objective, opts.usd_per_gpu_hour, opts.ladder, opts.workload)
    check_prompt_text(opts.prompt_text, opts.workload)
    check_bounds(opts.model_dump())  # every option's range, declared with its field
    check_max_duration(opts.precision, opts.max_duration_s)  # as bench checks it
    _check_numbers(lad, opts.prompts_per_concurrency)
    extra_args = _no_secrets(opts.args, opts.extra_args)
    _no_knob_flags(opts.args)
    return lad, extra_args


def new_settings(
    model: str,
    inventory,
    options: TuneOptions | None = None,
    *,
    study_dir: Path | None = None,
    save: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """The settings (``tune.json`` shape) of a new study of ``model`` on ``inventory``: the search space from
    the base profile (``profile`` or the catalog's for the GPU architecture) and the model's facts,
    narrowed by ``knobs`` (``"spec_depth=0-4"``, ``"max_num_seqs=4,8"``) and pruned for the ``ladder``.
    With ``study_dir``: checked to hold no study yet and to be writable, and (``save``) written there.

    ``options`` and ``overrides``: :class:`m3ctl.tuning.options.TuneOptions` (:func:`tune_options`; defaults and
    units there, e.g. ``ladder`` concurrencies, ``time_budget_s`` seconds, ``usd_per_gpu_hour`` USD,
    ``input_len``/``output_len`` tokens, ``boundary_margin`` a fraction of the SLO limit; ``args``: ``{flag:
    value}`` vLLM flags of every trial; ``extra_args``: raw vLLM args (no ``--api-key``); ``port`` None: 8000).
    Each option goes where its ``saved`` fact says (``spec``, ``bench``, ``plan_base``, the top).

    Raises:
        BadInput: a bad SLO, objective (``tokens_per_usd`` without a price), ladder, workload, knob, budget or
            length; an unreadable profile or model; ``study_dir`` already holds a study or is not writable.
    """
    return new_study(model, inventory, options, study_dir=study_dir, save=save, **overrides)[0]


def new_study(
    model: str,
    inventory,
    options: TuneOptions | None = None,
    *,
    study_dir: Path | None = None,
    save: bool = False,
    **overrides: Any,
) -> tuple[dict[str, Any], TrialPlans]:
    """:func:`new_settings` and the trial plans that collapsed the space (:func:`_collapse_same_servers`): each
    configuration of the space planned once, which the study's evaluator takes over
    (m3ctl.tuning.plans.TrialPlans.share_plans) instead of planning them again. Raises as :func:`new_settings`."""
    opts = tune_options(options, **overrides)
    lad, extra_args = check_options(opts)
    if study_dir is not None:
        _check_new_study_dir(study_dir)
    space, pruned = _study_space(model, inventory, opts.profile, opts.knobs, lad, opts.max_spec_depth)
    # A local model directory and profile file are stored absolute, so `--resume DIR` works from any directory.
    values = {
        **opts.model_dump(),
        "ladder": lad,
        "max_trials": spec_default("max_trials") if opts.max_trials is None else opts.max_trials,
        "port": 8000 if opts.port is None else opts.port,
        "profile": str(Path(opts.profile).resolve()) if opts.profile else None,
        "args": dict(opts.args),
        "extra_args": extra_args,
    }
    spec = _saved(values, "spec")
    settings = {
        "model": str(Path(model).resolve()) if Path(model).is_dir() else model,
        "space": space.to_json(),
        **_saved(values, "top"),
        "pruned": pruned,
        "spec": {f.name: spec[f.name] for f in dataclass_fields(TuneSpec) if f.name in spec},  # the search's order
        "plan_base": _saved(values, "plan_base"),
        "bench": {**_saved(values, "bench"), "tokenizer": local_tokenizer(model, [*extra_args, *opts.args])},
    }
    plans = _collapse_same_servers(settings, inventory, Path(study_dir) if study_dir is not None else Path.cwd())
    if save and study_dir is not None:
        save_settings(Path(study_dir), settings)
    return settings, plans


def _collapse_same_servers(settings: dict[str, Any], inventory, study_dir: Path) -> TrialPlans:
    """Drop from ``settings``' space the knob values whose every configuration plans a server another value of the
    knob plans already (m3ctl.tuning.plans.collapse_same_servers, with the study's own trial plans), a
    note each in ``settings["pruned"]``: saved with the space, so a resume searches the same space. Returns those
    trial plans (every configuration of the space planned)."""
    plan_base = dict(settings["plan_base"])
    if settings.get("profile_file"):
        plan_base["profile"] = load_profile_file(Path(settings["profile_file"]))
    plans = TrialPlans(
        inventory,
        settings["model"],
        study_dir,
        TuneSpec(**settings["spec"]),
        plan_base=plan_base,
        bench=settings["bench"],
        port=settings["port"],
        name_prefix=prefix_for(study_dir),
        space=Space.from_json(settings["space"]),
    )
    space, notes = collapse_same_servers(plans, Space.from_json(settings["space"]))
    settings["space"] = space.to_json()
    settings["pruned"] = [*settings["pruned"], *notes]
    return plans


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

    if settings.get("profile_file"):
        base = load_profile_file(Path(settings["profile_file"]))
        settings["plan_base"]["profile"] = base
        return base
    return profile_for_arch(inventory.arch)
