"""Fakes of the hardware libraries, built from real captures (tests/fixtures/) or labelled synthetic snapshots.

A snapshot is the JSON that tests/fixtures/nvidia-h200x2/nvml_snapshot.json holds (captured with pynvml on
real GPUs), optionally extended with keys the capture did not record:
``mem`` ({"total", "free"} bytes), ``brand`` (NVML brand id), ``numa``, ``fabric_state`` (0..3),
``mig_devices`` ([{"uuid", "name", "mem"}]), ``no_permission`` (["power", "util"]).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

FIXTURES = Path(__file__).parent / "fixtures"
H200X2 = FIXTURES / "nvidia-h200x2"


class FakeNVMLError(Exception):
    """Mimics pynvml.NVMLError: ``value`` carries the NVML return code."""

    def __init__(self, msg: str, value: int | None = None):
        super().__init__(msg)
        self.value = value


class FakeNVML:
    """A pynvml-compatible module replaying a snapshot. Records init/shutdown calls so tests can check pairing.

    Args:
        snapshot: dict or path of a snapshot JSON.
        init_error: message nvmlInit raises (with ``init_code`` as its NVML return code).
    """

    def __init__(self, snapshot: dict | Path, *, init_error: str | None = None, init_code: int | None = None):
        self.snap = json.loads(Path(snapshot).read_text()) if isinstance(snapshot, Path) else snapshot
        self.init_error, self.init_code = init_error, init_code
        self.inits = 0
        self.shutdowns = 0
        self.fabric_reads = 0

    def nvmlInit(self):
        if self.init_error:
            raise FakeNVMLError(self.init_error, self.init_code)
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
        if h.get("mem_no_permission"):
            raise FakeNVMLError("Insufficient Permissions", 4)
        if not h.get("mem"):
            raise FakeNVMLError("Not Supported", 3)
        return SimpleNamespace(**h["mem"])

    def nvmlDeviceGetMigMode(self, h):
        return tuple(h["mig_mode"])

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7 if h.get("mig_devices") is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        migs = h.get("mig_devices") or []
        if i >= len(migs):
            raise FakeNVMLError("Not Found", 6)
        return migs[i]

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=h["pci_bus_id"])

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetBrand(self, h):
        if "brand" not in h:
            raise FakeNVMLError("Not Supported", 3)
        return h["brand"]

    def nvmlDeviceGetNumaNodeId(self, h):
        if "numa" not in h:
            raise FakeNVMLError("Not Supported", 3)
        return h["numa"]

    def nvmlDeviceGetNvLinkState(self, h, link):
        states = h.get("nvlink_states")
        if not states:
            raise FakeNVMLError("Not Supported", 3)
        if link >= len(states):
            raise FakeNVMLError("Invalid Argument", 2)
        return states[link]

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        key = f"{a['index']}-{b['index']}"
        return self.snap.get("topology_common_ancestor", {})[key]

    def nvmlDeviceGetGpuFabricInfo(self, h, info=None):
        self.fabric_reads += 1
        st = h.get("fabric_state")
        if st is None:
            raise FakeNVMLError("Not Supported", 3)
        if isinstance(st, list):  # a sequence of readings (IN_PROGRESS then COMPLETED)
            st = st[min(self.fabric_reads - 1, len(st) - 1)]
        return SimpleNamespace(state=st, status=0)

    def nvmlDeviceGetPowerUsage(self, h):
        if "power" in h.get("no_permission", []):
            raise FakeNVMLError("Insufficient Permissions", 4)
        return 81000

    def nvmlDeviceGetUtilizationRates(self, h):
        if "util" in h.get("no_permission", []):
            raise FakeNVMLError("Insufficient Permissions", 4)
        return SimpleNamespace(gpu=0, memory=0)


def h200x2_snapshot() -> dict:
    """The real H200 x2 NVML capture, with memory and fabric state taken from the same host's real
    ``nvidia-smi -q -x`` capture (the pynvml capture did not record them)."""
    from m3ctl.hw.detect import parse_nvidia_smi_xml

    snap = json.loads((H200X2 / "nvml_snapshot.json").read_text())
    xml = parse_nvidia_smi_xml((H200X2 / "nvidia-smi-q.xml").read_text())
    by_uuid = {g["uuid"]: g for g in xml["gpus"].values()}
    states = {"completed": 3, "in_progress": 2, "not_started": 1, "not_supported": 0}
    for g in snap["gpus"]:
        x = by_uuid[g["uuid"]]
        g["mem"] = {"total": x["memory_total_mib"] * 2**20, "free": (x["memory_total_mib"] - 616) * 2**20}
        g["fabric_state"] = states[x["fabric_state"]]
    return snap


def h200x2_nvml() -> FakeNVML:
    return FakeNVML(h200x2_snapshot())


def smi_runner(csv_text: str | None, rc: int = 0, *, xml: str | None = None, topo: str | None = None,
               extra: dict[str, tuple[int, str, str]] | None = None):
    """A subprocess runner answering nvidia-smi with recorded output (None: command not found).

    ``extra`` maps a command's first words (e.g. ``"dmesg"``, ``"rocm-smi"``) to (rc, stdout, stderr).
    """

    def run(cmd):
        for key, ans in (extra or {}).items():
            if cmd[: len(key.split())] == key.split():
                return ans
        if cmd[0] != "nvidia-smi" or csv_text is None:
            return 127, "", f"{cmd[0]}: command not found"
        if cmd[1:3] == ["-q", "-x"]:
            return (0, xml, "") if xml else (127, "", "")
        if cmd[1:3] == ["topo", "-m"]:
            return (0, topo, "") if topo else (127, "", "")
        return rc, csv_text if rc == 0 else "", "" if rc == 0 else csv_text

    return run


class FakeAmdSmi:
    """An amdsmi-compatible module; defaults are an MI300X-class host (gfx942, 192 GiB, AMD public specs)."""

    class AmdSmiMemoryType:
        VRAM = 0

    def __init__(self, n: int = 8, gfx: str = "gfx942", name: str = "AMD Instinct MI300X", mem_gib: int = 192,
                 link: str = "XGMI"):
        self.n, self.gfx, self.name, self.mem_gib, self.link = n, gfx, name, mem_gib, link
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
        return self.mem_gib * 2**30

    def amdsmi_get_gpu_device_bdf(self, h):
        return f"0000:{h + 1:02x}:00.0"

    def amdsmi_get_gpu_device_uuid(self, h):
        return f"GPU-{h:02x}ff74a1-0000-1000-80dd-d1f0e5{h:06x}"

    def amdsmi_topo_get_link_type(self, a, b):
        return {"hops": 1, "type": self.link}

    def amdsmi_get_gpu_driver_info(self, h):
        return {"driver_version": "6.10.5"}


def amdsmi_from_snapshot(path: Path) -> FakeAmdSmi:
    """A FakeAmdSmi from a labelled snapshot JSON ({"gpus": n, "gfx", "name", "mem_gib", "link"})."""
    s = json.loads(path.read_text())
    return FakeAmdSmi(n=s["count"], gfx=s["gfx"], name=s["name"], mem_gib=s["mem_gib"], link=s.get("link", "XGMI"))
