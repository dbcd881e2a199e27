"""Issue #15 item 5 on the H200: the tune of the scale model against a clean grid of the same configurations.

Reads the recorded evidence (tests/fixtures/h200x1-real/scale/, made by scripts/gpu/h200_scale.sh on one H200
with vLLM 0.26.0: MiniMax-M2-shaped scale model, 16 of 62 layers, FP8, dummy weights, 4096 in / 256 out, fresh
prompts at every run, a warm-up per load level) and prints:

- the clean grid: per configuration and concurrency, p90 TPOT, total tok/s per GPU, prefix-cache hit rate;
  each configuration's capacity under the SLO (largest measured concurrency meeting it; every run at that
  concurrency must meet it) and the objective there;
- the tune's own measurements (trials, the concurrencies its bisection visited);
- the ratios issue #15 asks for: the tune's reported capacity and objective for its choice over the grid's,
  and its choice's objective over the grid's best.

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

from m3ctl.tune.slo import objective_value, parse_slo  # noqa: E402

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
        name, c = f.stem[len("grid-"):].rsplit("-c", 1)
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
        rows[name] = {"capacity": cap, "objective": obj, "levels": {
            c: [{"p90_tpot_ms": round(r["p90_tpot_ms"], 1),
                 "tput_per_gpu": round(objective_value(r, "tput_per_gpu", 1, None)),
                 "prefix_cache_hit_rate": (r.get("server_metrics") or {}).get("prefix_cache_hit_rate")}
                for r in rs] for c, rs in sorted(runs.items())}}
    best = res["best"]
    chosen = next((n for n, k in GRID_CONFIGS.items()
                   if all(best["config"].get(x) == v for x, v in k.items())), None)
    g_best = max((r for r in rows.values() if r["objective"]), key=lambda r: r["objective"], default=None)
    ratios = {}
    if chosen and rows.get(chosen, {}).get("capacity"):
        ratios["tune_capacity_over_grid"] = best["concurrency"] / rows[chosen]["capacity"]
        ratios["tune_objective_over_grid_same_config"] = best["objective"] / rows[chosen]["objective"]
    if g_best:
        ratios["grid_choice_over_grid_best"] = (rows[chosen]["objective"] / g_best["objective"]
                                                if chosen and rows[chosen]["objective"] else None)
    return {"slo": slo_text, "grid": rows, "tune_chosen": chosen, "tune_best": best,
            "tune_trials": {t: {"config": v["config"], "levels": {
                c: [{"p90_tpot_ms": round(r["p90_tpot_ms"], 1),
                     "tput_per_gpu": round(objective_value(r, "tput_per_gpu", 1, None)),
                     "prefix_cache_hit_rate": (r.get("server_metrics") or {}).get("prefix_cache_hit_rate")}
                    for r in rs] for c, rs in sorted(v["runs"].items())}} for t, v in tune.items()},
            "launches": res.get("launches"), "interrupted_launches": res.get("interrupted_launches"),
            "ratios": ratios}


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
        cells = "  ".join(f"c{c}: " + ",".join(f"{r['p90_tpot_ms']}/{r['tput_per_gpu']}/{r['prefix_cache_hit_rate']}"
                                               for r in rs) for c, rs in row["levels"].items())
        print(f"  {name:9s} capacity c={row['capacity']} obj={row['objective'] and round(row['objective'])}\n    {cells}")
    print("\ntune trials (bisection levels): c: p90 TPOT ms / tok/s per GPU / prefix-cache hits")
    for t, v in rep["tune_trials"].items():
        k = v["config"]
        cells = "  ".join(f"c{c}: " + ",".join(f"{r['p90_tpot_ms']}/{r['tput_per_gpu']}/{r['prefix_cache_hit_rate']}"
                                               for r in rs) for c, rs in v["levels"].items()) or "(interrupted)"
        print(f"  {t}: k={k['spec_depth']} seqs={k['max_num_seqs']} mbt={k['max_num_batched_tokens']} "
              f"kv={k['kv_cache_dtype']}  {cells}")
    b = rep["tune_best"]
    print(f"\ntune chose {rep['tune_chosen']} at c={b['concurrency']}, {round(b['objective'])} tok/s per GPU; "
          f"launches {rep['launches']}, interrupted {list((rep['interrupted_launches'] or {}))}")
    for k, v in rep["ratios"].items():
        print(f"  {k}: {v:.3f}" if v is not None else f"  {k}: n/a")


if __name__ == "__main__":
    main()
