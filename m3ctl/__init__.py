"""m3ctl: get MiniMax-M3.1-Flash serving on vLLM, fast and correctly, on the GPUs at hand.

The package is a library first; :mod:`m3ctl.cli` is a thin Typer layer over it, and :mod:`m3ctl.api` is the
Python API, re-exported here: ``m3ctl.doctor()``, ``m3ctl.plan()``, ``m3ctl.serve()``, ``m3ctl.stop()``,
``m3ctl.bench()``, ``await m3ctl.abench()``, ``m3ctl.tune()`` (``from m3ctl.api import ...`` for type checkers).

Those are plain functions of :mod:`m3ctl.api`; the modules behind them live in the packages of their layer
(``m3ctl.checks``, ``m3ctl.planning``, ``m3ctl.serving``, ``m3ctl.loadgen``, ``m3ctl.tuning``; docs/layers.md).

Importing :mod:`m3ctl` (and running ``m3ctl --help``/``--version``) never imports vLLM, torch, NVML, amdsmi
or docker: those are imported lazily where they are used; the API is imported on first use.
"""

import importlib

__version__ = "0.1.0"

#: The API functions (m3ctl/api/) available as ``m3ctl.<name>``.
API = ("doctor", "plan", "serve", "stop", "bench", "abench", "tune")

__all__ = ["__version__", "abench", "bench", "doctor", "plan", "serve", "stop", "tune"]  # = API


def __getattr__(name: str):
    """``m3ctl.<api name>``, imported on first use (PEP 562)."""
    if name in API:
        return getattr(importlib.import_module("m3ctl.api"), name)
    if name == "api":  # ``import m3ctl; m3ctl.api.plan(...)`` (a submodule is an attribute once imported)
        return importlib.import_module("m3ctl.api")
    raise AttributeError(f"module 'm3ctl' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *API, "api"})
