#!/usr/bin/env bash
# H200 evidence, call 6 (nvidia-h200, one GPU): a two-start `m3ctl tune` of the tiny MiniMax-M2 (spec depth x
# max-num-seqs) under a real SLO, within the session's last device minutes. Results are copied flat into $OUT.
set -u
exec > >(tee "$OUT/run6.log") 2>&1
bash .bundle/setup.sh > "$OUT/setup.log" 2>&1
# optuna and its needs are not on the GPU image: carried as wheels in .whl (device README, Notes)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
source .bundle/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH:/tmp/site M3CTL_STATE_DIR=/tmp/m3state COLUMNS=160
M="python3 -m m3ctl"
[ -f /tmp/tm2/config.json ] || $M dev tiny-model /tmp/tm2 --head-dim 128 > /dev/null
timeout 230 $M tune --model /tmp/tm2 --study-dir /tmp/study-$(date +%s) --slo "p90_tpot_ms<=5,p90_ttft_ms<=500" \
   --knob spec_depth=0,3 --knob max_num_seqs=256 --knob max_num_batched_tokens=8192 --ladder 4,16,64 --max-trials 2 --time-budget 150 \
   --confirm-top 0 --input-len 256 --output-len 128 --prompts-per-concurrency 4; echo "tune rc=$?"
cp /tmp/study-*/result.json "$OUT/tune-result.json" 2>/dev/null; cp /tmp/study-*/profile.yaml "$OUT/tune-profile.yaml" 2>/dev/null
$M stop --all; nvidia-smi --query-gpu=index,memory.used --format=csv
