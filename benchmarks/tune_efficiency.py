"""How much of the grid optimum ``m3ctl tune``'s search reaches, and at what fraction of the grid's cost.

Two steps:

    # once (about 20-30 min on 2 cores): measure the whole grid on the real vLLM CPU server
    python benchmarks/tune_efficiency.py --record tests/fixtures/tune_grid_cpu.json
    # any time (seconds, no server): run the search with many seeds against the recorded results
    python benchmarks/tune_efficiency.py --grid tests/fixtures/tune_grid_cpu.json --seeds 50

Grid optimum: for every configuration, the best objective over the ladder concurrencies that meet the
SLO (the value a brute-force sweep would find). Grid cost: every server start plus every run duration.
Search cost: the starts and runs the search actually made (replayed with their recorded durations).
Target (issue 6): median over seeds >= 97 % of the optimum at <= 25 % of the cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

SLO = "p90_tpot_ms<=60,p90_ttft_ms<=1500"
LADDER = [1, 2, 4, 8, 16]
KNOBS = ["spec_depth=0-4", "max_num_seqs=4,16", "max_num_batched_tokens=256,2048"]
BENCH = {"input_len": 128, "output_len": 32, "seed": 0, "num_warmups": 1}


def record(out: Path, model: str | None) -> None:
    from m3ctl.dev.tiny_model import build_tiny_model
    from m3ctl.errors import ConfigRejected, LaunchFailed
    from m3ctl.hw.detect import detect
    from m3ctl.catalog import profile_for_arch
    from m3ctl.tune.search import TuneSpec
    from m3ctl.tune.server import ServerEvaluator
    from m3ctl.tune.space import apply_pins, default_space

    inv = detect()
    model = model or str(build_tiny_model(Path("/tmp/m3ctl-tune-grid-model")))
    space = apply_pins(default_space(profile_for_arch(inv.arch), len(inv.gpus)), KNOBS)
    spec = TuneSpec(slo=SLO, ladder=LADDER, prompts_per_concurrency=4, min_prompts=8)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    work = Path("/tmp/m3ctl-tune-grid-record")
    work.mkdir(exist_ok=True)
    ev = ServerEvaluator(inv, model, work, spec, plan_base={}, bench=BENCH, port=port, name_prefix="tunegrid",
                         space=space)
    grid = {"meta": {"slo": SLO, "knobs": KNOBS, "bench": BENCH, "host_cpus": __import__("os").cpu_count(),
                     "model": "m3ctl dev tiny-model (MiniMax-M2 tiny)", "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "objective": "tput_per_gpu", "prompts_per_concurrency": 4, "min_prompts": 8},
            "ladder": LADDER, "space": space.to_json(), "configs": []}
    keep = ("duration", "completed", "failed", "output_throughput", "total_token_throughput", "validity",
            *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p90", "p99")))
    for i, cand in enumerate(space.grid()):
        rec = {"config": cand, "status": "ok", "points": {}}
        try:
            ev.check(cand)
            t0 = time.monotonic()
            sess = ev.open(cand, i, lambda m: None)
            rec["start_s"] = sess.start_s
            try:
                for c in LADDER:
                    r = sess.measure(c, 1.0)
                    rec["points"][str(c)] = {k: r.get(k) for k in keep}
                    rec["points"][str(c)]["validity"] = {"valid": r["validity"]["valid"], "reasons": r["validity"]["reasons"]}
            finally:
                sess.close()
        except ConfigRejected as e:
            rec.update(status="rejected", reason=e.message)
        except LaunchFailed as e:
            rec.update(status="crashed", reason=e.message, start_s=time.monotonic() - t0)
        grid["configs"].append(rec)
        out.write_text(json.dumps(grid, indent=1))
        best = max((p["total_token_throughput"] for p in rec["points"].values()), default=0)
        print(f"[{i + 1}/{len(space.grid())}] {cand} {rec['status']} start {rec.get('start_s', 0):.0f}s "
              f"max tput {best:.0f}", flush=True)


def grid_truth(grid: dict, slo_text: str) -> tuple[float, float, dict]:
    from m3ctl.tune.slo import parse_slo

    slo = parse_slo(slo_text)
    best, best_cfg, cost = 0.0, None, 0.0
    for rec in grid["configs"]:
        if rec["status"] == "rejected":
            continue
        cost += float(rec.get("start_s", 0.0))
        for p in rec["points"].values():
            cost += float(p.get("duration") or 0.0)
            if p["validity"]["valid"] and slo.ok(p) and p["total_token_throughput"] > best:
                best, best_cfg = p["total_token_throughput"], rec["config"]
    return best, cost, best_cfg


def replay(path: Path, seeds: int, max_trials: int, confirm_top: int, slo: str) -> int:
    from m3ctl.tune.replay import ReplayEvaluator, recorded_space
    from m3ctl.tune.search import TuneSpec, Tuner
    from m3ctl.tune.space import key_of

    grid = json.loads(path.read_text())
    space = recorded_space(grid)
    keys = {key_of(c) for c in space.grid()}
    grid["configs"] = [c for c in grid["configs"] if key_of(c["config"]) in keys]
    opt, gcost, gbest = grid_truth(grid, slo)
    print(f"grid: {len(grid['configs'])} configurations x ladder {grid['ladder']}; optimum {opt:.1f} tok/s/GPU "
          f"at {gbest}; grid cost {gcost:.0f} s")
    fr_opt, fr_cost, starts = [], [], []
    for seed in range(seeds):
        ev = ReplayEvaluator(grid)
        spec = TuneSpec(slo=slo, ladder=grid["ladder"], max_trials=max_trials, seed=seed, confirm_top=confirm_top)
        res = Tuner(space, ev, spec).run(clock=lambda: ev.clock[0])
        got = res.best.final if res.best else 0.0
        fr_opt.append(got / opt)
        fr_cost.append(res.cost_s / gcost)
        starts.append(ev.opened)
    med_o, med_c = statistics.median(fr_opt), statistics.median(fr_cost)
    print(f"search: max_trials={max_trials} confirm_top={confirm_top} seeds={seeds}")
    print(f"  fraction of optimum: median {med_o:.3f}  min {min(fr_opt):.3f}  p10 "
          f"{sorted(fr_opt)[len(fr_opt) // 10]:.3f}")
    print(f"  fraction of grid cost: median {med_c:.3f}  max {max(fr_cost):.3f}")
    print(f"  server starts: median {statistics.median(starts):.0f} of {len(grid['configs'])} (grid)")
    ok = med_o >= 0.97 and med_c <= 0.25
    print(f"target (>= 0.97 of optimum at <= 0.25 of cost, medians): {'MET' if ok else 'NOT MET'}")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", type=Path, help="measure the grid on the real CPU server and write it here")
    ap.add_argument("--model", help="local model dir for --record (default: a fresh tiny model)")
    ap.add_argument("--grid", type=Path, default=Path(__file__).parent.parent / "tests/fixtures/tune_grid_cpu.json")
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--max-trials", type=int, default=4)
    ap.add_argument("--confirm-top", type=int, default=0)
    ap.add_argument("--slo", default=None, help="SLO for the replay (default: the recorded one)")
    a = ap.parse_args()
    if a.record:
        record(a.record, a.model)
        return 0
    grid = json.loads(a.grid.read_text())
    return replay(a.grid, a.seeds, a.max_trials, a.confirm_top, a.slo or grid["meta"]["slo"])


if __name__ == "__main__":
    sys.exit(main())
