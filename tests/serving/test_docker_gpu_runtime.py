"""A GPU plan on a Docker daemon without the NVIDIA container toolkit (neither the ``nvidia`` runtime in ``docker
info``'s ``Runtimes`` nor the hook ``--gpus`` runs): a finding in doctor (fatal for a docker launch; ``auto``
chooses the process runtime there) and in serve's pre-flight, which asks the daemon through the SDK."""

from __future__ import annotations

import pytest

from m3ctl.checks.doctor import run_doctor
from m3ctl.core.state import Registry
from m3ctl.errors import ConfigRejected
from m3ctl.hw.host import gpu_runtime_problem
from m3ctl.hw.inventory import ContainerFacts
from m3ctl.planning.launchplan import LaunchPlan
from m3ctl.runtime.docker import DockerRuntime
from m3ctl.serving.preflight import host_checks
from tests.conftest import free_port
from tests.hosts import h200x2

HOOK = "nvidia-container-runtime-hook"


@pytest.fixture(autouse=True)
def _no_hook_on_path(monkeypatch, tmp_path):
    """This host's PATH (and /usr/bin, /usr/local/bin, which the lookup adds) has no toolkit hook."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    if gpu_runtime_problem("nvidia", ("runc",)) is None:
        pytest.skip("this host has the NVIDIA container toolkit hook installed")


def _plan(tmp_path) -> LaunchPlan:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    port = free_port()
    return LaunchPlan(
        name="d1",
        profile="hopper",
        runtime="docker",
        image="vllm/vllm-openai:minimax-m3",
        model=str(model),
        served_model_name="m3",
        port=port,
        startup_budget_s=100,
        argv=["vllm", "serve", str(model), "--port", str(port)],
        gpu_vendor="nvidia",
        gpu_devices=["GPU-aaa"],
    )


class _Daemon(DockerRuntime):
    """The docker runtime against a daemon whose ``info()`` lists ``runtimes``; pulls are recorded, not made."""

    def __init__(self, runtimes: tuple[str, ...]):
        super().__init__()
        self.runtimes, self.pulled = runtimes, []

    def client(self):
        runtimes = self.runtimes

        class Client:
            def info(self):
                return {"Runtimes": {r: {"path": r} for r in runtimes}}

        return Client()

    def ensure_image(self, ref: str) -> bool:
        self.pulled.append(ref)
        return False


def test_serve_preflight_refuses_a_gpu_container_on_a_daemon_without_the_nvidia_runtime(tmp_path):
    rt = _Daemon(("io.containerd.runc.v2", "runc"))
    with pytest.raises(ConfigRejected) as e:
        host_checks(_plan(tmp_path), Registry(tmp_path / "state"), rt)
    assert "no nvidia container runtime" in e.value.message and "runtimes: io.containerd.runc.v2, runc" in (
        e.value.message
    )
    assert "nvidia-ctk runtime configure" in e.value.hint and "--runtime process" in e.value.hint
    assert rt.pulled == []  # refused before anything is pulled or started


def test_serve_preflight_passes_with_the_runtime_or_the_hook(tmp_path):
    rt = _Daemon(("nvidia", "runc"))
    host_checks(_plan(tmp_path), Registry(tmp_path / "state"), rt)
    assert rt.pulled == ["vllm/vllm-openai:minimax-m3"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / HOOK).write_text("#!/bin/sh\n")
    (bin_dir / HOOK).chmod(0o755)
    assert gpu_runtime_problem("nvidia", ("runc",), path=str(bin_dir)) is None  # `--gpus` works through the hook
    assert gpu_runtime_problem(None, ("runc",)) is None  # a CPU container needs no toolkit


def _daemon_without_nvidia():
    inv = h200x2()
    c = ContainerFacts(docker_reachable=True, docker_version="27.1", docker_socket="/x.sock", runtimes=("runc",))
    return inv.model_copy(update={"container": c})


def test_doctor_refuses_docker_and_auto_plans_the_process_runtime_on_such_a_daemon():
    inv = _daemon_without_nvidia()
    rep = run_doctor(inv, runtime="docker", host_checks=False)
    row = rep.check("container.nvidia_runtime")
    assert row.status == "FAIL" and "not registered" in row.message
    v = rep.verdict
    assert v.status == "not_runnable" and v.severity == "fatal" and v.serve_command is None
    assert any(b.startswith("container.nvidia_runtime:") for b in v.blockers)
    auto = run_doctor(inv, host_checks=False)
    assert auto.check("container.nvidia_runtime").status == "WARN"
    assert "--runtime docker" not in (auto.verdict.serve_command or "")
    assert (auto.verdict.plan_request or {}).get("runtime") != "docker"
