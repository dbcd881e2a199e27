"""Host inventories for planning tests: the real H200 x2 capture, and catalog systems
(m3ctl/data/systems.yaml, built by :func:`m3ctl.hw.systems.inventory_for_system`; each fact sourced there).
"""

from __future__ import annotations

from m3ctl.hw.detect import detect
from m3ctl.hw.inventory import HostInventory
from m3ctl.hw.systems import inventory_for_system
from tests.fakes import FIXTURES, FakeNVML, smi_runner

#: Catalog systems the planning tests use (names as `--system` takes them).
SYSTEMS = ("h200x8", "b200x8", "b300x8", "gb300x4", "rubinx8", "rtxpro6000x2", "mi300xx8", "mi355xx8")


def synthetic(name: str) -> HostInventory:
    """A host you don't have: the catalog system ``name`` (what detection would report there)."""
    return inventory_for_system(name)


def h200x2() -> HostInventory:
    """The real H200 x2 host: nvidia-smi capture (it carries memory.total; the NVML snapshot does not)."""
    csv = (FIXTURES / "nvidia-h200x2" / "nvidia-smi-query.csv").read_text()
    inv = detect(nvml=FakeNVML({"gpus": []}, init_error="skip"), run=smi_runner(csv))
    return inv.model_copy(update={"cuda_driver_version": "13.0"})


ALL = {"h200x2": h200x2, **{k: (lambda k=k: synthetic(k)) for k in SYSTEMS}}
