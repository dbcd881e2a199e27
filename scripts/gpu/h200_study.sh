#!/usr/bin/env bash
# docs/results/h200-starts.md, H200 calls 2-3: `m3ctl tune` of the MiniMax-M2 scale model (16 layers, FP8, dummy weights) with the
# study's start measures on (one compile cache per study and model, CUDA-graph capture bounded by the ladder), GPU
# energy per bench run (NVML), the shared capacity rule and the never-a-loser choice. Fresh prompts every run.
# The study travels between calls as .study/study.tgz (carry .study): the first call starts it, the next --resume-s
# it (the compile cache travels too, so a resumed trial with a known compile key loads it). Carry .bundle .whl.
# Usage: bash scripts/gpu/h200_study.sh TIME_BUDGET_S (cumulative over resumes)
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); B=${1:-480}; STOP_AT=${STOP_AT:-565}
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv,noheader
$M dev scale-model /tmp/sm2 --arch minimax-m2 --layers 16 --quant fp8 > /dev/null || { echo "scale-model failed"; exit 1; }
S=/tmp/study
echo "setup done at $(( $(date +%s) - t0 )) s"
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
if [ -f .study/study.tgz ]; then
  mkdir -p $S && tar -xzf .study/study.tgz -C $S
  timeout -s INT $(( $(left) - 20 )) $M tune --resume $S --time-budget $B --confirm-top 0 --pareto > $OUT/tune.log 2>&1
  echo "tune rc=$?"
else
  timeout -s INT $(( $(left) - 20 )) $M tune --model /tmp/sm2 --study-dir $S --port 8040 --slo "p90_tpot_ms<=30" \
    --objective tput_per_gpu --knob tp=1 --knob dcp=1 --knob ep=false --knob dbo=false --knob spec_depth=0,3 \
    --knob max_num_seqs=128,256,1024 --knob max_num_batched_tokens=2048,8192 --knob kv_cache_dtype=default,fp8 \
    --ladder 32,64,96,128 --input-len 2048 --output-len 128 --prompts-per-concurrency 2 \
    --max-trials 12 --time-budget $B --confirm-top 0 --pareto -- --load-format dummy > $OUT/tune.log 2>&1
  echo "tune rc=$?"
fi
$M stop --all > /dev/null 2>&1
tail -40 $OUT/tune.log
for f in $S/trials/*/start.json; do echo "$f $(python3 -c "import json,sys;d=json.load(open('$f'));print(d['start_s'],d['compile_cache'],d['phases'])")"; done
du -sh $S $S/vllm-cache 2>/dev/null
# the study without server logs' bulk and with the compile cache (a resume reuses it)
tar -C $S -czf "$OUT/study.tgz" --exclude='*.png' --exclude=vllm-cache . && ls -la $OUT/study.tgz
cp $S/result.json $S/profile.yaml $S/pareto.png "$OUT/" 2>/dev/null
nvidia-smi --query-gpu=index,memory.used --format=csv
echo "call done at $(( $(date +%s) - t0 )) s"
