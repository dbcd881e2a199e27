"""Options declared once and shared by the commands: output (``--json``, output files), where to plan for
(``--inventory``, ``--system``), the deployment and its plan knobs (plan, serve, doctor, tune), the workload
(bench, tune). Values are checked at parse time (click ranges and the parsers below), so a bad value is one
``error:`` line with exit 2 before any work starts.

Per-machine defaults (``--model``, ``--port``) come from ``M3CTL_*`` variables and the user's config file,
layered by the API (m3ctl.api.plan_request, m3ctl.api.user_defaults: command line > --config > env > config
file): an option left out is passed as "not given", never as a default of the CLI's own.
"""

import difflib
import functools
import inspect
import math
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

import typer

from m3ctl import api
from m3ctl.assess.request import PlanRequest
from m3ctl.catalog import images, models
from m3ctl.catalog.limits import MAX_REQUEST_TOKENS
from m3ctl.catalog.vllm_args import check_choice, flag_table, vllm_int
from m3ctl.cli import output
from m3ctl.errors import BadInput, M3Error
from m3ctl.planning.launch import parse_mount

PLAIN_HELP = output.PLAIN_HELP  # declared with the output (m3ctl.cli.app reads it there); bench.py reads it here


# ------------------------------------------------------------------ value completion
#: The attribute a parser carries when its option has a fixed or catalog set of values: ``complete(incomplete)``,
#: the values that start with what was typed. The parsers below set it where the set is declared (:func:`choice`,
#: :func:`vllm_choice`, :func:`variant_name`, :func:`runtime`, :func:`system_name`...), so every option parsed by
#: one completes in bash, zsh and fish: the CLI's command table (m3ctl.cli.app.load_command) hands it to click for
#: every option of every command, without importing more than the command itself.
COMPLETE = "complete"


def _matches(values: Callable[[], Iterable[str]], comma: bool, incomplete: str) -> list[str]:
    """The values starting with ``incomplete``; ``comma``: the last item of a comma list (``h200x8,b2`` ->
    ``h200x8,b200x8``...)."""
    head, _, last = incomplete.rpartition(",") if comma else ("", "", incomplete)
    prefix = f"{head}," if comma and head else ""
    return [prefix + v for v in values() if v.startswith(last)]


def completes(values: Callable[[], Iterable[str]], *, comma: bool = False) -> Callable[[Callable], Callable]:
    """Mark a parser with the values its option completes in the shell (read when completing, never at import:
    ``values`` may read the catalog); ``comma`` for a comma-separated list."""

    def mark(parser: Callable) -> Callable:
        setattr(parser, COMPLETE, functools.partial(_matches, values, comma))
        return parser

    return mark


def completion_of(parser: Any) -> Callable[[str], list[str]] | None:
    """The shell completion a parser carries (:func:`completes`), None when its values are free."""
    return getattr(parser, COMPLETE, None)


# ------------------------------------------------------------------ parsers (parse-time value checks)
def token_count(text: str) -> int:
    """A token count as vLLM reads one (``8k`` = 8000, ``8K`` = 8192, else an integer), at least 1."""
    n = vllm_int(text)
    if n is None or n < 1:
        raise typer.BadParameter(f"{text!r} is not a whole number >= 1 (8k = 8000 and 8K = 8192 work too)")
    if (
        n > MAX_REQUEST_TOKENS
    ):  # no model has a longer context (m3ctl.catalog.limits.MAX_REQUEST_TOKENS): nothing fits more
        raise typer.BadParameter(f"{text} is above {MAX_REQUEST_TOKENS:,}, the longest context of any public model")
    return n


def text(value: str) -> str:
    """A non-empty value (an empty ``--model ''`` would silently mean "the default")."""
    if not value.strip():
        raise typer.BadParameter("an empty value is not allowed (leave the option out for the default)")
    return value


def suggests(values: Callable[[], Iterable[str]]) -> Callable[[str], str]:
    """A non-empty value (:func:`text`) that completes ``values()`` in the shell: for options whose values the
    settings check themselves, with their own message (``--endpoint``), or that change at run time (deployments)."""

    def parse(value: str) -> str:
        return text(value)

    parse.__name__ = "suggests"
    return completes(values)(parse)


def vllm_choice(flag: str) -> Callable[[str], str]:
    """A parser accepting the values vLLM's own ``--FLAG`` accepts (its choices in m3ctl/data/vllm_serve_flags.yaml,
    read from ``vllm serve --help=all``); the rules check the rest (per architecture, per model)."""

    def parse(value: str) -> str:
        try:
            return check_choice(flag, value)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None

    parse.__name__ = "vllm_choice"
    return completes(lambda: [c for c in (flag_table().flags[flag].choices or []) if c != "None"])(parse)


def _variant_names() -> list[str]:
    return sorted({v for m in models().values() for v in m.variants})


@completes(_variant_names)
def variant_name(value: str) -> str:
    """A variant name some catalog model has (m3ctl/models/*.yaml: nvfp4, mxfp4, mxfp8, fp8, bf16...)."""
    return choice(*_variant_names())(value)


@completes(lambda: sorted({n for m in models().values() for n in (m.name, *m.aliases)}))
def model_ref(value: str) -> str:
    """A model: a catalog name, a hub id or a local directory (:func:`text`); completes the catalog's names (a path
    completes as a file: no catalog name starts with ``/`` or ``.``)."""
    return text(value)


@completes(lambda: sorted(images()))
def image_ref(value: str) -> str:
    """An image: a catalog name, a reference or a local image (:func:`text`); completes the catalog's names."""
    return text(value)


@completes(lambda: api.system_names())
def system_name(value: str) -> str:
    """A catalog system (:func:`text`: the API checks the name and says what is close); completes every catalog
    system at the GPU counts of one node (``h200x1``, ``h200x2``...)."""
    return text(value)


@completes(lambda: ["all", *api.system_names()], comma=True)
def system_list(value: str) -> str:
    """Catalog systems, comma-separated or ``all``, no empty item (:func:`text`, :func:`list_items`; the API checks
    each name)."""
    list_items(text(value), "b200x8,gb300x4")
    return value


def output_dir(path: Path, what: str) -> Path:
    """A directory m3ctl will create (or fill): refused when it is a file or lies under one, before any work.

    Raises:
        BadInput: it is a file, or a parent is a file.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise BadInput(f"{what} {p} is a file, not a directory", "give a directory path")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise BadInput(f"{what} {p}: {parent} is a file, not a directory", "choose a path in a directory")
    return p


def mount_spec(value: str) -> str:
    """A docker bind mount ``HOST:CONTAINER[:ro|rw]`` as m3ctl.planning.launch.parse_mount reads it."""
    try:
        parse_mount(value)
    except M3Error as e:
        raise typer.BadParameter(f"{e.message} ({e.hint})") from None
    return value


def absolute_path(value: str) -> str:
    """An absolute path (a Kubernetes hostPath must be one: https://kubernetes.io/docs/concepts/storage/volumes/#hostpath)."""
    if not value.startswith("/"):
        raise typer.BadParameter(f"{value!r} is not an absolute path (e.g. /data/hf-cache)")
    return value


def choice(*values: str) -> Callable[[str], str]:
    """A parser accepting one of ``values`` (an error lists them, with the closest as a "did you mean")."""

    def parse(text: str) -> str:
        if text not in values:
            close = difflib.get_close_matches(text, values, n=1)
            raise typer.BadParameter(
                f"{text!r} is not one of {', '.join(values)}" + (f"; did you mean {close[0]!r}?" if close else "")
            )
        return text

    parse.__name__ = "choice"
    return completes(lambda: values)(parse)


@completes(lambda: get_args(PlanRequest.model_fields["runtime"].annotation))
def runtime(text: str) -> str:
    """A runtime PlanRequest accepts (process, docker, auto)."""
    return choice(*get_args(PlanRequest.model_fields["runtime"].annotation))(text)


def positive_float(text: str) -> float:
    """A number > 0 (``inf`` allowed)."""
    try:
        v = float(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a number") from None
    if not v > 0:
        raise typer.BadParameter(f"{text} must be > 0")
    return v


def percentiles(text: str) -> str:
    """Comma-separated percentiles, each in [0, 100]."""
    try:
        vals = [float(x) for x in list_items(text, "50,90,99")]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a comma-separated list of numbers (e.g. 50,90,99)") from None
    if not vals or any(not 0 <= v <= 100 or math.isnan(v) for v in vals):
        raise typer.BadParameter(f"{text!r}: percentiles are numbers from 0 to 100 (e.g. 50,90,99)")
    return text


def list_items(text: str, example: str) -> list[str]:
    """The items of a comma-separated option value, stripped; an empty item (``1,,4``, ``1,4,``, ``""``) is refused:
    a typo, not a value to drop silently. ``example``: a well-formed value for the message."""
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise typer.BadParameter(
            f"{text!r} has an empty item: give the values separated by single commas (e.g. {example})"
        )
    return items


def int_list(text: str) -> str:
    """A comma-separated list of integers >= 1 (``1,2,4,8``), no empty item (:func:`list_items`)."""
    try:
        vals = [int(x) for x in list_items(text, "1,2,4,8")]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not an integer or a list such as 1,2,4,8") from None
    if not vals or min(vals) < 1:
        raise typer.BadParameter(f"{text!r}: values must be integers >= 1 (e.g. 1,2,4,8)")
    return text


def int_list_upto(most: int) -> Callable[[str], str]:
    """:func:`int_list` whose values are at most ``most`` (a model field's ``le``)."""

    def parse(text: str) -> str:
        int_list(text)
        if max(int(x) for x in text.split(",") if x.strip()) > most:
            raise typer.BadParameter(f"{text!r}: values must be integers from 1 to {most:,}")
        return text

    parse.__name__ = "int_list"
    return parse


# ------------------------------------------------------------------ output
Json = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print the result as one JSON document on stdout (JSON Lines, one object per event, where the command "
        "streams: serve in the foreground, watch, logs --follow); errors stay on stderr as error:/hint: lines.",
    ),
]


# ------------------------------------------------------------------ host to plan for
Inventory = Annotated[
    Path | None, typer.Option(help="Evaluate a saved inventory (doctor --save-inventory) instead of this host.")
]
System = Annotated[
    str | None,
    typer.Option(
        parser=system_name,
        metavar="NAME",
        help="Evaluate a catalog system you don't have (h200x8, gb300x4, mi355xx8; xN sets the GPU count); nothing is probed.",
    ),
]

# ------------------------------------------------------------------ deployment (plan, serve, doctor, tune)
Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        parser=model_ref,
        help="Catalog model (MiniMax-M3.1-Flash), hub id, or local directory (default: $M3CTL_MODEL, the config file's, else MiniMax-M3.1-Flash).",
    ),
]
#: ``serve`` and ``tune`` start servers: the model is never assumed there (``plan`` and ``doctor`` default it).
ServeModel = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        parser=model_ref,
        help="Catalog model (MiniMax-M3.1-Flash), hub id, or local directory (required: give it, or set $M3CTL_MODEL or the config file's model).",
    ),
]
TuneModel = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        parser=model_ref,
        help="Catalog model (MiniMax-M3.1-Flash), hub id, or local directory (required for a new study: give it, or set $M3CTL_MODEL or the config file's model).",
    ),
]
Port = Annotated[
    int | None, typer.Option(min=1, max=65535, help="API port (default: $M3CTL_PORT, the config file's, else 8000).")
]
Host = Annotated[str, typer.Option(help="API listen address.")]
Name = Annotated[str, typer.Option(help="Deployment name.")]
ServedName = Annotated[
    str | None, typer.Option(parser=text, help="API model id (default: the model id, with --name as a second name).")
]
Runtime = Annotated[
    str | None,
    typer.Option(
        parser=runtime,
        help="process (bare `vllm serve`), docker, or auto (the default: docker when --image is given, or the profile has an image and the container engine is reachable; else process).",
    ),
]
Profile = Annotated[Path | None, typer.Option(help="Kernel profile YAML to use instead of the catalog's.")]
Arg = Annotated[
    list[str] | None,
    typer.Option("--arg", help="vllm serve flag override flag=value, e.g. max-num-seqs=64 (repeatable)."),
]
ApiKeyEnv = Annotated[
    str | None,
    typer.Option(
        help="Require this API key: the name of the environment variable holding it (handed to vLLM as VLLM_API_KEY, never on its command line)."
    ),
]
SkipChecks = Annotated[bool, typer.Option(help="Report plan rule violations as warnings instead of rejecting.")]
Config = Annotated[
    Path | None,
    typer.Option(help="Plan config YAML (flags override it; it overrides M3CTL_* and ~/.config/m3ctl/config.yaml)."),
]


def options(group: dict[str, tuple[Any, Any]], into: str):
    """Add the options of ``group`` ({name: (Annotated type, default)}) to a command; the command receives them
    as one dict argument ``into`` (so a group is declared once, here, and not repeated per command)."""

    def deco(fn):
        sig = inspect.signature(fn)
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values() if p.name != into]
        params += [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=t, default=d) for n, (t, d) in group.items()
        ]

        @functools.wraps(fn)
        def wrapper(**kw):
            return fn(**{k: v for k, v in kw.items() if k not in group}, **{into: {k: kw[k] for k in group}})

        del wrapper.__wrapped__  # typer reads the signature and annotations below, not fn's
        wrapper.__signature__ = sig.replace(parameters=params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return deco


# ------------------------------------------------------------------ options derived from a settings model
def model_options(model, spec: dict[str, dict[str, Any]]) -> tuple[dict[str, tuple[Any, Any]], dict[str, str]]:
    """Typer options derived from the pydantic ``model``'s fields (the schema is declared once, there): for each
    field of ``spec`` its help (the field's description), type (``X | None`` -> Optional[X]; a ``Literal`` ->
    a choice parser with a "did you mean") and default. ``spec[field]`` adds or overrides what the model cannot
    say: ``name`` (the CLI name, e.g. ``time_budget`` for ``time_budget_s``), ``cli_default`` (the option's
    default where it is not the model's, e.g. None when the command decides from other options), ``decls`` (``"--knob"``,
    ``"--baseline/--no-baseline"``), ``type`` (e.g. ``str`` for a comma list), ``show`` (model default -> CLI
    default), ``unset`` (default None, so that only a given value counts, e.g. for ``--resume``; the model's
    default is named in the help), ``help`` (for a model whose fields carry no description), and any
    typer.Option keyword (``parser``, ``min``, ``max``, ``metavar``). A number field's ``ge``/``le`` bounds
    become the option's ``min``/``max`` (checked at parse time) unless ``spec`` gives a parser or the bound.

    Returns:
        (the group for :func:`options`, {CLI name: field name}).
    """
    group: dict[str, tuple[Any, Any]] = {}
    names: dict[str, str] = {}
    for field, extra in spec.items():
        extra = dict(extra)
        f = model.model_fields[field]
        name, decls = extra.pop("name", field), extra.pop("decls", ())
        decls = (decls,) if isinstance(decls, str) else tuple(decls)
        unset, show, typ = extra.pop("unset", False), extra.pop("show", None), extra.pop("type", None)
        default = f.get_default(call_default_factory=True)
        ann, optional = f.annotation, False
        if get_origin(ann) in (Union, types.UnionType):
            args = [a for a in get_args(ann) if a is not type(None)]
            optional, ann = len(args) < len(get_args(ann)), args[0]
        if typ is None:
            if get_origin(ann) is Literal:
                extra.setdefault("parser", choice(*get_args(ann)))
                typ = str
            elif get_origin(ann) in (list, dict) or ann in (list, dict):
                typ, optional = list[str], True
            else:
                typ = ann
        if typ in (int, float) and "parser" not in extra:  # the model's bounds, checked at parse time
            for m in f.metadata:
                if getattr(m, "ge", None) is not None:
                    extra.setdefault("min", m.ge)
                if getattr(m, "le", None) is not None:
                    extra.setdefault("max", m.le)
        if optional or unset or default in ([], {}) or extra.get("cli_default", ...) is None:
            typ = Optional[typ]  # noqa: UP045 - built at runtime from a field type, for typer
        help_ = extra.pop("help", None) or f.description or ""
        if unset:
            shown = {True: "on", False: "off"}.get(default, default) if isinstance(default, bool) else default
            help_ += f" (default: {shown})"
        value = None if unset or default in ([], {}) else (show(default) if show else default)
        value = extra.pop("cli_default", value)  # the CLI's own default (None: only a given value counts)
        group[name] = (Annotated[typ, typer.Option(*decls, help=help_, **extra)], value)
        names[name] = field
    return group, names


#: The option types and default renderings a settings model's field may name in its declaration.
_DECLARED_TYPES: dict[str, Any] = {"str": str, "path": Path}
_DECLARED_SHOWS: dict[str, Any] = {"comma": lambda v: ",".join(map(str, v))}


def declared_options(
    model,
    parsers: dict[str, Any] | None = None,
    extra: dict[str, dict[str, Any]] | None = None,
    *,
    order: tuple[str, ...] = (),
) -> tuple[dict[str, tuple[Any, Any]], dict[str, str]]:
    """:func:`model_options` of the fields of the pydantic settings ``model`` (BenchConfig, TuneOptions, ServeSettings) that declare
    their option themselves (``json_schema_extra={"cli": {...}}``: ``name``, ``decls``, ``min``, ``max``,
    ``metavar``, ``unset``, ``cli_default``; ``parser`` by name, from ``parsers`` or a parser of this module, or
    ``(name, argument)``: this module's parser factory ``name`` called with it; ``type`` ``"str"`` or
    ``"path"``; ``show`` ``"comma"``: a list default shown comma-separated). Fields without ``cli`` are not options.
    ``extra[field]``: typer.Option keywords a data declaration cannot hold (parsers built at run time,
    autocompletion). Listed in ``order``, then in the model's field order (a new field lands last)."""
    fields = [
        f
        for f, info in model.model_fields.items()
        if isinstance(info.json_schema_extra, dict) and isinstance(info.json_schema_extra.get("cli"), dict)
    ]
    fields.sort(key=lambda f: order.index(f) if f in order else len(order))
    spec: dict[str, dict[str, Any]] = {}
    for f in fields:
        cli = dict(model.model_fields[f].json_schema_extra["cli"])
        if isinstance(cli.get("parser"), str):
            cli["parser"] = (parsers or {}).get(cli["parser"]) or globals()[cli["parser"]]
        elif isinstance(cli.get("parser"), tuple):  # (name, argument): a parser built from one (vllm_choice)
            name, *args = cli["parser"]
            cli["parser"] = globals()[name](*args)
        if isinstance(cli.get("type"), str):
            cli["type"] = _DECLARED_TYPES[cli["type"]]
        if isinstance(cli.get("show"), str):
            cli["show"] = _DECLARED_SHOWS[cli["show"]]
        spec[f] = {**cli, **(extra or {}).get(f, {})}
    return model_options(model, spec)


# ------------------------------------------------------------------ the plan knobs (plan, serve; doctor a few)
def plan_knobs(model: Any = PlanRequest) -> dict[str, tuple[Any, Any]]:
    """The planner's typed knobs that ``plan`` and ``serve`` share: the options derived from the PlanRequest fields
    that declare one (m3ctl.assess.request.knob: each knob's type, default, bounds, help and flag are its field),
    then ``--offline/--online`` (an argument of m3ctl.api.plan/serve, not a request field)."""
    group, _ = declared_options(model)  # in PlanRequest's field order, as --help lists them
    return {**group, "offline": _OFFLINE}


_OFFLINE = (
    Annotated[
        bool | None,
        typer.Option(
            "--offline/--online",
            help="Air-gapped: resolve the model, tokenizer and draft model to local HF-cache snapshots and check every file before launch (default: on when HF_HUB_OFFLINE=1).",
        ),
    ],
    None,
)
#: The planner's typed knobs (PlanRequest fields), shared by `plan` and `serve` through :func:`options`.
PLAN_KNOBS: dict[str, tuple[Any, Any]] = plan_knobs()


def knob_option(name: str) -> Any:
    """The option of one plan knob of :data:`PLAN_KNOBS` (its flag, parser and help), for a command that takes it
    one by one (``doctor``)."""
    return PLAN_KNOBS[name][0].__metadata__[0]


#: Plan knobs that ``doctor`` takes as ``plan`` and ``serve`` do.
Variant = Annotated[str | None, knob_option("variant")]
Attention = Annotated[str | None, knob_option("attention")]
Stack = Annotated[str | None, knob_option("stack")]
