#!/usr/bin/env bash
# H200 evidence for issue #15 (nvidia-h200, one GPU): the MiniMax-M2-shaped scale model (`m3ctl dev scale-model`,
# 16 of 62 layers, FP8 128x128 blocks, 256 experts top-8, dummy weights) served through m3ctl, long prompts
# (4096 in / 256 out), every bench run on fresh prompts (its own seed), warmed at each load level.
#
#   grid CFG...   a clean grid: for each configuration one fresh server; at every concurrency of $LADDER a
#                 warm-up run (c prompts, 16 output tokens, own seed), then the measured run (max(2c,32) prompts,
#                 own seed); bench JSONs (with server /metrics deltas: prefix-cache hits, JIT compiles) -> grid.tgz
#   tune B        `m3ctl tune` over the same knobs (new study, or `--resume` of .study/study.tgz) with time budget B;
#                 TUNE_KNOBS replaces the knob pins (e.g. for issue #18 on 2-8 GPUs:
#                 TUNE_KNOBS="--knob tp=1,2,4,8 --knob dp=1,2 --knob ep=false,true --knob spec_depth=0,3")
#   plans N...    doctor, then plan at each TP N (EP where the rules ask for it), saved as JSON: what m3ctl predicts
#                 (layout, KV capacity) before a multi-GPU serve (issue #18)
#
# CFG is NAME=FLAGS with m3ctl serve flags joined by '+', e.g. mbt2048=--max-num-batched-tokens+2048; "defaults="
# is vLLM's defaults. m3ctl runs from .snap (git archive of the commit under test); carry .bundle .whl .snap
# (.study for a resume). Stops itself by STOP_AT seconds after its start so the results come back.
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); MODE=$1; shift
STOP_AT=${STOP_AT:-560}; LADDER=${LADDER:-4,8,16,32,64,128}; IN=${IN:-4096}; OUTLEN=${OUTLEN:-256}
SLO=${SLO:-p90_tpot_ms<=25}
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
source .snap/scripts/gpu/snap-env.sh
M="python3 -P -m m3ctl"  # -P: m3ctl from .snap, not the working-tree copy in the cwd
[ -f /tmp/sm2/config.json ] || $M dev scale-model /tmp/sm2 --arch minimax-m2 --layers 16 --quant fp8
echo "setup done at $(( $(date +%s) - t0 )) s"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
if [ "$MODE" = grid ]; then
  G=/tmp/grid; mkdir -p $G
  for cfg in "$@"; do
    name=${cfg%%=*}; flags=${cfg#*=}; flags=${flags//+/ }
    [ "$(left)" -lt 150 ] && { echo "skip $name: $(left) s left"; continue; }
    ts=$(date +%s)
    timeout -s INT $(( $(left) - 20 )) $M serve --model /tmp/sm2 --name g --port 8050 --runtime process --detach \
      $flags -- --load-format dummy > $G/serve-$name.txt 2>&1; rc=$?
    echo "serve $name rc=$rc ready_s=$(( $(date +%s) - ts ))"
    if [ $rc = 0 ]; then
      for c in ${LADDER//,/ }; do
        [ "$(left)" -lt 40 ] && { echo "stop $name at c=$c: $(left) s left"; break; }
        n=$(( 2 * c > 32 ? 2 * c : 32 ))
        timeout $(( $(left) - 10 )) $M bench --deployment g --concurrency $c --num-prompts $c --input-len $IN --output-len 16 \
          --seed $(( 100000 + c )) --no-progress --output-json $G/warm-$name-c$c.json > /dev/null 2>&1
        timeout $(( $(left) - 10 )) $M bench --deployment g --concurrency $c --num-prompts $n --input-len $IN \
          --output-len $OUTLEN --seed $c --no-progress --label "$name c=$c" --output-json $G/grid-$name-c$c.json \
          > $G/bench-$name-c$c.txt 2>&1; echo "  $name c=$c rc=$? at $(( $(date +%s) - t0 )) s"
      done
      cp $M3CTL_STATE_DIR/logs/g.log $G/log-$name.txt 2>/dev/null
    fi
    $M stop g > /dev/null 2>&1
  done
  tar -C $G -czf "$OUT/grid.tgz" .
elif [ "$MODE" = plans ]; then
  P=/tmp/plans; mkdir -p $P
  $M doctor --model /tmp/sm2 --json > $P/doctor.json 2> $P/doctor.err; echo "doctor rc=$?"
  for tp in "$@"; do
    $M plan --model /tmp/sm2 --runtime process --tp $tp --json -- --load-format dummy > $P/plan-tp$tp.json 2> $P/plan-tp$tp.err \
      || $M plan --model /tmp/sm2 --runtime process --tp $tp --ep --json -- --load-format dummy > $P/plan-tp$tp-ep.json 2>> $P/plan-tp$tp.err
    echo "plan tp=$tp rc=$?"
  done
  tar -C $P -czf "$OUT/plans.tgz" .
else
  S=/tmp/study; B=${1:-400}
  if [ -f .study/study.tgz ]; then
    mkdir -p $S && tar -xzf .study/study.tgz -C $S
    timeout -s INT $(left) $M tune --resume $S --time-budget $B; echo "tune rc=$?"
  else
    timeout -s INT $(left) $M tune --model /tmp/sm2 --study-dir $S --port 8040 --slo "$SLO" --objective tput_per_gpu \
      ${TUNE_KNOBS:---knob tp=1 --knob dcp=1 --knob ep=false --knob dbo=false --knob spec_depth=0,3 --knob max_num_seqs=128,1024 \
      --knob max_num_batched_tokens=2048,8192 --knob kv_cache_dtype=default,fp8} \
      --ladder $LADDER --input-len $IN --output-len $OUTLEN --prompts-per-concurrency 2 \
      --max-trials ${TRIALS:-5} --time-budget $B --confirm-top 0 --no-baseline -- --load-format dummy; echo "tune rc=$?"
  fi
  $M stop --all
  tar -C $S -czf "$OUT/study.tgz" . && cp $S/result.json "$OUT/" 2>/dev/null
fi
nvidia-smi --query-gpu=index,memory.used --format=csv
echo "call done at $(( $(date +%s) - t0 )) s"
