"""Keep secrets (HF tokens, API keys) out of argv, logs, dry-run output and errors.

Secrets only ever travel to the server through environment variables; everything
m3ctl prints or records goes through :func:`redact_env` / :func:`redact_text`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: Environment variable names whose values are secret (matched case-insensitively).
_SECRET_NAME = re.compile(r"(TOKEN|API_KEY|APIKEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.I)
MASK = "***"

# Token shapes that must never be printed even if they slip into free text.
_SECRET_VALUE = re.compile(r"\b(hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_\-]{8,}|Bearer\s+\S+)")


def is_secret_name(name: str) -> bool:
    """True when an environment variable name looks like it carries a secret."""
    return bool(_SECRET_NAME.search(name))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Copy of ``env`` with the values of secret-looking names replaced by ``***``."""
    return {k: (MASK if is_secret_name(k) and v else v) for k, v in env.items()}


def redact_text(text: str, secrets: list[str] | tuple[str, ...] = ()) -> str:
    """Mask known secret values and token-shaped strings (``hf_...``, ``sk-...``, bearer headers)."""
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, MASK)
    return _SECRET_VALUE.sub(MASK, text)


#: The variable vLLM reads its API key from when ``--api-key`` is not given
#: (vllm/entrypoints/serve/middleware/register.py: ``args.api_key or [envs.VLLM_API_KEY]``).
API_KEY_ENV = "VLLM_API_KEY"


def split_api_key(raw_args: list[str]) -> tuple[list[str], str | None]:
    """Take vLLM's ``--api-key KEY`` (or ``--api-key=KEY``) out of raw ``vllm serve`` arguments, so the key
    reaches the server through :data:`API_KEY_ENV` in its environment, never its argv.

    Returns:
        (the arguments without the key, the key or None).

    Raises:
        BadInput: ``--api-key`` without a value, or with several keys (the environment carries one).
    """
    from m3ctl.errors import BadInput  # noqa: PLC0415

    out: list[str] = []
    keys: list[str] = []
    i = 0
    while i < len(raw_args):
        a = raw_args[i]
        if a == "--api-key" or a == "--api_key":
            j = i + 1
            while j < len(raw_args) and not raw_args[j].startswith("-"):
                keys.append(raw_args[j])
                j += 1
            if j == i + 1:
                raise BadInput("raw --api-key has no value", "give one key: -- --api-key KEY, or --api-key-env VAR")
            i = j
            continue
        if a.startswith(("--api-key=", "--api_key=")):
            keys.append(a.split("=", 1)[1])
        else:
            out.append(a)
        i += 1
    if len(keys) > 1:
        raise BadInput(f"raw --api-key has {len(keys)} keys; m3ctl hands one to vLLM through {API_KEY_ENV}",
                       "give one key")
    return out, (keys[0] if keys else None)


#: Secret variables of this environment handed to the server (their values only through its environment).
PASSTHROUGH = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", API_KEY_ENV)


def passthrough_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{name: value}`` of the :data:`PASSTHROUGH` variables set in ``environ`` (default ``os.environ``)."""
    import os  # noqa: PLC0415

    env = os.environ if environ is None else environ
    return {k: env[k] for k in PASSTHROUGH if env.get(k)}
