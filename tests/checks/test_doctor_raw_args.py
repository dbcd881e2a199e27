"""``m3ctl doctor -- <vllm args>``: the raw vLLM arguments plan and serve take, read by the same reader and layered
the same way, so that doctor's verdict is plan's outcome for them (a scale model served with ``--load-format dummy``
has no weights on disk: plan and serve took it, doctor said "not runnable (weights missing)")."""

from __future__ import annotations

import json

import pytest

from m3ctl import api
from m3ctl.dev.scale_model import ScaleModelSpec, build_scale_model
from m3ctl.errors import BadInput
from tests.conftest import run_cli

OFFLINE = {"HF_HUB_OFFLINE": "1"}  # the GPU hosts' setting: every file vLLM reads must be on disk


@pytest.fixture(scope="module")
def scale_model(tmp_path_factory):
    """``m3ctl dev scale-model DIR --arch minimax-m3 --layers 2 --quant bf16``: a config, no weights."""
    return str(build_scale_model(tmp_path_factory.mktemp("sm") / "m3", ScaleModelSpec("minimax-m3", 2, "bf16")))


def test_doctor_takes_the_raw_args_plan_takes_and_agrees_with_it(scale_model):
    tail = ["--", "--load-format", "dummy"]
    p = run_cli("plan", "--model", scale_model, "--system", "h200x1", "--json", *tail, env=OFFLINE)
    assert p.returncode == 0, p.stderr
    d = run_cli("doctor", "--model", scale_model, "--system", "h200x1", "--json", *tail, env=OFFLINE)
    rep = json.loads(d.stdout)
    assert d.returncode == 0 and rep["runnable"], d.stdout
    rows = {c["id"]: c for c in rep["checks"]}
    assert rows["model.offline"]["status"] == "OK", rows["model.offline"]
    assert rep["verdict"]["plan_request"]["args"] == {"load-format": "dummy"}
    # without the tail, both refuse it for the same missing weights
    bare = run_cli("doctor", "--model", scale_model, "--system", "h200x1", "--json", env=OFFLINE)
    assert bare.returncode == 1 and "weights" in json.loads(bare.stdout)["verdict"]["summary"]
    p = run_cli("plan", "--model", scale_model, "--system", "h200x1", env=OFFLINE)
    assert p.returncode != 0 and "weights" in p.stderr


def test_the_api_doctor_takes_them_too(scale_model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rep = api.doctor(model=scale_model, system="h200x1", extra_args=["--load-format", "dummy"])
    assert rep.verdict.status != "not_runnable", rep.verdict.summary
    assert api.doctor(model=scale_model, system="h200x1").verdict.status == "not_runnable"


@pytest.mark.parametrize(
    "args,words",
    [
        (["--context", "4096", "--", "--max-model-len", "8192"], "--context and raw --max-model-len both set it"),
        (["--kv-cache-dtype", "fp8", "--", "--kv-cache-dtype", "auto"], "raw --kv-cache-dtype both set it"),
        (["--", "--port", "9000"], "--port"),  # a flag m3ctl sets itself, refused as plan refuses it
    ],
)
def test_bad_raw_args_are_one_line_exit_2(args, words):
    p = run_cli("doctor", "--system", "b200x8", *args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.startswith("error: ") and words in p.stderr and "Traceback" not in p.stderr
    with pytest.raises(BadInput):
        api.doctor(system="b200x8", extra_args=args[args.index("--") + 1 :], **_opts(args[: args.index("--")]))


def _opts(given: list[str]) -> dict:
    """``--context 4096`` -> ``{"context": "4096"}``."""
    return {given[i].lstrip("-").replace("-", "_"): given[i + 1] for i in range(0, len(given), 2)}
