"""The plan knobs that ``plan`` and ``serve`` share are declared once, as PlanRequest fields
(m3ctl.assess.request.knob: type, default, bounds, help and flag together): ``m3ctl plan``'s and ``m3ctl serve``'s
options and the ``**knobs`` of m3ctl.api.plan/serve derive from them. On the main before this, the options were
written again in m3ctl/cli/options.py (PLAN_KNOBS) with their own help, so a field added to PlanRequest was no option."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import typer

from m3ctl.assess.request import PlanRequest
from m3ctl.cli import options as o
from m3ctl.cli.plan import plan as plan_command
from m3ctl.cli.serve import serve as serve_command

REPO = Path(__file__).resolve().parents[2]


def _options(command) -> dict[str, typer.models.OptionInfo]:
    """A command's options by parameter name, as typer reads them."""
    return {
        n: p.annotation.__metadata__[0]
        for n, p in inspect.signature(command).parameters.items()
        if hasattr(p.annotation, "__metadata__")
    }


def _knobs() -> dict[str, str]:
    """{field: help} of the PlanRequest fields declared as plan knobs."""
    return {
        f: info.description or ""
        for f, info in PlanRequest.model_fields.items()
        if isinstance(info.json_schema_extra, dict) and "cli" in info.json_schema_extra
    }


def test_every_plan_knob_is_a_plan_and_a_serve_option_with_its_fields_help():
    knobs = _knobs()
    assert {"variant", "tp", "ep", "spec_method", "kv_cache_dtype", "attention", "max_model_len"} <= set(knobs)
    for command in (plan_command, serve_command):
        opts = _options(command)
        for field, help_ in knobs.items():
            assert field in opts, f"PlanRequest.{field} is no option of {command.__name__}"
            assert opts[field].help == help_, field
    assert set(o.PLAN_KNOBS) == {*knobs, "offline"}


#: A program that adds one knob to PlanRequest (one field, nothing else) before the CLI and the API are imported,
#: then prints what the CLI and the API make of it.
PROGRAM = """
import contextlib, io, json
from pydantic import Field
import m3ctl.assess.request as r
from m3ctl.errors import BadInput

class PlanRequest(r.PlanRequest):
    warmup_rounds: int | None = Field(default=None, ge=1, **r.knob("Warm-up rounds before ready."))

r.PlanRequest = PlanRequest
from m3ctl import api
from m3ctl.cli.app import main

def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return [rc, out.getvalue(), err.getvalue()]

def refused(call):
    try:
        call()
    except BadInput as e:
        return e.message
    return None

inv = api.host_inventory(system="b200x8")
print(json.dumps({
    "plan_help": cli("plan", "--help")[1],
    "serve_help": cli("serve", "--help")[1],
    "plan_cli_ok": cli("plan", "--system", "b200x8", "--warmup-rounds", "3")[0],
    "plan_cli_bad": cli("plan", "--system", "b200x8", "--warmup-rounds", "0")[:3:2],
    "request": api.plan_request(warmup_rounds=3).warmup_rounds,
    "plan_api": api.plan(system="b200x8", warmup_rounds=3).name,
    "plan_api_bad": refused(lambda: api.plan(system="b200x8", warmup_rounds=0)),
    "serve_api": api.serve(inventory=inv, dry_run=True, warmup_rounds=3).name,
    "serve_api_bad": refused(lambda: api.serve(inventory=inv, dry_run=True, warmup_rounds=0)),
}))
"""


def test_a_new_knob_is_one_field_and_becomes_an_option_of_plan_and_serve_and_a_keyword_of_both_apis(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("M3CTL_")}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]), COLUMNS="200")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    p = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for command in ("plan", "serve"):
        assert "--warmup-rounds" in got[f"{command}_help"], command
        assert "Warm-up rounds before ready." in got[f"{command}_help"], command
    assert got["plan_cli_ok"] == 0
    rc, err = got["plan_cli_bad"]
    assert rc == 2 and "--warmup-rounds" in err and "Traceback" not in err
    assert got["request"] == 3
    assert got["plan_api"] == got["serve_api"] == "m3ctl"
    assert "warmup_rounds" in got["plan_api_bad"]
    assert "warmup_rounds" in got["serve_api_bad"]
