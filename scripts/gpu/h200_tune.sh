#!/usr/bin/env bash
# H200 evidence, calls 8-9 (nvidia-h200-x2): `m3ctl tune` of the tiny MiniMax-M2 over TP {1,2} x ngram depth
# {0..3} x max-num-seqs {64,128,1024} under a real SLO, vLLM's defaults measured as the baseline. The study dir
# travels between calls as .study/study.tgz (carry .study): the first call starts it, the next one `--resume`s
# it on a fresh machine with a larger time budget. m3ctl runs from .snap (git archive of the commit under test).
# Usage: bash scripts/gpu/h200_tune.sh TIME_BUDGET_S
set -u
exec > >(tee "$OUT/tune-call.log") 2>&1
t0=$(date +%s); B=${1:-300}
source scripts/gpu/snap-env.sh
$M dev tiny-model /tmp/tm2 --head-dim 128 > /dev/null
S=/tmp/study
if [ -f .study/study.tgz ]; then
  mkdir -p $S && tar -xzf .study/study.tgz -C $S
  echo "resuming (setup took $(( $(date +%s) - t0 )) s)"
  timeout -s INT $(( 575 - ($(date +%s) - t0) )) $M tune --resume $S --time-budget $B --pareto; echo "tune rc=$?"
else
  echo "starting (setup took $(( $(date +%s) - t0 )) s)"
  timeout -s INT $(( 575 - ($(date +%s) - t0) )) $M tune --model /tmp/tm2 --study-dir $S --port 8040 \
    --slo "p90_tpot_ms<=3,p90_ttft_ms<=200" --objective tput_per_gpu \
    --knob tp=1,2 --knob spec_depth=0-3 --knob max_num_seqs=64,128,1024 --knob dcp=1 --knob ep=false --knob dbo=false \
    --knob max_num_batched_tokens=8192 --knob kv_cache_dtype=default \
    --ladder 8,16,32,64,96,128,192 --input-len 512 --output-len 256 --prompts-per-concurrency 4 \
    --max-trials 14 --time-budget $B --confirm-top 1 --pareto; echo "tune rc=$?"
fi
$M stop --all; nvidia-smi --query-gpu=index,memory.used --format=csv
tar -C $S -czf "$OUT/study.tgz" . && cp $S/result.json "$OUT/" 2>/dev/null; cp $S/profile.yaml $S/pareto.png "$OUT/" 2>/dev/null
echo "call done at $(( $(date +%s) - t0 )) s"
