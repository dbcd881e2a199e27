"""Shell completion of option values: every option with a fixed or catalog set of values (a choice, vLLM's choices
of a flag, the catalog's variants and systems) completes in bash, zsh and fish, through the protocol the shells'
completion scripts speak (``_M3CTL_COMPLETE=complete_bash`` with ``COMP_WORDS``/``COMP_CWORD``; ``complete_zsh``
and ``complete_fish`` with ``_TYPER_COMPLETE_ARGS``), in a subprocess as the shell runs it, loading no engine and,
for ``plan``, nothing beyond the planner."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from m3ctl.cli.app import COMMANDS, load_command
from m3ctl.cli.options import completion_of
from m3ctl.core.state import Deployment, Registry
from m3ctl.planning.emit import FORMATS
from tests.conftest import M3CTL
from tests.test_structure import HEAVY, NOT_ON_PLAN, REPO


def _env(**kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("M3CTL_", "_M3CTL_", "_TYPER_", "COMP_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return {**env, **kw}


def bash(line: str) -> list[str]:
    """What bash's completion function gets for ``line`` (the word being completed: the last one, empty after a
    trailing space)."""
    words = line.split()
    cword = len(words) if line.endswith(" ") else len(words) - 1
    p = subprocess.run(
        M3CTL,
        env=_env(_M3CTL_COMPLETE="complete_bash", COMP_WORDS=line, COMP_CWORD=str(cword)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def zsh(line: str) -> list[str]:
    """The values zsh's completion function gets for ``line`` (its ``_arguments`` spec, unquoted)."""
    p = subprocess.run(
        M3CTL,
        env=_env(_M3CTL_COMPLETE="complete_zsh", _TYPER_COMPLETE_ARGS=line),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout.strip()
    assert out.startswith("_arguments '*: :((") and out.endswith("))'"), out
    return [v.split('":"')[0].strip('"') for v in out[len("_arguments '*: :((") : -len("))'")].split("\n")]


def fish(line: str) -> list[str]:
    p = subprocess.run(
        M3CTL,
        env=_env(_M3CTL_COMPLETE="complete_fish", _TYPER_COMPLETE_ARGS=line, _TYPER_COMPLETE_FISH_ACTION="get-args"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return [v.split("\t")[0] for v in p.stdout.split("\n") if v]


def test_bash_completes_catalog_systems_and_fixed_values():
    assert bash("m3ctl plan --system h2") == ["h200x1", "h200x2", "h200x4", "h200x8"]
    assert bash("m3ctl plan --emit ") == list(FORMATS)
    assert set(bash("m3ctl plan --variant ")) >= {"nvfp4", "mxfp4", "mxfp8", "bf16"}
    assert bash("m3ctl doctor --runtime ") == ["auto", "process", "docker"]
    assert bash("m3ctl serve --attention ") == ["msa", "dense"]
    assert bash("m3ctl bench --workload a") == ["agentic"]
    assert bash("m3ctl plan --systems h200x8,b3") == [
        "h200x8,b300x1",
        "h200x8,b300x2",
        "h200x8,b300x4",
        "h200x8,b300x8",
    ]
    assert "fp8" in bash("m3ctl plan --kv-cache-dtype fp")  # vLLM's own choices of the flag
    assert "mi355xx8" in bash("m3ctl tune --system mi355")


def test_catalog_models_and_images_complete_and_paths_stay_files():
    assert "vllm-openai-minimax-m3" in bash("m3ctl plan --image vllm")
    assert "vllm-openai-rocm-minimax-m3" in bash("m3ctl serve --image vllm-openai-r")
    assert "MiniMax-M3.1-Flash" in bash("m3ctl doctor --model MiniMax-M3")
    assert bash("m3ctl serve --model /tm") == []  # a path: bash's own file completion (complete -o default)


def test_zsh_and_fish_complete_the_same_values():
    assert zsh("m3ctl plan --system h2") == ["h200x1", "h200x2", "h200x4", "h200x8"]
    assert zsh("m3ctl plan --emit ") == list(FORMATS)
    assert zsh("m3ctl watch dep --restart ") == ["no", "on-failure"]
    assert fish("m3ctl plan --emit ") == list(FORMATS)
    assert fish("m3ctl plan --system h2") == ["h200x1", "h200x2", "h200x4", "h200x8"]


#: Options with a fixed or catalog set of values, by command: each must complete (a new one completes by its parser).
EXPECTED = {
    "plan": {
        "--system",
        "--systems",
        "--emit",
        "--variant",
        "--attention",
        "--runtime",
        "--kv-cache-dtype",
        "--spec-method",
    },
    "serve": {"--variant", "--attention", "--runtime", "--kv-cache-dtype", "--smoke", "--restart"},
    "doctor": {"--system", "--variant", "--runtime", "--kv-cache-dtype", "--attention"},
    "tune": {"--system", "--workload", "--objective", "--prompt-text"},
    "bench": {"--workload", "--range-convention", "--prompt-text", "--plot-x"},
    "watch": {"--restart"},
}


def _options(cmd, path=()):
    for p in getattr(cmd, "params", []):
        if getattr(p, "param_type_name", "") == "option":
            yield " ".join(path), p
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _options(sub, (*path, name))


#: Options whose values change at run time: none in a fresh HOME (the deployments of the state dir).
DYNAMIC = {"--deployment"}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_whose_parser_knows_its_values_completes(command):
    """The one derivation point: an option whose parser carries its values completes them, in every command."""
    completing = set()
    for sub, p in _options(load_command(command)):
        info = getattr(getattr(p, "type_descriptor", None), "parameter_info", None)
        if completion_of(getattr(info, "parser", None)) is not None:
            assert p._custom_shell_complete is not None, (command, sub, p.opts)
            got = p.shell_complete(None, "")
            assert all(v.value for v in got), (command, p.opts)
            assert got or set(p.opts) & DYNAMIC, (command, p.opts)
            if not sub:
                completing.update(o for o in p.opts if o.startswith("--"))
    assert EXPECTED.get(command, set()) <= completing


def _modules_loaded_completing(line: str) -> list[str]:
    words = line.split()
    code = (
        "import json, sys, contextlib, io\n"
        "from m3ctl.cli.app import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main([])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "sys.stderr.write(json.dumps(sorted(sys.modules)))\n"
    )
    env = _env(_M3CTL_COMPLETE="complete_bash", COMP_WORDS=line, COMP_CWORD=str(len(words) - 1))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    return json.loads(p.stderr.strip().splitlines()[-1])


def test_completing_loads_no_engine_and_plan_nothing_beyond_the_planner():
    loaded = _modules_loaded_completing("m3ctl plan --system h2")
    assert [m for m in loaded if any(m == p or m.startswith(p + ".") for p in (*HEAVY, *NOT_ON_PLAN))] == []


def test_options_the_settings_check_themselves_complete_their_values_too(tmp_path):
    """``--endpoint``, ``--http-client`` and the dev models' ``--arch``/``--quant`` keep their settings' own check
    and message, and complete the values it accepts; ``--deployment`` completes the deployments of the state dir."""
    assert bash("m3ctl bench --endpoint ") == ["completions", "chat"]
    assert bash("m3ctl bench --http-client a") == ["aiohttp"]
    assert bash("m3ctl dev scale-model out --arch ") == ["minimax-m2", "minimax-m3"]
    assert bash("m3ctl dev scale-model out --quant n") == ["nvfp4"]
    assert "minimax-m3-release" in bash("m3ctl dev tiny-model out --arch minimax-m3")
    state = tmp_path / "state"
    Registry(state).save(Deployment(name="qwen-a", runtime="process", port=8000, served_model_name="m", model="m"))
    p = subprocess.run(
        M3CTL,
        env=_env(
            _M3CTL_COMPLETE="complete_bash",
            COMP_WORDS="m3ctl bench --deployment q",
            COMP_CWORD="3",
            M3CTL_STATE_DIR=str(state),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.stdout.split() == ["qwen-a"], p.stderr
