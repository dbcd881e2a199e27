#!/usr/bin/env bash
# One device call on whichever Hopper GPU comes (carry .bundle WITH fi.tar.xz, and .whl; usage: bash scripts/gpu/call19.sh):
# is the single-user step a property of the host or of the server instance? (docs/results/estimate-fit.md: two H200
# hosts read 1.82 and 1.44 ms at c = 1.) On one host, two fresh servers of each model, one factor at a time:
#   floor A   the floor model (hopper_m3_call.sh part floor) at c = 1 and 4, 40 requests each
#   grid A    the scale model's decode sweep at c = 1, 4, 16, 64 (1,024 in / 256 out), no prefill sweep
#   floor B   a fresh floor-model server, the same bench with another seed
#   grid B    a fresh scale-model server, decode at c = 1 and 4
set -u
RES=res19 STOP_AT=${STOP_AT:-585}
source scripts/gpu/call-lib.sh
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | tee "$R/cpu.txt"
$M dev tiny-model /tmp/m3t --arch minimax-m3-release --head-dim 128 --overwrite > /dev/null || echo "tiny-model failed"
cp /tmp/m3t/config.json "$R/floor-config.json"
$M dev scale-model /tmp/m3b --arch minimax-m3 --layers 2 --quant bf16 --overwrite > /dev/null || { echo "scale-model failed"; exit 1; }
$M plan --model /tmp/m3b --runtime process --json -- --load-format dummy > "$R/plan.json" 2> "$R/plan.err"
echo "setup done at $(( $(date +%s) - t0 )) s"
serve floorA /tmp/m3t 8046; bench floorA floor-a --concurrency 1,4 --num-prompts 40 --seed 51; stop floorA
serve gridA /tmp/m3b 8043; bench gridA decode-a --concurrency 1,4,16,64 --seed 21; stop gridA
serve floorB /tmp/m3t 8047; bench floorB floor-b --concurrency 1,4 --num-prompts 40 --seed 53; stop floorB
serve gridB /tmp/m3b 8044; bench gridB decode-b --concurrency 1,4 --seed 23; stop gridB
$M stop --all > /dev/null 2>&1
pgrep -af "vllm serve" && echo "LEFT RUNNING" || echo "nothing left running"
echo "call done at $(( $(date +%s) - t0 )) s"
