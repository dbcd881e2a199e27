#!/usr/bin/env bash
# H200 evidence, call 2 (nvidia-h200-x2): plan-rule evidence on real vLLM 0.26 through m3ctl.
# FP8 KV, ngram speculation, NVFP4 KV (expected failure), TP2 + DCP2, GQA DCP refusal, DBO without DeepEP,
# and a text-only tiny MiniMax-M3. m3ctl's own rejections are recorded before each --skip-checks run.
set -u
R=$OUT/r; mkdir -p "$R"
exec > >(tee "$OUT/run2.log") 2>&1
ts() { date +%s.%N; }
T0=$(ts)
bash .bundle/setup.sh > "$R/setup.log" 2>&1
source .bundle/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH M3CTL_STATE_DIR=/tmp/m3state COLUMNS=200
M="python3 -m m3ctl"
el() { python3 -c "print(round($(ts)-$T0,1))"; }
$M dev tiny-model /tmp/tm2 --head-dim 128 >/dev/null; $M dev tiny-model /tmp/tm2kv1 --head-dim 128 --kv-heads 1 >/dev/null
$M dev tiny-model /tmp/tm3t --arch minimax-m3-text --head-dim 128 >/dev/null
B="--num-gpus 1 --concurrency 16 --num-prompts 128 --input-len 512 --output-len 256"
# m3ctl's verdicts before launch (milliseconds, no GPU work)
for args in "--kv-cache-dtype nvfp4" "--tp 2 --dcp 2" "--dp 2 --ep --dbo" "--kv-cache-dtype fp8" "--spec-depth 3"; do
  echo "== plan tm2 $args"; $M plan --model /tmp/tm2 --runtime process $args > /dev/null 2> "$R/plan-err.txt"; echo "rc=$?"; cat "$R/plan-err.txt"
done > "$R/plan-verdicts.txt" 2>&1
echo "== phase 1 $(el)"
( CUDA_VISIBLE_DEVICES=0 timeout 280 $M serve --model /tmp/tm2 --name fp8kv --port 8021 --tp 1 --kv-cache-dtype fp8 --detach > "$R/serve-fp8kv.txt" 2>&1
  echo "rc=$?" >> "$R/serve-fp8kv.txt"
  $M bench --deployment fp8kv $B --output-json "$R/bench-fp8kv.json" > "$R/bench-fp8kv.txt" 2>&1
  $M logs fp8kv -n 300 > "$R/log-fp8kv.txt"; $M stop fp8kv >> "$R/serve-fp8kv.txt" 2>&1 ) &
P1=$!
( CUDA_VISIBLE_DEVICES=1 timeout 200 $M serve --model /tmp/tm2 --name nvfp4kv --port 8022 --tp 1 --kv-cache-dtype nvfp4 --skip-checks --detach > "$R/serve-nvfp4kv.txt" 2>&1
  echo "rc=$?" >> "$R/serve-nvfp4kv.txt"; cp /tmp/m3state/logs/nvfp4kv.log "$R/log-nvfp4kv.txt" 2>/dev/null
  CUDA_VISIBLE_DEVICES=1 timeout 200 $M serve --model /tmp/tm3t --name m3t --port 8023 --tp 1 --detach -- --load-format dummy > "$R/serve-m3t.txt" 2>&1
  echo "rc=$?" >> "$R/serve-m3t.txt"; cp /tmp/m3state/logs/m3t.log "$R/log-m3t.txt" 2>/dev/null
  $M bench --deployment m3t --num-gpus 1 --concurrency 4 --num-prompts 16 --input-len 256 --output-len 64 --output-json "$R/bench-m3t.json" > "$R/bench-m3t.txt" 2>&1
  $M stop m3t >> "$R/serve-m3t.txt" 2>&1 ) &
P2=$!
wait $P1
echo "== phase 2 (ngram) $(el)"
( CUDA_VISIBLE_DEVICES=0 timeout 280 $M serve --model /tmp/tm2 --name ngram --port 8024 --tp 1 --spec-depth 3 --detach > "$R/serve-ngram.txt" 2>&1
  echo "rc=$?" >> "$R/serve-ngram.txt"
  $M bench --deployment ngram $B --output-json "$R/bench-ngram.json" > "$R/bench-ngram.txt" 2>&1
  $M logs ngram -n 300 > "$R/log-ngram.txt"; $M stop ngram >> "$R/serve-ngram.txt" 2>&1 ) &
P3=$!
wait $P2 $P3
echo "== phase 3 (TP2 + DCP2, kv heads 1) $(el)"
timeout 280 $M serve --model /tmp/tm2kv1 --name dcp --port 8025 --tp 2 --dcp 2 --detach > "$R/serve-dcp.txt" 2>&1; echo "rc=$?" >> "$R/serve-dcp.txt"
$M bench --deployment dcp --num-gpus 2 --concurrency 16 --num-prompts 128 --input-len 512 --output-len 256 --output-json "$R/bench-dcp.json" > "$R/bench-dcp.txt" 2>&1
$M logs dcp -n 300 > "$R/log-dcp.txt"; $M stop dcp >> "$R/serve-dcp.txt" 2>&1
echo "== phase 4 (expected failures: GQA DCP, DBO without DeepEP) $(el)"
( CUDA_VISIBLE_DEVICES=0,1 timeout 150 $M serve --model /tmp/tm2 --name gqadcp --port 8026 --tp 2 --dcp 2 --skip-checks --detach > "$R/serve-gqadcp.txt" 2>&1
  echo "rc=$?" >> "$R/serve-gqadcp.txt"; cp /tmp/m3state/logs/gqadcp.log "$R/log-gqadcp.txt" 2>/dev/null )
( timeout 150 $M serve --model /tmp/tm2 --name dbo --port 8027 --dp 2 --tp 1 --ep --dbo --skip-checks --detach -- --all2all-backend deepep_low_latency > "$R/serve-dbo.txt" 2>&1
  echo "rc=$?" >> "$R/serve-dbo.txt"; cp /tmp/m3state/logs/dbo.log "$R/log-dbo.txt" 2>/dev/null )
$M status > "$R/status-end.txt" 2>&1; $M stop --all >> "$R/status-end.txt" 2>&1
nvidia-smi --query-gpu=index,memory.used --format=csv > "$R/gpu-mem-end.csv"
for f in "$R"/serve-*.txt; do echo "== $f"; tail -4 "$f"; done
echo "total $(el) s"
tar -C "$OUT" -czf "$OUT/call2.tgz" r && rm -rf "$R"
