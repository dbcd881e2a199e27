#!/usr/bin/env bash
# H200 evidence, call 1 (nvidia-h200-x2, about 7 min): doctor, plan, serve/bench/stop of a tiny MiniMax-M2 through
# m3ctl's process runtime, `vllm bench serve` side by side, and a tiny MiniMax-M3 (MSA) with dummy weights.
# Run from the repo root on the GPU host with the offline vLLM bundle in .bundle (docs/sources.md#h200-the-offline-vllm-bundle).
set -u
R=$OUT/r; mkdir -p "$R"
exec > >(tee "$OUT/run1.log") 2>&1
ts() { date +%s.%N; }
T0=$(ts)
bash .bundle/setup.sh > "$R/setup.log" 2>&1 || { echo "setup failed"; tail -20 "$R/setup.log"; }
source .bundle/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH M3CTL_STATE_DIR=/tmp/m3state COLUMNS=200
M="python3 -m m3ctl"
echo "setup done in $(python3 -c "print(round($(ts)-$T0,1))") s"
nvidia-smi > "$R/nvidia-smi.txt"
$M --version
for f in "" "-v"; do $M doctor $f > "$R/doctor$f.txt" 2>&1; echo "doctor$f rc=$?"; done
$M doctor --json --save-inventory "$R/inventory.json" > "$R/doctor.json" 2>&1; echo "doctor json rc=$?"
$M doctor --json --model MiniMax-M3.1-Flash > "$R/doctor-flash.json" 2>&1; echo "doctor flash rc=$?"
$M plan --model MiniMax-M3.1-Flash > "$R/plan-flash.txt" 2>&1; echo "plan flash rc=$?"
$M plan --model MiniMax-M3.1-Flash --max-model-len 131072 --allow-emulated --json > "$R/plan-flash-emulated.json" 2>&1; echo "plan flash emulated rc=$?"
$M dev tiny-model /tmp/tm2 --head-dim 128 > /dev/null && $M dev tiny-model /tmp/tm3 --arch minimax-m3 --head-dim 128 > /dev/null
$M plan --model /tmp/tm2 --runtime process --tp 1 --json > "$R/plan-tm2.json" 2>&1; echo "plan tm2 rc=$?"
# MiniMax-M3 (MSA) with dummy weights on GPU1, in parallel with the M2 work on GPU0.
( CUDA_VISIBLE_DEVICES=1 $M serve --model /tmp/tm3 --name m3 --port 8012 --tp 1 --detach --startup-timeout 300 \
    -- --load-format dummy --language-model-only > "$R/serve-m3.txt" 2>&1; echo "serve m3 rc=$?" >> "$R/serve-m3.txt" ) &
M3PID=$!
CUDA_VISIBLE_DEVICES=0 $M serve --model /tmp/tm2 --name m2 --port 8011 --tp 1 --detach > "$R/serve-m2.txt" 2>&1; echo "serve m2 rc=$?"
cat "$R/serve-m2.txt"
$M status --json > "$R/status.json"
$M bench --deployment m2 --num-gpus 1 --concurrency 1,4,16,64 --num-prompts 128 --input-len 512 --output-len 256 \
   --output-json "$R/bench-sweep.json" --plot "$R/pareto.png" --usd-per-gpu-hour 3.5 > "$R/bench-sweep.txt" 2>&1; echo "bench sweep rc=$?"
$M bench --deployment m2 --num-gpus 1 --concurrency 16 --num-prompts 256 --input-len 512 --output-len 256 \
   --output-json "$R/bench-m3ctl-c16.json" > "$R/bench-m3ctl-c16.txt" 2>&1; echo "bench c16 rc=$?"
vllm bench serve --backend openai --base-url http://127.0.0.1:8011 --endpoint /v1/completions --model m2 \
   --tokenizer /tmp/tm2 --dataset-name random --random-input-len 512 --random-output-len 256 --num-prompts 256 \
   --max-concurrency 16 --ignore-eos --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
   --save-result --result-dir "$R" --result-filename vllm-bench-c16.json --disable-tqdm > "$R/vllm-bench-c16.txt" 2>&1; echo "vllm bench rc=$?"
$M logs m2 -n 400 > "$R/log-m2.txt" 2>&1
wait $M3PID; cat "$R/serve-m3.txt"
$M logs m3 -n 400 > "$R/log-m3.txt" 2>&1 || cp /tmp/m3state/logs/m3.log "$R/log-m3.txt" 2>/dev/null
$M status > "$R/status.txt" 2>&1
$M stop --all > "$R/stop.txt" 2>&1; echo "stop rc=$?"; cat "$R/stop.txt"
nvidia-smi --query-gpu=index,memory.used --format=csv > "$R/gpu-mem-after-stop.csv"; cat "$R/gpu-mem-after-stop.csv"
echo "total $(python3 -c "print(round($(ts)-$T0,1))") s"
tar -C "$OUT" -czf "$OUT/call1.tgz" r && rm -rf "$R"
