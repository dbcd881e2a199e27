#!/usr/bin/env bash
# H200 evidence, call 5 (nvidia-h200-x2): re-record doctor after the fabric-manager fix (no vLLM server).
set -u
H=$OUT/h; mkdir -p "$H"
exec > >(tee "$OUT/run5.log") 2>&1
bash .bundle/setup.sh > "$H/setup.log" 2>&1
source .bundle/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH COLUMNS=200
M="python3 -m m3ctl"
$M doctor --save-inventory "$H/inventory.json" --json > "$H/doctor.json"; echo "rc=$?" > "$H/doctor.rc"
$M doctor -v > "$H/doctor-v.txt"; echo "v rc=$?" >> "$H/doctor.rc"
$M doctor > "$H/doctor.txt"; echo "plain rc=$?" >> "$H/doctor.rc"
$M doctor --strict > /dev/null; echo "strict rc=$?" >> "$H/doctor.rc"
$M doctor --variant nvfp4 --json > "$H/doctor-nvfp4.json"; echo "nvfp4 rc=$?" >> "$H/doctor.rc"
CUDA_VISIBLE_DEVICES=0 $M doctor --save-inventory "$H/inventory-cvd0.json" --json > "$H/doctor-cvd0.json"; echo "cvd0 rc=$?" >> "$H/doctor.rc"
$M plan --model MiniMax-M3.1-Flash --max-model-len 131072 --allow-emulated --json > "$H/plan-flash-emulated.json"; echo "plan rc=$?" >> "$H/doctor.rc"
nvidia-smi -q -x > "$H/nvidia-smi-q.xml"; nvidia-smi topo -m > "$H/nvidia-smi-topo.txt"
grep -i -A3 "fabric" "$H/nvidia-smi-q.xml" | head -20
python3 benchmarks/doctor_speed.py --runs 7 > "$H/doctor_speed.txt" 2>&1; cat "$H/doctor_speed.txt"
cat "$H/doctor.rc"; tail -3 "$H/doctor.txt"
tar -C "$OUT" -czf "$OUT/call5.tgz" h && rm -rf "$H"
