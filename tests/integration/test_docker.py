"""The docker runtime on a real Docker engine running the real vLLM CPU server in a container.

The module starts its own ``dockerd`` (``--bridge=none --iptables=false``, own socket via
DOCKER_HOST) and builds the local image without any registry (m3ctl/dev/docker_stack.py; recipe
in shared/reference/cpu-test-stack.md section 4). One container server is shared by the tests that
only read from it; the fault tests that need their own launch run before it starts, so at most
one vLLM server of this module runs at a time. Skipped, with the reason, only where no engine can
start (no dockerd binary, not permitted to start one).
"""

from __future__ import annotations

import json
import os
import signal

import httpx
import psutil
import pytest

from m3ctl.assess.request import PlanRequest
from m3ctl.runtime.base import port_in_use
from tests.conftest import free_port, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.docker]

SECRET = "hf_m3ctlDockerTestSecret0123456789"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from m3ctl.dev.docker_stack import StackUnavailable, ensure_images, start_engine

    try:
        eng = start_engine()
    except StackUnavailable as e:
        pytest.skip(f"no container engine can start here: {e}")
    try:
        timings = ensure_images(eng)
    except StackUnavailable as e:
        eng.stop()
        pytest.skip(f"cannot build the local image: {e}")
    print(f"\nprivate dockerd ready in {eng.timings['dockerd_ready_s']:.1f} s; image steps {timings or 'cached'}")
    mp = pytest.MonkeyPatch()
    mp.setenv("DOCKER_HOST", eng.docker_host)
    yield eng
    mp.undo()
    eng.stop()


@pytest.fixture
def docker_env(engine):
    return {"DOCKER_HOST": engine.docker_host}


def _image_args() -> list[str]:
    from m3ctl.dev.docker_stack import VLLM_CPU_IMAGE, site_mounts

    return ["--runtime", "docker", "--image", VLLM_CPU_IMAGE, *(a for m in site_mounts() for a in ("--mount", m))]


def _containers(engine, name: str | None = None):
    c = engine.client()
    try:
        flt = {"label": f"m3ctl.name={name}"} if name else {"label": "m3ctl.name"}
        return c.containers.list(all=True, filters=flt)
    finally:
        c.close()


# ------------------------------------------------------------------ faults first (each launches on its own)
def test_image_that_does_not_exist(engine, docker_env, tiny_models):
    p = run_cli(
        "serve",
        "--model",
        str(tiny_models["llama"]),
        "--name",
        "noimg",
        "--port",
        str(free_port()),
        "--runtime",
        "docker",
        "--image",
        "m3ctl-test/does-not-exist:nope",
        "--detach",
        env=docker_env,
    )
    assert p.returncode == 3, p.stdout + p.stderr
    assert "m3ctl-test/does-not-exist:nope" in p.stderr and "docker load" in p.stderr
    assert "starting noimg" not in p.stdout and "Traceback" not in p.stderr
    assert _containers(engine, "noimg") == []


def test_container_exits_during_load_reports_phase_and_cause(engine, docker_env, tiny_models):
    port = free_port()
    args = [
        "serve",
        "--model",
        str(tiny_models["llama"]),
        "--name",
        "dies",
        "--port",
        str(port),
        *_image_args(),
        "--arg",
        "max-model-len=100000",
        "--detach",
    ]
    p = run_cli(*args, env=docker_env)  # the plan rule catches it in milliseconds ...
    assert p.returncode == 3 and "rule model.max_len" in p.stderr, p.stdout + p.stderr
    p = run_cli(*args, "--skip-checks", env=docker_env)  # ... and past the rule, the container dies while loading
    assert p.returncode == 4, p.stdout + p.stderr
    assert "✗ port" in p.stdout  # died while loading, before the API port opened
    assert "phase 'port'" in p.stderr and "max-model-len exceeds" in p.stderr and "100000" in p.stderr
    assert "Traceback" not in p.stderr
    assert _containers(engine, "dies") == [] and not port_in_use("127.0.0.1", port)
    st = json.loads(run_cli("status", "--json", env=docker_env, check=True).stdout)  # the record keeps the cause
    assert [(d["name"], d["phase"]) for d in st] == [("dies", "failed")] and "max-model-len exceeds" in st[0]["cause"]
    assert run_cli("stop", "dies", env=docker_env).returncode == 0
    assert json.loads(run_cli("status", "--json", env=docker_env, check=True).stdout) == []


def test_stop_of_unknown_name(docker_env):
    p = run_cli("stop", "nope", env=docker_env)
    assert p.returncode == 2 and "no deployment named 'nope'" in p.stderr


def test_emitted_docker_run_and_the_sdk_create_the_same_container(
    engine, docker_env, tiny_models, tmp_path, monkeypatch
):
    """The real docker CLI reads the emitted `docker run` (its --gpus CSV, -v, -e) into the same device request,
    binds and environment as the SDK kwargs of the runtime (containers created, not started: no NVIDIA here)."""
    import shlex
    import subprocess

    from m3ctl.dev.docker_stack import VLLM_CPU_IMAGE
    from m3ctl.planning.emit import render
    from m3ctl.planning.plan import plan
    from m3ctl.runtime.docker import container_spec
    from tests.hosts import ALL

    (tmp_path / "hf").mkdir()
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    inv = ALL["h200x2"]()
    p = plan(
        inv,
        PlanRequest(
            model=str(tiny_models["llama"]),
            name="emitcli",
            runtime="docker",
            image=VLLM_CPU_IMAGE,
            tp=2,
            skip_checks=True,
            pass_env=["HF_TOKEN"],
            vllm_executable="vllm",
        ),
    )
    argv = shlex.split(render(p, "docker"))  # no --runtime: the device request alone (created, never started)
    argv[argv.index("run") : argv.index("run") + 2] = ["create"]  # `run -d` -> `create`
    r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **docker_env, "HF_TOKEN": "x"})
    assert r.returncode == 0, r.stderr
    c = engine.client()
    try:
        cli_ct = c.containers.get("m3ctl-emitcli")
        spec = container_spec(p, {"HF_TOKEN": "x"})
        spec.pop("detach")
        spec["name"] = "m3ctl-emitcli-sdk"
        sdk_ct = c.containers.create(**spec)
        a, b = cli_ct.attrs, sdk_ct.attrs
        devs = [(d["Driver"], d["DeviceIDs"], d["Capabilities"]) for d in a["HostConfig"]["DeviceRequests"]]
        assert devs == [(d["Driver"], d["DeviceIDs"], d["Capabilities"]) for d in b["HostConfig"]["DeviceRequests"]]
        assert devs == [
            ("nvidia", [g.uuid for g in inv.gpus], [["gpu"]])
        ]  # both GPUs, one request (not Count=1, ["0"])
        assert sorted(a["HostConfig"]["Binds"]) == sorted(b["HostConfig"]["Binds"])
        assert all(x.endswith(":ro") for x in a["HostConfig"]["Binds"])
        assert sorted(a["Config"]["Env"]) == sorted(b["Config"]["Env"])
        assert a["Config"]["Entrypoint"] == b["Config"]["Entrypoint"] == ["vllm"]
    finally:
        for n in ("m3ctl-emitcli", "m3ctl-emitcli-sdk"):
            try:
                c.containers.get(n).remove(force=True)
            except Exception:  # noqa: BLE001
                pass
        c.close()


def test_stop_finds_the_container_of_an_unreadable_record(engine, docker_env):
    """A truncated record of a docker deployment: status lists it as unreadable, stop finds its container by name."""
    from m3ctl.core.state import Registry
    from m3ctl.dev.docker_stack import VLLM_CPU_IMAGE

    c = engine.client()
    try:
        c.containers.run(
            VLLM_CPU_IMAGE,
            ["-c", "import time; time.sleep(300)"],
            entrypoint=["python3"],
            name="m3ctl-lostrec",
            labels={"m3ctl.name": "lostrec"},
            detach=True,
            network_mode="host",
        )
        reg = Registry()
        reg.deployments_dir.mkdir(parents=True, exist_ok=True)
        (reg.deployments_dir / "lostrec.json").write_text('{"name": "lostrec", "runtime": "dock')
        st = json.loads(run_cli("status", "--json", env=docker_env, check=True).stdout)
        assert [(d["name"], d["phase"]) for d in st] == [("lostrec", "unreadable")]
        p = run_cli("stop", "lostrec", "--timeout", "2", env=docker_env)  # python as PID 1 ignores SIGTERM
        assert p.returncode == 0 and "lostrec: killed" in p.stdout, p.stdout + p.stderr
        assert _containers(engine, "lostrec") == [] and not reg.exists("lostrec")
    finally:
        for ct in c.containers.list(all=True, filters={"name": "m3ctl-lostrec"}):
            ct.remove(force=True)
        c.close()


# ------------------------------------------------------------------ one shared container server
@pytest.fixture(scope="module")
def dserver(engine, tiny_models, tmp_path_factory):
    """The real vLLM CPU server (tiny MiniMax-M2) in a container launched through the docker runtime."""
    from m3ctl.catalog import profiles
    from m3ctl.core.state import Registry
    from m3ctl.dev.docker_stack import VLLM_CPU_IMAGE, site_mounts
    from m3ctl.hw.detect import detect
    from m3ctl.planning.plan import PlanRequest, plan
    from m3ctl.runtime.docker import DockerOptions, DockerRuntime
    from m3ctl.serving.serve import launch_and_wait, stop

    state = tmp_path_factory.mktemp("docker-state")
    reg = Registry(state)
    rt = DockerRuntime(DockerOptions(mounts=site_mounts()))
    p = plan(
        detect(),
        PlanRequest(
            model=str(tiny_models["m2"]), name="dshared", port=free_port(), runtime="docker", image=VLLM_CPU_IMAGE
        ),
    )
    res = launch_and_wait(p, registry=reg, secret_env={"HF_TOKEN": SECRET}, runtime=rt, expect=profiles()["cpu"].expect)
    yield {"res": res, "reg": reg, "rt": rt, "state": state, "plan": p}
    if reg.exists("dshared"):
        reps = stop(["dshared"], registry=reg)
        assert reps[0].leftover == [] and reps[0].port_free


def test_docker_ready_and_real_completion(dserver):
    res = dserver["res"]
    assert list(res.readiness.phase_times) == ["process", "port", "health", "models", "completion"]
    dep = res.deployment
    assert dep.runtime == "docker" and dep.container_id and dep.image == dserver["plan"].image
    r = httpx.post(
        f"{dep.url}/v1/completions",
        json={"model": dep.served_model_name, "prompt": "def f(x):", "max_tokens": 8, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8


def test_docker_labels_secrets_ipc_and_restart_policy(dserver, engine):
    dep = dserver["res"].deployment
    (ct,) = _containers(engine, "dshared")
    a = ct.attrs
    labels = a["Config"]["Labels"]
    assert labels["m3ctl.name"] == "dshared" and labels["m3ctl.plan-hash"] == dep.plan_hash
    assert labels["m3ctl.model"] == dserver["plan"].model and labels["m3ctl.port"] == str(dep.port)
    assert a["HostConfig"]["RestartPolicy"]["Name"] == "no"
    assert a["HostConfig"]["IpcMode"] == "host" and a["HostConfig"]["NetworkMode"] == "host"
    assert f"HF_TOKEN={SECRET}" in a["Config"]["Env"]  # secrets travel by env only ...
    public = json.dumps([a["Config"]["Cmd"], a["Config"]["Entrypoint"], a["Args"], labels, a["Name"]])
    assert SECRET not in public  # ... never argv or labels
    assert SECRET not in (dserver["state"] / "deployments" / "dshared.json").read_text()
    assert SECRET not in (dserver["state"] / "plans" / "dshared.json").read_text()
    # F14: /dev/shm inside is the host's (ipc=host), not docker's 64 MiB default.
    code, out = ct.exec_run(["python3", "-c", "import os;s=os.statvfs('/dev/shm');print(s.f_frsize*s.f_blocks)"])
    assert code == 0 and int(out) > 1024**3
    binds = {b.split(":")[1]: b.split(":")[-1] for b in a["HostConfig"]["Binds"]}
    assert binds[dserver["plan"].model] == "ro" and binds["/opt/vllm-site"] == "ro"


def test_docker_kernels_verified_from_container_log(dserver):
    k = dserver["res"].kernels
    assert k.observed.get("moe") == ["CPU"]
    assert any(f.level == "OK" and f.kind == "moe" for f in k.findings)


def test_docker_status_and_logs_cli(dserver, docker_env):
    env = {**docker_env, "M3CTL_STATE_DIR": str(dserver["state"])}
    st = json.loads(run_cli("status", "--json", env=env, check=True).stdout)
    assert [(d["name"], d["runtime"], d["phase"], d["alive"]) for d in st] == [("dshared", "docker", "ready", True)]
    assert st[0]["image"] == dserver["plan"].image and st[0]["container_id"]
    table = run_cli("status", env=env, check=True).stdout
    assert "dshared" in table and "docker" in table
    logs = run_cli("logs", "dshared", "-n", "2000", env=env, check=True).stdout
    assert "Application startup complete" in logs and "Using CPU Unquantized MoE backend" in logs
    # m3ctl's vLLM plugin is importable in the container and ran in the engine (docs/sources.md#cpu-amx-permission)
    assert "m3ctl plugin: AMX tile permission" in logs and "Failed to load plugin" not in logs


def test_docker_watch_cli_probes_with_real_completions(dserver, docker_env):
    env = {**docker_env, "M3CTL_STATE_DIR": str(dserver["state"])}
    p = run_cli("watch", "dshared", "--count", "2", "--interval", "0.5", env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count(" ok canary 1 token in ") == 2


def test_docker_engine_core_killed_watchdog_notices(dserver):
    """Kill the EngineCore inside the container while the API server process lives on."""
    import time

    from m3ctl.serving.watchdog import Watchdog

    dep, rt = dserver["res"].deployment, dserver["rt"]
    dog = Watchdog(dep, rt, canary_timeout_s=10)
    assert dog.probe().ok
    engine_core = [p for p in map(psutil.Process, rt.pids(dep)) if "EngineCore" in " ".join(p.cmdline()) + p.name()]
    assert engine_core, "no EngineCore process found in the container"
    engine_core[0].send_signal(signal.SIGKILL)
    deadline, probe = time.time() + 60, None
    while time.time() < deadline:
        probe = dog.probe()
        if not probe.ok:
            break
        time.sleep(0.5)
    assert probe is not None and probe.verdict in ("engine-dead", "exited", "unreachable"), probe


def test_docker_stop_cli_leaves_nothing(dserver, engine, docker_env):
    dep = dserver["res"].deployment
    env = {**docker_env, "M3CTL_STATE_DIR": str(dserver["state"])}
    p = run_cli("stop", "dshared", env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "dshared:" in p.stdout and "port free" in p.stdout and "gpu memory n/a (no NVML)" in p.stdout
    assert _containers(engine, "dshared") == [] and not port_in_use("127.0.0.1", dep.port)
    assert json.loads(run_cli("status", "--json", env=env, check=True).stdout) == []
    # the log survives the container, for post-mortems
    assert "Application startup complete" in open(dep.log_path).read()
