#!/usr/bin/env bash
# Session 16 (docs/results/h200-study8.md): eight configurations, a confirmed choice and its clean grid in one
# session's device time. Study7's stack and workload (scripts/gpu/h200_study7.sh: MiniMax-M2 scale model, 16 layers,
# FP8, dummy weights; SLO p90 TPOT <= 30 ms; 2,048 in / 128 out; 4 prompts per concurrency; every start measure on),
# with the ladder ending at c=96 (study7 measured no configuration holding c=128: each c=128 run cost 2-3 runs)
# and a knob space of one twin of the defaults (max_num_seqs 256) and four max_num_batched_tokens values:
#   search    start or resume the search (no confirmation); its time budget ends it before the call does
#   confirm   resume the search with CONFIRM_S seconds kept for --confirm-top 1 (the choice and vLLM's defaults
#             each on a fresh server, the worse measurement kept)
#   grid      (EXTRA_S > 0: the search resumed for EXTRA_S more seconds, with its confirmation, first) the clean grid (scripts/gpu/scale_grid.py, the same capacity rule, levels 64, 96 with 32 below) of
#             the chosen configuration and of the defaults, each on its own fresh server, then a second server of
#             the chosen one when time is left; the grid uses the study's compile cache (a start's cost only)
# Each call records the host (host.txt) and samples load, /proc/stat, GPU power, SM clock and clock-event reasons
# every 10 s (samples.txt). Carry .bundle .whl (and .study). Usage: bash scripts/gpu/h200_study8.sh search|confirm|grid
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); MODE=${1:-search}; STOP_AT=${STOP_AT:-580}; CONFIRM_S=${CONFIRM_S:-250}
SLO="p90_tpot_ms<=30"; LADDER=32,64,96; PPC=4
{ lscpu | grep -E "^Model name|^CPU\(s\)|^Thread|^Core|^Socket|^Hypervisor|^Virtualization|MHz"; nproc; cat /proc/loadavg; uptime; } > $OUT/host.txt 2>&1
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee -a $OUT/host.txt
[ -f /tmp/sm2/config.json ] || $M dev scale-model /tmp/sm2 --arch minimax-m2 --layers 16 --quant fp8 > /dev/null || { echo "scale-model failed"; exit 1; }
echo "setup done at $(( $(date +%s) - t0 )) s"
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
( while sleep 10; do
    echo "$(( $(date +%s) - t0 )) load=$(cut -d' ' -f1 /proc/loadavg) cpu=$(head -1 /proc/stat | cut -c6-) gpu=$(nvidia-smi --query-gpu=power.draw,clocks.sm,utilization.gpu,temperature.gpu --format=csv,noheader | tr -d ' ') why=$(nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv,noheader 2>&1 | tr -d ' ') apps=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ';' | tr -d ' ')"
  done ) > $OUT/samples.txt 2>&1 &
SAMPLER=$!
S=/tmp/study
[ -f $S/tune.json ] || [ ! -f .study/study.tgz ] || { mkdir -p $S && tar -xzf .study/study.tgz -C $S; }
elapsed() { python3 -c "import json,sys;print(int(json.load(open('$S/result.json')).get('elapsed_s',0)))" 2>/dev/null || echo 0; }
if [ "$MODE" = search ] || [ "$MODE" = confirm ]; then
  KEEP=30; CT=0
  [ "$MODE" = confirm ] && { KEEP=$(( 30 + CONFIRM_S )); CT=1; }
  B=$(( $(elapsed) + $(left) - KEEP ))
  echo "search time budget $B s (study elapsed $(elapsed) s), confirm-top $CT"
  if [ -f $S/tune.json ]; then
    echo "resuming the study in $S ($(ls $S/trials | wc -l) trial folders)"
    timeout -s INT $(( $(left) - 10 )) $M tune --resume $S --time-budget $B --confirm-top $CT --pareto > $OUT/tune.log 2>&1
  else
    timeout -s INT $(( $(left) - 10 )) $M tune --model /tmp/sm2 --study-dir $S --port 8040 --slo "$SLO" \
      --objective tput_per_gpu --knob tp=1 --knob dcp=1 --knob ep=false --knob dbo=false --knob spec_depth=0,3 \
      --knob max_num_seqs=256,1024 --knob max_num_batched_tokens=2048,4096,8192,16384 --knob kv_cache_dtype=default,fp8 \
      --ladder $LADDER --input-len 2048 --output-len 128 --prompts-per-concurrency $PPC \
      --max-trials 16 --time-budget $B --confirm-top $CT --pareto -- --load-format dummy > $OUT/tune.log 2>&1
  fi
  echo "tune rc=$? at $(( $(date +%s) - t0 )) s"
  $M stop --all > /dev/null 2>&1
  tail -45 $OUT/tune.log
  for f in $S/trials/*/start*.json; do echo "$f $(python3 -c "import json;d=json.load(open('$f'));print(d['start_s'],d['compile_cache'],d.get('prewarmed'),d['phases'])")"; done
  tar -C $S -czf "$OUT/study.tgz" --exclude='*.png' --exclude=vllm-cache . && ls -la $OUT/study.tgz
  cp $S/result.json $S/profile.yaml "$OUT/" 2>/dev/null
else
  if [ "${EXTRA_S:-0}" -gt 0 ]; then  # the search resumed for EXTRA_S more seconds first (its confirmation too)
    echo "search resumed for $EXTRA_S s (study elapsed $(elapsed) s)"
    timeout -s INT $(( $(left) - 200 )) $M tune --resume $S --time-budget $(( $(elapsed) + EXTRA_S )) --confirm-top 1 --pareto > $OUT/tune.log 2>&1
    echo "tune rc=$? at $(( $(date +%s) - t0 )) s"; $M stop --all > /dev/null 2>&1; tail -25 $OUT/tune.log
    tar -C $S -czf "$OUT/study.tgz" --exclude='*.png' --exclude=vllm-cache .
  fi
  G=/tmp/grid; mkdir -p $G
  set -- $(python3 - "$S/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def flags_of(cfg):
    flags, raw = [], []
    if cfg.get("spec_depth"):
        flags += ["--spec-depth", str(cfg["spec_depth"])]
    for k, f in (("max_num_seqs", "--max-num-seqs"), ("max_num_batched_tokens", "--max-num-batched-tokens")):
        if cfg.get(k) is not None:
            raw += [f, str(cfg[k])]
    if cfg.get("kv_cache_dtype") not in (None, "default", "auto"):
        raw += ["--kv-cache-dtype", str(cfg["kv_cache_dtype"])]
    return "+".join(flags + (["--"] + raw if raw else []))
trials = {t.get("trial"): t for t in r.get("trials", [])}
if r.get("chosen") != "defaults" and r.get("chosen_trial") in trials:
    f = flags_of(trials[r["chosen_trial"]].get("config") or {})
    print(f"chosen={f} defaults= chosen2={f}")
else:  # the defaults chosen: the best tuned configuration by the study's own ranking beside them
    best = (r.get("best") or {}).get("trial")
    f = flags_of((trials.get(best) or {}).get("config") or {}) if best is not None else ""
    print(f"defaults= best={f} defaults2=" if f else "defaults= defaults2=")
PY
)
  echo "grid configurations: $* (chosen: $(python3 -c "import json;r=json.load(open('$S/result.json'));print(r.get('chosen'), r.get('chosen_trial'))"))"
  CR=$(ls -d $S/vllm-cache/* 2>/dev/null | head -1); [ -n "$CR" ] || { CR=/tmp/gridcache; mkdir -p $CR; }
  VLLM_CACHE_ROOT=$CR TORCHINDUCTOR_CACHE_DIR=$CR/inductor VLLM_USE_AOT_COMPILE=0 \
  python3 -P scripts/gpu/scale_grid.py "$@" --model /tmp/sm2 --outdir $G --slo "$SLO" --ladder 64,96 \
    --input-len 2048 --output-len 128 --prompts-per-concurrency $PPC --below 32 --repeats 2 \
    --seconds $(( $(left) - 15 )) --min-config-s 120 --port 8050 > $OUT/grid.log 2>&1; echo "grid rc=$?"
  $M stop --all > /dev/null 2>&1
  tail -30 $OUT/grid.log
  tar -C $G -czf "$OUT/grid.tgz" .
fi
kill $SAMPLER 2>/dev/null
nvidia-smi --query-gpu=index,memory.used --format=csv
echo "call done at $(( $(date +%s) - t0 )) s"
