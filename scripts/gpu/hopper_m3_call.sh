#!/usr/bin/env bash
# Hopper evidence on the MiniMax-M3.1-Flash scale model (real per-layer shapes, dummy weights; one H100 or H200; the
# vLLM 0.26 bundle). Parts, each optional, in this order (PARTS="default grid msa", the default):
#   floor    the host's per-step floor: an M3 model of the scale model's layer structure (2 MoE layers, the same
#            sparse-attention config) with tiny dimensions (`dev tiny-model --arch minimax-m3-release --head-dim 128`,
#            dummy weights), so a decode step is nearly all host work; the grid's decode levels c = 1 and 4 on it
#            (docs/results/estimate-fit.md: the estimate's host term).
#            With FLOOR_HIGH=1 also c = 16 and 64 (192 requests each): the floor above c = 4.
#   default  `m3ctl serve` with NO attention option, as a new user would: it must come up ready on the plan's default
#            for Hopper (the known issue's dense fallback) with the full smoke, then a long-prompt bench (4,096 in).
#   grid     on that server: the estimate fit's runs (docs/results/estimate-fit.md): a decode sweep at concurrency
#            1,4,16,64 (1,024 in / 256 out) and a prefill sweep at concurrency 1 (512 to 8,192 in / 1 out; not with
#            GRID_PREFILL=0; GRID_C=1,4 for fewer decode levels); with GRID_LONG=1 also a decode run at c = 16
#            with 4,096 in / 256 out, staggered.
#   routing  on that server: what greedy decoding of dummy weights does to MoE routing. A dummy model's greedy output
#            repeats a few tokens, so every user's decode step may route the same few experts; sampling at
#            temperature 1 draws near-uniform tokens instead. ROUTE_REPS (default 2) alternating decode sweeps at
#            c = 16 and 64 (1,024 in / 256 out): greedy, then `--temperature 1`; and four greedy completions saved
#            (completions.txt) to show what the tokens are.
#   msa      the failing path asked for explicitly (`--attention msa`): what serve says and, where it dies, the cause.
#   drafter  the scale model with its DSpark drafter (`dev scale-model --drafter`) through the default plan (the day-0
#            stack: the drafter at its block size, dense attention on Hopper); a short bench with the server's
#            spec-decode counters; then `--stack recipe` (no drafter) on the same bench, for what the drafter buys.
#            With FIT_ON_RECIPE=1 the recipe server (the same target model as `default`, no drafter) then runs the
#            `grid` sweeps, so one server start gives both.
# Carry .bundle WITH fi.tar.xz (vLLM's MiniMax-M3 code needs FlashInfer's norm) and .whl (site.tar.xz). m3ctl runs
# from the working tree. Outputs: $OUT/call.log, $OUT/setup.log and $OUT/res.tgz (plan/doctor JSON, serve-*.txt,
# bench JSON, engine logs; only 8 files come back from a call).
set -u
R=/tmp/res; mkdir -p "$R"
trap 'tar -czf "$OUT/res.tgz" -C /tmp res' EXIT
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); STOP_AT=${STOP_AT:-570}; PARTS=${PARTS:-default grid msa}; LAYERS=${LAYERS:-2}
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
has() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }
source scripts/gpu/wt-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$R/gpu.txt"
$M dev scale-model /tmp/m3b --arch minimax-m3 --layers "$LAYERS" --quant bf16 --overwrite > /dev/null || { echo "scale-model failed"; exit 1; }
echo "setup done at $(( $(date +%s) - t0 )) s"
if has default || has grid || has routing; then
  $M plan --model /tmp/m3b --runtime process --json -- --load-format dummy > "$R/plan.json" 2> "$R/plan.err"
  echo "plan rc=$?"
  $M doctor --model /tmp/m3b --runtime process --json -- --load-format dummy > "$R/doctor.json" 2> "$R/doctor.err"; echo "doctor rc=$?"
fi

serve_case() {  # TAG PORT [m3ctl serve options...] : serve detached (model $MODEL, default /tmp/m3b), rc, status, log
  local tag=$1 port=$2; shift 2
  echo "== $tag at $(( $(date +%s) - t0 )) s (left $(left) s)"
  local s0; s0=$(date +%s)
  timeout -s INT $(( $(left) - 20 )) $M serve --model "${MODEL:-/tmp/m3b}" --name "$tag" --port "$port" --runtime process --detach \
    "$@" -- --load-format dummy > "$R/serve-$tag.txt" 2>&1
  echo "serve $tag rc=$? wall $(( $(date +%s) - s0 )) s"; tail -30 "$R/serve-$tag.txt"
  $M status > "$R/status-$tag.txt" 2>&1; cat "$R/status-$tag.txt"
  cp "/tmp/m3state/logs/$tag.log" "$R/log-$tag.txt" 2>/dev/null
}
alive() { $M status --json 2>/dev/null | python3 -c "import json,sys;sys.exit(0 if any(d.get('alive') for d in json.load(sys.stdin)) else 1)"; }
bench() {  # TAG [bench options...]
  local tag=$1; shift
  echo "== bench $tag at $(( $(date +%s) - t0 )) s (left $(left) s)"
  timeout $(( $(left) - 30 )) $M bench --deployment "${DEP:-m3default}" --prompt-text fresh --num-gpus 1 --no-progress \
    --output-json "$R/bench-$tag.json" "$@" > "$R/bench-$tag.txt" 2>&1
  echo "bench $tag rc=$?"; tail -25 "$R/bench-$tag.txt"
}
if has floor; then
  $M dev tiny-model /tmp/m3t --arch minimax-m3-release --head-dim 128 --overwrite > /dev/null || echo "tiny-model failed"
  cp /tmp/m3t/config.json "$R/floor-config.json"
  MODEL=/tmp/m3t serve_case m3floor 8046
  if alive; then
    DEP=m3floor bench floor --input-len 1024 --output-len 256 --ignore-eos --concurrency 1,4 --num-prompts 40 --seed 51
    [ "${FLOOR_HIGH:-0}" = 1 ] && DEP=m3floor bench floor-high --input-len 1024 --output-len 256 --ignore-eos \
      --concurrency 16,64 --num-prompts 192 --seed 52
  fi
  $M stop m3floor > /dev/null 2>&1
fi
if has default || has grid || has routing; then
  serve_case m3default 8043
  if alive; then
    has default && bench long --input-len 4096 --output-len 64 --concurrency 8 --num-prompts 48 --seed 11
    if has grid; then
      bench decode --input-len 1024 --output-len 256 --ignore-eos --concurrency "${GRID_C:-1,4,16,64}" --seed 21 --power
      [ "${GRID_LONG:-0}" = 1 ] && bench decode-long --input-len 4096 --output-len 256 --ignore-eos --concurrency 16 \
        --seed 22
      [ "${GRID_PREFILL:-1}" = 1 ] && bench prefill --input-len 512,2048,4096,8192 --output-len 1 --concurrency 1 \
        --num-prompts 12 --seed 31
    fi
    if has routing; then
      python3 - > "$R/completions.txt" 2>&1 <<'PY'
import json, urllib.request
name = json.load(urllib.request.urlopen("http://127.0.0.1:8043/v1/models"))["data"][0]["id"]
for i, prompt in enumerate(["The capital of France is", "def fib(n):", "Once upon a time", "1, 2, 3, 4,"]):
    body = {"model": name, "prompt": prompt, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request("http://127.0.0.1:8043/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    print(i, repr(json.load(urllib.request.urlopen(req))["choices"][0]["text"]))
PY
      head -8 "$R/completions.txt"
      for k in $(seq 1 "${ROUTE_REPS:-2}"); do
        bench greedy$k --input-len 1024 --output-len 256 --ignore-eos --concurrency 16,64 --seed $(( 60 + k ))
        bench sampled$k --input-len 1024 --output-len 256 --ignore-eos --concurrency 16,64 --seed $(( 70 + k )) \
          --temperature 1
      done
    fi
  fi
  $M stop m3default > /dev/null 2>&1
fi
if has msa && [ "$(left)" -gt 200 ]; then serve_case m3msa 8044 --attention msa; fi
if has drafter; then
  $M dev scale-model /tmp/m3d --arch minimax-m3 --layers "$LAYERS" --quant bf16 --drafter --overwrite > "$R/scale-drafter.txt" 2>&1 \
    || { echo "scale-model --drafter failed"; cat "$R/scale-drafter.txt"; }
  cp /tmp/m3d/dspark/config.json "$R/dspark-config.json" 2>/dev/null
  $M plan --model /tmp/m3d --runtime process --json -- --load-format dummy > "$R/plan-drafter.json" 2> "$R/plan-drafter.err"
  for stack in ${STACKS:-day0 recipe}; do
    [ "$(left)" -gt 200 ] || break
    tag=m3$stack; echo "== $tag at $(( $(date +%s) - t0 )) s (left $(left) s)"
    timeout -s INT $(( $(left) - 20 )) $M serve --model /tmp/m3d --name "$tag" --port 8045 --runtime process --detach \
      --stack "$stack" -- --load-format dummy > "$R/serve-$tag.txt" 2>&1
    echo "serve $tag rc=$?"; tail -20 "$R/serve-$tag.txt"
    if alive; then
      python3 -c "import urllib.request as u;print(u.urlopen('http://127.0.0.1:8045/metrics').read().decode())" | grep -E "^vllm:spec_decode" > "$R/metrics-before-$tag.txt"
      timeout $(( $(left) - 15 )) $M bench --deployment "$tag" --prompt-text fresh --num-gpus 1 --no-progress \
        --input-len 1024 --output-len 128 --ignore-eos --concurrency 4 --num-prompts 48 --seed 41 \
        --output-json "$R/bench-$tag.json" > "$R/bench-$tag.txt" 2>&1
      echo "bench $tag rc=$?"; grep -E "TPOT|tok/s|valid|accept" "$R/bench-$tag.txt" | head -12
      python3 -c "import urllib.request as u;print(u.urlopen('http://127.0.0.1:8045/metrics').read().decode())" | grep -E "^vllm:spec_decode" > "$R/metrics-after-$tag.txt"
      head -5 "$R/metrics-after-$tag.txt"
      if [ "$stack" = recipe ] && [ "${FIT_ON_RECIPE:-0}" = 1 ]; then
        DEP=$tag bench decode --input-len 1024 --output-len 256 --ignore-eos --concurrency 1,4,16,64 --seed 21 --power
        DEP=$tag bench prefill --input-len 512,2048,4096,8192 --output-len 1 --concurrency 1 --num-prompts 12 --seed 31
      fi
    fi
    $M stop "$tag" > /dev/null 2>&1; cp "/tmp/m3state/logs/$tag.log" "$R/log-$tag.txt" 2>/dev/null
  done
fi
$M stop --all > /dev/null 2>&1
pgrep -af "vllm serve" && echo "LEFT RUNNING" || echo "nothing left running"
cp /tmp/m3state/logs/*.log "$R/" 2>/dev/null; ls "$R" | head -20
echo "call done at $(( $(date +%s) - t0 )) s"
