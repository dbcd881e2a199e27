"""``m3ctl dev scale-model --drafter``: a DSpark drafter config vLLM 0.26 accepts for the scale model, checked on
the CPU by loading it as transformers does (AutoConfig) and reading each field vLLM reads:
registry ``Qwen3DSparkModel`` (model_executor/models/registry.py), SpeculativeConfig (dspark_block_size, the method
from the architecture), DFlashQwen3Model (hidden size, target_layer_ids, mask token), DSparkMarkovHead
(markov_rank), get_eagle3_aux_layers_from_config (target layer i read as aux hidden state i + 1)."""

from __future__ import annotations

import json

import pytest

from m3ctl.assess.facts import drafter_block_size
from m3ctl.dev.scale_model import ScaleModelSpec, build_scale_model, dspark_drafter_config, scale_config
from m3ctl.errors import BadInput
from m3ctl.planning.offline import check_snapshot
from tests.conftest import run_cli


@pytest.mark.parametrize("layers", [1, 2, 16])
def test_the_drafter_config_loads_with_transformers_and_holds_what_vllm_reads(layers):
    from transformers import AutoConfig, PretrainedConfig

    target = scale_config(ScaleModelSpec(arch="minimax-m3", layers=layers, quant="bf16"))
    text = target["text_config"]
    raw = dspark_drafter_config(target)
    cfg = AutoConfig.for_model(**raw)
    assert isinstance(cfg, PretrainedConfig) and cfg.model_type == "qwen3"
    assert cfg.architectures == ["Qwen3DSparkModel"]
    assert cfg.hidden_size == text["hidden_size"] and cfg.vocab_size == text["vocab_size"]
    assert cfg.num_hidden_layers == 1 and cfg.markov_rank > 0
    assert cfg.dspark_block_size == 7
    dflash = cfg.dflash_config
    ids = dflash["target_layer_ids"]
    assert ids and all(0 <= i < layers for i in ids)  # aux hidden state i + 1 exists: 1..layers
    assert cfg.dspark_target_layer_ids == ids
    assert 0 <= dflash["mask_token_id"] < cfg.vocab_size
    assert cfg.num_attention_heads * cfg.head_dim > 0 and cfg.num_key_value_heads >= 1
    assert cfg.layer_types == ["full_attention"]


def test_scale_model_drafter_is_written_where_the_planner_looks(tmp_path):
    out = build_scale_model(tmp_path / "m3b", ScaleModelSpec(arch="minimax-m3", layers=2, quant="bf16", drafter=True))
    conf = json.loads((out / "dspark" / "config.json").read_text())
    assert conf["architectures"] == ["Qwen3DSparkModel"]
    assert drafter_block_size(str(out / "dspark")) == 7  # what the planner reads
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(out / "dspark"))  # as vLLM's draft ModelConfig loads it
    assert cfg.architectures == ["Qwen3DSparkModel"] and cfg.rope_parameters["rope_theta"] == 1_000_000.0
    assert getattr(cfg, "n_predict", None) is None  # vLLM would otherwise check the depth's divisibility by it
    check_snapshot(out / "dspark", "drafter", False)  # an offline launch (--load-format dummy) accepts it


def test_the_cli_writes_the_drafter_and_refuses_it_for_minimax_m2(tmp_path):
    r = run_cli("dev", "scale-model", str(tmp_path / "a"), "--arch", "minimax-m3", "--layers", "1", "--drafter")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "a" / "dspark" / "config.json").is_file() and "DSpark drafter" in r.stdout
    r = run_cli("dev", "scale-model", str(tmp_path / "b"), "--arch", "minimax-m2", "--layers", "1", "--drafter")
    assert r.returncode == 2 and "error: --drafter" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(BadInput):
        ScaleModelSpec(arch="minimax-m2", drafter=True).validate()
