#!/usr/bin/env bash
# docs/results/h100-spread.md, call 1: where the spread between the tune's study (docs/results/h200-study11.md) and a plain
# serve + bench comes from, one factor at a time, on one GPU, one lease. The workload is the plain setup of
# the earlier three-server H100 recording (MiniMax-M2 shapes, 12 layers, FP8, --load-format dummy, c=64,
# 2,048 in / 128 out, fresh prompts, vLLM defaults through a plain `m3ctl serve`). Factors:
#   vocab   the scale model's config vocab_size 200,064 (what `m3ctl dev scale-model` writes, with a 2,048-token
#           tokenizer) against 2,048 (the tokenizer's size), each on its own fresh server;
#   client  on the vocab-2,048 server: m3ctl bench as is, with --client-procs 2, with --http-client aiohttp, and
#           `vllm bench serve` (random dataset, same lengths, --ignore-eos), to place the 8 % between the two clients.
# GPU clock/power/temperature/utilisation sampled every 2 s. Carry .bundle (WITH_EXTRAS=0, no fi.tar.xz) and
# .whl (site.tar.xz: orjson, psutil for CPython 3.12). Outputs under $OUT.
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); STOP_AT=${STOP_AT:-570}
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv | tee $OUT/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv,noheader -l 2 > $OUT/gpu-samples.csv 2>&1 &
$M dev scale-model /tmp/m2v --arch minimax-m2 --layers 12 --quant fp8 > /dev/null || { echo "scale-model failed"; exit 1; }
cp -r /tmp/m2v /tmp/m2s
python3 - <<'PY'
import json
p = "/tmp/m2s/config.json"; c = json.load(open(p)); print("vocab_size was", c["vocab_size"]); c["vocab_size"] = 2048
json.dump(c, open(p, "w"), indent=2)
PY
echo "setup done at $(( $(date +%s) - t0 )) s"
R=$OUT/runs; mkdir -p $R
bench() {  # TAG PORT NAME SEED NPROMPTS [extra bench options]
  local tag=$1 port=$2 name=$3 seed=$4 n=$5; shift 5
  [ "$(left)" -gt 40 ] || { echo "skip $tag: $(left) s left"; return; }
  timeout $(( $(left) - 10 )) $M bench --url http://127.0.0.1:$port --model "$name" --concurrency 64 --num-prompts $n \
    --input-len 2048 --output-len 128 --prompt-text fresh --seed $seed --num-gpus 1 --no-progress \
    --output-json $R/$tag.json "$@" > $R/$tag.txt 2>&1
  echo "$tag rc=$? at $(( $(date +%s) - t0 )) s: $(python3 -c "
import json;d=json.load(open('$R/$tag.json'));print(round(d['total_token_throughput']), 'tok/s p90tpot', round(d['p90_tpot_ms'],2), 'p50ttft', round(d['p50_ttft_ms']), 'dur', round(d['duration'],2), 'prep', d.get('run_phases_s',{}).get('prepare'))" 2>/dev/null)"
}
vbench() {  # TAG PORT NAME SEED
  [ "$(left)" -gt 45 ] || { echo "skip $1: $(left) s left"; return; }
  timeout $(( $(left) - 10 )) vllm bench serve --backend vllm --base-url http://127.0.0.1:$2 --model "$3" --tokenizer "$3" \
    --dataset-name random --random-input-len 2048 --random-output-len 128 --num-prompts 640 --max-concurrency 64 \
    --ignore-eos --seed $4 --save-result --result-dir $R --result-filename $1.json > $R/$1.txt 2>&1
  echo "$1 rc=$? at $(( $(date +%s) - t0 )) s: $(grep -E "Total token throughput|P90 TPOT|Median TTFT|Benchmark duration" $R/$1.txt | tr -s ' ' | tr '\n' ';')"
}
serve() {  # NAME MODEL PORT
  echo "== $1 ($2) at $(( $(date +%s) - t0 )) s"
  timeout $(( $(left) - 20 )) $M serve --model $2 --name $1 --port $3 --runtime process --detach --smoke quick -- --load-format dummy > $R/serve-$1.txt 2>&1
  echo "serve $1 rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "ready|✗" $R/serve-$1.txt
}
serve v2k /tmp/m2s 8050
bench v2k-warm 8050 /tmp/m2s 101 64
bench v2k-a 8050 /tmp/m2s 102 256
bench v2k-b 8050 /tmp/m2s 103 256
bench v2k-cp2 8050 /tmp/m2s 104 256 --client-procs 2
bench v2k-aio 8050 /tmp/m2s 105 256 --http-client aiohttp
vbench v2k-vllm 8050 /tmp/m2s 106
cp /tmp/m3state/logs/v2k.log $R/log-v2k.txt 2>/dev/null; $M stop v2k > /dev/null 2>&1
serve v200k /tmp/m2v 8051
bench v200k-warm 8051 /tmp/m2v 201 64
bench v200k-a 8051 /tmp/m2v 202 256
bench v200k-b 8051 /tmp/m2v 203 256
vbench v200k-vllm 8051 /tmp/m2v 206
cp /tmp/m3state/logs/v200k.log $R/log-v200k.txt 2>/dev/null; $M stop --all > /dev/null 2>&1
tar -C $OUT -czf $OUT/runs.tgz runs && rm -rf $R
echo "call done at $(( $(date +%s) - t0 )) s"
