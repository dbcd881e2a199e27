"""The settings of one ``m3ctl serve`` beyond its plan request, declared once: :class:`ServeSettings`.

Each field holds its type, default, help (``description``) and, in ``json_schema_extra``, its ``cli`` spelling
(as m3ctl.cli.options.declared_options reads it: ``name``, ``decls``, ``parser`` by name, ``metavar``,
``cli_default``) and ``api`` (False: a ``m3ctl serve`` option only, which the API takes in another form: the
foreground watch is :class:`m3ctl.serving.workflow.ServeWatch`, ``--no-smoke`` is ``smoke="off"``).

Derived from it: ``m3ctl serve``'s options (m3ctl.cli.serve) and the keywords :func:`m3ctl.api.serve` takes
beside the plan request's (:func:`serve_settings`: each checked against its field, one BadInput line). What the
server is (model, name, port, runtime, image, knobs...) is the plan request's (m3ctl.assess.request.PlanRequest).
A new serve setting is one field here (plus its use where it acts). This module imports nothing but pydantic and
m3ctl.errors, so the CLI reads it for ``--help``.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from m3ctl.errors import BadInput, argument_error, first_error

_SMOKE_HELP = (
    "Smoke test before 'ready': quick (a long prompt + a mixed concurrent batch), full (also chat, parsers, a known "
    "answer, output checks; default) or off."
)
_FALLBACK_HELP = (
    "auto: a launch that dies before ready is relaunched with its failing component's safe remedy (without "
    "speculation, eager mode, another MoE/attention backend...), re-planned and printed; each attempt is reported. "
    "A kill, a bad flag, a missing weight file is not relaunched. Default off."
)
_API_KEY_ENV_HELP = (
    "Require this API key: the name of the environment variable holding it (handed to vLLM as VLLM_API_KEY, never "
    "on its command line)."
)


def _field(default: Any, help: str, *, cli: dict[str, Any] | None = None, api: bool = True, **more: Any) -> Any:
    """A ServeSettings field: ``default`` (a list: a fresh copy each time), ``help``, its ``m3ctl serve`` spelling
    (``cli``; ``{}``: named as the field) and whether :func:`m3ctl.api.serve` takes it (``api``)."""
    extra: dict[str, Any] = {"cli": cli if cli is not None else {}, "api": api}
    if isinstance(default, list):
        return Field(default_factory=list, description=help, json_schema_extra=extra, **more)
    return Field(default, description=help, json_schema_extra=extra, **more)


class ServeSettings(BaseModel):
    """How one plan is launched, checked and kept (the ``m3ctl serve`` options that are not the plan request's)."""

    model_config = ConfigDict(extra="forbid")
    dry_run: bool = _field(False, "Print the plan and exit; start nothing.", cli={"decls": "--dry-run"})
    detach: bool = _field(
        False, "Return once the server is ready; leave it running.", cli={"decls": ("--detach", "-d")}, api=False
    )
    mounts: list[str] = _field(
        [],
        "Extra docker bind mount HOST:CONTAINER[:ro|rw] (repeatable; read-only by default).",
        cli={"name": "mount", "decls": "--mount", "parser": "mount_spec"},
    )
    restart: Literal["no", "on-failure"] = _field(
        "no", "Foreground watchdog: no or on-failure (restart a dead/stalled server).", api=False
    )
    watch_interval: float = _field(10.0, "Foreground watchdog: seconds between liveness probes.", api=False, ge=0)
    api_key_env: str | None = _field(None, _API_KEY_ENV_HELP)
    smoke: str | bool = _field(
        "full",
        _SMOKE_HELP,
        cli={
            "decls": "--smoke",
            "type": "str",
            "parser": "smoke_choice",
            "metavar": "quick|full|off",
            "cli_default": None,
        },
    )
    no_smoke: bool = _field(False, "Same as --smoke off.", cli={"decls": "--no-smoke"}, api=False)
    fallback: Literal["off", "auto"] = _field("off", _FALLBACK_HELP, cli={"decls": "--fallback", "metavar": "off|auto"})


#: The settings :func:`m3ctl.api.serve` takes as keywords (the others are ``m3ctl serve`` options only).
API_SETTINGS = tuple(
    n
    for n, f in ServeSettings.model_fields.items()
    if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("api")
)


def serve_settings(
    settings: ServeSettings | dict[str, Any] | None, keywords: dict[str, Any], who: str = "m3ctl.serve"
) -> tuple[ServeSettings, dict[str, Any]]:
    """``settings`` (a :class:`ServeSettings`, a dict of its fields, None: the defaults) with the keywords among
    ``keywords`` that are API settings (:data:`API_SETTINGS`) laid over it, and the other keywords (the plan
    request's knobs).

    Raises:
        BadInput: one line naming the first bad value (``who(name=value): why``).
    """
    base = settings.model_dump(exclude_unset=True) if isinstance(settings, ServeSettings) else dict(settings or {})
    given = {k: keywords[k] for k in API_SETTINGS if k in keywords}
    rest = {k: v for k, v in keywords.items() if k not in given}
    values = {**base, **given}
    for name, value in given.items():  # lax pydantic reads True as 1 or "True"; a switch is no value here
        ann = ServeSettings.model_fields[name].annotation
        if isinstance(value, bool) and ann is not bool and bool not in get_args(ann):
            raise BadInput(
                f"{who}({name}={value}): a switch where a value is expected",
                f"see help(m3ctl.api.serve) for the type and unit of {name}",
            )
    try:
        return ServeSettings.model_validate(values), rest
    except ValidationError as e:
        err = first_error(e)
        name = str(err.loc[0]) if err.loc else ""
        value = values.get(name)
        raise argument_error(
            who, name, value, err.msg, f"see help(m3ctl.api.serve) for the type and unit of {name}"
        ) from None
