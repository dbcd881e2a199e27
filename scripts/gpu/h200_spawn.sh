#!/usr/bin/env bash
# docs/results/h200-starts.md, H200 call 3: what fills the ~20 s between the API server's last config line and the engine-core
# process's first line, and the API server's ~20 s of imports. One start of the M2 scale model with vLLM's DEBUG
# log (the study's cache root and capture bound), and python -X importtime of the API server module. Carry .bundle .whl.
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s)
source scripts/gpu/wt-env.sh
$M dev scale-model /tmp/sm2 --arch minimax-m2 --layers 16 --quant fp8 > /dev/null || exit 1
echo "setup done at $(( $(date +%s) - t0 )) s"
python3 -X importtime -c "import vllm.entrypoints.openai.api_server" 2> $OUT/importtime.txt; echo "import rc=$? at $(( $(date +%s) - t0 )) s"
s=$(date +%s.%N)
VLLM_LOGGING_LEVEL=DEBUG VLLM_CACHE_ROOT=/tmp/cacheS timeout 200 $M serve --model /tmp/sm2 --name S --port 8040 --runtime process --smoke quick --detach -- --load-format dummy --compilation-config '{"max_cudagraph_capture_size":128}' > $OUT/serve-S.txt 2>&1
echo "S rc=$? wall=$(python3 -c "import time;print(round(time.time()-$s,1))") s"
gzip -c /tmp/m3state/logs/S.log > $OUT/log-S.txt.gz
$M stop --all > /dev/null 2>&1
echo "call done at $(( $(date +%s) - t0 )) s"
