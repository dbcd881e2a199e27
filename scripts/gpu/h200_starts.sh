#!/usr/bin/env bash
# docs/results/h200-starts.md, H200 call 1: where a trial server's start goes, and what the study's start measures
# (m3ctl/tuning/startup.py) take off it. The MiniMax-M2 scale model (16 layers, FP8, dummy weights), each start through
# `m3ctl serve --smoke quick` (what a tune trial runs), then stopped; the server logs come back for
# m3ctl.tuning.startup.start_breakdown. Carry .bundle .whl.
#   A  cold, vLLM's default cache root (~/.cache/vllm in a fresh HOME), vLLM's default capture sizes: a trial today
#   B  A again (default cache now warm, same key)
#   C  study measures: own VLLM_CACHE_ROOT (cold) + capture bound 128 (a ladder topping at c=128)
#   D  C again (warm): the start every later trial with the same compile key gets
#   E  C's cache with --max-num-seqs 128 (another scheduler knob: same compile key?)
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s)
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$M dev scale-model /tmp/sm2 --arch minimax-m2 --layers 16 --quant fp8 > /dev/null || { echo "scale-model failed"; exit 1; }
echo "setup done at $(( $(date +%s) - t0 )) s"
BOUND='--compilation-config {"max_cudagraph_capture_size":128}'
start() {  # TAG HOME CACHE_ROOT|- vLLM args...
  local tag=$1 home=$2 root=$3; shift 3
  local s=$(date +%s.%N)
  if [ "$root" = - ]; then
    HOME=$home $M serve --model /tmp/sm2 --name $tag --port 8040 --runtime process --smoke quick --detach -- --load-format dummy "$@" > $OUT/serve-$tag.txt 2>&1
  else
    HOME=$home VLLM_CACHE_ROOT=$root $M serve --model /tmp/sm2 --name $tag --port 8040 --runtime process --smoke quick --detach -- --load-format dummy "$@" > $OUT/serve-$tag.txt 2>&1
  fi
  echo "$tag rc=$? wall=$(python3 -c "import time;print(round(time.time()-$s,1))") s at $(( $(date +%s) - t0 )) s"
  $M status --json > $OUT/status-$tag.json 2>/dev/null
  cp /tmp/m3state/logs/$tag.log $OUT/log-$tag.txt 2>/dev/null || find /tmp/m3state -name "$tag*" -exec cp {} $OUT/ \;
  $M stop $tag > /dev/null 2>&1
}
start A /tmp/hA -
start B /tmp/hA -
start C /tmp/hC /tmp/cacheC $BOUND
start D /tmp/hC /tmp/cacheC $BOUND
[ $(( $(date +%s) - t0 )) -lt 470 ] && start E /tmp/hC /tmp/cacheC $BOUND --max-num-seqs 128
ls /tmp/m3state /tmp/m3state/* | head -20
du -sh /tmp/cacheC /tmp/hA/.cache/vllm 2>/dev/null
$M stop --all > /dev/null 2>&1; nvidia-smi --query-gpu=index,memory.used --format=csv
echo "call done at $(( $(date +%s) - t0 )) s"
