#!/usr/bin/env bash
# One device call on whichever Hopper GPU comes (carry .bundle WITH fi.tar.xz, and .whl; usage: bash scripts/gpu/call17.sh):
# the estimate fit's open rows (docs/results/estimate-fit.md), through hopper_m3_call.sh.
#   H200: the host's floor at c = 1, 4, 16 and 64 and the grid on one H200 host (parts floor and grid, FLOOR_HIGH=1),
#         which the c = 1 H100 -> H200 row needs, and a staggered c = 16 run at 4,096 in (GRID_LONG=1).
#   H100: the floor at c = 1 to 64 on this host, then on the M3 scale model the routing part: greedy against sampled
#         decode sweeps on one server (does a dummy model's greedy output read fewer experts than the estimate's
#         uniform routing assumes?).
set -u
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$NAME" in
  *H200*) PARTS=${PARTS:-floor grid} ;;
  *) PARTS=${PARTS:-floor routing} ;;
esac
FLOOR_HIGH=1 GRID_LONG=1 PARTS=$PARTS STOP_AT=${STOP_AT:-580} exec bash scripts/gpu/hopper_m3_call.sh
