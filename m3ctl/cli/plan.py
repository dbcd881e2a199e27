"""``m3ctl plan``: plan a launch (image, argv, env, every choice explained) or size catalog systems; start nothing."""

from typing import Annotated, Any

import typer

from m3ctl import api
from m3ctl.cli import options as o
from m3ctl.cli.estimate import number, show_estimate
from m3ctl.cli.inputs import given_request
from m3ctl.cli.output import Output, escape
from m3ctl.cli.render import print_plan
from m3ctl.errors import EXIT_CONFIG_REJECTED, BadInput
from m3ctl.planning.emit import FORMATS, render

#: ``--list``: every variant x image x layout of the host with the planner's verdict (m3ctl.api.plan_list).
ListAll = Annotated[
    bool,
    typer.Option(
        "--list",
        help="List every variant x image x layout for this host (or --system/--inventory), each runnable, runnable "
        "with a named fallback, or refused with its rule; the one plan picks is marked. --json: every entry.",
    ),
]


#: ``--estimate``: how fast the planned launch serves a workload (m3ctl.api.estimate), options from its settings.
Estimate = Annotated[
    bool,
    typer.Option(
        "--estimate",
        help="Estimate decode tok/s per user, total tok/s per GPU, TPOT, prefill time and tokens per USD of the "
        "planned launch for --concurrency users of --input-len/--output-len tokens: ranges, with the assumption "
        "that dominates each named. Offline, before anything runs.",
    ),
]
ESTIMATE_OPTIONS, _ = o.declared_options(api.EstimateRequest)
#: ``--systems``: the sizing view over catalog systems (m3ctl.api.size_systems).
Systems = Annotated[
    list[str] | None,
    typer.Option(
        "--systems",
        parser=o.system_list,
        metavar="NAMES",
        help="Sizing view: plan on these catalog systems (comma list or repeated; 'all' = every one) and print which serve the model at --max-model-len, how, with how much KV cache.",
    ),
]


@o.options(ESTIMATE_OPTIONS, into="workload")
@o.options(o.PLAN_KNOBS, into="knobs")
def plan(
    ctx: typer.Context,
    model: o.Model = None,
    name: o.Name = "m3ctl",
    port: o.Port = None,
    host: o.Host = "127.0.0.1",
    served_model_name: o.ServedName = None,
    runtime: o.Runtime = None,
    inventory: o.Inventory = None,
    profile: o.Profile = None,
    arg: o.Arg = None,
    skip_checks: o.SkipChecks = False,
    config: o.Config = None,
    system: o.System = None,
    knobs: dict | None = None,
    image: Annotated[
        str | None,
        typer.Option(
            parser=o.image_ref,
            help="Container image (catalog name, reference or a local image); implies --runtime docker.",
        ),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print {image, argv, env, explain, rejected} as JSON.")
    ] = False,
    emit: Annotated[
        str | None,
        typer.Option(
            parser=o.choice(*FORMATS),
            help="Render as docker, compose, k8s, lws (multi-node DP), script, ray (multi-node TP x PP), vllm-config "
            "(vLLM's own --config YAML) or vllm-env (its environment file).",
        ),
    ] = None,
    nodes: Annotated[
        int,
        typer.Option(
            min=1,
            max=5000,
            help="(at most 5,000: the largest Kubernetes cluster, https://kubernetes.io/docs/setup/best-practices/cluster-large/) "
            "With --emit lws/ray: nodes (pods/hosts).",
        ),
    ] = 2,
    hf_cache_hostpath: Annotated[
        str | None,
        typer.Option(
            parser=o.absolute_path,
            help="With --emit k8s/lws: mount this node path as the HF cache instead of a PersistentVolumeClaim.",
        ),
    ] = None,
    api_key_env: o.ApiKeyEnv = None,
    list_all: ListAll = False,
    estimate: Estimate = False,
    workload: dict | None = None,
    systems: Systems = None,
) -> None:
    """Plan a launch for this host (or --inventory FILE, --system NAME): image, argv, env, every choice explained; start nothing.

    Raw vLLM flags go after `--`. A rule violation exits 3 naming the rule, the values and the fix.
    """

    out = Output(json_out)
    _check_combination(
        ctx,
        emit=emit,
        json_out=json_out,
        systems=systems,
        host=bool(inventory or system),
        list_all=list_all,
        hf_cache_hostpath=hf_cache_hostpath,
        estimate=estimate,
    )
    req = given_request(ctx)  # the options given; the API layers them over --config, M3CTL_* and the config file
    wl = {k: v for k, v in (workload or {}).items() if v is not None} if estimate else None
    if list_all:
        return listing(out, api.plan_list(req, inventory=inventory, system=system, config=config))
    if systems:
        rows = api.size_systems(  # --api-key-env as one plan's
            systems, req, config=config, workload=wl, api_key_env=api_key_env
        )
        return sizing(out, api.plan_request(req, config=config), rows)
    if wl is not None:
        return show_estimate(out, api.estimate(req, workload=wl, inventory=inventory, system=system, config=config))
    # a container form plans for the docker runtime unless a layer names one (as `serve`: auto otherwise)
    p = api.plan(
        req,
        inventory=inventory,
        system=system,
        config=config,
        offline=(knobs or {}).get("offline"),
        default_runtime="docker" if emit in ("docker", "compose", "k8s", "lws") else "auto",
        api_key_env=api_key_env,
    )
    if emit:
        typer.echo(render(p, emit, nodes=nodes, hf_host_path=hf_cache_hostpath), nl=False)
    elif json_out:
        out.result(p.summary())
    else:
        print_plan(out.con, p)


def _check_combination(
    ctx: typer.Context, *, emit, json_out, systems, host, list_all, hf_cache_hostpath, estimate
) -> None:
    """Options that do not go together (``host``: --inventory or --system given), refused before any planning.

    Raises:
        BadInput: naming both options.
    """
    if emit and emit not in FORMATS:
        raise BadInput(f"unknown --emit format {emit!r}", f"use one of: {', '.join(FORMATS)}")
    if emit and json_out:
        raise BadInput("--emit prints a file in its own format, not JSON", "drop --json or --emit")
    if systems and (host or emit):  # --emit was dropped without a word
        raise BadInput(
            "--systems sizes catalog systems; it takes no --inventory, --system or --emit",
            "drop one of them (--system NAME --emit FORMAT renders one system's launch)",
        )
    if list_all and (emit or systems):
        raise BadInput(
            "--list lists the launch choices of one host; it takes no --emit or --systems",
            "drop --emit/--systems (--list --system NAME lists a catalog system's)",
        )
    if estimate and (emit or list_all):
        raise BadInput(
            "--estimate estimates the launch plan picks (or each of --systems); it takes no --emit or --list",
            "drop them (--estimate --system NAME estimates a catalog system's launch)",
        )
    given = [n for n in ESTIMATE_OPTIONS if _given(ctx, n)]
    if given and not estimate:
        raise BadInput(f"--{given[0].replace('_', '-')} applies to --estimate", "add --estimate")
    src = ctx.get_parameter_source("nodes")
    given_nodes = getattr(src, "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")  # typer may bundle its own click
    if given_nodes and emit not in ("lws", "ray"):  # it used to be ignored without a word
        raise BadInput("--nodes applies to --emit lws or --emit ray", "add --emit lws (multi-node DP) or ray (TP x PP)")
    if hf_cache_hostpath and emit not in ("k8s", "lws"):
        raise BadInput("--hf-cache-hostpath applies to --emit k8s or --emit lws", "add --emit k8s or lws")


def _given(ctx: typer.Context, name: str) -> bool:
    """True when option ``name`` was given on the command line (not its default)."""
    src = ctx.get_parameter_source(name)
    return getattr(src, "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")  # typer may bundle its own click


def _span(e, key: str) -> str:
    """``low-high`` of one figure of a row's estimate ('' without one)."""
    if e is None:
        return ""
    f = getattr(e, key)
    return "n/a" if f is None else f"{number(f.low)}-{number(f.high)}"


def sizing(out: Output, request, rows: list) -> None:
    """``plan --systems``: the sizing table of :func:`m3ctl.api.size_systems`' rows (exit 3 when no system serves
    the model); ``--json``: {model, systems: [row...]}."""

    out.result({"model": request.model, "systems": [r.model_dump() for r in rows]})
    if not out.json:
        from rich.table import Table  # noqa: PLC0415

        mml = request.max_model_len
        t = Table(
            title=f"m3ctl plan --systems: {escape(request.model)} at "
            + (f"{mml} tokens" if mml else "its maximum length")
            + " (KV tokens per replica; seqs = sequences of that length at once)"
        )
        est = any(r.estimate is not None for r in rows)
        cols = ("system", "MiB/GPU", "variant", "layout", "profile", "image", "KV tokens", "seqs")
        for col in cols + (("tok/s/user", "tok/s/GPU") if est else ()):
            t.add_column(col, no_wrap=True)
        t.add_column("verdict", overflow="fold")
        for r in rows:
            layout = (
                f"TP{r.tp}"
                + (f" PP{r.pp}" if r.pp and r.pp > 1 else "")
                + f" DP{r.dp}"
                + (" EP" if r.ep else "")
                + (f" DCP{r.dcp}" if r.dcp and r.dcp > 1 else "")
                if r.serves
                else ""
            )
            verdict = (
                (f"[yellow]serves, {r.attention} attention[/]" if r.attention else "[green]serves[/]")
                if r.serves
                else f"[red]{escape(r.rule or 'no plan')}[/]"
            )
            t.add_row(
                r.system,
                str(r.gpu_mib or "?"),
                r.variant or "",
                layout,
                escape(r.profile or ""),
                escape(r.image.split("/")[-1] if r.image else (r.runtime or "")),
                f"{r.kv_tokens:,}" if r.kv_tokens is not None else "",
                f"{r.concurrent_sequences:,}" if r.concurrent_sequences is not None else "",
                *((_span(r.estimate, "tok_s_user"), _span(r.estimate, "tok_s_gpu")) if est else ()),
                verdict,
            )
        out.con.print(t)
        if est:
            e = next(r.estimate for r in rows if r.estimate is not None)
            out.con.print(
                f"  estimates (low-high) for {e.concurrency:,} users over each row's DP replicas, {e.input_len:,} in / "
                f"{e.output_len:,} out, before anything runs; each row's dominant assumption:",
                soft_wrap=True,
            )
            for r in rows:
                if r.estimate is not None:
                    out.con.print(f"    {r.system}: {escape(r.estimate.dominant)}", soft_wrap=True)
                    for f in r.estimate.findings:  # what the server would not run as posed, as plan --estimate warns
                        out.con.print(f"      [yellow]warning:[/] {escape(f)}", soft_wrap=True)
        for r in rows:
            if r.no_estimate:  # asked for, but the cost model has no data for this row
                out.con.print(f"  {r.system}: {escape(r.no_estimate)}", soft_wrap=True)
        for r in rows:
            if not r.serves:
                out.con.print(f"  {r.system}: {escape(r.rule + ': ' if r.rule else '')}{escape(r.reason or '')}")
            elif r.attention:  # a known fatal issue's fallback, planned by default: its cost and the way back
                fb = next((f for f in r.fallbacks if f.startswith("attention: ")), "")
                out.con.print(f"  {r.system}: {escape(fb or r.attention + ' attention')}")
    if not any(r.serves for r in rows):
        raise typer.Exit(EXIT_CONFIG_REJECTED)


#: How ``plan --list`` shows an entry's status.
_STATUS = {"runnable": "[green]runnable[/]", "fallback": "[yellow]fallback[/]", "refused": "[red]refused[/]"}


def _groups(entries: list) -> list[tuple[Any, list[str]]]:
    """The entries folded for the table: consecutive entries of one runtime, image and variant with the same
    verdict (status, rule, fallbacks, opt-in) in one row listing their layouts; the chosen entry alone."""
    rows: list[tuple[Any, list[str]]] = []
    last = None
    for e in entries:
        key = (e.runtime, e.image, e.variant, e.status, e.rule, tuple(e.fallbacks), e.opt_in, e.chosen)
        lay = e.layout.label if e.layout is not None else "every layout"
        if key == last and not e.chosen:
            rows[-1][1].append(lay)
        else:
            rows.append((e, [lay]))
        last = key
    return rows


def _short(fallback: str) -> str:
    """A fallback path's name (``nvfp4_gemm``, ``known-bad``): the whole line is printed once under the table."""
    return fallback.split(":")[0]


def listing(out: Output, pl) -> None:
    """``plan --list``: :func:`m3ctl.api.plan_list`'s entries as a table (consecutive entries with one verdict
    folded into one row), what plan picks, and each fallback and rule once; ``--json``: every entry (exit 3 when
    none runs)."""

    out.result(pl.model_dump())
    if not out.json:
        from rich.table import Table  # noqa: PLC0415

        where = f"catalog system {pl.system}" if pl.system else "this host"
        t = Table(
            title=f"m3ctl plan --list: {escape(pl.model)} on {where} ({pl.gpus} x {pl.arch or 'no GPU'}, "
            f"profile {pl.profile or 'none planned'})"
        )
        t.add_column("runtime / image", overflow="fold", ratio=3)
        t.add_column("variant", no_wrap=True)
        t.add_column("layouts", overflow="fold", ratio=4)
        t.add_column("status", no_wrap=True)
        t.add_column("fallback / rule", overflow="fold", ratio=4)
        for e, lays in _groups(pl.entries):
            if e.status == "refused":
                reason = e.reason or ""
                why = f"{e.rule}: " + (reason if len(reason) <= 70 else reason[:69] + "…")
            else:
                why = ", ".join(_short(f) for f in e.fallbacks) + (f" (needs {e.opt_in})" if e.opt_in else "")
            t.add_row(
                escape(e.runtime if e.image is None else e.image),
                escape(e.variant or "(checkpoint)"),
                escape(", ".join(lays)),
                _STATUS[e.status]
                + ((" [bold]<- plan[/]" if pl.plan.plans else " [bold]<- doctor[/]") if e.chosen else ""),
                escape(why),
            )
        out.con.print(t)
        for f in dict.fromkeys(f for e in pl.entries for f in e.fallbacks):
            out.con.print(f"  fallback {escape(f)}")
        p = pl.plan
        if p.plans:
            img = f" {p.image_ref}" if p.image_ref else ""
            lay = p.layout.label if p.layout else ""
            out.con.print(f"plan picks: {escape(p.variant or 'the checkpoint as is')} {lay}, {p.runtime}{escape(img)}")
        else:
            fix = f"; with {p.opt_in} it plans the entry marked (doctor's verdict)" if p.opt_in else ""
            out.con.print(f"plan refuses the request: rule {escape(p.rule or '')}: {escape(p.reason or '')}{fix}")
    if not pl.runnable():
        raise typer.Exit(EXIT_CONFIG_REJECTED)
