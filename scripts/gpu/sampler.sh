# Sourced by the GPU scripts: `start_sampler FILE` writes a line every 5 s (seconds since $t0, GPU power, SM clock,
# utilisation, temperature and clock-event reasons from nvidia-smi) to FILE in the background; $SAMPLER is its pid.
start_sampler() {
  ( while sleep 5; do
      echo "$(( $(date +%s) - t0 )) gpu=$(nvidia-smi --query-gpu=power.draw,clocks.sm,utilization.gpu,temperature.gpu --format=csv,noheader | tr -d ' ') why=$(nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv,noheader 2>&1 | tr -d ' ')"
    done ) > "$1" 2>&1 &
  SAMPLER=$!
}
