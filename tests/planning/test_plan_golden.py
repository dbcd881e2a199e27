"""Golden plans for the real H200 capture and each synthetic host; emitted forms; CLI `plan`.

Regenerate after an intended catalog change: M3CTL_UPDATE_GOLDEN=1 pytest tests/planning/test_plan_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from m3ctl.errors import ConfigRejected
from m3ctl.planning.emit import render
from m3ctl.planning.plan import PlanRequest, plan
from tests.conftest import run_cli
from tests.hosts import ALL

GOLDEN = Path(__file__).parent.parent / "golden" / "plans"


def _golden_for(host: str) -> dict:
    inv = ALL[host]()
    try:
        p = plan(inv, PlanRequest(model="MiniMax-M3.1-Flash", runtime="docker", vllm_executable="vllm"))
        out = p.summary()
    except ConfigRejected as e:
        out = {"rejected": e.message, "hint": e.hint}
    # The 131072-token plan: what an operator of this host can run when the full context does not fit.
    try:
        p2 = plan(
            inv,
            PlanRequest(
                model="MiniMax-M3.1-Flash",
                runtime="docker",
                max_model_len=131072,
                allow_emulated=True,
                vllm_executable="vllm",
            ),
        )
        out2 = {"variant": p2.variant, "argv": p2.argv, "env": p2.env, "warnings": p2.warnings}
    except ConfigRejected as e:
        out2 = {"rejected": e.message}
    return {"host": host, "default": out, "context_131072_allow_emulated": out2}


@pytest.mark.parametrize("host", sorted(ALL))
def test_golden_plan(host):
    got = _golden_for(host)
    path = GOLDEN / f"{host}.json"
    if os.environ.get("M3CTL_UPDATE_GOLDEN") == "1" or not path.exists():
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text())


def test_emit_forms_for_b200():
    p = plan(
        ALL["b200x8"](),
        PlanRequest(model="MiniMax-M3.1-Flash", runtime="docker", pass_env=["HF_TOKEN"], vllm_executable="vllm"),
    )
    d = render(p, "docker")
    # The device request the runtime sends (driver nvidia, by device): printed as the docker CLI reads it, no --runtime.
    assert (
        d.startswith("docker run -d --name m3ctl-m3ctl --ipc=host")
        and """--gpus 'driver=nvidia,"device=0,1,2,3,4,5,6,7"'""" in d
    )
    assert "--runtime" not in d
    assert "vllm/vllm-openai:minimax-m3 serve MiniMaxAI/MiniMax-M3.1-Flash-NVFP4 --host 127.0.0.1" in d
    assert "--network host" in d and " -p " not in d  # binds where serve --runtime docker binds
    assert "-e HF_TOKEN " in d
    c = yaml.safe_load(render(p, "compose"))["services"]["m3ctl"]
    assert c["image"] == "vllm/vllm-openai:minimax-m3" and c["environment"]["HF_TOKEN"].startswith("${HF_TOKEN:?")
    assert c["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == [str(i) for i in range(8)]
    k = list(yaml.safe_load_all(render(p, "k8s")))[-1]
    cont = k["spec"]["template"]["spec"]["containers"][0]
    assert cont["resources"]["limits"]["nvidia.com/gpu"] == 8 and cont["startupProbe"]["httpGet"]["path"] == "/health"
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "m3ctl-secrets", "key": "HF_TOKEN"}}} in cont[
        "env"
    ]
    s = render(p, "script")
    assert (
        s.startswith("#!/usr/bin/env bash")
        and "vllm/vllm-openai:minimax-m3 serve MiniMaxAI/MiniMax-M3.1-Flash-NVFP4" in s
    )


def test_emit_amd_devices():
    p = plan(ALL["mi355xx8"](), PlanRequest(model="MiniMax-M3.1-Flash", runtime="docker", vllm_executable="vllm"))
    d = render(p, "docker")
    assert "--device /dev/kfd --device /dev/dri --group-add video --security-opt seccomp=unconfined" in d
    assert "VLLM_ROCM_USE_AITER=1" in d and "--attention-backend TRITON_ATTN" in d


def test_cli_plan_json_and_exit_codes(tmp_path):
    inv = tmp_path / "b200.json"
    inv.write_text(ALL["b200x8"]().model_dump_json())
    p = run_cli("plan", "--inventory", str(inv), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert set(d) >= {"image", "argv", "env", "explain", "rejected"} and d["variant"] == "nvfp4"
    p = run_cli("plan", "--inventory", str(inv), "--dcp", "2")
    assert p.returncode == 3 and p.stderr.startswith("error: rule parallel.dcp:")
    p = run_cli("plan", "--inventory", str(inv), "--emit", "k8s")
    assert p.returncode == 0 and [d["kind"] for d in yaml.safe_load_all(p.stdout)] == [
        "PersistentVolumeClaim",
        "Deployment",
    ]
    p = run_cli("plan", "--inventory", str(inv), "--emit", "helm")
    assert p.returncode == 2 and "'helm' is not one of docker" in p.stderr
    p = run_cli("plan", "--inventory", str(inv), "--variant", "nvfp5")
    assert p.returncode == 2 and "did you mean 'nvfp4'" in p.stderr
    p = run_cli("plan", "--inventory", str(inv), "--", "--max-num-seqs", "64")
    assert p.returncode == 0 and "--max-num-seqs 64" in p.stdout


def test_user_config_file_precedence(tmp_path):
    inv = tmp_path / "b200.json"
    inv.write_text(ALL["b200x8"]().model_dump_json())
    cfg = tmp_path / "m3ctl.yaml"
    cfg.write_text("schema_version: 1\nvariant: mxfp8\nmax_model_len: 131072\nargs: {max-num-seqs: 128}\n")
    d = json.loads(run_cli("plan", "--inventory", str(inv), "--config", str(cfg), "--json", check=True).stdout)
    a = d["argv"]
    assert d["variant"] == "mxfp8" and a[a.index("--max-num-seqs") + 1] == "128" and "131072" in a
    # CLI flags beat the file.
    d = json.loads(
        run_cli(
            "plan",
            "--inventory",
            str(inv),
            "--config",
            str(cfg),
            "--variant",
            "nvfp4",
            "--max-num-seqs",
            "64",
            "--json",
            check=True,
        ).stdout
    )
    a = d["argv"]
    assert d["variant"] == "nvfp4" and a[a.index("--max-num-seqs") + 1] == "64" and a.count("--max-num-seqs") == 1
    cfg.write_text("schema_version: 1\nvarint: x\n")
    p = run_cli("plan", "--inventory", str(inv), "--config", str(cfg))
    assert p.returncode == 2 and "unknown key 'varint'; did you mean 'variant'?" in p.stderr


def test_emit_lws_multi_node_dp():
    p = plan(
        ALL["b200x8"](),
        PlanRequest(model="MiniMax-M3.1-Flash", runtime="docker", tp=1, dp=8, ep=True, vllm_executable="vllm"),
    )
    doc = list(yaml.safe_load_all(render(p, "lws", nodes=2)))[-1]
    assert doc["kind"] == "LeaderWorkerSet" and doc["spec"]["leaderWorkerTemplate"]["size"] == 2
    lead = doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    work = doc["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    la, wa = lead["args"][0], work["args"][0]
    for a in (la, wa):
        assert "--data-parallel-size 16 --data-parallel-size-local 8" in a
        assert "--data-parallel-address $(LWS_LEADER_ADDRESS)" in a and a.count("--data-parallel-size ") == 1
    assert "--data-parallel-start-rank" not in la and "--headless" not in la  # a leader start rank = external LB
    assert "--headless" in wa and wa.endswith("--data-parallel-start-rank $(( LWS_WORKER_INDEX * 8 ))")
    assert lead["resources"]["limits"]["nvidia.com/gpu"] == 8 and "ports" in lead and "ports" not in work
    with pytest.raises(Exception, match="at least 2 nodes"):
        render(p, "lws", nodes=1)


def test_cli_plan_on_this_cpu_host_defaults():
    # Default runtime "auto": no image on the cpu profile, so the real verdict shows (no variant runs on CPU).
    p = run_cli("plan")
    assert p.returncode == 3 and p.stderr.startswith("error: rule variant.native:")
    assert "has no variant for cpu: plan it for a GPU host" in p.stderr
    p = run_cli("plan", "--emit", "helm")  # a bad format is refused before any planning
    assert p.returncode == 2 and "'helm' is not one of docker" in p.stderr
