"""m3ctl's result JSON holds what ``vllm bench serve`` writes: its plain keys (``rtfx`` included) and, with
``--save-detailed`` (the same flag), its per-request arrays; each request carries an ``X-Request-Id`` that the
server sees, so a request joins the server's log. The key lists are read from the installed vLLM's own source
(vllm/benchmarks/serve.py), and vLLM's own timeline reader (the loop ``--plot-timeline`` runs) reads the file."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import httpx
import pytest

from m3ctl.loadgen.prompts import LocalTokenizer
from m3ctl.loadgen.runner import BenchConfig, run_bench
from tests.conftest import groundtruth_pool, run_cli


def _vllm_serve_source() -> str:
    spec = importlib.util.find_spec("vllm.benchmarks.serve")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed here")
    return Path(spec.origin).read_text()


def vllm_detailed_fields() -> list[str]:
    """The arrays vLLM drops without --save-detailed (its own list, in serve.py)."""
    m = re.search(r"if not args\.save_detailed:.*?for field in \[(.*?)\]", _vllm_serve_source(), re.DOTALL)
    assert m, "vLLM's save_detailed list moved: read vllm/benchmarks/serve.py"
    return re.findall(r'"(\w+)"', m.group(1))


def vllm_result_keys() -> list[str]:
    """The keys of vLLM's result dict for a text benchmark (the first ``result = {`` of serve.py)."""
    src = _vllm_serve_source()
    start = src.index("        result = {\n")
    return re.findall(r'^\s+"(\w+)":', src[start : src.index("        }\n", start)], re.MULTILINE)


@pytest.fixture(scope="module")
def run(tiny_models):
    with groundtruth_pool("--tokenizer", str(tiny_models["m2"]), "--no-metrics") as start:
        url = start("--ttft-ms", "5", "--itl-ms", "2")
        httpx.post(f"{url}/gt/reset")
        cfg = BenchConfig(
            url=url,
            model="groundtruth",
            concurrency=4,
            num_prompts=12,
            input_len=32,
            output_len=6,
            save_detailed=True,
            scrape_server_metrics=False,
            warmup=False,
        )
        res = run_bench(cfg, tok=LocalTokenizer(tiny_models["m2"]))
        yield res, httpx.get(f"{url}/gt/records").json()


def test_every_plain_key_and_every_detailed_array_of_vllm(run):
    res, _ = run
    missing = [k for k in vllm_result_keys() + vllm_detailed_fields() if k not in res]
    assert missing == []
    assert res["rtfx"] == 0.0
    n = res["num_prompts"]
    for k in vllm_detailed_fields():
        assert len(res[k]) == n, k
    assert res["errors"] == [""] * n and all(t for t in res["generated_texts"])
    assert res["input_lens"] == [32] * n and res["output_lens"] == [6] * n
    assert all(len(itl) == 5 for itl in res["itls"]) and all(0 < t < 5 for t in res["ttfts"])


def test_vllms_timeline_reader_reads_the_file_unchanged(run, tmp_path):
    """The per-request loop of vLLM's ``--plot-timeline`` (vllm/benchmarks/serve.py), on the saved JSON."""
    res, _ = run
    benchmark_result = json.loads(json.dumps(res))
    per_request_data = []
    start_times = benchmark_result.get("start_times", [])
    ttfts = benchmark_result.get("ttfts", [])
    itls = benchmark_result.get("itls", [])
    input_lens = benchmark_result.get("input_lens", [])
    output_lens = benchmark_result.get("output_lens", [])
    if start_times and ttfts and itls:
        for i in range(len(start_times)):
            latency = ttfts[i] + sum(itls[i]) if itls[i] else ttfts[i]
            per_request_data.append(
                {
                    "start_time": start_times[i],
                    "ttft": ttfts[i],
                    "itl": itls[i],
                    "latency": latency,
                    "prompt_len": input_lens[i],
                    "output_tokens": output_lens[i],
                }
            )
    assert len(per_request_data) == res["num_prompts"]
    for d, lat in zip(per_request_data, res["latencies"], strict=True):
        assert d["latency"] == pytest.approx(lat, abs=0.01)  # ttft + the gaps: the whole request


def test_each_request_carries_an_id_the_server_saw(run):
    res, records = run
    ids = res["request_ids"]
    assert len(set(ids)) == len(ids) == res["num_prompts"] and all(i.startswith("bench-") for i in ids)
    assert sorted(r["request_id"] for r in records) == sorted(ids)


def test_without_save_detailed_the_arrays_stay_out(tiny_models, tmp_path):
    with groundtruth_pool("--tokenizer", str(tiny_models["m2"]), "--no-metrics") as start:
        url = start("--ttft-ms", "5", "--itl-ms", "2")
        out = tmp_path / "r.json"
        p = run_cli(
            "bench", "--url", url, "--model", "groundtruth", "--tokenizer", str(tiny_models["m2"]),
            "--concurrency", "2", "--num-prompts", "4", "--input-len", "16", "--output-len", "4", "--no-warmup",
            "--output-json", str(out),
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        res = json.loads(out.read_text())
    assert res["rtfx"] == 0.0 and not any(k in res for k in ("ttfts", "itls", "generated_texts", "request_ids"))
