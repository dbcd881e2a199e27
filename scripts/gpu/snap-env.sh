# Sourced by the GPU scripts that run m3ctl from .snap/ (a `git archive` of the commit under test) with optuna
# from .whl/ (calls 7-13): installs the offline vLLM bundle, puts m3ctl and the wheels on PYTHONPATH, sets $M.
# Needs $OUT (the device tool's output folder); carry .bundle, .whl and .snap.
bash .bundle/setup.sh > "$OUT/setup.log" 2>&1 || { echo "bundle setup failed, see $OUT/setup.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
source .bundle/env.sh
export PYTHONPATH=$PWD/.snap:$PYTHONPATH:/tmp/site M3CTL_STATE_DIR=/tmp/m3state COLUMNS=200
M="python3 -m m3ctl"
