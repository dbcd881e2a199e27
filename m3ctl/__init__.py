"""m3ctl: get MiniMax-M3.1-Flash serving on vLLM, fast and correctly, on the GPUs at hand.

The package is a library first; :mod:`m3ctl.cli` is a thin Typer layer over it, and :mod:`m3ctl.api` is the
Python API, re-exported here: ``m3ctl.doctor()``, ``m3ctl.plan()``, ``m3ctl.serve()``, ``m3ctl.stop()``,
``m3ctl.bench()``, ``await m3ctl.abench()``, ``m3ctl.tune()`` (``from m3ctl.api import ...`` for type checkers).

Five of those names are also modules of the package (``m3ctl/plan.py``, ``m3ctl/serve.py``, ``m3ctl/doctor.py``,
``m3ctl/bench/``, ``m3ctl/tune/``), and Python binds a submodule to its name in the package once imported. So
``m3ctl.plan`` stays the module (``from m3ctl import serve as serving`` keeps working) and calling it calls the
API function: those modules are :class:`_ApiModule` s (``__call__`` -> ``m3ctl.api.<name>``).

Importing :mod:`m3ctl` (and running ``m3ctl --help``/``--version``) never imports vLLM, torch, NVML, amdsmi
or docker: those are imported lazily where they are used; the API is imported on first use.
"""

import importlib
import sys
import types

__version__ = "0.1.0"

#: The API functions (m3ctl/api.py) available as ``m3ctl.<name>``.
API = ("doctor", "plan", "serve", "stop", "bench", "abench", "tune")
#: API names that are also submodules of the package: the module is returned, and calling it calls the API.
_MODULE_NAMES = ("doctor", "plan", "serve", "bench", "tune")

__all__ = ["__version__", "abench", "bench", "doctor", "plan", "serve", "stop", "tune"]  # = API


class _ApiModule(types.ModuleType):
    """A submodule whose name is also an API function: ``m3ctl.plan(...)`` calls :func:`m3ctl.api.plan`."""

    def __call__(self, *args, **kwargs):
        return getattr(importlib.import_module("m3ctl.api"), self.__name__.rpartition(".")[2])(*args, **kwargs)

    @property
    def __signature__(self):  # inspect.signature(m3ctl.plan): the API function's
        import inspect  # noqa: PLC0415

        return inspect.signature(getattr(importlib.import_module("m3ctl.api"), self.__name__.rpartition(".")[2]))


def _api_module(name: str) -> None:
    """Make the module ``name`` (one of :data:`_MODULE_NAMES`) callable as its API function; each of those
    modules calls this on itself when it is imported."""
    sys.modules[name].__class__ = _ApiModule


def __getattr__(name: str):
    """``m3ctl.<api name>``, imported on first use (PEP 562)."""
    if name in _MODULE_NAMES:
        return importlib.import_module(f"m3ctl.{name}")
    if name in API:
        return getattr(importlib.import_module("m3ctl.api"), name)
    raise AttributeError(f"module 'm3ctl' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *API})
