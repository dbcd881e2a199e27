"""GPU memory held per process, for ``m3ctl stop``'s "nothing left behind" check.

NVIDIA only, through NVML (``nvmlDeviceGetComputeRunningProcesses``,
https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html). NVML is always
initialised and shut down in pairs. Without NVML (CPU host, AMD host, broken driver) the answer
is None, meaning "cannot tell", never "nothing held".
"""

from __future__ import annotations


def gpu_memory_by_pid() -> dict[int, int] | None:
    """``{pid: MiB}`` of GPU memory used by compute processes on every visible NVIDIA GPU.

    Returns:
        The map (empty when no process holds GPU memory), or None when NVML is unavailable.
        PIDs are as NVML reports them (host PIDs when run on the host).
    """
    try:
        import pynvml  # noqa: PLC0415
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    out: dict[int, int] = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                used = getattr(p, "usedGpuMemory", None) or 0
                out[p.pid] = out.get(p.pid, 0) + int(used) // (1024 * 1024)
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out
