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
