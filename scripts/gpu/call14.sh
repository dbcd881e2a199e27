#!/usr/bin/env bash
# Independent users against users in lockstep, on one server (docs/results/in-run-intervals.md; carry .bundle .whl;
# usage: bash scripts/gpu/call14.sh). The setup of call13.sh's interval runs: the MiniMax-M2 scale model, 12 layers,
# FP8, dummy weights, vLLM's defaults with CUDA graphs captured up to 64; c=64, 2,048 in / 128 out, fresh prompts
# built with the model's own tokenizer.json, --precision 2% --max-duration 25, each run with its warm-up wave.
# Runs alternate `--stagger off` (lockstep: every lane's first request at the start) and `--stagger auto` (lane k
# of 64 at k x S / 64, S the warm-up's median latency), PAIRS of each. GPU power, SM clock and clock-event reasons
# every 5 s (samples.txt).
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); STOP_AT=${STOP_AT:-575}; PAIRS=${PAIRS:-3}
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee "$OUT/host.txt"
R=/tmp/st; mkdir -p $R; trap 'tar -C /tmp -czf "$OUT/st.tgz" st' EXIT
$M dev scale-model /tmp/sm2 --arch minimax-m2 --layers 12 --quant fp8 --overwrite > /dev/null || { echo "scale-model failed"; exit 1; }
source scripts/gpu/sampler.sh; start_sampler "$OUT/samples.txt"
echo "setup done at $(( $(date +%s) - t0 )) s"
timeout -s INT $(( $(left) - 20 )) $M serve --model /tmp/sm2 --name st --port 8061 --runtime process --detach -- \
  --load-format dummy --compilation-config '{"max_cudagraph_capture_size": 64}' > $R/serve.txt 2>&1
echo "serve rc=$? at $(( $(date +%s) - t0 )) s"; tail -3 $R/serve.txt
B="$M bench --deployment st --prompt-text fresh --tokenizer /tmp/sm2 --num-gpus 1 --no-progress --input-len 2048 --output-len 128 --ignore-eos --concurrency 64 --precision 2% --max-duration 25 --num-prompts 1280"
k=0
for p in $(seq 1 "$PAIRS"); do
  for mode in off auto; do
    [ "$(left)" -gt 60 ] || break 2
    k=$(( k + 1 ))
    timeout $(( $(left) - 10 )) $B --stagger $mode --seed $(( 200 + k )) --output-json $R/$mode$p.json > $R/$mode$p.txt 2>&1
    echo "run $mode$p rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "steady-state total|precision of|valid " $R/$mode$p.txt | head -4
  done
done
grep -E "WARNING|ERROR" /tmp/m3state/logs/st.log | tail -20 > $R/log-warnings.txt; $M stop --all > /dev/null 2>&1; kill "$SAMPLER" 2>/dev/null
echo "call done at $(( $(date +%s) - t0 )) s"
