"""Human renderings shared by several commands: a launch plan, smoke findings, kernel findings."""

from m3ctl import api
from m3ctl.cli.output import escape, print_hang, shell_lines
from m3ctl.core.secrets import source_var

COLOUR = {"OK": "green", "WARN": "yellow", "FAIL": "red", "SKIP": "dim", "INFO": "cyan", "UNJUDGED": "magenta"}


def shown_command(p, runtime=None) -> str:
    """What will run, for display (m3ctl.api.launch_command: the ``docker run`` of a docker plan under
    ``runtime``'s options, else the process command; a secret taken from another variable bound by name)."""

    return api.launch_command(p, runtime)


def print_plan(con, p) -> None:
    """The plan: a head line, each choice with why, what was rejected, warnings (wrapped at the console width),
    then the command on one line (whole, so it can be copied)."""
    print_hang(
        con,
        "plan ",
        f"{p.name}: profile {p.profile}, runtime {p.runtime}, {p.url}"
        + (f", model {p.model_spec}" if p.model_spec else "")
        + (f", variant {p.variant}" if p.variant else "")
        + (f", image {p.image}" if p.image else ""),
        2,
        "bold",
        (0, 4),
    )
    for c in p.choices:
        print_hang(con, f"  {c.what} = ", f"{c.value}  ({c.why})", 4)
    for r in p.rejected:
        print_hang(con, "  rejected ", f"{r.what} {r.value}: {r.why}", 4, "dim", (2, 10))
    for w in p.warnings:
        print_hang(con, "  warning: ", w, 4, "yellow", (2, 10))
    if p.secret_env_names:
        origins = getattr(p, "secret_origins", None) or {}
        flagged = [k for k in p.secret_env_names if source_var(p, k) == k and origins.get(k, "").startswith("--")]
        names = [
            k if source_var(p, k) == k else f"{k} (from ${source_var(p, k)})"
            for k in p.secret_env_names
            if k not in flagged
        ]
        if names:
            print_hang(con, "  env passed through (values hidden): ", ", ".join(names), 4)
        if flagged:  # a key given as a flag: m3ctl's launch sets it; a copy of the printed command would not
            print_hang(
                con,
                "  env m3ctl sets from a flag (value hidden, not in the command below): ",
                ", ".join(f"{k} ({origins[k]}; --api-key-env NAME prints a command that reads it)" for k in flagged),
                4,
            )
    if getattr(p, "day0", None) is not None:
        print_day0(con, p.day0)
    con.print(escape(shell_lines(shown_command(p), con.width)), soft_wrap=True)


def print_day0(con, report) -> None:
    """The plan's day-0 block (:mod:`m3ctl.planning.day0`): its one line, then one line per part."""
    print_hang(con, "  day-0 stack: ", report.summary(), 4)
    for s in report.parts:
        print_hang(con, f"    {s.part} = ", s.line(), 6)


def print_smoke(con, findings: list[dict] | None, only_problems: bool = False) -> None:
    """One line per smoke finding (``smoke STATUS id seconds: message``, then ``got:`` and ``fix:`` unless OK);
    the unjudged findings that share a message (random weights) in one line, never with their replies."""
    rows = list(findings or [])
    for f in rows:
        status = f["status"]
        if only_problems and status in ("OK", "SKIP"):
            continue
        if status == "UNJUDGED":
            same = [g for g in rows if g["status"] == "UNJUDGED" and g["message"] == f["message"]]
            if same[0] is not f:
                continue  # shown with the first of its kind
            ids = ", ".join(g["id"] for g in same)
            took = sum(g.get("duration_s") or 0.0 for g in same)
            head = f"  smoke {status} {ids} {took:.1f} s: "
            print_hang(con, head, f["message"], 8, COLOUR[status], (8, 8 + len(status)))
            if f.get("fix"):  # what would judge it; never the unjudgeable reply itself
                print_hang(con, "        fix: ", f["fix"], 13)
            continue
        took_s = f" {f['duration_s']:.1f} s" if f.get("duration_s") is not None else ""
        head = f"  smoke {status} {f['id']}{took_s}: "
        print_hang(con, head, f["message"], 8, COLOUR[status], (8, 8 + len(status)))
        if f.get("evidence") and status != "OK":
            print_hang(con, "        got: ", f["evidence"], 13)
        if f.get("fix") and status != "OK":
            print_hang(con, "        fix: ", f["fix"], 13)


def print_kernels(con, rep) -> None:
    if rep is None:
        return
    for f in rep.findings:
        print_hang(con, f"  kernels {f.level} ", f.message, 10, COLOUR[f.level], (10, 10 + len(f.level)))
    for d in getattr(rep, "day0", None) or []:  # the day-0 parts the log confirms (a verdict's findings)
        word = _DAY0_WORD[d.severity]
        print_hang(con, f"  day-0 {word} ", f"{d.id}: {d.message}", 8, COLOUR[word], (8, 8 + len(word)))


#: A day-0 finding's severity as the status word its line shows (never OK for what could not be judged).
_DAY0_WORD = {"ok": "OK", "degraded": "WARN", "fatal": "FAIL", "unjudged": "UNJUDGED"}
