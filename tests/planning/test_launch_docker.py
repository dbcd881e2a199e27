"""One docker launch, rendered once (m3ctl.planning.launch.DockerRun): the ``docker run`` that ``serve`` prints and
``plan --emit docker`` writes, and the docker SDK kwargs the docker runtime sends, are two renders of the same
object. Here the printed command is parsed (shlex, as a shell would split it) back into SDK kwargs and compared
whole; the real-engine test creates both containers (``docker create``, never started: no GPU here) and compares
``docker inspect``. Secrets: names only in the printed command, values only in the SDK's environment.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from m3ctl.assess.request import PlanRequest
from m3ctl.core.state import Registry
from m3ctl.planning.emit import docker_command, render
from m3ctl.planning.launch import DockerRun, plan_docker_run
from m3ctl.planning.plan import LaunchPlan, plan
from m3ctl.runtime.docker import DockerOptions, container_spec
from tests.hosts import ALL
from tests.hw.test_hw import dockerd  # noqa: F401 - the real private dockerd fixture

SECRET = "hf_m3ctlLaunchSpecSecret0123456789"
KEY = "sk-m3ctl-launch-spec-key-0123456789"


@pytest.fixture
def model_dir(tmp_path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "hidden_size": 64,
                "max_position_embeddings": 4096,
            }
        )
    )
    return d


@pytest.fixture
def hf_home(tmp_path, monkeypatch) -> Path:
    hf = tmp_path / "hf"
    hf.mkdir()
    monkeypatch.setenv("HF_HOME", str(hf))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return hf


def _nvidia_plan(model_dir: Path, image: str = "vllm/vllm-openai:v0.32.0", **kw) -> LaunchPlan:
    return plan(
        ALL["h200x2"](),
        PlanRequest(
            model=str(model_dir),
            runtime="docker",
            vllm_executable="vllm",
            skip_checks=True,
            image=image,
            tp=2,
            pass_env=["HF_TOKEN"],
            **kw,
        ),
    )


def _amd_plan() -> LaunchPlan:
    return LaunchPlan(
        name="r",
        profile="my-rocm",
        image="rocm/vllm:latest",
        model="org/m",
        served_model_name="org/m",
        port=8000,
        startup_budget_s=100,
        argv=["vllm", "serve", "org/m"],
        vllm_args={},
        gpu_vendor="amd",
        gpu_devices=["0", "1"],
        gpus=[0, 1],
        tp=2,
        env={"VLLM_ROCM_USE_AITER": "1", "HIP_VISIBLE_DEVICES": "0"},
        secret_env_names=["HF_TOKEN"],
    )


def parse_docker_run(argv: list[str], caller_env: dict[str, str]) -> dict:
    """The docker SDK kwargs a ``docker run`` argv asks for, read as the docker CLI reads it (``-e NAME``: the
    value from ``caller_env``, left out when unset there; ``--gpus``: a CSV record, docker/cli opts/gpus.go)."""
    assert argv[:2] == ["docker", "run"]
    out: dict = {
        "restart_policy": None,
        "stdin_open": False,
        "tty": False,
        "labels": {},
        "volumes": {},
        "environment": {},
    }
    i = 2
    while i < len(argv):
        a = argv[i]
        if a == "-d":
            out["detach"] = True
        elif a.startswith("--ipc="):
            out["ipc_mode"] = a.split("=", 1)[1]
        elif a == "--entrypoint":
            out["entrypoint"] = [argv[i + 1]]
            out["image"] = argv[i + 2]
            out["command"] = argv[i + 3 :]
            break
        else:
            v = argv[i + 1]
            i += 1
            if a == "--name":
                out["name"] = v
            elif a == "--restart":
                out["restart_policy"] = {"Name": v}
            elif a == "--network":
                out["network_mode"] = v
            elif a == "-p":
                hip, hport, cport = v.rsplit(":", 2)
                out.setdefault("ports", {})[f"{cport}/tcp"] = (hip.strip("[]"), int(hport))
            elif a == "--shm-size":
                out["shm_size"] = v
            elif a == "--ulimit":
                name, lim = v.split("=")
                soft, hard = lim.split(":")
                out.setdefault("ulimits", []).append({"Name": name, "Soft": int(soft), "Hard": int(hard)})
            elif a == "-v":
                src, dst, mode = v.split(":")
                out["volumes"][src] = {"bind": dst, "mode": mode}
            elif a == "--label":
                k, _, val = v.partition("=")
                out["labels"][k] = val
            elif a == "--gpus":
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
                out.setdefault("device_requests", []).append(req)
            elif a == "--device":
                out.setdefault("devices", []).append(f"{v}:{v}:rwm")
            elif a == "--group-add":
                out.setdefault("group_add", []).append(v)
            elif a == "--security-opt":
                out.setdefault("security_opt", []).append(v)
            elif a == "--user":
                out["user"] = v
            elif a == "-e":
                k, eq, val = v.partition("=")
                if eq:
                    out["environment"][k] = val
                elif k in caller_env:
                    out["environment"][k] = caller_env[k]
            else:
                raise AssertionError(f"unexpected docker run flag {a!r}")
        i += 1
    return out


def _sdk_plain(spec: dict) -> dict:
    """SDK kwargs with the docker.types objects as the dicts the Engine API gets."""
    out = dict(spec)
    for k in ("device_requests", "ulimits"):
        if k in out:
            out[k] = [{kk: vv for kk, vv in dict(x).items()} for x in out[k]]
    if "device_requests" in out:
        out["device_requests"] = [
            {"Driver": "", "Count": 0, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}, **r}
            for r in out["device_requests"]
        ]
    return out


def _no_ids_as_empty(spec: dict) -> dict:
    """``DeviceIDs`` null (the CLI's "all") and [] (the SDK's) are the same request to the engine."""
    for r in spec.get("device_requests", []):
        r["DeviceIDs"] = r["DeviceIDs"] or []
    return spec


def _assert_printed_is_created(argv: list[str], sdk: dict, secrets: dict[str, str]) -> None:
    printed = " ".join(argv)
    for value in secrets.values():  # secrets: names in argv, values only in the SDK's environment
        assert value not in printed
    assert _no_ids_as_empty(parse_docker_run(argv, caller_env=secrets)) == _no_ids_as_empty(_sdk_plain(sdk))


def test_nvidia_printed_docker_run_is_the_sdk_kwargs(model_dir, hf_home, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    p = _nvidia_plan(model_dir)
    secrets = {"HF_TOKEN": SECRET, "VLLM_API_KEY": KEY}  # a key handed to the launch: its name is printed too
    marker = Registry().marker(p.name)
    run = plan_docker_run(p, secret_names=list(secrets), marker=marker)
    argv = run.cli_args()
    sdk = run.sdk_kwargs(secrets)
    _assert_printed_is_created(argv, sdk, secrets)
    assert sdk == container_spec(p, secrets, marker=marker)  # what DockerRuntime.launch sends
    assert ["-e", "HF_TOKEN"] == argv[argv.index("HF_TOKEN") - 1 : argv.index("HF_TOKEN") + 1]
    assert sdk["device_requests"][0]["DeviceIDs"] == [g.uuid for g in ALL["h200x2"]().gpus]
    assert set(sdk["volumes"]) == {str(model_dir.resolve()), str(hf_home)}
    assert sdk["labels"]["m3ctl.deployment"] == marker and "--runtime" not in argv
    # what serve prints (m3ctl/cli/render.py: emit.docker_command) is this object, with the runtime's label
    assert shlex.split(docker_command(p)) == plan_docker_run(p, marker=marker).cli_args()


def test_amd_printed_docker_run_is_the_sdk_kwargs(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "absent"))  # no HF cache yet: a hub model binds it read-write anyway
    p = _amd_plan()
    run = plan_docker_run(p)
    argv, sdk = run.cli_args(), run.sdk_kwargs({"HF_TOKEN": SECRET})
    _assert_printed_is_created(argv, sdk, {"HF_TOKEN": SECRET})
    assert sdk["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"] and sdk["group_add"] == ["video"]
    assert sdk["security_opt"] == ["seccomp=unconfined"] and "device_requests" not in sdk
    assert sdk["environment"]["ROCR_VISIBLE_DEVICES"] == "0,1" and "HIP_VISIBLE_DEVICES" not in sdk["environment"]
    assert sdk["volumes"] == {str(tmp_path / "absent"): {"bind": "/root/.cache/huggingface", "mode": "rw"}}


@pytest.mark.parametrize(
    "opts",
    [
        DockerOptions(network="bridge"),
        DockerOptions(ipc_host=False),
        DockerOptions(ipc_host=False, shm_size="32g", network="bridge"),
        DockerOptions(gpu_vendor="nvidia"),
        DockerOptions(gpu_vendor="amd", gpu_devices=["2", "3"]),
    ],
    ids=["bridge", "no-ipc-host", "shm-bridge", "all-nvidia", "amd-override"],
)
def test_runtime_options_reach_the_printed_command(opts, model_dir, hf_home, tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir()
    opts = opts.model_copy(update={"mounts": [f"{extra}:/data", f"{extra}/../ckpt:/w:rw"]})
    p = _nvidia_plan(model_dir)
    run = plan_docker_run(p, opts)
    _assert_printed_is_created(run.cli_args(), run.sdk_kwargs({}), {})
    assert shlex.split(docker_command(p, opts, marker=None)) == run.cli_args()
    assert run.sdk_kwargs({}) == container_spec(p, {}, opts)


def test_bridge_publishes_the_plan_address_and_listens_on_all_interfaces_inside(model_dir, hf_home):
    p = _nvidia_plan(model_dir)
    argv = plan_docker_run(p, DockerOptions(network="bridge")).cli_args()
    assert argv[argv.index("-p") + 1] == f"127.0.0.1:{p.port}:{p.port}" and "--network" not in argv
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    argv = plan_docker_run(p).cli_args()  # host network: where the plan says
    assert argv[argv.index("--network") + 1] == "host" and argv[argv.index("--host") + 1] == "127.0.0.1"


def test_script_runs_the_same_container_in_the_foreground(model_dir, hf_home):
    p = _nvidia_plan(model_dir)
    (line,) = [ln for ln in render(p, "script").splitlines() if ln.startswith("exec ")]
    argv = shlex.split(line)[1:]
    assert argv[:3] == ["docker", "run", "--rm"]
    assert argv[3:] == plan_docker_run(p).cli_args()[3:]


def test_the_launch_object_holds_no_secret_value(model_dir, hf_home):
    p = _nvidia_plan(model_dir)
    run = plan_docker_run(p, secret_names=["HF_TOKEN", "VLLM_API_KEY"])
    assert SECRET not in run.model_dump_json() and "VLLM_API_KEY" in run.secret_env_names
    assert DockerRun.model_validate_json(run.model_dump_json()) == run


# ------------------------------------------------------------------ a real engine: docker inspect of both
def _tiny_image(client, ref: str = "m3ctl-test/launch-spec:1") -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("etc/marker")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"ok"))
    repo, tag = ref.rsplit(":", 1)
    client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=tag)
    return ref


_COMPARED = {  # docker inspect fields the printed command and the SDK both set
    "Config": ["Image", "Entrypoint", "Cmd", "Env", "Labels", "User", "Tty", "OpenStdin"],
    "HostConfig": [
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
        "Runtime",
        "Privileged",
        "CapAdd",
    ],
}


def _inspect(client, name: str) -> dict:
    a = client.api.inspect_container(name)
    got = {sec: {k: a[sec].get(k) for k in keys} for sec, keys in _COMPARED.items()}
    got["Name"] = a["Name"]
    for k, v in got["HostConfig"].items():  # the CLI sends [] / {} where the SDK sends nothing: the same to the engine
        got["HostConfig"][k] = v if v not in ([], {}) else None
    got["Config"]["Env"] = sorted(got["Config"]["Env"] or [])  # order: the image's PATH first, then ours
    got["HostConfig"]["Binds"] = sorted(got["HostConfig"]["Binds"] or [])
    return got


@pytest.mark.docker
def test_printed_docker_run_creates_the_container_the_runtime_creates(
    dockerd,  # noqa: F811 - the fixture imported from tests.hw.test_hw
    model_dir,
    hf_home,
    tmp_path,
    monkeypatch,
):
    """``docker create`` from the printed command (the real docker CLI) and the SDK kwargs of the docker runtime
    give the same ``docker inspect`` (image, entrypoint, command, env, labels, binds, network, ipc, shm, ulimits,
    device requests, restart). Created, never started: this host has no GPU. AMD device nodes are not created
    here (the engine resolves --device on the host, which has no /dev/kfd); the unit tests compare them."""
    import docker

    cli = shutil.which("docker")
    if cli is None:
        pytest.skip("no docker CLI (apt-get install docker.io)")
    client = docker.DockerClient(base_url=dockerd, timeout=60)
    image = _tiny_image(client)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    extra = tmp_path / "extra"
    extra.mkdir()
    p = _nvidia_plan(model_dir, image=image, name="inspectme")
    marker = Registry().marker(p.name)
    secrets = {"HF_TOKEN": SECRET}
    cases = {"defaults": DockerOptions(), "no-ipc-host": DockerOptions(ipc_host=False, mounts=[f"{extra}:/data:rw"])}
    try:
        for case, opts in cases.items():
            printed = docker_command(p, opts, marker=marker)
            assert SECRET not in printed
            argv = shlex.split(printed)
            argv[1:3] = ["create"]  # `run -d` -> `create`: nothing starts
            r = subprocess.run(
                [cli, *argv[1:]],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "DOCKER_HOST": dockerd, "HF_TOKEN": SECRET},
            )
            assert r.returncode == 0, f"{case}: {r.stderr}"
            from_cli = _inspect(client, "m3ctl-inspectme")
            client.api.remove_container("m3ctl-inspectme", force=True)
            spec = container_spec(p, secrets, opts, marker=marker)
            spec.pop("detach")
            client.containers.create(**spec)
            from_sdk = _inspect(client, "m3ctl-inspectme")
            client.api.remove_container("m3ctl-inspectme", force=True)
            diff = {
                f"{sec}.{k}": (from_cli[sec][k], from_sdk[sec][k])
                for sec in _COMPARED
                for k in _COMPARED[sec]
                if from_cli[sec][k] != from_sdk[sec][k]
            }
            assert not diff and from_cli == from_sdk, f"{case}: printed (docker CLI) vs SDK: {diff}"
            # and both are what was printed
            parsed = parse_docker_run(shlex.split(printed), secrets)
            assert from_cli["Config"]["Cmd"] == parsed["command"] and from_cli["Config"]["Image"] == image
            assert f"HF_TOKEN={SECRET}" in from_cli["Config"]["Env"]
            assert from_cli["HostConfig"]["Binds"] == sorted(
                f"{s}:{v['bind']}:{v['mode']}" for s, v in parsed["volumes"].items()
            )
            assert from_cli["Config"]["Labels"]["m3ctl.deployment"] == marker
            (req,) = from_cli["HostConfig"]["DeviceRequests"]
            assert (req["Driver"], req["DeviceIDs"]) == ("nvidia", [g.uuid for g in ALL["h200x2"]().gpus])
            assert from_cli["HostConfig"]["NetworkMode"] == "host"
            if case == "defaults":
                assert from_cli["HostConfig"]["IpcMode"] == "host"
            else:
                assert from_cli["HostConfig"]["ShmSize"] == 4 * 2**30  # 2 GiB x TP 2 (F14)
                assert from_cli["HostConfig"]["Ulimits"] == [{"Name": "memlock", "Soft": -1, "Hard": -1}]
    finally:
        for ct in client.containers.list(all=True, filters={"name": "m3ctl-inspectme"}):
            ct.remove(force=True)
        client.images.remove(image, force=True)
        client.close()


def test_serve_prints_the_mounts_its_runtime_creates(model_dir, hf_home, tmp_path):
    """`m3ctl serve --runtime docker --mount SRC:DST` prints the docker run of the runtime that launches it: the
    extra mount is in the printed line (it used to be left out)."""
    from m3ctl.cli.render import shown_command
    from m3ctl.runtime.docker import DockerRuntime

    extra = tmp_path / "data"
    extra.mkdir()
    p = _nvidia_plan(model_dir)
    rt = DockerRuntime(DockerOptions(mounts=[f"{extra}:/data:ro"]))
    printed = shlex.split(shown_command(p, rt))
    assert any(f"{extra}:/data:ro" in a for a in printed)
    assert printed == shlex.split(docker_command(p, rt.options))
    assert not any(str(extra) in a for a in shlex.split(shown_command(p)))  # a plan alone: the runtime defaults


def test_the_launch_spec_owns_the_docker_options_and_labels_without_importing_the_runtime():
    """planning.launch decides the container (DockerOptions, the deployment label); runtime.docker launches it and
    imports launch, never the other way round (no import cycle, no function-level import of the runtime)."""
    import ast
    import sys

    from m3ctl.planning import launch
    from m3ctl.runtime import docker as rdocker

    assert rdocker.DockerOptions is launch.DockerOptions and launch.DEPLOYMENT_LABEL == "m3ctl.deployment"
    tree = ast.parse(Path(launch.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m.startswith("m3ctl.runtime")}, imported
    code = "import sys, m3ctl.planning.launch\nprint(sorted(m for m in sys.modules if m.startswith('m3ctl.runtime')))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]", p.stdout + p.stderr
