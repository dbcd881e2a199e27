"""On the H200 (docs/results/h200-scale.md): the tune of the scale model against a clean grid of the same configurations.

Reads the recorded evidence (tests/fixtures/h200x1-real/scale/, made by scripts/gpu/h200_scale.sh on one H200
with vLLM 0.26.0: MiniMax-M2-shaped scale model, 16 of 62 layers, FP8, dummy weights, 4096 in / 256 out, fresh
prompts at every run, a warm-up per load level) and prints:

- the clean grid: per configuration and concurrency, p90 TPOT, total tok/s per GPU, prefix-cache hit rate;
  each configuration's capacity under the SLO (largest measured concurrency meeting it; every run at that
  concurrency must meet it) and the objective there;
- the tune's own measurements (trials, the concurrencies its bisection visited);
- the ratios the tune is judged by: the tune's reported capacity and objective for its choice over the grid's,
  and its choice's objective over the grid's best;
- the capacity rule (m3ctl/loadgen/capacity.py, through m3ctl/tuning/search.py ``measure_level``) replayed on these runs: each
  tuned configuration's bisection from where the tune started it, the n-th run at a level answered by the n-th
  recorded run there (the tune's own run first, then the grid's in recording order; the repeats of the rule
  would run on the tune's server, so the grid runs stand in for them, from other fresh servers). A level that
  would need more runs than were recorded is reported as such.

    python benchmarks/scale_evidence.py [--slo "p90_tpot_ms<=30"] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from m3ctl.loadgen.slo import objective_value, parse_slo

EVIDENCE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "h200x1-real" / "scale"

#: Grid configuration name -> the tune's configuration (knob values), as scripts/gpu/h200_scale.sh launched them.
GRID_CONFIGS = {
    "defaults": dict(spec_depth=0, max_num_seqs=1024, max_num_batched_tokens=8192, kv_cache_dtype="default"),
    "mbt2048": dict(spec_depth=0, max_num_seqs=1024, max_num_batched_tokens=2048, kv_cache_dtype="default"),
    "seqs128": dict(spec_depth=0, max_num_seqs=128, max_num_batched_tokens=8192, kv_cache_dtype="default"),
}


def _one(path: Path) -> dict:
    d = json.loads(path.read_text())
    return d[0] if isinstance(d, list) else d


def grid_runs(root: Path = EVIDENCE) -> dict[str, dict[int, list[dict]]]:
    """{config name: {concurrency: [bench results]}} from every grid-*/grid-NAME-cN.json."""
    out: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for f in sorted(root.glob("grid-*/grid-*-c*.json")):
        name, c = f.stem[len("grid-") :].rsplit("-c", 1)
        out[name][int(c)].append(_one(f))
    return out


def tune_runs(root: Path = EVIDENCE) -> dict[int, dict]:
    """{trial: {"config": knobs, "runs": {concurrency: [bench results]}}} from the study's trial folders."""
    out = {}
    for t in sorted((root / "study" / "trials").iterdir()):
        cfg = json.loads((t / "config.json").read_text())["config"]
        runs: dict[int, list[dict]] = defaultdict(list)
        for f in sorted(t.glob("bench-c*-x*.json")):
            runs[int(f.stem.split("-")[1][1:])].append(_one(f))
        out[int(t.name)] = {"config": cfg, "runs": dict(runs)}
    return out


def capacity(runs: dict[int, list[dict]], slo_text: str) -> tuple[int | None, float | None]:
    """Largest concurrency whose every run meets the SLO and every lower measured one too (a closed-loop
    capacity), and the median objective (total tok/s per GPU) of the runs there."""
    slo = parse_slo(slo_text)
    best = None
    for c in sorted(runs):
        if all(slo.ok(r) for r in runs[c]):
            best = c
        else:
            break
    if best is None:
        return None, None
    return best, statistics.median(objective_value(r, "tput_per_gpu", 1, None) for r in runs[best])


def report(slo_text: str, root: Path = EVIDENCE) -> dict:
    grid, tune = grid_runs(root), tune_runs(root)
    res = json.loads((root / "study" / "result.json").read_text())
    rows = {}
    for name, runs in grid.items():
        cap, obj = capacity(runs, slo_text)
        rows[name] = {
            "capacity": cap,
            "objective": obj,
            "levels": {
                c: [
                    {
                        "p90_tpot_ms": round(r["p90_tpot_ms"], 1),
                        "tput_per_gpu": round(objective_value(r, "tput_per_gpu", 1, None)),
                        "prefix_cache_hit_rate": (r.get("server_metrics") or {}).get("prefix_cache_hit_rate"),
                    }
                    for r in rs
                ]
                for c, rs in sorted(runs.items())
            },
        }
    best = res["best"]
    chosen = next((n for n, k in GRID_CONFIGS.items() if all(best["config"].get(x) == v for x, v in k.items())), None)
    g_best = max((r for r in rows.values() if r["objective"]), key=lambda r: r["objective"], default=None)
    ratios = {}
    if chosen and rows.get(chosen, {}).get("capacity"):
        ratios["tune_capacity_over_grid"] = best["concurrency"] / rows[chosen]["capacity"]
        ratios["tune_objective_over_grid_same_config"] = best["objective"] / rows[chosen]["objective"]
    if g_best:
        ratios["grid_choice_over_grid_best"] = (
            rows[chosen]["objective"] / g_best["objective"] if chosen and rows[chosen]["objective"] else None
        )
    return {
        "slo": slo_text,
        "grid": rows,
        "tune_chosen": chosen,
        "tune_best": best,
        "tune_trials": {
            t: {
                "config": v["config"],
                "levels": {
                    c: [
                        {
                            "p90_tpot_ms": round(r["p90_tpot_ms"], 1),
                            "tput_per_gpu": round(objective_value(r, "tput_per_gpu", 1, None)),
                            "prefix_cache_hit_rate": (r.get("server_metrics") or {}).get("prefix_cache_hit_rate"),
                        }
                        for r in rs
                    ]
                    for c, rs in sorted(v["runs"].items())
                },
            }
            for t, v in tune.items()
        },
        "launches": res.get("launches"),
        "interrupted_launches": res.get("interrupted_launches"),
        "ratios": ratios,
    }


class _NotRecorded(Exception):
    pass


class _RecordedRuns:
    """A tune session answering the n-th run at a concurrency with the n-th recorded result there."""

    start_s = 0.0

    def __init__(self, runs: dict[int, list[dict]]):
        self.runs, self.made = runs, defaultdict(int)

    def measure(self, c: int, fidelity: float) -> dict:
        n = self.made[c]
        if n >= len(self.runs.get(c, [])):
            raise _NotRecorded(f"c={c} needs run {n + 1}; {len(self.runs.get(c, []))} recorded")
        self.made[c] += 1
        return self.runs[c][n]

    def close(self) -> None:
        pass


def replay_with_repeats(slo_text: str, root: Path = EVIDENCE) -> dict:
    """The capacity rule (TuneSpec defaults) replayed per tuned configuration that the grid also measured:
    {config name: {"start", "levels" {c: {"p90_tpot_ms": [runs], "median", "slo_ok", "objective"}},
    "capacity", "objective", "spread" (m3ctl.tuning.search.level_spread), "needs_more_runs" (why, or None)}}."""
    from m3ctl.tuning.search import TuneSpec, bisect_concurrency, level_spread

    grid, tune = grid_runs(root), tune_runs(root)
    res = json.loads((root / "study" / "result.json").read_text())
    settings = json.loads((root / "study" / "tune.json").read_text())
    first = {t["trial"]: t["points"][0]["concurrency"] for t in res["trials"] if t.get("points")}
    spec = TuneSpec(slo=slo_text, ladder=settings["spec"]["ladder"])
    slo = parse_slo(slo_text)
    out = {}
    for t, v in tune.items():
        name = next((n for n, k in GRID_CONFIGS.items() if all(v["config"].get(x) == y for x, y in k.items())), None)
        if name is None or name not in grid or not v["runs"]:
            continue
        runs = {c: [*v["runs"].get(c, []), *grid[name].get(c, [])] for c in {*v["runs"], *grid[name]}}
        done: list = []
        row: dict = {"trial": t, "start": first.get(t), "needs_more_runs": None}
        try:
            bisect_concurrency(
                _RecordedRuns(runs),
                spec,
                slo,
                1,
                lambda m: None,
                first.get(t),
                on_point=lambda pts: done.__setitem__(slice(None), pts),
            )
        except _NotRecorded as e:
            row["needs_more_runs"] = str(e)
        pts = done
        row["levels"] = {
            p.concurrency: {
                "p90_tpot_ms": [round(r["metrics"]["p90_tpot_ms"], 1) for r in p.runs]
                or [round(p.metrics["p90_tpot_ms"], 1)],
                "median": round(p.metrics["p90_tpot_ms"], 1),
                "slo_ok": p.slo_ok,
                "objective": round(p.objective),
                "partial": row["needs_more_runs"] is not None and p is pts[-1],
            }
            for p in pts
        }
        ok = [p for p in pts if p.slo_ok]
        cap = max((p.concurrency for p in ok), default=None) if row["needs_more_runs"] is None else None
        row["capacity"] = cap
        row["objective"] = round(max(p.objective for p in ok if p.concurrency == cap)) if cap else None
        row["spread"] = level_spread(slo, pts, cap) if cap else None
        out[name] = row
    return out


# ---------------------------------------------------------------- study 2 (session 7, nvidia-h200-x2)
#: The second study (tests/fixtures/h200x1-real/scale2/): `h200_scale.sh pair` on an nvidia-h200-x2, the tune
#: on GPU 0 and the clean grid (scripts/gpu/scale_grid.py) on GPU 1 at the same time; baseline on, boundary
#: repeats (10 %, 2 more), --confirm-top 1, --prompts-per-concurrency 2, ladder 16..128 (grid: 48, 64, 96, 128).
EVIDENCE2 = EVIDENCE.parent / "scale2"
GRID2_CONFIGS = {
    **GRID_CONFIGS,
    "spec3": dict(spec_depth=3, max_num_seqs=1024, max_num_batched_tokens=8192, kv_cache_dtype="default"),
    "kvfp8": dict(spec_depth=0, max_num_seqs=1024, max_num_batched_tokens=8192, kv_cache_dtype="fp8"),
}


def grid2_runs(root: Path = EVIDENCE2) -> dict[str, dict[int, list[dict]]]:
    """{config name: {concurrency: [bench results in the order they ran]}} from the grid's raw bench JSONs."""
    runs: dict[str, dict[int, list[tuple[int, dict]]]] = defaultdict(lambda: defaultdict(list))
    for f in sorted((root / "grid").glob("grid-*-c*-r*.json")):
        name, c, k = f.stem[len("grid-") :].rsplit("-", 2)
        runs[name][int(c[1:])].append((int(k[1:]), _one(f)))
    return {n: {c: [r for _, r in sorted(rs, key=lambda kr: kr[0])] for c, rs in lv.items()} for n, lv in runs.items()}


def grid2_from_runs(slo_text: str, root: Path = EVIDENCE2) -> dict[str, dict]:
    """The clean grid recomputed from its raw bench JSONs (not from grid.json): per configuration and level the
    p90 TPOT and tok/s per GPU of every run, the median, the capacity rule's verdict (m3ctl.loadgen.capacity.decide
    with its defaults, the tune's: ``state``, ``confidence``; ``slo_ok``: it holds) and the plain median's
    (``median_slo_ok``: the rule grid.json was written with on the GPU), the capacity (levels upwards until the
    first that does not hold) and the median objective there."""
    from m3ctl.loadgen.capacity import decide

    slo = parse_slo(slo_text)
    out = {}
    for name, levels in grid2_runs(root).items():
        cap, obj, rows = None, None, {}
        for c in sorted(levels):
            rs = levels[c]
            med = statistics.median(r["p90_tpot_ms"] for r in rs)
            v = decide(rs, slo)
            rows[c] = {
                "p90_tpot_ms": [round(r["p90_tpot_ms"], 1) for r in rs],
                "median_p90_tpot_ms": round(med, 2),
                "tput_per_gpu": [round(objective_value(r, "tput_per_gpu", 1, None)) for r in rs],
                "prefix_cache_hit_rate": [r["server_metrics"]["prefix_cache_hit_rate"] for r in rs],
                "slo_ok": v.holds,
                "state": v.state,
                "confidence": v.confidence,
                "median_slo_ok": slo.ok({"p90_tpot_ms": med}),
            }
            if not v.holds:
                break
            cap, obj = c, statistics.median(objective_value(r, "tput_per_gpu", 1, None) for r in rs)
        out[name] = {"levels": rows, "capacity": cap, "objective": obj}
    return out


def study2_report(slo_text: str = "p90_tpot_ms<=30", root: Path = EVIDENCE2) -> dict:
    """Tune (result.json) against the clean grid, per configuration: capacity concurrency and objective on
    both sides and their ratios (tune / grid); the tune's choice against the grid's best."""
    res = json.loads((root / "study" / "result.json").read_text())
    grid = grid2_from_runs(slo_text, root)
    name_of = {json.dumps(v, sort_keys=True): k for k, v in GRID2_CONFIGS.items()}

    def name(cfg: dict) -> str:
        return name_of.get(json.dumps({k: cfg[k] for k in GRID_CONFIGS["defaults"]}, sort_keys=True), "?")

    rows = {}
    for t in res["trials"]:
        n = name(t["config"])
        final = t["objective"] if t.get("confirmed") is None else min(t["objective"], t["confirmed"])
        g = grid.get(n, {})
        rows[n] = {
            "trial": t["trial"],
            "tune_capacity": t["concurrency"],
            "tune_objective": final,
            "confirmed": t.get("confirmed"),
            "same_server_as": t.get("same_server_as"),
            "grid_capacity": g.get("capacity"),
            "grid_objective": g.get("objective"),
            "capacity_ratio": (t["concurrency"] / g["capacity"]) if g.get("capacity") else None,
            "objective_ratio": (final / g["objective"]) if g.get("objective") else None,
        }
    chosen = name(res["best"]["config"])
    measured = {k: v for k, v in grid.items() if v["objective"] is not None}
    grid_best = max(measured, key=lambda k: measured[k]["objective"])
    return {
        "slo": slo_text,
        "grid": grid,
        "rows": rows,
        "tune_chosen": chosen,
        "grid_best": grid_best,
        "choice_vs_grid_best": measured[chosen]["objective"] / measured[grid_best]["objective"]
        if chosen in measured
        else None,
        "stopped_by": res["stopped_by"],
        "launches": res["launches"],
        "elapsed_s": res["elapsed_s"],
    }


def print_study2(slo_text: str) -> None:
    rep = study2_report(slo_text)
    print(
        f"\nstudy 2 (tests/fixtures/h200x1-real/scale2): SLO {rep['slo']}; tune {rep['launches']} starts "
        f"({rep['stopped_by']}), {rep['elapsed_s']:.0f} s wall"
    )
    print("clean grid, from the raw runs: c: p90 TPOT ms of each run -> the capacity rule's verdict")
    for n, g in rep["grid"].items():
        lv = "  ".join(
            f"c{c}: {'/'.join(map(str, x['p90_tpot_ms']))} {'ok' if x['slo_ok'] else 'miss'}"
            for c, x in g["levels"].items()
        )
        print(f"  {n:9s} {lv}")
    print(
        f"  {'config':9s} {'tune c':>6s} {'tune tok/s':>10s} {'grid c':>6s} {'grid tok/s':>10s} {'c ratio':>7s} "
        f"{'tok/s ratio':>11s}"
    )
    for n, r in rep["rows"].items():

        def f(x, spec):
            return format(x, spec) if x is not None else "n/a"

        print(
            f"  {n:9s} {f(r['tune_capacity'], '6d')} {f(r['tune_objective'], '10.0f')} "
            f"{f(r['grid_capacity'], '6d')} {f(r['grid_objective'], '10.0f')} {f(r['capacity_ratio'], '7.2f')} "
            f"{f(r['objective_ratio'], '11.3f')}" + (" (confirmed)" if r["confirmed"] is not None else "")
        )
    print(
        f"  tune chose {rep['tune_chosen']}; grid best {rep['grid_best']}; grid objective of the choice / grid best "
        f"= {rep['choice_vs_grid_best']:.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slo", default="p90_tpot_ms<=30")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rep = report(a.slo)
    if a.json:
        print(json.dumps(rep, indent=1, default=str))
        return
    print(f"SLO {rep['slo']}; objective total tok/s per GPU; one H200, scale model (16 layers, FP8), 4096/256")
    print("\nclean grid (fresh prompts, warm-up per level): c: p90 TPOT ms / tok/s per GPU / prefix-cache hits")
    for name, row in rep["grid"].items():
        cells = "  ".join(
            f"c{c}: " + ",".join(f"{r['p90_tpot_ms']}/{r['tput_per_gpu']}/{r['prefix_cache_hit_rate']}" for r in rs)
            for c, rs in row["levels"].items()
        )
        print(
            f"  {name:9s} capacity c={row['capacity']} obj={row['objective'] and round(row['objective'])}\n    {cells}"
        )
    print("\ntune trials (bisection levels): c: p90 TPOT ms / tok/s per GPU / prefix-cache hits")
    for t, v in rep["tune_trials"].items():
        k = v["config"]
        cells = (
            "  ".join(
                f"c{c}: " + ",".join(f"{r['p90_tpot_ms']}/{r['tput_per_gpu']}/{r['prefix_cache_hit_rate']}" for r in rs)
                for c, rs in v["levels"].items()
            )
            or "(interrupted)"
        )
        print(
            f"  {t}: k={k['spec_depth']} seqs={k['max_num_seqs']} mbt={k['max_num_batched_tokens']} "
            f"kv={k['kv_cache_dtype']}  {cells}"
        )
    b = rep["tune_best"]
    print(
        f"\ntune chose {rep['tune_chosen']} at c={b['concurrency']}, {round(b['objective'])} tok/s per GPU; "
        f"launches {rep['launches']}, interrupted {list(rep['interrupted_launches'] or {})}"
    )
    for k, v in rep["ratios"].items():
        print(f"  {k}: {v:.3f}" if v is not None else f"  {k}: n/a")
    print(
        "\nthe capacity rule (m3ctl/loadgen/capacity.py: runs within 10 % of the bound repeated, up to 2 more; the "
        "median of 3 meets and no run misses by more than 10 %), replayed on the recorded runs: c: p90 TPOT ms "
        "of each run -> median"
    )
    for name, row in replay_with_repeats(a.slo).items():
        lv = "  ".join(
            f"c{c}: {'/'.join(map(str, x['p90_tpot_ms']))} -> {x['median']} "
            + ("partial" if x["partial"] else "ok" if x["slo_ok"] else "miss")
            for c, x in row["levels"].items()
        )
        sp = row["spread"]
        tail = (
            f"capacity c={row['capacity']} from {sp['runs']} run(s), p90 TPOT {sp['min']:.1f}-{sp['max']:.1f} ms, "
            f"{row['objective']} tok/s per GPU"
            if row["capacity"]
            else f"undecided: {row['needs_more_runs']}"
        )
        print(f"  {name:9s} {lv}\n    {tail}")
    print_study2(a.slo)


if __name__ == "__main__":
    main()
