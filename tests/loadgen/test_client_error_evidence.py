"""docs/results/client-error.md is what its recorded run says: the client's own TTFT error against the recording
ground-truth server (benchmarks/bench_client.py, own-error part), read from tests/fixtures/client-error/own-error.txt."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).parent.parent.parent
RUN = REPO / "tests" / "fixtures" / "client-error" / "own-error.txt"
DOC = REPO / "docs" / "results" / "client-error.md"
ROW = re.compile(
    r"c=\s*(\d+) procs=(\d+): own error median\s+([+-][\d.]+) ms \(([+-][\d.]+) % of the realized ([\d.]+) ms\), "
    r"p90\s+([+-][\d.]+) ms; (\d+) requests; CPU stall (\S+)"
)


def recorded() -> list[tuple[str, ...]]:
    return [m.groups() for m in map(ROW.search, RUN.read_text().splitlines()) if m]


def test_the_run_covers_every_concurrency_with_one_and_two_client_processes():
    rows = recorded()
    assert {(int(c), int(p)) for c, p, *_ in rows} == {(c, p) for c in (1, 32, 64, 128, 256) for p in (1, 2)}
    assert all(int(n) == max(64, 4 * int(c)) for c, _, _, _, _, _, n, _ in rows)


def test_the_own_error_is_within_half_a_percent_of_ttft_up_to_c256():
    rows = recorded()
    assert rows and all(abs(float(r[3])) <= 0.5 for r in rows)  # r[3]: % of the realized TTFT
    assert max(float(r[3]) for r in rows) == 0.33


def test_the_docs_table_is_the_recorded_run():
    table = [ln for ln in DOC.read_text().splitlines() if re.match(r"\| \d", ln)]
    shown = [[x.strip() for x in ln.strip("|").split("|")] for ln in table]
    want = [[c, p, n, f"{med} ms", f"{rel} %", f"{p90} ms", stall] for c, p, med, rel, _, p90, n, stall in recorded()]
    assert shown == want
