"""docs/results/h100-spread.md is what its recorded runs say: every figure and each conclusion of the spread
decomposition recomputed from tests/fixtures/h100-spread/runs.tgz (one H100, 2026-12-06)."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent.parent
RUNS = REPO / "tests" / "fixtures" / "h100-spread" / "runs.tgz"
DOC = REPO / "docs" / "results" / "h100-spread.md"


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    out: dict[str, dict] = {}
    with tarfile.open(RUNS) as t:
        for m in t.getmembers():
            f = t.extractfile(m) if m.name.endswith(".json") else None
            if f is not None:
                out[Path(m.name).stem] = json.load(f)
    return out


def tps(runs: dict[str, dict], *names: str) -> list[float]:
    return [runs[n]["total_token_throughput"] for n in names]


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / min(values)


def test_every_throughput_in_the_table_is_a_recorded_run(runs):
    table = [ln for ln in DOC.read_text().splitlines() if ln.startswith("| ") and "tok/s" not in ln]
    shown = {int(x.replace(",", "")) for ln in table for x in re.findall(r"\b\d{2},\d{3}\b", ln)}
    recorded = {round(d["total_token_throughput"]) for d in runs.values()}
    assert shown and shown <= recorded, sorted(shown - recorded)


def test_the_truncated_vocabulary_is_the_studys_regime(runs):
    truncated = tps(runs, "c1-v200k-a", "c1-v200k-b")
    small = tps(runs, "c1-v2k-a", "c1-v2k-b")
    full = tps(runs, "c2-f1-a", "c2-f1-nocu", "c2-f1-640", "c2-f2-a", "c2-f2-b", "c3-g1-a", "c3-g1-b", "c3-g1-warm")
    assert max(truncated) < 0.72 * min(small)  # -31 % or worse on the same machine
    assert 45_000 < min(truncated) and max(truncated) < 61_500  # inside study11's 46,145-61,410
    assert spread(full) < 0.03 and min(full) > 0.97 * max(small)  # the full head costs no more than the noise


def test_the_clients_agree_on_the_full_vocabulary_and_the_client_is_not_the_bottleneck(runs):
    m3, vllm = tps(runs, "c2-f1-640", "c2-f1-vllm")
    assert runs["c2-f1-640"]["num_prompts"] == runs["c2-f1-vllm"]["completed"] == 640
    assert abs(vllm - m3) / m3 < 0.005
    client_runs = [d for n, d in runs.items() if "validity" in d]
    assert max(d["validity"]["client_loop_lag_p99_ms"] for d in client_runs) < 1.1
    assert max(d["validity"]["client_cpu_max_pct"] for d in client_runs) < 21
    assert spread(tps(runs, "c1-v2k-a", "c1-v2k-b", "c1-v2k-cp2", "c1-v2k-aio")) < 0.05


def test_the_trial_server_is_inside_the_plain_servers_noise(runs):
    plain = tps(runs, "c2-f1-a", "c2-f1-nocu", "c2-f2-a", "c2-f2-b", "c3-g1-a", "c3-g1-b", "c3-g1-warm")
    (trial,) = tps(runs, "c3-tune-base-c64")
    assert 0 < (trial - max(plain)) / max(plain) < spread(plain) < 0.03


def test_the_four_wave_outlier_was_called_valid(runs):
    b, a = runs["c2-f1-b"], runs["c2-f1-a"]
    assert b["total_token_throughput"] < 0.94 * a["total_token_throughput"]
    assert b["p90_tpot_ms"] > 1.3 * a["p90_tpot_ms"] and b["median_ttft_ms"] < 0.8 * a["median_ttft_ms"]
    assert b["validity"]["valid"] is True and b["server_metrics"]["preemptions"] == 0
