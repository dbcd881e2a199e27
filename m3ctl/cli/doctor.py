"""``m3ctl doctor``: probe this host (or an inventory/system) and say, check by check, whether it can serve."""

from pathlib import Path
from typing import Annotated

import typer

from m3ctl import api
from m3ctl.checks.doctor import report_json
from m3ctl.cli import options as o
from m3ctl.cli.inputs import raw_args_without_key
from m3ctl.cli.output import Output, hang
from m3ctl.cli.render import COLOUR


def doctor(
    ctx: typer.Context,
    json_out: o.Json = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "-v",
            "--verbose",
            help="Show every detail and the skipped checks (without it: the first detail of a WARN or FAIL).",
        ),
    ] = False,
    model: o.Model = None,
    variant: o.Variant = None,
    context: Annotated[
        int | None,
        typer.Option(parser=o.token_count, metavar="N", help="Context tokens one sequence must fit (default 32768)."),
    ] = None,
    kv_cache_dtype: Annotated[
        str | None,
        typer.Option(
            parser=o.vllm_choice("kv-cache-dtype"),
            help="KV cache dtype to validate for this GPU (default: the user config's, else auto).",
        ),
    ] = None,
    runtime: Annotated[
        str | None,
        typer.Option(
            parser=o.choice("auto", "process", "docker"),
            help="auto, process or docker: what serve would use (default: the user config's, else auto).",
        ),
    ] = None,
    port: o.Port = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 on WARN too.")] = False,
    image: Annotated[
        str | None,
        typer.Option(
            parser=o.image_ref, help="Check this image (catalog name or a local image) instead of the recommended one."
        ),
    ] = None,
    inventory: o.Inventory = None,
    save_inventory: Annotated[Path | None, typer.Option(help="Write this host's inventory as JSON.")] = None,
    system: o.System = None,
    attention: o.Attention = None,
    stack: o.Stack = None,
) -> None:
    """Probe this host and say, check by check, whether and how it can serve (exit 1 on FAIL or not runnable).

    Raw vLLM flags go after `--`, as `m3ctl plan` and `serve` take them (the verdict is plan's outcome for them).
    """

    out = Output(json_out)
    rep = api.doctor(
        model=model,
        variant=variant,
        context=context,
        kv_cache_dtype=kv_cache_dtype,
        runtime=runtime,
        port=port,
        image=image,
        inventory=inventory,
        system=system,
        attention=attention,
        stack=stack,
        save_inventory=save_inventory,
        extra_args=raw_args_without_key(ctx),
    )
    out.result(report_json(rep, strict))
    if not out.json:
        render(out.con, rep, verbose)
    code = rep.exit_code(strict)
    if code and rep.ok and not out.json:  # exit 1 with no FAIL row: say which rule of the exit code it is
        from rich.text import Text  # noqa: PLC0415

        why = (
            "a WARN under --strict"
            if rep.verdict.status != "not_runnable"
            else "the verdict: the model is not runnable here (`m3ctl doctor --model DIR` checks a local model)"
        )
        out.con.print(Text(hang("exit 1: ", f"no check failed; {why}", out.con.width)), soft_wrap=True)
    if code:
        raise typer.Exit(code)


def render(con, rep, verbose: bool) -> None:
    """One entry per check (status, id, finding; under it why: the first detail of a WARN or FAIL, every detail
    with -v; then the fix), wrapped at the terminal width (80 columns in a log file), then the verdict."""
    from rich.text import Text  # noqa: PLC0415

    shown = [c for c in rep.checks if verbose or c.status != "SKIP" or c.id.startswith("day0.")]
    w = max((len(c.id) for c in shown), default=0)
    con.print("m3ctl doctor", style="bold")
    for c in shown:
        problem = c.status in ("WARN", "FAIL")
        lines = [c.message, *(c.details if verbose else c.details[:1] if problem else [])]
        if problem and c.fix:
            lines.append(f"fix: {c.fix}")
        body = hang(f"{c.status:<4} {c.id:<{w}} ", "\n".join(lines), con.width)
        text = Text(body)
        text.stylize(COLOUR[c.status], 0, len(c.status))
        con.print(text, soft_wrap=True)
    v = rep.verdict
    vc = {"runnable_natively": "green", "runnable_with_fallbacks": "yellow", "not_runnable": "red"}[v.status]
    text = Text(hang("verdict: ", v.summary, con.width))
    text.stylize(vc, 0, 8)
    con.print(text, soft_wrap=True)
    if v.day0:  # the stack's share already in the summary: only where it was judged
        stack, _, where = v.day0.rpartition(" [")
        line = f"on {where.removesuffix(']')}" if stack and stack in v.summary else v.day0
        con.print(Text(hang("  day-0 stack: ", line, con.width, 4)), soft_wrap=True)
    for head, items in (("  fallback: ", v.fallbacks), ("  note: ", v.notes)):
        for item in items:
            con.print(Text(hang(head, item, con.width, 4)), soft_wrap=True)
    if v.serve_command:
        con.print(Text(hang("  serve it: ", v.serve_command, con.width, 4)), soft_wrap=True)
