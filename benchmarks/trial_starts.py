#!/usr/bin/env python3
"""Where a tune trial's server start goes, and what the study's start measures take off it (docs/results/h200-starts.md).

Prints, from vLLM's own logs (m3ctl.tuning.startup.start_breakdown):

1. the five H200 starts of the MiniMax-M2 scale model recorded by scripts/gpu/h200_starts.sh (or ``--logs``):
   A cold with vLLM's defaults, B the same warm, C the study's cache root + capture bound (cold), D the same warm,
   E D's cache with another --max-num-seqs: each phase in seconds, and the saving of each measure;
2. a study's trials (``--study DIR``, default the recorded H200 study tests/fixtures/h200x1-real/study8, or
   ``--study study3`` ... ``study7`` for sessions 10-15, ``study9``, ``study10``, ``study11`` for sessions 17-19): each
   trial's start broken down (and a trial's later starts, start-N.json: its confirmation on a fresh server), cache
   hit or miss, its bench runs' time by phase (prompts, warm-ups, measured; studies since session 17), the median
   start after the first, the study's wall time, the
   share of it spent starting servers, and the study's wall time against the same study without the measures.

The "without" wall time is the study's own wall time with each trial start's bounded CUDA-graph capture replaced by
vLLM's default capture measured in (1) (A's), each forked engine-core process by B's spawned one, each prewarmed
start's API-server imports by the imports of the same study's starts that found no prewarmed process ready (the
baseline's, or A-E's when every start was prewarmed), and, as an upper end, each compile-cache hit and each compile
that used the study's shared Inductor kernel cache replaced by A's cold compile (a hit only counts if the capture
bound is what made its compile key match an earlier trial's: vLLM's own default cache in ~/.cache/vllm hits every
other repeat key as well). A trial's phases are read again from its server.log where the study kept one, so a
study recorded before a marker was added (vLLM's non-AOT torch.compile line) is broken down like a new one. It is derived from measured phases, not a
second run of the study; the script says so next to the figure.

Usage: python benchmarks/trial_starts.py [--study DIR] [--logs DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from m3ctl.tuning.startup import start_breakdown

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "h200x1-real"
RECORDED = tuple(f"study{i}" for i in range(3, 12))  # the recorded studies; study8: the default
DEFAULT = "study8"  # eight-configuration attempt with its grid; study9 (session 17) had four starts
TAGS = {
    "A": "cold, vLLM defaults",
    "B": "warm default cache",
    "C": "study cache + bound, cold",
    "D": "study cache + bound, warm",
    "E": "D's cache, --max-num-seqs 128",
}


def _read(p: Path) -> str:
    return gzip.decompress(p.read_bytes()).decode() if p.suffix == ".gz" else p.read_text()


def reference(logs: Path) -> dict[str, dict]:
    out = {}
    for tag in TAGS:
        f = next((p for p in (logs / f"log-{tag}.txt.gz", logs / f"log-{tag}.txt") if p.exists()), None)
        if f is not None:
            b = start_breakdown(_read(f))
            out[tag] = {"phases": dict(b.phases), "vllm_s": b.vllm_s, "compile_cache": b.compile_cache}
    return out


def print_reference(ref: dict[str, dict]) -> None:
    phases = list(dict.fromkeys(p for r in ref.values() for p in r["phases"]))
    print("Starts of the M2 scale model on one H200 (s, from vLLM's log; api_imports not in the log alone):")
    print(f"  {'phase':<18}" + "".join(f"{t:>8}" for t in ref))
    for ph in phases:
        print(f"  {ph:<18}" + "".join(f"{r['phases'].get(ph, float('nan')):>8.1f}" for r in ref.values()))
    print(f"  {'logged total':<18}" + "".join(f"{sum(r['phases'].values()):>8.1f}" for r in ref.values()))
    print(f"  {'compile cache':<18}" + "".join(f"{r['compile_cache'] or '-':>8}" for r in ref.values()))
    for t, what in TAGS.items():
        print(f"    {t}: {what}")
    if {"A", "B", "D"} <= ref.keys():
        a, b, d = (ref[t]["phases"] for t in "ABD")
        print(
            f"  compile cache hit saves {a['torch_compile'] - b['torch_compile']:.0f} s of torch.compile and "
            f"{a['api_config'] - b['api_config']:.0f} s of model-registry inspection (A - B)"
        )
        print(
            f"  capture bound 128: CUDA graphs {ref['D']['vllm_s'].get('cuda_graphs', 0):.0f} s against "
            f"{ref['A']['vllm_s'].get('cuda_graphs', 0):.0f} s (vLLM: D vs A); engine spawn and imports "
            f"({d['engine_spawn']:.0f} s + the API server's imports) are vLLM's own and unchanged"
        )


def _study_dir(arg: str | None, tmp: Path) -> Path:
    if arg and arg not in RECORDED:
        if not (Path(arg) / "result.json").is_file():
            raise SystemExit(
                f"--study {arg}: no study there (no result.json); give a study dir or {', '.join(RECORDED)}"
            )
        return Path(arg)
    with tarfile.open(FIX / (arg or DEFAULT) / "study.tgz") as t:
        t.extractall(tmp, filter="data")
    return tmp


def _start(path: Path) -> dict:
    """A trial's start.json, its phases read again from the trial's server.log where there is one (the launch
    time is not in the log, so the first phase, the API server's imports, stays as recorded)."""
    s = json.loads(path.read_text())
    log = path.parent / path.name.replace("start", "server").replace(".json", ".log")  # start-2.json: server-2.log
    if log.exists():
        b = start_breakdown(log.read_text(errors="replace"))
        old = s["phases"]
        first = {k: v for k, v in old.items() if k == "api_imports"}
        tail = {k: v for k, v in old.items() if k in ("ready", "smoke")}
        s["phases"] = {**first, **dict(b.phases), **tail}
        s["compile_cache"] = b.compile_cache or s["compile_cache"]
    return s


def print_measurement(sdir: Path) -> None:
    """Per trial, its bench runs' wall time by phase (``run_phases_s``: prompts, warm-ups, the measured phase,
    the rest), for studies recorded since session 17; older ones say the figure is not recorded."""
    rows = []
    for d in sorted((sdir / "trials").iterdir()):
        runs = [json.loads(p.read_text()) for p in sorted(d.glob("bench-*.json"))]
        ph = [r["run_phases_s"] for r in runs if r.get("run_phases_s")]
        if ph:
            tot = {k: sum(x[k] for x in ph) for k in ("prepare", "warmup", "measured", "finish", "total")}
            rows.append((d.name, len(ph), tot))
    if not rows:
        print("  measurement by phase: not recorded (bench run_phases_s came in session 17)")
        return
    for name, n, t in rows:
        print(
            f"  measuring {name:<5} {n} run(s) {t['total']:6.1f} s: measured {t['measured']:.1f}, prompts "
            f"{t['prepare']:.1f}, warm-ups {t['warmup']:.1f}, after {t['finish']:.1f}"
        )
    all_t = {k: sum(t[k] for _, _, t in rows) for k in rows[0][2]}
    print(
        f"  measuring, all trials: {all_t['total']:.0f} s, of it prompts {all_t['prepare'] / all_t['total']:.0%}, "
        f"warm-ups {all_t['warmup'] / all_t['total']:.0%}"
    )


def print_study(sdir: Path, ref: dict[str, dict]) -> None:
    res = json.loads((sdir / "result.json").read_text())
    starts = sorted(
        ((p.parent.name, _start(p)) for p in (sdir / "trials").glob("*/start.json")),
        key=lambda t: (t[0] != "base", t[0]),
    )  # the baseline starts first
    # later starts of a trial (start-N.json: a confirmation on a fresh server), after the search's
    again = sorted(
        (f"{p.parent.name}#{p.stem.split('-')[1]}", _start(p)) for p in (sdir / "trials").glob("*/start-*.json")
    )
    print(f"\nStudy {sdir}: {len(starts)} server start(s), wall {res['elapsed_s']:.0f} s")
    for name, s in starts:
        ph = s["phases"]
        print(
            f"  trial {name:<5} {s['start_s']:6.1f} s  cache {s['compile_cache'] or '-':<5} "
            f"engine {s.get('engine_process') or 'spawn':<5} prewarmed {'yes' if s.get('prewarmed') else 'no ':<3} "
            + " ".join(f"{k}={v:g}" for k, v in ph.items())
        )
    for name, s in again:
        print(
            f"  again {name:<7} {s['start_s']:6.1f} s  cache {s['compile_cache'] or '-':<5} "
            f"prewarmed {'yes' if s.get('prewarmed') else 'no ':<3} "
            + " ".join(f"{k}={v:g}" for k, v in s["phases"].items())
        )
    times = [s["start_s"] for _, s in starts]
    after = times[1:]
    print(
        f"  median start after the first: {statistics.median(after):.1f} s over the search's {len(after)}"
        + (
            f", {statistics.median(after + [s['start_s'] for _, s in again]):.1f} s with the {len(again)} later"
            if again
            else ""
        )
        if after
        else "  median start after the first: n/a (one start)"
    )
    starts = starts + again
    spent = sum(s["start_s"] for _, s in starts)
    print(f"  starting servers: {spent:.0f} s of {res['elapsed_s']:.0f} s wall ({spent / res['elapsed_s']:.0%})")
    print_measurement(sdir)
    if {"A", "B"} <= ref.keys():
        a, b = ref["A"], ref["B"]
        cold_imports = [s["phases"]["api_imports"] for _, s in starts if s["phases"].get("api_imports", 0) > 5]
        imports_s = statistics.median(cold_imports) if cold_imports else 18.0
        graphs = hits = imports = spawn = 0.0
        for _, s in starts:
            if s.get("fast_starts") and a["vllm_s"].get("cuda_graphs") is not None:
                graphs += max(0.0, a["vllm_s"]["cuda_graphs"] - s["phases"].get("cuda_graphs", 0.0))
            if s["compile_cache"] == "hit" or s.get("kernel_cache"):
                hits += max(0.0, a["phases"]["torch_compile"] - s["phases"].get("torch_compile", 0.0))
            if s.get("engine_process") == "fork":
                spawn += max(0.0, b["phases"]["engine_spawn"] - s["phases"].get("engine_spawn", 0.0))
            if s.get("prewarmed") and s["phases"].get("api_imports", 0.0) < 5:
                imports += max(0.0, imports_s - s["phases"].get("api_imports", 0.0))
        lo = res["elapsed_s"] + graphs + spawn + imports
        hi = lo + hits
        kernels = [n for n, s in starts if s.get("kernel_cache")]
        if kernels:
            tc = {n: s["phases"].get("torch_compile") for n, s in starts}
            print(
                f"  shared Inductor kernel cache in {len(kernels)} start(s); torch.compile (s, vLLM's figure): "
                + ", ".join(f"{n} {v:g} ({s['compile_cache']})" for n, s in starts if (v := tc[n]) is not None)
            )
        print(
            f"  wall without the measures (derived from the measured phases, not a second run): {lo:.0f} s with "
            f"vLLM's default capture sizes ({graphs:.0f} s of graphs), spawned engine processes ({spawn:.0f} s) "
            f"and no prewarmed server process ({imports:.0f} s of imports at {imports_s:.1f} s each), up to "
            f"{hi:.0f} s if every compile-cache hit and shared-kernel compile ({hits:.0f} s) saved all of A's cold "
            f"compile (vLLM's default cache in ~/.cache/vllm hits repeat keys too); ratio with / without = "
            f"{res['elapsed_s'] / lo:.2f} to {res['elapsed_s'] / hi:.2f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--study", help=f"a study dir, or one of {', '.join(RECORDED)} (default: the recorded H200 {DEFAULT})"
    )
    ap.add_argument("--logs", default=str(FIX / "starts"), help="dir with log-A..E.txt(.gz)")
    a = ap.parse_args()
    ref = reference(Path(a.logs))
    if ref:
        print_reference(ref)
    with tempfile.TemporaryDirectory() as tmp:
        print_study(_study_dir(a.study, Path(tmp)), ref)


if __name__ == "__main__":
    main()
