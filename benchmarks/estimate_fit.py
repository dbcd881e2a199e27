"""Fit the estimate's achieved efficiencies from recorded Hopper runs, and check the fit by cross-prediction.

``plan --estimate`` (m3ctl.planning.estimate) prices a step as ``overhead + max(bytes / (eta_hbm x HBM), flops /
(eta_compute x peak))`` with the efficiencies of m3ctl/data/gpu_peaks.yaml. This script reads runs of the MiniMax-M3
scale model (``m3ctl dev scale-model --arch minimax-m3``: real per-layer shapes, fewer layers, dummy weights) served
by ``m3ctl serve`` on one GPU and measured by ``m3ctl bench`` (scripts/gpu/hopper_m3_call.sh, part ``grid``): a decode
sweep (concurrency 1..64, 1,024 in / 256 out, exact output lengths) and a prefill sweep (concurrency 1, 1 token out:
TTFT is one prefill). For each GPU it finds the ``(eta_hbm, eta_compute, overhead)`` that minimise the squared log
error of the model's TPOT and prefill time against the measured medians (a grid search: three parameters, a few
thousand model calls), then predicts each GPU's runs from the OTHER GPU's fit (the honesty check: the target is within
15 % on decode tok/s per user and total tok/s).

    python benchmarks/estimate_fit.py tests/fixtures/estimate-fit/h100 tests/fixtures/estimate-fit/h200
    python benchmarks/estimate_fit.py --yaml RUN_DIR...   # the fitted efficiency block for gpu_peaks.yaml

A run directory holds ``gpu.txt`` (``nvidia-smi --query-gpu=name,... --format=csv``), ``config.json`` (the scale
model's) and ``bench-decode.json`` / ``bench-prefill.json`` (bench ``--output-json``). The attention the runs served is
read from ``plan.json`` when present (the dense fallback on Hopper: every layer reads its whole context).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from m3ctl.assess.cost import GpuPeak, Layout, Shape, gpu_peak, peaks
from m3ctl.assess.facts import facts_from_config
from m3ctl.planning.estimate import Workload, figures, shape_of

#: The fit's coarse grid (HBM and tensor-core fractions of the datasheet peaks, per-step overhead in ms), then a
#: grid 10x finer around the coarse best.
COARSE = ((0.05, 1.0, 0.05), (0.05, 1.0, 0.05), (0.0, 10.0, 0.5))
#: The cross-prediction target of the issue that asked for the fit.
TARGET = 0.15


@dataclass(frozen=True)
class Point:
    """One measured level: ``kind`` decode (``value`` = median TPOT, s) or prefill (median TTFT, s)."""

    kind: str
    concurrency: int
    input_len: int
    output_len: int
    value: float
    tok_s_user: float = 0.0
    tok_s_total: float = 0.0


@dataclass(frozen=True)
class RunSet:
    """One GPU's recorded runs with the cost model's inputs for them."""

    name: str
    gpu_key: str
    gpu: GpuPeak
    points: list[Point]
    shape: Shape


def _runs(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    return list(data.get("runs", [data]))


def _valid(run: dict) -> bool:
    v = run.get("validity") or {}
    return bool(run.get("completed")) and v.get("valid", True) is not False


def load(run_dir: Path) -> RunSet:
    """The runs of ``run_dir`` (module docstring).

    Raises:
        SystemExit: a missing file or a GPU the peak table does not know.
    """
    gpu_name = (run_dir / "gpu.txt").read_text().splitlines()[1].split(",")[0].strip()
    found = gpu_peak(gpu_name)
    if found is None:
        raise SystemExit(f"{run_dir}: no peaks for GPU {gpu_name!r}")
    cfg = json.loads((run_dir / "config.json").read_text())
    facts = facts_from_config(cfg, str(run_dir), local=True)
    plan = run_dir / "plan.json"
    dense = plan.is_file() and '"dense"' in plan.read_text()
    if dense or facts.attention != "msa":
        facts = facts.model_copy(update={"sparse_attention_freq": [0] * (facts.num_layers or 0)})
    shape, _ = shape_of(facts, "bf16", 2.0)
    points = []
    for r in _runs(run_dir / "bench-decode.json"):
        if _valid(r) and r.get("median_tpot_ms"):
            c = int(r.get("max_concurrency") or 1)
            n_in = round(r["total_input_tokens"] / r["completed"])
            n_out = round(r["total_output_tokens"] / r["completed"])
            points.append(
                Point(
                    "decode",
                    c,
                    n_in,
                    n_out,
                    r["median_tpot_ms"] / 1e3,
                    1e3 / r["median_tpot_ms"],
                    r["total_token_throughput"],
                )
            )
    for r in _runs(run_dir / "bench-prefill.json"):
        if _valid(r) and r.get("median_ttft_ms"):
            n_in = round(r["total_input_tokens"] / r["completed"])
            points.append(Point("prefill", 1, n_in, 1, r["median_ttft_ms"] / 1e3))
    if not points:
        raise SystemExit(f"{run_dir}: no valid decode or prefill run")
    return RunSet(run_dir.name, found[0], found[1], points, shape)


def predict(rs: RunSet, gpu: GpuPeak, p: Point, hbm: float, compute: float, overhead_ms: float) -> dict:
    """The estimate's figures for point ``p`` of ``rs`` on ``gpu`` at these efficiencies."""
    latency_us = sum(peaks().comm.all_reduce_latency_us) / 2
    wl = Workload(concurrency=p.concurrency, input_len=p.input_len, output_len=p.output_len)
    return figures(rs.shape, Layout(tp=1), gpu, "bf16", wl, (hbm, compute, overhead_ms, latency_us, 1.0))


def _model_value(rs: RunSet, gpu: GpuPeak, p: Point, eff: tuple[float, float, float]) -> float:
    f = predict(rs, gpu, p, *eff)
    return f["tpot_ms"] / 1e3 if p.kind == "decode" else f["prefill_s"]


def _axis(lo: float, hi: float, step: float) -> list[float]:
    return [round(lo + i * step, 6) for i in range(round((hi - lo) / step) + 1)]


def _search(rs: RunSet, axes: list[list[float]]) -> tuple[float, tuple[float, float, float]]:
    best: tuple[float, tuple[float, float, float]] = (math.inf, (0.0, 0.0, 0.0))
    for h, c, o in itertools.product(*axes):
        err = sum(math.log(_model_value(rs, rs.gpu, p, (h, c, o)) / p.value) ** 2 for p in rs.points)
        if err < best[0]:
            best = (err, (h, c, o))
    return best


def fit(rs: RunSet) -> tuple[tuple[float, float, float], float]:
    """``((eta_hbm, eta_compute, overhead_ms), rms log error)`` minimising the squared log error over ``rs``: the
    :data:`COARSE` grid, then a grid ten times finer over one coarse step around its best."""
    _, centre = _search(rs, [_axis(*a) for a in COARSE])
    fine = [_axis(max(a[0], x - a[2]), min(a[1], x + a[2]), a[2] / 10) for a, x in zip(COARSE, centre, strict=True)]
    err, eff = _search(rs, fine)
    return eff, math.sqrt(err / len(rs.points))


def cross(fitted: RunSet, eff: tuple[float, float, float], target: RunSet) -> list[dict]:
    """Each of ``target``'s decode points predicted with ``fitted``'s efficiencies on ``target``'s GPU."""
    rows = []
    for p in target.points:
        f = predict(target, target.gpu, p, *eff)
        if p.kind == "decode":
            total = f["tok_s_gpu"]
            rows.append(
                {
                    "concurrency": p.concurrency,
                    "tok_s_user": (p.tok_s_user, f["tok_s_user"]),
                    "tok_s_total": (p.tok_s_total, total),
                }
            )
        else:
            rows.append({"prefill_input": p.input_len, "prefill_s": (p.value, f["prefill_s"])})
    return rows


def _pct(measured: float, predicted: float) -> str:
    return f"{(predicted / measured - 1) * 100:+.1f} %"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (module docstring), one per GPU")
    ap.add_argument("--yaml", action="store_true", help="print the fitted efficiency block for gpu_peaks.yaml")
    args = ap.parse_args(argv)
    sets = [load(d) for d in args.runs]
    fits = {rs.name: fit(rs) for rs in sets}
    if args.yaml:
        effs = [e for e, _ in fits.values()]
        lo_hi = [(min(e[i] for e in effs), max(e[i] for e in effs)) for i in range(3)]
        runs = ", ".join(f"{rs.name} ({rs.gpu_key})" for rs in sets)
        print("efficiency:\n  measured: true")
        print(f"  hbm: [{lo_hi[0][0]:g}, {lo_hi[0][1]:g}]\n  compute: [{lo_hi[1][0]:g}, {lo_hi[1][1]:g}]")
        print(f"  step_overhead_ms: [{lo_hi[2][0]:g}, {lo_hi[2][1]:g}]")
        print(f"  source: >-\n    fitted by benchmarks/estimate_fit.py from the recorded runs {runs}")
        return 0
    print(
        "| GPU | eta HBM | eta tensor | overhead ms | rms log error | points |\n| --- | --- | --- | --- | --- | --- |"
    )
    for rs in sets:
        (h, c, o), rms = fits[rs.name]
        print(f"| {rs.name} ({rs.gpu_key}) | {h:.2f} | {c:.2f} | {o:.1f} | {rms:.3f} | {len(rs.points)} |")
    for rs in sets:
        eff = fits[rs.name][0]
        print(f"\n{rs.name} at its own fit:\n\n| level | measured ms | model ms | error |\n| --- | --- | --- | --- |")
        for p in rs.points:
            m, f = p.value * 1e3, _model_value(rs, rs.gpu, p, eff) * 1e3
            what = f"c={p.concurrency} TPOT" if p.kind == "decode" else "prefill"
            print(f"| {what}, {p.input_len:,} in / {p.output_len:,} out | {m:.2f} | {f:.2f} | {_pct(m, f)} |")
    worst = 0.0
    for a, b in itertools.permutations(sets, 2):
        print(f"\nFit on {a.name}, predict {b.name}:\n")
        print("| level | measured | predicted | error |\n| --- | --- | --- | --- |")
        for row in cross(a, fits[a.name][0], b):
            for key in ("tok_s_user", "tok_s_total", "prefill_s"):
                if key in row:
                    m, p = row[key]
                    level = f"c={row['concurrency']}" if "concurrency" in row else f"prefill {row['prefill_input']} in"
                    print(f"| {level} {key} | {m:,.3f} | {p:,.3f} | {_pct(m, p)} |")
                    if key != "prefill_s":
                        worst = max(worst, abs(p / m - 1))
    if len(sets) > 1:
        verdict = "within" if worst <= TARGET else "outside"
        print(f"\nworst decode cross-prediction error {worst * 100:.1f} %: {verdict} the {TARGET * 100:.0f} % target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
