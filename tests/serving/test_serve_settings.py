"""``m3ctl serve``'s own settings are declared once (m3ctl.serving.settings.ServeSettings): the CLI options and the
keywords of m3ctl.api.serve are derived from its fields, so a new serve setting is one field. Each test here fails
on the main before ServeSettings (the module did not exist; serve's options were written in m3ctl/cli/serve.py and
again in api.serve's signature)."""

from __future__ import annotations

import inspect
import json

import pytest
import typer
from pydantic import Field

from m3ctl import api
from m3ctl.cli import options as o
from m3ctl.cli.serve import serve as serve_command
from m3ctl.errors import BadInput
from m3ctl.serving.settings import API_SETTINGS, ServeSettings, serve_settings
from tests.conftest import run_cli


@pytest.fixture
def model(tiny_models):
    return tiny_models["m2"]


def _cli_options() -> dict[str, typer.models.OptionInfo]:
    """The options of ``m3ctl serve``, by parameter name, as typer reads them."""
    return {
        n: p.annotation.__metadata__[0]
        for n, p in inspect.signature(serve_command).parameters.items()
        if hasattr(p.annotation, "__metadata__")
    }


def test_every_serve_setting_is_an_option_with_the_fields_help():
    opts = _cli_options()
    for field, info in ServeSettings.model_fields.items():
        assert isinstance(info.json_schema_extra, dict), field
        cli = info.json_schema_extra["cli"]
        assert isinstance(cli, dict), field
        name = cli.get("name", field)
        assert name in opts, f"ServeSettings.{field} is no m3ctl serve option"
        assert opts[name].help.startswith(info.description), field


def test_the_api_settings_are_the_fields_not_marked_cli_only():
    assert set(API_SETTINGS) == {"dry_run", "mounts", "api_key_env", "smoke", "fallback"}
    s, rest = serve_settings(None, {"dry_run": True, "fallback": "auto", "tp": 2})
    assert (s.dry_run, s.fallback, rest) == (True, "auto", {"tp": 2})


def test_a_new_field_is_a_new_option_with_nothing_else_written():
    """What adding a knob takes: one field. The options builder derives the option (flag, type, bound, help)."""

    class WithKnob(ServeSettings):
        drain_s: float = Field(5.0, ge=0, description="Seconds to drain.", json_schema_extra={"cli": {}, "api": True})

    group, names = o.declared_options(WithKnob, {"smoke_choice": o.choice("quick", "full", "off")})
    ann, default = group["drain_s"]
    assert default == 5.0 and names["drain_s"] == "drain_s"
    assert ann.__metadata__[0].help == "Seconds to drain." and ann.__metadata__[0].min == 0


def test_settings_object_and_keywords_plan_the_same(model):
    by_kw = api.serve(
        model=str(model), name="s1", dry_run=True, mounts=["/a:/b"], runtime="docker", image="m3ctl/test:1"
    )
    by_obj = api.serve(
        model=str(model),
        name="s1",
        runtime="docker",
        image="m3ctl/test:1",
        settings=ServeSettings(dry_run=True, mounts=["/a:/b"]),
    )
    assert by_kw.model_dump() == by_obj.model_dump()


def test_a_bad_setting_is_one_line_naming_it_in_the_api_and_the_cli(model):
    with pytest.raises(BadInput, match=r"^m3ctl\.serve\(api_key_env=True\): a switch where a value is expected"):
        api.serve(model=str(model), api_key_env=True)
    with pytest.raises(BadInput, match=r"^m3ctl\.serve\(fallback='x'\): Input should be 'off' or 'auto'"):
        api.serve(model=str(model), settings={"fallback": "x"})
    p = run_cli("serve", "--model", str(model), "--dry-run", "--restart", "always")
    assert p.returncode == 2 and "--restart" in p.stderr and "Traceback" not in p.stderr


def test_cli_dry_run_json_is_the_api_plan(model):
    """Each setting the CLI takes reaches the API under its field's name (``--mount`` is ``mounts``)."""
    argv = ["--name", "s2", "--runtime", "docker", "--image", "m3ctl/test:1", "--mount", "/a:/b"]
    p = run_cli("serve", "--model", str(model), *argv, "--dry-run", "--json", "--no-smoke")
    assert p.returncode == 0, p.stderr
    want = api.serve(
        model=str(model), name="s2", runtime="docker", image="m3ctl/test:1", mounts=["/a:/b"], dry_run=True
    )
    assert json.loads(p.stdout) == want.model_dump(mode="json")
