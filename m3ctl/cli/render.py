"""Human renderings shared by several commands: a launch plan, smoke findings, kernel findings."""

from m3ctl.cli.output import escape

COLOUR = {"OK": "green", "WARN": "yellow", "FAIL": "red", "SKIP": "dim", "INFO": "cyan"}


def shown_command(p) -> str:
    """What will run, for display: the ``docker run`` of a docker plan (its image), else the process command."""
    if p.runtime == "docker" and p.image:
        from m3ctl.emit import docker_command  # noqa: PLC0415

        return docker_command(p).strip()
    return p.command_line()


def print_plan(con, p) -> None:
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
    con.print(escape(shown_command(p)), soft_wrap=True)


def print_smoke(con, findings: list[dict] | None, only_problems: bool = False) -> None:
    for f in findings or []:
        if only_problems and f["status"] in ("OK", "SKIP"):
            continue
        con.print(f"  smoke [{COLOUR[f['status']]}]{f['status']}[/] {f['id']}: {escape(f['message'])}")
        if f.get("evidence") and f["status"] != "OK":
            con.print(f"        got: {escape(f['evidence'])}")
        if f.get("fix") and f["status"] != "OK":
            con.print(f"        fix: {escape(f['fix'])}")


def print_kernels(con, rep) -> None:
    if rep is None:
        return
    for f in rep.findings:
        con.print(f"  kernels [{COLOUR[f.level]}]{f.level}[/] {escape(f.message)}")
