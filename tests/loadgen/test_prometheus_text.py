"""Every Prometheus page m3ctl reads goes through prometheus_client's parser: the legal forms the two hand-written
parsers misread (a trailing timestamp read as the value, a ``}`` inside a label value, a tab separator) read right,
and a line the parser refuses does not lose the others."""

from __future__ import annotations

import pytest

from m3ctl.core.prometheus import samples
from m3ctl.loadgen.servermetrics import cache_config, gauges, parse

PAGE = (
    "# HELP vllm:prefix_cache_hits Prefix cache hits.\n"
    "# TYPE vllm:prefix_cache_hits counter\n"
    'vllm:prefix_cache_hits_total{model_name="m}x",engine="0"} 12 1700000000000\n'
    'vllm:prefix_cache_hits_total{model_name="m,y",engine="1"} 3\n'
    'vllm:num_requests_waiting{model_name="m"}\t7\n'
    'vllm:num_requests_running{model_name="m"} 5 1700000000000\n'
    'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",note="a}b"} 1.0\n'
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0",model_name="m"} 9\n'
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1",model_name="m"} 4\n'
)


def test_legal_forms_read_right():
    m = parse(PAGE)
    assert m["prefix_cache_hits_total"] == 15.0  # not 1700000000000 (the timestamp), both label sets summed
    assert m["spec_decode_num_accepted_tokens_per_pos_total[0]"] == 9.0
    assert m["spec_decode_num_accepted_tokens_per_pos_total[1]"] == 4.0
    assert gauges(PAGE) == {"num_requests_waiting": 7.0, "num_requests_running": 5.0}
    assert cache_config(PAGE)["block_size"] == "16" and cache_config(PAGE)["note"] == "a}b"


@pytest.mark.parametrize("bad", ['vllm:num_requests_waiting{model_name="m" 3\n', "this is not prometheus\n"])
def test_a_bad_line_does_not_lose_the_others(bad):
    page = PAGE + bad + 'vllm:generation_tokens_total{model_name="m"} 42\n'
    assert parse(page)["generation_tokens_total"] == 42.0
    assert gauges(page)["num_requests_running"] == 5.0
    assert ("vllm:generation_tokens_total", {"model_name": "m"}, 42.0) in samples(page)
