#!/usr/bin/env bash
# docs/results/h100-spread.md, call 3: the harness factor. The configuration of calls 1-2 (MiniMax-M2 shapes, 12 layers, FP8,
# full 200,064-token tokenizer, vLLM defaults, c=64, 2,048 in / 128 out, fresh prompts) measured by the tune's own
# trial machinery (prewarmed server process, study compile cache, CUDA-graph capture bounded by the ladder, forked
# engine core: `m3ctl tune` with a one-configuration space, the defaults' baseline at c=64, 4 prompts per concurrency
# as the studies ran), then by a plain `m3ctl serve` carrying the trial's one engine flag
# (--compilation-config max_cudagraph_capture_size 64) + `m3ctl bench` x2. Calls 1-2: plain serve + bench 75-77K tok/s.
# Carry .bundle (no fi.tar.xz) and .whl (site.tar.xz: optuna + slim sqlalchemy/alembic + orjson, psutil).
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); STOP_AT=${STOP_AT:-235}
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv | tee $OUT/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv,noheader -l 2 > $OUT/gpu-samples.csv 2>&1 &
python3 -c "import optuna, sqlalchemy; print('optuna', optuna.__version__, 'sqlalchemy', sqlalchemy.__version__)" || exit 1
$M dev scale-model /tmp/m2f --arch minimax-m2 --layers 12 --quant fp8 > /dev/null || { echo "scale-model failed"; exit 1; }
echo "setup done at $(( $(date +%s) - t0 )) s"
R=$OUT/runs; mkdir -p $R; S=/tmp/study
timeout $(( $(left) - 5 )) $M tune --model /tmp/m2f --study-dir $S --port 8040 --slo "p90_tpot_ms<=30" --objective tput_per_gpu \
  --knob tp=1 --knob dcp=1 --knob ep=false --knob dbo=false --knob spec_depth=0 --knob max_num_seqs=1024 \
  --knob max_num_batched_tokens=8192 --knob kv_cache_dtype=default --ladder 64 --input-len 2048 --output-len 128 \
  --prompts-per-concurrency 4 --prompt-text fresh --max-trials 1 --confirm-top 0 --time-budget 170 -- --load-format dummy > $R/tune.log 2>&1
echo "tune rc=$? at $(( $(date +%s) - t0 )) s"; tail -25 $R/tune.log
$M stop --all > /dev/null 2>&1
python3 - "$S" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/trials/*/*.json")):
    try:
        d = json.load(open(f))
    except Exception:
        continue
    if isinstance(d, dict) and "total_token_throughput" in d:
        print(f, round(d["total_token_throughput"]), "p90tpot", round(d["p90_tpot_ms"], 2), "p50ttft", round(d["p50_ttft_ms"]), "n", d.get("num_prompts"))
PY
tar -C $S -czf $R/study.tgz --exclude=vllm-cache . 2>/dev/null
bench() {  # TAG SEED
  [ "$(left)" -gt 40 ] || { echo "skip $1: $(left) s left"; return; }
  timeout $(( $(left) - 10 )) $M bench --url http://127.0.0.1:8050 --model /tmp/m2f --concurrency 64 --num-prompts 256 \
    --input-len 2048 --output-len 128 --prompt-text fresh --seed $2 --num-gpus 1 --no-progress --output-json $R/$1.json > $R/$1.txt 2>&1
  echo "$1 rc=$? at $(( $(date +%s) - t0 )) s: $(python3 -c "
import json;d=json.load(open('$R/$1.json'));print(round(d['total_token_throughput']), 'tok/s p90tpot', round(d['p90_tpot_ms'],2), 'p50ttft', round(d['p50_ttft_ms']), 'dur', round(d['duration'],2))" 2>/dev/null)"
}
if [ "$(left)" -gt 150 ]; then
  echo "== plain serve with the trial's capture bound at $(( $(date +%s) - t0 )) s"
  timeout $(( $(left) - 20 )) $M serve --model /tmp/m2f --name g1 --port 8050 --runtime process --detach --smoke quick -- --load-format dummy \
    --compilation-config '{"max_cudagraph_capture_size": 64}' > $R/serve-g1.txt 2>&1
  echo "serve g1 rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "ready|✗" $R/serve-g1.txt
  bench g1-warm 501; bench g1-a 502; bench g1-b 503
fi
$M stop --all > /dev/null 2>&1
tar -C $OUT -czf $OUT/runs.tgz runs && rm -rf $R
echo "call done at $(( $(date +%s) - t0 )) s"
