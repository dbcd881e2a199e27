#!/usr/bin/env python3
"""The clean grid (docs/results/h200-scale.md): what the tune's capacity is checked against.

For each configuration ``NAME=FLAGS`` (m3ctl serve flags joined by '+', then raw vLLM flags after a '--' token,
e.g. ``spec3=--spec-depth+3``, ``seqs128=--+--max-num-seqs+128``; ``defaults=`` for vLLM's defaults):
one fresh server (``m3ctl serve --detach``), then every concurrency of ``--ladder`` in ascending order, each
level measured by ``m3ctl bench`` (its own process, its own seed: fresh prompts; ``--warmup``: a wave of as
many fresh requests as the concurrency first, out of the measured window). Each level is decided by the
capacity rule (m3ctl/loadgen/capacity.py) through the tune's own ``measure_level`` (imported, not copied): a run
within ``--margin`` of the SLO's limit is repeated with fresh prompts, up to ``--repeats`` more runs; the level
holds when the median of the runs meets the SLO and no run misses it by more than the margin. Both sides
define a level's verdict and a capacity alike while measuring independently (separate servers, the bench CLI
here, the tune's own sessions there). Levels go up until one does not hold (:func:`walk_levels`); the capacity
is m3ctl.loadgen.capacity.capacity_of over the levels measured. A configuration the ``grid.json`` in ``--outdir``
already holds complete (from an earlier call) is skipped; an incomplete one is measured again from a fresh
server.

Writes ``OUTDIR/grid-NAME-cC-rK.json`` (each bench run), ``OUTDIR/log-NAME.txt`` (server log) and
``OUTDIR/grid.json``: ``{"slo", "ladder", "configs": {NAME: {"flags", "ready_s", "levels": {C: {"runs":
[{p90_tpot_ms, objective, valid, file}], "median_p90_tpot_ms", "median_objective", "slo_ok", "state",
"confidence"}}, "capacity",
"objective_at_capacity", "stopped"}}}``, rewritten after every run (a call that ends early keeps what it
measured). Objective: total tok/s per GPU (``tput_per_gpu``), as the tune's.

Run on the GPU host with m3ctl importable (scripts/gpu/h200_scale.sh ``grid`` mode).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from m3ctl.loadgen.capacity import capacity_of
from m3ctl.loadgen.slo import SLO, parse_slo
from m3ctl.tuning.search import Point, TuneSpec, measure_level


def walk_levels(
    sess,
    spec: TuneSpec,
    slo: SLO,
    ladder: list[int],
    below: list[int],
    on_event=print,
    on_level=None,
    time_left=lambda: float("inf"),
) -> dict:
    """Levels of one server upwards from the ladder's first until one does not hold; when that first level does
    not hold, downwards through ``below`` (descending) until one holds (the capacity is then below the ladder).
    Each level is ``measure_level`` (the capacity rule). ``on_level(c, point)``: after each level (the script
    saves grid.json there); ``time_left()``: seconds left, the walk stops below 45.

    Returns ``{"levels": {c: Point}, "capacity": c or None (capacity_of), "objective": the median objective at
    the capacity or None, "stopped": why the walk ended}``."""
    levels: dict[int, Point] = {}
    todo, below = list(ladder), list(below)
    stopped = None
    while todo:
        c = todo.pop(0)
        if time_left() < 45:
            stopped = f"deadline at c={c}"
            break
        going_down = not any(p.slo_ok for p in levels.values()) and c <= ladder[0]
        pt = measure_level(sess, spec, slo, c, 1.0, 1, on_event)
        levels[c] = pt
        if on_level is not None:
            on_level(c, pt)
        if pt.slo_ok and going_down and c < ladder[0]:
            stopped = f"missed at c={min(x for x in levels if x > c)}"
            break
        if not pt.slo_ok:
            stopped = f"missed at c={c}"
            if going_down and below:
                todo = [below.pop(0)]
                continue
            break
    else:
        stopped = stopped or "top of the ladder"
    cap = capacity_of((x, p.slo_ok) for x, p in levels.items())
    return {
        "levels": levels,
        "capacity": cap,
        "objective": levels[cap].objective if cap is not None else None,
        "stopped": stopped,
    }


class CliSession:
    """One running deployment measured through the ``m3ctl bench`` CLI (the tune's Session protocol)."""

    def __init__(self, m3: list[str], name: str, cfg: str, out: Path, args: argparse.Namespace, seed0: int):
        self.m3, self.name, self.cfg, self.out, self.a = m3, name, cfg, out, args
        self.seed, self.runs, self.files = seed0, {}, []

    def measure(self, c: int, fidelity: float) -> dict:
        k = self.runs[c] = self.runs.get(c, 0) + 1
        self.seed += 1
        f = self.out / f"grid-{self.cfg}-c{c}-r{k}.json"
        n = max(self.a.min_prompts, round(self.a.prompts_per_concurrency * c * fidelity))
        cmd = [
            *self.m3,
            "bench",
            "--deployment",
            self.name,
            "--concurrency",
            str(c),
            # a --precision grid: each run until the objective's interval is within it (the bench's cap), as a
            # --precision tune measures; otherwise the tune's fixed count
            *(
                ["--precision", str(self.a.precision), "--precision-metric", "total_token_throughput"]
                + (["--max-duration", str(self.a.max_duration)] if self.a.max_duration else [])
                if self.a.precision
                else ["--num-prompts", str(n)]
            ),
            "--input-len",
            str(self.a.input_len),
            "--output-len",
            str(self.a.output_len),
            "--warmup",
            *(["--tokenizer", self.a.tokenizer] if self.a.tokenizer else []),
            # common prompt text: the tune's seed (0) in every run, so the grid sends the tune's prompts (each
            # run's fresh salt tags them); fresh text: a seed of its own per run, as before
            *(
                ["--prompt-text", "common", "--seed", "0"]
                if self.a.prompt_text == "common"
                else ["--seed", str(self.seed)]
            ),
            "--no-progress",
            "--label",
            f"{self.cfg} c={c} r{k}",
            "--output-json",
            str(f),
        ]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30, self.a.deadline - time.time()))
            (self.out / f"bench-{self.cfg}-c{c}-r{k}.txt").write_text(p.stdout + p.stderr)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        self.files.append(f.name)
        if not f.exists():
            return {"completed": 0, "validity": {"valid": False, "reasons": [f"bench exit {rc}"]}}
        return json.loads(f.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+", help="NAME=FLAGS (flags joined by '+')")
    ap.add_argument("--model", required=True)
    ap.add_argument("--outdir", type=Path, required=True)
    ap.add_argument("--slo", required=True)
    ap.add_argument("--ladder", default="16,32,48,64,96,128")
    ap.add_argument("--input-len", type=int, default=4096)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--prompts-per-concurrency", type=float, default=3)
    ap.add_argument("--min-prompts", type=int, default=32)
    ap.add_argument("--below", default="32,16", help="levels tried downwards when the ladder's first one misses")
    ap.add_argument("--margin", type=float, default=0.10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--port", type=int, default=8050)
    ap.add_argument("--seconds", type=float, default=540, help="stop by this many seconds after the start")
    ap.add_argument("--min-config-s", type=float, default=200, help="start no configuration with less left")
    ap.add_argument("--extra", default="--load-format+dummy", help="vLLM args after --, joined by '+'")
    ap.add_argument("--prompt-text", choices=["fresh", "common"], default="fresh", help="bench --prompt-text")
    ap.add_argument("--precision", help="bench --precision (e.g. 3%%): each run until the objective is known that well")
    ap.add_argument("--max-duration", type=float, help="bench --max-duration of a --precision run (s)")
    ap.add_argument("--tokenizer", help="model dir whose tokenizer.json builds the prompts (as the tune's study does)")
    a = ap.parse_args()
    a.deadline = time.time() + a.seconds
    m3 = [sys.executable, "-P", "-m", "m3ctl"]
    slo = parse_slo(a.slo)
    ladder = [int(x) for x in a.ladder.split(",")]
    below0 = sorted((int(x) for x in a.below.split(",") if x), reverse=True)
    spec = TuneSpec(
        slo=a.slo, objective="tput_per_gpu", ladder=ladder, boundary_margin=a.margin, boundary_repeats=a.repeats
    )
    a.outdir.mkdir(parents=True, exist_ok=True)
    summary_f = a.outdir / "grid.json"
    summary = json.loads(summary_f.read_text()) if summary_f.exists() else {"configs": {}}
    summary.update(
        slo=a.slo,
        ladder=ladder,
        input_len=a.input_len,
        output_len=a.output_len,
        prompts_per_concurrency=a.prompts_per_concurrency,
        prompt_text=a.prompt_text,
        margin=a.margin,
        repeats=a.repeats,
    )

    def save() -> None:
        tmp = summary_f.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=1))
        tmp.replace(summary_f)

    for i, item in enumerate(a.configs):
        cfg, _, flags = item.partition("=")
        done = summary["configs"].get(cfg, {}).get("stopped") or ""
        if done.startswith("missed") or done == "top of the ladder":
            print(f"skip {cfg}: measured by an earlier call ({done})", flush=True)
            continue
        left = a.deadline - time.time()
        if left < a.min_config_s:
            print(f"skip {cfg}: {left:.0f} s left", flush=True)
            continue
        name = f"grid-{cfg}"
        toks = [f for f in flags.split("+") if f]
        own, raw = (toks[: toks.index("--")], toks[toks.index("--") + 1 :]) if "--" in toks else (toks, [])
        serve = [
            *m3,
            "serve",
            "--model",
            a.model,
            "--name",
            name,
            "--port",
            str(a.port),
            "--runtime",
            "process",
            "--detach",
            *own,
            "--",
            *[f for f in a.extra.split("+") if f],
            *raw,
        ]
        t0 = time.time()
        p = subprocess.run(serve, capture_output=True, text=True, timeout=max(30, a.deadline - time.time() - 20))
        rec = summary["configs"].setdefault(cfg, {})
        rec.update(
            flags=flags.replace("+", " "),
            ready_s=round(time.time() - t0, 1),
            serve_rc=p.returncode,
            levels={},
            capacity=None,
            objective_at_capacity=None,
            stopped=None,
        )
        print(f"serve {cfg} rc={p.returncode} ready_s={rec['ready_s']}", flush=True)
        if p.returncode != 0:
            rec["stopped"] = "serve failed: " + (p.stdout + p.stderr).strip().splitlines()[-1:][0][:300]
            save()
            subprocess.run([*m3, "stop", name], capture_output=True)
            continue
        sess = CliSession(m3, name, cfg, a.outdir, a, seed0=1000 * (i + 1))

        def on_level(c: int, pt: Point, rec=rec, cfg=cfg, t0=t0) -> None:
            runs = pt.runs or [pt.__dict__]
            rec["levels"][str(c)] = {
                "runs": [
                    {
                        "p90_tpot_ms": r["metrics"].get("p90_tpot_ms"),
                        "objective": r["objective"],
                        "objective_ci": r.get("objective_ci"),
                        "valid": r["valid"],
                        "slo_ok": r["slo_ok"],
                        "reasons": r["reasons"],
                    }
                    for r in runs
                ],
                "median_p90_tpot_ms": pt.metrics.get("p90_tpot_ms"),
                "median_objective": pt.objective,
                "objective_ci": pt.objective_ci,
                "slo_ok": pt.slo_ok,
                "valid": pt.valid,
                "state": (pt.verdict or {}).get("state"),
                "confidence": (pt.verdict or {}).get("confidence"),
            }
            cap = capacity_of((int(x), lv["slo_ok"]) for x, lv in rec["levels"].items())
            rec["capacity"] = cap
            rec["objective_at_capacity"] = rec["levels"][str(cap)]["median_objective"] if cap is not None else None
            print(
                f"  {cfg} c={c}: {len(runs)} run(s) p90 TPOT "
                f"{[round(r['metrics'].get('p90_tpot_ms') or 0, 1) for r in runs]} -> "
                f"{'holds' if pt.slo_ok else 'does not hold'} ({(pt.verdict or {}).get('confidence')}), "
                f"{pt.objective:.0f} tok/s/GPU at {time.time() - t0:.0f} s",
                flush=True,
            )
            save()

        try:
            got = walk_levels(
                sess,
                spec,
                slo,
                ladder,
                below0,
                lambda m, cfg=cfg: print(f"  {cfg} {m}", flush=True),
                on_level,
                lambda: a.deadline - time.time(),
            )
            rec["stopped"] = got["stopped"]
        finally:
            log = Path(os.environ.get("M3CTL_STATE_DIR", "")) / "logs" / f"{name}.log"
            if log.exists():
                (a.outdir / f"log-{cfg}.txt").write_text(log.read_text()[-200_000:])
            subprocess.run([*m3, "stop", name], capture_output=True)
            save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
