"""Does the tuned configuration beat vLLM's defaults on the objective, same workload, same SLO?

    # 1. tune (real CPU server), e.g.
    m3ctl tune --model DIR --study-dir /tmp/study --knob spec_depth=0-4 --knob max_num_seqs=4,8,16 \
        --knob max_num_batched_tokens=256,512,2048 --slo "p90_tpot_ms<=60,p90_ttft_ms<=1500" \
        --ladder 1,2,4,8,16 --input-len 128 --output-len 32 --max-trials 6
    # 2. measure both back to back (one server at a time), alternating, --repeats times each
    python benchmarks/tune_vs_defaults.py --study /tmp/study --repeats 2

"Defaults" = the catalog profile alone (no max-num-seqs, max-num-batched-tokens or speculative flags:
vLLM picks its own). Each measurement is one server start plus the same concurrency bisection against
the study's SLO (m3ctl.tune.search.evaluate), so both sides get their best SLO-meeting load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()

    from m3ctl.hw.detect import detect
    from m3ctl.tune.search import TuneSpec, evaluate
    from m3ctl.tune.server import ServerEvaluator
    from m3ctl.tune.slo import parse_slo
    from m3ctl.tune.space import Space
    from m3ctl.tune.study import load_settings

    settings = load_settings(a.study)
    best = json.loads((a.study / "result.json").read_text())["best"]
    spec = TuneSpec(**{**settings["spec"], "confirm_top": 0})
    slo = parse_slo(spec.slo)
    space = Space.from_json(settings["space"])
    work = Path("/tmp/m3ctl-tune-vs-defaults")
    work.mkdir(exist_ok=True)
    ev = ServerEvaluator(detect(), settings["model"], work, spec, plan_base=settings.get("plan_base", {}),
                         bench=settings.get("bench", {}), port=settings["port"], name_prefix="tunevsdef", space=space)
    defaults = {k: v for k, v in best["config"].items() if k in ("tp", "dp")}
    print(f"SLO {slo}; objective {spec.objective}; ladder {spec.ladder}")
    print(f"tuned: {best['command']}")
    print(f"defaults: {ev.plan(defaults, name='m3ctl').command_line()}")
    got: dict[str, list[float]] = {"defaults": [], "tuned": []}
    n = 0
    for r in range(a.repeats):
        for label, cand in (("defaults", defaults), ("tuned", best["config"])):
            out = evaluate(ev, cand, spec, slo, 1000 + n, lambda m: None)
            n += 1
            got[label].append(out.objective)
            pts = ", ".join(f"c={p.concurrency}:{p.objective:.0f}" + ("" if p.slo_ok else " (SLO miss)")
                            for p in out.points)
            print(f"  run {r + 1} {label:8s}: {out.status:14s} {out.objective:8.1f} at c={out.concurrency} ({pts})",
                  flush=True)
    d, t = statistics.median(got["defaults"]), statistics.median(got["tuned"])
    print(f"median {spec.objective}: defaults {d:.1f}, tuned {t:.1f}, ratio {t / d if d else float('inf'):.2f}x")
    return 0 if t > d else 1


if __name__ == "__main__":
    sys.exit(main())
