#!/usr/bin/env bash
# The tune against a clean grid, each figure with its interval, in one device call (docs/results/tune-vs-grid.md).
# The spread decomposition's setup (docs/results/h100-spread.md): the MiniMax-M2 scale model with a tokenizer that
# covers its vocabulary (what `m3ctl dev scale-model` writes now), FP8, dummy weights, 12 layers on an 80 GB card
# (16 on an H200), vLLM's defaults otherwise; 2,048 in / 128 out, fresh prompts, c=64.
#   search  `m3ctl tune` over max_num_seqs 32, 256, 1024 (1024 is vLLM's default on this GPU: the defaults' own
#           server measures it), ladder 64, SLO p90 TPOT <= 15 ms (20 on the H200), --precision 3% on the
#           objective (total tok/s per GPU) with --max-duration 25 s a run, no confirmation rung, time budget SEARCH_S
#   grid    scripts/gpu/scale_grid.py: each configuration on a fresh server of its own, the same workload, the
#           same precision, the tune's compile cache and its CUDA-graph capture bound (64); the tune's choice first
# Each call records the host (host.txt) and samples GPU power, SM clock and clock-event reasons every 5 s
# (samples.txt). Carry .bundle .whl. Usage: bash scripts/gpu/h100_study12.sh
# Overrides (the defaults are the first study's): SEQS, the tune's max_num_seqs values; GRID, the grid's
# configurations after the tune's choice (from defaults, seqs32, seqs256, seqs1024); SLO_MS, the p90 TPOT bound.
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); STOP_AT=${STOP_AT:-585}; SEARCH_S=${SEARCH_S:-270}
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
{ lscpu | grep -E "^Model name|^CPU\(s\)"; nproc; cat /proc/loadavg; } > "$OUT/host.txt" 2>&1
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee -a "$OUT/host.txt"
MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${MIB:-0}" -ge 120000 ]; then LAYERS=16; SLO="p90_tpot_ms<=20"; else LAYERS=12; SLO="p90_tpot_ms<=15"; fi
[ -n "${SLO_MS:-}" ] && SLO="p90_tpot_ms<=$SLO_MS"
echo "GPU memory $MIB MiB: $LAYERS layers, SLO $SLO" | tee -a "$OUT/host.txt"
$M dev scale-model /tmp/sm2 --arch minimax-m2 --layers $LAYERS --quant fp8 --overwrite > /dev/null || { echo "scale-model failed"; exit 1; }
echo "setup done at $(( $(date +%s) - t0 )) s"
S=/tmp/study; G=/tmp/grid; mkdir -p $G
( while sleep 5; do
    echo "$(( $(date +%s) - t0 )) load=$(cut -d' ' -f1 /proc/loadavg) gpu=$(nvidia-smi --query-gpu=power.draw,clocks.sm,utilization.gpu,temperature.gpu --format=csv,noheader | tr -d ' ') why=$(nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv,noheader 2>&1 | tr -d ' ')"
  done ) > "$OUT/samples.txt" 2>&1 &
SAMPLER=$!
pack() { tar -C /tmp -czf "$OUT/study.tgz" --exclude='*.png' --exclude=vllm-cache study grid; }
trap pack EXIT
timeout -s INT $(( SEARCH_S + 40 )) $M tune --model /tmp/sm2 --study-dir $S --port 8040 --slo "$SLO" \
  --objective tput_per_gpu --knob tp=1 --knob dcp=1 --knob ep=false --knob dbo=false --knob spec_depth=0 \
  --knob max_num_seqs="${SEQS:-32,256,1024}" --knob max_num_batched_tokens=8192 --knob kv_cache_dtype=default \
  --ladder 64 --input-len 2048 --output-len 128 --prompt-text fresh --precision 3% --max-duration 25 \
  --max-trials 4 --time-budget $SEARCH_S --confirm-top 0 -- --load-format dummy > "$OUT/tune.log" 2>&1
echo "tune rc=$? at $(( $(date +%s) - t0 )) s"
$M stop --all > /dev/null 2>&1
tail -25 "$OUT/tune.log"
set -- $(python3 - "$S/result.json" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
trials = {t.get("trial"): t for t in r.get("trials", [])}
chosen = r.get("chosen")
seqs = (trials.get(r.get("chosen_trial")) or {}).get("config", {}).get("max_num_seqs") if chosen != "defaults" else None
order = [f"seqs{seqs}" if seqs else "defaults"] + os.environ.get("GRID", "defaults seqs256 seqs32").split()
flags = {"defaults": "", "seqs256": "--+--max-num-seqs+256", "seqs32": "--+--max-num-seqs+32",
         "seqs1024": "--+--max-num-seqs+1024"}
print(" ".join(f"{n}={flags[n]}" for n in dict.fromkeys(order)))
PY
)
echo "grid configurations: $* at $(( $(date +%s) - t0 )) s"
CR=$(ls -d $S/vllm-cache/* 2>/dev/null | head -1); [ -n "$CR" ] || { CR=/tmp/gridcache; mkdir -p $CR; }
VLLM_CACHE_ROOT=$CR TORCHINDUCTOR_CACHE_DIR=$CR/inductor VLLM_USE_AOT_COMPILE=0 \
python3 -P scripts/gpu/scale_grid.py "$@" --model /tmp/sm2 --outdir $G --slo "$SLO" --ladder 64 --below 32 \
  --input-len 2048 --output-len 128 --repeats 2 --tokenizer /tmp/sm2 --prompt-text fresh --precision 3% \
  --max-duration 25 --extra '--load-format+dummy+--compilation-config+{"max_cudagraph_capture_size": 64}' \
  --seconds $(( $(left) - 15 )) --min-config-s 75 --port 8050 > "$OUT/grid.log" 2>&1; echo "grid rc=$?"
$M stop --all > /dev/null 2>&1
tail -20 "$OUT/grid.log"
kill $SAMPLER 2>/dev/null
echo "call done at $(( $(date +%s) - t0 )) s"
