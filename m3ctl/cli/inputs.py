"""From parsed options to the library's inputs: the host to plan for, the plan request (its layers), raw args."""

import json
from pathlib import Path
from typing import Optional

import typer

from m3ctl.errors import BadInput


def host_inventory(inventory: Optional[Path], system: Optional[str]):
    """The inventory to evaluate: ``--inventory FILE``, ``--system NAME``, else this host
    (:func:`m3ctl.api.host_inventory`).

    Raises:
        BadInput: both given, an unreadable or invalid inventory file, an unknown system.
    """
    from m3ctl.api import host_inventory as inventory_of  # noqa: PLC0415

    return inventory_of(inventory, system)


def user_defaults():
    """The per-machine layers (``M3CTL_*`` over the XDG config file) as a PlanRequest (m3ctl.assess.request)."""
    from m3ctl.assess.request import user_request  # noqa: PLC0415

    return user_request()


def parse_args(pairs: list[str]) -> dict:
    """``--arg flag=value`` pairs as ``{flag: value}`` (values JSON-parsed when they can be; a bare flag: True)."""
    out: dict = {}
    for p in pairs:
        key, sep, val = p.partition("=")
        if not key.strip("-"):
            raise BadInput(f"bad --arg {p!r}", "use --arg flag=value or --arg flag (e.g. --arg max-num-seqs=64)")
        if not sep:
            out[key.strip("-")] = True
            continue
        try:
            out[key.strip("-")] = json.loads(val)
        except ValueError:
            out[key.strip("-")] = val
    return out


def raw_args_without_key(ctx: typer.Context) -> list[str]:
    """What follows `--` (click consumes the `--` itself). A secret flag among them (``--api-key K``) is taken
    out by the planner (m3ctl.secrets.separate): the server gets it in its environment, never in argv."""
    return list(ctx.args)


def no_api_key(args: list[str]) -> list[str]:
    """Raw args for tune, which starts private trial servers: an API key is refused (it would be stored)."""
    from m3ctl.secrets import split_api_key  # noqa: PLC0415

    rest, key = split_api_key(list(args))
    if key:
        raise BadInput("tune starts its own private trial servers: a raw --api-key is not used (nor stored)",
                       "drop --api-key from the raw arguments")
    return rest


def plan_request(ctx: typer.Context, **extra):
    """The plan request of a `plan`/`serve` command, its layers merged (m3ctl.assess.request: command line >
    ``--config`` > ``M3CTL_*`` > the XDG config file). Only options given on the command line count as given;
    click's ``--`` remainder is the raw vLLM args; ``extra`` adds values that are not options (``pass_env``).

    Raises:
        BadInput: a value the request rejects, naming the option.
    """
    from pydantic import ValidationError  # noqa: PLC0415

    from m3ctl.assess.request import PlanRequest, load_request, merge  # noqa: PLC0415

    opts = dict(ctx.params)
    given = {k: v for k, v in opts.items() if k in PlanRequest.model_fields and k != "profile"}
    given.update(profile_file=str(opts["profile"]) if opts.get("profile") else None,
                 args=parse_args(opts.get("arg") or []), startup_budget_s=opts.get("startup_timeout"),
                 extra_args=raw_args_without_key(ctx))
    for k in list(given):  # an option left at its default is not "given": the lower layers decide
        src = ctx.get_parameter_source(k) if k in opts else None
        if src is not None and src.name == "DEFAULT":
            given.pop(k)
    switches = ("allow_emulated", "no_multicast", "skip_checks")  # flags without a --no- form: False = not given
    cli = {k: v for k, v in {**given, **extra}.items()
           if v is not None and v != {} and v != [] and not (k in switches and v is False)}
    file_req = load_request(opts["config"]) if opts.get("config") else None
    try:
        return merge(user_defaults(), file_req, PlanRequest(**cli))
    except ValidationError as e:
        err = e.errors()[0]
        opt = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "an option"
        raise BadInput(f"{opt}: {err['msg']}", f"see `m3ctl {ctx.info_name} --help`") from None


def secrets_present() -> dict[str, str]:
    """The pass-through secrets set in this environment (:func:`m3ctl.secrets.passthrough_env`; never shown)."""
    from m3ctl.secrets import passthrough_env  # noqa: PLC0415

    return passthrough_env()


def maybe_offline(p, offline: Optional[bool]):
    """The plan resolved to checked local snapshots when offline (:func:`m3ctl.api.resolve_if_offline`)."""
    from m3ctl.api import resolve_if_offline  # noqa: PLC0415

    return resolve_if_offline(p, offline)


def check_outputs(**paths: Optional[Path]) -> None:
    """Check every given output file writable before any work (m3ctl.state.check_output_path); ``-`` is stdout.
    Keyword names are the options (``output_json`` -> ``--output-json``)."""
    from m3ctl.state import check_output_path  # noqa: PLC0415

    for opt, path in paths.items():
        if path is not None and str(path) != "-":
            check_output_path(path, "--" + opt.replace("_", "-"))
