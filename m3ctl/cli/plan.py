"""``m3ctl plan``: plan a launch (image, argv, env, every choice explained) or size catalog systems; start nothing."""

from typing import Annotated

import typer

from m3ctl import api
from m3ctl.cli import options as o
from m3ctl.cli.inputs import given_request
from m3ctl.cli.output import Output, escape
from m3ctl.cli.render import print_plan
from m3ctl.errors import EXIT_CONFIG_REJECTED, BadInput
from m3ctl.planning.emit import FORMATS, render


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
            parser=o.text, help="Container image (catalog name, reference or a local image); implies --runtime docker."
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
    systems: Annotated[
        list[str] | None,
        typer.Option(
            "--systems",
            parser=o.text,
            metavar="NAMES",
            help="Sizing view: plan on these catalog systems (comma list or repeated; 'all' = every one) and print which serve the model at --max-model-len, how, with how much KV cache.",
        ),
    ] = None,
) -> None:
    """Plan a launch for this host (or --inventory FILE, --system NAME): image, argv, env, every choice explained; start nothing.

    Raw vLLM flags go after `--`. A rule violation exits 3 naming the rule, the values and the fix.
    """

    out = Output(json_out)
    if emit and emit not in FORMATS:
        raise BadInput(f"unknown --emit format {emit!r}", f"use one of: {', '.join(FORMATS)}")
    if emit and json_out:
        raise BadInput("--emit prints a file in its own format, not JSON", "drop --json or --emit")
    if systems and (inventory or system or emit):  # --emit was dropped without a word
        raise BadInput(
            "--systems sizes catalog systems; it takes no --inventory, --system or --emit",
            "drop one of them (--system NAME --emit FORMAT renders one system's launch)",
        )
    src = ctx.get_parameter_source("nodes")
    given_nodes = getattr(src, "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")  # typer may bundle its own click
    if given_nodes and emit not in ("lws", "ray"):  # it used to be ignored without a word
        raise BadInput("--nodes applies to --emit lws or --emit ray", "add --emit lws (multi-node DP) or ray (TP x PP)")
    if hf_cache_hostpath and emit not in ("k8s", "lws"):
        raise BadInput("--hf-cache-hostpath applies to --emit k8s or --emit lws", "add --emit k8s or lws")
    req = given_request(ctx)  # the options given; the API layers them over --config, M3CTL_* and the config file
    if systems:
        rows = api.size_systems(systems, req, config=config, api_key_env=api_key_env)  # --api-key-env as one plan's
        return sizing(out, api.plan_request(req, config=config), rows)
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
        for col in ("system", "MiB/GPU", "variant", "layout", "profile", "image", "KV tokens", "seqs"):
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
            verdict = "[green]serves[/]" if r.serves else f"[red]{escape(r.rule or 'no plan')}[/]"
            t.add_row(
                r.system,
                str(r.gpu_mib or "?"),
                r.variant or "",
                layout,
                escape(r.profile or ""),
                escape(r.image.split("/")[-1] if r.image else (r.runtime or "")),
                f"{r.kv_tokens:,}" if r.kv_tokens is not None else "",
                f"{r.concurrent_sequences:,}" if r.concurrent_sequences is not None else "",
                verdict,
            )
        out.con.print(t)
        for r in rows:
            if not r.serves:
                out.con.print(f"  {r.system}: {escape(r.rule + ': ' if r.rule else '')}{escape(r.reason or '')}")
    if not any(r.serves for r in rows):
        raise typer.Exit(EXIT_CONFIG_REJECTED)
