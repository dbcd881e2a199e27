"""Study directory: settings (``tune.json``), the optuna SQLite study (``study.db``), one folder per trial
(``trials/NNNN/``: config, bench JSONs, server.log), ``running.json`` while a server runs, and the outputs
(``result.json``, ``pareto.png``, ``profile.yaml``). :func:`run_tune` starts or resumes a study.

The study's parts: its settings (:mod:`m3ctl.tuning.settings`), where its trials run (:mod:`m3ctl.tuning.pool`),
the search (:mod:`m3ctl.tuning.search`), what it shows (:mod:`m3ctl.tuning.render`) and writes
(:mod:`m3ctl.tuning.outputs`); their public names are importable from here too."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from m3ctl.core.state import Registry
from m3ctl.errors import EXIT_NOT_SAVED, BadInput, ConfigRejected, M3Error, NothingToTune, cause
from m3ctl.tuning.measure import TuneResult
from m3ctl.tuning.options import TuneSpec
from m3ctl.tuning.outputs import write_outputs
from m3ctl.tuning.plans import TrialPlans
from m3ctl.tuning.pool import nothing_to_tune, smallest_trial, trial_pool
from m3ctl.tuning.render import (
    PARALLEL_FLAGS,
    _dry_run_order,
    all_points,
    boundary_rule,
    dry_run,
    level_rows,
    parallel_preview,
    pareto_figure,
    pareto_png,
    point_class,
    profile_yaml,
    tuned_flags,
)
from m3ctl.tuning.search import Tuner, load_equivalence
from m3ctl.tuning.server import ServerEvaluator, stop_leftovers
from m3ctl.tuning.settings import (
    SETTINGS_SCHEMA_VERSION,
    TuneSettings,
    base_profile,
    check_budgets,
    check_study_db,
    load_settings,
    local_tokenizer,
    new_settings,
    new_study,
    prefix_for,
    resume_settings,
    save_settings,
)
from m3ctl.tuning.space import Space, plan_kwargs

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
        try:
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            f.flush()
        except OSError as e:
            raise ConfigRejected(
                f"{cause(e)} writing the study's lock {study_dir / LOCK_FILE}",
                "free space or make it writable, then rerun",
            ) from None
        try:
            yield
        finally:
            f.truncate(0)
            fcntl.flock(f, fcntl.LOCK_UN)


def open_tuner(study_dir: Path, space: Space, ev, spec: TuneSpec, on_event=None, pool=None) -> Tuner:
    """The study's :class:`~m3ctl.tuning.search.Tuner` on its optuna SQLite file ``study.db`` (created when new);
    ``pool``: trials at once (:func:`trial_pool`), None: one at a time.

    Raises:
        ConfigRejected: the disk is full or read-only, or the optuna/sqlalchemy install is broken (which module)
            (exit 3: nothing was measured); see :func:`open_failure`.
        BadInput: ``study.db`` is not a readable optuna SQLite study (corrupt, truncated, another file);
            nothing has started.
    """
    db = Path(study_dir) / "study.db"
    new = not db.exists()
    try:
        return Tuner(space, ev, spec, storage=f"sqlite:///{db}", on_event=on_event, pool=pool)
    except Exception as e:  # noqa: BLE001 - sqlalchemy/optuna raise many kinds (DatabaseError, RuntimeError...)
        raise open_failure(e, db, new) from None


def _chain(e: BaseException) -> Iterator[BaseException]:
    """``e``, then what it wraps (sqlalchemy's ``orig``, ``__cause__``, ``__context__``), each once."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        orig = getattr(x, "orig", None)
        todo += [orig if isinstance(orig, BaseException) else None, x.__cause__, x.__context__]


#: SQLite's result codes that are the file system's answer, not the study's content (https://sqlite.org/rescode.html)
_SQLITE_CAUSES = {13: "no space left on device", 8: "read-only file system or database", 10: "I/O error"}


def open_failure(e: BaseException, db: Path, new: bool) -> M3Error:
    """The error that names why ``db`` could not be created or opened: a broken optuna/sqlalchemy install (the
    missing module), the file system's answer (disk full, read-only, I/O: from the OSError or SQLite's result
    code), else (an existing study) not a readable optuna study, or (a new one) the creation's own error."""
    chain = list(_chain(e))
    if imp := next((x for x in chain if isinstance(x, ImportError)), None):
        mod = imp.name or str(imp)
        pkg = (imp.name or "optuna").split(".")[0]
        return ConfigRejected(
            f"the optuna/sqlalchemy install is broken: {type(imp).__name__}: {imp} (opening the study {db})",
            f"reinstall {pkg} in m3ctl's environment (`pip install --force-reinstall {pkg}`; "
            f"`python -c 'import {mod}'` shows the fault), then rerun",
        )
    what = "creating" if new else "opening"
    for x in chain:
        code = getattr(x, "sqlite_errorcode", None)
        words = cause(x) if isinstance(x, OSError) else _SQLITE_CAUSES.get((code or 0) & 0xFF)
        if words:
            space = words == "no space left on device" or getattr(x, "errno", None) == errno.EDQUOT
            return ConfigRejected(
                f"{words} {what} the optuna study {db} ({type(x).__name__}: {_first(x)})",
                ("free space on its file system" if space else "make its directory writable")
                + " or choose another study directory, then rerun"
                + (" (nothing was measured)" if new else f" `m3ctl tune --resume {db.parent}`"),
            )
    if new:
        return ConfigRejected(
            f"could not create the optuna study {db} ({type(e).__name__}: {_first(e)})",
            "--debug shows the traceback; nothing was measured",
        )
    return BadInput(
        f"{db} is not a readable optuna study ({type(e).__name__}: {_first(e)})",
        "restore it from a backup, or move it away to start the search over (the trials/ folder "
        "and tune.json are kept)",
    )


class StudyNotSaved(M3Error):
    """The study's record could not be written while it ran (disk full, read-only, I/O error): exit 5, as any result
    measured but not saved. The trial servers are stopped; what was saved before (finished trials, each trial's runs
    in its folder) is kept for ``--resume``."""

    exit_code = EXIT_NOT_SAVED


def save_failure(e: BaseException, db: Path) -> M3Error | None:
    """The error naming why the running study's ``db`` could not be written (the file system's answer, from the
    OSError or SQLite's result code in ``e``'s chain: optuna wraps it as ``StorageInternalError``), None when
    ``e`` is no such failure. Before, a disk that filled mid-trial was an internal error."""
    for x in _chain(e):
        code = getattr(x, "sqlite_errorcode", None)
        words = cause(x) if isinstance(x, OSError) else _SQLITE_CAUSES.get((code or 0) & 0xFF)
        if words:
            space = words == "no space left on device" or getattr(x, "errno", None) == errno.EDQUOT
            return StudyNotSaved(
                f"{words} writing the optuna study {db} during the run ({type(x).__name__}: {_first(x)})",
                ("free space on its file system" if space else "make its directory writable")
                + f", then `m3ctl tune --resume {db.parent}` (the trial servers were stopped; finished trials and "
                "every saved run are kept)",
            )
    return None


def _first(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:160]


def run_tune(
    study_dir: Path,
    settings: dict[str, Any],
    *,
    inventory,
    registry=None,
    on_event: Callable[[int | None, str, str], None] | None = None,
    on_cleanup: Callable[[list[str]], None] | None = None,
    parallel_trials: int | str = "auto",
    plans: TrialPlans | None = None,
) -> tuple[TuneResult, Tuner, Any]:
    """Start or continue the study in ``study_dir`` with ``settings`` (the ``tune.json`` shape:
    ``model``, ``space``, ``spec``, ``plan_base``, ``bench``, ``port``). Leftover servers of a killed
    run are stopped first. Returns the result, the tuner and the evaluator. ``parallel_trials``: trials at once on
    disjoint GPU sets (:func:`trial_pool`; a run setting, not saved: a resumed study may run elsewhere). ``plans``:
    the new study's trial plans (:func:`new_study`), whose plans the evaluator reuses (TrialPlans.share_plans).

    The study is locked for the run (:func:`study_lock`): a second concurrent run of it refuses before touching it.

    Raises:
        ConfigRejected: another process runs this study, the plan rules reject every configuration of its space
            (:func:`smallest_trial`), or its ``study.db`` could not be created (disk full, broken optuna install:
            :func:`open_failure`); a new study's folder is then removed, lock and partial study.db included:
            nothing was measured (exit 3).
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
                plans=plans,
            )
    except M3Error:
        if fresh and not (sdir / "trials").exists():  # a refused or uncreated new study leaves no folder behind
            for f in ("tune.json", LOCK_FILE, "study.db", "study.db-journal", "study.db-wal", "study.db-shm"):
                with contextlib.suppress(OSError):
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
    plans: TrialPlans | None = None,
) -> tuple[TuneResult, Tuner, Any]:

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
    ev.share_plans(plans)
    pool = trial_pool(inventory, settings["port"], parallel_trials, need=smallest_trial(ev, space))
    tuner = open_tuner(study_dir, space, ev, spec, on_event, pool=pool if pool.limit > 1 else None)
    try:
        res = tuner.run()
    except Exception as e:  # a record that could not be written is named (disk full), else re-raised
        if (failed := save_failure(e, study_dir / "study.db")) is not None:
            raise failed from None
        raise
    finally:
        ev.stop_current()
        ev.stop_slots()
        ev.discard_prewarmed()
    return res, tuner, ev


__all__ = [
    "LOCK_FILE",
    "PARALLEL_FLAGS",
    "SETTINGS_SCHEMA_VERSION",
    "NothingToTune",
    "StudyNotSaved",
    "TuneSettings",
    "_dry_run_order",
    "all_points",
    "base_profile",
    "boundary_rule",
    "check_budgets",
    "check_study_db",
    "dry_run",
    "level_rows",
    "load_equivalence",
    "load_settings",
    "local_tokenizer",
    "new_settings",
    "new_study",
    "nothing_to_tune",
    "open_tuner",
    "parallel_preview",
    "pareto_figure",
    "pareto_png",
    "plan_kwargs",
    "point_class",
    "prefix_for",
    "profile_yaml",
    "resume_settings",
    "run_tune",
    "save_failure",
    "save_settings",
    "smallest_trial",
    "study_lock",
    "trial_pool",
    "tuned_flags",
    "write_outputs",
]
