#!/usr/bin/env bash
# H200 evidence, call 10 (nvidia-h200, one GPU; the session's last ~4 device minutes): the profile that the GPU
# tune wrote (tests/fixtures/h200x2-real/tune/profile.yaml) launched as is by `m3ctl serve --profile`, then one
# bench at the tuned concurrency, then stop.
set -u
exec > >(tee "$OUT/run10.log") 2>&1
t0=$(date +%s)
bash .bundle/setup.sh > "$OUT/setup.log" 2>&1
source .bundle/env.sh
export PYTHONPATH=$PWD/.snap:$PYTHONPATH M3CTL_STATE_DIR=/tmp/m3state COLUMNS=200
M="python3 -m m3ctl"
$M dev tiny-model /tmp/tm2 --head-dim 128 > /dev/null
echo "setup done at $(( $(date +%s) - t0 )) s"
timeout -s INT 150 $M serve --profile tests/fixtures/h200x2-real/tune/profile.yaml --model /tmp/tm2 --name tuned \
  --port 8050 --runtime process --detach; echo "serve rc=$?"
$M bench --deployment tuned --num-gpus 1 --concurrency 64 --num-prompts 256 --input-len 512 --output-len 256 \
  --output-json "$OUT/bench-tuned-c64.json" --no-progress > "$OUT/bench-tuned.txt" 2>&1; echo "bench rc=$?"; tail -25 "$OUT/bench-tuned.txt"
cp /tmp/m3state/logs/tuned.log "$OUT/log-tuned.txt" 2>/dev/null
$M stop --all; nvidia-smi --query-gpu=index,memory.used --format=csv
echo "call done at $(( $(date +%s) - t0 )) s"
