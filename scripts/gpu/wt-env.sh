# Sourced by the GPU scripts of session 10 on: installs the offline vLLM bundle (carry .bundle: build-bundle.sh with
# WITH_EXTRAS=0; fi.tar.xz left out for the MiniMax-M2 scale model) and the Python packages m3ctl needs there
# (carry .whl: site.tar.xz, optuna/sqlalchemy/alembic/orjson/psutil/docker unpacked for CPython 3.12), and runs
# m3ctl from the working tree the device tool copied (the commit under test). Needs $OUT. Sets $M.
bash .bundle/setup.sh > "$OUT/setup.log" 2>&1 || { echo "bundle setup failed, see $OUT/setup.log"; exit 1; }
mkdir -p /tmp/site && tar -xJf .whl/site.tar.xz -C /tmp/site || { echo "site unpack failed"; exit 1; }
source .bundle/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH:/tmp/site M3CTL_STATE_DIR=/tmp/m3state COLUMNS=200
M="python3 -m m3ctl"
