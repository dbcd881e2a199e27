"""Size flags given through ``--arg`` / ``args:`` are read as vLLM's own parser reads them (issue 24 item 5:
``--arg kv-cache-memory-bytes=banana`` started vLLM, which then refused it)."""

from __future__ import annotations

import pytest

from m3ctl.catalog.vllm_values import check_args, parse_value_types, value_types
from m3ctl.errors import BadInput

SAMPLES = ["256M", "1K", "1k", "25.6k", "1.5K", "banana", "", "12", "0x10", "2G", "1e3", " 8k ", "-5", "3T", "1.5"]


def test_agrees_with_vllms_own_parser_on_every_sample():
    argparse_utils = pytest.importorskip("vllm.utils.argparse_utils")
    for v in SAMPLES:
        try:
            argparse_utils.human_readable_int(v)
            vllm_ok = True
        except Exception:  # noqa: BLE001 - ValueError or argparse.ArgumentTypeError
            vllm_ok = False
        try:
            check_args({"kv-cache-memory-bytes": v})
            ours = True
        except BadInput:
            ours = False
        assert ours == vllm_ok, v


def test_max_model_len_takes_auto_and_other_flags_are_left_to_the_rules():
    check_args({"max-model-len": "auto", "max_model_len": -1, "gpu-memory-utilization": "banana"})
    with pytest.raises(BadInput, match=r"--arg max-model-len='x'.*or auto"):
        check_args({"max-model-len": "x"})


def test_the_table_is_validated():
    assert "kv-cache-memory-bytes" in value_types().human_readable_int
    from m3ctl.errors import CatalogError

    with pytest.raises(CatalogError):
        parse_value_types("vllm_version: 0.32.0\nsource: x\nhuman_readable_int: []\n")
    with pytest.raises(CatalogError):
        parse_value_types("vllm_version: 0.32.0\nsource: x\nhuman_readable_int: [a]\nbogus: 1\n")


def test_plan_request_refuses_before_planning():
    from m3ctl import api

    with pytest.raises(BadInput, match="kv-cache-memory-bytes"):
        api.plan(system="h200x8", args={"kv-cache-memory-bytes": "banana"})


def test_a_switch_takes_true_or_false_only():
    """`--arg enforce-eager=maybe` was planned as `--enforce-eager maybe`, which vLLM's parser refuses."""
    check_args({"enforce-eager": True, "enable-prefix-caching": False})
    for v in ("maybe", 0, "no"):
        with pytest.raises(BadInput, match="is a switch and takes no value"):
            check_args({"enforce-eager": v})
