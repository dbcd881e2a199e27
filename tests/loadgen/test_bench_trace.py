"""Trace replay (``m3ctl bench --trace``, m3ctl/loadgen/trace.py) against the ground-truth server.

The server (m3ctl/loadgen/groundtruth.py) stamps every request's arrival on the client's clock, counts the prompt
with the tiny model's tokenizer (``usage.prompt_tokens``) and runs a block prefix cache (``cached_tokens``), so
the assertions are on what was really sent and when: recorded timestamps, never the test's duration.
"""

from __future__ import annotations

import itertools
import json

import httpx
import pytest

from m3ctl.errors import BadInput
from m3ctl.loadgen import trace as traces
from m3ctl.loadgen.prompts import LocalTokenizer
from m3ctl.loadgen.runner import BenchConfig, run_bench, validate
from tests.conftest import groundtruth_pool, run_cli

BLOCK = 16  # the server's prefix-cache block (tokens)
#: Send lag (s) one request may show on this shared 2-core host: the trace's own threshold is 50 ms.
TOL_S = 0.025

# 12 records over 1.5 s, gaps 20..340 ms, two prefix groups (one given its prefix_len, one by the half rule),
# absolute timestamps (the first is t=0).
T0 = 1_700_000_000.0
RECORDS = [
    {"timestamp": T0 + 0.00, "input_len": 40, "output_len": 6},
    {"timestamp": T0 + 0.02, "input_len": 96, "output_len": 4, "prefix_id": "sys-a", "prefix_len": 64},
    {"timestamp": T0 + 0.25, "input_len": 80, "output_len": 9, "prefix_id": "sys-a", "prefix_len": 64},
    {"timestamp": T0 + 0.30, "input_len": 70, "output_len": 5, "prefix_id": 7},
    {"timestamp": T0 + 0.52, "input_len": 33, "output_len": 12},
    {"timestamp": T0 + 0.60, "input_len": 120, "output_len": 3, "prefix_id": "sys-a"},
    {"timestamp": T0 + 0.94, "input_len": 90, "output_len": 7, "prefix_id": 7},
    {"timestamp": T0 + 1.00, "input_len": 64, "output_len": 8},
    {"timestamp": T0 + 1.07, "input_len": 110, "output_len": 4, "prefix_id": 7, "hash_ids": [1, 2]},
    {"timestamp": T0 + 1.30, "input_len": 75, "output_len": 10, "prefix_id": "sys-a"},
    {"timestamp": T0 + 1.41, "input_len": 50, "output_len": 6},
    {"timestamp": T0 + 1.50, "input_len": 88, "output_len": 5, "prefix_id": 7},
]


def _write(path, recs, extra: str = "") -> str:
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n" + extra)
    return str(path)


@pytest.fixture(scope="module")
def gt(tiny_models):
    with groundtruth_pool(
        "--tokenizer", str(tiny_models["m2"]), "--prefix-cache-block", str(BLOCK), "--no-metrics"
    ) as start:
        yield start


@pytest.fixture(scope="module")
def tok(tiny_models):
    return LocalTokenizer(tiny_models["m2"])


def _cfg(url: str, trace: str, **kw) -> BenchConfig:
    return BenchConfig(
        **{
            "url": url,
            "model": "groundtruth",
            "trace_path": trace,
            "scrape_server_metrics": False,
            "per_request": True,
            **kw,
        }
    )


def test_trace_replays_arrivals_lengths_and_prefixes(gt, tok, tmp_path):
    url = gt("--ttft-ms", "20", "--itl-ms", "5")
    path = _write(tmp_path / "t.jsonl", RECORDS)
    httpx.post(f"{url}/gt/reset")
    res = run_bench(_cfg(url, path), tok=tok)
    offsets = [r["timestamp"] - T0 for r in RECORDS]
    reqs = res["requests"]  # in scheduled order = trace order (distinct timestamps)
    assert res["completed"] == len(RECORDS) and res["failed"] == 0 and res["num_prompts"] == len(RECORDS)
    assert res["load"]["mode"] == "trace" and res["max_concurrency"] is None
    # the rate the replay offered: 11 gaps over 1.5 s (vLLM's key; it said "inf", a --request-rate never given)
    assert res["request_rate"] == pytest.approx(11 / 1.5) and res["load"]["rate"] == pytest.approx(11 / 1.5)
    assert res["load"]["arrival"] == "trace" and res["load"]["burstiness"] is None and res["burstiness"] is None
    # Each request was due at its trace offset and sent then (client clock) ...
    s0 = reqs[0]["scheduled_time"]
    for q, off in zip(reqs, offsets, strict=True):
        assert q["scheduled_time"] - s0 == pytest.approx(off, abs=1e-6)
        assert 0 <= q["start_time"] - q["scheduled_time"] <= TOL_S
    # ... and arrived then (the server's stamps: the open loop did not wait for earlier answers; the longest
    # request takes ~80 ms, longer than several of the gaps, so up to 3 were in flight at once).
    arrivals = [r["arrival"] for r in httpx.get(f"{url}/gt/records").json()]
    assert len(arrivals) == len(RECORDS)
    for a, off in zip(sorted(arrivals), offsets, strict=True):
        assert a - min(arrivals) == pytest.approx(off, abs=TOL_S)
    # Exact lengths: the server's own count of each prompt, and max_tokens with ignore_eos.
    assert [q["prompt_len"] for q in reqs] == [r["input_len"] for r in RECORDS]
    assert [q["output_tokens"] for q in reqs] == [r["output_len"] for r in RECORDS]
    assert res["input_token_count_mismatches"] == 0 and res["output_token_count_mismatches"] == 0
    # Prefix sharing, as the server's prefix cache saw it: a group's later requests hit its prefix (64 tokens
    # given for sys-a; 70 // 2 = 35 for group 7, whole blocks: 32), its first and the ungrouped ones nothing.
    seen: set = set()
    for q, r in zip(reqs, RECORDS, strict=True):
        pid = r.get("prefix_id")
        want = {"sys-a": 64, 7: 32}[pid] if pid is not None and pid in seen else 0
        seen.add(pid)
        assert q["cached_tokens"] >= want and (want or q["cached_tokens"] == 0), (r, q["cached_tokens"])
    # The result records the trace and how closely the sends followed it.
    tr = res["trace"]
    assert (tr["path"], tr["records"], tr["time_scale"], tr["prefix_groups"]) == (path, 12, 1.0, 2)
    assert tr["duration_s"] == pytest.approx(1.5) and tr["prefix_lens"] == {"sys-a": 64, "7": 35}
    lags = sorted(1000 * (q["start_time"] - q["scheduled_time"]) for q in reqs)
    fid = tr["timing_fidelity"]
    assert fid["send_lag_ms"]["max"] == pytest.approx(lags[-1], abs=1e-6) and fid["sent"] == 12
    assert fid["threshold_ms"] == 50.0 and fid["mean_interarrival_ms"] == pytest.approx(1500 / 11)
    assert fid["lagged"] is False and not any("trace replay lagged" in w for w in res["validity"]["warnings"])
    assert res["workload"]["prefix_cache_expected_hit"] == pytest.approx(
        (3 * 64 + 3 * 35) / sum(r["input_len"] for r in RECORDS)
    )
    assert res["validity"]["prefix_cache"]["observed"] <= res["validity"]["prefix_cache"]["allowed"]


def test_trace_time_scale_and_capped_replay_lag_warning(gt, tok, tmp_path):
    """x0.5 halves every offset; with --concurrency 1 the requests of a dense trace wait for the slot, so the
    sends lag the trace (the lag includes the wait) and the run says so, naming the cap."""
    url = gt("--ttft-ms", "20", "--itl-ms", "5")
    recs = [{"timestamp": 0.02 * i, "input_len": 20, "output_len": 16} for i in range(8)]  # ~100 ms each
    path = _write(tmp_path / "dense.jsonl", recs)
    res = run_bench(_cfg(url, path, concurrency=1, trace_time_scale=0.5), tok=tok)
    reqs = res["requests"]
    assert res["load"]["mode"] == "trace-capped" and res["trace"]["duration_s"] == pytest.approx(0.07)
    assert res["request_rate"] == pytest.approx(100.0)  # x0.5: 7 gaps of 10 ms
    assert [q["scheduled_time"] - reqs[0]["scheduled_time"] for q in reqs] == pytest.approx(
        [0.01 * i for i in range(8)], abs=1e-6
    )
    # one at a time: each request was sent when the one before it ended
    for a, b in itertools.pairwise(reqs):
        assert b["start_time"] >= a["start_time"] + a["latency"] - 1e-3
    fid = res["trace"]["timing_fidelity"]
    assert fid["lagged"] is True and fid["send_lag_ms"]["p99"] > 50
    assert any("trace replay lagged" in w and "--concurrency cap" in w for w in res["validity"]["warnings"])


def test_trace_prompts_exact_with_shared_token_prefix(tok, tmp_path):
    tr = traces.load(_write(tmp_path / "t.jsonl", RECORDS))
    reqs = traces.requests(tok, tr, seed=0, salt="abc")
    ids = [tok.encode(r.prompt) for r in reqs]
    assert [len(i) for i in ids] == [r["input_len"] for r in RECORDS] == [r.prompt_len for r in reqs]
    assert [r.output_len for r in reqs] == [r["output_len"] for r in RECORDS]
    groups: dict = {}
    for i, r in zip(ids, RECORDS, strict=True):
        groups.setdefault(r.get("prefix_id"), []).append(i)
    for pid, n in (("sys-a", 64), (7, 35)):
        heads = {tuple(i[:n]) for i in groups[pid]}
        assert len(heads) == 1, pid  # the same first n tokens in every prompt of the group
        assert len({tuple(i[: n + 1]) for i in groups[pid]}) > 1  # and they differ after the prefix
    assert groups["sys-a"][0][:8] != groups[7][0][:8]
    assert len({tuple(i[:8]) for i in groups[None]}) == len(groups[None])  # ungrouped prompts share nothing
    # a fresh salt draws fresh text of the same lengths
    again = traces.requests(tok, tr, seed=0, salt="xyz")
    assert [r.prompt_len for r in again] == [r.prompt_len for r in reqs] and again[0].prompt != reqs[0].prompt


GOOD = '{"timestamp": 0, "input_len": 8, "output_len": 4}'


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('{"timestamp": 1, "input_len": 8}', "'output_len' is missing"),
        ('{"timestamp": 1, "input_len": 8.5, "output_len": 4}', "'input_len' is 8.5"),
        ('{"timestamp": 1, "input_len": 0, "output_len": 4}', "'input_len' is 0"),
        ('{"timestamp": 1, "input_len": 8, "output_len": true}', "'output_len' is true"),
        ('{"timestamp": "soon", "input_len": 8, "output_len": 4}', "'timestamp' is \"soon\""),
        ('{"timestamp": -1, "input_len": 8, "output_len": 4}', "'timestamp' -1 is earlier than line 1's 0"),
        ('{"input_len": 8, "output_len": 4}', "'timestamp' is missing"),
        ('{"timestamp": 1, "input_len": 8, "output_len": 4, "prefix_id": [1]}', "'prefix_id'"),
        ('{"timestamp": 1, "input_len": 8, "output_len": 4, "prefix_len": 2}', "'prefix_len' without a 'prefix_id'"),
        (
            '{"timestamp": 1, "input_len": 8, "output_len": 4, "prefix_id": "a", "prefix_len": 8}',
            "'input_len' 8 is not",
        ),
        ("[1, 2]", "not a JSON object"),
        ('{"timestamp": 1, ', "not JSON"),
    ],
)
def test_bad_trace_line_names_file_line_and_field(tmp_path, line, field):
    p = tmp_path / "bad.jsonl"
    p.write_text(GOOD + "\n\n" + line + "\n" + GOOD.replace('"timestamp": 0', '"timestamp": 5') + "\n")
    with pytest.raises(BadInput) as e:
        traces.load(p)
    assert e.value.message.startswith(f"--trace {p}:3: ") and field in e.value.message


def test_trace_refuses_options_it_replaces_and_conflicting_prefix_lens(tmp_path):
    p = _write(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 0, "input_len": 8, "output_len": 4, "prefix_id": "a", "prefix_len": 4},
            {"timestamp": 1, "input_len": 9, "output_len": 4, "prefix_id": "a", "prefix_len": 5},
        ],
    )
    with pytest.raises(BadInput, match=r":2: field 'prefix_len' 5 differs from line 1's 4"):
        traces.load(p)
    ok = _write(tmp_path / "ok.jsonl", RECORDS)
    base = {"url": "http://127.0.0.1:9", "model": "m", "trace_path": ok}
    for kw, msg in (
        ({"workload": "agentic"}, "--trace replaces --workload"),
        ({"request_rate": 5.0}, "--request-rate does not apply"),
        ({"duration_s": 10.0, "concurrency": 2}, "--duration does not apply"),
        ({"num_prompts": 5}, "--num-prompts does not apply"),  # it sent every record, silently
        ({"burstiness": 0.5}, "--burstiness does not apply"),  # accepted, and written as the run's burstiness
    ):
        with pytest.raises(BadInput, match=msg):
            validate(BenchConfig(**base, **kw))
    with pytest.raises(BadInput, match="--trace-time-scale scales a replayed trace: it needs --trace"):
        validate(BenchConfig(url=base["url"], model="m", trace_time_scale=2.0))  # it was ignored
    with pytest.raises(BadInput, match="has no records"):
        traces.load(_write(tmp_path / "empty.jsonl", []))


def test_cli_bad_trace_is_one_line_exit_2(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(GOOD + "\n" + GOOD + "\n" + '{"timestamp": 2, "input_len": "x", "output_len": 4}\n')
    r = run_cli("bench", "--url", "http://127.0.0.1:9", "--model", "x", "--trace", str(p))
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(err) == 1 and f"{p}:3" in err[0] and "'input_len'" in err[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


# Mooncake's format (https://github.com/kvcache-ai/Mooncake, FAST25-release traces; AIPerf's mooncake_trace):
# timestamps in ms, lengths as input_length/output_length, one hash id per 512-token block of the prompt.
MOONCAKE = [
    {"timestamp": 1000, "input_length": 1100, "output_length": 6, "hash_ids": [1, 2, 3]},
    {"timestamp": 1020, "input_length": 700, "output_length": 4, "hash_ids": [1, 4]},
    {"timestamp": 1250, "input_length": 1600, "output_length": 5, "hash_ids": [1, 2, 5, 6]},
    {"timestamp": 1300, "input_length": 300, "output_length": 8, "hash_ids": [7]},
    {"timestamp": 1520, "input_length": 1100, "output_length": 6, "hash_ids": [1, 2, 3]},
    {"timestamp": 1600, "input_length": 600, "output_length": 3, "hash_ids": [8, 9]},
]
#: Tokens each record shares with an earlier one: its longest run of leading full blocks seen before.
MOONCAKE_SHARED = [0, 512, 1024, 0, 1024, 0]


def test_a_mooncake_trace_replays_its_timing_lengths_and_shared_blocks(gt, tok, tmp_path):
    url = gt("--ttft-ms", "20", "--itl-ms", "5")
    path = _write(tmp_path / "mooncake.jsonl", MOONCAKE)
    tr = traces.load(path)
    assert tr.format == "mooncake" and [r.blocks for r in tr.records] == [(1, 2), (1,), (1, 2, 5), (), (1, 2), (8,)]
    assert tr.offsets() == pytest.approx([0.0, 0.02, 0.25, 0.30, 0.52, 0.60])  # ms read as ms
    httpx.post(f"{url}/gt/reset")
    res = run_bench(_cfg(url, path), tok=tok)
    reqs = res["requests"]
    assert res["completed"] == len(MOONCAKE) and res["failed"] == 0
    assert [q["prompt_len"] for q in reqs] == [r["input_length"] for r in MOONCAKE]
    assert [q["output_tokens"] for q in reqs] == [r["output_length"] for r in MOONCAKE]
    # the server's prefix cache saw each record's shared blocks (and nothing of the others' own text)
    for q, want in zip(reqs, MOONCAKE_SHARED, strict=True):
        assert want <= q["cached_tokens"] < want + 512, (q["cached_tokens"], want)
    assert res["trace"]["format"] == "mooncake" and res["trace"]["full_blocks"] == 4  # ids 1, 2, 5, 8
    assert res["workload"]["prefix_cache_expected_hit"] == pytest.approx(
        sum(MOONCAKE_SHARED) / sum(r["input_length"] for r in MOONCAKE)
    )
    arrivals = sorted(r["arrival"] for r in httpx.get(f"{url}/gt/records").json())
    for a, off in zip(arrivals, tr.offsets(), strict=True):
        assert a - arrivals[0] == pytest.approx(off, abs=TOL_S)


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        ([MOONCAKE[0], {"timestamp": 0.5, "input_len": 8, "output_len": 4}], "a m3ctl record in a mooncake trace"),
        ([{"timestamp": 1, "input_length": 1100, "output_length": 4, "hash_ids": [1]}], "too few for 1,100 input"),
        ([{"timestamp": 1, "input_length": 900, "output_length": 4, "hash_ids": [1]}], "too few for 900 input"),
        ([{"timestamp": 1, "input_length": 100, "output_length": 4, "hash_ids": ["a"]}], "not a list of integer"),
        ([{"timestamp": 1, "input_length": 100, "hash_ids": [1]}], "'output_length' is missing"),
    ],
)
def test_a_bad_mooncake_line_is_one_line(tmp_path, lines, says):
    with pytest.raises(BadInput, match=says):
        traces.load(_write(tmp_path / "bad.jsonl", lines))
