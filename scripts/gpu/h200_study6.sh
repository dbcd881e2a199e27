#!/usr/bin/env bash
# Session 14 (docs/results/h200-study6.md): study5 (scripts/gpu/h200_study5.sh: same model, SLO, ladder, knob space,
# 4 prompts per concurrency, every start measure on) with the tune given two whole calls, so the study reaches at
# least 8 configurations, then the clean grid of its chosen configuration. A tune call resumes the study a warm
# machine still holds (/tmp/study), else a carried .study/study.tgz, else starts it: a lost machine never starts a
# second study under the first one's name.
# Modes:
#   tune B        start or resume the study with a cumulative time budget of B s
#   grid CFG...   the clean grid (scripts/gpu/scale_grid.py) for these configurations, same SLO and ladder
#   grid auto     the same for the study's chosen configuration and vLLM's defaults (read from /tmp/study/result.json)
#   grid chosen   the chosen configuration only
# Carry .bundle .whl (and .study / .grid to continue). Usage: bash scripts/gpu/h200_study6.sh MODE ARGS
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); MODE=${1:-tune}; shift || true; STOP_AT=${STOP_AT:-570}
SLO="p90_tpot_ms<=30"; LADDER=32,64,96,128; PPC=${PPC:-4}
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv,noheader
[ -f /tmp/sm2/config.json ] || $M dev scale-model /tmp/sm2 --arch minimax-m2 --layers 16 --quant fp8 > /dev/null || { echo "scale-model failed"; exit 1; }
echo "setup done at $(( $(date +%s) - t0 )) s"
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
( while sleep 10; do echo "$(( $(date +%s) - t0 )) $(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | tr '\n' ';')"; done ) > $OUT/gpu-apps.txt 2>&1 &
SAMPLER=$!
S=/tmp/study
if [ "$MODE" = tune ]; then
  B=${1:-500}
  [ -f $S/tune.json ] || [ ! -f .study/study.tgz ] || { mkdir -p $S && tar -xzf .study/study.tgz -C $S; }
  if [ -f $S/tune.json ]; then  # a warm machine keeps its study and compile cache
    echo "resuming the study in $S ($(ls $S/trials | wc -l) trial folders)"
    timeout -s INT $(( $(left) - 25 )) $M tune --resume $S --time-budget $B --confirm-top 0 --pareto > $OUT/tune.log 2>&1
  else
    timeout -s INT $(( $(left) - 25 )) $M tune --model /tmp/sm2 --study-dir $S --port 8040 --slo "$SLO" \
      --objective tput_per_gpu --knob tp=1 --knob dcp=1 --knob ep=false --knob dbo=false --knob spec_depth=0,3 \
      --knob max_num_seqs=128,256,1024 --knob max_num_batched_tokens=2048,8192 --knob kv_cache_dtype=default,fp8 \
      --ladder $LADDER --input-len 2048 --output-len 128 --prompts-per-concurrency $PPC \
      --max-trials 16 --time-budget $B --confirm-top 0 --pareto -- --load-format dummy > $OUT/tune.log 2>&1
  fi
  echo "tune rc=$?"
  $M stop --all > /dev/null 2>&1
  tail -45 $OUT/tune.log
  for f in $S/trials/*/start.json; do echo "$f $(python3 -c "import json;d=json.load(open('$f'));print(d['start_s'],d['compile_cache'],d.get('prewarmed'),d.get('engine_process'),d['phases'])")"; done
  tar -C $S -czf "$OUT/study.tgz" --exclude='*.png' --exclude=vllm-cache . && ls -la $OUT/study.tgz
  cp $S/result.json $S/profile.yaml $S/pareto.png "$OUT/" 2>/dev/null
else
  G=/tmp/grid; mkdir -p $G
  if [ "${1:-}" = auto ] || [ "${1:-}" = chosen ]; then
    WHICH=$1
    [ -f $S/result.json ] || { mkdir -p $S && tar -xzf .study/study.tgz -C $S; }
    set -- $(python3 - "$S/result.json" "$WHICH" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
pick = [t for t in r.get("trials", []) if "chosen_trial" in r and t.get("trial") == r["chosen_trial"]]
best = (pick[0] if pick else (r.get("best") or {})).get("config") or {}  # the chosen tuned trial, else the best
flags, raw = [], []
if best.get("spec_depth"):
    flags += ["--spec-depth", str(best["spec_depth"])]
for k, f in (("max_num_seqs", "--max-num-seqs"), ("max_num_batched_tokens", "--max-num-batched-tokens")):
    if best.get(k) is not None:
        raw += [f, str(best[k])]
if best.get("kv_cache_dtype") not in (None, "default", "auto"):
    raw += ["--kv-cache-dtype", str(best["kv_cache_dtype"])]
name = "chosen" if best else None
cfgs = [f"{name}=" + "+".join(flags + (["--"] + raw if raw else []))] if best and r.get("chosen") != "defaults" else []
print(" ".join(cfgs + (["defaults="] if sys.argv[2] == "auto" or not cfgs else [])))
PY
)
    echo "grid configurations: $*"
  fi
  [ -f .grid/grid.json ] && cp .grid/grid.json $G/grid.json
  python3 -P scripts/gpu/scale_grid.py "$@" --model /tmp/sm2 --outdir $G --slo "$SLO" --ladder $LADDER \
    --input-len 2048 --output-len 128 --prompts-per-concurrency $PPC --below 16 --repeats 2 \
    --seconds $(( $(left) - 25 )) --min-config-s 120 --port 8050 > $OUT/grid.log 2>&1; echo "grid rc=$?"
  $M stop --all > /dev/null 2>&1
  tail -30 $OUT/grid.log
  tar -C $G -czf "$OUT/grid.tgz" . && cp $G/grid.json $OUT/ 2>/dev/null
fi
kill $SAMPLER 2>/dev/null
ps -eo pid,args | grep -c "prewarm_child" | xargs echo "prewarm_child processes left (incl. grep):"
nvidia-smi --query-gpu=index,memory.used --format=csv
echo "call done at $(( $(date +%s) - t0 )) s"
