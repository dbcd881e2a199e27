#!/usr/bin/env bash
# One device call after call17.sh's routing part (carry .bundle WITH fi.tar.xz, and .whl; usage: bash scripts/gpu/call18.sh):
# greedy decoding of dummy weights repeats one token per user, and sampling at temperature 1 made the M3 scale model's
# decode 6-9 % slower. Two things the fit needs from that:
#   sampler  what sampling itself costs a step: the floor model (tiny dimensions, 4 experts: no routing to speak of)
#            at c = 16 and 64, greedy then `--temperature 1` (192 requests each);
#   grid     the scale model's decode sweep (c = 1, 4, 16, 64, 1,024 in / 256 out) sampled at temperature 1: the fit's
#            decode points with routing spread over the experts.
set -u
R=/tmp/res18; rm -rf "$R"; mkdir -p "$R"
trap 'tar -czf "$OUT/res.tgz" -C /tmp res18' EXIT
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); STOP_AT=${STOP_AT:-420}
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$R/gpu.txt"
$M dev tiny-model /tmp/m3t --arch minimax-m3-release --head-dim 128 --overwrite > /dev/null || echo "tiny-model failed"
$M dev scale-model /tmp/m3b --arch minimax-m3 --layers 2 --quant bf16 --overwrite > /dev/null || { echo "scale-model failed"; exit 1; }
serve() {  # TAG MODEL PORT
  echo "== $1 at $(( $(date +%s) - t0 )) s"
  timeout -s INT $(( $(left) - 20 )) $M serve --model "$2" --name "$1" --port "$3" --runtime process --detach \
    -- --load-format dummy > "$R/serve-$1.txt" 2>&1
  echo "serve $1 rc=$?"; tail -3 "$R/serve-$1.txt"
}
bench() {  # DEP TAG [options]
  local dep=$1 tag=$2; shift 2
  timeout $(( $(left) - 20 )) $M bench --deployment "$dep" --prompt-text fresh --num-gpus 1 --no-progress \
    --input-len 1024 --output-len 256 --ignore-eos --output-json "$R/bench-$tag.json" "$@" > "$R/bench-$tag.txt" 2>&1
  echo "bench $tag rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "concurrency / rate|median TPOT|valid " "$R/bench-$tag.txt" | head -4
}
serve m3floor /tmp/m3t 8046
bench m3floor floor-greedy --concurrency 16,64 --num-prompts 192 --seed 81
bench m3floor floor-sampled --concurrency 16,64 --num-prompts 192 --seed 82 --temperature 1
$M stop m3floor > /dev/null 2>&1
serve m3default /tmp/m3b 8043
bench m3default decode-sampled --concurrency 1,4,16,64 --seed 83 --temperature 1
$M stop --all > /dev/null 2>&1; cp /tmp/m3state/logs/*.log "$R/" 2>/dev/null
pgrep -af "vllm serve" && echo "LEFT RUNNING" || echo "nothing left running"
echo "call done at $(( $(date +%s) - t0 )) s"
