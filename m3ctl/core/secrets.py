"""Keep secrets (HF tokens, API keys, URL credentials) out of argv, logs, printed and stored forms, and errors.

One secret path: whatever channel carries a secret (``serve --api-key-env VAR``, a raw ``-- --api-key K``,
``--arg api-key=K``, ``args: {api-key: K}`` in a ``--config`` file, a profile's ``serve_args``, an ``env:`` of a
profile, model or config with a secret-looking name, the pass-through variables of the launching shell) is
separated here (:func:`separate`, called by the planner on every layer of flags and on the final environment):
the value goes only into the server's environment (:data:`API_KEY_ENV` for an API key: vLLM reads it when
``--api-key`` is absent, https://docs.vllm.ai/en/latest/configuration/env_vars.html), and everything m3ctl prints
or stores carries the variable's name instead. Clients of a deployment (readiness, smoke, watch, bench, tune)
get their key from one resolver (:func:`client_key` / :func:`auth_headers`); a restart reproduces every secret
of the launch or refuses (:func:`restart_env`). URL credentials (``http://user:pass@host``) are taken out of the
URL by :func:`split_url_credentials`.

The facts (secret flags and the variable each maps to, the pass-through names, the secret-name pattern) are
data: m3ctl/data/secrets.yaml, validated by :class:`SecretsTable`.
"""

import base64
import difflib
import functools
import ipaddress
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from pydantic import Field

from m3ctl.catalog import Regex, _Strict, data, register
from m3ctl.catalog.vllm_args import flag_table
from m3ctl.errors import BadInput

MASK = "***"

# Token shapes that must never be printed even if they slip into free text.
_SECRET_VALUE = re.compile(r"\b(hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_\-]{8,}|Bearer\s+\S+|Basic\s+[A-Za-z0-9+/=]{6,})")
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")
#: A URL query parameter that carries a credential (``?api_key=...``, ``&token=...``): its value is masked.
_URL_QUERY_SECRET = re.compile(
    r"(?P<key>[?&](?:api[_-]?key|apikey|key|token|access[_-]?token|auth|password|passwd|secret|sig|signature)=)"
    r"[^&#\s'\"]+",
    re.IGNORECASE,
)

#: The variable vLLM reads its API key from when ``--api-key`` is not given.
API_KEY_ENV = "VLLM_API_KEY"

#: Secret values m3ctl has seen in this process (separated from flags, env or URLs): :func:`redact_text` masks
#: them wherever they would be printed (error messages included).
_KNOWN: set[str] = set()


class SecretFlag(_Strict):
    """A ``vllm serve`` flag whose value is a secret: ``env`` is the variable the server reads instead."""

    env: str = Field(pattern=r"^[A-Z_][A-Z0-9_]*$")
    source: str = Field(pattern=r"^https://")
    note: str = ""


class SecretsTable(_Strict):
    """m3ctl/data/secrets.yaml (see the file for what each field means)."""

    schema_version: int = 1
    secret_name_pattern: Regex
    passthrough: list[str] = Field(min_length=1)
    flags: dict[str, SecretFlag] = Field(min_length=1)
    protected_prefixes: list[str] = Field(default_factory=list)
    protected_source: str = Field(pattern=r"^https://")


register("data/secrets.yaml", SecretsTable)


def table() -> SecretsTable:
    """The built-in table (m3ctl/data/secrets.yaml), validated once (:func:`m3ctl.catalog.data`).

    Raises:
        CatalogError: the file is not valid (names the key that is wrong).
    """
    return data("data/secrets.yaml", SecretsTable)


@functools.lru_cache(maxsize=1)
def _name_re() -> re.Pattern:
    return re.compile(table().secret_name_pattern, re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """True when an environment variable name (or a flag name, dashes read as underscores) carries a secret."""
    return bool(_name_re().search(name.replace("-", "_")))


def passthrough_names() -> tuple[str, ...]:
    """Variables of the launching environment handed to the server (m3ctl/data/secrets.yaml ``passthrough``)."""
    return tuple(table().passthrough)


def remember(*values: str | None) -> None:
    """Mask these values wherever :func:`redact_text` runs from now on (this process only)."""
    if values:
        _KNOWN.update(v for v in values if v and len(v) >= 4)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Copy of ``env`` with the values of secret-looking names replaced by ``***``."""
    return {k: (MASK if is_secret_name(k) and v else v) for k, v in env.items()}


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Mask ``secrets``, every value :func:`remember` ed, URL credentials (``scheme://user:pass@`` ->
    ``scheme://***@``; ``?api_key=...`` -> ``?api_key=***``) and token-shaped strings (``hf_...``, ``sk-...``,
    bearer/basic headers)."""
    for s in sorted({*secrets, *_KNOWN}, key=len, reverse=True):
        if s and len(s) >= 4:
            text = text.replace(s, MASK)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    text = _URL_QUERY_SECRET.sub(lambda m: f"{m.group('key')}{MASK}", text)
    return _SECRET_VALUE.sub(MASK, text)


# ----------------------------------------------------------------------------- the one separation
#: Answers of :func:`secret_flag` and :func:`near_secret_flag` by flag name, for the tables they were computed from
#: (:func:`_memo`): the planner asks them for every flag of every layer of every plan (a 288-configuration
#: ``tune --dry-run`` asked about 17,000 times for a few dozen names).
_MEMO: dict[tuple[bool, str], Any] = {}
_MEMO_TABLES: list[object] = []


def _memo(near: bool, name: str) -> Any:
    """The memoized answer of :func:`_secret_flag` (``near`` False) or :func:`_near_secret_flag` for ``name``;
    computed anew once either table (m3ctl/data/secrets.yaml, the vLLM flag table) is another object."""
    tables = [table(), flag_table()]
    if len(_MEMO_TABLES) != 2 or _MEMO_TABLES[0] is not tables[0] or _MEMO_TABLES[1] is not tables[1]:
        _MEMO.clear()
        _MEMO_TABLES[:] = tables
    key = (near, name)
    if key not in _MEMO:
        if len(_MEMO) > 4096:  # names come from flags: bounded in practice; a bound all the same
            _MEMO.clear()
        _MEMO[key] = _near_secret_flag(name) if near else _secret_flag(name)
    return _MEMO[key]


def secret_flag(name: str) -> SecretFlag | None:
    """The :class:`SecretFlag` a flag name means (``--api_key``, ``api-key``, a unique prefix such as
    ``--api-k``: read as vLLM's parser reads it, m3ctl/catalog/vllm_args.py), else None."""
    return _memo(False, name)


def _secret_flag(name: str) -> SecretFlag | None:
    flags = table().flags
    k = name.lstrip("-").split(".", 1)[0].replace("_", "-")
    if k in flags:
        return flags[k]
    opts = flag_table().option_strings()
    if k in opts:
        return None
    matches = [o for o in opts if o.startswith(k)] if k else []
    return flags.get(matches[0]) if len(matches) == 1 else None


@dataclass
class Separated:
    """What :func:`separate` found.

    Attributes:
        args: the flags without secret ones; env: the environment without secret values.
        values: ``{server variable: value}``: for the server's environment only.
        origins: ``{server variable: where it was given}`` (no value), e.g. ``--arg api-key (command-line
            override (--arg))``.
    """

    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    values: dict[str, str] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)


def separate(
    args: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None, *, origin: str = ""
) -> Separated:
    """Take the secrets out of one layer of ``vllm serve`` flags (``{flag: value}``) and environment: a flag of
    m3ctl/data/secrets.yaml with a value (``api-key`` -> ``VLLM_API_KEY``, ``hf-token`` -> ``HF_TOKEN``; a bare
    ``--hf-token`` means "the login token" and stays), and every variable with a secret-looking name
    (:func:`is_secret_name`). The values found are :func:`remember` ed (masked in every message).

    Raises:
        BadInput: a secret flag with several values (the environment carries one), or an empty one; an unknown
            flag a typo away from a secret one with a value (:func:`near_secret_flag`, even under
            ``--skip-checks``: its value would stand in the server's argv and in m3ctl's records).
    """
    out = Separated()
    for k, v in (args or {}).items():
        f = secret_flag(k)
        if f is None and v not in (True, False, None) and near_secret_flag(k):
            remember(*([str(x) for x in v] if isinstance(v, tuple | list) else [str(v)]))
            raise BadInput(
                f"--{k.lstrip('-')} is no vLLM flag, and it looks like a secret one: its value would stand in the "
                "server's command line",
                "spell the secret flag right (m3ctl hands its value to the server's environment) or drop it",
            )
        if f is None or v is True or v is None or v is False:
            out.args[k] = v
            continue
        vals = [str(x) for x in v] if isinstance(v, tuple | list) else [str(v)]
        if len(vals) != 1 or not vals[0]:
            raise BadInput(
                f"--{k.lstrip('-')} has {len(vals)} values; m3ctl hands one to the server through {f.env}",
                "give one value",
            )
        out.values[f.env] = vals[0]
        out.origins[f.env] = f"--{k.lstrip('-')}" + (f" ({origin})" if origin else "")
    for k, v in (env or {}).items():
        if is_secret_name(k) and v:
            out.values[k] = v
            out.origins[k] = f"env {k}" + (f" ({origin})" if origin else "")
        else:
            out.env[k] = v
    remember(*out.values.values())
    return out


def split_api_key(raw_args: list[str]) -> tuple[list[str], str | None]:
    """Take vLLM's ``--api-key KEY`` (or ``--api-key=KEY``) out of raw ``vllm serve`` arguments (tune refuses
    one: its trial servers are private). Raw flags of ``plan``/``serve`` are separated by the planner instead.

    Returns:
        (the arguments without the key, the key or None).

    Raises:
        BadInput: ``--api-key`` without a value, or with several keys (the environment carries one).
    """
    out: list[str] = []
    keys: list[str] = []
    i = 0
    while i < len(raw_args):
        a = raw_args[i]
        name, eq, val = a.partition("=")
        f = secret_flag(name) if a.startswith("--") else None
        if f is not None and f.env == API_KEY_ENV:
            if eq:
                keys.append(val)
                i += 1
                continue
            j = i + 1
            while j < len(raw_args) and not raw_args[j].startswith("-"):
                keys.append(raw_args[j])
                j += 1
            if j == i + 1:
                raise BadInput("raw --api-key has no value", "give one key: -- --api-key KEY, or --api-key-env VAR")
            i = j
            continue
        out.append(a)
        i += 1
    remember(*keys)
    if len(keys) > 1:
        raise BadInput(
            f"raw --api-key has {len(keys)} keys; m3ctl hands one to vLLM through {API_KEY_ENV}", "give one key"
        )
    return out, (keys[0] if keys else None)


def near_secret_flag(name: str) -> bool:
    """Whether ``name`` is a secret flag (:func:`secret_flag`) or a flag vLLM does not know that is a typo away
    from one (``--api-keyy``, ``--hf_tokn``, ``--API-KEY``: difflib ratio >= 0.8, any case). Such a typo reaches vLLM only under
    ``--skip-checks`` (the rules refuse an unknown flag otherwise); its value is masked wherever it is shown, and
    it is not moved to the server's environment (the flag is passed as given, and vLLM refuses it)."""
    return bool(_memo(True, name))


def _near_secret_flag(name: str) -> bool:
    if secret_flag(name) is not None:
        return True
    k = name.lstrip("-").split(".", 1)[0].replace("_", "-")
    if not k or k in flag_table().option_strings():
        return False
    return bool(difflib.get_close_matches(k.lower(), list(table().flags), n=1, cutoff=0.8))  # --API-KEY too


def redact_raw(raw_args: list[str]) -> list[str]:
    """Raw ``vllm serve`` arguments with the values of secret flags, of unknown flags a typo away from one
    (:func:`near_secret_flag`) and of token shapes masked, for display."""
    out: list[str] = []
    hide = False
    for a in raw_args:
        if hide and not a.startswith("-"):
            out.append(MASK)
            continue
        hide = False
        name, eq, _ = a.partition("=")
        if a.startswith("--") and near_secret_flag(name):
            if eq:
                out.append(f"{name}={MASK}")
            else:
                out.append(a)
                hide = True
            continue
        out.append(redact_text(a))
    return out


# ----------------------------------------------------------------------------- the launching environment
def passthrough_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{name: value}`` of the pass-through variables (:func:`passthrough_names`) set in ``environ`` (default
    ``os.environ``)."""
    env = os.environ if environ is None else environ
    out = {k: env[k] for k in passthrough_names() if env.get(k)}
    remember(*out.values())
    return out


def launch_env(plan: Any, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{server variable: value}`` a launch of ``plan`` hands to the server's environment: the pass-through
    variables set in ``environ`` (default ``os.environ``), then the values the plan's inputs carried
    (:meth:`~m3ctl.planning.plan.LaunchPlan.secret_values`; they win, as vLLM's flag wins over its variable)."""
    out = passthrough_env(environ)
    out.update(plan.secret_values())
    return out


def given_api_key(api_key_env: str | None, raw_key: str | None) -> tuple[str | None, dict[str, str]]:
    """The API key to launch with (``raw_key``, or the value of the variable named ``api_key_env``) and where it
    came from (``{VLLM_API_KEY: "--api-key-env NAME" | "raw --api-key"}``).

    Raises:
        BadInput: ``api_key_env`` is not a variable name or names an unset variable, or a key given both ways.
    """
    given: dict[str, str] = {}
    if api_key_env is not None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", api_key_env):  # a key passed by mistake is never echoed
            raise BadInput(
                "--api-key-env takes the name of an environment variable that holds the key, not the key itself",
                "export NAME=KEY (e.g. export VLLM_API_KEY=...), then pass --api-key-env NAME",
            )
        if not os.environ.get(api_key_env):
            raise BadInput(f"--api-key-env {api_key_env}: that variable is not set", f"export {api_key_env}=KEY first")
        if raw_key:
            raise BadInput("both --api-key-env and a raw --api-key given", "give the key once")
        raw_key = os.environ[api_key_env]
        given[API_KEY_ENV] = f"--api-key-env {api_key_env}"
    if raw_key:
        given.setdefault(API_KEY_ENV, "raw --api-key")
    return raw_key, given


def source_var(plan: Any, name: str) -> str:
    """The variable of the launching environment that holds the value the server gets as ``name``: the one
    ``serve --api-key-env VAR`` named for :data:`API_KEY_ENV`, else ``name`` itself."""
    if name == API_KEY_ENV and getattr(plan, "api_key_env", None):
        return plan.api_key_env
    return name


def client_key(plan: Any | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The API key a client of a deployment sends (readiness, smoke, watch, bench, tune): from the variable its
    plan took the key from (:func:`source_var`), else :data:`API_KEY_ENV`; None when neither is set."""
    env = os.environ if environ is None else environ
    var = source_var(plan, API_KEY_ENV) if plan is not None else API_KEY_ENV
    key = env.get(var) or env.get(API_KEY_ENV) or None
    remember(key)
    return key


def key_hint(plan: Any | None) -> str:
    """Which key source a keyed deployment expects, for an "unauthorised" message: ``set MY_KEY`` or
    ``set VLLM_API_KEY``, with where the launch took it from."""
    var = source_var(plan, API_KEY_ENV) if plan is not None else API_KEY_ENV
    origin = (getattr(plan, "secret_origins", None) or {}).get(API_KEY_ENV)
    if origin and var == API_KEY_ENV and origin != "the launching environment":  # no variable of the shell held it
        return (
            f"the launch took the key from {origin}, and the running server's environment (where m3ctl reads it) "
            f"cannot be read here: set {API_KEY_ENV} to that key"
        )
    return f"set {var} to the server's API key" + (f" (the launch took it from {origin})" if origin else "")


def auth_headers(
    key: str | None = None, *, secret_env: Mapping[str, str] | None = None, basic: str | None = None
) -> dict[str, str]:
    """The ``Authorization`` header of a client: ``Bearer KEY`` (``key``, else ``secret_env[VLLM_API_KEY]``),
    else ``Basic ...`` (``basic``: base64 ``user:password`` from URL credentials, RFC 7617); ``{}`` when none."""
    key = key or (secret_env or {}).get(API_KEY_ENV)
    if key:
        return {"Authorization": f"Bearer {key}"}
    return {"Authorization": f"Basic {basic}"} if basic else {}


def restart_env(plan: Any, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{server variable: value}`` that relaunches ``plan`` with every secret of its original launch, from
    this environment (each from its :func:`source_var`).

    Raises:
        BadInput: a variable the launch passed is not set here (naming it and where the launch took it from):
            a restart would drop that secret (a keyed server would come back open).
    """
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for name in getattr(plan, "secret_env_names", []) or []:
        var = source_var(plan, name)
        if not env.get(var):
            origin = (getattr(plan, "secret_origins", None) or {}).get(name)
            raise BadInput(
                f"cannot restart {plan.name!r}: its launch passed {name}"
                + (f" (from {origin})" if origin else "")
                + f" and {var} is not set here",
                f"export {var} as at the launch, or watch with --restart no",
            )
        out[name] = env[var]
    remember(*out.values())
    return out


def exposure_warning(host: str, secret_names: Iterable[str]) -> str | None:
    """One line when the server would listen beyond loopback without an API key, else None."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback or API_KEY_ENV in set(secret_names):
        return None
    every = host in ("0.0.0.0", "::")
    return (
        f"--host {host}: the API listens on {'every interface' if every else host} with no API key; anyone "
        "who can reach this host can use the server (serve --api-key-env VAR, or keep --host 127.0.0.1)"
    )


# ----------------------------------------------------------------------------- URL credentials
def split_url_credentials(url: str) -> tuple[str, str | None]:
    """``http://user:pass@host:port/x`` -> (``http://host:port/x``, base64 ``user:pass`` for a Basic header);
    a URL without credentials comes back as is with None. The credentials are :func:`remember` ed."""
    m = _URL_USERINFO.search(url)
    if not m:
        return url, None
    userinfo = m.group("userinfo")
    user, _, pw = userinfo.partition(":")
    remember(userinfo, unquote(pw), unquote(user) if len(user) >= 4 and not pw else None)
    clean = url[: m.start("userinfo")] + url[m.end() :]
    try:
        parts = urlsplit(clean)
        clean = urlunsplit(parts)
    except ValueError:
        pass
    return clean, base64.b64encode(f"{unquote(user)}:{unquote(pw)}".encode()).decode()
