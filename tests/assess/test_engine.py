"""One decision engine (issue 13): doctor and plan give the same answer; catalog/rule fixes N01, N07, N10, N11,
N15, N17 (field-failures-2.md) through public interfaces."""

from __future__ import annotations

import json
import shlex

import pytest

from m3ctl import catalog
from m3ctl.checks.doctor import run_doctor
from m3ctl.errors import CatalogError, ConfigRejected
from m3ctl.hw.inventory import GpuInfo, HostInventory
from m3ctl.hw.systems import inventory_for_system, system_names
from m3ctl.planning.plan import PlanRequest, plan
from tests.checks.test_doctor_hosts import EXPECTED, host
from tests.conftest import run_cli
from tests.hosts import ALL, h200x2, synthetic

VLLM = "vllm"


def _plan(inv, **kw):
    return plan(inv, PlanRequest(vllm_executable=VLLM, **kw))


def _rule(e: ConfigRejected) -> str:
    return e.message.removeprefix("rule ").split(":", 1)[0]


def _a100x8() -> HostInventory:
    gpus = tuple(
        GpuInfo(
            index=i,
            vendor="nvidia",
            name="NVIDIA A100-SXM4-80GB",
            arch="ampere",
            compute_capability="8.0",
            memory_total_mib=81920,
        )
        for i in range(8)
    )
    return HostInventory(gpus=gpus, probe="synthetic", driver_version="580.82.07", cuda_driver_version="13.0")


# ----------------------------------------------------------------------------- the four disagreements of issue 13
def test_real_h200x2_doctor_runnable_means_its_serve_command_plans(tmp_path):
    inv_file = tmp_path / "h200x2.json"
    inv_file.write_text(h200x2().model_dump_json())
    p = run_cli("doctor", "--inventory", str(inv_file), "--json")
    assert p.returncode == 0, p.stderr
    v = json.loads(p.stdout)["verdict"]
    assert v["status"] == "runnable_with_fallbacks" and v["plan_request"]["allow_emulated"] is True
    cmd = shlex.split(v["serve_command"])
    assert cmd[:2] == ["m3ctl", "serve"] and "--allow-emulated" in cmd and "--inventory" in cmd
    # no --max-model-len: the planner sizes the context (the largest that fits) as `m3ctl plan` does (issue 23)
    assert "--max-model-len" not in cmd and "--tp" not in cmd
    s = run_cli(*cmd[1:], "--dry-run", "--json")  # accepted as is
    assert s.returncode == 0, s.stderr
    planned = json.loads(s.stdout)
    assert planned["variant"] == v["variant"] and planned["tp"] == v["tp"]
    mml = int(planned["argv"][planned["argv"].index("--max-model-len") + 1])  # the largest that fits, chosen
    assert v["context"] < mml <= v["max_context"]


def test_h200x8_driver_575_both_pick_the_cu129_image():
    inv = synthetic("h200x8").model_copy(update={"driver_version": "575.57.08", "cuda_driver_version": "12.9"})
    p = _plan(inv, runtime="docker")
    assert p.image == "vllm/vllm-openai:latest-cu129"
    assert any("vllm-openai-cu129" in w and "575.51.03" not in w and "580.65.06" in w for w in p.warnings)
    rep = run_doctor(inv, host_checks=False, runtime="docker")
    assert rep.verdict.image == "vllm-openai-cu129" and rep.check("image.cuda_vs_driver").status == "OK"
    assert rep.verdict.status != "not_runnable" and "--runtime docker" in rep.verdict.serve_command


def test_a100_doctor_and_plan_agree_not_runnable():
    inv = _a100x8()
    for model in ("MiniMax-M2.5", "MiniMax-M3.1-Flash"):  # M2.5 FP8 was "runnable with fallbacks" in doctor only
        with pytest.raises(CatalogError, match="no kernel profile"):
            _plan(inv, model=model)
        rep = run_doctor(inv, model=model, host_checks=False)
        assert rep.verdict.status == "not_runnable" and rep.exit_code() == 1, rep.verdict.summary
    assert any(
        b.startswith("model.profile:")
        for b in run_doctor(inv, model="MiniMax-M2.5", host_checks=False).verdict.blockers
    )


def test_rtxpro6000_mxfp8_does_not_run_in_both():
    inv = synthetic("rtxpro6000x2")
    with pytest.raises(ConfigRejected) as ei:
        _plan(inv, variant="mxfp8", tp=2)
    assert _rule(ei.value) == "variant.native" and "N08" in ei.value.hint
    rep = run_doctor(inv, variant="mxfp8", host_checks=False)
    assert rep.check("capability.quantization").status == "FAIL" and rep.verdict.status == "not_runnable"


# ----------------------------------------------------------------------------- the invariant
CATALOG_MODELS = [m for m, s in catalog.models().items() if s.variants]
HOSTS = {
    **{k: ALL[k] for k in ALL},
    **{k: (lambda k=k: host(k)) for k in EXPECTED},
    # every system of the --system catalog (m3ctl/data/systems.yaml), at its default GPU count
    **{f"system-{n}": (lambda n=n: inventory_for_system(n)) for n in system_names()},
}


@pytest.mark.parametrize("host_name", sorted(HOSTS))
def test_doctor_verdict_is_a_plan_on_every_host_model_variant(host_name):
    """Every real and synthetic host x every catalog model x its variants (and the default):
    1. doctor runnable => its request plans (exit 0), same variant and TP;
    2. the engine rejects doctor's request => doctor is not runnable and names the same rule id;
    3. `m3ctl plan --model M [--variant V]` rejects => a not-runnable verdict names the same rule id, or a runnable
       verdict's request carries the flag that answers it (--allow-emulated, --max-model-len, --tp)."""
    inv = HOSTS[host_name]()
    seen = {"runnable": 0, "rejected": 0, "user_rejected": 0, "no_profile": 0}
    # memory.fit: doctor's fix may be another variant with a fallback (the layout is the planner's search, issue 23)
    fixed_by = {
        "variant.native": ["allow_emulated"],
        "memory.fit": ["max_model_len", "tp", "variant", "allow_emulated"],
        "quant.shard_alignment": ["tp"],
        "parallel.gpus": ["tp"],
    }
    for model in CATALOG_MODELS:
        for variant in [None, *catalog.models()[model].variants]:
            v = run_doctor(inv, model=model, variant=variant, host_checks=False).verdict
            where = (host_name, model, variant, v.summary)
            if v.plan_request is None:
                assert v.status == "not_runnable" and v.serve_command is None, where
            else:
                try:
                    p = _plan(inv, **v.plan_request)
                except ConfigRejected as e:
                    seen["rejected"] += 1
                    assert v.status == "not_runnable", where
                    assert any(b.startswith(_rule(e) + ":") for b in v.blockers), (where, _rule(e))
                except CatalogError:  # no kernel profile for this architecture (a100, l40s): doctor says so
                    seen["no_profile"] += 1
                    assert v.status == "not_runnable", where
                    assert any(b.startswith("model.profile:") for b in v.blockers), where
                else:
                    if v.status == "not_runnable":  # planned; a host check blocks (e.g. driver.amdsmi for a process)
                        assert v.blockers, where
                    else:
                        seen["runnable"] += 1
                        assert v.serve_command and p.variant == v.variant and p.tp == v.tp, where
            try:
                _plan(inv, model=model, variant=variant)
            except ConfigRejected as e:
                seen["user_rejected"] += 1
                rule = _rule(e)
                if v.status == "not_runnable":
                    assert any(b.startswith(rule + ":") for b in v.blockers), (where, rule)
                else:
                    assert any(k in v.plan_request for k in fixed_by[rule]), (where, rule, v.plan_request)
            except CatalogError:
                assert v.status == "not_runnable", where
    assert seen["runnable"] + seen["rejected"] + seen["no_profile"] > 0


def test_plan_rejection_is_named_by_doctor_with_the_same_rule():
    # 2 x H200, bf16: plan rejects memory.fit, doctor's verdict names memory.fit too.
    with pytest.raises(ConfigRejected) as ei:
        _plan(h200x2(), variant="bf16", tp=2)
    assert _rule(ei.value) == "memory.fit"
    rep = run_doctor(h200x2(), variant="bf16", host_checks=False)
    assert any(b.startswith("memory.fit:") for b in rep.verdict.blockers)


# ----------------------------------------------------------------------------- choose, don't just reject
def test_largest_max_model_len_that_fits_is_chosen_and_said():
    p = _plan(h200x2(), variant="nvfp4", allow_emulated=True)
    mml = int(p.argv[p.argv.index("--max-model-len") + 1])
    assert 32768 < mml < 524288 and mml % 128 == 0  # a multiple of the MSA KV block
    assert any("max-model-len" in w and "KV capacity" in w and "concurrent sequence" in w for w in p.warnings)
    explicit = _plan(h200x2(), variant="nvfp4", allow_emulated=True, max_model_len=32768)
    assert explicit.argv[explicit.argv.index("--max-model-len") + 1] == "32768"


# ----------------------------------------------------------------------------- precedence
def test_command_line_beats_config_file(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("schema_version: 1\nep: true\nmax_model_len: 65536\nargs: {max-num-seqs: 8}\n")
    inv = tmp_path / "b200.json"
    inv.write_text(synthetic("b200x8").model_dump_json())
    p = run_cli("plan", "--inventory", str(inv), "--config", str(cfg), "--no-ep", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["layout"]["ep"] is False  # --no-ep on the command line beats ep: true in the file
    assert out["request"]["ep"] is False and out["request"]["max_model_len"] == 65536  # the merged request
    argv = out["argv"]
    assert argv[argv.index("--max-model-len") + 1] == "65536" and argv[argv.index("--max-num-seqs") + 1] == "8"
    p2 = run_cli("plan", "--inventory", str(inv), "--config", str(cfg), "--max-model-len", "4096", "--json")
    argv2 = json.loads(p2.stdout)["argv"]
    assert argv2[argv2.index("--max-model-len") + 1] == "4096" and json.loads(p2.stdout)["layout"]["ep"] is True
    cfg2 = tmp_path / "c2.yaml"
    cfg2.write_text("args: {max-model-len: 1000}\n")  # a typed command-line flag also beats the file's --arg form
    p3 = run_cli("plan", "--inventory", str(inv), "--config", str(cfg2), "--max-model-len", "4096", "--json")
    argv3 = json.loads(p3.stdout)["argv"]
    assert argv3[argv3.index("--max-model-len") + 1] == "4096"


# ----------------------------------------------------------------------------- catalog and rule fixes
def test_n01_mxfp8_indexer_fp8_only_on_sm100():
    for h in ("h200x8", "mi300xx8"):
        p = _plan(synthetic(h), variant="mxfp8", tp=8, allow_emulated=True)
        assert "--attention_config.indexer_kv_dtype" not in p.argv, h
    b = _plan(synthetic("b200x8"), variant="mxfp8", tp=8)
    assert "--attention_config.indexer_kv_dtype" in b.argv
    for raw in (["--attention_config.indexer_kv_dtype", "fp8"], ["--attention-config", '{"indexer_kv_dtype":"fp8"}']):
        with pytest.raises(ConfigRejected) as ei:
            _plan(synthetic("h200x8"), variant="mxfp8", tp=8, extra_args=raw)
        assert _rule(ei.value) == "msa.indexer_kv_dtype" and "Triton" in ei.value.message


def test_n07_mxfp8_on_cdna3_is_sized_as_bf16():
    with pytest.raises(ConfigRejected) as ei:
        _plan(synthetic("mi300xx8"), variant="mxfp8", tp=4, dp=1, pp=1, allow_emulated=True, max_model_len=32768)
    assert _rule(ei.value) == "memory.fit" and "BF16" in ei.value.message
    _plan(synthetic("mi300xx8"), variant="mxfp8", tp=8, allow_emulated=True, max_model_len=32768)
    rep = run_doctor(synthetic("mi300xx8"), variant="mxfp8", host_checks=False, runtime="docker")
    assert rep.verdict.tp == 8


def _moe_dir(tmp_path, quant: dict):
    d = tmp_path / "moe704"
    d.mkdir(parents=True)
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["MiniMaxM2ForCausalLM"],
                "model_type": "minimax_m2",
                "hidden_size": 1024,
                "num_attention_heads": 8,
                "num_key_value_heads": 8,
                "num_hidden_layers": 2,
                "num_local_experts": 8,
                "moe_intermediate_size": 704,
                "max_position_embeddings": 4096,
                "quantization_config": quant,
            }
        )
    )
    return str(d)


def test_n15_nvfp4_moe_shard_alignment(tmp_path):
    m = _moe_dir(tmp_path, {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16})
    with pytest.raises(ConfigRejected) as ei:
        _plan(synthetic("b200x8"), model=m, tp=4, dp=1, pp=1, dcp=1, ep=False)
    assert _rule(ei.value) == "quant.shard_alignment" and "--ep" in ei.value.hint
    _plan(synthetic("b200x8"), model=m, tp=4, ep=True)
    with pytest.raises(ConfigRejected):  # the FlashInfer TRT-LLM backend named explicitly: same tile
        _plan(
            synthetic("b200x8"),
            model=m,
            tp=4,
            dp=1,
            pp=1,
            dcp=1,
            ep=False,
            extra_args=["--moe-backend", "flashinfer_trtllm"],
        )
    _plan(synthetic("h200x8"), model=m, tp=4, allow_emulated=True)  # Hopper: NVFP4 MoE via Marlin, not this tile
    with pytest.raises(ConfigRejected) as ei:  # the local checkpoint's NVFP4 is emulated there, as the catalog's is
        _plan(synthetic("h200x8"), model=m, tp=4)
    assert _rule(ei.value) == "variant.native"
    fp8 = _moe_dir(tmp_path / "fp8", {"quant_method": "fp8", "weight_block_size": [128, 128]})
    with pytest.raises(ConfigRejected) as ei:  # the FP8 block rule (F11) is unchanged
        _plan(synthetic("h200x8"), model=fp8, tp=4, dp=1, pp=1, dcp=1, ep=False)
    assert "quantization block 128" in ei.value.message


def test_n10_flat_hf_overrides_warned_with_the_nested_form():
    p = _plan(
        synthetic("mi355xx8"),
        model="MiniMax-M3",
        variant="mxfp4",
        tp=4,
        extra_args=["--hf-overrides", '{"use_index_cache": true, "index_topk_freq": 4}'],
    )
    w = [x for x in p.warnings if "model.hf_overrides" in x]
    assert w and '"text_config":{"use_index_cache":true,"index_topk_freq":4}' in w[0]
    nested = _plan(
        synthetic("mi355xx8"),
        model="MiniMax-M3",
        variant="mxfp4",
        tp=4,
        extra_args=["--hf-overrides", '{"text_config": {"use_index_cache": true}}'],
    )
    assert not any("model.hf_overrides" in x for x in nested.warnings)


def test_n17_unknown_hub_id_is_neither_dense_nor_gqa():
    inv = synthetic("b200x8")
    p = _plan(inv, model="zai-org/GLM-5.3", tp=8, ep=True)  # no false parallel.ep rejection
    assert p.ep
    with pytest.raises(ConfigRejected) as ei:
        _plan(inv, model="zai-org/GLM-5.3", tp=8, dcp=2)
    assert _rule(ei.value) == "parallel.dcp" and "unknown" in ei.value.message and "GQA" not in ei.value.message


def test_attention_backend_spelled_twice_reaches_vllm_once():
    p = _plan(synthetic("b200x8"), extra_args=["--attention-backend", "TRITON_ATTN"])
    assert "--attention-backend" in p.argv and "--attention_config.backend" not in p.argv


# ----------------------------------------------------------------------------- N11 / #16.5: DSpark depth
@pytest.mark.parametrize("form", ["typed", "json", "dotted"])
def test_n11_dspark_depth_vs_block_size_every_spelling(form):
    inv = synthetic("b200x8")

    def req(depth: int) -> dict:
        if form == "typed":
            return {"spec_method": "dspark", "spec_depth": depth}
        if form == "json":
            return {
                "extra_args": [
                    "--speculative-config",
                    json.dumps(
                        {
                            "method": "dspark",
                            "model": "MiniMaxAI/MiniMax-M3.1-Flash-DSpark",
                            "num_speculative_tokens": depth,
                        }
                    ),
                ]
            }
        return {
            "extra_args": [
                "--speculative-config.method",
                "dspark",
                "--speculative-config.num_speculative_tokens",
                str(depth),
            ]
        }

    with pytest.raises(ConfigRejected) as ei:  # below the block size: vLLM refuses to start
        _plan(inv, **req(5))
    assert _rule(ei.value) == "spec.dspark_depth" and "< the drafter's trained block size 7" in ei.value.message
    above = _plan(inv, **req(9))  # above: runs, acceptance collapses: WARN
    assert any("spec.dspark_depth" in w and "acceptance collapses" in w for w in above.warnings)
    assert above.spec_depth == 9
    ok = _plan(inv, **req(7))
    assert not any("spec.dspark_depth" in w for w in ok.warnings)


def test_n11_block_size_read_from_a_local_drafter_config(tmp_path):
    d = tmp_path / "drafter"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["DSparkDrafter"], "dspark_block_size": 5}))
    inv = synthetic("b200x8")
    spec = json.dumps({"method": "dspark", "model": str(d), "num_speculative_tokens": 7})
    p = _plan(inv, extra_args=["--speculative-config", spec])  # the model card's 7 on a block-5 drafter: WARN
    assert any("spec.dspark_depth" in w and "block size 5" in w and "config.json" in w for w in p.warnings)
    with pytest.raises(ConfigRejected) as ei:
        _plan(
            inv,
            extra_args=[
                "--speculative-config",
                spec.replace('"num_speculative_tokens": 7', '"num_speculative_tokens": 4'),
            ],
        )
    assert "< the drafter's trained block size 5" in ei.value.message


def test_raw_speculative_config_goes_through_the_token_budget_rule():
    with pytest.raises(ConfigRejected) as ei:
        _plan(
            synthetic("b200x8"),
            max_num_seqs=1024,
            max_num_batched_tokens=2048,
            extra_args=["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'],
        )
    assert _rule(ei.value) == "spec.token_budget"


# ----------------------------------------------------------------------------- version awareness
def test_old_engine_is_not_native_for_minimax_m3():
    rep_new = run_doctor(synthetic("b200x8"), host_checks=False)
    assert rep_new.verdict.status == "runnable_with_fallbacks"  # only the day-0 stack's fallbacks
    assert all(f.startswith("day0.") for f in rep_new.verdict.fallbacks), rep_new.verdict.fallbacks
    from m3ctl.checks.doctor import ImageFacts

    old = ImageFacts(name="vllm-0.12", reference="vllm/vllm-openai:v0.12.0", cuda_version="12.9", vllm_version="0.12.0")
    rep = run_doctor(synthetic("b200x8"), host_checks=False, image=old)
    assert rep.verdict.status == "not_runnable"
    with pytest.raises(ConfigRejected) as ei:
        _plan(synthetic("b200x8"), engine_version="0.12.0")
    assert _rule(ei.value) == "variant.native" and "needs vLLM >= 0.24.0" in ei.value.message
    with pytest.raises(ConfigRejected) as ei:  # a local-dir-free bf16 request hits the model's own minimum too
        _plan(synthetic("b200x8"), model="MiniMax-M2.5", engine_version="0.12.0")
    assert _rule(ei.value) == "engine.version" and "0.20.2" in ei.value.message


# ----------------------------------------------------------------------------- a user --image, checked before launch
@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """A Docker Engine API on a unix socket that knows one image (what `docker image inspect` reads)."""
    import http.server
    import socketserver
    import threading

    images: dict[str, dict] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            from urllib.parse import unquote

            ref = unquote(self.path.removeprefix("/images/").removesuffix("/json"))
            body = json.dumps({"Config": images[ref]}).encode() if ref in images else b"{}"
            self.send_response(200 if ref in images else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

        def get_request(self):
            req, _ = super().get_request()
            return req, ("local", 0)

    sock = tmp_path / "docker.sock"
    srv = Server(str(sock), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    yield images
    srv.shutdown()
    srv.server_close()


def test_user_image_checked_from_its_labels_before_launch(fake_engine):
    fake_engine["me/vllm:old"] = {"Env": ["CUDA_VERSION=13.0.1", "VLLM_VERSION=0.12.0"], "Labels": {}}
    fake_engine["me/vllm:cu13"] = {
        "Env": ["CUDA_VERSION=13.0.1", "TORCH_CUDA_ARCH_LIST=9.0a 10.0a"],
        "Labels": {"org.opencontainers.image.version": "v0.32.0"},
    }
    fake_engine["me/vllm:cu129"] = {"Env": ["CUDA_VERSION=12.9.1", "VLLM_VERSION=0.32.0"], "Labels": {}}
    b200 = synthetic("b200x8")
    with pytest.raises(ConfigRejected) as ei:
        _plan(b200, runtime="docker", image="me/vllm:old")
    assert _rule(ei.value) == "variant.native" and "needs vLLM >= 0.24.0" in ei.value.message  # from its VLLM_VERSION
    ok = _plan(b200, runtime="docker", image="me/vllm:cu13")
    assert ok.image == "me/vllm:cu13" and any("vLLM 0.32.0" in c.why for c in ok.choices if c.what == "image")
    with pytest.raises(ConfigRejected) as ei:  # GB300 (sm_103) is not in the image's arch list
        _plan(synthetic("b300x8"), runtime="docker", image="me/vllm:cu13")
    assert _rule(ei.value) == "image.archs"
    old_driver = b200.model_copy(update={"driver_version": "575.57.08", "cuda_driver_version": "12.9"})
    with pytest.raises(ConfigRejected) as ei:
        _plan(old_driver, runtime="docker", image="me/vllm:cu13")
    assert _rule(ei.value) == "image.cuda_vs_driver" and "580.65.06" in ei.value.hint
    assert _plan(old_driver, runtime="docker", image="me/vllm:cu129").image == "me/vllm:cu129"


def test_mla_config_is_not_gqa_for_the_dcp_rule(tmp_path):
    """A DeepSeek-V3-style config (kv_lora_rank: MLA, one latent KV 'head') is not held to GQA's TP > KV heads."""
    d = tmp_path / "mla"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["DeepseekV3ForCausalLM"],
                "model_type": "deepseek_v3",
                "hidden_size": 1024,
                "num_attention_heads": 16,
                "num_key_value_heads": 16,
                "num_hidden_layers": 2,
                "kv_lora_rank": 512,
                "n_routed_experts": 8,
                "moe_intermediate_size": 256,
                "max_position_embeddings": 4096,
            }
        )
    )
    p = _plan(synthetic("b200x8"), model=str(d), tp=8, dcp=2)  # GQA with 16 KV heads would need TP >= 32
    assert p.dcp == 2
    with pytest.raises(ConfigRejected) as ei:  # cdna3 has no DCP (N17)
        _plan(synthetic("mi300xx8"), model=str(d), tp=8, dcp=2)
    assert _rule(ei.value) == "parallel.dcp" and "MLA" in ei.value.message


def test_tune_searches_what_the_rules_allow(tmp_path):
    """tune builds its space from the same model facts and rules: no DCP for MSA on Hopper, DSpark only at its
    block size (both were swept and then rejected trial by trial)."""
    inv = tmp_path / "b200.json"
    inv.write_text(synthetic("b200x8").model_dump_json())
    p = run_cli(
        "tune", "--model", "MiniMax-M3.1-Flash", "--inventory", str(inv), "--slo", "p90_tpot_ms<=50", "--dry-run"
    )
    assert p.returncode == 0, p.stderr
    space = next(line for line in p.stdout.splitlines() if "space:" in line)
    assert "dcp [1];" in space and "spec_depth [0, 7]" in space
    assert "spec.dspark_depth" not in p.stdout


def test_a_bad_option_value_is_one_line_exit_2(tmp_path):
    inv = tmp_path / "h.json"
    inv.write_text(h200x2().model_dump_json())
    p = run_cli("plan", "--inventory", str(inv), "--runtime", "dockr")
    assert (
        p.returncode == 2
        and p.stderr.startswith("error: Invalid value for '--runtime'")
        and "Traceback" not in p.stderr
    )


def test_the_request_never_shows_secrets():
    from m3ctl.planning.plan import serve_command

    req = PlanRequest(
        model="MiniMax-M3.1-Flash",
        env={"MY_API_KEY": "abc123secret"},
        args={"api-key": "abc123secret"},
        extra_args=["--hf-token", "hf_abcdefghijklmnop"],
        vllm_executable=VLLM,
    )
    cmd = serve_command(req)
    assert "abc123secret" not in cmd and "hf_abcdefghijklmnop" not in cmd
    assert "abc123secret" not in json.dumps(req.public()) and "hf_abcdefghij" not in json.dumps(req.public())
