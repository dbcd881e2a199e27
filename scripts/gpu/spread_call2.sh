#!/usr/bin/env bash
# docs/results/h100-spread.md, call 2: the scale model with a tokenizer that covers its whole vocabulary (200,064 ids: the
# LM head's real cost kept, every sampled id decodes; m3ctl.dev.tiny_model.pad_vocabulary), on two fresh servers
# of one configuration (MiniMax-M2 shapes, 12 layers, FP8, --load-format dummy, vLLM defaults, plain `m3ctl serve`),
# c=64, 2,048 in / 128 out, fresh prompts. Server 1 also places the gap to `vllm bench serve`: m3ctl with
# --no-continuous-usage, m3ctl over 640 prompts (the length vllm bench serve runs), vllm bench serve 640.
# Carry .bundle (no fi.tar.xz) and .whl (site.tar.xz: orjson, psutil). Outputs under $OUT.
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); STOP_AT=${STOP_AT:-565}
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv | tee $OUT/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv,noheader -l 2 > $OUT/gpu-samples.csv 2>&1 &
$M dev scale-model /tmp/m2f --arch minimax-m2 --layers 12 --quant fp8 > /dev/null || { echo "scale-model failed"; exit 1; }
python3 -c "import json;print('vocab', json.load(open('/tmp/m2f/config.json'))['vocab_size'], 'tokenizer', len(json.load(open('/tmp/m2f/tokenizer.json'))['model']['vocab']))"
echo "setup done at $(( $(date +%s) - t0 )) s"
R=$OUT/runs; mkdir -p $R
bench() {  # TAG PORT SEED NPROMPTS [extra bench options]
  local tag=$1 port=$2 seed=$3 n=$4; shift 4
  [ "$(left)" -gt 40 ] || { echo "skip $tag: $(left) s left"; return; }
  timeout $(( $(left) - 10 )) $M bench --url http://127.0.0.1:$port --model /tmp/m2f --concurrency 64 --num-prompts $n \
    --input-len 2048 --output-len 128 --prompt-text fresh --seed $seed --num-gpus 1 --no-progress \
    --output-json $R/$tag.json "$@" > $R/$tag.txt 2>&1
  echo "$tag rc=$? at $(( $(date +%s) - t0 )) s: $(python3 -c "
import json;d=json.load(open('$R/$tag.json'));print(round(d['total_token_throughput']), 'tok/s p90tpot', round(d['p90_tpot_ms'],2), 'p50ttft', round(d['p50_ttft_ms']), 'dur', round(d['duration'],2), 'prep', d.get('run_phases_s',{}).get('prepare'))" 2>/dev/null)"
}
vbench() {  # TAG PORT SEED
  [ "$(left)" -gt 45 ] || { echo "skip $1: $(left) s left"; return; }
  timeout $(( $(left) - 10 )) vllm bench serve --backend vllm --base-url http://127.0.0.1:$2 --model /tmp/m2f --tokenizer /tmp/m2f \
    --dataset-name random --random-input-len 2048 --random-output-len 128 --num-prompts 640 --max-concurrency 64 \
    --ignore-eos --seed $3 --save-result --save-detailed --result-dir $R --result-filename $1.json > $R/$1.txt 2>&1
  echo "$1 rc=$? at $(( $(date +%s) - t0 )) s: $(grep -E "Total token throughput|P99 TPOT|Median TTFT|Benchmark duration|Peak concurrent" $R/$1.txt | tr -s ' ' | tr '\n' ';')"
}
serve() {  # NAME PORT
  echo "== $1 at $(( $(date +%s) - t0 )) s"
  timeout $(( $(left) - 20 )) $M serve --model /tmp/m2f --name $1 --port $2 --runtime process --detach --smoke quick -- --load-format dummy > $R/serve-$1.txt 2>&1
  echo "serve $1 rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "ready|✗" $R/serve-$1.txt
}
serve f1 8050
bench f1-warm 8050 301 64
bench f1-a 8050 302 256
bench f1-b 8050 303 256
bench f1-nocu 8050 304 256 --no-continuous-usage
bench f1-640 8050 305 640
vbench f1-vllm 8050 306
cp /tmp/m3state/logs/f1.log $R/log-f1.txt 2>/dev/null; $M stop f1 > /dev/null 2>&1
serve f2 8051
bench f2-warm 8051 401 64
bench f2-a 8051 402 256
bench f2-b 8051 403 256
cp /tmp/m3state/logs/f2.log $R/log-f2.txt 2>/dev/null; $M stop --all > /dev/null 2>&1
tar -C $OUT -czf $OUT/runs.tgz runs && rm -rf $R
echo "call done at $(( $(date +%s) - t0 )) s"
