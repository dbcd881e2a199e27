#!/usr/bin/env bash
# One device call that serves whichever Hopper GPU comes (carry .bundle .whl; usage: bash scripts/gpu/call13.sh).
#   H200: the estimate fit's grid on the M3 scale model (hopper_m3_call.sh, part grid), the runs an H100 already gave
#         (tests/fixtures/estimate-fit/h100/), for the H100 <-> H200 cross-prediction (docs/results/estimate-fit.md).
#   H100: the in-run intervals on the GPU (docs/results/tune-vs-grid.md): one plain server of the spread setup
#         (MiniMax-M2 scale model, 12 layers, FP8, dummy weights, vLLM's defaults, CUDA graphs captured up to 64),
#         a warm-up wave, then RUNS bench runs at c=64, 2,048 in / 128 out, fresh prompts, --precision 2%
#         --max-duration 30: each run's interval against the runs' own spread. GPU power, SM clock and clock-event
#         reasons are sampled every 5 s (samples.txt).
set -u
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
[ -n "${MODE:-}" ] || case "$NAME" in *H200*) PARTS=grid exec bash scripts/gpu/hopper_m3_call.sh;; esac
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); STOP_AT=${STOP_AT:-570}; RUNS=${RUNS:-3}
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee "$OUT/host.txt"
R=/tmp/iv; mkdir -p $R; trap 'tar -C /tmp -czf "$OUT/iv.tgz" iv' EXIT
$M dev scale-model /tmp/sm2 --arch minimax-m2 --layers 12 --quant fp8 --overwrite > /dev/null || { echo "scale-model failed"; exit 1; }
source scripts/gpu/sampler.sh; start_sampler "$OUT/samples.txt"
echo "setup done at $(( $(date +%s) - t0 )) s"
timeout -s INT $(( $(left) - 20 )) $M serve --model /tmp/sm2 --name iv --port 8060 --runtime process --detach -- \
  --load-format dummy --compilation-config '{"max_cudagraph_capture_size": 64}' > $R/serve.txt 2>&1
echo "serve rc=$? at $(( $(date +%s) - t0 )) s"; tail -5 $R/serve.txt
B="$M bench --deployment iv --prompt-text fresh --num-gpus 1 --no-progress --input-len 2048 --output-len 128 --ignore-eos --concurrency 64"
$B --num-prompts 64 --no-warmup --seed 100 --output-json $R/warm.json > $R/warm.txt 2>&1; echo "warm rc=$?"
for k in $(seq 1 "$RUNS"); do
  [ "$(left)" -gt 70 ] || break
  $B --no-warmup --precision 2% --max-duration 30 --seed $(( 100 + k )) --output-json $R/run$k.json > $R/run$k.txt 2>&1
  echo "run $k rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "tok/s|interval|precision|valid" $R/run$k.txt | head -8
done
cp /tmp/m3state/logs/iv.log $R/log.txt 2>/dev/null; $M stop --all > /dev/null 2>&1; kill "$SAMPLER" 2>/dev/null
echo "call done at $(( $(date +%s) - t0 )) s"
