"""The API of ``m3ctl tune``: the options are :class:`m3ctl.tuning.options.TuneOptions` (declared there once),
checked here and handed whole to the study (m3ctl.tuning.settings, m3ctl.tuning.study)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from m3ctl.api._args import _checked
from m3ctl.api._plan import host_inventory, user_defaults
from m3ctl.errors import BadInput
from m3ctl.results import TuneReport
from m3ctl.serving import serve as serving
from m3ctl.tuning import study as st
from m3ctl.tuning.options import RESUME_OPTIONS, TuneOptions
from m3ctl.tuning.pool import nothing_to_tune
from m3ctl.tuning.settings import tune_options

if TYPE_CHECKING:
    from m3ctl.hw.inventory import HostInventory
    from m3ctl.tuning.plans import TrialPlans


# ----------------------------------------------------------------------------- tune
def prepare_tune(
    model: str | None = None,
    *,
    study_dir: str | Path | None = None,
    resume: str | Path | None = None,
    inventory: str | Path | HostInventory | None = None,
    system: str | None = None,
    dry_run: bool = False,
    options: TuneOptions | dict[str, Any] | None = None,
    **overrides: Any,
) -> tuple[Path, dict[str, Any], HostInventory]:
    """What :func:`tune` checks and settles before any trial: ``(study dir, settings (tune.json), inventory)``;
    a new study's settings are saved unless ``dry_run``. ``options`` (a :class:`m3ctl.tuning.options.TuneOptions`
    or a dict of its fields) and ``overrides`` (its fields by name): the study's options (None: not given; a new
    study takes the default, a resume keeps the saved value; ``port``: as the CLI's). ``m3ctl tune`` runs the
    study from it with its own progress lines.

    Raises:
        BadInput: as :func:`tune`.
    """
    return _prepare_tune(
        model,
        study_dir=study_dir,
        resume=resume,
        inventory=inventory,
        system=system,
        dry_run=dry_run,
        options=options,
        **overrides,
    )[:3]


def _prepare_tune(
    model: str | None,
    *,
    study_dir: str | Path | None,
    resume: str | Path | None,
    inventory: str | Path | HostInventory | None,
    system: str | None,
    dry_run: bool,
    options: TuneOptions | dict[str, Any] | None,
    **overrides: Any,
) -> tuple[Path, dict[str, Any], HostInventory, TrialPlans | None]:
    """:func:`prepare_tune`, and a new study's trial plans (m3ctl.tuning.settings.new_study: the configurations its
    settings planned, for the study to reuse); None for a resume."""
    plans = None
    if isinstance(options, dict):
        overrides, options = {**options, **overrides}, None
    opts = tune_options(options, "m3ctl.tune", **overrides)
    if system and not dry_run:
        raise BadInput(f"--system {system} is a host you don't have: nothing can be measured there", "add --dry-run")
    inv = host_inventory(inventory, system)
    if resume:
        sdir = Path(resume)
        given = {k: getattr(opts, k) for k in RESUME_OPTIONS if k in opts.model_fields_set}
        settings = st.resume_settings(sdir, save=not dry_run, **given)
    else:
        user = user_defaults()
        model = model or (user.model if "model" in user.model_fields_set else None)
        if not model:
            raise BadInput(
                "--model is required (or --resume DIR)", "e.g. m3ctl tune --model DIR --slo 'p90_tpot_ms<=50'"
            )
        sdir = Path(study_dir) if study_dir else Path.cwd() / f"m3ctl-tune-{time.strftime('%Y%m%d-%H%M%S')}"
        if opts.port is None:  # not given: $M3CTL_PORT, the config file's, else 8000 (as the CLI)
            opts = opts.model_copy(update={"port": user.port})
        opts = _user_max_model_len(opts, user)
        settings, plans = st.new_study(model, inv, opts, study_dir=sdir, save=not dry_run)
    return sdir, settings, inv, plans


def _user_max_model_len(opts: TuneOptions, user: Any) -> TuneOptions:
    """``opts`` with the user config's ``max_model_len`` as every trial's ``--max-model-len``, as ``plan`` takes it,
    unless the tune's own flags give one (``--arg max-model-len=N`` or a raw ``--max-model-len N``)."""
    if "max_model_len" not in user.model_fields_set or user.max_model_len is None:
        return opts
    given = {k.lstrip("-").replace("_", "-") for k in opts.args}
    given |= {a.lstrip("-").split("=", 1)[0].replace("_", "-") for a in opts.extra_args if a.startswith("--")}
    if "max-model-len" in given:
        return opts
    return opts.model_copy(update={"args": {**opts.args, "max-model-len": user.max_model_len}})


def tune_refusal(report: dict[str, Any]) -> Exception | None:
    """The error a ``tune(dry_run=True)`` report stands for when nothing in it can run (``report["runnable"]``
    False: the plan rules reject every configuration of the space), the one a run raises before any start
    (m3ctl.tuning.pool.nothing_to_tune: ConfigRejected, exit 3); None when the study can run."""
    if report.get("runnable", True):
        return None
    c = report["candidates"][0] if report.get("candidates") else {"describe": "-", "reason": "an empty space"}
    return nothing_to_tune(len(report.get("candidates") or []), c["describe"], c.get("reason", ""))


@overload
def tune(model: str | None = None, *, dry_run: Literal[False] = False, **kw: Any) -> TuneReport: ...
@overload
def tune(model: str | None = None, *, dry_run: Literal[True], **kw: Any) -> dict[str, Any]: ...


@_checked
def tune(
    model: str | None = None,
    *,
    options: TuneOptions | None = None,
    study_dir: str | Path | None = None,
    resume: str | Path | None = None,
    pareto: bool = False,
    inventory: str | Path | HostInventory | None = None,
    system: str | None = None,
    dry_run: bool = False,
    on_event: Callable[[int | None, str, str], None] | None = None,
    parallel_trials: int | Literal["auto"] = "auto",
    on_study: Callable[[Path, dict[str, Any]], None] | None = None,
    on_cleanup: Callable[[list[str]], None] | None = None,
    on_finish: Callable[[Any, Any], None] | None = None,
    **overrides: Any,
) -> TuneReport | dict[str, Any]:
    """Search TP/DCP/DBO/EP, speculation depth and batching by measurement under an SLO (``m3ctl tune``).

    The study's settings, their defaults and help are :class:`m3ctl.tuning.options.TuneOptions` (declared there
    once; ``m3ctl tune``'s options and this function's ``**overrides`` are derived from it). ``model`` defaults to
    ``$M3CTL_MODEL`` / the user's config file's, ``port`` to ``$M3CTL_PORT`` / the config file's, else 8000
    (:func:`user_defaults`), as the CLI. A new study of ``model`` goes to ``study_dir`` (default
    ``./m3ctl-tune-<time>``); ``resume`` continues the study in that directory (its saved settings; the
    ``RESUME_OPTIONS`` given here (``max_trials``, ``time_budget_s``, ``baseline``, ``confirm_top``) replace the
    saved ones; budgets count across resumes).

    Args:
        options, **overrides: the study's options, a :class:`m3ctl.tuning.options.TuneOptions` and/or its fields
            by name (units, defaults and help there; each override is checked against its field's type: one
            BadInput line), e.g. ``slo="p90_tpot_ms<=20"``, ``knobs=["spec_depth=0-4"]``, ``max_trials`` (server
            starts), ``time_budget_s``; None: not given (a new study's default, a resume's saved value; ``port``:
            as the CLI's).
        pareto: also write ``pareto.png`` and the Pareto front into the result.
        dry_run: start and write nothing; return what the study would run (m3ctl.tuning.render.dry_run's dict).
        on_event: ``(trial, config description, message)`` for each trial phase.
        parallel_trials: search trials at once on disjoint GPU sets (``"auto"``: as many as fit; 1: one after the
            other); not saved with the study (a resume takes it again). See docs/tune.md, "Parallel trials".
        on_study, on_cleanup, on_finish: called with ``(study dir, settings)`` before the first trial, with the
            names of leftover servers of an interrupted run once they are stopped, and with ``(TuneResult,
            Tuner)`` (m3ctl.tuning.search) when the search ends, before the outputs are written.

    Returns:
        :class:`~m3ctl.results.TuneReport` (``result.json``): ``chosen`` (``tuned``, ``defaults`` when vLLM's
        defaults won or tied, ``none`` when nothing met the SLO: ``report.ok`` False, ``closest`` names the
        nearest miss) and ``reason``, ``best`` (the best search configuration), ``baseline``, ``vs_baseline``,
        ``capacity_rule``, ``trials``, ``pareto``; ``profile.yaml`` is written to the study dir for the chosen
        configuration (none for ``none``). With ``dry_run``: the dry-run dict.

    Raises:
        BadInput: an unknown option or a value of the wrong type; bad options (SLO, objective, ladder, workload,
            budgets, lengths), ``system`` without ``dry_run`` (nothing can be measured there), a directory that
            already holds a study, an unreadable or corrupt study (``tune.json``).
        KeyboardInterrupt: interrupted; the trial's server is stopped, completed trials are kept (resume).
    """
    sdir, settings, inv, plans = _prepare_tune(
        model,
        study_dir=study_dir,
        resume=resume,
        inventory=inventory,
        system=system,
        dry_run=dry_run,
        options=options,
        **overrides,
    )
    base = st.base_profile(settings, inv)
    if dry_run:
        return st.dry_run(sdir, settings, inventory=inv, parallel_trials=parallel_trials, plans=plans)
    if on_study is not None:
        on_study(sdir, settings)
    with serving.stop_signals_as_interrupt():  # SIGTERM/SIGHUP: the trial's server is stopped as on Ctrl-C
        res, tuner, ev = st.run_tune(
            sdir,
            settings,
            inventory=inv,
            on_event=on_event,
            on_cleanup=on_cleanup,
            parallel_trials=parallel_trials,
            plans=plans,
        )
    if on_finish is not None:
        on_finish(res, tuner)
    return TuneReport.from_dict(
        st.write_outputs(sdir, res, tuner, ev, settings, base, pareto), str(sdir / "result.json")
    )
