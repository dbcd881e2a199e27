"""Live progress: the rolling statistics (pure) and the rich display driven by a real run.

The display test runs the bench client against the ground-truth server (m3ctl/loadgen/groundtruth.py,
a test instrument with injected TTFT/ITL) and reads the frames rich wrote to a recording console.
"""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from m3ctl.loadgen.progress import LiveProgress, RollingStats, render_line
from m3ctl.loadgen.prompts import LocalTokenizer
from m3ctl.loadgen.runner import BenchConfig, run_bench
from tests.conftest import run_cli, start_groundtruth


def _done(t, ok=True, kind="", ttft=0.1, toks=10):
    return ("d", t, ok, kind, ttft, toks)


def test_rolling_stats_counts_window_and_median():
    rs = RollingStats(window_s=5.0, total=10)
    for t in (100.0, 100.0, 100.5):
        rs.add(("s", t))
    s = rs.snapshot(100.6)
    assert (s.completed, s.failed, s.in_flight, s.rolling_ttft_ms, s.total) == (0, 0, 3, None, 10)
    assert s.elapsed_s == pytest.approx(0.6)
    rs.add(_done(101.0, ttft=0.200, toks=30))
    rs.add(_done(102.0, ttft=0.100, toks=30))
    rs.add(_done(102.5, ok=False, kind="stream_cut", ttft=0.0, toks=0))
    s = rs.snapshot(103.0)
    assert (s.completed, s.failed, s.in_flight) == (2, 1, 0)
    assert s.failed_by_kind == {"stream_cut": 1}
    assert s.rolling_ttft_ms == pytest.approx(150.0)  # median of 200 and 100 (even count: mean of the middle two)
    # run younger than the window: 60 tokens over the 3 s since the first send
    assert s.rolling_output_tok_s == pytest.approx(20.0)
    for i in range(3):
        rs.add(("s", 103.0))
        rs.add(_done(104.0 + i, ttft=0.050 * (i + 1), toks=5))
    s = rs.snapshot(106.5)  # window [101.5, 106.5]: finishes at 102, 104, 105, 106 (101.0 dropped)
    assert s.completed == 5
    assert s.rolling_ttft_ms == pytest.approx(100.0)  # median of 100, 50, 100, 150
    assert s.rolling_output_tok_s == pytest.approx((30 + 15) / 5.0)
    s = rs.snapshot(120.0)  # nothing finished in the last 5 s
    assert s.rolling_ttft_ms is None and s.rolling_output_tok_s == 0.0 and s.completed == 5


def test_rolling_stats_out_of_order_events_and_failure_kinds():
    rs = RollingStats(window_s=2.0)
    rs.add(("s", 10.0))
    rs.add(_done(11.5, ttft=0.3))
    rs.add(_done(11.0, ttft=0.1))  # from another process, earlier
    rs.add(_done(11.2, ok=False, kind="connection_refused"))
    rs.add(_done(11.3, ok=False, kind="connection_refused"))
    rs.add(_done(11.4, ok=False, kind=""))
    s = rs.snapshot(12.9)  # window [10.9, 12.9] still holds both
    assert s.rolling_ttft_ms == pytest.approx(200.0)
    assert s.failed_by_kind == {"connection_refused": 2, "other": 1}
    assert rs.snapshot(13.2).rolling_ttft_ms == pytest.approx(300.0)  # 11.0 left the window, 11.5 did not
    line = render_line(s)
    assert "failed 3 (connection_refused 2, other 1)" in line and "TTFT p50 200 ms (last 2s)" in line


def _snap(**kw):
    from m3ctl.loadgen.progress import Snapshot

    base = dict(
        completed=12345,
        total=100000,
        in_flight=128,
        elapsed_s=1234.5,
        rolling_ttft_ms=12345.6,
        rolling_output_tok_s=123456.7,
    )
    return Snapshot(**(base | kw))


@pytest.mark.parametrize("failed", [{}, {"connection_refused": 20, "stream_cut": 7, "timeout": 3}])
def test_progress_line_fits_80_columns_with_the_throughput_whole(failed):
    """At 80 columns the line keeps done, throughput and TTFT whole and drops the lesser figures whole."""
    s = _snap(failed=sum(failed.values()), failed_by_kind=failed)
    line = render_line(s, 80, "bench c=128")
    assert len(line) <= 80, line
    assert line.startswith("bench c=128  12345/100000 done  out 123457 tok/s  TTFT p50 12346 ms"), line
    if failed:
        assert "failed 30" in line  # failures outrank in flight and elapsed
    for part in line.split("  "):  # every figure shown is whole: it is one of the full-width line's parts
        assert part in render_line(s, None, "bench c=128") or part == "failed 30", part
    wide = render_line(s, 300, "bench c=128")
    assert "in flight 128" in wide and "1234.5 s" in wide and "(last 5s)" in wide


def test_progress_live_frames_at_80_columns_show_the_throughput():
    """A terminal 80 columns wide: each frame is one line of at most 80 columns ending in whole figures."""
    import time

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=80, color_system=None)
    with LiveProgress(con, total=100000, refresh_per_second=50, label="bench c=128", plain=False) as prog:
        t = time.perf_counter()
        for _ in range(200):
            prog.put(("s", t))
        for _ in range(64):
            prog.put(_done(t + 0.01, ttft=12.3456, toks=4000))
        time.sleep(0.2)
    frames = [f for f in re.split(r"\r|\n|\x1b\[[0-9;?]*[A-Za-z]", buf.getvalue()) if "done" in f]
    assert frames, buf.getvalue()
    for f in frames:
        assert len(f) <= 80 and "…" not in f and re.search(r"done  out [\d.]+ tok/s  TTFT p50 ", f), f
    assert re.match(r"bench c=128  64/100000 done  out \d+ tok/s  TTFT p50 12346 ms", frames[-1]), frames[-1]


def test_progress_into_a_log_file_prints_plain_lines():
    """No terminal (a log file, CI), even when the console is forced to emit terminal codes: a plain line now and
    then and one at the end, without cursor movement, carriage returns or colours."""
    import time

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=80)
    with LiveProgress(con, total=10, label="bench c=2", plain_every_s=0.15) as prog:
        for _ in range(5):
            prog.put(("s", time.perf_counter()))
            time.sleep(0.1)
            prog.put(_done(time.perf_counter(), ttft=0.05, toks=10))
    out = buf.getvalue()
    lines = out.splitlines()
    assert "\x1b" not in out and "\r" not in out, repr(out)
    assert 2 <= len(lines) <= 6, lines  # about one per 0.15 s over 0.5 s, plus the final one
    assert lines[-1].startswith("bench c=2  5/10 done  out ") and all(len(x) <= 80 for x in lines), lines


@pytest.fixture(scope="module")
def gt_url():
    p, url = start_groundtruth("--ttft-ms", "120", "--itl-ms", "10")
    yield url
    p.terminate()
    p.wait(timeout=10)


_FRAME = re.compile(
    r"(\d+)/(\d+) done\s+out ([\d.]+) tok/s\s+TTFT p50 ([\d.]+|-)(?: ms)? \(last 5s\)"
    r"\s+failed (\d+)\s+in flight (\d+)"
)


@pytest.mark.parametrize("procs", [1, 2])
def test_live_display_frames_from_a_real_run(gt_url, tiny_models, procs):
    """Frames show completed counts rising to the total and a rolling TTFT near the injected 120 ms."""
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=250, color_system=None)
    cfg = BenchConfig(
        url=gt_url,
        model="groundtruth",
        num_prompts=48,
        concurrency=4,
        input_len=8,
        output_len=20,
        scrape_server_metrics=False,
        client_procs=procs,
    )
    # 12 waves of (120 + 19 x 10) ms = 3.7 s; 20 frames a second
    with LiveProgress(con, total=48, refresh_per_second=20, plain=False) as prog:
        res = run_bench(cfg, tok=LocalTokenizer(tiny_models["m2"]), progress=prog)
    frames = _FRAME.findall(buf.getvalue())
    assert res["completed"] == 48 and len(frames) >= 10, buf.getvalue()[-500:]
    done = [int(f[0]) for f in frames]
    assert all(int(f[1]) == 48 for f in frames)
    assert done == sorted(done) and done[-1] == 48 and len(set(done)) >= 6  # rises in steps of the waves
    assert all(0 <= int(f[5]) <= 4 for f in frames) and int(frames[-1][5]) == 0
    ttfts = [float(f[3]) for f in frames if f[3] != "-"]
    assert ttfts and all(119.0 <= t <= 145.0 for t in ttfts), ttfts  # injected 120 ms (+ scheduling on this host)
    # steady state: 4 streams x 20 tokens every 0.31 s = 258 tok/s (counted at request ends: bucketed, so +-25 %)
    late = [float(f[2]) for f, d in zip(frames, done, strict=True) if 16 <= d < 48]
    assert late and 190 <= sorted(late)[len(late) // 2] <= 330, late


def test_cli_progress_on_stderr_json_on_stdout(gt_url, tiny_models):
    p = run_cli(
        "bench",
        "--url",
        gt_url,
        "--model",
        "groundtruth",
        "--num-prompts",
        "12",
        "--concurrency",
        "4",
        "--input-len",
        "8",
        "--output-len",
        "10",
        "--tokenizer",
        str(tiny_models["m2"]),
        "--progress",
        "--output-json",
        "-",
    )
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)  # stdout is the JSON and nothing else
    assert res["completed"] == 12
    # forced into a pipe (a log file): plain lines, no terminal codes
    assert "12/12 done" in p.stderr and "\x1b[" not in p.stderr and "\r" not in p.stderr, p.stderr
    q = run_cli(
        "bench",
        "--url",
        gt_url,
        "--model",
        "groundtruth",
        "--num-prompts",
        "4",
        "--concurrency",
        "2",
        "--input-len",
        "8",
        "--output-len",
        "5",
        "--tokenizer",
        str(tiny_models["m2"]),
        "--json",
    )
    assert q.returncode == 0 and json.loads(q.stdout)["completed"] == 4
    assert "done" not in q.stderr  # auto: stderr is a pipe here, so no progress
