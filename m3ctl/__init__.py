"""m3ctl: get MiniMax-M3.1-Flash serving on vLLM, fast and correctly, on the GPUs at hand.

The package is a library first; :mod:`m3ctl.cli` is a thin Typer layer over it.
Importing :mod:`m3ctl` (and running ``m3ctl --help``/``--version``) never imports
vLLM, torch, NVML, amdsmi or docker: those are imported lazily where they are used.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
