"""``m3ctl doctor``: probe this host (or an inventory/system) and say, check by check, whether it can serve."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from m3ctl.cli import options as o
from m3ctl.cli.inputs import check_outputs, host_inventory, user_defaults
from m3ctl.cli.output import Output, escape
from m3ctl.cli.render import COLOUR


def doctor(
    json_out: o.Json = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Show every detail and the skipped checks.")] = False,
    model: o.Model = None,
    variant: o.Variant = None,
    context: Annotated[Optional[int], typer.Option(parser=o.token_count, metavar="N", help="Context tokens one sequence must fit (default 32768).")] = None,
    kv_cache_dtype: Annotated[str, typer.Option(help="KV cache dtype to validate for this GPU.")] = "auto",
    runtime: Annotated[str, typer.Option(parser=o.choice("auto", "process", "docker"), help="auto, process or docker (what serve would use).")] = "auto",
    port: o.Port = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 on WARN too.")] = False,
    image: Annotated[Optional[str], typer.Option(help="Check this image (catalog name or a local image) instead of the recommended one.")] = None,
    inventory: o.Inventory = None,
    save_inventory: Annotated[Optional[Path], typer.Option(help="Write this host's inventory as JSON.")] = None,
    system: o.System = None,
) -> None:
    """Probe this host and say, check by check, whether and how it can serve (exit 1 on FAIL)."""
    from m3ctl.doctor import report_json, resolve_image, run_doctor  # noqa: PLC0415

    out = Output(json_out)
    check_outputs(save_inventory=save_inventory)
    user = user_defaults()
    inv = host_inventory(inventory, system)
    if save_inventory:
        save_inventory.write_text(inv.model_dump_json(indent=2))
    rep = run_doctor(inv, model=model or (user.model if "model" in user.model_fields_set else None),
                     variant=variant, context=context, kv_cache_dtype=kv_cache_dtype, runtime=runtime,
                     port=port or user.port, host_checks=inventory is None and system is None,
                     image=resolve_image(image) if image else None,
                     inventory_file=str(inventory) if inventory else None)
    out.result(report_json(rep))
    if not out.json:
        render(out.con, rep, verbose)
    code = rep.exit_code(strict)
    if code:
        raise typer.Exit(code)


def render(con, rep, verbose: bool) -> None:
    """The checks as a table (details of WARN and FAIL always; of every check with -v), then the verdict."""
    from rich.table import Table  # noqa: PLC0415

    t = Table(title="m3ctl doctor", show_lines=False)
    for col in ("check", "status", "finding", "fix"):
        t.add_column(col, overflow="fold")
    for c in rep.checks:
        if c.status == "SKIP" and not verbose:
            continue
        details = c.details if verbose or c.status in ("WARN", "FAIL") else []
        finding = c.message + "".join("\n  " + d for d in details)
        t.add_row(c.id, f"[{COLOUR[c.status]}]{c.status}[/]", escape(finding),
                  escape(c.fix or "") if c.status in ("WARN", "FAIL") else "")
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
