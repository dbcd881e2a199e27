# Sourced by the one-off device calls (call18.sh, call19.sh) after `RES=resNN STOP_AT=${STOP_AT:-N}`: results in
# /tmp/$RES, packed into $OUT/res.tgz on exit, the call's output in $OUT/call.log; installs the GPU kit (wt-env.sh: sets
# $M) and records the GPU (gpu.txt). Defines, each logging its time:
#   left                    seconds left before STOP_AT
#   serve TAG MODEL PORT    m3ctl serve MODEL detached as TAG (--runtime process, dummy weights); serve-TAG.txt
#   bench DEP TAG [opts]    m3ctl bench --deployment DEP, fresh prompts, 1,024 in / 256 out exactly; bench-TAG.json
#   stop TAG                m3ctl stop TAG, its engine log kept as log-TAG.txt
R=/tmp/$RES; rm -rf "$R"; mkdir -p "$R"
trap 'tar -czf "$OUT/res.tgz" -C /tmp "$RES"' EXIT
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s)
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$R/gpu.txt"
serve() {
  echo "== $1 at $(( $(date +%s) - t0 )) s (left $(left) s)"
  local s0; s0=$(date +%s)
  timeout -s INT $(( $(left) - 20 )) $M serve --model "$2" --name "$1" --port "$3" --runtime process --detach \
    -- --load-format dummy > "$R/serve-$1.txt" 2>&1
  echo "serve $1 rc=$? wall $(( $(date +%s) - s0 )) s"; tail -2 "$R/serve-$1.txt"
}
bench() {
  local dep=$1 tag=$2; shift 2
  [ "$(left)" -gt 40 ] || { echo "bench $tag skipped: $(left) s left"; return; }
  timeout $(( $(left) - 20 )) $M bench --deployment "$dep" --prompt-text fresh --num-gpus 1 --no-progress \
    --input-len 1024 --output-len 256 --ignore-eos --output-json "$R/bench-$tag.json" "$@" > "$R/bench-$tag.txt" 2>&1
  echo "bench $tag rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "concurrency / rate|median TPOT|valid " "$R/bench-$tag.txt" | head -4
}
stop() { $M stop "$1" > /dev/null 2>&1; cp "/tmp/m3state/logs/$1.log" "$R/log-$1.txt" 2>/dev/null; }
