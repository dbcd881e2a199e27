"""Per-machine settings (issue 17): ``M3CTL_*`` variables, the XDG default config file, their precedence
(command line > --config > M3CTL_* > ~/.config/m3ctl/config.yaml > catalog; m3ctl.assess.request), unknown
``M3CTL_`` variables reported, and shell completion."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from m3ctl.cli import main


@pytest.fixture
def xdg(tmp_path, monkeypatch):
    """An empty XDG config home; returns the path of m3ctl's default config file in it."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for k in ("M3CTL_MODEL", "M3CTL_PORT"):
        monkeypatch.delenv(k, raising=False)
    path = tmp_path / "xdg" / "m3ctl" / "config.yaml"
    path.parent.mkdir(parents=True)
    return path


def planned(capsys, *args: str) -> dict:
    rc = main(["plan", "--json", *args])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out)


def port_of(plan: dict) -> str:
    return plan["argv"][plan["argv"].index("--port") + 1]


def test_precedence_cli_over_config_over_env_over_xdg_file(capsys, monkeypatch, tmp_path, xdg, tiny_models):
    tiny = str(tiny_models["llama"])
    xdg.write_text(f"model: {tiny}\nport: 8301\n")
    p = planned(capsys)
    assert tiny in p["argv"] and port_of(p) == "8301"  # the XDG file alone picks the model and port
    monkeypatch.setenv("M3CTL_PORT", "8302")
    assert port_of(planned(capsys)) == "8302"  # env over the file
    cfg = tmp_path / "run.yaml"
    cfg.write_text("port: 8303\n")
    assert port_of(planned(capsys, "--config", str(cfg))) == "8303"  # --config over env
    assert port_of(planned(capsys, "--config", str(cfg), "--port", "8304")) == "8304"  # the command line over all


def test_m3ctl_model_is_the_default_model_of_plan_serve_doctor_and_tune(capsys, monkeypatch, xdg, tiny_models):
    tiny = str(tiny_models["llama"])
    monkeypatch.setenv("M3CTL_MODEL", tiny)
    assert tiny in planned(capsys)["argv"]
    assert main(["serve", "--dry-run", "--json"]) == 0  # no --model needed
    assert tiny in json.loads(capsys.readouterr().out)["argv"]
    assert main(["doctor", "--json"]) in (0, 1)
    rep = json.loads(capsys.readouterr().out)
    assert any(c["id"] == "model.plan" for c in rep["checks"])  # a local model directory was checked
    assert main(["tune", "--dry-run", "--json", "--knob", "max_num_seqs=4"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == tiny


def test_serve_without_a_model_anywhere_is_a_usage_error(capsys, xdg):
    assert main(["serve", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Missing option '--model' (or M3CTL_MODEL)")


def test_bad_values_in_env_and_xdg_file_name_their_source(capsys, monkeypatch, xdg):
    monkeypatch.setenv("M3CTL_PORT", "eighty")
    assert main(["plan", "--system", "h200x8"]) == 2
    assert capsys.readouterr().err.startswith("error: M3CTL_PORT='eighty'")
    monkeypatch.setenv("M3CTL_MODEL", " ")  # planned `vllm serve ' '`
    assert main(["plan", "--system", "h200x8"]) == 2
    assert capsys.readouterr().err.startswith("error: M3CTL_MODEL=' ': the model name is empty")
    monkeypatch.delenv("M3CTL_MODEL")
    monkeypatch.setenv("M3CTL_PORT", "9100.5")
    assert main(["plan", "--system", "h200x8"]) == 2
    assert capsys.readouterr().err.startswith("error: M3CTL_PORT='9100.5'")
    monkeypatch.setenv("M3CTL_PORT", "9100.0")  # integral: 9100, as `--port 9100.0` reads
    assert port_of(planned(capsys, "--system", "h200x8")) == "9100"
    assert port_of(planned(capsys, "--system", "h200x8", "--port", "9100.0")) == "9100"
    monkeypatch.delenv("M3CTL_PORT")
    xdg.write_text("port: 8001\nmax_model_len: 8192\nport: 8002\n")  # the second port won with no word
    assert main(["plan", "--system", "h200x8"]) == 2
    assert f"{xdg}: not valid YAML: key 'port' given twice (line 3, column 1)" in capsys.readouterr().err
    xdg.write_text("max_num_seqs: [1\n")  # said only "while parsing a flow sequence": no problem, no place
    assert main(["plan", "--system", "h200x8"]) == 2
    assert f"{xdg}: not valid YAML: did not find expected ',' or ']' (line 2, column 1)" in capsys.readouterr().err
    xdg.write_text("prot: 8000\n")
    assert main(["plan", "--system", "h200x8"]) == 2
    assert f"{xdg}: unknown key 'prot'; did you mean 'port'?" in capsys.readouterr().err
    xdg.unlink()
    xdg.mkdir()  # a directory where the file belongs: refused as --config refuses it (it was silently ignored)
    assert main(["plan", "--system", "h200x8"]) == 2
    err = capsys.readouterr().err
    assert main(["plan", "--system", "h200x8", "--config", str(xdg)]) == 2
    assert str(xdg) in err and "directory" in err and err == capsys.readouterr().err


def test_unknown_m3ctl_variables_are_reported_on_stderr(tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("M3CTL_")},
        "M3CTL_PROT": "8000",
        "M3CTL_MODEL": "x",
        "M3CTL_DEBUG": "0",
        "M3CTL_STATE_DIR": os.environ["M3CTL_STATE_DIR"],
        "XDG_CONFIG_HOME": str(tmp_path),
    }
    p = subprocess.run(
        [sys.executable, "-m", "m3ctl", "status", "--json"], capture_output=True, text=True, env=env, timeout=60
    )
    assert p.returncode == 0 and json.loads(p.stdout) == []
    (line,) = p.stderr.splitlines()
    assert line.startswith("warning: unknown environment variable(s) M3CTL_PROT ignored") and "M3CTL_PORT" in line


def test_shell_completion_is_on(capsys, monkeypatch):
    assert main(["--help"]) == 0
    assert "--install-completion" in capsys.readouterr().out
    env = {
        **os.environ,
        "_M3CTL_COMPLETE": "complete_bash",
        "COMP_WORDS": "m3ctl bench --workload pre",
        "COMP_CWORD": "3",
    }
    p = subprocess.run([sys.executable, "-m", "m3ctl"], capture_output=True, text=True, env=env, timeout=60)
    assert p.stdout.split() == ["prefix-repetition"]
