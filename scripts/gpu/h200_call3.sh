#!/usr/bin/env bash
# H200 evidence, call 3 (nvidia-h200, one GPU): a tiny text-only MiniMax-M3 (MSA) with release-format config
# fields and dummy weights, served through m3ctl with the Hopper profile (block size 128), then benched.
set -u
R=$OUT/r; mkdir -p "$R"
exec > >(tee "$OUT/run3.log") 2>&1
bash .bundle/setup.sh > "$R/setup.log" 2>&1
source .bundle/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH M3CTL_STATE_DIR=/tmp/m3state COLUMNS=200
M="python3 -m m3ctl"
$M dev tiny-model /tmp/tm3t --arch minimax-m3-text --head-dim 128 > /dev/null
$M plan --model /tmp/tm3t --runtime process -- --load-format dummy > "$R/plan-m3t.txt" 2>&1
timeout 300 $M serve --model /tmp/tm3t --name m3t --port 8031 --detach -- --load-format dummy > "$R/serve-m3t.txt" 2>&1; echo "rc=$?" >> "$R/serve-m3t.txt"
cat "$R/serve-m3t.txt"
$M bench --deployment m3t --num-gpus 1 --concurrency 1,8 --num-prompts 32 --input-len 1024 --output-len 128 --output-json "$R/bench-m3t.json" > "$R/bench-m3t.txt" 2>&1; echo "bench rc=$?"
cp /tmp/m3state/logs/m3t.log "$R/log-m3t.txt" 2>/dev/null
$M stop --all; nvidia-smi --query-gpu=index,memory.used --format=csv
tar -C "$OUT" -czf "$OUT/call3.tgz" r && rm -rf "$R"
