"""Does the tuned configuration beat vLLM's defaults on the objective, same workload, same SLO?

    # 1. tune (real CPU server), e.g.
    m3ctl tune --model DIR --study-dir /tmp/study --knob spec_depth=0-4 --knob max_num_seqs=4,8,16 \
        --knob max_num_batched_tokens=256,512,2048 --slo "p90_tpot_ms<=60,p90_ttft_ms<=1500" \
        --ladder 1,2,4,8,16 --input-len 128 --output-len 32 --max-trials 6
    # 2. measure both back to back (one server at a time), alternating, --repeats times each
    python benchmarks/tune_vs_defaults.py --study /tmp/study --repeats 2

"Defaults" = the study's baseline configuration (m3ctl.tuning.server.ServerEvaluator.baseline_candidate: the
catalog profile with none of the tuned knobs' flags, so vLLM picks max-num-seqs, max-num-batched-tokens and no
speculation itself; the smallest TP the planner accepts). Each measurement is one fresh server start plus the
same concurrency search against the study's SLO (m3ctl.tuning.search.evaluate, cold bisection so neither side
gets a warm-start advantage), so both sides get their best SLO-meeting load. Runs alternate defaults/tuned so
slow drifts of the host hit both. Reports every repeat, the mean, the spread (sample standard deviation and
range) and whether the difference of the means exceeds the sum of the two spreads. Run it on a quiet host
(check `uptime`; no other `vllm serve`).
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
    from m3ctl.loadgen.slo import parse_slo
    from m3ctl.tuning.search import TuneSpec, evaluate
    from m3ctl.tuning.server import ServerEvaluator
    from m3ctl.tuning.space import Space
    from m3ctl.tuning.study import load_settings

    settings = load_settings(a.study)
    best = json.loads((a.study / "result.json").read_text())["best"]
    spec = TuneSpec(**{**settings["spec"], "confirm_top": 0, "warm_start": False})
    slo = parse_slo(spec.slo)
    space = Space.from_json(settings["space"])
    work = Path("/tmp/m3ctl-tune-vs-defaults")
    work.mkdir(exist_ok=True)
    ev = ServerEvaluator(
        detect(),
        settings["model"],
        work,
        spec,
        plan_base=settings.get("plan_base", {}),
        bench=settings.get("bench", {}),
        port=settings["port"],
        name_prefix="tunevsdef",
        space=space,
    )
    defaults, why = ev.baseline_candidate()
    if defaults is None:
        print(f"no defaults configuration: {why}")
        return 2
    print(f"SLO {slo}; objective {spec.objective}; ladder {spec.ladder}")
    print(f"tuned: {best['command']}")
    print(f"defaults: {ev.command(defaults)}")
    got: dict[str, list[float]] = {"defaults": [], "tuned": []}
    n = 0
    for r in range(a.repeats):
        for label, cand in (("defaults", defaults), ("tuned", best["config"])):
            out = evaluate(ev, cand, spec, slo, 1000 + n, lambda m: None)
            n += 1
            got[label].append(out.objective)
            pts = ", ".join(
                f"c={p.concurrency}:{p.objective:.0f}" + ("" if p.slo_ok else " (SLO miss)") for p in out.points
            )
            print(
                f"  run {r + 1} {label:8s}: {out.status:14s} {out.objective:8.1f} at c={out.concurrency} "
                f"(start {out.start_s:.0f} s; {pts})",
                flush=True,
            )
    stats = {}
    for label, xs in got.items():
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        stats[label] = (statistics.mean(xs), sd, min(xs), max(xs))
        print(
            f"{label:8s}: mean {stats[label][0]:.1f}  stdev {sd:.1f}  range {min(xs):.1f}-{max(xs):.1f}  "
            f"runs {', '.join(f'{x:.1f}' for x in xs)}"
        )
    d, t = stats["defaults"][0], stats["tuned"][0]
    gap, spread = t - d, stats["defaults"][1] + stats["tuned"][1]
    print(
        f"mean {spec.objective}: defaults {d:.1f}, tuned {t:.1f}, ratio {t / d if d else float('inf'):.2f}x; "
        f"difference {gap:+.1f} vs spread (sum of stdevs) {spread:.1f}: "
        f"{'exceeds' if abs(gap) > spread else 'within'} the spread; ranges "
        f"{'disjoint' if stats['tuned'][2] > stats['defaults'][3] or stats['defaults'][2] > stats['tuned'][3] else 'overlap'}"
    )
    return 0 if gap > spread else 1


if __name__ == "__main__":
    sys.exit(main())
