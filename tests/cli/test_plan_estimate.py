"""``m3ctl plan --estimate``: the API's estimate through the CLI, its options derived from EstimateRequest."""

from __future__ import annotations

import json

import pytest

import m3ctl.api
from tests.conftest import run_cli


def test_plan_estimate_json_is_the_apis_estimate():
    args = ["--system", "b200x8", "--estimate", "--concurrency", "16", "--input-len", "2048", "--output-len", "256"]
    p = run_cli("plan", *args, "--usd-per-gpu-hour", "4", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    got = json.loads(p.stdout)
    want = m3ctl.api.estimate(
        system="b200x8",
        workload={"concurrency": 16, "input_len": 2048, "output_len": 256, "usd_per_gpu_hour": 4},
    )
    assert got == json.loads(want.model_dump_json())
    assert got["gpu"] == "b200" and got["tokens_per_dollar"]["mid"] > 0 and "(assumed" in got["dominant"]
    assert set(got["basis"].values()) == {"assumed"}  # off Hopper nothing is measured: each input says so


def test_plan_estimate_table_names_its_dominant_assumption():
    p = run_cli("plan", "--system", "h200x8", "--estimate")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "decode tok/s per user" in p.stdout and "dominant assumption:" in p.stdout
    assert "tokens per USD" not in p.stdout  # no price given
    assert "what it rests on:" in p.stdout and "assumed: " not in p.stdout  # each input says its own basis


def test_plan_estimate_text_says_the_host_floor_is_measured_where_it_was():
    """One user on an H100: the floor was measured on an H100 host at c = 1-4; the text says so, never "not
    measured" (the whole table once carried one flag, false)."""
    p = run_cli("plan", "--system", "h100x8", "--estimate", "--concurrency", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    text = " ".join(p.stdout.split())  # the console wraps long lines
    assert (
        "host step floor (ms) 1.31-2.04: measured on 4 h100 and h200 hosts at c = 1-4, runs h100c, h100d, h100e, h200c"
        in text
    )
    assert "not measured" not in text


def test_estimate_options_without_estimate_and_bad_combinations_are_one_line():
    p = run_cli("plan", "--system", "h200x8", "--concurrency", "8")
    assert p.returncode == 2 and "--concurrency applies to --estimate" in p.stderr and "Traceback" not in p.stderr
    p = run_cli("plan", "--system", "h200x8", "--estimate", "--list")
    assert p.returncode == 2 and "--estimate" in p.stderr and "Traceback" not in p.stderr
    p = run_cli("plan", "--system", "h200x8", "--estimate", "--concurrency", "0")
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_plan_systems_estimate_adds_each_serving_systems_estimate():
    p = run_cli("plan", "--systems", "b200x8,gb300x4", "--estimate", "--concurrency", "32", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r["system"]: r for r in json.loads(p.stdout)["systems"]}
    for name, row in rows.items():
        assert row["serves"] and row["estimate"]["concurrency"] == 32
        want = m3ctl.api.estimate(system=name, runtime="docker", workload={"concurrency": 32})
        assert row["estimate"]["tok_s_gpu"] == json.loads(want.model_dump_json())["tok_s_gpu"], name
    plain = run_cli("plan", "--systems", "b200x8", "--json")
    assert json.loads(plain.stdout)["systems"][0]["estimate"] is None
    table = run_cli("plan", "--systems", "b200x8", "--estimate")
    assert "tok/s/GPU" in table.stdout and "dominant assumption" in table.stdout


def test_plan_estimate_table_never_rounds_a_rate_to_zero():
    """512 users of 500K-token prompts on an H100: a user decodes well under 1 tok/s; the table once read 0 (as
    did --systems' column), while the JSON carried the rate."""
    args = ["--estimate", "--concurrency", "512", "--input-len", "500000", "--output-len", "24000"]
    p = run_cli("plan", "--system", "h100x8", *args)
    assert p.returncode == 0, p.stdout + p.stderr
    row = next(line for line in p.stdout.splitlines() if "decode tok/s per user" in line)
    cells = [c.strip() for c in row.split("│") if c.strip()][1:]
    want = m3ctl.api.estimate(system="h100x8", workload={"concurrency": 512, "input_len": 500000, "output_len": 24000})
    assert want.tok_s_user is not None and 0 < want.tok_s_user.high < 1
    assert [float(c) for c in cells] == pytest.approx(
        [want.tok_s_user.low, want.tok_s_user.mid, want.tok_s_user.high], rel=0.05
    )
    p = run_cli("plan", "--systems", "h100x8", *args)
    assert p.returncode == 0, p.stdout + p.stderr
    row = next(line for line in p.stdout.splitlines() if line.startswith("│ h100x8"))
    assert f"{want.tok_s_user.low:#.2g}-{want.tok_s_user.high:#.2g}" in row


def test_plan_systems_estimate_says_why_a_serving_system_has_none():
    """A catalog model without the facts the cost model needs (local-minimax-m3: no config.json at hand) serves on
    a B200 but has no estimate: the row says why, in the JSON and under the table (it once vanished silently)."""
    args = ["plan", "-m", "local-minimax-m3", "--systems", "b200x8", "--estimate"]
    row = json.loads(run_cli(*args, "--json").stdout)["systems"][0]
    assert row["serves"] and row["estimate"] is None
    assert row["no_estimate"].startswith("no estimate for local-minimax-m3: unknown num_layers")
    p = run_cli(*args)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "b200x8: no estimate for local-minimax-m3" in " ".join(p.stdout.split())


def test_plan_systems_estimate_warns_as_plan_estimate_does():
    """64 users of 500K-token prompts: an H100 x8 replica's KV cache holds one such sequence, so vLLM preempts and
    the estimate (priced as if they fit) is optimistic. plan --estimate warns; --systems printed the same figures
    without a word. Each row's findings now follow its dominant assumption."""
    args = ["--estimate", "--concurrency", "64", "--input-len", "500000"]
    want = m3ctl.api.estimate(system="h100x8", workload={"concurrency": 64, "input_len": 500000}).findings
    assert any("exceed its KV cache" in f for f in want)
    p = run_cli("plan", "--systems", "h100x8", *args)
    assert p.returncode == 0, p.stdout + p.stderr
    text = " ".join(p.stdout.split())
    for f in want:
        assert f"warning: {' '.join(f.split())}" in text


def test_plan_estimate_counts_users_as_it_counts_tokens():
    """Thousands separated, as the token counts beside them: '1,000,000 users', not '1000000 users'."""
    args = ["--estimate", "--concurrency", "1000000"]
    for view in (["--system", "b200x8"], ["--systems", "b200x8"]):
        p = run_cli("plan", *view, *args)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "1,000,000 users" in " ".join(p.stdout.split()) and "1000000" not in p.stdout
