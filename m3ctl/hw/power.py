"""GPU power and energy readings behind one interface (what ``m3ctl bench`` samples for energy per token).

:func:`open_power` tries NVML -> amdsmi -> nvidia-smi -> rocm-smi and returns the first
:class:`PowerSource` that reads at least one GPU, or raises :class:`~m3ctl.hw.probe.ProbeDeclined` with every
interface's reason. A source reads, per GPU index (the index the inventory and the launch plan use), the board
power in watts and, where the driver has one, the cumulative energy counter in joules. Sources never print and
never change the environment; NVML and amdsmi are initialised once per source and shut down by ``close()``.
External boundaries are injectable as in :mod:`m3ctl.hw.detect` (``nvml``, ``amdsmi``, ``run``).

Sources:
- NVML (https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html):
  ``nvmlDeviceGetPowerUsage`` returns milliwatts (on Ampere, except GA100, and newer: averaged over 1 s);
  ``nvmlDeviceGetTotalEnergyConsumption`` returns millijoules since the driver was last reloaded (Volta and
  newer; NOT_SUPPORTED elsewhere). Python binding: nvidia-ml-py (``pynvml``).
- amdsmi (https://rocm.docs.amd.com/projects/amdsmi/en/latest/): ``amdsmi_get_power_info`` returns a dict whose
  ``current_socket_power`` (MI300 and newer) / ``average_socket_power`` (MI200 and older, Navi) / ``socket_power``
  are watts, ``"N/A"`` when unsupported; ``amdsmi_get_energy_count`` returns ``energy_accumulator`` and
  ``counter_resolution`` (microjoules per count), not supported in a VM guest.
- ``nvidia-smi --query-gpu=index,power.draw --format=csv,noheader,nounits`` (``nvidia-smi --help-query-gpu``:
  watts, ``[N/A]`` without power management); ``rocm-smi --showpower --json`` (``... Power (W)`` per card).
- A GPU metrics exporter's Prometheus page, for GPUs on another host (``open_power(url=...)``, ``bench
  --power-metrics URL``): :data:`EXPORTERS`. NVIDIA DCGM exporter
  (https://docs.nvidia.com/datacenter/dcgm/latest/dcgm-api/dcgm-api-field-ids.html): ``DCGM_FI_DEV_POWER_USAGE``
  (W) and ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ since the driver loaded), label ``gpu``; AMD device
  metrics exporter (https://instinct.docs.amd.com/projects/device-metrics-exporter/en/latest/configuration/
  metricslist.html): ``GPU_POWER_USAGE`` (W) and ``GPU_ENERGY_CONSUMED`` (µJ), label ``gpu_id``. The exporter
  refreshes at its own collection interval (dcgm-exporter ``-c``, 30 s by default): a figure is only as fine as
  that interval, so run it with ``-c 1000`` for runs of a minute.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from m3ctl.catalog.lazy import lazy_module
from m3ctl.core.prometheus import samples
from m3ctl.hw.amd import import_amdsmi
from m3ctl.hw.nvidia import init_nvml
from m3ctl.hw.probe import ProbeDeclined, Runner, _code, _s, default_runner

if TYPE_CHECKING:
    import httpx
else:
    httpx = lazy_module("httpx")

NVML_ERROR_NOT_SUPPORTED = 3
#: amdsmi marks an unsupported field of a struct with these (amdsmi_interface.py: 0xFFFF; amdsmi.h: UINT32_MAX).
_AMD_UNSUPPORTED = {0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF}


@dataclass(frozen=True)
class PowerReading:
    """One GPU at one moment.

    Attributes:
        gpu: GPU index (NVML / amdsmi enumeration order, as in the inventory and the launch plan).
        watts: board power (W), None when the sensor did not answer.
        energy_j: the driver's cumulative energy counter (J, from an arbitrary origin: only differences mean
            something), None when the GPU has no counter or it did not answer.
        error: why the reading failed (the vendor's message), None when it succeeded.
    """

    gpu: int
    watts: float | None
    energy_j: float | None = None
    error: str | None = None


class PowerSource(Protocol):
    """An open power interface. ``name``: ``nvml``, ``amdsmi``, ``nvidia-smi`` or ``rocm-smi``;
    ``gpus``: the GPU indices it reads; ``has_counter``: GPUs whose energy counter answered at open;
    ``min_interval_s``: the shortest sampling period that makes sense (a CLI fallback spawns a process per read)."""

    name: str
    gpus: list[int]
    has_counter: set[int]
    min_interval_s: float

    def read(self, gpus: Sequence[int]) -> list[PowerReading]:
        """One reading per GPU of ``gpus``, in that order; a failure is a reading with ``error`` (never raises)."""

    def close(self) -> None:
        """Release the library (NVML shutdown, amdsmi shut down); idempotent."""


# ----------------------------------------------------------------------------- NVML
class NvmlPower:
    """Power and energy through NVML. Raises ProbeDeclined at open (no library, init failed, no GPU)."""

    name = "nvml"
    min_interval_s = 0.0

    def __init__(self, nvml: Any | None = None):
        self.nvml, self._open = init_nvml(nvml), True
        try:
            n = int(self.nvml.nvmlDeviceGetCount())
            self._h = {i: self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)}
        except Exception as e:
            self.close()
            raise ProbeDeclined(f"NVML could not list GPUs: {_s(e) or type(e).__name__}", _code(e)) from e
        if not self._h:
            self.close()
            raise ProbeDeclined("NVML reports 0 devices")
        self.gpus = sorted(self._h)
        self.has_counter = {i for i in self.gpus if self._energy(i)[0] is not None}

    def _energy(self, i: int) -> tuple[float | None, str | None]:
        fn = getattr(self.nvml, "nvmlDeviceGetTotalEnergyConsumption", None)
        if fn is None:
            return None, "nvmlDeviceGetTotalEnergyConsumption missing from this nvidia-ml-py"
        try:
            return int(fn(self._h[i])) / 1000.0, None  # mJ -> J
        except Exception as e:
            return None, _s(e) or type(e).__name__

    def read(self, gpus: Sequence[int]) -> list[PowerReading]:
        out = []
        for i in gpus:
            try:
                w = int(self.nvml.nvmlDeviceGetPowerUsage(self._h[i])) / 1000.0  # mW -> W
            except Exception as e:
                out.append(PowerReading(i, None, None, f"nvmlDeviceGetPowerUsage: {_s(e) or type(e).__name__}"))
                continue
            e_j, err = self._energy(i) if i in self.has_counter else (None, None)
            out.append(PowerReading(i, w, e_j, f"nvmlDeviceGetTotalEnergyConsumption: {err}" if err else None))
        return out

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()


# ----------------------------------------------------------------------------- amdsmi
def _amd_watts(info: Any) -> float | None:
    """Watts from ``amdsmi_get_power_info``'s dict: current (MI300+), else average, else socket power."""
    if not isinstance(info, dict):
        return None
    for key in ("current_socket_power", "average_socket_power", "socket_power"):
        v = info.get(key)
        if isinstance(v, int | float) and v not in _AMD_UNSUPPORTED:
            return float(v)
    return None


class AmdSmiPower:
    """Power and energy through amdsmi (ROCm). Raises ProbeDeclined at open."""

    name = "amdsmi"
    min_interval_s = 0.0

    def __init__(self, amdsmi: Any | None = None):
        amdsmi = amdsmi if amdsmi is not None else import_amdsmi()
        try:
            amdsmi.amdsmi_init()
        except Exception as e:
            raise ProbeDeclined(f"amdsmi init failed: {e}") from e
        self.amdsmi, self._open = amdsmi, True
        try:
            handles = list(amdsmi.amdsmi_get_processor_handles())
        except Exception as e:
            self.close()
            raise ProbeDeclined(f"amdsmi could not list processors: {e}") from e
        if not handles:
            self.close()
            raise ProbeDeclined("amdsmi reports 0 processors")
        self._h = dict(enumerate(handles))
        self.gpus = sorted(self._h)
        self.has_counter = {i for i in self.gpus if self._energy(i)[0] is not None}

    def _energy(self, i: int) -> tuple[float | None, str | None]:
        try:
            d = self.amdsmi.amdsmi_get_energy_count(self._h[i])
            acc, res = d["energy_accumulator"], d["counter_resolution"]
            return float(acc) * float(res) / 1e6, None  # counts x uJ/count -> J
        except Exception as e:
            return None, str(e) or type(e).__name__

    def read(self, gpus: Sequence[int]) -> list[PowerReading]:
        out = []
        for i in gpus:
            try:
                w = _amd_watts(self.amdsmi.amdsmi_get_power_info(self._h[i]))
            except Exception as e:
                out.append(PowerReading(i, None, None, f"amdsmi_get_power_info: {e or type(e).__name__}"))
                continue
            e_j, err = self._energy(i) if i in self.has_counter else (None, None)
            why = "amdsmi_get_power_info: no power field supported" if w is None else None
            out.append(PowerReading(i, w, e_j, why or (f"amdsmi_get_energy_count: {err}" if err else None)))
        return out

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                self.amdsmi.amdsmi_shut_down()


# ----------------------------------------------------------------------------- CLI fallbacks
def parse_nvidia_smi_power(text: str) -> dict[int, float | None]:
    """``{index: watts}`` from ``nvidia-smi --query-gpu=index,power.draw --format=csv,noheader,nounits``
    (``[N/A]`` -> None)."""
    out: dict[int, float | None] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue
        try:
            out[int(cells[0])] = float(cells[1].split()[0])
        except (ValueError, IndexError):
            out[int(cells[0])] = None
    return out


def parse_rocm_smi_power(text: str) -> dict[int, float | None]:
    """``{card index: watts}`` from ``rocm-smi --showpower --json`` (the first ``... Power (W)`` value of a card:
    "Current Socket Graphics Package Power (W)" on MI300, "Average Graphics Package Power (W)" before)."""
    data = json.loads(text)
    out: dict[int, float | None] = {}
    for key, row in data.items():
        m = re.fullmatch(r"card(\d+)", key)
        if not m or not isinstance(row, dict):
            continue
        val = next((v for k, v in row.items() if "Power (W)" in k), None)
        try:
            out[int(m.group(1))] = float(val) if val is not None else None
        except (TypeError, ValueError):
            out[int(m.group(1))] = None
    return out


class SmiPower:
    """Power (no energy counter) through ``nvidia-smi`` or ``rocm-smi``: one process per read of all GPUs, so
    sampling is at most once a second. Raises ProbeDeclined at open (missing, failing, no GPU with a reading)."""

    min_interval_s = 1.0

    def __init__(self, tool: str, run: Runner = default_runner):
        self.name, self.run = tool, run
        self.has_counter: set[int] = set()
        got = self._all()
        if isinstance(got, str):
            raise ProbeDeclined(got)
        self.gpus = sorted(i for i, w in got.items() if w is not None)
        if not self.gpus:
            raise ProbeDeclined(f"{tool} reports no GPU power reading" + (" (all [N/A])" if got else ""))

    def _all(self) -> dict[int, float | None] | str:
        if self.name == "nvidia-smi":
            cmd = ["nvidia-smi", "--query-gpu=index,power.draw", "--format=csv,noheader,nounits"]
        else:
            cmd = ["rocm-smi", "--showpower", "--json"]
        rc, out, err = self.run(cmd)
        if rc != 0:
            return f"{self.name} failed (exit {rc}): {(err or out).strip()[:200]}"
        try:
            return parse_nvidia_smi_power(out) if self.name == "nvidia-smi" else parse_rocm_smi_power(out)
        except ValueError as e:
            return f"{self.name} output unreadable: {e}"

    def read(self, gpus: Sequence[int]) -> list[PowerReading]:
        got = self._all()
        if isinstance(got, str):
            return [PowerReading(i, None, None, got) for i in gpus]
        return [
            PowerReading(i, w, None, None if w is not None else f"{self.name}: no reading for GPU {i}")
            for i in gpus
            for w in [got.get(i)]
        ]

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------- the chain
@dataclass(frozen=True)
class Exporter:
    """One exporter's metric names: its power gauge (W), its energy counter and the joules per counter unit, the
    label holding the GPU index."""

    name: str
    power: str
    energy: str
    joules_per_unit: float
    gpu_label: str


#: The GPU exporters :class:`ExporterPower` reads (sources in the module docstring).
EXPORTERS = (
    Exporter("dcgm-exporter", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3, "gpu"),
    Exporter("amd-exporter", "GPU_POWER_USAGE", "GPU_ENERGY_CONSUMED", 1e-6, "gpu_id"),
)


class ExporterPower:
    """Power and energy of another host's GPUs from its metrics exporter's page (``GET url``). Raises
    ProbeDeclined at open (unreachable, not a page of a known exporter, no GPU on it)."""

    min_interval_s = 1.0

    def __init__(self, url: str, get: Any = None):
        self.url, self.get = url, get or httpx.get  # httpx.get unless a test gives its own
        got = self._page()
        if isinstance(got, str):
            raise ProbeDeclined(got)
        self.kind, readings = got
        self.name = self.kind.name
        self.gpus = sorted(readings)
        self.has_counter = {g for g, (_, e) in readings.items() if e is not None}
        if not self.gpus:
            raise ProbeDeclined(f"{url}: the {self.name} page lists no GPU")

    def _page(self) -> tuple[Exporter, dict[int, tuple[float | None, float | None]]] | str:
        try:
            r = self.get(self.url, timeout=5.0)
        except httpx.HTTPError as e:
            return f"{self.url}: {type(e).__name__}: {e}"
        if r.status_code != 200:
            return f"{self.url}: HTTP {r.status_code}"
        rows = samples(r.text)
        names = {n for n, _, _ in rows}
        kind = next((x for x in EXPORTERS if x.power in names or x.energy in names), None)
        if kind is None:
            return f"{self.url}: no GPU power metric of a known exporter ({', '.join(x.power for x in EXPORTERS)})"
        out: dict[int, tuple[float | None, float | None]] = {}
        for name, labels, v in rows:
            idx = labels.get(kind.gpu_label, "")
            if name not in (kind.power, kind.energy) or not idx.isdigit():
                continue
            watts, joules = out.get(int(idx), (None, None))
            out[int(idx)] = (v, joules) if name == kind.power else (watts, v * kind.joules_per_unit)
        return kind, out

    def read(self, gpus: Sequence[int]) -> list[PowerReading]:
        got = self._page()
        if isinstance(got, str):
            return [PowerReading(i, None, None, got) for i in gpus]
        _, readings = got
        return [
            PowerReading(i, w, e, None if w is not None or e is not None else f"{self.name}: no reading for GPU {i}")
            for i in gpus
            for w, e in [readings.get(i, (None, None))]
        ]

    def close(self) -> None:
        pass


def open_power(
    *, nvml: Any | None = None, amdsmi: Any | None = None, run: Runner = default_runner, url: str | None = None
) -> PowerSource:
    """The first power interface that reads at least one GPU: NVML, amdsmi, nvidia-smi, rocm-smi; with ``url``,
    that metrics exporter's page only (:class:`ExporterPower`: GPUs on another host).

    Args:
        nvml, amdsmi, run: injectable boundaries (a pynvml-like module, an amdsmi-like module, a subprocess
            runner returning (exit code, stdout, stderr)); defaults: the real ones.
        url: a DCGM or AMD exporter's metrics URL (``http://gpu-host:9400/metrics``).

    Returns:
        An open :class:`PowerSource`; the caller closes it.

    Raises:
        ProbeDeclined: none answered; the message joins each interface's reason (``nvml: ...; amdsmi: ...``).
    """
    if url:
        return ExporterPower(url)
    why: list[str] = []
    for name, make in (
        ("nvml", lambda: NvmlPower(nvml)),
        ("amdsmi", lambda: AmdSmiPower(amdsmi)),
        ("nvidia-smi", lambda: SmiPower("nvidia-smi", run)),
        ("rocm-smi", lambda: SmiPower("rocm-smi", run)),
    ):
        try:
            return make()
        except ProbeDeclined as e:
            why.append(f"{name}: {e}")
        except Exception as e:
            why.append(f"{name}: {type(e).__name__}: {e}")
    raise ProbeDeclined("; ".join(why))
