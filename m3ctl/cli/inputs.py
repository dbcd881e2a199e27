"""From parsed options to the API's inputs: the plan request of the options given (the API layers it over
``--config``, ``M3CTL_*`` and the config file), ``--arg`` pairs, raw args, output paths checked up front."""

import json
from pathlib import Path

import typer
from pydantic import ValidationError

from m3ctl.assess.request import PlanRequest
from m3ctl.core import state
from m3ctl.errors import BadInput


def parse_args(pairs: list[str]) -> dict:
    """``--arg flag=value`` pairs as ``{flag: value}`` (values JSON-parsed when they can be; a bare flag: True)."""
    out: dict = {}
    given: dict[str, tuple[str, str]] = {}  # flag (dashes) -> (as given, its value)
    for p in pairs:
        key, sep, val = p.partition("=")
        if not key.strip("-"):
            raise BadInput(f"bad --arg {p!r}", "use --arg flag=value or --arg flag (e.g. --arg max-num-seqs=64)")
        flag = key.strip("-")
        same = flag.replace("_", "-")  # max_num_seqs and max-num-seqs are one flag (vLLM reads both)
        if same in given and given[same][1] != sep + val:
            raise BadInput(
                f"--arg {given[same][0]} and --arg {p.lstrip('-')}: one vLLM flag given twice with different values",
                "give it once",
            )
        given.setdefault(same, (p.lstrip("-"), sep + val))
        if not sep:
            out[flag] = True
            continue
        try:
            out[flag] = json.loads(val)
        except ValueError:
            out[flag] = val
    return out


def raw_args_without_key(ctx: typer.Context) -> list[str]:
    """What follows `--` (click consumes the `--` itself). A secret flag among them (``--api-key K``) is taken
    out by the planner (m3ctl.core.secrets.separate): the server gets it in its environment, never in argv."""
    return list(ctx.args)


def given_request(ctx: typer.Context, **extra):
    """The PlanRequest of the options given on this `plan`/`serve` command line: one layer, the highest; the API
    merges it over ``--config``, ``M3CTL_*`` and the XDG config file (:func:`m3ctl.api.plan_request`). Options left
    at their default are not "given" (the lower layers decide); click's ``--`` remainder is the raw vLLM args;
    ``extra`` adds values that are not options.

    Raises:
        BadInput: a value the request rejects, naming the option.
    """
    opts = dict(ctx.params)
    given = {k: v for k, v in opts.items() if k in PlanRequest.model_fields and k != "profile"}
    given.update(
        profile_file=str(opts["profile"]) if opts.get("profile") else None,
        args=parse_args(opts.get("arg") or []),
        startup_budget_s=opts.get("startup_timeout"),
        extra_args=raw_args_without_key(ctx),
    )
    for k in list(given):  # an option left at its default is not "given": the lower layers decide
        src = ctx.get_parameter_source(k) if k in opts else None
        if src is not None and src.name == "DEFAULT":
            given.pop(k)
    switches = ("allow_emulated", "no_multicast", "skip_checks")  # flags without a --no- form: False = not given
    cli = {
        k: v
        for k, v in {**given, **extra}.items()
        if v is not None and v != {} and v != [] and not (k in switches and v is False)
    }
    try:
        return PlanRequest(**cli)
    except ValidationError as e:
        err = e.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        if not err["loc"]:  # a check across options: its message names them
            raise BadInput(msg, f"see `m3ctl {ctx.info_name} --help`") from None
        opt = "--" + str(err["loc"][0]).replace("_", "-")
        raise BadInput(f"{opt}: {msg}", f"see `m3ctl {ctx.info_name} --help`") from None


def check_outputs(*, new_dirs: bool = True, **paths: Path | None) -> None:
    """Check every given output file writable before any work (m3ctl.core.state.check_output_path, ``new_dirs``
    False: its directory must exist); ``-`` is stdout. Keyword names are the options (``output_json`` ->
    ``--output-json``)."""
    for opt, path in paths.items():
        if path is not None and str(path) != "-":
            state.check_output_path(path, "--" + opt.replace("_", "-"), new_dirs=new_dirs)
