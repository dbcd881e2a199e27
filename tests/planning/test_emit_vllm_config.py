"""``plan --emit vllm-config`` / ``vllm-env``: the plan as vLLM's own ``--config`` file and its environment file.
The config file is read by the installed vLLM's own parser (FlexibleArgumentParser.load_config_file) and must give
the namespace the plan's command line gives."""

from __future__ import annotations

import pytest
import yaml

from m3ctl.assess.request import PlanRequest
from m3ctl.hw.systems import inventory_for_system
from m3ctl.planning.emit import render
from m3ctl.planning.launch import launch_spec
from m3ctl.planning.plan import plan

from ..conftest import run_cli

CASES = {
    "h200x8 defaults": ("h200x8", {}),
    "b200x8 speculative, fp8 KV, switches off": (
        "b200x8",
        {"spec_depth": 3, "kv_cache_dtype": "fp8", "args": {"enable-prefix-caching": False, "max-num-seqs": 64}},
    ),
    "mi355xx8 dp": ("mi355xx8", {"dp": 2, "tp": 4}),
}


def _plan(system: str, knobs: dict):
    return plan(inventory_for_system(system), PlanRequest(model="MiniMax-M3.1-Flash", skip_checks=True, **knobs))


@pytest.mark.parametrize("case", list(CASES))
def test_vllms_parser_reads_the_config_as_the_command_line(case, tmp_path, vllm_parser):
    p = _plan(*CASES[case])
    cfg = tmp_path / "config.yaml"
    cfg.write_text(render(p, "vllm-config"))
    from_file = vars(vllm_parser.parse_args(["--config", str(cfg)]))
    serve_args = launch_spec(p).serve_args()[1:]  # [model, *flags]
    from_argv = vars(vllm_parser.parse_args(["--model", serve_args[0], *serve_args[1:]]))
    differ = {k: (from_file.get(k), from_argv.get(k)) for k in set(from_file) | set(from_argv) if k != "config"}
    assert {k: v for k, v in differ.items() if v[0] != v[1]} == {}
    assert from_file["model"] == p.model or from_file["model"].endswith(p.model.split("/")[-1])


def test_the_env_file_names_secrets_and_never_writes_them():
    p = plan(
        inventory_for_system("h200x8"),
        PlanRequest(
            model="MiniMax-M3.1-Flash", skip_checks=True, env={"NCCL_DEBUG": "WARN"}, args={"api-key": "sk-never-123"}
        ),
    )
    text, cfg = render(p, "vllm-env"), render(p, "vllm-config")
    assert "NCCL_DEBUG=WARN" in text.splitlines()
    assert any(ln.startswith("# VLLM_API_KEY: a secret") for ln in text.splitlines()), text
    assert "sk-never" not in text + cfg and "api-key" not in yaml.safe_load(cfg)
    doc = yaml.safe_load(cfg)
    assert doc["port"] == p.port and doc["host"] == launch_spec(p).host


def test_the_cli_emits_both_forms():
    p = run_cli("plan", "--system", "h200x8", "--emit", "vllm-config")
    assert p.returncode == 0, p.stderr
    assert yaml.safe_load(p.stdout)["tensor-parallel-size"] >= 1
    e = run_cli("plan", "--system", "h200x8", "--emit", "vllm-env")
    assert e.returncode == 0 and e.stdout.startswith("# m3ctl plan")
