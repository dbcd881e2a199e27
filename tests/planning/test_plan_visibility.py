"""Serve-side handling of visible-device variables: field failures F02 (UUIDs), F03 (MIG memory), F05 (AMD masking)."""

from __future__ import annotations

import pytest

from m3ctl.errors import ConfigRejected
from m3ctl.hw.inventory import GpuInfo, MigDevice
from m3ctl.planning.plan import PlanRequest, plan
from tests.hosts import h200x2, synthetic


def test_f02_gpu_uuid_translated_to_index_for_process_runtime(tiny_models):
    inv = h200x2()
    uuid1 = inv.gpus[1].uuid
    inv = inv.model_copy(update={"visible_devices": {"CUDA_VISIBLE_DEVICES": uuid1}})
    p = plan(inv, PlanRequest(model=str(tiny_models["m2"]), runtime="process", vllm_executable="vllm"))
    assert p.env["CUDA_VISIBLE_DEVICES"] == "1" and p.tp == 1 and p.gpus == [1]
    assert any(c.what == "CUDA_VISIBLE_DEVICES" and "F02" in c.why for c in p.choices)
    # A short unique prefix works too; an unknown UUID is rejected before launch.
    short = inv.model_copy(update={"visible_devices": {"CUDA_VISIBLE_DEVICES": uuid1[:12]}})
    assert (
        plan(short, PlanRequest(model=str(tiny_models["m2"]), runtime="process", vllm_executable="vllm")).env[
            "CUDA_VISIBLE_DEVICES"
        ]
        == "1"
    )
    bad = inv.model_copy(update={"visible_devices": {"CUDA_VISIBLE_DEVICES": "GPU-deadbeef-0000"}})
    with pytest.raises(ConfigRejected, match="rule gpu.visible_devices"):
        plan(bad, PlanRequest(model=str(tiny_models["m2"]), runtime="process", vllm_executable="vllm"))


def test_f02_docker_gets_uuids_not_cuda_visible_devices(tiny_models):
    inv = h200x2()
    inv = inv.model_copy(update={"visible_devices": {"CUDA_VISIBLE_DEVICES": inv.gpus[1].uuid}})
    p = plan(inv, PlanRequest(model=str(tiny_models["m2"]), runtime="docker", vllm_executable="vllm"))
    assert p.gpu_devices == [inv.gpus[1].uuid] and "CUDA_VISIBLE_DEVICES" not in p.env


def test_f03_mig_slice_memory_drives_the_memory_rule():
    g = synthetic("h200x8").gpus[0]
    mig = MigDevice(index=0, uuid="MIG-1111-2222", name="NVIDIA H200 MIG 1g.18gb", memory_total_mib=16 * 1024)
    gpu = GpuInfo(**{**g.model_dump(), "mig_mode": True, "mig_devices": (mig,), "uuid": "GPU-aaaa"})
    inv = synthetic("h200x8").model_copy(
        update={"gpus": (gpu,), "visible_devices": {"CUDA_VISIBLE_DEVICES": "MIG-1111-2222"}}
    )
    with pytest.raises(ConfigRejected) as ei:
        plan(inv, PlanRequest(model="MiniMax-M3.1-Flash", variant="mxfp8", max_model_len=4096, vllm_executable="vllm"))
    assert "rule memory.fit" in ei.value.message and "(16 GiB" in ei.value.message


def test_f05_amd_single_visibility_variable(tiny_models):
    inv = synthetic("mi300xx8").model_copy(
        update={"visible_devices": {"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}}
    )
    p = plan(inv, PlanRequest(model=str(tiny_models["m2"]), runtime="process", vllm_executable="vllm"))
    assert p.env["ROCR_VISIBLE_DEVICES"] == "3" and p.unset_env == ["HIP_VISIBLE_DEVICES"] and p.tp == 1
    masked = inv.model_copy(update={"visible_devices": {"ROCR_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0,1"}})
    with pytest.raises(
        ConfigRejected, match="rule gpu.visible_devices: CUDA_VISIBLE_DEVICES entry '1' is out of range"
    ):
        plan(masked, PlanRequest(model=str(tiny_models["m2"]), runtime="process", vllm_executable="vllm"))


def test_process_runtime_unsets_the_other_variables(tmp_path, monkeypatch, tiny_models):
    """The process runtime really removes unset_env from the child's environment."""
    import sys

    from m3ctl.core.state import Registry
    from m3ctl.runtime.process import ProcessRuntime

    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")
    inv = synthetic("mi300xx8").model_copy(
        update={"visible_devices": {"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}}
    )
    p = plan(inv, PlanRequest(model=str(tiny_models["m2"]), runtime="process", vllm_executable="vllm", name="envcheck"))
    out = tmp_path / "env.txt"
    p = p.model_copy(
        update={
            "argv": [
                sys.executable,
                "-c",
                (
                    f"import os; open({str(out)!r}, 'w').write("
                    "os.environ.get('HIP_VISIBLE_DEVICES', 'unset') + ' ' + "
                    "os.environ['ROCR_VISIBLE_DEVICES'])"
                ),
            ]
        }
    )
    rt = ProcessRuntime()
    import time

    dep = rt.launch(p, Registry(tmp_path / "state"), {})
    deadline = time.time() + 30
    while rt.is_alive(dep) and time.time() < deadline:
        time.sleep(0.1)
    rt.stop(dep, timeout_s=5)
    assert out.read_text() == "unset 3"
