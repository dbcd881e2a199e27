#!/usr/bin/env bash
# H200 evidence, call 7 (nvidia-h200-x2): (1) a tiny MiniMax-M3 in the release config format (vLLM's own
# MiniMaxM3Config; MSA layers, block size 128, dummy weights) served through m3ctl with the Hopper profile;
# (2) `m3ctl tune` of the tiny MiniMax-M2 over TP {1,2} x ngram depth {0..3} x max-num-seqs {64,128,1024}
# under a real SLO, its study dir written straight into $OUT so a later call can `--resume` it (call 8).
# m3ctl runs from .snap (git archive of the commit under test), so files being edited in the tree do not travel in.
set -u
exec > >(tee "$OUT/run7.log") 2>&1
t0=$(date +%s)
source scripts/gpu/snap-env.sh
$M dev tiny-model /tmp/tm2 --head-dim 128 > /dev/null
$M dev tiny-model /tmp/tm3r --arch minimax-m3-release --head-dim 128 > /dev/null
cp /tmp/tm3r/config.json "$OUT/tm3r-config.json"
echo "setup done at $(( $(date +%s) - t0 )) s"
# (1) MiniMax-M3 release format through m3ctl (plan, then serve; the diagnosis names the first real error)
$M plan --model /tmp/tm3r --runtime process --tp 1 -- --load-format dummy > "$OUT/plan-m3r.txt" 2>&1; echo "plan rc=$?" >> "$OUT/plan-m3r.txt"
timeout -s INT 200 $M serve --model /tmp/tm3r --name m3r --port 8031 --runtime process --tp 1 --detach -- --load-format dummy > "$OUT/serve-m3r.txt" 2>&1; echo "serve rc=$?" >> "$OUT/serve-m3r.txt"
cat "$OUT/plan-m3r.txt" "$OUT/serve-m3r.txt"
cp /tmp/m3state/logs/m3r.log "$OUT/log-m3r.txt" 2>/dev/null
$M stop --all > /dev/null 2>&1
echo "m3 done at $(( $(date +%s) - t0 )) s"
# (2) tune, study dir in $OUT (comes back even if the call's limit ends it)
left=$(( 560 - ($(date +%s) - t0) ))
timeout -s INT $left $M tune --model /tmp/tm2 --study-dir "$OUT/study" --port 8040 \
  --slo "p90_tpot_ms<=3,p90_ttft_ms<=200" --objective tput_per_gpu \
  --knob tp=1,2 --knob spec_depth=0-3 --knob max_num_seqs=64,128,1024 --knob dcp=1 --knob ep=false --knob dbo=false \
  --knob max_num_batched_tokens=8192 --knob kv_cache_dtype=default \
  --ladder 8,16,32,64,96,128,192 --input-len 512 --output-len 256 --prompts-per-concurrency 4 \
  --max-trials 12 --time-budget $(( left - 150 )) --confirm-top 1 --pareto; echo "tune rc=$?"
$M stop --all; nvidia-smi --query-gpu=index,memory.used --format=csv
echo "call done at $(( $(date +%s) - t0 )) s"
