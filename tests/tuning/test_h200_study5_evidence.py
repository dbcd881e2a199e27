"""The H200 study of session 12 (docs/results/h200-study5.md), from the recorded study and grid
(tests/fixtures/h200x1-real/study5): the shared Inductor kernel cache on real hardware, the median trial start, and
the tune's capacity against a clean grid of the same configurations under the same (spread-aware) rule, with 4
prompts per concurrency on both sides."""

from __future__ import annotations

import gzip
import json
import re
import statistics
import tarfile
from pathlib import Path

import pytest

from m3ctl.tuning.startup import start_breakdown

FIX = Path(__file__).parent.parent / "fixtures" / "h200x1-real" / "study5"
STUDY4 = FIX.parent / "study4"


def _extract(tgz: Path, d: Path) -> Path:
    with tarfile.open(tgz) as t:
        t.extractall(d, filter="data")
    return d


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    return _extract(FIX / "study.tgz", tmp_path_factory.mktemp("study5"))


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> dict:
    return json.loads((_extract(FIX / "grid.tgz", tmp_path_factory.mktemp("grid5")) / "grid.json").read_text())


def _starts(study: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((study / "trials").glob("*/start.json"))}


def _compile(study: Path, trial: str) -> tuple[str | None, float | None, float | None]:
    """(compile cache, vLLM's torch.compile seconds, Inductor's own compile seconds) from a trial's server log."""
    log = (study / "trials" / trial / "server.log").read_text(errors="replace")
    b = start_breakdown(log)
    m = re.search(r"Compiling a graph for compile range \(.*?\) takes ([\d.]+) s", log)
    return b.compile_cache, b.vllm_s.get("torch_compile"), float(m[1]) if m else None


def test_every_trial_shared_one_kernel_cache_with_aot_compile_off(study):
    starts = _starts(study)
    assert set(starts) == {"base", "0001", "0002", "0003", "0004", "0005"}
    assert {s["kernel_cache"] for s in starts.values()} == {"/tmp/study/vllm-cache/tmp_sm2/inductor"}
    for name, s in starts.items():
        assert s["engine_process"] == "fork" and s["prewarmed"] is True, name
        cfg = json.loads((study / "trials" / name / "config.json").read_text())["command"]
        assert (
            "TORCHINDUCTOR_CACHE_DIR=/tmp/study/vllm-cache/tmp_sm2/inductor" in cfg and "VLLM_USE_AOT_COMPILE=0" in cfg
        )


def test_a_new_compile_key_compiles_only_what_changed(study):
    """Speculation, max-num-batched-tokens and the KV dtype each give vLLM a new compile key. In study4 (AOT compile
    on, Inductor's cache inside each key's folder) such a start spent 21-29 s in torch.compile; with one kernel
    cache, k=3 found every kernel of the baseline's graph (Inductor: 0.94 s) and the others compiled in part."""
    got = {t: _compile(study, t) for t in ("base", "0001", "0002", "0003", "0004", "0005")}
    assert {t for t, (c, _, _) in got.items() if c == "hit"} == {"0002", "0005"}  # vLLM's own key matched
    new_keys = {t: got[t] for t in ("0001", "0003", "0004")}  # k=3 / mbt 2048 / KV fp8: keys never seen before
    assert all(c == "miss" and tc <= 16.0 for c, tc, _ in new_keys.values())
    assert new_keys["0001"][2] == pytest.approx(0.94) and got["base"][2] == pytest.approx(8.88)
    with tarfile.open(STUDY4 / "study.tgz") as t:
        old = [json.load(t.extractfile(m)) for m in t.getmembers() if m.name.endswith("start.json")]
    assert min(s["phases"]["torch_compile"] for s in old if s["compile_cache"] == "miss") >= 21


def test_the_median_start_after_the_first_is_under_40_s(study):
    starts = _starts(study)
    after_first = sorted(s["start_s"] for n, s in starts.items() if n != "base")
    assert statistics.median(after_first) == pytest.approx(33.56, abs=0.01)  # issue 25 asks <= 40 s
    # the one start over 40 s claimed a prewarmed process still importing (the first start of call 2)
    slow = {n for n, s in starts.items() if n != "base" and s["start_s"] > 40}
    assert slow == {"0003"} and starts["0003"]["phases"]["api_imports"] > 15


def test_no_prewarmed_process_ever_held_the_gpu():
    counts = [
        line.count("MiB;")
        for line in gzip.decompress((FIX / "gpu-apps.txt.gz").read_bytes()).decode().splitlines()
        if not line.startswith("==")
    ]
    assert len(counts) > 100 and max(counts) == 1


def test_the_tunes_capacity_and_choice_agree_with_the_clean_grid(study, grid):
    """Issue 25 item 2: the chosen configuration's capacity equals the grid's and its objective is within 5 %; the
    choice is the grid's best. The baseline's capacity agrees too; its objective (one run in the tune, the median
    of 3 in the grid) is 10.7 % higher in the tune."""
    res = json.loads((study / "result.json").read_text())
    best, base = res["best"], res["baseline"]
    assert best["config"]["spec_depth"] == 3 and best["config"]["max_num_seqs"] == 1024
    assert res["chosen"] == "tuned" and best["capacity_runs"] == 3
    chosen, defaults = grid["configs"]["chosen"], grid["configs"]["defaults"]
    assert chosen["capacity"] == best["concurrency"] == 128
    assert abs(best["objective"] / chosen["objective_at_capacity"] - 1) < 0.05  # 0.978
    assert chosen["objective_at_capacity"] == max(c["objective_at_capacity"] for c in grid["configs"].values())
    assert defaults["capacity"] == base["concurrency"] == 96
    assert base["objective"] / defaults["objective_at_capacity"] == pytest.approx(1.107, abs=0.001)
    assert res["capacity_rule"]["spread"] == pytest.approx(0.136, abs=0.001)  # the spread-aware bar in effect
