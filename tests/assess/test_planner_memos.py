"""The planner's memoized answers (what made ``tune --dry-run`` fast) give what the functions computed before, and
follow their tables: a swapped table (a test's, a reloaded file) is answered from the new table, never from a stale
memo. The ``--json`` and text of ``tune --dry-run`` are byte-identical before and after (checked by a diff over
several systems when the memos came in; :func:`test_tune_dry_run_json_is_the_same_on_a_second_run` holds it)."""

from __future__ import annotations

import json

from m3ctl import api, catalog
from m3ctl.assess import capability
from m3ctl.assess.facts import ModelFacts, _copy, model_facts
from m3ctl.core import secrets


def test_the_memoized_capability_verdicts_equal_the_computed_ones():
    t = capability.table()
    engines = (None, "0.1.0", "99.0")
    cudas = (None, "11.8", "13.0")
    for arch, row in t.archs.items():
        for name in row.features:
            for engine in engines:
                for cuda in cudas:
                    got = capability.evaluate_feature(arch, name, engine_version=engine, image_cuda=cuda)
                    assert got == capability._evaluate_feature(arch, name, engine_version=engine, image_cuda=cuda)
        for precision in t.precisions:
            for attention in t.attention_features:
                for engine in engines:
                    got = capability.variant_support(arch, precision, attention, engine_version=engine)
                    assert got == capability._variant_support(arch, precision, attention, engine_version=engine)


def test_a_swapped_capability_table_is_answered_from_the_new_table(monkeypatch):
    t = capability.table()
    arch = next(a for a, row in t.archs.items() if row.features)
    name, row = next(iter(t.archs[arch].features.items()))
    before = capability.evaluate_feature(arch, name)
    other = "unsupported" if row.status != "unsupported" else "native"
    archs = dict(t.archs)
    archs[arch] = t.archs[arch].model_copy(
        update={"features": {**t.archs[arch].features, name: row.model_copy(update={"status": other})}}
    )
    swapped = t.model_copy(update={"archs": archs})
    monkeypatch.setattr(capability, "table", lambda: swapped)
    assert capability.evaluate_feature(arch, name).status == other != before.status


def test_the_fast_facts_copy_is_a_deep_copy():
    f = ModelFacts(
        source="x",
        architectures=["A"],
        sparse_attention_freq=[1, 0],
        sparse_attention_config={"nested": {"freq": [1]}},
        assumed=["num_layers"],
    )
    c = _copy(f)
    assert c == f.model_copy(deep=True) and c.model_fields_set == f.model_fields_set
    c.architectures.append("B")
    c.sparse_attention_config["nested"]["freq"].append(2)
    assert f.architectures == ["A"] and f.sparse_attention_config == {"nested": {"freq": [1]}}


def test_merged_facts_do_not_share_the_local_records_lists():
    spec = catalog.find_model("MiniMax-M3.1-Flash")
    local = ModelFacts(source="MiniMax-M3.1-Flash", architectures=["X"])
    merged = model_facts(spec, local)
    merged.architectures.append("Y")
    assert local.architectures == ["X"]


def test_secret_flag_answers_follow_the_secrets_table(monkeypatch):
    assert secrets.secret_flag("--api-key").env == "VLLM_API_KEY"
    assert secrets.secret_flag("--api_k").env == "VLLM_API_KEY"  # a unique prefix, as vLLM's parser reads it
    assert secrets.secret_flag("--max-num-seqs") is None
    assert secrets.near_secret_flag("--api-keyy") and not secrets.near_secret_flag("--max-num-seqs")
    t = secrets.table()
    swapped = t.model_copy(update={"flags": {k: v for k, v in t.flags.items() if k != "api-key"}})
    monkeypatch.setattr(secrets, "table", lambda: swapped)
    assert secrets.secret_flag("--api-key") is None  # not a stale memo of the built-in table
    monkeypatch.undo()
    assert secrets.secret_flag("--api-key").env == "VLLM_API_KEY"


def test_tune_dry_run_json_is_the_same_on_a_second_run(tmp_path):
    """A second dry run in one process (every memo warm) answers what the first (memos emptied) answered."""

    def dry_run() -> str:
        r = api.tune("MiniMax-M3.1-Flash", system="h200x4", dry_run=True, study_dir=tmp_path / "study")
        return json.dumps(r, sort_keys=True, default=str)

    secrets._MEMO.clear()
    capability._MEMO.clear()
    first = dry_run()
    assert secrets._MEMO and capability._MEMO
    assert dry_run() == first
