"""The Python API: one call per ``m3ctl`` command, typed arguments and typed results (notebooks, scripts).

Re-exported at the package: ``import m3ctl; m3ctl.doctor()``, ``m3ctl.plan(...)``, ``m3ctl.serve(...)``,
``m3ctl.stop(...)``, ``m3ctl.bench(...)``, ``await m3ctl.abench(...)``, ``m3ctl.tune(...)``.
``from m3ctl.api import bench`` gives the same functions with their signatures for type checkers.

Every function mirrors its CLI command (same defaults, same checks) with keyword arguments whose units are in
their names or documented (``*_s`` seconds, ``*_ms`` milliseconds, lengths in tokens, money in USD). Errors
are :class:`~m3ctl.errors.M3Error` subclasses with a one-line ``message`` and a ``hint``: ``BadInput``
(exit code 2 in the CLI), ``ConfigRejected`` (3), ``LaunchFailed`` (4), ``ChecksFailed`` (1).

Host to evaluate (``doctor``, ``plan``, ``tune``): ``inventory`` (a saved ``m3ctl doctor --save-inventory``
file, or a :class:`~m3ctl.hw.inventory.HostInventory`), or ``system`` (a catalog system such as ``h200x8``;
nothing is probed), else this host is detected.

Each verb lives in its own module (``_plan``, ``_doctor``, ``_serve``, ``_bench``, ``_tune``; argument checking in
``_args``) and is resolved on first use (PEP 562): ``m3ctl plan`` imports the planner, never the load generator,
the serving stack or the tuner. Importing this package imports neither vLLM, torch, NVML, amdsmi nor docker.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the verbs with their signatures, for type checkers (resolved lazily at run time: __getattr__)
    from m3ctl.api._bench import abench, bench, bench_error
    from m3ctl.api._doctor import doctor
    from m3ctl.api._estimate import estimate
    from m3ctl.api._plan import (
        host_inventory,
        launch_command,
        plan,
        plan_request,
        system_names,
        user_defaults,
    )
    from m3ctl.api._serve import (
        ServeWatch,
        interrupt_exit_code,
        launch_plan,
        logs,
        prepare_serve,
        running,
        serve,
        serve_fallbacks,
        status,
        stop,
        watch,
    )
    from m3ctl.api._sizing import plan_list, size_systems
    from m3ctl.api._tune import prepare_tune, tune, tune_refusal
    from m3ctl.assess.request import PlanRequest
    from m3ctl.checks.doctor import CheckResult, DoctorReport, Verdict
    from m3ctl.core.signals import interruption, signal_name, signal_policy, signum_of
    from m3ctl.hw.inventory import GpuInfo, HostInventory
    from m3ctl.loadgen.config import BenchConfig
    from m3ctl.planning.estimate import Estimate
    from m3ctl.planning.listing import PlanList
    from m3ctl.planning.plan import LaunchPlan
    from m3ctl.planning.workload import EstimateRequest
    from m3ctl.results import BenchResult, BenchSweep, BenchValidity, TuneBest, TuneReport
    from m3ctl.runtime.base import StopReport
    from m3ctl.serving.serve import ServeResult
    from m3ctl.tuning.options import TuneOptions

__all__ = [
    "BenchConfig",
    "BenchResult",
    "BenchSweep",
    "BenchValidity",
    "CheckResult",
    "DoctorReport",
    "Estimate",
    "EstimateRequest",
    "GpuInfo",
    "HostInventory",
    "LaunchPlan",
    "PlanList",
    "PlanRequest",
    "ServeResult",
    "ServeWatch",
    "StopReport",
    "TuneBest",
    "TuneOptions",
    "TuneReport",
    "Verdict",
    "abench",
    "bench",
    "bench_error",
    "doctor",
    "estimate",
    "host_inventory",
    "interrupt_exit_code",
    "interruption",
    "launch_command",
    "launch_plan",
    "logs",
    "plan",
    "plan_list",
    "plan_request",
    "prepare_serve",
    "prepare_tune",
    "running",
    "serve",
    "serve_fallbacks",
    "signal_name",
    "signal_policy",
    "signum_of",
    "size_systems",
    "status",
    "stop",
    "system_names",
    "tune",
    "tune_refusal",
    "user_defaults",
    "watch",
]

#: Where each public name lives: the verbs in this package's modules, the result and settings types in theirs.
#: Each is imported on first use (``from m3ctl.api import LaunchPlan``, ``m3ctl.api.plan(...)``).
_HOME = {
    **dict.fromkeys(("abench", "bench", "bench_error"), "m3ctl.api._bench"),
    "doctor": "m3ctl.api._doctor",
    "estimate": "m3ctl.api._estimate",
    "Estimate": "m3ctl.planning.estimate",
    "EstimateRequest": "m3ctl.planning.workload",
    **dict.fromkeys(("plan_list", "size_systems"), "m3ctl.api._sizing"),
    **dict.fromkeys(
        (
            "host_inventory",
            "launch_command",
            "plan",
            "plan_request",
            "system_names",
            "user_defaults",
            "resolve_if_offline",
        ),
        "m3ctl.api._plan",
    ),
    **dict.fromkeys(
        (
            "ServeWatch",
            "launch_plan",
            "logs",
            "prepare_serve",
            "running",
            "serve",
            "serve_fallbacks",
            "serve_plan",
            "status",
            "stop",
            "watch",
            "Status",
            "LogTail",
        ),
        "m3ctl.api._serve",
    ),
    **dict.fromkeys(("prepare_tune", "tune", "tune_refusal"), "m3ctl.api._tune"),
    **dict.fromkeys(("BenchResult", "BenchSweep", "BenchValidity", "TuneBest", "TuneReport"), "m3ctl.results"),
    "PlanRequest": "m3ctl.assess.request",
    "LaunchPlan": "m3ctl.planning.plan",
    "PlanList": "m3ctl.planning.listing",
    **dict.fromkeys(("DoctorReport", "CheckResult", "Verdict"), "m3ctl.checks.doctor"),
    **dict.fromkeys(("HostInventory", "GpuInfo"), "m3ctl.hw.inventory"),
    "BenchConfig": "m3ctl.loadgen.config",
    "TuneOptions": "m3ctl.tuning.options",
    "ServeResult": "m3ctl.serving.serve",
    "StopReport": "m3ctl.runtime.base",
    #: the one signal policy (SIGINT, SIGTERM, SIGHUP): its exit status and the interruption each raises
    **dict.fromkeys(
        ("interrupt_exit_code", "interruption", "signal_name", "signal_policy", "signum_of"), "m3ctl.core.signals"
    ),
}


def __getattr__(name: str) -> Any:
    """A public verb or type of :data:`_HOME`, imported from its module on first use (PEP 562)."""
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
