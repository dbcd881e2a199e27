#!/usr/bin/env bash
# H200 evidence for docs/results/h200-m3.md after the workload smoke (nvidia-h200, one GPU; vLLM 0.26 bundle):
#   h200_m3_smoke.sh fail   MiniMax-M3 scale models (real per-layer shapes, dummy weights) through `m3ctl serve`:
#                           NVFP4 x 8 layers and BF16 x 2 layers. The smoke's long prompt must kill the MSA path
#                           and serve must exit 4 naming MSA sparse attention, with nothing left running.
#   h200_m3_smoke.sh ready  the same BF16 x 2 model with `--attention dense` (the fallback on request) and the
#                           MiniMax-M2 scale model (16 layers, FP8): both must come up ready with the full smoke; the
#                           smoke's duration is in the JSON events (serve --json).
# Carry .bundle (docs/sources.md#h200-the-offline-vllm-bundle, WITH_EXTRAS=0) and .whl (orjson, psutil, docker wheels).
# m3ctl runs from the working tree. Outputs under $OUT: call.log, serve-*.jsonl, log-*.txt, status-*.txt.
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); MODE=${1:?fail|ready}; STOP_AT=${STOP_AT:-575}
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
bash .bundle/setup.sh > "$OUT/setup.log" 2>&1 || { echo "bundle setup failed"; tail -20 "$OUT/setup.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
source .bundle/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH:/tmp/site M3CTL_STATE_DIR=/tmp/m3state COLUMNS=200
M="python3 -P -m m3ctl"
echo "setup done at $(( $(date +%s) - t0 )) s"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv

serve_case() {  # TAG MODEL_DIR [m3ctl serve options...] : serve, record rc, the JSON events, status, the log; stop
  local tag=$1 model=$2; shift 2
  echo "== $tag at $(( $(date +%s) - t0 )) s (left $(left) s)"
  local s0; s0=$(date +%s.%N)
  timeout -s INT $(( $(left) - 30 )) $M serve --model "$model" --name "$tag" --runtime process --detach "$@" \
    > "$OUT/serve-$tag.txt" 2>&1
  echo "serve $tag rc=$? wall $(python3 -c "import time;print(round(time.time()-$s0,1))") s"
  cat "$OUT/serve-$tag.txt"
  $M status > "$OUT/status-$tag.txt" 2>&1; cat "$OUT/status-$tag.txt"
  cp "/tmp/m3state/logs/$tag.log" "$OUT/log-$tag.txt" 2>/dev/null
  $M stop "$tag" > /dev/null 2>&1
  pgrep -af "vllm serve" && echo "LEFT RUNNING after $tag" || echo "nothing left running after $tag"
}
if [ "$MODE" = fail ]; then
  $M dev scale-model /tmp/m3n --arch minimax-m3 --layers 8 --quant nvfp4 > /dev/null || exit 1
  $M dev scale-model /tmp/m3b --arch minimax-m3 --layers 2 --quant bf16 > /dev/null || exit 1
  serve_case m3bf16 /tmp/m3b --port 8041 -- --load-format dummy
  serve_case m3nvfp4 /tmp/m3n --port 8042 --allow-emulated -- --load-format dummy
else
  $M dev scale-model /tmp/m3b --arch minimax-m3 --layers 2 --quant bf16 > /dev/null || exit 1
  $M dev scale-model /tmp/sm2 --arch minimax-m2 --layers 16 --quant fp8 > /dev/null || exit 1
  serve_case m3dense /tmp/m3b --port 8043 --attention dense -- --load-format dummy
  serve_case m2 /tmp/sm2 --port 8044 -- --load-format dummy
fi
$M stop --all > /dev/null 2>&1; nvidia-smi --query-gpu=index,memory.used --format=csv
echo "call done at $(( $(date +%s) - t0 )) s"
