"""Issue 44, item 7: the API and the CLI refuse the same inputs; ``M3CTL_*`` values are checked like options;
contradictory options are refused; raw vLLM arguments layer like every other setting; an asked max-model-len
above the model's is refused (vLLM would), not capped; tune takes the user config's max_model_len as plan does.
Each test here fails on the main before the fix."""

from __future__ import annotations

import json

import pytest

from m3ctl import api
from m3ctl.errors import BadInput, ConfigRejected
from tests.conftest import run_cli

URL = "http://127.0.0.1:9"  # nothing listens: every refusal here comes before anything is sent


def _one_line(p) -> str:
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


# ----------------------------------------------------------------------------- the API refuses what the CLI does
def test_api_bench_refuses_a_negative_temperature_as_the_cli_does():
    with pytest.raises(BadInput, match=r"temperature: Input should be greater than or equal to 0"):
        api.bench(url=URL, model="m", temperature=-1)
    p = run_cli("bench", "--url", URL, "--model", "m", "--temperature", "-1")
    assert p.returncode == 2 and "greater than or equal to 0" in _one_line(p)


@pytest.mark.parametrize(
    ("call", "where"),
    [
        (lambda: api.bench(url=URL, model="m", label="a\x00b"), "label"),
        (lambda: api.bench(url=URL, model="m", label=b"run"), "label"),
        (lambda: api.bench(url=URL, model="m", tokenizer=b"/tmp/tok"), "tokenizer"),
        (lambda: api.plan(model="Mini\x00Max", system="h200x8"), "model"),
        (lambda: api.plan(model=b"MiniMax-M3.1-Flash", system="h200x8"), "model"),
        (lambda: api.plan(system="h200x8", args={"max-num-seqs": b"64"}), "args"),
        (lambda: api.plan(system="h200x8", extra_args=["--max-num-seqs", "6\x004"]), "extra_args"),
        (lambda: api.plan(system="h200x8", env={"A": "x\x00y"}), "env"),
    ],
)
def test_api_refuses_nul_and_bytes(call, where):
    """No argv holds a NUL or bytes; the API took them (pydantic decodes bytes, and a NUL cut the text where vLLM,
    a file name or a header read it). The settings models refuse them: one line naming the field."""
    with pytest.raises(BadInput, match=rf"{where}: (a NUL character|bytes are not text)"):
        call()


def test_a_config_file_with_a_nul_is_refused_as_the_api_refuses_it(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text('model: "Mini\\0Max"\n')
    p = run_cli("plan", "--system", "h200x8", "--config", str(cfg))
    assert p.returncode == 2 and "NUL character" in _one_line(p)


# ----------------------------------------------------------------------------- M3CTL_* checked like options
@pytest.mark.parametrize(
    ("var", "value", "said"),
    [
        ("M3CTL_DEBUG", "yes", "M3CTL_DEBUG='yes': not 0 or 1"),
        ("M3CTL_STATE_DIR", "", "M3CTL_STATE_DIR is set but empty"),
        ("M3CTL_STATE_DIR", "rel/state", "M3CTL_STATE_DIR='rel/state': not an absolute path"),
        (
            "M3CTL_STATE_DIR",
            "/proc/version",
            "M3CTL_STATE_DIR='/proc/version': not a directory",
        ),  # was "no deployments"
        ("M3CTL_PORT", "", "M3CTL_PORT=''"),
        ("M3CTL_MODEL", "", "M3CTL_MODEL='': the model name is empty"),
    ],
)
def test_a_bad_m3ctl_variable_is_refused_naming_it(var, value, said, monkeypatch):
    p = run_cli("status", env={var: value})
    assert p.returncode == 2 and said in _one_line(p)
    monkeypatch.setenv(var, value)
    with pytest.raises(BadInput, match=var):
        api.user_defaults()


# ----------------------------------------------------------------------------- contradictions
@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ("bench", "--url", URL, "--model", "m", "--concurrency", "4", "--max-concurrency", "8"),
            "--concurrency 4 and --max-concurrency 8: one option given twice",
        ),
        (("plan", "--system", "h200x8", "--port", "9000", "--port", "9001"), "--port 9000 and --port 9001"),
        (
            ("plan", "--system", "h200x8", "--arg", "max-num-seqs=64", "--arg", "max_num_seqs=32"),
            "--arg max-num-seqs=64 and --arg max_num_seqs=32: one vLLM flag given twice with different values",
        ),
        (
            ("plan", "--system", "h200x8", "--spec-depth", "0", "--spec-method", "ngram"),
            "--spec-depth 0 turns speculative decoding off and --spec-method ngram asks for it",
        ),
    ],
)
def test_contradictory_options_are_refused(argv, said):
    p = run_cli(*argv)
    assert p.returncode == 2 and said in _one_line(p)


def test_the_same_value_twice_is_no_contradiction():
    p = run_cli("plan", "--system", "h200x8", "--arg", "max-num-seqs=64", "--arg", "max-num-seqs=64", "--json")
    assert p.returncode == 0, p.stderr


def test_api_refuses_spec_depth_zero_with_a_method():
    with pytest.raises(BadInput, match="--spec-depth 0 turns speculative decoding off"):
        api.plan(system="h200x8", spec_depth=0, spec_method="ngram")


# ----------------------------------------------------------------------------- raw arguments layer
def _flag(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_raw_arguments_layer_like_every_other_setting(tmp_path):
    """A config file's raw ``--max-num-seqs 40`` beat the command line's ``--max-num-seqs 64`` (raw arguments were
    applied last); now each layer's raw flags are read into its args during the merge."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text('extra_args: [--max-num-seqs, "40"]\n')
    assert _flag(api.plan(system="h200x8", config=cfg, max_num_seqs=64).argv, "--max-num-seqs") == ["64"]
    assert _flag(api.plan(system="h200x8", config=cfg).argv, "--max-num-seqs") == ["40"]
    cfg.write_text("max_num_seqs: 40\n")  # and the command line's raw flag beats the file's typed one
    p = api.plan(system="h200x8", config=cfg, extra_args=["--max-num-seqs", "64"])
    assert _flag(p.argv, "--max-num-seqs") == ["64"]
    r = run_cli("plan", "--system", "h200x8", "--config", str(cfg), "--json", "--", "--max-num-seqs", "64")
    assert r.returncode == 0, r.stderr
    assert _flag(json.loads(r.stdout)["argv"], "--max-num-seqs") == ["64"]


# ----------------------------------------------------------------------------- max-model-len
def test_an_asked_max_model_len_above_the_models_is_refused(tiny_models, monkeypatch):
    """vLLM refuses a max_model_len above the model's max_position_embeddings (4096 for the tiny model) unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: m3ctl capped it with a note. Now a rule says so; the override passes it."""
    model = str(tiny_models["m2"])
    with pytest.raises(ConfigRejected) as e:
        api.plan(model=model, system="h200x8", max_model_len=8192)
    assert "model.max_len" in str(e.value) and "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in (e.value.hint or "")
    p = api.plan(model=model, system="h200x8", max_model_len=8192, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert _flag(p.argv, "--max-model-len") == ["8192"]


def test_tune_takes_the_user_configs_max_model_len(tmp_path, monkeypatch):
    xdg = tmp_path / "xdg"
    (xdg / "m3ctl").mkdir(parents=True)
    (xdg / "m3ctl" / "config.yaml").write_text("max_model_len: 2048\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    _, settings, _ = api.prepare_tune("MiniMax-M3.1-Flash", system="h200x8", dry_run=True, slo="p90_tpot_ms<=50")
    assert settings["plan_base"]["overrides"]["max-model-len"] == 2048
    _, settings, _ = api.prepare_tune(  # the tune's own flag wins
        "MiniMax-M3.1-Flash", system="h200x8", dry_run=True, slo="p90_tpot_ms<=50", args={"max-model-len": 4096}
    )
    assert settings["plan_base"]["overrides"]["max-model-len"] == 4096


@pytest.mark.parametrize(
    "call",
    [
        lambda: api.tune(model="MiniMax-M3.1-Flash", system="h200x8", slo="p90_tpot_ms<=20\x00", dry_run=True),
        lambda: api.tune(model="MiniMax-M3.1-Flash", system="h200x8", slo=b"p90_tpot_ms<=20", dry_run=True),
        lambda: api.tune(model="MiniMax-M3.1-Flash", system="h200x8", args={"max-num-seqs": "6\x004"}, dry_run=True),
    ],
)
def test_api_tune_refuses_nul_and_bytes_in_one_line(call):
    """The tune's settings (TuneOptions) refuse what no command line carries, as bench and plan do; it escaped as
    a raw pydantic ValidationError."""
    with pytest.raises(BadInput, match=r"m3ctl\.tune\(\w+=.*\): (a NUL character|bytes are not text)"):
        call()
