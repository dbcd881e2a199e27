"""Fit the estimate's achieved efficiencies from recorded Hopper runs, and check the fit by cross-prediction.

``plan --estimate`` (m3ctl.planning.estimate) prices a step as ``overhead + max(bytes / (eta_hbm x HBM), flops /
(eta_compute x peak))`` and a request's prefill as ``prefill overhead + its prefill step`` with the efficiencies of
m3ctl/data/gpu_peaks.yaml. This script reads runs of the MiniMax-M3
scale model (``m3ctl dev scale-model --arch minimax-m3``: real per-layer shapes, fewer layers, dummy weights) served
by ``m3ctl serve`` on one GPU and measured by ``m3ctl bench`` (scripts/gpu/hopper_m3_call.sh, part ``grid``): a decode
sweep (concurrency 1..64, 1,024 in / 256 out, exact output lengths) and a prefill sweep (concurrency 1, 1 token out:
TTFT is one prefill). A run the bench judged invalid, or one its pace check (m3ctl.loadgen.pace) does not show to decode
at one steady pace, is left out and listed. Run directories of the same GPU kind (read from ``gpu.txt``) are fitted
together, any number of
them (two servers, two sessions). For each GPU kind it finds the ``(eta_hbm, eta_compute, step overhead, prefill
overhead)`` that minimise the squared log error of the model's TPOT and prefill time against the measured medians (a
grid search over the first three, a few thousand model calls; the prefill overhead, which moves only the prefill
times, by a line search at each grid point), then predicts each GPU kind's runs from every OTHER kind's fit, level by
level (the honesty check: the target is within 15 % of each run's decode tok/s per user, total tok/s and prefill
time; a figure a fit has no run to price is "could not judge", never a pass, and so is the whole check with one GPU
kind). A kind with fewer valid points than the four parameters is not fitted; ``--yaml`` needs two kinds.

    python benchmarks/estimate_fit.py tests/fixtures/estimate-fit/h100 tests/fixtures/estimate-fit/h100b \
        tests/fixtures/estimate-fit/h100c tests/fixtures/estimate-fit/h100d tests/fixtures/estimate-fit/h100e \
        tests/fixtures/estimate-fit/h200 tests/fixtures/estimate-fit/h200b tests/fixtures/estimate-fit/h200c
    python benchmarks/estimate_fit.py --yaml RUN_DIR...   # the fitted efficiency block for gpu_peaks.yaml

A run directory holds ``gpu.txt`` (``nvidia-smi --query-gpu=name,... --format=csv``), ``config.json`` (the scale
model's) and ``bench-decode.json`` / ``bench-prefill.json`` (bench ``--output-json``; a ``bench-decode-long.json``, the
decode at a longer prompt, joins the decode points). The attention the runs served is
read from ``plan.json`` when present (the dense fallback on Hopper: every layer reads its whole context). A directory
without ``config.json`` is a repeat of the sweep on the same scale model: it takes the model (and ``plan.json``) of an
earlier directory of its GPU kind.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from m3ctl.assess.cost import Layout, Shape
from m3ctl.assess.facts import facts_from_config
from m3ctl.assess.peaks import GpuPeak, gpu_peak, peaks
from m3ctl.loadgen.pace import Pace, pace
from m3ctl.planning.estimate import Workload, figures, shape_of

#: The fit's coarse grid (HBM and tensor-core fractions of the datasheet peaks, per-step overhead in ms), then a
#: grid 10x finer around the coarse best.
COARSE = ((0.05, 1.0, 0.05), (0.05, 1.0, 0.05), (0.0, 10.0, 0.5))
#: The prefill overhead's coarse axis (ms per request), refined the same way.
PREFILL = (0.0, 40.0, 1.0)
#: The cross-prediction target of the issue that asked for the fit.
TARGET = 0.15
#: The figures the cross-prediction checks: (key in a prediction, label).
FIGURES = (("tok_s_user", "tok/s per user"), ("tok_s_total", "total tok/s"), ("prefill_ms", "prefill ms"))


@dataclass(frozen=True)
class Point:
    """One measured level of run ``run``: ``kind`` decode (``value`` = median TPOT, s) or prefill (median TTFT, s);
    ``floor_s``: the host's per-step floor at this concurrency on the host that served the run (:func:`host_floor`;
    0 when no run of its GPU kind measured one)."""

    kind: str
    concurrency: int
    input_len: int
    output_len: int
    value: float
    tok_s_user: float = 0.0
    tok_s_total: float = 0.0
    run: str = ""
    floor_s: float = 0.0

    def level(self) -> str:
        """The level's name, shared by the runs of a kind that measured it."""
        what = f"c={self.concurrency}" if self.kind == "decode" else "prefill"
        return f"{what}, {self.input_len:,} in / {self.output_len:,} out"


@dataclass(frozen=True)
class Dropped:
    """A recorded run the fit leaves out (:func:`_steady`, :func:`_invalid`): its directory, file and concurrency, its
    median TPOT by quarter (ms, or "-") and why."""

    run: str
    what: str
    quarters_ms: str
    why: str


@dataclass(frozen=True)
class RunSet:
    """One GPU kind's recorded runs (``runs``: the directory names) with the cost model's inputs for them."""

    name: str
    gpu_key: str
    gpu: GpuPeak
    points: list[Point]
    shape: Shape
    runs: tuple[str, ...] = ()
    floors: dict[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    floor_from: dict[str, str] = field(default_factory=dict)
    dropped: tuple[Dropped, ...] = ()

    def has_prefill(self) -> bool:
        return any(p.kind == "prefill" for p in self.points)


def _read_json(path: Path, kind: type) -> Any:
    """The JSON of ``path``, which must be a ``kind`` (dict or list).

    Raises:
        SystemExit: one line naming the file and what is wrong with it (unreadable, not JSON, not a ``kind``).
    """
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise SystemExit(f"{path}: cannot read it ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SystemExit(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, kind):
        want = "object" if kind is dict else "list"
        raise SystemExit(f"{path}: expected a JSON {want}, found {type(data).__name__}")
    return data


def _runs(path: Path) -> list[dict]:
    """The bench runs of ``path`` (bench ``--output-json``: ``{"runs": [...]}`` or one run); none when it is absent.

    Raises:
        SystemExit: the file is not JSON, or not an object whose runs are objects.
    """
    if not path.is_file():
        return []
    data = _read_json(path, dict)
    runs = data.get("runs", [data])
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise SystemExit(f'{path}: expected "runs" to be a list of objects')
    return runs


def _floors(run_dir: Path, dropped: list[Dropped]) -> tuple[tuple[int, float], ...]:
    """The host's per-step floor measured on the host that served ``run_dir``: ``((concurrency, median TPOT s), ...)``
    from its ``bench-floor.json`` and, where the run went past c = 4, ``bench-floor-high.json``
    (scripts/gpu/hopper_m3_call.sh part ``floor``, with ``FLOOR_HIGH=1`` for c = 16 and 64: a tiny-dimension model of
    the scale model's layer structure, so a step is nearly all host work), valid and steady runs only (the others
    appended to ``dropped``), by concurrency; empty without one."""
    files = (run_dir / "bench-floor.json", run_dir / "bench-floor-high.json")
    return tuple(
        sorted(
            (int(r.get("max_concurrency") or 1), r["median_tpot_ms"] / 1e3)
            for f in files
            for r in _steady(f, run_dir.name, dropped)
            if r.get("median_tpot_ms")
        )
    )


def host_floor(floors: tuple[tuple[int, float], ...], concurrency: int) -> float:
    """The host's per-step floor (s) at ``concurrency`` from the measured ``floors`` (:func:`_floors`): linear
    between two measured concurrencies, held at the nearest measured end outside them; 0 without a measurement.

    No extrapolation past the measured range: a floor measured at c = 1 and 4 says nothing of c = 64, and the rise
    from c = 1 to 4 is not the host's per-sequence cost alone (at c = 4 the floor model's own GPU work, small as it is,
    is already part of its step), so extending that line charged c = 64 a 13.2 ms floor where the scale model
    measured 8.5-8.9 ms for the whole step (docs/results/estimate-fit.md). Held at the last measured value above the
    range: the floor a step cannot undercut as far as the run shows (a host does not do less work for more
    sequences), and since a step takes the longer of the floor and the GPU's work, a held floor can leave a step
    priced too fast only where the host's work grew past it, never priced slower than a measurement supports. Below
    the first measured concurrency the first value (reached only when c = 1 was not measured)."""
    if not floors:
        return 0.0
    (c_lo, f_lo), (c_hi, f_hi) = floors[0], floors[-1]
    if concurrency <= c_lo:
        return f_lo
    if concurrency >= c_hi:
        return f_hi
    for (c0, f0), (c1, f1) in itertools.pairwise(floors):
        if concurrency <= c1:
            return f0 + (f1 - f0) * (concurrency - c0) / (c1 - c0)
    return f_hi  # not reached: c_lo < concurrency < c_hi lies in some segment


def _valid(run: dict) -> bool:
    v = run.get("validity") or {}
    return bool(run.get("completed")) and v.get("valid", True) is not False


def recorded_pace(run: dict) -> Pace | None:
    """The pace check (m3ctl.loadgen.pace: did the run decode at one steady pace?) of a recorded closed-loop run
    (:func:`_paced`); None when it is too short to judge.

    The bench's own ``validity.decode_pace`` where it wrote one. For a run recorded before the bench did, rebuilt from
    what the file keeps: each request's end-to-end latency (``latencies``, s, in start order) less the run's median
    TTFT, over its requested output length less one (the fit's runs ask exact output lengths; TTFT is under 5 % of a
    1,024 in / 256 out request, so its spread moves a quarter's median little)."""
    kept = (run.get("validity") or {}).get("decode_pace")
    if isinstance(kept, dict):
        z = kept.get("z")
        ms = tuple(m / 1e3 for m in kept["block_median_tpot_ms"])
        return Pace(ms, kept["shift_pct"] / 100, math.inf if z is None else z)
    ttft = run.get("median_ttft_ms") or 0.0
    lat = [(t - ttft / 1e3) / (run["output_len_requested"] - 1) for t in run.get("latencies") or []]
    return pace(lat, int(run["max_concurrency"])) if len(lat) == run.get("completed") else None


def _paced(run: dict) -> bool:
    """A run recorded without the bench's ``decode_pace`` block that the pace check applies to: a closed loop (a
    concurrency, no request rate) of requests of more than one output token (a prefill run has no decode pace)."""
    closed = run.get("max_concurrency") and str(run.get("request_rate")) == "inf"
    return bool(closed) and (run.get("output_len_requested") or 0) > 1


def _steady(path: Path, name: str, dropped: list[Dropped]) -> list[dict]:
    """The valid runs of ``path`` shown to decode at one steady pace (:func:`recorded_pace`), and those the check
    does not apply to (:func:`_paced`). The others, and the runs the bench judged invalid (:func:`_invalid`), are
    appended to ``dropped``: a disturbed run's median belongs to neither of its paces, and a run too short to show its
    pace is not shown steady (could not judge is no pass)."""
    kept = []
    for r in _runs(path):
        what = f"{path.name} c={r.get('max_concurrency')}"
        if not _valid(r):
            _invalid(r, name, what, dropped)
            continue
        judged = isinstance((r.get("validity") or {}).get("decode_pace"), dict) or _paced(r)
        found = recorded_pace(r) if judged else None
        if judged and found is None:
            n, c = r.get("completed"), r.get("max_concurrency")
            dropped.append(Dropped(name, what, "-", f"could not judge: {n} requests, a quarter under two waves of {c}"))
        elif found is not None and found.disturbed:
            dropped.append(Dropped(name, what, found.quarters_ms(), f"not steady: {found.shift * 100:.1f} % shift"))
        else:
            kept.append(r)
    return kept


def _shape(run_dir: Path) -> Shape:
    cfg = _read_json(run_dir / "config.json", dict)
    facts = facts_from_config(cfg, str(run_dir), local=True)
    plan = run_dir / "plan.json"
    dense = plan.is_file() and '"dense"' in plan.read_text()
    if dense or facts.attention != "msa":
        facts = facts.model_copy(update={"sparse_attention_freq": [0] * (facts.num_layers or 0)})
    return shape_of(facts, "bf16", 2.0)[0]


def load(run_dir: Path, like: RunSet | None = None) -> RunSet:
    """The runs of ``run_dir`` (module docstring); without a ``config.json`` the model of ``like``.

    Raises:
        SystemExit: a missing file, a GPU the peak table does not know, or no valid run.
    """
    gpu_name = _gpu_name(run_dir)
    found = gpu_peak(gpu_name)
    if found is None:
        raise SystemExit(f"{run_dir}: no peaks for GPU {gpu_name!r}")
    if (run_dir / "config.json").is_file():
        shape = _shape(run_dir)
    elif like is not None:
        shape = like.shape
    else:
        raise SystemExit(f"{run_dir}: no config.json, and no earlier run directory of its GPU kind to take it from")
    name = run_dir.name
    points = []
    dropped: list[Dropped] = []
    decode = [run_dir / "bench-decode.json", run_dir / "bench-decode-long.json"]
    for r in [r for f in decode for r in _steady(f, name, dropped)]:
        if r.get("median_tpot_ms"):
            c = int(r.get("max_concurrency") or 1)
            n_in = round(r["total_input_tokens"] / r["completed"])
            n_out = round(r["total_output_tokens"] / r["completed"])
            tpot = r["median_tpot_ms"]
            points.append(Point("decode", c, n_in, n_out, tpot / 1e3, 1e3 / tpot, r["total_token_throughput"], name))
    for r in _steady(run_dir / "bench-prefill.json", name, dropped):
        if r.get("median_ttft_ms"):
            n_in = round(r["total_input_tokens"] / r["completed"])
            points.append(Point("prefill", 1, n_in, 1, r["median_ttft_ms"] / 1e3, run=name))
    floors = _floors(run_dir, dropped)
    if not points and not dropped:
        raise SystemExit(f"{run_dir}: no valid decode or prefill run")
    points = [replace(p, floor_s=host_floor(floors, p.concurrency)) for p in points]
    own = {name: floors} if floors else {}
    return RunSet(name, found[0], found[1], points, shape, (name,), own, dropped=tuple(dropped))


def load_kinds(run_dirs: list[Path]) -> list[RunSet]:
    """The run directories grouped by GPU kind, in the order each kind first appears; a kind's runs are fitted
    together.

    Raises:
        SystemExit: as :func:`load`, or two directories of one kind that served different models.
    """
    kinds: dict[str, RunSet] = {}
    for d in run_dirs:
        rs = load(d, next((k for k in kinds.values() if k.gpu_key == _kind_of(d)), None))
        have = kinds.get(rs.gpu_key)
        if have is None:
            kinds[rs.gpu_key] = replace(rs, name=rs.gpu_key)
            continue
        if have.shape != rs.shape:
            raise SystemExit(f"{d}: serves another model than {', '.join(have.runs)} (same GPU kind {rs.gpu_key})")
        runs = (*have.runs, rs.name)
        floors = {**have.floors, **rs.floors}
        kinds[rs.gpu_key] = replace(
            have,
            name=rs.gpu_key,
            points=have.points + rs.points,
            runs=runs,
            floors=floors,
            dropped=have.dropped + rs.dropped,
        )
    return [_lend_floors(k) for k in kinds.values()]


def _lend_floors(rs: RunSet) -> RunSet:
    """``rs`` with each run that measured no host floor given the floor of the first of its kind's runs that did
    (the same GPU kind's hosts: named in ``floor_from``, so the tables say whose floor a run was priced with)."""
    donor = next((r for r in rs.runs if r in rs.floors), None)
    if donor is None:
        return rs
    lent = {r: donor for r in rs.runs if r not in rs.floors}
    points = [
        replace(p, floor_s=host_floor(rs.floors[donor], p.concurrency)) if p.run in lent else p for p in rs.points
    ]
    return replace(rs, points=points, floor_from=lent)


def _gpu_name(run_dir: Path) -> str:
    """The GPU of ``run_dir`` (its ``gpu.txt``: nvidia-smi's CSV, header then one line per GPU).

    Raises:
        SystemExit: no readable ``gpu.txt`` there.
    """
    try:
        return (run_dir / "gpu.txt").read_text().splitlines()[1].split(",")[0].strip()
    except (OSError, IndexError):
        raise SystemExit(f"{run_dir}: not a run directory (no gpu.txt with a GPU line)") from None


def _kind_of(run_dir: Path) -> str | None:
    found = gpu_peak(_gpu_name(run_dir))
    return found[0] if found else None


def predict(
    rs: RunSet, gpu: GpuPeak, p: Point, hbm: float, compute: float, overhead_ms: float, prefill_ms: float = 0.0
) -> dict:
    """The estimate's figures for point ``p`` of ``rs`` on ``gpu`` at these efficiencies and overheads, with the host
    floor measured on the host that served ``p`` (an input about the host, not a fitted figure)."""
    latency_us = sum(peaks().comm.all_reduce_latency_us.range) / 2
    wl = Workload(concurrency=p.concurrency, input_len=p.input_len, output_len=p.output_len)
    point = (hbm, compute, overhead_ms, prefill_ms, latency_us, 1.0, p.floor_s * 1e3)
    return figures(rs.shape, Layout(tp=1), gpu, "bf16", wl, point)


Eff4 = tuple[float, float, float, float]


def _model_value(rs: RunSet, gpu: GpuPeak, p: Point, eff: Eff4) -> float:
    f = predict(rs, gpu, p, *eff)
    return f["tpot_ms"] / 1e3 if p.kind == "decode" else f["prefill_s"]


def _axis(lo: float, hi: float, step: float) -> list[float]:
    return [round(lo + i * step, 6) for i in range(round((hi - lo) / step) + 1)]


def _search(rs: RunSet, axes: list[list[float]], prefill_axis: list[float]) -> tuple[float, Eff4]:
    """The grid point of ``axes`` (HBM, tensor, step overhead) and the prefill overhead of ``prefill_axis`` with the
    least squared log error. The prefill overhead adds to the prefill times only, so it is a line search on the
    model's prefill times at each grid point (0 when ``rs`` has no prefill run: nothing to fit it on)."""
    decode = [p for p in rs.points if p.kind == "decode"]
    prefill = [p for p in rs.points if p.kind == "prefill"]
    best: tuple[float, Eff4] = (math.inf, (0.0, 0.0, 0.0, 0.0))
    for h, c, o in itertools.product(*axes):
        err = sum(math.log(_model_value(rs, rs.gpu, p, (h, c, o, 0.0)) / p.value) ** 2 for p in decode)
        if err >= best[0]:
            continue
        base = [(_model_value(rs, rs.gpu, p, (h, c, o, 0.0)), p.value) for p in prefill]
        pre_err, po = min(
            ((sum(math.log((b + x / 1e3) / v) ** 2 for b, v in base), x) for x in prefill_axis if base),
            default=(0.0, 0.0),
        )
        if err + pre_err < best[0]:
            best = (err + pre_err, (h, c, o, po))
    return best


def fit(rs: RunSet) -> tuple[Eff4, float]:
    """``((eta_hbm, eta_compute, overhead_ms, prefill_overhead_ms), rms log error)`` minimising the squared log error
    over ``rs``: the :data:`COARSE` and :data:`PREFILL` grids, then a grid ten times finer over one coarse step
    around their best."""
    grids = (*COARSE, PREFILL)
    _, centre = _search(rs, [_axis(*a) for a in COARSE], _axis(*PREFILL))
    fine = [_axis(max(a[0], x - a[2]), min(a[1], x + a[2]), a[2] / 10) for a, x in zip(grids, centre, strict=True)]
    err, eff = _search(rs, fine[:3], fine[3])
    return eff, math.sqrt(err / len(rs.points))


def cross(fitted: RunSet, eff: Eff4, target: RunSet) -> list[dict]:
    """Each level of ``target`` (its runs of one level together) predicted with ``fitted``'s efficiencies on
    ``target``'s GPU, per figure: ``{"level", "figure", "measured": [per run], "predicted", "error", "verdict"}``;
    ``error`` is the largest against any run (signed), ``verdict`` within / outside the target, or could not judge
    (a prefill priced by a fit that had no prefill run)."""
    levels: dict[str, list[Point]] = {}
    for p in target.points:
        levels.setdefault(p.level(), []).append(p)
    rows = []
    order = sorted(levels.items(), key=lambda kv: (kv[1][0].kind != "decode", kv[1][0].concurrency, kv[1][0].input_len))
    for level, pts in order:
        f = predict(target, target.gpu, pts[0], *eff)
        got = {"tok_s_user": f["tok_s_user"], "tok_s_total": f["tok_s_gpu"], "prefill_ms": f["prefill_s"] * 1e3}
        keys = ("tok_s_user", "tok_s_total") if pts[0].kind == "decode" else ("prefill_ms",)
        for key in keys:
            measured = [p.value * 1e3 if key == "prefill_ms" else getattr(p, key) for p in pts]
            error = max((got[key] / m - 1 for m in measured), key=abs)
            if key == "prefill_ms" and not fitted.has_prefill():
                verdict = f"could not judge: no prefill run on {fitted.name}"
            else:
                verdict = "within" if abs(error) <= TARGET else "outside"
            rows.append(
                {
                    "level": level,
                    "figure": key,
                    "measured": measured,
                    "predicted": got[key],
                    "error": error,
                    "verdict": verdict,
                }
            )
    return rows


def _pct(measured: float, predicted: float) -> str:
    return f"{(predicted / measured - 1) * 100:+.1f} %"


def _run_dirs(paths: list[Path]) -> list[Path]:
    """The run directories given, checked before any is read.

    Raises:
        SystemExit: a path that does not exist or is not a directory, or one directory given twice (its runs would
            count twice in the fit).
    """
    seen: dict[Path, Path] = {}
    for p in paths:
        if not p.exists():
            raise SystemExit(f"{p}: does not exist")
        if not p.is_dir():
            raise SystemExit(f"{p}: not a directory (pass run directories)")
        first = seen.setdefault(p.resolve(), p)
        if first is not p:
            raise SystemExit(f"{p}: given twice (also as {first}): each run directory counts once in the fit")
    return paths


#: The parameters fitted per GPU kind (eta HBM, eta compute, step overhead, prefill overhead).
N_PARAMS = 4


def _fittable(sets: list[RunSet]) -> list[RunSet]:
    """``sets`` when each GPU kind has at least as many measured points as the fit has parameters.

    Raises:
        SystemExit: a kind with fewer points (any fit would match them exactly and say nothing).
    """
    for rs in sets:
        if len(rs.points) < N_PARAMS:
            raise SystemExit(
                f"{rs.name} ({', '.join(rs.runs)}): {len(rs.points)} valid point(s), fewer than the {N_PARAMS} "
                "fitted parameters: refusing to fit it (add decode or prefill levels, or more run directories)"
            )
    return sets


def _yaml(sets: list[RunSet], fits: dict[str, tuple[Eff4, float]], dirs: list[Path]) -> None:
    """Prints the fitted inputs of gpu_peaks.yaml's efficiency block (m3ctl/assess/peaks.py's Input): each figure's
    range over the GPU kinds' fits, marked fitted, with the kinds, the concurrency range and the run directories
    ``dirs`` (as given) its points came from. The host floor is measured, not fitted: it keeps its own entry.

    Raises:
        SystemExit: one GPU kind (its fit is a point, not a range, and nothing cross-checked it).
    """
    if len(sets) < 2:
        raise SystemExit(
            f"--yaml: one GPU kind ({sets[0].name}, {len(sets[0].runs)} run directory(ies)) gives one fit, not a "
            "range, and no other kind checked it by cross-prediction: pass run directories of two GPU kinds"
        )
    effs = [fits[rs.name][0] for rs in sets]
    pre = [fits[rs.name][0][3] for rs in sets if rs.has_prefill()] or [0.0]
    ranges = [(min(e[i] for e in effs), max(e[i] for e in effs)) for i in range(3)] + [(min(pre), max(pre))]
    gpus = ", ".join(rs.gpu_key for rs in sets)
    runs = "".join(f"\n      - {d.as_posix()}" for d in dirs)
    print("efficiency:")
    for i, name in enumerate(("hbm", "compute", "step_overhead_ms", "prefill_overhead_ms")):
        cs = [p.concurrency for rs in sets for p in rs.points if i < 3 or p.kind == "prefill"] or [1]
        print(f"  {name}:\n    range: [{ranges[i][0]:g}, {ranges[i][1]:g}]\n    basis: fitted\n    gpus: [{gpus}]")
        print(f"    concurrency: [{min(cs)}, {max(cs)}]\n    runs:{runs}")
        print("    note: >-\n      fitted by benchmarks/estimate_fit.py (docs/results/estimate-fit.md says how well)")


def _own(rs: RunSet, eff: Eff4) -> None:
    print(f"\n{rs.name} at its own fit:\n\n| run | level | measured ms | model ms | host floor ms | error |")
    print("| --- | --- | --- | --- | --- | --- |")
    for p in rs.points:
        m, f = p.value * 1e3, _model_value(rs, rs.gpu, p, eff) * 1e3
        what = f"c={p.concurrency} TPOT" if p.kind == "decode" else "prefill"
        level = f"{what}, {p.input_len:,} in / {p.output_len:,} out"
        print(f"| {p.run} | {level} | {m:.2f} | {f:.2f} | {p.floor_s * 1e3:.2f} | {_pct(m, f)} |")


def _floor_table(sets: list[RunSet]) -> None:
    """The host floors each run was priced with: measured on its own host, lent by another run of its kind, or none."""
    print("\n| GPU | run | host floor (median TPOT of the floor model, ms) | from |\n| --- | --- | --- | --- |")
    for rs in sets:
        for run in rs.runs:
            src = rs.floor_from.get(run, run if run in rs.floors else "")
            measured = ", ".join(f"c={c}: {f * 1e3:.2f}" for c, f in rs.floors.get(src, ()))
            where = "its own host" if src == run else (f"lent by {src}" if src else "none measured (0)")
            print(f"| {rs.name} | {run} | {measured or '-'} | {where} |")


def _invalid(run: dict, name: str, what: str, dropped: list[Dropped]) -> None:
    """A run the bench itself judged invalid, appended to ``dropped`` with the bench's reason (its pace check's
    quarters where that was the reason); one that never completed a request is not listed."""
    if not run.get("completed"):
        return
    v = run.get("validity") or {}
    found = recorded_pace(run) if isinstance(v.get("decode_pace"), dict) else None
    if found is not None and found.disturbed:
        why = f"not steady: {found.shift * 100:.1f} % shift (the bench's verdict)"
        dropped.append(Dropped(name, what, found.quarters_ms(), why))
        return
    reasons = v.get("reasons") or ["invalid"]
    dropped.append(Dropped(name, what, "-", f"the bench's verdict: {reasons[0]}"))


def _dropped_table(sets: list[RunSet]) -> None:
    """The recorded runs left out (:func:`_steady`): judged invalid by the bench, or not shown to decode at one steady
    pace."""
    gone = [d for rs in sets for d in rs.dropped]
    if not gone:
        print("\nNo run left out: every run is valid, and every decode run was shown to decode at one steady pace.")
        return
    print("\nLeft out: judged invalid by the bench, or not shown to decode at one steady pace (m3ctl.loadgen.pace):\n")
    print("| run | runs of | median TPOT by quarter, ms | why |\n| --- | --- | --- | --- |")
    for d in gone:
        print(f"| {d.run} | {d.what} | {d.quarters_ms} | {d.why} |")


def _cross_table(a: RunSet, eff: Eff4, b: RunSet) -> dict[str, list[dict]]:
    """Prints the cross-prediction of ``b`` from ``a``'s fit; returns its rows by figure."""
    print(f"\nFit on {a.name} ({', '.join(a.runs)}), predict {b.name} ({', '.join(b.runs)}):\n")
    print("| level | figure | measured | predicted | error | verdict |\n| --- | --- | --- | --- | --- | --- |")
    by: dict[str, list[dict]] = {k: [] for k, _ in FIGURES}
    label = dict(FIGURES)
    for r in cross(a, eff, b):
        by[r["figure"]].append(r)
        measured = " / ".join(f"{m:,.1f}" for m in r["measured"])
        error = f"{r['error'] * 100:+.1f} %"
        print(
            f"| {r['level']} | {label[r['figure']]} | {measured} | {r['predicted']:,.1f} | {error} | {r['verdict']} |"
        )
    verdicts = []
    for key, name in FIGURES:
        rows = by[key]
        if not rows:
            verdicts.append(f"{name}: could not judge (no run of {b.name} measured it)")
        elif any(r["verdict"].startswith("could not judge") for r in rows):
            verdicts.append(f"{name}: {rows[0]['verdict']}")
        else:
            worst = max((r["error"] for r in rows), key=abs)
            verdict = "within" if abs(worst) <= TARGET else "outside"
            verdicts.append(f"{name}: worst {worst * 100:+.1f} %, {verdict} the {TARGET * 100:.0f} % target")
    print("\n" + "; ".join(verdicts))
    return by


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (module docstring), any number per GPU kind")
    ap.add_argument("--yaml", action="store_true", help="print the fitted efficiency block for gpu_peaks.yaml")
    args = ap.parse_args(argv)
    dirs = _run_dirs(args.runs)
    sets = _fittable(load_kinds(dirs))
    fits = {rs.name: fit(rs) for rs in sets}
    if args.yaml:
        _yaml(sets, fits, dirs)
        return 0
    print("| GPU | runs | eta HBM | eta tensor | step overhead ms | prefill overhead ms | rms log error | points |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for rs in sets:
        (h, c, o, po), rms = fits[rs.name]
        pre = f"{po:.1f}" if rs.has_prefill() else "not fitted (no prefill run)"
        runs = ", ".join(rs.runs)
        print(f"| {rs.name} | {runs} | {h:.2f} | {c:.2f} | {o:.1f} | {pre} | {rms:.3f} | {len(rs.points)} |")
    _floor_table(sets)
    _dropped_table(sets)
    for rs in sets:
        _own(rs, fits[rs.name][0])
    worst = 0.0
    for a, b in itertools.permutations(sets, 2):
        by = _cross_table(a, fits[a.name][0], b)
        worst = max([worst, *(abs(r["error"]) for k in ("tok_s_user", "tok_s_total") for r in by[k])])
    if len(sets) > 1:
        verdict = "within" if worst <= TARGET else "outside"
        print(f"\nworst decode cross-prediction error {worst * 100:.1f} %: {verdict} the {TARGET * 100:.0f} % target")
    else:
        print(f"\ncross-prediction: could not judge (one GPU kind, {sets[0].name}: no other kind's fit to predict it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
