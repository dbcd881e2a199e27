#!/usr/bin/env bash
# H200 evidence, call 4 (nvidia-h200, one GPU): doctor on a 1-GPU host, and one full vLLM startup log of the tiny
# MiniMax-M2 served through m3ctl with the Hopper profile's kernel expectations (kernel verification).
set -u
R=$OUT/r; mkdir -p "$R"
exec > >(tee "$OUT/run4.log") 2>&1
bash .bundle/setup.sh > "$R/setup.log" 2>&1
source .bundle/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH M3CTL_STATE_DIR=/tmp/m3state COLUMNS=200
M="python3 -m m3ctl"
$M doctor > "$R/doctor.txt" 2>&1; echo "doctor rc=$?"
$M doctor --json --save-inventory "$R/inventory.json" > "$R/doctor.json" 2>&1; echo "doctor json rc=$?"
$M plan --model MiniMax-M3.1-Flash > "$R/plan-flash.txt" 2>&1; echo "plan flash rc=$?"
$M dev tiny-model /tmp/tm2 --head-dim 128 > /dev/null
timeout 300 $M serve --model /tmp/tm2 --name m2 --port 8041 --detach > "$R/serve-m2.txt" 2>&1; echo "serve rc=$?"; cat "$R/serve-m2.txt"
$M bench --deployment m2 --concurrency 8 --num-prompts 64 --input-len 256 --output-len 128 --output-json "$R/bench.json" > /dev/null 2>&1; echo "bench rc=$?"
cp /tmp/m3state/logs/m2.log "$R/log-m2-full.txt"
$M stop --all; nvidia-smi --query-gpu=index,memory.used --format=csv
tar -C "$OUT" -czf "$OUT/call4.tgz" r && rm -rf "$R"
