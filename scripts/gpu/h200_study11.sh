#!/usr/bin/env bash
# Session 19 (docs/results/h200-study11.md): eight configurations, a confirmed choice and its clean grid in one
# lease, on one machine. Study10's stack (scripts/gpu/h200_study10.sh: MiniMax-M2 scale model, FP8, dummy
# weights; 2,048 in / 128 out; every start measure on), changed where studies 8-10 said what stood in the way:
#   - no level on the SLO's boundary by design: studies 8-10 put c=96 inside the capacity rule's 10 % margin, so
#     three runs a level and 5-6 configurations a session. Ladder 32, 64, 128 with SLO p90 TPOT <= 30 ms (16
#     layers): c=64 measured 18.2-25.7 ms in studies 8-10 (under 27), and c=128 is past 33 ms, so each level is
#     decided by one run (a run inside the margin still gets its repeats);
#   - 4 prompts per concurrency (study8's; study9: 8-wave runs spread as much as 16-wave ones);
#   - the layers follow the GPU lent: 16 on an H200 (141 GB), 12 on an H100 (80 GB: 57 GiB of 16-layer weights
#     leave too little KV cache for c=128 x 2,176 tokens), the SLO scaled by 12/16 there;
#   - the grid in the same lease, on the same machine, right after the search (study10: a grid on another
#     machine measured that machine, 11 % slower on the defaults).
# Modes:
#   search    start or resume the search (CONFIRM=N: with --confirm-top N); its time budget ends it in the call
#   grid      the clean grid (scripts/gpu/scale_grid.py, the same capacity rule, levels 64, 128 with 32 below) of
#             the chosen configuration and of the defaults (or the best tuned one beside them), each on its own
#             fresh server, with the study's compile cache and its CUDA-graph bound
# Each call records the host (host.txt) and samples load, GPU power, SM clock and clock-event reasons every 10 s
# (samples.txt). Carry .bundle .whl. Usage: bash scripts/gpu/h200_study11.sh search|grid
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); MODE=${1:-search}; STOP_AT=${STOP_AT:-585}
LADDER=32,64,128; PPC=4; PT=fresh
{ lscpu | grep -E "^Model name|^CPU\(s\)|^Thread|^Core|^Socket|^Hypervisor|^Virtualization|MHz"; nproc; cat /proc/loadavg; uptime; } > $OUT/host.txt 2>&1
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee -a $OUT/host.txt
MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${MIB:-0}" -ge 120000 ]; then LAYERS=16; SLO="p90_tpot_ms<=30"; else LAYERS=12; SLO="p90_tpot_ms<=22.5"; fi
echo "GPU memory $MIB MiB: $LAYERS layers, SLO $SLO" | tee -a $OUT/host.txt
[ -f /tmp/sm2/config.json ] || $M dev scale-model /tmp/sm2 --arch minimax-m2 --layers $LAYERS --quant fp8 > /dev/null || { echo "scale-model failed"; exit 1; }
echo "setup done at $(( $(date +%s) - t0 )) s"
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
S=/tmp/study; G=/tmp/grid
( while sleep 10; do
    echo "$(( $(date +%s) - t0 )) load=$(cut -d' ' -f1 /proc/loadavg) gpu=$(nvidia-smi --query-gpu=power.draw,clocks.sm,utilization.gpu,temperature.gpu --format=csv,noheader | tr -d ' ') why=$(nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv,noheader 2>&1 | tr -d ' ')"
    [ -d $G ] && tar -C $G -czf $OUT/grid.tgz . 2>/dev/null  # a call cut short keeps what the grid measured
  done ) > $OUT/samples.txt 2>&1 &
SAMPLER=$!
[ -f $S/tune.json ] || [ ! -f .study/study.tgz ] || { mkdir -p $S && tar -xzf .study/study.tgz -C $S; }
[ -d $G ] || [ ! -f .study/grid.tgz ] || { mkdir -p $G && tar -xzf .study/grid.tgz -C $G; }  # a fresh machine: the grid so far
elapsed() { python3 -c "import json,sys;print(int(json.load(open('$S/result.json')).get('elapsed_s',0)))" 2>/dev/null || echo 0; }
pack() { tar -C $S -czf "$OUT/study.tgz" --exclude='*.png' --exclude=vllm-cache . ; }
starts() { for f in $S/trials/*/start*.json; do echo "$f $(python3 -c "import json;d=json.load(open('$f'));print(d['start_s'],d['compile_cache'],d.get('prewarmed'),d['phases'])")"; done; }
if [ "$MODE" = search ]; then
  B=$(( $(elapsed) + $(left) - 30 ))
  echo "search time budget $B s (study elapsed $(elapsed) s)"
  if [ -f $S/tune.json ]; then
    echo "resuming the study in $S ($(ls $S/trials | wc -l) trial folders)"
    timeout -s INT $(( $(left) - 10 )) $M tune --resume $S --time-budget $B --confirm-top ${CONFIRM:-0} --pareto > $OUT/tune.log 2>&1
  else
    timeout -s INT $(( $(left) - 10 )) $M tune --model /tmp/sm2 --study-dir $S --port 8040 --slo "$SLO" \
      --objective tput_per_gpu --knob tp=1 --knob dcp=1 --knob ep=false --knob dbo=false --knob spec_depth=0 \
      --knob max_num_seqs=256,1024 --knob max_num_batched_tokens=2048,4096,8192,16384 --knob kv_cache_dtype=default,fp8 \
      --ladder $LADDER --input-len 2048 --output-len 128 --prompts-per-concurrency $PPC --prompt-text $PT \
      --max-trials 16 --time-budget $B --confirm-top ${CONFIRM:-0} --pareto -- --load-format dummy > $OUT/tune.log 2>&1
  fi
  echo "tune rc=$? at $(( $(date +%s) - t0 )) s"
  $M stop --all > /dev/null 2>&1
  tail -30 $OUT/tune.log; starts; pack; ls -la $OUT/study.tgz
else
  if [ "${EXTRA_S:-0}" -gt 0 ]; then
    echo "search resumed for $EXTRA_S s with its confirmation (study elapsed $(elapsed) s)"
    timeout -s INT $(( $(left) - 150 )) $M tune --resume $S --time-budget $(( $(elapsed) + EXTRA_S )) --confirm-top 1 --pareto > $OUT/tune.log 2>&1
    echo "tune rc=$? at $(( $(date +%s) - t0 )) s"; $M stop --all > /dev/null 2>&1; tail -40 $OUT/tune.log; starts; pack
  fi
  mkdir -p $G
  set -- $(python3 - "$S/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def flags_of(cfg):
    raw = []
    for k, f in (("max_num_seqs", "--max-num-seqs"), ("max_num_batched_tokens", "--max-num-batched-tokens")):
        if cfg.get(k) is not None:
            raw += [f, str(cfg[k])]
    if cfg.get("kv_cache_dtype") not in (None, "default", "auto"):
        raw += ["--kv-cache-dtype", str(cfg["kv_cache_dtype"])]
    return "+".join(["--"] + raw if raw else [])
trials = {t.get("trial"): t for t in r.get("trials", [])}
if r.get("chosen") != "defaults" and r.get("chosen_trial") in trials:
    print(f"chosen={flags_of(trials[r['chosen_trial']].get('config') or {})} defaults=")
else:  # the defaults chosen: the best tuned configuration by the study's own ranking beside them
    best = (r.get("best") or {}).get("trial")
    f = flags_of((trials.get(best) or {}).get("config") or {}) if best is not None else ""
    print(f"defaults= best={f}" if f else "defaults=")
PY
)
  echo "grid configurations: $* (chosen: $(python3 -c "import json;r=json.load(open('$S/result.json'));print(r.get('chosen'), r.get('chosen_trial'))"))"
  CR=$(ls -d $S/vllm-cache/* 2>/dev/null | head -1); [ -n "$CR" ] || { CR=/tmp/gridcache; mkdir -p $CR; }
  VLLM_CACHE_ROOT=$CR TORCHINDUCTOR_CACHE_DIR=$CR/inductor VLLM_USE_AOT_COMPILE=0 \
  python3 -P scripts/gpu/scale_grid.py "$@" --model /tmp/sm2 --outdir $G --slo "$SLO" --ladder 64,128 \
    --input-len 2048 --output-len 128 --prompts-per-concurrency $PPC --below 32 --repeats 2 --tokenizer /tmp/sm2 \
    --prompt-text $PT \
    --extra '--load-format+dummy+--compilation-config+{"max_cudagraph_capture_size": 128}' \
    --seconds $(( $(left) - 15 )) --min-config-s 100 --port 8050 > $OUT/grid.log 2>&1; echo "grid rc=$?"
  $M stop --all > /dev/null 2>&1
  tail -30 $OUT/grid.log
fi
kill $SAMPLER 2>/dev/null; wait $SAMPLER 2>/dev/null
[ -d $G ] && tar -C $G -czf "$OUT/grid.tgz" .
nvidia-smi --query-gpu=index,memory.used --format=csv
echo "call done at $(( $(date +%s) - t0 )) s"
