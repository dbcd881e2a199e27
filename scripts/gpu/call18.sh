#!/usr/bin/env bash
# One device call after call17.sh's routing part (carry .bundle WITH fi.tar.xz, and .whl; usage: bash scripts/gpu/call18.sh):
# greedy decoding of dummy weights repeats one token per user, and sampling at temperature 1 made the M3 scale model's
# decode 6-9 % slower. Two things the fit needs from that:
#   sampler  what sampling itself costs a step: the floor model (tiny dimensions, 4 experts: no routing to speak of)
#            at c = 16 and 64, greedy then `--temperature 1` (192 requests each);
#   grid     the scale model's decode sweep (c = 1, 4, 16, 64, 1,024 in / 256 out) sampled at temperature 1: the fit's
#            decode points with routing spread over the experts.
set -u
RES=res18 STOP_AT=${STOP_AT:-420}
source scripts/gpu/call-lib.sh
$M dev tiny-model /tmp/m3t --arch minimax-m3-release --head-dim 128 --overwrite > /dev/null || echo "tiny-model failed"
$M dev scale-model /tmp/m3b --arch minimax-m3 --layers 2 --quant bf16 --overwrite > /dev/null || { echo "scale-model failed"; exit 1; }
serve m3floor /tmp/m3t 8046
bench m3floor floor-greedy --concurrency 16,64 --num-prompts 192 --seed 81
bench m3floor floor-sampled --concurrency 16,64 --num-prompts 192 --seed 82 --temperature 1
stop m3floor
serve m3default /tmp/m3b 8043
bench m3default decode-sampled --concurrency 1,4,16,64 --seed 83 --temperature 1
stop m3default
$M stop --all > /dev/null 2>&1
pgrep -af "vllm serve" && echo "LEFT RUNNING" || echo "nothing left running"
echo "call done at $(( $(date +%s) - t0 )) s"
