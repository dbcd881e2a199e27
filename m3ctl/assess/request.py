"""The typed plan request: what a user (CLI, ``--config`` file, tune, doctor's verdict) asks ``plan()`` for.

Precedence, highest first: command line > ``--config`` file > ``M3CTL_*`` environment variables
(:func:`env_request`) > the user's default config file ``$XDG_CONFIG_HOME/m3ctl/config.yaml``, default
``~/.config/m3ctl/config.yaml`` (:func:`user_config_path`; same format as ``--config``) > catalog
(model/variant/profile data for the detected architecture) > vLLM default. :func:`user_request` is the two
per-machine layers merged. Layers merge with :func:`merge`: a field set in a higher layer wins
(``--no-ep`` on the command line beats ``ep: true`` in the file), ``args`` and ``env`` merge key by key, and a
typed flag set above removes the same vLLM flag from a lower layer's ``args``.

Example ``--config`` file::

    schema_version: 1
    variant: mxfp8
    max_model_len: 131072
    args: {max-num-seqs: 128}
    env: {VLLM_LOGGING_LEVEL: INFO}
"""

import json
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from m3ctl.catalog import Profile, _explain, load_yaml, yaml_error
from m3ctl.catalog.lazy import lazy_module
from m3ctl.catalog.loader import empty_list, read_user_text
from m3ctl.catalog.vllm_args import _is_option, canon_flag, check_choice, read_raw_args, vllm_int
from m3ctl.catalog.vllm_values import check_args
from m3ctl.core.secrets import MASK, is_secret_name, redact_env, redact_raw, secret_flag
from m3ctl.errors import BadInput, first_error, plain_text

if TYPE_CHECKING:
    import yaml
else:
    yaml = lazy_module("yaml")

#: The origin of what the command line (or an API call's own arguments) sets (:meth:`PlanRequest.origin_of`).
DIRECT = "command line / API"

#: Typed knobs -> the vLLM flag they set (a typed knob set in a higher layer drops that flag from lower ``args``).
TYPED_FLAGS = {
    "kv_cache_dtype": "kv-cache-dtype",
    "max_model_len": "max-model-len",
    "max_num_seqs": "max-num-seqs",
    "max_num_batched_tokens": "max-num-batched-tokens",
    "tp": "tensor-parallel-size",
    "dp": "data-parallel-size",
    "dcp": "decode-context-parallel-size",
    "pp": "pipeline-parallel-size",
    "ep": "enable-expert-parallel",
    "dbo": "enable-dbo",
}


def knob(help: str, **cli: Any) -> dict[str, Any]:
    """The ``Field`` keywords of a plan knob that ``m3ctl plan`` and ``m3ctl serve`` both take as an option: its help
    (``description``) and its CLI spelling (``json_schema_extra={"cli": ...}``: ``decls``, ``parser`` by name, or
    ``(name, argument)`` for a parser built from one, ``metavar``; read by m3ctl.cli.options.declared_options). The
    field is the knob's one declaration: type, default, bounds, help and flag; ``m3ctl plan``/``serve``'s options and
    the ``**knobs`` of m3ctl.api.plan/serve (PlanRequest fields as keywords) derive from it."""
    return {"description": help, "json_schema_extra": {"cli": cli}}


class PlanRequest(BaseModel):
    """One plan request; every field optional (None = not asked: the catalog or vLLM decides).

    Attributes:
        model: catalog name/alias (``MiniMax-M3.1-Flash``), hub id, or local model directory.
        name, port, host, served_model_name: deployment name and API address.
        runtime: ``process``, ``docker`` or ``auto`` (docker when the profile has an image).
        profile_file: kernel profile YAML instead of the catalog's (``--profile``); ``profile`` holds it loaded.
        variant: precision variant (``nvfp4``, ``mxfp8``...); default: best native one that fits.
        tp, dp, dcp, ep, dbo, pp: parallel layout (pp: pipeline stages); each one given pins that dimension, the
            planner searches the others (:mod:`m3ctl.assess.search`).
        gpus: the GPUs the server runs on, as physical indices (``nvidia-smi`` / ``amd-smi`` numbering), e.g. ``[2, 3]``;
            None: the visible GPUs in order. The planner plans for those GPUs only and sets the server's visible
            devices (:func:`m3ctl.planning.plan.plan`); tune's parallel trials use it (m3ctl/tuning/schedule.py). Not a CLI flag.
        spec_depth, spec_method, draft_tp: speculative decoding (depth 0 = off).
        kv_cache_dtype, max_model_len (tokens), max_num_seqs, max_num_batched_tokens: typed vLLM flags.
        attention: ``dense`` serves an MSA model with dense attention on every layer (the opt-in fallback of a
            known issue, m3ctl/data/known_issues.yaml; quality cost unknown); None / ``msa``: the checkpoint's own.
        stack: ``day0`` (None: the default) turns on every part of the model's day-0 stack the engine, hardware and
            image run (m3ctl/data/day0.yaml; m3ctl.planning.day0), with each documented fallback named; ``recipe``
            keeps the conservative recipe plan (the variant's flags only, nothing turned on by default).
        args: ``{flag: value}`` vLLM flags (``--arg``; ``args:`` in a file); extra_args: raw vLLM args after ``--``.
        env: extra server environment; pass_env: names of secret variables passed through (values never stored).
        image, mounts: docker image (default: the catalog's) and extra bind mounts.
        engine_version: vLLM version of the engine when known from outside (else image label / installed vLLM).
        allow_emulated, no_multicast, skip_checks: opt-ins (fallback kernels, NVLink multicast off, rules as warnings).
        startup_budget_s: readiness budget (s); vllm_executable, catalog_dir: where vLLM and the catalog are.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True, arbitrary_types_allowed=True)
    schema_version: Literal[1] = 1
    model: str = "MiniMax-M3.1-Flash"
    name: str = "m3ctl"
    port: int = Field(default=8000, ge=1, le=65535)
    host: str = "127.0.0.1"
    served_model_name: str | None = None
    runtime: Literal["process", "docker", "auto"] = "process"
    profile_file: str | None = None
    profile: Any = Field(default=None, exclude=True)
    variant: str | None = Field(
        default=None,
        **knob(
            "Model variant (nvfp4, mxfp4, mxfp8, fp8, bf16); default: best native one that fits.", parser="variant_name"
        ),
    )
    tp: int | None = Field(default=None, ge=1, **knob("Tensor parallel size.", decls="--tp"))
    dp: int | None = Field(default=None, ge=1, **knob("Data parallel size.", decls="--dp"))
    dcp: int | None = Field(default=None, ge=1, **knob("Decode context parallel size (adds no GPUs).", decls="--dcp"))
    pp: int | None = Field(
        default=None,
        ge=1,
        **knob("Pipeline parallel stages (GPUs = TP x PP x DP); default: the planner's layout search.", decls="--pp"),
    )
    ep: bool | None = Field(
        default=None, **knob("Expert parallel on/off (default: profile strategy).", decls="--ep/--no-ep")
    )
    dbo: bool | None = Field(
        default=None, **knob("Dual batch overlap (needs DP>1 + EP + DeepEP).", decls="--dbo/--no-dbo")
    )
    gpus: list[int] | None = Field(default=None, min_length=1)
    spec_depth: int | None = Field(
        default=None, ge=0, **knob("Speculative tokens (0 = off); uses the model's drafter, else ngram.")
    )
    spec_method: str | None = Field(
        default=None,
        **knob("Speculative method override (ngram, dspark, eagle3, mtp...).", parser=("vllm_choice", "spec-method")),
    )
    draft_tp: int | None = Field(default=None, ge=1)
    kv_cache_dtype: str | None = Field(
        default=None,
        **knob(
            "KV cache dtype (validated per architecture and attention type).", parser=("vllm_choice", "kv-cache-dtype")
        ),
    )
    attention: Literal["msa", "dense"] | None = Field(
        default=None,
        **knob(
            "msa (the checkpoint's sparse attention, even into a known fatal issue) or dense: every layer dense "
            "through --hf-overrides, a known MSA issue's fallback (quality cost unknown); default: msa, or the "
            "fallback where a known fatal issue applies.",
            metavar="msa|dense",
        ),
    )
    stack: Literal["day0", "recipe"] | None = Field(
        default=None,
        **knob(
            "day0 (the default): every part of the model's day-0 stack that the engine, hardware and image run "
            "(NVFP4 KV cache, the DSpark drafter, indexer DCP at long context, the MI350 path), each documented "
            "fallback named; recipe: the conservative recipe plan.",
            metavar="day0|recipe",
        ),
    )
    max_model_len: int | None = Field(
        default=None, ge=1, **knob("Max model length (tokens).", parser="token_count", metavar="N")
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, **knob("Max concurrent sequences.", parser="token_count", metavar="N")
    )
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, **knob("Max batched tokens per step.", parser="token_count", metavar="N")
    )
    args: dict[str, Any] = Field(default_factory=dict, validation_alias=AliasChoices("args", "overrides"))
    extra_args: list[str] = Field(default_factory=empty_list)
    env: dict[str, str] = Field(default_factory=dict)
    pass_env: list[str] = Field(default_factory=empty_list)
    image: str | None = None
    mounts: list[str] = Field(default_factory=empty_list)
    engine_version: str | None = None
    allow_emulated: bool = Field(
        default=False,
        **knob("Accept a variant that runs only through a fallback kernel here (e.g. NVFP4 on Hopper)."),
    )
    no_multicast: bool = Field(
        default=False,
        **knob("Turn NVLink multicast off for multi-GPU launches (shared hosts).", decls="--no-multicast"),
    )
    skip_checks: bool = False
    startup_budget_s: float | None = None
    vllm_executable: str | None = None
    catalog_dir: str | None = None
    #: Where this layer came from (:data:`DIRECT`, a config file, the environment); set by the loaders.
    _origin: str = PrivateAttr(default="")
    #: After :func:`merge`: field (or ``args.<flag>``) -> the origin of the layer that set it.
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    def origin_of(self, key: str) -> str:
        """Where a field (``max_model_len``) or an ``args`` flag (``args.max-num-seqs``) was set: a config file,
        the ``M3CTL_*`` environment or :data:`DIRECT` (the command line or an API call's arguments)."""
        return self._origins.get(key) or self._origin or DIRECT

    def given_as(self, field: str, flag: str) -> str:
        """Why a plan took ``field``'s value, for its explanation: ``given with --variant`` from the command line
        or an API call, else the layer that set it (``config file run.yaml (variant)``)."""
        o = self.origin_of(field)
        return f"given with {flag}" if o == DIRECT else f"{o} ({field})"

    @field_validator("*", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        """Text the command line could carry: no bytes, no NUL (m3ctl.errors.plain_text), API and CLI alike."""
        return plain_text(v)

    @field_validator("profile")
    @classmethod
    def _a_loaded_profile(cls, v: Any) -> Any:
        """``profile`` carries a loaded kernel profile (tune's trials); a name or a path is ``profile_file``'s
        (``profile: hopper`` in a config file crashed the planner)."""
        if v is not None and not isinstance(v, Profile):
            raise ValueError(f"{v!r} is not a loaded profile: name a profile YAML file with profile_file (--profile)")
        return v

    @field_validator("model")
    @classmethod
    def _absolute_local_model(cls, v: str) -> str:
        """A local model directory given relative (``./tm2``, ``~/m``) is stored absolute: a plan, a record and a
        restart from another directory name the same directory (vLLM would take a relative path that does not
        exist there for a hub id and download it)."""
        if not v.strip():  # M3CTL_MODEL=" " planned `vllm serve ' '`
            raise ValueError("the model name is empty: name a catalog model, a hub id or a local model directory")
        p = Path(v).expanduser()
        return str(p.resolve()) if not p.is_absolute() and p.is_dir() else v

    @field_validator("port", "tp", "dp", "dcp", "pp", "spec_depth", "draft_tp", mode="before")
    @classmethod
    def _a_number_not_a_switch(cls, v: Any) -> Any:
        """``port: true`` in a YAML file is a switch, not port 1 (pydantic's lax mode would read it as 1). An integral
        ``9100.0`` is read as 9100 here as on the command line (Typer parses m3ctl's integer options the same way)."""
        if v is True or v is False:
            raise ValueError(f"{str(v).lower()} is a switch, not a whole number")
        return v

    @field_validator("max_model_len", "max_num_seqs", "max_num_batched_tokens", mode="before")
    @classmethod
    def _token_count(cls, v: Any) -> Any:
        """Read as vLLM reads them (``8k`` = 8000, ``8K`` = 8192: m3ctl.catalog.vllm_args.vllm_int), whether they
        come from the command line, a config file or the API (the CLI's ``--max-model-len 8k`` parses the same)."""
        if v is True or v is False:
            raise ValueError(f"{str(v).lower()} is a switch, not a token count")
        if isinstance(v, str):
            n = vllm_int(v)
            if n is None:
                raise ValueError(f"{v!r} is not a whole number (8k = 8000 and 8K = 8192 work too)")
            return n
        return v

    @field_validator("kv_cache_dtype", "spec_method")
    @classmethod
    def _a_vllm_choice(cls, v: str | None, info: Any) -> str | None:
        """A value vLLM's own ``--kv-cache-dtype`` / ``--speculative-config method`` accepts (the choices in
        m3ctl/data/vllm_serve_flags.yaml), as the CLI's parser checks it; the plan rules check the rest."""
        flag = "kv-cache-dtype" if info.field_name == "kv_cache_dtype" else "spec-method"
        return None if v is None else check_choice(flag, v)

    @field_validator("args")
    @classmethod
    def _vllm_values(cls, v: dict[str, Any]) -> dict[str, Any]:
        """Flags in one spelling (``max_num_seqs``, ``--max-num-seqs`` -> ``max-num-seqs``:
        m3ctl.catalog.vllm_args.canon_flag), so a higher layer's replaces a lower one's and the rules see it; values
        of size flags read as vLLM reads them (m3ctl.catalog.vllm_values; BadInput, one line, on a bad one)."""
        out: dict[str, Any] = {}
        for k, val in v.items():
            if (c := canon_flag(str(k))) in out:
                raise ValueError(f"--{c} is given twice ({k!r} is another spelling of it)")
            out[c] = val
        check_args(out)
        return out

    def check_one_value_per_flag(self) -> None:
        """A typed knob and ``args`` for the same vLLM flag in one layer must agree (``--max-num-seqs 80 --arg
        max-num-seqs=64`` planned 64 with no word); across layers the higher one wins (:func:`merge`).

        Raises:
            BadInput: naming both; ``spec_depth`` 0 (off) with a ``spec_method`` (on)."""
        if self.spec_depth == 0 and self.spec_method:
            raise BadInput(
                f"--spec-depth 0 turns speculative decoding off and --spec-method {self.spec_method} asks for it",
                "drop --spec-method, or give --spec-depth N (N > 0 draft tokens)",
            )
        for k, flag in TYPED_FLAGS.items():
            v = getattr(self, k)
            if v is not None and flag in self.args and str(self.args[flag]).lower() != str(v).lower():
                raise BadInput(
                    f"--{k.replace('_', '-')} {v} and --arg {flag}={self.args[flag]} disagree",
                    "give the value once",
                )

    def set_fields(self) -> dict[str, Any]:
        """The fields this layer sets explicitly: ``allow_emulated: false`` in a ``--config`` file turns off the
        user config's ``true`` (the CLI leaves a switch it was not given out of its layer: m3ctl.cli.inputs)."""
        out = {}
        for k in self.model_fields_set:
            v = getattr(self, k)
            if v is None or k == "schema_version":
                continue
            out[k] = v
        return out

    def public(self) -> dict[str, Any]:
        """JSON of the fields set (defaults left out) with secret-looking env values, arg values and raw tokens
        masked (m3ctl.core.secrets): what plan --json, doctor --json and the registry may show."""
        out = self.model_dump(mode="json", exclude_defaults=True)
        if "env" in out:
            out["env"] = redact_env(out["env"])
        if "args" in out:
            out["args"] = {k: (MASK if is_secret_name(k) or secret_flag(k) else v) for k, v in out["args"].items()}
        if "extra_args" in out:
            out["extra_args"] = redact_raw(out["extra_args"])
        return out


def raw_as_flags(raw: list[str]) -> tuple[dict[str, Any], list[str]]:
    """A layer's raw vLLM arguments (``extra_args``) read as vLLM reads them (m3ctl.catalog.vllm_args.read_raw_args),
    so that they layer as ``args`` do: ``({flag: value}, the rest)``. The rest stays raw, as written: an argument
    vLLM does not know or a value it would refuse (the rules name them), a dotted key, a secret flag (its origin
    says "raw"), anything malformed (the planner says what is wrong with it).
    """
    segments: list[list[str]] = []
    for tok in raw:  # one segment per option, with the values after it
        if _is_option(tok) or not segments:
            segments.append([tok])
        else:
            segments[-1].append(tok)
    flags: dict[str, Any] = {}
    rest: list[str] = []
    for seg in segments:
        try:
            read = read_raw_args(seg)
        except BadInput:
            rest += seg
            continue
        (name, value), *more = list(read.flags.items()) or [("", None)]
        if more or not name or read.unknown or "." in name or secret_flag(name) is not None or name in flags:
            rest += seg
            continue
        try:
            check_args({name: value})
        except BadInput:  # a value vLLM would refuse: the rules name it as a raw argument
            rest += seg
            continue
        flags[name] = value
    return flags, rest


def _layer_raw(layer: PlanRequest, given: dict[str, Any]) -> list[str]:
    """Move the raw arguments of one layer's ``given`` fields into its ``args`` (:func:`raw_as_flags`); returns the
    raw arguments left.

    Raises:
        BadInput: a raw flag and ``--arg`` or a typed option of the same layer with different values.
    """
    flags, rest = raw_as_flags(given.pop("extra_args", []))
    args = dict(given.get("args", {}))
    typed_of = {flag: k for k, flag in TYPED_FLAGS.items()}
    for flag, v in flags.items():
        shown = v if not isinstance(v, tuple) else " ".join(v)
        if flag in args and str(args[flag]).lower() != str(shown).lower():
            raise BadInput(f"--arg {flag}={args[flag]} and raw --{flag} {shown} disagree", "give the value once")
        k = typed_of.get(flag)
        if k in given and str(given[k]).lower() != str(shown if v is not True else "true").lower():
            raise BadInput(
                f"--{k.replace('_', '-')} {given[k]} and raw --{flag} {shown} disagree", "give the value once"
            )
        if k not in given:
            args[flag] = v
    if args:
        given["args"] = args
    return rest


def merge(*layers: PlanRequest | None) -> PlanRequest:
    """Merge requests, lowest precedence first (e.g. ``merge(file_request, cli_request)``): see the module doc.
    The result knows which layer set each field and ``args`` flag (:meth:`PlanRequest.origin_of`)."""
    data: dict[str, Any] = {}
    args: dict[str, Any] = {}
    env: dict[str, str] = {}
    origins: dict[str, str] = {}
    extra: list[str] = []
    typed_of = {flag: k for k, flag in TYPED_FLAGS.items()}
    for layer in layers:
        if layer is None:
            continue
        layer.check_one_value_per_flag()
        given = layer.set_fields()
        had = set(given.get("args", {}))
        extra += _layer_raw(layer, given)  # raw vLLM arguments layer as args do
        for flag in set(given.get("args", {})) - had:
            o = layer.origin_of(f"args.{flag}")
            origins[f"args.{flag}"] = "raw vLLM argument" if o == DIRECT else f"{o} (extra_args)"
        for k, flag in TYPED_FLAGS.items():
            if k in given:
                args.pop(flag, None)
        for flag in given.get("args", {}):
            if flag in had:
                origins[f"args.{flag}"] = layer.origin_of(f"args.{flag}")
            if flag in typed_of:  # this layer's --arg max-num-seqs=64 replaces a lower layer's max_num_seqs
                data.pop(typed_of[flag], None)
        for k in given:
            if k not in ("args", "env"):
                origins[k] = layer.origin_of(k)
        args.update(given.pop("args", {}))
        env.update(given.pop("env", {}))
        data.update(given)
    prof = data.pop("profile", None)
    req = PlanRequest(**data, args=args, env=env, extra_args=extra)
    if prof is not None:
        req.profile = prof
    req._origins = origins
    return req


def load_request(path: str | Path) -> PlanRequest:
    """A :class:`PlanRequest` from a YAML file (``--config``).

    Raises:
        BadInput: unreadable file, invalid YAML, or an unknown key (with a "did you mean").
    """
    p = Path(path)
    text = read_user_text(p, "config")  # BadInput: missing, a directory, unreadable, not UTF-8
    try:
        data = load_yaml(text) or {}
    except yaml.YAMLError as e:
        raise BadInput(f"{p}: not valid YAML: {yaml_error(e)}", "fix the YAML syntax") from e
    if not isinstance(data, dict):
        raise BadInput(f"{p}: expected a mapping at the top level", "see the example in m3ctl/assess/request.py")
    for key in ("model", "profile_file"):  # a relative path next to the file, as compose files read them
        v = data.get(key)
        if isinstance(v, str) and v.strip() and not Path(v).expanduser().is_absolute():
            near = p.absolute().parent / v
            if near.exists():
                data[key] = str(near.resolve())
    try:
        req = PlanRequest.model_validate(data)
    except ValidationError as e:
        raise BadInput(_explain(e, PlanRequest, str(p)), "see the example in m3ctl/assess/request.py") from e
    req._origin = f"config file {p.absolute()}"
    return req


#: Environment variables for the options people set per machine -> the PlanRequest field each sets.
#: (Read where they are used: M3CTL_STATE_DIR by m3ctl.core.state.state_dir, M3CTL_CATALOG_DIR by m3ctl.catalog.)
ENV_FIELDS = {"M3CTL_MODEL": "model", "M3CTL_PORT": "port"}
#: Every ``M3CTL_`` variable m3ctl reads; any other is reported by :func:`unknown_env` (a typo would be ignored).
KNOWN_ENV = frozenset(
    {
        *ENV_FIELDS,
        "M3CTL_STATE_DIR",
        "M3CTL_CATALOG_DIR",
        "M3CTL_DEBUG",
        "M3CTL_DEPLOYMENT",
        "M3CTL_TEST_CACHE",
        "M3CTL_UPDATE_GOLDEN",
    }
)


def env_request(environ: dict[str, str] | None = None) -> PlanRequest:
    """The ``M3CTL_*`` layer (:data:`ENV_FIELDS`): e.g. ``M3CTL_MODEL=/models/m3 M3CTL_PORT=8001``.

    Raises:
        BadInput: a value that is not valid for its field (``M3CTL_PORT=abc``), naming the variable.
    """
    env = os.environ if environ is None else environ
    data = {f: env[k] for k, f in ENV_FIELDS.items() if k in env}  # set but empty: refused, as --port '' is
    try:
        req = PlanRequest.model_validate(data)
        req._origins = {f: f"environment {k}" for k, f in ENV_FIELDS.items() if f in data}
        return req
    except ValidationError as e:
        err = first_error(e)
        var = next(k for k, f in ENV_FIELDS.items() if f == err.loc[0])
        raise BadInput(f"{var}={env[var]!r}: {err.msg}", f"fix or unset {var}") from None


def check_env(environ: dict[str, str] | None = None) -> None:
    """Check every ``M3CTL_`` variable m3ctl reads as its option would be checked (one line naming the variable;
    never ignored): :data:`ENV_FIELDS` through :class:`PlanRequest` (:func:`env_request`), ``M3CTL_DEBUG`` 0 or 1,
    ``M3CTL_STATE_DIR`` an absolute path and not a file, none set but empty. ``M3CTL_CATALOG_DIR`` is checked where
    it is read (m3ctl.catalog); ``M3CTL_DEPLOYMENT`` is m3ctl's own process marker.

    Raises:
        BadInput: the first bad one.
    """
    env = os.environ if environ is None else environ
    for k in ("M3CTL_DEBUG", "M3CTL_STATE_DIR", "M3CTL_CATALOG_DIR"):
        v = env.get(k)
        if v is None:
            continue
        if not v.strip():
            raise BadInput(f"{k} is set but empty", f"give {k} a value or unset it")
        if k == "M3CTL_DEBUG" and v not in ("0", "1"):
            raise BadInput(
                f"M3CTL_DEBUG={v!r}: not 0 or 1", "M3CTL_DEBUG=1 shows tracebacks on errors; 0 or unset hides them"
            )
        if k == "M3CTL_STATE_DIR" and not Path(v).expanduser().is_absolute():
            raise BadInput(
                f"M3CTL_STATE_DIR={v!r}: not an absolute path (the state would move with the working directory)",
                "give an absolute directory, e.g. M3CTL_STATE_DIR=$PWD/state",
            )
        if k == "M3CTL_STATE_DIR" and Path(v).expanduser().exists() and not Path(v).expanduser().is_dir():
            raise BadInput(  # `status` read "no deployments" from it while the deployments ran
                f"M3CTL_STATE_DIR={v!r}: not a directory",
                "point it at a directory (it is made on demand) or unset it",
            )
    env_request(dict(env))


def user_config_path(environ: dict[str, str] | None = None) -> Path:
    """The user's default config file: ``$XDG_CONFIG_HOME/m3ctl/config.yaml``, else ``~/.config/m3ctl/config.yaml``
    (XDG Base Directory spec, https://specifications.freedesktop.org/basedir-spec/latest/)."""
    env = os.environ if environ is None else environ
    base = Path(env["XDG_CONFIG_HOME"]).expanduser() if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "m3ctl" / "config.yaml"


def user_request(environ: dict[str, str] | None = None) -> PlanRequest:
    """The per-machine layers merged: the user's default config file (if it exists), under ``M3CTL_*``.

    Raises:
        BadInput: as :func:`load_request` and :func:`env_request`.
    """
    check_env(environ)
    path = user_config_path(environ)
    return merge(load_request(path) if path.exists() else None, env_request(environ))


def unknown_env(environ: dict[str, str] | None = None) -> list[str]:
    """``M3CTL_`` variables that m3ctl does not read (sorted): most likely typos of :data:`KNOWN_ENV`."""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.startswith("M3CTL_") and k not in KNOWN_ENV)


def serve_command(req: PlanRequest, inventory: str | None = None) -> str:
    """The ``m3ctl serve ...`` command line that plans exactly ``req`` (shell-quoted; raw args after ``--``;
    secret-looking values masked, and ``env``/``pass_env`` never rendered: they come from the environment).

    ``inventory``: a saved inventory file to plan for (as ``--inventory``), None for the host serve runs on.
    """
    out = ["m3ctl", "serve", "--model", req.model]
    if req.name != "m3ctl":
        out += ["--name", req.name]
    if req.port != 8000:
        out += ["--port", str(req.port)]
    if req.runtime != "process":
        out += ["--runtime", req.runtime]
    for k in (
        "variant",
        "tp",
        "dp",
        "dcp",
        "pp",
        "spec_depth",
        "spec_method",
        "kv_cache_dtype",
        "attention",
        "stack",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "image",
        "served_model_name",
        "profile_file",
    ):
        v = getattr(req, k)
        if v is not None:
            out += ["--" + k.replace("_", "-").replace("profile-file", "profile"), str(v)]
    for k in ("ep", "dbo"):
        v = getattr(req, k)
        if v is not None:
            out.append(f"--{k}" if v else f"--no-{k}")
    for k, flag in (
        ("allow_emulated", "--allow-emulated"),
        ("no_multicast", "--no-multicast"),
        ("skip_checks", "--skip-checks"),
    ):
        if getattr(req, k):
            out.append(flag)
    pub = req.public()
    for k, v in pub.get("args", {}).items():
        out += ["--arg", k if v is True else f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    if inventory:
        out += ["--inventory", inventory]
    if pub.get("extra_args"):
        out += ["--", *pub["extra_args"]]
    return shlex.join(out)
