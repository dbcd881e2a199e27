"""A speculative plan's token budget (m3ctl/planning/spec_budget.py, ``draft_slots`` of m3ctl/data/vllm_defaults.yaml):
with the DSpark drafter at depth 7 vLLM's default ``--max-num-batched-tokens`` (8192 on an H100/H200) leaves room
for 8192 // 14 = 585 of the 1024 sequences it admits to decode in one step (vLLM 0.26 warned "max_num_scheduled_tokens
is set to 2048"); the plan raises the budget to max-num-seqs x (1 + K + slots), says why, and leaves a given one."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from m3ctl import api
from m3ctl.catalog import vllm_defaults
from m3ctl.errors import ConfigRejected

MODEL = "MiniMax-M3.1-Flash"
DSPARK = {"spec_method": "dspark", "spec_depth": 7}
LOG = Path(__file__).parents[1] / "fixtures" / "hopper-m3-default" / "h100-drafter" / "log-m3day0.txt.gz"


def _choice(p, what: str):
    return next((c for c in p.choices if c.what == what), None)


def test_dspark_at_depth_7_raises_the_budget_so_every_sequence_decodes_in_one_step():
    p = api.plan(model=MODEL, system="h200x8", variant="mxfp8", **DSPARK)
    slots = vllm_defaults().draft_slots
    assert slots is not None and slots.slots("dspark", 7) == 6  # K - 1 for DSpark's parallel drafting
    assert p.vllm_args["max-num-batched-tokens"] == 1024 * (1 + 7 + 6) == 14336
    c = _choice(p, "--max-num-batched-tokens")
    assert c is not None and "depth 7" in c.why and "6 drafting slots" in c.why and "at most 585" in c.why, c
    assert "max_num_new_slots_for_drafting" in c.why  # the rule's source, from the data
    assert "--max-num-batched-tokens 14336" in p.command_line()


def test_a_budget_that_already_fits_or_one_given_is_left_alone():
    assert "max-num-batched-tokens" not in api.plan(model=MODEL, system="b200x8", **DSPARK).vllm_args  # 16384
    given = api.plan(model=MODEL, system="h200x8", variant="mxfp8", max_num_batched_tokens=8192, **DSPARK)
    assert given.vllm_args["max-num-batched-tokens"] == 8192
    ngram = api.plan(model=MODEL, system="h200x8", variant="mxfp8", spec_method="ngram", spec_depth=4)
    assert "max-num-batched-tokens" not in ngram.vllm_args  # no drafting slots: rule spec.token_budget's
    fewer = api.plan(model=MODEL, system="h200x8", variant="mxfp8", max_num_seqs=256, **DSPARK)
    assert "max-num-batched-tokens" not in fewer.vllm_args  # 256 x 14 fits 8192
    # a depth off the drafter's trained block (7) is rule spec.dspark_depth's, not a budget to derive
    off = api.plan(model=MODEL, system="h200x8", variant="mxfp8", max_num_seqs=512, spec_method="dspark", spec_depth=9)
    assert "max-num-batched-tokens" not in off.vllm_args and any("spec.dspark_depth" in w for w in off.warnings)
    # a depth past max-model-len is no budget to derive: the rule refuses it as before
    with pytest.raises(ConfigRejected) as ei:
        api.plan(model=MODEL, system="h200x8", variant="mxfp8", spec_method="dspark", spec_depth=10**25)
    assert ei.value.rule == "spec.token_budget"


def test_the_slot_rule_matches_what_vllm_logged_on_the_h100():
    """vLLM 0.26 on one H100 (8192 batched tokens, 1024 seqs, DSpark depth 7) logged max_num_scheduled_tokens 2048:
    8192 - 1024 x slots, with the slots the data gives."""
    text = gzip.decompress(LOG.read_bytes()).decode()
    got = int(re.search(r"max_num_scheduled_tokens is set to (\d+) based on the speculative", text).group(1))
    slots = vllm_defaults().draft_slots
    assert slots is not None and got == 8192 - 1024 * slots.slots("dspark", 7)
