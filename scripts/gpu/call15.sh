#!/usr/bin/env bash
# One device call on whichever Hopper GPU comes (carry .bundle with fi.tar.xz, and .whl; usage: bash scripts/gpu/call15.sh):
# the estimate fit's host term (docs/results/estimate-fit.md). On one host, the host's per-step floor (hopper_m3_call.sh
# part floor: a tiny-dimension M3 model of the scale model's layer structure at c = 1 and 4) and then the grid
# (part grid: the M3 scale model's decode sweep at c = 1, 4, 16, 64 and prefill sweep), so the fit can price a step
# as the slower of the GPU's work and the host's floor measured on the host that served it.
set -u
STOP_AT=${STOP_AT:-585} PARTS="floor grid" exec bash scripts/gpu/hopper_m3_call.sh
