"""Input a new user got wrong and m3ctl accepted (2026-12-03): --slo with a lower bound on a latency, a text with no
term or one metric given twice; bench with both --url and --deployment. Each is one BadInput line now."""

import pytest

from m3ctl.errors import BadInput
from m3ctl.loadgen.slo import parse_slo


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("p90_tpot_ms>=3", "a latency SLO is an upper bound"),
        ("p99_ttft_ms>100", "a latency SLO is an upper bound"),
        (",", "has no term"),
        (" , ,", "has no term"),
        ("p90_tpot_ms<=3,p90_tpot_ms<=5", "given twice"),
    ],
)
def test_bad_slo_text_is_one_bad_input(text, says):
    with pytest.raises(BadInput, match=says):
        parse_slo(text)


def test_good_slo_text_still_parses():
    assert parse_slo("").terms == () and parse_slo(None).terms == ()
    slo = parse_slo("p90_tpot_ms<=20, output_throughput>=100")
    assert [(t.key, t.op, t.value) for t in slo.terms] == [
        ("p90_tpot_ms", "<=", 20.0),
        ("output_throughput", ">=", 100.0),
    ]


def test_bench_url_and_deployment_together_is_one_bad_input():
    """`bench --url X --deployment Y` used to pick the deployment and fail on its name (or measure the wrong
    server); which one was meant cannot be known."""
    from m3ctl.loadgen.target import resolve_target

    with pytest.raises(BadInput, match="--url and --deployment both name the endpoint"):
        resolve_target("http://127.0.0.1:9", deployment="demo", lookup_model=False)
