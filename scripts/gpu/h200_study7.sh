#!/usr/bin/env bash
# Session 15 (docs/results/h200-study7.md): study6 (scripts/gpu/h200_study6.sh: MiniMax-M2 scale model, 16 layers, FP8,
# dummy weights; SLO p90 TPOT <= 30 ms; ladder 32-128; same knob space; 4 prompts per concurrency; every start
# measure on) with the choice confirmed on fresh servers and the host recorded:
#   tune        start or resume the search (no confirmation); its time budget ends it before the call does
#   finish      resume with --confirm-top 1 and no search time left (the best and vLLM's defaults each started
#               again on a fresh server, the worse of the two measurements kept), then the clean grid
#               (scripts/gpu/scale_grid.py) of the chosen configuration and of vLLM's defaults, each on its own
#               fresh server, a second defaults server when time is left; the grid points its servers at the
#               study's compile cache (a start's cost, not its measurement) and walks 64, 96, 128 (32 below).
# Each call records the host: CPU model, cores, load, CPU steal (/proc/stat), GPU power, SM clock and the clock
# event reasons every 10 s (host.txt, samples.txt), beside the GPU's compute processes. A call resumes the study a
# warm machine still holds (/tmp/study), else a carried .study/study.tgz.
# Carry .bundle .whl (and .study). Usage: bash scripts/gpu/h200_study7.sh tune|finish
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); MODE=${1:-tune}; STOP_AT=${STOP_AT:-545}
SLO="p90_tpot_ms<=30"; LADDER=32,64,96,128; PPC=4
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
if [ "$MODE" = tune ]; then
  B=$(( $(elapsed) + $(left) - 30 ))
  echo "search time budget $B s (study elapsed $(elapsed) s)"
  if [ -f $S/tune.json ]; then
    echo "resuming the study in $S ($(ls $S/trials | wc -l) trial folders)"
    timeout -s INT $(( $(left) - 15 )) $M tune --resume $S --time-budget $B --confirm-top 0 --pareto > $OUT/tune.log 2>&1
  else
    timeout -s INT $(( $(left) - 15 )) $M tune --model /tmp/sm2 --study-dir $S --port 8040 --slo "$SLO" \
      --objective tput_per_gpu --knob tp=1 --knob dcp=1 --knob ep=false --knob dbo=false --knob spec_depth=0,3 \
      --knob max_num_seqs=128,256,1024 --knob max_num_batched_tokens=2048,8192 --knob kv_cache_dtype=default,fp8 \
      --ladder $LADDER --input-len 2048 --output-len 128 --prompts-per-concurrency $PPC \
      --max-trials 16 --time-budget $B --confirm-top 0 --pareto -- --load-format dummy > $OUT/tune.log 2>&1
  fi
  echo "tune rc=$?"
else
  timeout -s INT $(( $(left) - 200 )) $M tune --resume $S --time-budget 1 --confirm-top 1 --pareto > $OUT/tune.log 2>&1
  echo "tune (confirm) rc=$? at $(( $(date +%s) - t0 )) s"
fi
$M stop --all > /dev/null 2>&1
tail -40 $OUT/tune.log
for f in $S/trials/*/start*.json; do echo "$f $(python3 -c "import json;d=json.load(open('$f'));print(d['start_s'],d['compile_cache'],d.get('prewarmed'),d['phases'])")"; done
tar -C $S -czf "$OUT/study.tgz" --exclude='*.png' --exclude=vllm-cache . && ls -la $OUT/study.tgz
cp $S/result.json $S/profile.yaml "$OUT/" 2>/dev/null
if [ "$MODE" = finish ]; then
  G=/tmp/grid; mkdir -p $G
  set -- $(python3 - "$S/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
pick = [t for t in r.get("trials", []) if "chosen_trial" in r and t.get("trial") == r["chosen_trial"]]
best = (pick[0] if pick else {}).get("config") or {}
flags, raw = [], []
if best.get("spec_depth"):
    flags += ["--spec-depth", str(best["spec_depth"])]
for k, f in (("max_num_seqs", "--max-num-seqs"), ("max_num_batched_tokens", "--max-num-batched-tokens")):
    if best.get(k) is not None:
        raw += [f, str(best[k])]
if best.get("kv_cache_dtype") not in (None, "default", "auto"):
    raw += ["--kv-cache-dtype", str(best["kv_cache_dtype"])]
chosen = ["chosen=" + "+".join(flags + (["--"] + raw if raw else []))] if best and r.get("chosen") != "defaults" else []
print(" ".join(chosen + ["defaults=", "defaults2="]))
PY
)
  echo "grid configurations: $* (chosen: $(python3 -c "import json;r=json.load(open('$S/result.json'));print(r.get('chosen'), r.get('chosen_trial'))"))"
  CR=$(ls -d $S/vllm-cache/* | head -1)
  VLLM_CACHE_ROOT=$CR TORCHINDUCTOR_CACHE_DIR=$CR/inductor VLLM_USE_AOT_COMPILE=0 \
  python3 -P scripts/gpu/scale_grid.py "$@" --model /tmp/sm2 --outdir $G --slo "$SLO" --ladder 64,96,128 \
    --input-len 2048 --output-len 128 --prompts-per-concurrency $PPC --below 32 --repeats 2 \
    --seconds $(( $(left) - 20 )) --min-config-s 100 --port 8050 > $OUT/grid.log 2>&1; echo "grid rc=$?"
  $M stop --all > /dev/null 2>&1
  tail -30 $OUT/grid.log
  tar -C $G -czf "$OUT/grid.tgz" . && cp $G/grid.json $OUT/ 2>/dev/null
fi
kill $SAMPLER 2>/dev/null
ps -eo pid,args | grep -c "prewarm_child" | xargs echo "prewarm_child processes left (incl. grep):"
nvidia-smi --query-gpu=index,memory.used --format=csv
echo "call done at $(( $(date +%s) - t0 )) s"
