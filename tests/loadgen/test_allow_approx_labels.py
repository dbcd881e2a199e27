"""``--allow-approx`` counts the streamed chunks when the server sends no usage: the run table and the result JSON
say so ("stream chunks"), never "server usage" (the table and ``token_counts_from`` / ``token_counts.output_source``
said "server usage" for counts the client made)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from m3ctl.loadgen.prompts import LocalTokenizer
from m3ctl.loadgen.report import bench_tables
from m3ctl.loadgen.runner import BenchConfig, run_bench
from tests.conftest import start_groundtruth


@pytest.fixture(scope="module")
def no_usage_server():
    proc, url = start_groundtruth("--ttft-ms", "1", "--itl-ms", "1", "--no-usage")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def usage_server():
    proc, url = start_groundtruth("--ttft-ms", "1", "--itl-ms", "1")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def tok(tiny_models):
    return LocalTokenizer(tiny_models["m2"])


def _run(url: str, tok, **kw) -> dict:
    cfg = BenchConfig(
        url=url,
        model="groundtruth",
        input_len=16,
        output_len=20,
        num_prompts=4,
        concurrency=2,
        scrape_server_metrics=False,
        **kw,
    )
    return run_bench(cfg, tok=tok)


def _table(res: dict) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=200, color_system=None)
    tables, _notes = bench_tables(res, [50.0, 90.0, 99.0])
    for t in tables:
        con.print(t)
    return buf.getvalue()


def test_allow_approx_says_stream_chunks_in_the_table_and_the_json(no_usage_server, tok):
    res = _run(no_usage_server, tok, allow_approx=True)
    assert res["completed"] == 4 and res["total_output_tokens"] == 4 * 20
    assert res["token_counts_from"] == "stream chunks"
    assert res["token_counts"]["output_source"] == "stream chunks"
    assert res["output_tokens_source"].startswith("stream chunks for 4 of 4 responses")
    text = _table(res)
    (row,) = [ln for ln in text.splitlines() if "input / output tokens" in ln]
    assert "stream chunks" in row and "server usage" not in row, row


def test_usage_counts_still_say_server_usage(usage_server, tok):
    res = _run(usage_server, tok)
    assert res["token_counts_from"] == "server usage"
    assert res["token_counts"]["output_source"] == "server usage.completion_tokens"
    (row,) = [ln for ln in _table(res).splitlines() if "input / output tokens" in ln]
    assert "(server usage)" in row, row
