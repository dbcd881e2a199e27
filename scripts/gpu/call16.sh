#!/usr/bin/env bash
# Tune trial against plain serve, measured the same way (docs/results/tune-vs-grid.md, "trial against plain"):
# the MiniMax-M2 scale model (12 layers, FP8, dummy weights, a tokenizer covering its vocabulary), vLLM's defaults
# with CUDA graphs captured up to 64 (the tune's bound for a ladder of 64); c=64, 2,048 in / 128 out, fresh prompts,
# --precision 3% on total tok/s with --max-duration 25, stagger auto (the default), a warm-up wave per run.
#   trial  `m3ctl tune` with a one-configuration space (the defaults' baseline only): the trial server's one run
#   p1, p2 two fresh plain `m3ctl serve` servers with the trial's one engine flag, RUNS `m3ctl bench` runs each
# GPU power, SM clock and clock-event reasons every 5 s (samples.txt). Carry .bundle .whl (optuna in site.tar.xz).
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); STOP_AT=${STOP_AT:-540}; RUNS=${RUNS:-3}
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee "$OUT/host.txt"
R=/tmp/tp; rm -rf $R /tmp/sm2 /tmp/study16; mkdir -p $R; trap 'tar -C /tmp -czf "$OUT/tp.tgz" --exclude=vllm-cache tp study16' EXIT
$M dev scale-model /tmp/sm2 --arch minimax-m2 --layers 12 --quant fp8 > /dev/null || { echo "scale-model failed"; exit 1; }
source scripts/gpu/sampler.sh; start_sampler "$OUT/samples.txt"
echo "setup done at $(( $(date +%s) - t0 )) s"
timeout -s INT 200 $M tune --model /tmp/sm2 --study-dir /tmp/study16 --port 8040 --slo "p90_tpot_ms<=20" \
  --objective tput_per_gpu --knob tp=1 --knob dcp=1 --knob ep=false --knob dbo=false --knob spec_depth=0 \
  --knob max_num_seqs=1024 --knob max_num_batched_tokens=8192 --knob kv_cache_dtype=default \
  --ladder 64 --input-len 2048 --output-len 128 --prompt-text fresh --precision 3% --max-duration 25 \
  --max-trials 1 --time-budget 150 --confirm-top 0 -- --load-format dummy > $R/tune.log 2>&1
echo "tune rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "^ *base|^baseline" $R/tune.log
$M stop --all > /dev/null 2>&1
seed=600
for s in p1 p2; do
  [ "$(left)" -gt 110 ] || { echo "skip $s: $(left) s left"; continue; }
  timeout $(( $(left) - 20 )) $M serve --model /tmp/sm2 --name $s --port 8050 --runtime process --detach --smoke quick -- \
    --load-format dummy --compilation-config '{"max_cudagraph_capture_size": 64}' > $R/serve-$s.txt 2>&1
  echo "serve $s rc=$? at $(( $(date +%s) - t0 )) s"
  for k in $(seq 1 $RUNS); do
    [ "$(left)" -gt 45 ] || { echo "skip $s r$k: $(left) s left"; continue; }
    seed=$((seed + 1))
    timeout $(( $(left) - 5 )) $M bench --deployment $s --concurrency 64 --precision 3% --precision-metric total_token_throughput \
      --max-duration 25 --input-len 2048 --output-len 128 --warmup --tokenizer /tmp/sm2 --seed $seed --no-progress \
      --label "$s r$k" --output-json $R/$s-r$k.json > $R/$s-r$k.txt 2>&1
    echo "$s r$k rc=$? at $(( $(date +%s) - t0 )) s: $(python3 -c "
import json;d=json.load(open('$R/$s-r$k.json'));u=d['uncertainty'];print(round(d['total_token_throughput']), 'tok/s', 'p90tpot', round(d['p90_tpot_ms'],2), 'p50ttft', round(d['p50_ttft_ms']))" 2>/dev/null)"
  done
  $M stop $s > /dev/null 2>&1
done
echo "call done at $(( $(date +%s) - t0 )) s"
