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


def smi_runner(
    csv_text: str | None,
    rc: int = 0,
    *,
    xml: str | None = None,
    topo: str | None = None,
    extra: dict[str, tuple[int, str, str]] | None = None,
):
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

    def __init__(
        self, n: int = 8, gfx: str = "gfx942", name: str = "AMD Instinct MI300X", mem_gib: int = 192, link: str = "XGMI"
    ):
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


class PoweredNVML(FakeNVML):
    """The real H200 x2 NVML capture (:func:`h200x2_snapshot`) with GPUs that draw known power over time, for energy
    tests. Readings are functions of ``time.perf_counter()`` (the bench client's clock), so what a run measured can
    be computed exactly from its own timestamps.

    Args:
        watts: ``{gpu: (W at construction, W/s ramp)}``: ``nvmlDeviceGetPowerUsage`` answers
            ``base + ramp * (t - t_origin)`` in mW (defaults: each GPU's real idle draw from the same host's
            ``nvidia-smi -q -x``, 81.37 W and 81.15 W, flat), capped at the capture's ``power_limit_mw`` (700 W).
        counter_w: ``{gpu: W}``: ``nvmlDeviceGetTotalEnergyConsumption`` answers ``e0_mj + W * (t - t_origin)`` in
            mJ; a GPU left out answers NOT_SUPPORTED (3), as pre-Volta GPUs do. Real H100/H200 power readings are
            1 s averages while the counter is exact, so the two may differ; tests give them different values to
            tell which one a result used.
        lost: ``{gpu: (first, last)}``: power reads number ``first`` to ``last`` (1-based, None: every later one) of
            that GPU raise GPU_IS_LOST (15), as a GPU that fell off the bus.
    """

    E0_MJ = 3_600_000_000  # 1 kWh since the driver loaded (any origin: only differences mean something)

    def __init__(
        self,
        watts: dict[int, tuple[float, float]] | None = None,
        counter_w: dict[int, float] | None = None,
        lost: dict[int, tuple[int, int | None]] | None = None,
    ):
        import time

        super().__init__(h200x2_snapshot())
        self.clock = time.perf_counter
        self.t_origin = self.clock()
        self.watts = watts or {0: (81.37, 0.0), 1: (81.15, 0.0)}
        self.counter_w = counter_w or {}
        self.lost = lost or {}
        self.reads = {g["index"]: 0 for g in self.snap["gpus"]}
        self.read_times: list[float] = []  # perf_counter of every power read

    def power_w(self, gpu: int, t: float) -> float:
        base, ramp = self.watts[gpu]
        return min(base + ramp * (t - self.t_origin), self.snap["gpus"][gpu]["power_limit_mw"] / 1000)

    def nvmlDeviceGetPowerUsage(self, h):
        i = h["index"]
        self.reads[i] += 1
        first, last = self.lost.get(i, (None, None))
        if first is not None and self.reads[i] >= first and (last is None or self.reads[i] <= last):
            raise FakeNVMLError("GPU is lost", 15)
        t = self.clock()
        self.read_times.append(t)
        return round(self.power_w(i, t) * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        i = h["index"]
        if i not in self.counter_w:
            raise FakeNVMLError("Not Supported", 3)
        return int(self.E0_MJ + self.counter_w[i] * 1000 * (self.clock() - self.t_origin))


class PoweredAmdSmi(FakeAmdSmi):
    """FakeAmdSmi (synthetic MI300X-class host) with power and energy answers shaped as amdsmi 7.0's
    ``amdsmi_get_power_info`` dict (``current_socket_power`` W on MI300+; ``"N/A"`` where unsupported) and
    ``amdsmi_get_energy_count`` dict (``energy_accumulator`` counts x ``counter_resolution`` uJ per count; the
    resolution here is a labelled made-up value); ``watts`` per GPU, constant; ``counter``: whether it answers."""

    RESOLUTION_UJ = 15.259

    def __init__(self, watts: float = 600.0, counter: bool = True, **kw):
        import time

        super().__init__(**kw)
        self.watts, self.counter, self.clock = watts, counter, time.perf_counter
        self.t_origin = self.clock()

    def amdsmi_get_power_info(self, h):
        return {
            "socket_power": "N/A",
            "current_socket_power": int(self.watts),
            "average_socket_power": "N/A",
            "gfx_voltage": "N/A",
            "soc_voltage": "N/A",
            "mem_voltage": "N/A",
            "power_limit": 750,
        }

    def amdsmi_get_energy_count(self, h):
        if not self.counter:
            raise RuntimeError("AMDSMI_STATUS_NOT_SUPPORTED")
        uj = self.watts * 1e6 * (self.clock() - self.t_origin)
        return {
            "energy_accumulator": int(uj / self.RESOLUTION_UJ),
            "counter_resolution": self.RESOLUTION_UJ,
            "timestamp": 0,
        }
