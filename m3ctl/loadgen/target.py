"""What a bench run is pointed at: a URL or an m3ctl deployment, its model id, key, log and GPU count.

``m3ctl bench --url/--deployment`` and :func:`m3ctl.api.bench` resolve their endpoint here (one place). A
deployment's key is :func:`launch_key` (m3ctl.serving.watchdog: the one the ``watch`` canary sends too).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from m3ctl.catalog.lazy import lazy_module
from m3ctl.core.secrets import auth_headers, client_key, key_hint, split_url_credentials
from m3ctl.core.state import Registry
from m3ctl.errors import BadInput, M3Error, ServerUnreachable, Unauthorised
from m3ctl.loadgen.config import BenchConfig
from m3ctl.serving.lifecycle import deployment_for_url as lookup
from m3ctl.serving.serve import deployment_gpus, runtime_for, saved_plan
from m3ctl.serving.watchdog import launch_key

if TYPE_CHECKING:
    import httpx
else:
    httpx = lazy_module("httpx")


@dataclass
class BenchTarget:
    """A resolved endpoint.

    Attributes:
        url: base URL without ``/v1`` (e.g. ``http://127.0.0.1:8000``).
        model: the model id requests name (None only when ``resolve_target(lookup_model=False)`` found none to
            take from the deployment: the caller asks :func:`only_model` once its options are checked).
        api_key: bearer key (given, else a deployment's key from the variable its launch took it from, else
            ``OPENAI_API_KEY``, else ``VLLM_API_KEY``: m3ctl.core.secrets.client_key); never stored or shown.
        basic_auth: base64 ``user:password`` of credentials that were in the URL (taken out of ``url``).
        key_hint: which key source the endpoint expects, for an "unauthorised" message.
        model_dir: the deployment's local model directory (a tokenizer fallback), else None.
        server_log: the deployment's server log (JIT compiles in the measured phase), else None.
        sync_log: brings ``server_log`` up to date (runtimes that copy it, e.g. docker), else None.
        num_gpus, num_gpus_source: GPUs behind the endpoint (tok/s per GPU) and where that number came from.
    """

    url: str
    model: str | None
    api_key: str | None = field(default=None, repr=False)
    basic_auth: str | None = field(default=None, repr=False)
    key_hint: str = "set OPENAI_API_KEY or VLLM_API_KEY to the server's API key"
    model_dir: str | None = None
    server_log: str | None = None
    sync_log: Callable[[], None] | None = None
    num_gpus: int | None = None
    num_gpus_source: str | None = None
    argv: tuple[str, ...] = ()
    """The deployment's launch command (a failure's diagnosis is keyed on it)."""
    deployment: str | None = None
    """The m3ctl deployment behind the endpoint (``--deployment``, or the one recorded at ``--url``'s address):
    a run whose requests fail checks its engine (m3ctl.serving.lifecycle) and names a death."""
    deployment_model: str | None = None
    """That deployment's served model name (what :meth:`pick_model` prefers when the server lists several)."""
    gpus: list[int] | None = None
    """That deployment's GPU indices (its saved launch plan's ``gpus``; ``[]``: a CPU plan), None when no plan is
    known: the GPUs bench samples for energy (m3ctl.loadgen.energy)."""

    def headers(self) -> dict[str, str]:
        """The Authorization header this endpoint gets (m3ctl.core.secrets.auth_headers), ``{}`` without a key."""
        return auth_headers(self.api_key, basic=self.basic_auth)

    def pick_model(self) -> tuple[str, str | None]:
        """The model id to benchmark and, when the server lists several names, the one line saying which was
        picked and why (:func:`model_choice`).

        Raises:
            Unauthorised, BadInput: as :func:`model_choice`.
        """
        return model_choice(self.url, self.headers(), self.deployment_model, self.deployment, self.key_hint)


def headers(cfg: BenchConfig) -> dict[str, str]:
    """The Authorization header of a bench run's requests (``cfg.api_key``, else ``cfg.auth_basic``), ``{}``
    without either."""
    return auth_headers(cfg.api_key, basic=cfg.auth_basic)


#: :func:`http_failure`'s words for a host name that does not resolve (bad input, not a server that is down).
DNS_FAILURE = "the host name does not resolve"


def http_failure(e: Exception) -> str:
    """What went wrong with an HTTP request, in words (httpx exception classes:
    https://www.python-httpx.org/exceptions/): refused, timed out, or not the JSON an OpenAI server answers."""
    text = str(e).lower()
    if isinstance(e, httpx.ConnectError):
        if "refused" in text:
            return "connection refused (nothing listens there)"
        if "name or service not known" in text or "nodename" in text or "resolution" in text:
            return DNS_FAILURE
        return f"cannot connect ({str(e)[:120] or type(e).__name__})"
    if isinstance(e, httpx.TimeoutException):
        return "no answer within the timeout"
    if isinstance(e, httpx.HTTPError):
        return f"{type(e).__name__}: {str(e)[:120]}"
    return "the answer is not an OpenAI /v1/models list"


#: What to do when nothing answers at a server's URL (:func:`unreachable`).
UNREACHABLE_HINT = "start the server (`m3ctl serve`) or check --url: `m3ctl status` lists what runs and where"


def unreachable(url: str, e: Exception) -> M3Error:
    """The error for a request to ``url`` that reached no server (``e``: the httpx error): a host name that does not
    resolve is :class:`BadInput` (a typo in --url, exit 2); anything else (connection refused: nothing listens
    there; timed out; dropped) is :class:`ServerUnreachable` (exit 6): the command was right, the server is not up."""
    why = http_failure(e)
    if why == DNS_FAILURE:
        return BadInput(f"cannot reach {url}: {why}", "check the host name in --url")
    return ServerUnreachable(f"cannot reach {url}: {why}", UNREACHABLE_HINT)


def model_choice(
    url: str,
    headers: dict[str, str] | None = None,
    preferred: str | None = None,
    deployment: str | None = None,
    key_hint: str | None = None,
) -> tuple[str, str | None]:
    """The model id to benchmark at ``url`` (``GET /v1/models``) and a note naming the choice (None when the server
    lists one name). Of several names (m3ctl's servers answer to the model and to the deployment's name), the
    deployment's model ``preferred`` when listed, else the first listed, as ``vllm bench serve`` takes the first
    (vllm/benchmarks/serve.py ``get_first_model_from_server``: ``data["data"][0]["id"]``;
    https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/benchmarks/serve.py).

    Raises:
        Unauthorised: the server answers 401/403 (``key_hint`` says which key it expects).
        BadInput: the list cannot be read, or the server lists no model (then pass the model).
    """

    try:
        r = httpx.get(f"{url}/v1/models", headers=headers or {}, timeout=10)
        if r.status_code in (401, 403):
            raise Unauthorised(
                f"{url}/v1/models answered {r.status_code}: the server requires an API key "
                + ("and this one was refused" if headers else "and none was sent"),
                key_hint or "set OPENAI_API_KEY or VLLM_API_KEY to the server's API key",
            )
        ids = [m["id"] for m in r.json()["data"]]
    except httpx.TransportError as e:  # nothing answered: --model would not help
        raise unreachable(url, e) from None
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise BadInput(
            f"cannot list models at {url}/v1/models: {http_failure(e)}", "check --url, or pass --model"
        ) from None
    if not ids:
        raise BadInput(f"{url} serves no model (/v1/models lists none)", "check --url, or pass --model")
    if len(ids) == 1:
        return ids[0], None
    names = ", ".join(map(repr, ids))
    if preferred is not None and preferred in ids:
        return preferred, (
            f"model {preferred!r}: the model of deployment {deployment!r} ({url} answers to {names}; "
            "--model picks another)"
        )
    return ids[0], (
        f"model {ids[0]!r}: the first of the {len(ids)} names {url}/v1/models lists ({names}), as "
        "vllm bench serve takes; --model picks another"
    )


def only_model(url: str, headers: dict[str, str] | None = None, key_hint: str | None = None) -> str:
    """The model id to benchmark at ``url``: :func:`model_choice` without a deployment (the first name listed).

    Raises:
        Unauthorised, BadInput: as :func:`model_choice`.
    """
    return model_choice(url, headers, key_hint=key_hint)[0]


def deployment_for_url(url: str):
    """The m3ctl deployment (:class:`~m3ctl.core.state.Deployment`) listening at ``url``, else None: the one lookup,
    :func:`m3ctl.serving.lifecycle.deployment_for_url`."""
    try:
        return lookup(url)
    except OSError:
        return None


def resolve_target(
    url: str | None = None,
    *,
    deployment: str | None = None,
    model: str | None = None,
    num_gpus: int | None = None,
    api_key: str | None = None,
    lookup_model: bool = True,
) -> BenchTarget:
    """The endpoint of a bench run: ``url``, or the m3ctl deployment named ``deployment`` (its URL, served model,
    API key, model directory, log and GPU count from its saved plan); ``model`` defaults to the deployment's
    model, else to the model :meth:`BenchTarget.pick_model` picks from ``/v1/models`` (the model of the deployment
    listening at ``url`` when m3ctl knows one, else the first listed; ``lookup_model=False``: left None, nothing is
    sent); ``num_gpus`` given wins over the deployment's. ``api_key`` given wins over the environment.

    Raises:
        BadInput: neither ``url`` nor ``deployment``, or both; an unknown deployment (NotFound); no model to pick;
            an empty ``model``.
    """
    if model is not None and not model.strip():
        raise BadInput("--model is empty", "give the served model's id, or leave --model out (the server's own)")
    if url and deployment:  # which one was meant is a guess: the deployment's URL, or another server's
        raise BadInput("--url and --deployment both name the endpoint", "give one of them")
    gpus_source = "--num-gpus" if num_gpus else None
    basic = None
    if url:  # credentials in the URL go to the Authorization header, never into results or messages
        url, basic = split_url_credentials(url)
    key = api_key
    hint = BenchTarget.key_hint
    model_dir = server_log = sync_log = None
    argv: tuple[str, ...] = ()
    gpus: list[int] | None = None
    if deployment:
        reg = Registry()
        dep = reg.get(deployment)
        url, model = url or dep.url, model or dep.served_model_name
        plan = saved_plan(reg, deployment)
        gpus = list(plan.gpus) if plan is not None else None
        key = key or launch_key(dep, plan) or os.environ.get("OPENAI_API_KEY")  # the deployment's own key first
        hint = key_hint(plan)
        model_dir = dep.model if Path(dep.model).is_dir() else None  # tokenizer fallback without /tokenize
        server_log = dep.log_path  # JIT compiles during the measured phase (docker: the log is synced first)
        argv = tuple(dep.argv)
        if dep.runtime != "process":
            sync_log = lambda: runtime_for(dep).sync_log(dep)
        if not num_gpus and (n := deployment_gpus(reg, deployment)):
            num_gpus, gpus_source = n, f"deployment {deployment}: tp x pp x dp x pcp (DCP adds none)"
    else:
        key = key or os.environ.get("OPENAI_API_KEY") or client_key(None)
    if not url:
        raise BadInput("no endpoint given", "pass --url http://HOST:PORT or --deployment NAME")
    url = url.rstrip("/").removesuffix("/v1")
    dep_name, dep_model = deployment, (model if deployment else None)
    if not deployment and (known := deployment_for_url(url)) is not None:  # its engine's death gets named
        dep_name, dep_model = known.name, model or known.served_model_name  # the model the record says it serves
        gpus = _plan_gpus(known.name)
    t = BenchTarget(
        url=url,
        model=model,
        api_key=key,
        basic_auth=basic,
        key_hint=hint,
        model_dir=model_dir,
        server_log=server_log,
        sync_log=sync_log,
        num_gpus=num_gpus,
        num_gpus_source=gpus_source,
        argv=argv,
        deployment=dep_name,
        deployment_model=dep_model,
        gpus=gpus,
    )
    if not model and lookup_model:
        t.model = t.pick_model()[0]
    return t


def _plan_gpus(name: str) -> list[int] | None:
    """The GPU indices of deployment ``name``'s saved launch plan, None when it has none (or it is unreadable: the
    bench of a URL does not fail on it)."""
    try:
        plan = saved_plan(Registry(), name)
    except (M3Error, OSError):
        return None
    return list(plan.gpus) if plan is not None else None


__all__ = ["BenchTarget", "deployment_for_url", "headers", "launch_key", "model_choice", "only_model", "resolve_target"]
