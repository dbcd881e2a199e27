"""Emitted launch forms (m3ctl/planning/emit.py), rendered from the launch spec (m3ctl/planning/launch.py), checked by the tools
that consume them: the docker CLI's CSV reading of ``--gpus``, ``docker-compose config`` (Compose v2),
``kubernetes-validate`` and ``bash -n``; and the docker CLI text against the docker SDK kwargs (one spec).
"""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from m3ctl.assess.request import PlanRequest
from m3ctl.planning.emit import render
from m3ctl.planning.launch import launch_spec
from m3ctl.planning.plan import LaunchPlan, plan
from m3ctl.runtime.docker import container_spec
from tests.conftest import run_cli
from tests.hosts import ALL

BIN = Path(sys.executable).parent


@pytest.fixture
def tiny_model_dir(tmp_path) -> Path:
    """A local checkpoint directory (config.json only: planning reads nothing else)."""
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


def _b200(**kw) -> LaunchPlan:
    return plan(
        ALL["b200x8"](), PlanRequest(model="MiniMax-M3.1-Flash", runtime="docker", vllm_executable="vllm", **kw)
    )


def _docker_cli_gpus(value: str) -> list[str]:
    """The device ids the docker CLI asks for, read as it reads ``--gpus`` (docker/cli opts/gpus.go: a CSV
    record of ``key=value`` fields; ``device=`` holds a comma list only inside one quoted CSV field)."""
    (fields,) = list(csv.reader([value]))
    ids: list[str] = []
    for f in fields:
        k, _, v = f.partition("=")
        if k == "device":
            ids += v.split(",")
    return ids


def _flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_docker_gpus_value_survives_the_docker_cli_csv_reader():
    argv = shlex.split(render(_b200(), "docker"))  # what the shell hands to the docker CLI
    (gpus,) = _flag_values(argv, "--gpus")
    assert _docker_cli_gpus(gpus) == [str(i) for i in range(8)]


def _probed_b200():
    """A b200x8 host as detection on it reports it (not the catalog system: this machine's HF cache applies)."""
    return ALL["b200x8"]().model_copy(update={"system": None})


def test_local_model_dir_and_its_hf_cache_are_mounted_read_only(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    p = plan(
        _probed_b200(),
        PlanRequest(
            model=str(tiny_model_dir),
            runtime="docker",
            vllm_executable="vllm",
            skip_checks=True,
            image="vllm/vllm-openai:v0.32.0",
        ),
    )
    vols = _flag_values(shlex.split(render(p, "docker")), "-v")
    # No HF cache on this host yet: neither the printed command nor the runtime mounts it (docker would create an
    # empty root-owned directory, read-only inside); it was printed before and skipped by the runtime.
    assert vols == [f"{tiny_model_dir.resolve()}:{tiny_model_dir.resolve()}:ro"]
    assert list(container_spec(p, {})["volumes"]) == [str(tiny_model_dir.resolve())]
    (tmp_path / "hf-home").mkdir()
    vols = _flag_values(shlex.split(render(p, "docker")), "-v")
    assert f"{tiny_model_dir.resolve()}:{tiny_model_dir.resolve()}:ro" in vols
    assert f"{tmp_path / 'hf-home'}:/root/.cache/huggingface:ro" in vols
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "hub").mkdir()
    vols = _flag_values(shlex.split(render(p, "docker")), "-v")
    assert f"{tmp_path / 'hub'}:/root/.cache/huggingface/hub:ro" in vols
    svc = yaml.safe_load(render(p, "compose"))["services"]["m3ctl"]
    assert all(v["read_only"] for v in svc["volumes"]) and len(svc["volumes"]) == 2
    assert _k8s_hf_read_only(p) is True  # k8s said read-write here while docker and compose said read-only


def _k8s_hf_read_only(p) -> bool:
    """The hf-cache volumeMount's readOnly in the Deployment of ``render(p, "k8s")``."""
    docs = [d for d in yaml.safe_load_all(render(p, "k8s")) if d]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    mounts = dep["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    return next(m["readOnly"] for m in mounts if m["name"] == "hf-cache")


def test_a_hub_model_mounts_the_hf_cache_read_write_even_before_it_exists(tmp_path, monkeypatch):
    """A hub model downloads into the host's HF cache (vLLM's docker example mounts it read-write): read-only, the
    engine's download fails on a fresh host. Mounted before it exists; the docker runtime makes it as the user."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    req = dict(runtime="docker", vllm_executable="vllm", skip_checks=True, image="vllm/vllm-openai:v0.32.0")
    p = plan(_probed_b200(), PlanRequest(model="MiniMaxAI/MiniMax-M3.1-Flash", **req))
    assert _flag_values(shlex.split(render(p, "docker")), "-v") == [
        f"{tmp_path / 'hf-home'}:/root/.cache/huggingface:rw"
    ]
    assert container_spec(p, {})["volumes"] == {
        str(tmp_path / "hf-home"): {"bind": "/root/.cache/huggingface", "mode": "rw"}
    }
    svc = yaml.safe_load(render(p, "compose"))["services"]["m3ctl"]
    assert [v["read_only"] for v in svc["volumes"]] == [False]
    assert _k8s_hf_read_only(p) is False
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))  # huggingface_hub's older name
    assert f"{tmp_path / 'legacy'}:/root/.cache/huggingface/hub:rw" in _flag_values(
        shlex.split(render(p, "docker")), "-v"
    )


def test_amd_devices_follow_the_gpu_vendor_not_the_profile_name(tmp_path):
    p = LaunchPlan(
        name="r",
        profile="my-rocm-tuned",
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
    )
    d = render(p, "docker")
    assert "--device /dev/kfd --device /dev/dri --group-add video" in d and "--gpus" not in d and "nvidia" not in d


def test_script_is_for_the_target_host_not_this_machine():
    venv_vllm = "/home/me/proj/.venv/bin/vllm"
    p = plan(ALL["b200x8"](), PlanRequest(model="MiniMax-M3.1-Flash", runtime="process", vllm_executable=venv_vllm))
    s = render(p, "script")
    # the target host's vllm; it listens where serve would (loopback unless --host says otherwise)
    assert venv_vllm not in s and 'exec "${VLLM:-vllm}" serve ' in s and "--host 127.0.0.1" in s and "0.0.0.0" not in s
    d = _b200()  # a docker plan's script runs the image the plan chose, on the host network as serve does
    s = render(d, "script")
    assert "vllm/vllm-openai:minimax-m3" in s and "--network host" in s and "--host 127.0.0.1" in s
    shown = run_cli("plan", "--inventory", _inv_file("b200x8"), "--runtime", "docker").stdout
    assert "vllm/vllm-openai:minimax-m3" in shown and sys.executable.rsplit("/", 2)[0] not in shown


def _inv_file(host: str) -> str:
    path = Path(os.environ["M3CTL_STATE_DIR"]).parent / f"{host}.json"
    path.write_text(ALL[host]().model_dump_json())
    return str(path)


def test_golden_docker_cli_and_sdk_kwargs_agree(tmp_path, monkeypatch, tiny_model_dir):
    """One spec: the ``docker run`` text and the docker SDK kwargs ask for the same devices, mounts and env."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "hf").mkdir()
    inv = ALL["h200x2"]()
    p = plan(
        inv,
        PlanRequest(
            model=str(tiny_model_dir),
            runtime="docker",
            vllm_executable="vllm",
            skip_checks=True,
            image="vllm/vllm-openai:v0.32.0",
            pass_env=["HF_TOKEN"],
            tp=2,
        ),
    )
    argv = shlex.split(render(p, "docker"))
    sdk = container_spec(p, {"HF_TOKEN": "hf_x1234567890"})
    (gpus,) = _flag_values(argv, "--gpus")
    assert _docker_cli_gpus(gpus) == sdk["device_requests"][0]["DeviceIDs"] == [g.uuid for g in inv.gpus]
    cli_vols = {}
    for v in _flag_values(argv, "-v"):
        src, dst, mode = v.split(":")
        cli_vols[src] = {"bind": dst, "mode": mode}
    assert cli_vols == sdk["volumes"]
    cli_env = dict(e.partition("=")[::2] for e in _flag_values(argv, "-e") if "=" in e)
    passed = [e for e in _flag_values(argv, "-e") if "=" not in e]
    assert cli_env == {k: v for k, v in sdk["environment"].items() if k not in passed}
    assert passed == ["HF_TOKEN"] and "HF_TOKEN" in sdk["environment"]
    i = argv.index("--entrypoint")
    assert [argv[i + 1]] == sdk["entrypoint"] and argv[i + 2] == sdk["image"]
    assert _flag_values(argv, "--name") == [sdk["name"]]


# ---------------------------------------------------------------- real validators
def _tool(name: str) -> str:
    path = shutil.which(name) or (str(BIN / name) if (BIN / name).exists() else None)
    if path is None:
        pytest.skip(f"{name} not installed (pip install -e '.[dev]')")
    return path


def test_compose_passes_docker_compose_config(tmp_path):
    exe = _tool("docker-compose")
    for p in (
        _b200(pass_env=["HF_TOKEN"]),
        plan(ALL["mi355xx8"](), PlanRequest(model="MiniMax-M3.1-Flash", runtime="docker", vllm_executable="vllm")),
    ):
        f = tmp_path / "compose.yaml"
        f.write_text(render(p, "compose"))
        r = subprocess.run(
            [exe, "-f", str(f), "config", "--quiet"],
            capture_output=True,
            text=True,
            env={**os.environ, "HF_TOKEN": "x"},
            timeout=60,
        )
        assert r.returncode == 0, r.stderr


def _k8s_validate(tmp_path: Path, docs: list[dict]) -> None:
    exe = _tool("kubernetes-validate")
    f = tmp_path / "objs.yaml"
    f.write_text(yaml.safe_dump_all(docs))
    r = subprocess.run([exe, "--strict", str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "INFO" in r.stdout, r.stdout + r.stderr


def test_k8s_objects_pass_kubernetes_validate_with_cache_claim_probes_and_secret_refs(tmp_path):
    p = _b200(pass_env=["HF_TOKEN", "VLLM_API_KEY"])
    docs = list(yaml.safe_load_all(render(p, "k8s")))
    _k8s_validate(tmp_path, docs)
    pvc, dep = docs
    assert pvc["kind"] == "PersistentVolumeClaim" and dep["kind"] == "Deployment"
    assert pvc["spec"]["resources"]["requests"]["storage"] == f"{math.ceil(p.weights_gib * 1.25) + 10}Gi"
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": pvc["metadata"]["name"]}} in pod["volumes"]
    assert not any("emptyDir" in v for v in pod["volumes"] if v["name"] != "shm")
    # Startup budget from the model size (the plan's), liveness /health, readiness needs the model listed.
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= p.startup_budget_s
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    probe = " ".join(c["readinessProbe"]["exec"]["command"])
    assert "/v1/models" in probe and repr(p.served_model_name) in probe and "VLLM_API_KEY" in probe
    for k in ("HF_TOKEN", "VLLM_API_KEY"):
        assert {"name": k, "valueFrom": {"secretKeyRef": {"name": "m3ctl-secrets", "key": k}}} in c["env"]
    host = list(yaml.safe_load_all(render(p, "k8s", hf_host_path="/mnt/hf")))
    assert (
        len(host) == 1
        and {"name": "hf-cache", "hostPath": {"path": "/mnt/hf", "type": "DirectoryOrCreate"}}
        in host[0]["spec"]["template"]["spec"]["volumes"]
    )


def test_lws_pod_templates_pass_kubernetes_validate_and_share_the_cache(tmp_path):
    p = _b200(tp=1, dp=8, ep=True)
    docs = list(yaml.safe_load_all(render(p, "lws", nodes=2)))
    pvc, lws = docs
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and lws["kind"] == "LeaderWorkerSet"
    t = lws["spec"]["leaderWorkerTemplate"]
    templates = [
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"t{i}"}, "template": t[k]}
        for i, k in enumerate(("leaderTemplate", "workerTemplate"))
    ]
    _k8s_validate(tmp_path, [pvc, *templates])
    lead = t["leaderTemplate"]["spec"]["containers"][0]
    assert lead["readinessProbe"] and lead["livenessProbe"]["httpGet"]["path"] == "/health"
    for k in ("leaderTemplate", "workerTemplate"):
        assert any(v.get("persistentVolumeClaim") for v in t[k]["spec"]["volumes"])


def test_scripts_pass_bash_n(tmp_path):
    forms = {
        "script-process": render(
            plan(
                ALL["b200x8"](),
                PlanRequest(
                    model="MiniMax-M3.1-Flash", runtime="process", vllm_executable="vllm", pass_env=["HF_TOKEN"]
                ),
            ),
            "script",
        ),
        "script-docker": render(_b200(), "script"),
        "ray": render(_b200(tp=8), "ray", nodes=2),
    }
    for name, text in forms.items():
        f = tmp_path / f"{name}.sh"
        f.write_text(text)
        r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, f"{name}: {r.stderr}"


def test_ray_form_spreads_tp_in_a_node_and_pp_across_nodes():
    s = render(_b200(tp=8), "ray", nodes=2)
    serve = next(line for line in s.splitlines() if "serve " in line)
    assert "--distributed-executor-backend ray" in serve and "--pipeline-parallel-size 2" in serve
    assert "--tensor-parallel-size 8" in serve and "ray start --head" in s and "--block" in s
    with pytest.raises(Exception, match="has DP 8"):
        render(_b200(tp=1, dp=8, ep=True), "ray", nodes=2)


# ---------------------------------------------------------------- served name
def test_served_name_is_the_model_id_with_the_deployment_name_as_alias():
    p = _b200(name="prod")
    spec = launch_spec(p)
    assert spec.served_model_names == ["MiniMaxAI/MiniMax-M3.1-Flash-NVFP4", "prod"]
    i = p.argv.index("--served-model-name")
    assert p.argv[i + 1 : i + 3] == ["MiniMaxAI/MiniMax-M3.1-Flash-NVFP4", "prod"] and p.served_model_name == p.model
    p = _b200(served_model_name="chat")
    assert p.argv[p.argv.index("--served-model-name") + 1 :][:2] == ["chat", "--block-size"]


def test_layout_from_the_plan_gives_bench_its_gpu_count():
    assert launch_spec(_b200(tp=4, dp=2, ep=True)).layout.num_gpus == 8
    assert launch_spec(_b200(tp=8, dcp=2, skip_checks=True)).layout.num_gpus == 8  # DCP reuses the TP GPUs
    p = _b200(tp=4, extra_args=["--pipeline-parallel-size", "2"], skip_checks=True)
    saved = LaunchPlan.model_validate_json(p.model_dump_json())  # as bench reads it from the registry
    assert launch_spec(saved).layout.num_gpus == 8 and launch_spec(saved).serve_args() == p.argv[1:]
    assert json.loads(p.model_dump_json())["vllm_args"]["pipeline-parallel-size"] == 2  # planned as --pp (issue 23)


def test_bench_deployment_takes_its_gpu_count_from_the_saved_layout(tmp_path, tiny_models):
    """bench --deployment reads the Layout of the saved plan (TP 4 x PP 2 = 8 GPUs: the PP is a raw flag)."""
    from m3ctl.core.state import Deployment, Registry
    from tests.conftest import start_groundtruth

    proc, url = start_groundtruth("--ttft-ms", "1", "--itl-ms", "1")
    try:
        reg = Registry()
        p = _b200(name="gt", tp=4, extra_args=["-pp", "2"], skip_checks=True)
        reg.save_plan("gt", p.model_dump_json())
        reg.save(
            Deployment(
                name="gt",
                port=int(url.rsplit(":", 1)[1]),
                served_model_name="groundtruth",
                model="groundtruth",
                argv=["vllm", "serve", "x"],
                pid=proc.pid,
            )
        )
        out = tmp_path / "b.json"
        r = run_cli(
            "bench",
            "--deployment",
            "gt",
            "--num-prompts",
            "2",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--tokenizer",
            str(tiny_models["m2"]),
            "--output-json",
            str(out),
        )
        assert r.returncode == 0, r.stdout + r.stderr
        res = json.loads(out.read_text())
        assert res["num_gpus"] == 8 and "deployment gt" in res["per_gpu"]["num_gpus_source"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_docker_form_binds_an_api_key_given_by_another_variable(tmp_path, monkeypatch):
    """``plan --api-key-env MY_KEY --emit docker`` wrote ``docker run ... -e VLLM_API_KEY`` alone: run where the key
    is in ``$MY_KEY`` (as the user said) and ``VLLM_API_KEY`` is unset, docker passed no key and vLLM served with no
    authentication. The form now binds it as the printed plan and the launch do (``VLLM_API_KEY="$MY_KEY" docker
    run ...``): by name, the value never in the text."""
    from m3ctl import api

    monkeypatch.setenv("MY_KEY", "sk-emit-secret")
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    p = api.plan(system="h200x8", runtime="docker", api_key_env="MY_KEY")
    line = render(p, "docker")
    assert "sk-emit-secret" not in line and line.startswith('VLLM_API_KEY="$MY_KEY" docker run ')
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text('#!/bin/sh\nprintf %s "$VLLM_API_KEY" > "$OUT"\n')
    (fake / "docker").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "MY_KEY": "sk-emit-secret", "OUT": str(tmp_path / "got")}
    subprocess.run(["sh", "-c", line], env=env, check=True)
    assert (tmp_path / "got").read_text() == "sk-emit-secret"
