"""Fault suite (issue 44 item 8), bench: signals and kill -9 mid-measurement and mid-trial, a server
stopped or killed under them. Each runs the real CLI against the ground-truth SSE server or the fake vLLM and
asserts the exit status, the message, the files and the processes left."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest

from tests.conftest import run_cli, start_groundtruth
from tests.faults.kit import (
    Cmd,
    fake_env,
    generations,
    nothing_left,
    one_error,
    serve_detached,
    status,
    temp_files,
    until,
)

SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


@pytest.fixture
def model(tiny_models):
    return tiny_models["m2"]


@pytest.fixture
def slow_gt():
    """A ground-truth server that streams 16 tokens in about 0.3 s: a long bench is still measuring for minutes."""
    proc, url = start_groundtruth("--itl-ms", "20", "--metrics")
    yield url
    proc.terminate()
    proc.wait(10)


def _successes(url: str) -> float:
    m = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(float(x.rsplit(" ", 1)[1]) for x in m.splitlines() if x.startswith("vllm:request_success_total"))


def _bench_gt(url: str, model: Path, out: Path) -> Cmd:
    return Cmd(
        "bench",
        "--url",
        url,
        "--model",
        "groundtruth",
        "--tokenizer",
        str(model),
        "--num-prompts",
        "2000",
        "--concurrency",
        "2",
        "--input-len",
        "8",
        "--output-len",
        "16",
        "--output-json",
        str(out),
    )


def _mid_bench(url: str, bench: Cmd) -> None:
    base = _successes(url)
    until(lambda: _successes(url) >= base + 4, 60, "the bench's requests complete", bench)


# ------------------------------------------------------------------------------------------- bench
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_mid_bench_saves_the_partial_result(tmp_path, model, slow_gt, sig):
    out = tmp_path / "b.json"
    bench = _bench_gt(slow_gt, model, out)
    try:
        _mid_bench(slow_gt, bench)
        bench.p.send_signal(sig)
        rc, text = bench.finish(120)
    finally:
        bench.kill()
    assert rc == 128 + sig, text
    assert "Traceback" not in text and "request throughput" in text, text  # the partial result is printed
    res = json.loads(out.read_text())
    assert 0 < res["completed"] < 2000, res["completed"]
    assert temp_files(tmp_path) == []


def test_kill_9_mid_bench_leaves_no_file_half_written_and_the_server_serving(tmp_path, model, slow_gt):
    out = tmp_path / "b.json"
    bench = _bench_gt(slow_gt, model, out)
    try:
        _mid_bench(slow_gt, bench)
        bench.p.kill()
        rc, _ = bench.finish()
    finally:
        bench.kill()
    assert rc == -9
    assert not out.exists() and temp_files(tmp_path) == []
    assert httpx.get(f"{slow_gt}/v1/models", timeout=5).status_code == 200


def _bench_dep(name: str, out: Path, n: int = 2000) -> Cmd:
    return Cmd(
        "bench",
        "--deployment",
        name,
        "--num-prompts",
        str(n),
        "--concurrency",
        "2",
        "--input-len",
        "8",
        "--output-len",
        "8",
        "--output-json",
        str(out),
    )


def test_kill_9_of_the_engine_mid_bench_names_the_death_and_keeps_the_partial_result(tmp_path, model):
    """The fake engine crashes (SIGABRT) after 30 generations: exit 4 naming the death, the partial result saved
    and marked invalid, the record kept as dead until `stop`."""
    _dep, port = serve_detached(fake_env(tmp_path, crash_after=30), model, "die", "--smoke", "off")
    out = tmp_path / "b.json"
    rc, text = _bench_dep("die", out).finish(120)
    assert rc == 4, text
    assert "the engine of deployment 'die' died at" in text and "Traceback" not in text, text
    res = json.loads(out.read_text())
    assert res["engine_died"]["state"] == "dead" and res["validity"]["valid"] is False and res["completed"] > 0
    (rec,) = status()
    assert rec["phase"] == "dead" and rec["cause"], rec
    assert run_cli("stop", "die").returncode == 0 and status() == []
    nothing_left(port)


@pytest.mark.parametrize("how", ["name", "--all"])
def test_stop_during_a_bench_ends_it_naming_the_stop(tmp_path, model, how):
    """`m3ctl stop` of the benched deployment mid-measurement: the bench ends with exit 4 (the server went down
    during a bench; not 2, bad input) and says who stopped it (not a crash, not a bad --url, not "no deployment
    named"); what was measured is saved, marked ``server_stopped``; nothing is left running."""
    _dep, port = serve_detached(fake_env(tmp_path, token_delay=0.05), model, "sb", "--smoke", "off")
    out = tmp_path / "b.json"
    bench = _bench_dep("sb", out)
    try:
        base = generations(port)
        until(lambda: generations(port) >= base + 6, 60, "the bench's requests arrive", bench)
        s = run_cli("stop", "sb" if how == "name" else "--all")
        assert s.returncode == 0 and "sb: stopped" in s.stdout, s.stdout + s.stderr
        rc, text = bench.finish(120)
    finally:
        bench.kill()
    assert rc == 4, text
    err = one_error(text)
    assert "was stopped during the run by `m3ctl stop`" in err and "no deployment named" not in text, text
    assert "check --url" not in text and f"partial results written to {out}" in text, text
    res = json.loads(out.read_text())
    assert res["server_stopped"]["name"] == "sb" and "m3ctl stop" in res["server_stopped"]["by"], res
    assert res["validity"]["valid"] is False and res["completed"] > 0 and "engine_died" not in res
    nothing_left(port)
    assert status() == []
