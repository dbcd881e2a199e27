"""A stagger's S from the warm-up: a warm-up asks for at most WARMUP_OUTPUT_LEN tokens, so its latency is scaled to
the run's output length before the lanes are spread over it (m3ctl.loadgen.drive.run_latency)."""

from __future__ import annotations

import pytest

from m3ctl.loadgen.client import RequestOutput
from m3ctl.loadgen.drive import run_latency


def test_a_short_warmup_is_scaled_to_the_runs_output_length():
    # the H200 case: 32 warm-up tokens at 0.5 s TTFT and 8 ms per token; the run asks for 128
    o = RequestOutput(success=True, output_tokens=32, ttft=0.5, latency=0.5 + 31 * 0.008)
    assert run_latency(o, 128) == pytest.approx(0.5 + 127 * 0.008)
    assert run_latency(o, 32) == pytest.approx(o.latency)  # the same length: as measured


@pytest.mark.parametrize("tokens, ttft, out_len", [(1, 0.5, 128), (None, 0.5, 128), (32, 0.0, 128), (32, 0.5, 1)])
def test_what_cannot_be_scaled_is_the_latency_as_measured(tokens, ttft, out_len):
    o = RequestOutput(success=True, output_tokens=tokens, ttft=ttft, latency=0.9)
    assert run_latency(o, out_len) == 0.9
