"""Argument checking of the API functions: each argument against its annotation, one BadInput line."""

from __future__ import annotations

from typing import Any, get_args

from m3ctl.errors import BadInput


# ----------------------------------------------------------------------------- argument types
def _type_namespace(fn: Any) -> dict[str, Any]:
    """The names the annotations of ``fn``'s module refer to (those under TYPE_CHECKING imported now, on first call)."""
    from pydantic import StrictInt  # noqa: PLC0415

    from m3ctl.assess.request import PlanRequest  # noqa: PLC0415
    from m3ctl.checks.doctor import DoctorReport  # noqa: PLC0415
    from m3ctl.hw.inventory import HostInventory  # noqa: PLC0415
    from m3ctl.loadgen.runner import BenchConfig  # noqa: PLC0415
    from m3ctl.planning.plan import LaunchPlan  # noqa: PLC0415
    from m3ctl.results import BenchResult, BenchSweep, TuneReport  # noqa: PLC0415
    from m3ctl.runtime.base import StopReport  # noqa: PLC0415
    from m3ctl.serving.serve import ServeResult  # noqa: PLC0415

    return {
        **fn.__globals__,
        "StrictInt": StrictInt,
        **{
            c.__name__: c
            for c in (
                PlanRequest,
                BenchConfig,
                DoctorReport,
                HostInventory,
                LaunchPlan,
                BenchResult,
                BenchSweep,
                TuneReport,
                StopReport,
                ServeResult,
            )
        },
    }


def _takes_bool(hint: Any) -> bool:
    """Whether an annotation admits ``True``/``False`` (``bool``, ``Any``, a ``Literal`` of them, or a union or
    ``Annotated`` holding one): elsewhere pydantic's lax mode would read ``True`` as the number 1."""
    if hint is bool or hint is Any or hint is True or hint is False:
        return True
    return any(_takes_bool(a) for a in get_args(hint))


def _checked(fn):
    """Check every argument of the API function ``fn`` against its annotation (pydantic, lax: ``"8000"`` is a port,
    ``"abc"`` is not) before the call: a wrong type is one :class:`~m3ctl.errors.BadInput` line naming the
    argument, never a TypeError/AttributeError from deep inside. Values (ranges, names) are checked by the
    library as the CLI's are; ``**knobs``/``**options`` by the model they feed (PlanRequest, BenchConfig)."""
    import functools  # noqa: PLC0415
    import inspect  # noqa: PLC0415

    sig = inspect.signature(fn)
    adapters: dict[str, Any] = {}
    hints: dict[str, Any] = {}

    def check(args, kwargs):
        if not adapters:
            from typing import get_type_hints  # noqa: PLC0415

            from pydantic import ConfigDict, TypeAdapter  # noqa: PLC0415

            hints.update(get_type_hints(fn, globalns=_type_namespace(fn), include_extras=True))  # keep Strict*
            cfg = ConfigDict(arbitrary_types_allowed=True)
            for name, par in sig.parameters.items():
                if name in hints and par.kind is not par.VAR_KEYWORD:
                    t = tuple[hints[name], ...] if par.kind is par.VAR_POSITIONAL else hints[name]
                    adapters[name] = TypeAdapter(t, config=cfg)
        from pydantic import ValidationError  # noqa: PLC0415

        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise BadInput(f"m3ctl.{fn.__name__}(): {e}", f"see help(m3ctl.api.{fn.__name__})") from None
        for name, value in bound.arguments.items():
            if name not in adapters or value is None and sig.parameters[name].default is None:
                continue
            if (value is True or value is False) and not _takes_bool(hints[name]):  # lax pydantic: True is 1
                raise BadInput(
                    f"m3ctl.{fn.__name__}({name}={value}): a switch where a value is expected",
                    f"see help(m3ctl.api.{fn.__name__}) for the type and unit of {name}",
                )
            try:
                bound.arguments[name] = adapters[name].validate_python(value)
            except ValidationError as e:
                err = e.errors()[0]
                shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
                raise BadInput(
                    f"m3ctl.{fn.__name__}({name}={shown}): {err['msg']}",
                    f"see help(m3ctl.api.{fn.__name__}) for the type and unit of {name}",
                ) from None
        return bound

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def acall(*args, **kwargs):
            bound = check(args, kwargs)
            return await fn(*bound.args, **bound.kwargs)

        return acall

    @functools.wraps(fn)
    def call(*args, **kwargs):
        bound = check(args, kwargs)
        return fn(*bound.args, **bound.kwargs)

    return call
