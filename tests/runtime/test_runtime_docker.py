"""Docker container spec (pure: what m3ctl asks the engine for), runtime diagnosis and pre-flight of ports.

The real engine runs in tests/integration/test_docker.py; here the spec is checked for GPU hosts,
which this machine cannot provide (device requests for NVIDIA, /dev/kfd + /dev/dri for AMD).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from m3ctl.core.state import Registry
from m3ctl.errors import ConfigRejected
from m3ctl.hw.inventory import GpuInfo, HostInventory
from m3ctl.planning.plan import LaunchPlan
from m3ctl.runtime.docker import DockerOptions, container_spec
from m3ctl.serving.diagnose import diagnose_text, explain_port_conflict


def _plan(tmp_path, **kw) -> LaunchPlan:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    base = dict(
        name="d1",
        profile="hopper",
        image="vllm/vllm-openai:minimax-m3",
        model=str(model),
        served_model_name="m3",
        port=8123,
        startup_budget_s=100,
        argv=["vllm", "serve", str(model), "--host", "127.0.0.1", "--port", "8123", "--tensor-parallel-size", "8"],
        env={"VLLM_FLOAT32_MATMUL_PRECISION": "high", "CUDA_VISIBLE_DEVICES": "GPU-aaa"},
    )
    base.update(kw)
    return LaunchPlan(**base)


def _h200_inventory() -> HostInventory:
    gpus = tuple(
        GpuInfo(
            index=i,
            vendor="nvidia",
            name="NVIDIA H200",
            arch="hopper",
            compute_capability="9.0",
            uuid=f"GPU-{i:08d}-uuid",
        )
        for i in range(2)
    )
    return HostInventory(gpus=gpus, probe="nvml")


def test_nvidia_spec_device_request_by_uuid_ipc_host_labels_no_restart(tmp_path):
    plan = _plan(tmp_path)
    spec = container_spec(plan, {"HF_TOKEN": "hf_secretvalue123"}, DockerOptions.for_host(_h200_inventory()))
    (req,) = spec["device_requests"]
    assert req["Driver"] == "nvidia" and req["DeviceIDs"] == ["GPU-00000000-uuid", "GPU-00000001-uuid"]
    assert req["Capabilities"] == [["gpu"]]
    assert "CUDA_VISIBLE_DEVICES" not in spec["environment"]  # F02: UUIDs go to the device request only
    assert spec["environment"]["HF_TOKEN"] == "hf_secretvalue123"
    assert spec["ipc_mode"] == "host" and "shm_size" not in spec  # F14
    assert spec["network_mode"] == "host" and spec["restart_policy"] == {"Name": "no"}
    assert spec["entrypoint"] == ["vllm"] and spec["command"] == plan.argv[1:]
    assert spec["labels"]["m3ctl.plan-hash"] == plan.plan_hash() and spec["labels"]["m3ctl.name"] == "d1"
    assert spec["volumes"] == {plan.model: {"bind": plan.model, "mode": "ro"}}
    flat = repr(spec["command"]) + repr(spec["labels"]) + spec["name"]
    assert "hf_secretvalue123" not in flat


def test_all_nvidia_gpus_when_no_selection(tmp_path):
    spec = container_spec(_plan(tmp_path), {}, DockerOptions(gpu_vendor="nvidia"))
    assert spec["device_requests"][0]["Count"] == -1


def test_amd_spec_devices_video_group_seccomp_single_visibility_var(tmp_path):
    plan = _plan(tmp_path, env={"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "0,1"})
    spec = container_spec(plan, {}, DockerOptions(gpu_vendor="amd", gpu_devices=["2", "3"]))
    assert spec["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    assert spec["group_add"] == ["video"] and spec["security_opt"] == ["seccomp=unconfined"]
    env = spec["environment"]
    assert (
        env["ROCR_VISIBLE_DEVICES"] == "2,3" and "HIP_VISIBLE_DEVICES" not in env and "CUDA_VISIBLE_DEVICES" not in env
    )
    assert "device_requests" not in spec


def test_shm_floor_scales_with_tp_when_ipc_host_is_not_allowed(tmp_path):
    spec = container_spec(_plan(tmp_path, tp=8), {}, DockerOptions(ipc_host=False))
    assert "ipc_mode" not in spec and spec["shm_size"] == "16g"  # F14: >= 16 GiB for TP8
    assert spec["ulimits"][0]["Name"] == "memlock" and spec["ulimits"][0]["Soft"] == -1


def test_bridge_network_publishes_port_and_listens_on_all_interfaces_inside(tmp_path):
    spec = container_spec(_plan(tmp_path), {}, DockerOptions(network="bridge"))
    assert "network_mode" not in spec and spec["ports"] == {"8123/tcp": ("127.0.0.1", 8123)}
    assert spec["command"][spec["command"].index("--host") + 1] == "0.0.0.0"


def test_hub_model_mounts_hf_cache_read_write_and_extra_mounts(tmp_path, monkeypatch):
    hf = tmp_path / "hf"
    hf.mkdir()
    monkeypatch.setenv("HF_HOME", str(hf))
    plan = _plan(tmp_path, model="MiniMaxAI/MiniMax-M3.1-Flash")
    spec = container_spec(plan, {}, DockerOptions(mounts=[f"{tmp_path}:/data", f"{tmp_path}/model:/w:rw"]))
    assert spec["volumes"][str(hf)] == {"bind": "/root/.cache/huggingface", "mode": "rw"}  # it downloads there
    assert spec["volumes"][str(tmp_path)] == {"bind": "/data", "mode": "ro"}
    assert spec["volumes"][str(tmp_path / "model")] == {"bind": "/w", "mode": "rw"}
    with pytest.raises(ConfigRejected, match="bad mount"):
        container_spec(plan, {}, DockerOptions(mounts=["/only-one-part"]))


def test_launching_a_hub_model_makes_the_missing_hf_cache_as_the_user_and_binds_it_read_write(tmp_path, monkeypatch):
    """On a fresh host the HF cache does not exist yet: the engine would create it root-owned and, read-only, the
    download fails. The runtime makes it first (this process's user) and binds it read-write."""
    import docker

    from m3ctl.errors import LaunchFailed
    from m3ctl.runtime.docker import DockerRuntime

    hf = tmp_path / "fresh" / "hf"
    monkeypatch.setenv("HF_HOME", str(hf))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    seen = {}

    class Containers:
        def get(self, _name):
            raise docker.errors.NotFound("none")

        def run(self, **spec):
            seen.update(spec, hf_made=hf.is_dir())
            raise docker.errors.APIError("stop here")

    class Client:
        containers = Containers()

    rt = DockerRuntime()
    monkeypatch.setattr(rt, "ensure_image", lambda _ref: False)
    monkeypatch.setattr(rt, "client", lambda: Client())
    plan = _plan(tmp_path, model="MiniMaxAI/MiniMax-M3.1-Flash")
    with pytest.raises(LaunchFailed, match="refused to start"):
        rt.launch(plan, Registry(tmp_path / "state"), {})
    assert seen["hf_made"] and hf.stat().st_uid == os.getuid()
    assert seen["volumes"][str(hf)] == {"bind": "/root/.cache/huggingface", "mode": "rw"}
    offline = _plan(tmp_path, model="MiniMaxAI/MiniMax-M3.1-Flash", offline=True)
    assert container_spec(offline, {})["volumes"][str(hf)]["mode"] == "ro"  # offline: the cache is only read
    hf.rmdir()
    assert str(hf) not in container_spec(offline, {})["volumes"]  # ... and, with nothing cached, not mounted


def test_no_image_is_rejected_with_the_fix(tmp_path):
    with pytest.raises(ConfigRejected, match="names no image") as e:
        container_spec(_plan(tmp_path, image=None), {})
    assert "--image" in e.value.hint


# ---------------------------------------------------------------- F14: shared memory too small for NCCL
def test_f14_nccl_shm_lines_map_to_shm_too_small():
    for line in (
        (
            "nccl-host:123:456 [0] NCCL INFO include/shm.h:41 NCCL WARN Error while creating shared memory "
            "segment /dev/shm/nccl-Vw9f0c (size 7340384)"
        ),
        (
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
            "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), "
            "NCCL version 2.20.5; ncclSystemError: System call (e.g. socket, malloc) or external library "
            "call failed or device error."
        ),
    ):
        d = diagnose_text("INFO loading\n" + line + "\n")
        assert d is not None and d.id == "nccl-shm" and d.cause.startswith("shm-too-small")
        assert "--ipc=host" in d.fix


# ---------------------------------------------------------------- F17: address in use, API port free
@pytest.fixture
def listener():
    """A real process (not this one) listening on a TCP port, like a stale vLLM holding a rendezvous port."""
    code = (
        "import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); "
        "print(s.getsockname()[1], flush=True); time.sleep(120)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    port = int(p.stdout.readline())
    yield p, port
    p.kill()
    p.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_f17_tcpstore_eaddrinuse_is_diagnosed_as_internal_port_with_holder(listener):
    proc, port = listener
    api = _free_port()
    line = (
        f"RuntimeError: The server socket has failed to listen on any local network address. port: {port}, "
        f"useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use"
    )
    d = diagnose_text("INFO x\n" + line + "\n")
    assert d.id == "internal-port-in-use"
    d = explain_port_conflict(d, "127.0.0.1", api)
    assert f"internal port {port}" in d.cause and f"pid {proc.pid}" in d.cause and "not the API port" in d.cause
    # The plain OSError form without a port number: the API port is free, so it must be an internal one.
    # The plain OSError form (vLLM log prefix with a timestamp, no port): the API port is free, so internal.
    line2 = "(EngineCore pid=2618) ERROR 11-29 20:21:11 [core.py:1] OSError: [Errno 98] Address already in use"
    d2 = explain_port_conflict(diagnose_text(line2 + "\n"), "127.0.0.1", api)
    assert d2.id == "internal-port-in-use" and "API port is free" in d2.cause
    # uvicorn's bind error names the API port: reported as the API port, not an internal one.
    line3 = (
        f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address already in use"
    )
    d3 = explain_port_conflict(diagnose_text(line3 + "\n"), "127.0.0.1", port)
    assert d3.id == "address-in-use" and f"API port {port}" in d3.cause and f"pid {proc.pid}" in d3.cause


def test_f17_preflight_rejects_busy_internal_port_naming_the_holder(listener, tmp_path):
    from m3ctl.serving.serve import preflight

    proc, port = listener
    plan = _plan(
        tmp_path,
        runtime="process",
        image=None,
        port=_free_port(),
        env={"MASTER_PORT": str(port)},
        argv=[sys.executable, "-c", "pass"],
    )
    with pytest.raises(ConfigRejected) as e:
        preflight(plan, Registry(tmp_path / "state"))
    assert f"internal port (MASTER_PORT) {port} on 127.0.0.1 is already in use" in e.value.message
    assert f"pid {proc.pid}" in e.value.message and e.value.exit_code == 3


def test_f17_serve_pins_vllm_port_to_a_free_port(tmp_path):
    from m3ctl.runtime.base import port_in_use
    from m3ctl.serving.serve import assign_internal_ports

    plan = assign_internal_ports(_plan(tmp_path, env={}))
    port = int(plan.env["VLLM_PORT"])
    assert port != plan.port and not port_in_use("127.0.0.1", port)
    assert assign_internal_ports(_plan(tmp_path, env={"VLLM_PORT": "4242"})).env["VLLM_PORT"] == "4242"


def test_warning_lines_mentioning_error_are_not_a_root_cause():
    """Seen under load: a readiness timeout blamed vLLM's ulimit WARNING because it contains 'error'."""
    warn = (
        "(APIServer pid=1) WARNING 11-29 21:13:54 [system_utils.py:255] Found ulimit of 20000 and failed to "
        "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors "
        "like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n"
    )
    assert diagnose_text(warn + "\n(APIServer pid=1) INFO 11-29 21:13:55 [api.py:1] loading\n") is None
    d = diagnose_text(warn + "\n(EngineCore pid=7) ERROR 11-29 21:14:00 [core.py:9] RuntimeError: boom\n")
    assert d.id == "generic" and "boom" in d.line
