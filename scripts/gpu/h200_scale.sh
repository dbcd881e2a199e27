#!/usr/bin/env bash
# H200 evidence for docs/results/h200-scale.md (nvidia-h200, one GPU): the MiniMax-M2-shaped scale model (`m3ctl dev scale-model`,
# 16 of 62 layers, FP8 128x128 blocks, 256 experts top-8, dummy weights) served through m3ctl, long prompts
# (4096 in / 256 out), every bench run on fresh prompts (its own seed), warmed at each load level.
#
#   grid CFG...   a clean grid (scripts/gpu/scale_grid.py): for each configuration one fresh server, levels of
#                 $GRID_LADDER (default $LADDER) upwards until one misses the SLO, each a warmed `m3ctl bench` run of
#                 PPC x c prompts with its own seed, repeated near the SLO limit like the tune's levels; bench JSONs
#                 and grid.json -> grid.tgz (a carried .grid/grid.json is continued: finished configurations skipped)
#   tune B        `m3ctl tune` over the same knobs (new study, or `--resume` of .study/study.tgz) with time budget B
#                 (cumulative wall seconds over resumes; baseline on, --confirm-top $CONFIRM, --max-trials $TRIALS);
#   pair B CFG... both at once on an nvidia-h200-x2: the tune on GPU 0, the grid on GPU 1 (own HOME and state dir);
#                 TUNE_KNOBS replaces the knob pins (e.g. for a multi-GPU study on 2-8 GPUs:
#                 TUNE_KNOBS="--knob tp=1,2,4,8 --knob dp=1,2 --knob ep=false,true --knob spec_depth=0,3")
#   plans N...    doctor, then plan at each TP N (EP where the rules ask for it), saved as JSON: what m3ctl predicts
#                 (layout, KV capacity) before a multi-GPU serve
#
# CFG is NAME=FLAGS with m3ctl serve flags joined by '+', e.g. mbt2048=--max-num-batched-tokens+2048; "defaults="
# is vLLM's defaults; vLLM flags go after a '--' token (seqs128=--+--max-num-seqs+128). m3ctl runs from .snap (git archive of the commit under test); carry .bundle .whl .snap
# (.study for a resume). Stops itself by STOP_AT seconds after its start so the results come back.
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); MODE=$1; shift
STOP_AT=${STOP_AT:-560}; LADDER=${LADDER:-16,32,48,64,96,128}; IN=${IN:-4096}; OUTLEN=${OUTLEN:-256}; PPC=${PPC:-2}
SLO=${SLO:-p90_tpot_ms<=30}
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
source .snap/scripts/gpu/snap-env.sh
M="python3 -P -m m3ctl"  # -P: m3ctl from .snap, not the working-tree copy in the cwd
[ -f /tmp/sm2/config.json ] || $M dev scale-model /tmp/sm2 --arch minimax-m2 --layers 16 --quant fp8
echo "setup done at $(( $(date +%s) - t0 )) s"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
grid_run() {  # CFG... on GPU $GRID_GPU, own HOME (compile caches), state dir and port per ${TAG:-} ("" or "0");
  # continues .grid/grid${TAG:-}.json (finished configurations are skipped)
  local G=/tmp/grid${TAG:-}; mkdir -p $G /tmp/hgrid${TAG:-}
  [ -f .grid/grid${TAG:-}.json ] && [ ! -f $G/grid.json ] && cp .grid/grid${TAG:-}.json $G/grid.json
  HOME=/tmp/hgrid${TAG:-} M3CTL_STATE_DIR=/tmp/m3state-grid${TAG:-} CUDA_VISIBLE_DEVICES=${GRID_GPU:-0} \
    python3 -P .snap/scripts/gpu/scale_grid.py "$@" --model /tmp/sm2 --outdir $G --slo "$SLO" \
    --ladder ${GRID_LADDER:-$LADDER} --input-len $IN --output-len $OUTLEN --prompts-per-concurrency $PPC \
    --below 32,16 --seconds $(( $(left) - 25 )) --port $(( 8050 + ${TAG:-1} )) > $OUT/grid${TAG:-}.log 2>&1; echo "grid${TAG:-} rc=$?"
  tar -C $G -czf "$OUT/grid${TAG:-}.tgz" .
}
tune_run() {  # new study, or --resume of .study/study.tgz, on GPU $TUNE_GPU with cumulative time budget $1
  S=/tmp/study; B=${1:-400}
  export CUDA_VISIBLE_DEVICES=${TUNE_GPU:-0}
  if [ -f .study/study.tgz ]; then
    mkdir -p $S && tar -xzf .study/study.tgz -C $S
    timeout -s INT $(( $(left) - 15 )) $M tune --resume $S --time-budget $B --confirm-top ${CONFIRM:-1} \
      > $OUT/tune.log 2>&1; echo "tune rc=$?"
  else
    timeout -s INT $(( $(left) - 15 )) $M tune --model /tmp/sm2 --study-dir $S --port 8040 --slo "$SLO" \
      --objective tput_per_gpu \
      ${TUNE_KNOBS:---knob tp=1 --knob dcp=1 --knob ep=false --knob dbo=false --knob spec_depth=0,3 --knob max_num_seqs=128,1024 \
      --knob max_num_batched_tokens=2048,8192 --knob kv_cache_dtype=default,fp8} \
      --ladder $LADDER --input-len $IN --output-len $OUTLEN --prompts-per-concurrency $PPC \
      --max-trials ${TRIALS:-4} --time-budget $B --confirm-top ${CONFIRM:-1} -- --load-format dummy > $OUT/tune.log 2>&1
    echo "tune rc=$?"
  fi
  $M stop --all > /dev/null 2>&1
  tar -C $S -czf "$OUT/study.tgz" .
}
if [ "$MODE" = grid ]; then
  grid_run "$@"
elif [ "$MODE" = pair ]; then  # the tune on GPU 0 and the grid on GPU 1 at once (nvidia-h200-x2): B CFG...
  B=$1; shift
  # GRID0="CFG...": once the tune is done, a second grid on GPU 0 (own grid0.json) for these configurations
  (TUNE_GPU=0 tune_run "$B"; [ -n "${GRID0:-}" ] && GRID_GPU=0 TAG=0 grid_run $GRID0) & tp=$!
  GRID_GPU=1 TAG= grid_run "$@" & gp=$!
  wait $tp $gp
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
  tune_run "$@"
fi
nvidia-smi --query-gpu=index,memory.used --format=csv
echo "call done at $(( $(date +%s) - t0 )) s"
