"""Printed == launched, byte for byte: the ``docker run`` that ``m3ctl plan`` and ``m3ctl serve --dry-run`` print
(and the line ``serve`` prints as it starts) is the container m3ctl's docker runtime creates, checked against
``docker inspect`` of a real container on a private engine.

The printed command is read as the docker CLI reads it (shlex, as a shell splits it) into the ``docker inspect``
fields it asks for (Config: image, entrypoint, command, env, labels, user, tty, stdin; HostConfig: binds, network,
ipc, shm, ulimits, device requests, devices, groups, security options, restart policy, ports, privileged,
capabilities, auto-remove) and compared field by field with the container ``serve --runtime docker`` created.
The same printed command is also given to the real docker CLI (``docker create``) and the two inspections compared
whole. Created, never started: this host has no GPU (the launch is stopped right after the engine created it).
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from m3ctl import api
from m3ctl.errors import LaunchFailed
from tests.conftest import free_port, run_cli
from tests.hosts import ALL

SECRET = "hf_m3ctlPrintedIsLaunched0123456789"
NAME = "printed"
IMAGE = "m3ctl-test/printed-is-launched:1"


def _tiny_image(client) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("etc/marker")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"ok"))
    repo, tag = IMAGE.rsplit(":", 1)
    client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=tag)
    return IMAGE


def _size(v: str) -> int:
    units = {"b": 1, "k": 2**10, "m": 2**20, "g": 2**30}
    return int(v[:-1]) * units[v[-1].lower()] if v[-1].lower() in units else int(v)


def printed_to_inspect(argv: list[str], caller_env: dict[str, str]) -> dict[str, dict]:
    """The ``docker inspect`` fields a ``docker run`` argv asks for, as the docker CLI reads its flags (``-e NAME``:
    the caller's value, left out when unset; ``--gpus``: a CSV record, docker/cli opts/gpus.go). Fields the command
    leaves unset are the engine's defaults (None here, as :func:`_inspect` normalises them)."""
    assert argv[:2] == ["docker", "run"], argv[:2]
    cfg: dict = {"Image": None, "Entrypoint": None, "Cmd": None, "Env": [], "Labels": {}, "User": None}
    cfg.update({"Tty": False, "OpenStdin": False})
    host: dict = {k: None for k in _HOST_FIELDS}
    host.update({"NetworkMode": "default", "Privileged": False, "AutoRemove": False})
    i = 2
    while i < len(argv):
        a = argv[i]
        if a == "-d":
            pass
        elif a == "--rm":
            host["AutoRemove"] = True
        elif a.startswith("--ipc="):
            host["IpcMode"] = a.split("=", 1)[1]
            if host["IpcMode"] == "host":  # the engine turns labelling off for a host IPC namespace (moby
                host["SecurityOpt"] = [*(host["SecurityOpt"] or []), "label=disable"]  # daemon/create.go)
        elif a == "--entrypoint":
            cfg["Entrypoint"] = [argv[i + 1]]
            cfg["Image"] = argv[i + 2]
            cfg["Cmd"] = argv[i + 3 :] or None
            break
        else:
            v = argv[i + 1]
            i += 1
            if a == "--name":
                pass  # compared apart (inspect's Name)
            elif a == "--restart":
                host["RestartPolicy"] = {"Name": v, "MaximumRetryCount": 0}
            elif a == "--network":
                host["NetworkMode"] = v
            elif a == "-p":
                hip, hport, cport = v.rsplit(":", 2)
                host["PortBindings"] = {
                    **(host["PortBindings"] or {}),
                    f"{cport}/tcp": [{"HostIp": hip.strip("[]"), "HostPort": hport}],
                }
            elif a == "--shm-size":
                host["ShmSize"] = _size(v)
            elif a == "--ulimit":
                n, lim = v.split("=")
                soft, hard = lim.split(":")
                host["Ulimits"] = [*(host["Ulimits"] or []), {"Name": n, "Soft": int(soft), "Hard": int(hard)}]
            elif a == "-v":
                host["Binds"] = sorted([*(host["Binds"] or []), v])
            elif a == "--label":
                k, _, val = v.partition("=")
                cfg["Labels"][k] = val
            elif a == "--gpus":
                (req,) = _gpus(v)
                host["DeviceRequests"] = [req]
            elif a == "--device":
                host["Devices"] = [*(host["Devices"] or []), {"PathOnHost": v, "PathInContainer": v}]
            elif a == "--group-add":
                host["GroupAdd"] = [*(host["GroupAdd"] or []), v]
            elif a == "--security-opt":
                host["SecurityOpt"] = [*(host["SecurityOpt"] or []), v]
            elif a == "--user":
                cfg["User"] = v
            elif a == "-e":
                k, eq, val = v.partition("=")
                if eq:
                    cfg["Env"].append(f"{k}={val}")
                elif k in caller_env:
                    cfg["Env"].append(f"{k}={caller_env[k]}")
            else:
                raise AssertionError(f"a docker run flag this reader does not know: {a!r}")
        i += 1
    cfg["Env"] = sorted(cfg["Env"])
    return {"Config": cfg, "HostConfig": host}


def _gpus(v: str) -> list[dict]:
    import csv

    (fields,) = list(csv.reader([v]))
    req = {"Driver": "", "Count": 0, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}
    for f in fields:
        k, _, val = f.partition("=")
        if f == "all" or (k == "count" and val == "all"):
            req["Count"] = -1
        elif k == "driver":
            req["Driver"] = val
        elif k == "device":
            req["DeviceIDs"] = val.split(",")
        else:
            raise AssertionError(f"unexpected --gpus field {f!r}")
    return [req]


_HOST_FIELDS = (
    "Binds",
    "NetworkMode",
    "IpcMode",
    "ShmSize",
    "Ulimits",
    "DeviceRequests",
    "Devices",
    "GroupAdd",
    "SecurityOpt",
    "RestartPolicy",
    "PortBindings",
    "Privileged",
    "CapAdd",
    "AutoRemove",
)
_CONFIG_FIELDS = ("Image", "Entrypoint", "Cmd", "Env", "Labels", "User", "Tty", "OpenStdin")


def _inspect(client, name: str) -> dict[str, dict]:
    """The compared fields of ``docker inspect NAME``; [] / {} / "" as None (the CLI and the SDK send either), the
    engine's default shm size (64 MiB) and ``--ipc`` (private or shareable, the daemon's choice) as unset, devices
    without their cgroup permissions (``rwm`` both ways)."""
    a = client.api.inspect_container(name)
    cfg = {k: a["Config"].get(k) for k in _CONFIG_FIELDS}
    cfg["Env"] = sorted(cfg["Env"] or [])
    cfg["Labels"] = cfg["Labels"] or {}
    cfg["User"] = cfg["User"] or None
    host = {k: a["HostConfig"].get(k) for k in _HOST_FIELDS}
    for k, v in host.items():
        host[k] = None if v in ([], {}, "") else v
    if host["ShmSize"] == 64 * 2**20:
        host["ShmSize"] = None
    if host["IpcMode"] in ("private", "shareable"):
        host["IpcMode"] = None
    if host["Binds"]:
        host["Binds"] = sorted(host["Binds"])
    if host["Devices"]:
        host["Devices"] = [
            {"PathOnHost": d["PathOnHost"], "PathInContainer": d["PathInContainer"]} for d in host["Devices"]
        ]
    for r in host["DeviceRequests"] or []:
        r["DeviceIDs"] = r["DeviceIDs"] or None
        r["Options"] = r["Options"] or {}
    return {"Config": cfg, "HostConfig": host, "Name": a["Name"]}


def _field_diff(printed: dict, created: dict) -> dict[str, tuple]:
    return {
        f"{sec}.{k}": (printed[sec][k], created[sec][k])
        for sec in ("Config", "HostConfig")
        for k in printed[sec]
        if printed[sec][k] != created[sec][k]
    }


def _docker_line(stdout: str) -> list[str]:
    """The ``docker run`` command in a command's output, joined as a shell joins ``\\``-newline continuations."""
    text = stdout.replace("\\\n", "")
    (line,) = [ln for ln in text.splitlines() if ln.lstrip().startswith("docker run ")]
    return shlex.split(line)


@pytest.fixture(scope="module")
def engine():
    """A real private dockerd (Debian docker.io), started by m3ctl's test stack; stopped afterwards. It registers an
    ``nvidia`` runtime (backed by runc) as the NVIDIA container toolkit configures a GPU host's daemon: serve's
    pre-flight refuses a GPU container on a daemon without one (m3ctl.serving.preflight.check_gpu_runtime), and
    these containers are only created, never started."""
    from m3ctl.dev.docker_stack import StackUnavailable, start_engine

    try:
        eng = start_engine(runtimes={"nvidia": "runc"})
    except StackUnavailable as e:
        pytest.skip(f"no container engine can start here: {e}")
    try:
        yield eng.docker_host
    finally:
        eng.stop()


@pytest.fixture
def model_dir(tmp_path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 64,
        "max_position_embeddings": 4096,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.docker
def test_plan_and_serve_dry_run_print_the_container_serve_creates(
    engine,
    model_dir,
    tmp_path,
    monkeypatch,
):
    import docker
    from docker.models.containers import ContainerCollection

    cli = shutil.which("docker")
    if cli is None:
        pytest.skip("no docker CLI (apt-get install docker.io)")
    client = docker.DockerClient(base_url=engine, timeout=60)
    _tiny_image(client)
    hf = tmp_path / "hf"
    hf.mkdir()
    extra = tmp_path / "data"
    extra.mkdir()
    inv = tmp_path / "h200x2.json"
    inv.write_text(ALL["h200x2"]().model_dump_json())
    env = {"DOCKER_HOST": engine, "HF_HOME": str(hf), "HF_TOKEN": SECRET}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    port = free_port()
    args = ["--model", str(model_dir), "--runtime", "docker", "--image", IMAGE, "--inventory", str(inv)]
    args += ["--name", NAME, "--port", str(port), "--skip-checks"]
    mount = ["--mount", f"{extra}:/data:ro"]  # serve's option (the plan verb has none)

    planned = run_cli("plan", *args, "--emit", "docker", env=env)
    assert planned.returncode == 0, planned.stderr
    unmounted = run_cli("serve", "--dry-run", *args, env=env)
    assert unmounted.returncode == 0, unmounted.stderr
    assert _docker_line(planned.stdout) == _docker_line(unmounted.stdout)
    dry = run_cli("serve", "--dry-run", *args, *mount, env=env)
    assert dry.returncode == 0, dry.stderr
    assert SECRET not in planned.stdout + dry.stdout
    cases = {  # what was printed, and the launch of the same request
        "plan --emit docker": (_docker_line(planned.stdout), []),
        "serve --dry-run --mount": (_docker_line(dry.stdout), [f"{extra}:/data:ro"]),
    }
    announced: list[str] = []
    created: dict[str, dict] = {}

    def create_only(self, image, command=None, **kw):  # the engine creates it; this host cannot start it (no GPU)
        kw.pop("detach", None)
        ct = self.create(image, command, **kw)
        created.update(_inspect(self.client, ct.id))
        ct.remove(force=True)
        raise docker.errors.APIError("created, not started (test)")

    monkeypatch.setattr(ContainerCollection, "run", create_only)
    try:
        for case, (argv, mounts) in cases.items():
            created.clear()
            announced.clear()
            with pytest.raises(LaunchFailed, match="created, not started"):
                api.serve(
                    {"model": str(model_dir), "runtime": "docker", "image": IMAGE, "name": NAME, "port": port},
                    inventory=str(inv),
                    mounts=mounts,
                    smoke="off",
                    skip_checks=True,
                    on_start=lambda _p, cmd: announced.append(cmd),
                )
            assert created, f"{case}: the docker runtime created no container"
            assert created["Name"] == f"/m3ctl-{NAME}"
            assert f"HF_TOKEN={SECRET}" in created["Config"]["Env"]
            (line,) = announced
            for where, shown in ((case, argv), ("serve's starting line", shlex.split(line))):
                diff = _field_diff(printed_to_inspect(shown, {"HF_TOKEN": SECRET}), created)
                assert not diff, f"{where}: printed vs created by m3ctl's docker runtime (printed, created): {diff}"

            # the real docker CLI, given the printed command, creates the same container
            r = subprocess.run(
                [cli, "create", *argv[3:]],  # `docker run -d ...` -> `docker create ...`: nothing starts
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, **env},
            )
            assert r.returncode == 0, r.stderr
            by_cli = _inspect(client, f"m3ctl-{NAME}")
            client.api.remove_container(f"m3ctl-{NAME}", force=True)
            assert by_cli == created, f"{case}: docker CLI vs m3ctl's runtime: {_field_diff(by_cli, created)}"
    finally:
        for ct in client.containers.list(all=True, filters={"name": f"m3ctl-{NAME}"}):
            ct.remove(force=True)
        client.images.remove(IMAGE, force=True)
        client.close()


def test_a_docker_launch_adds_nothing_to_the_printed_plan(model_dir):
    """The launch pins vLLM's internal port (F17) for a process, never for a container: the container is the
    printed ``docker run``, which cannot know a port chosen at launch (it made the created container differ in
    ``VLLM_PORT`` and in its ``m3ctl.plan-hash`` label)."""
    from m3ctl.planning.launchplan import LaunchPlan
    from m3ctl.serving.preflight import assign_internal_ports

    base = {"name": "d", "profile": "p", "model": str(model_dir), "served_model_name": "m", "port": free_port()}
    base |= {"startup_budget_s": 10, "argv": ["vllm", "serve", str(model_dir)]}
    docker_plan = LaunchPlan(**base, runtime="docker", image=IMAGE)
    assert assign_internal_ports(docker_plan) == docker_plan
    pinned = assign_internal_ports(LaunchPlan(**base, runtime="process"))
    assert "VLLM_PORT" in pinned.env


def test_serve_prints_the_process_environment_it_launches(model_dir, tmp_path):
    """``serve``'s starting line shows the plan that launches, its pinned ``VLLM_PORT`` included (it showed the
    plan from before the pin)."""
    import sys

    from m3ctl.core.state import Registry
    from m3ctl.planning.emit import launch_command
    from m3ctl.planning.launchplan import LaunchPlan
    from m3ctl.serving.serve import launch_and_wait

    code = "import os, sys; print('VLLM_PORT=' + os.environ['VLLM_PORT'], flush=True); sys.exit(3)"
    p = LaunchPlan(
        name="shown",
        profile="p",
        model=str(model_dir),
        served_model_name="m",
        port=free_port(),
        startup_budget_s=30,
        argv=[sys.executable, "-c", code],
    )
    shown: list[str] = []
    reg = Registry()
    with pytest.raises(LaunchFailed):
        launch_and_wait(
            p, registry=reg, smoke="off", on_preflight=lambda launched: shown.append(launch_command(launched))
        )
    (line,) = shown
    (port,) = [t for t in shlex.split(line) if t.startswith("VLLM_PORT=")]
    assert port in reg.log_path("shown").read_text()
