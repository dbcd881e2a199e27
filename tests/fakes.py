"""Fakes of the hardware libraries, built from real captures (tests/fixtures/)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

FIXTURES = Path(__file__).parent / "fixtures"


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """A pynvml-compatible module replaying ``nvml_snapshot.json`` (captured with pynvml on real GPUs).

    Records init/shutdown calls so tests can check they are paired.
    """

    def __init__(self, snapshot: dict | Path, *, init_error: str | None = None):
        self.snap = json.loads(Path(snapshot).read_text()) if isinstance(snapshot, Path) else snapshot
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error:
            raise FakeNVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.snap["gpus"])

    def nvmlSystemGetDriverVersion(self):
        return self.snap["driver_version"]

    def nvmlSystemGetCudaDriverVersion(self):
        return self.snap["cuda_driver_version"]

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.snap["gpus"][i]

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return tuple(h["cc"])

    def nvmlDeviceGetMemoryInfo(self, h):
        if not h.get("mem"):
            raise FakeNVMLError("Not Supported")
        return SimpleNamespace(**h["mem"])

    def nvmlDeviceGetMigMode(self, h):
        return tuple(h["mig_mode"])

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=h["pci_bus_id"])

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]


def h200x2_nvml() -> FakeNVML:
    return FakeNVML(FIXTURES / "nvidia-h200x2" / "nvml_snapshot.json")


def smi_runner(csv_text: str | None, rc: int = 0):
    """A subprocess runner answering nvidia-smi with ``csv_text`` (None: command not found)."""

    def run(cmd):
        if cmd[0] != "nvidia-smi" or csv_text is None:
            return 127, "", f"{cmd[0]}: command not found"
        return rc, csv_text, ""

    return run


class FakeAmdSmi:
    """An amdsmi-compatible module for an MI300X-class host (gfx942); values from AMD's public specs."""

    class AmdSmiMemoryType:
        VRAM = 0

    def __init__(self, n: int = 8, gfx: str = "gfx942", name: str = "AMD Instinct MI300X"):
        self.n, self.gfx, self.name = n, gfx, name
        self.inits = self.shutdowns = 0

    def amdsmi_init(self):
        self.inits += 1

    def amdsmi_shut_down(self):
        self.shutdowns += 1

    def amdsmi_get_processor_handles(self):
        return list(range(self.n))

    def amdsmi_get_gpu_asic_info(self, h):
        return {"market_name": self.name, "target_graphics_version": self.gfx}

    def amdsmi_get_gpu_memory_total(self, h, kind):
        return 192 * 2**30

    def amdsmi_get_gpu_device_bdf(self, h):
        return f"0000:{h + 1:02x}:00.0"

    def amdsmi_get_gpu_driver_info(self, h):
        return {"driver_version": "6.10.5"}
