#!/usr/bin/env bash
# H200 evidence for docs/results/h200-m3.md, call 1 (nvidia-h200, one GPU): the MiniMax-M3 scale model
# (`m3ctl dev scale-model --arch minimax-m3 --layers 2 --quant bf16`, real per-layer shapes, dummy weights)
# served through m3ctl as it stood before the long-prompt smoke (its smoke sends short prompts only), then:
#   A  one prompt of LONG token ids (beyond one 128-token MSA block) -> the engine's log as it dies
#   B  the same with CUDA_LAUNCH_BLOCKING=1 (the faulting kernel's own frame)
#   C  dense attention on the same checkpoint (--hf-overrides, every layer's sparse_attention_freq 0), a 4096-in
#      bench at concurrency 16
# Carry .bundle (docs/sources.md#h200-the-offline-vllm-bundle, WITH_EXTRAS=0) and .whl (orjson, psutil, docker).
# m3ctl runs from the working tree. Everything lands in $OUT (logs as log-*.txt).
set -u
exec > >(tee "$OUT/call.log") 2>&1
t0=$(date +%s); STOP_AT=${STOP_AT:-570}; LONG=${LONG:-1100}
left() { echo $(( STOP_AT - ($(date +%s) - t0) )); }
bash .bundle/setup.sh > "$OUT/setup.log" 2>&1 || { echo "bundle setup failed"; tail -20 "$OUT/setup.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
source .bundle/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH:/tmp/site M3CTL_STATE_DIR=/tmp/m3state COLUMNS=200
M="python3 -P -m m3ctl"
$M dev scale-model /tmp/m3b --arch minimax-m3 --layers 2 --quant bf16 > /dev/null || exit 1
echo "setup done at $(( $(date +%s) - t0 )) s"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv

long_request() {  # PORT NAME N: one completion of N random token ids; prints status, elapsed, error text
  python3 - "$@" <<'EOF'
import json, random, sys, time, httpx
port, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = [random.Random(7).randrange(1000, 30000) for _ in range(n)]
t = time.time()
try:
    r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                   json={"model": name, "prompt": ids, "max_tokens": 16, "temperature": 0})
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text[:400]
    print(json.dumps({"status": r.status_code, "s": round(time.time() - t, 2), "usage": (body or {}).get("usage") if isinstance(body, dict) else None,
                      "error": (body or {}).get("error") if isinstance(body, dict) else body}))
except Exception as e:
    print(json.dumps({"status": None, "s": round(time.time() - t, 2), "exception": f"{type(e).__name__}: {e}"}))
EOF
}
run_case() {  # TAG PORT [extra env assignments...] -- serve args after the model
  local tag=$1 port=$2; shift 2
  echo "== $tag at $(( $(date +%s) - t0 )) s (left $(left) s)"
  timeout -s INT $(( $(left) - 40 )) env "$@" $M serve --model /tmp/m3b --name "$tag" --port "$port" --runtime process \
    --detach -- --load-format dummy ${SERVE_EXTRA:-}; echo "serve rc=$?"
}
# A: the short smoke passes; the first long prompt kills the engine
run_case m3a 8041 NOOP_=1
long_request 8041 m3a 100;  long_request 8041 m3a $LONG; sleep 5; long_request 8041 m3a 100
$M status; cp /tmp/m3state/logs/m3a.log "$OUT/log-m3-bf16-long.txt" 2>/dev/null; $M stop m3a > /dev/null 2>&1
# B: CUDA_LAUNCH_BLOCKING=1, eager
SERVE_EXTRA=--enforce-eager run_case m3b 8042 CUDA_LAUNCH_BLOCKING=1
long_request 8042 m3b $LONG; sleep 5
cp /tmp/m3state/logs/m3b.log "$OUT/log-m3-bf16-long-blocking.txt" 2>/dev/null; $M stop m3b > /dev/null 2>&1
# C: dense attention fallback on the same checkpoint
if [ "$(left)" -gt 200 ]; then
  SERVE_EXTRA="--hf-overrides {\"text_config\":{\"sparse_attention_config\":{\"sparse_attention_freq\":[0,0]}}}" run_case m3d 8043 NOOP_=1
  long_request 8043 m3d $LONG; long_request 8043 m3d 4000
  $M bench --deployment m3d --num-gpus 1 --concurrency 16 --num-prompts 48 --input-len 4096 --output-len 256 \
    --output-json "$OUT/bench-m3-dense-c16.json" --no-progress > "$OUT/bench-m3-dense.txt" 2>&1; echo "bench rc=$?"
  tail -30 "$OUT/bench-m3-dense.txt"
  cp /tmp/m3state/logs/m3d.log "$OUT/log-m3-bf16-dense.txt" 2>/dev/null
fi
$M stop --all > /dev/null 2>&1; nvidia-smi --query-gpu=index,memory.used --format=csv
echo "call done at $(( $(date +%s) - t0 )) s"
