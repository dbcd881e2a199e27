"""What a tune names and counts is the server that runs: a candidate's text names the layout the planner made (TP 1
raised to PP 8 so MiniMax-M3.1-Flash fits 8 x B200), and knob values that plan the very same server (its KV cache
dtype NVFP4 from the checkpoint, asked as "default" or as "nvfp4") are one configuration, collapsed before the
search with a note."""

from __future__ import annotations

import re

from m3ctl import api
from m3ctl.tuning.space import describe


def _server(command: str) -> str:
    """A trial's command without what is the trial's own: its served-model tag (``{prefix}-tN``)."""
    return re.sub(r"tune-[0-9a-f]{8}-t\w+", "", command)


def test_a_tp1_trial_planned_with_pp8_is_named_by_the_layout_that_runs(tmp_path):
    r = api.tune(
        "MiniMax-M3.1-Flash",
        system="b200x8",
        dry_run=True,
        study_dir=tmp_path / "s",
        knobs=["tp=1,8", "spec_depth=0", "max_num_batched_tokens=8192", "ep=off", "dbo=off"],
    )
    ok = {
        c["config"]["tp"]: c for c in r["candidates"] if c["status"] == "ok" and c["config"]["kv_cache_dtype"] != "fp8"
    }
    assert "--pipeline-parallel-size 8" in ok[1]["command"]
    assert ok[1]["describe"].startswith("tp=1 pp=8 gpus=8"), ok[1]["describe"]  # before: "tp=1 kv=default"
    assert "--pipeline-parallel-size" not in ok[8]["command"] and ok[8]["describe"].startswith("tp=8 kv=")
    # PP 8 and TP 8 are different servers (layers in 8 stages vs each layer's weights in 8 shards): both kept
    assert _server(ok[1]["command"]) != _server(ok[8]["command"])
    assert r["baseline"]["config"]["tp"] == 1 and r["baseline"]["describe"].startswith("tp=1 pp=8 gpus=8")


def test_describe_names_the_planned_layout_only_where_it_differs():
    cand = {"tp": 1, "kv_cache_dtype": "default"}
    assert describe(cand, layout={"tp": 1, "pp": 1, "dp": 1}) == "tp=1 kv=default"
    assert describe(cand, layout={"tp": 1, "pp": 8, "dp": 1}) == "tp=1 pp=8 gpus=8 kv=default"
    assert describe({"kv_cache_dtype": "fp8"}, layout={"tp": 2, "pp": 4, "dp": 1}) == "tp=2 pp=4 gpus=8 kv=fp8"


def test_kv_values_that_plan_one_server_are_one_configuration(tmp_path):
    """The checkpoint's KV cache is NVFP4: ``kv=default`` and ``kv=nvfp4`` plan byte-identical commands but for the
    served-model tag. Before: both were candidates (two starts of the budget on one server)."""
    r = api.tune(
        "MiniMax-M3.1-Flash",
        system="b200x8",
        dry_run=True,
        study_dir=tmp_path / "s",
        knobs=["tp=8", "spec_depth=0", "ep=off", "dbo=off"],
    )
    assert r["space"]["values"]["kv_cache_dtype"] == ["default", "fp8"]
    note = next(n for n in r["pruned"] if n.startswith("kv_cache_dtype nvfp4 dropped"))
    assert "kv_cache_dtype default" in note and "--kv-cache-dtype nvfp4" in note
    servers = [_server(c["command"]) for c in r["candidates"] if c["status"] == "ok"]
    assert len(servers) == len(set(servers)) == r["servers"] == r["feasible"] > 1
