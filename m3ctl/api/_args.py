"""Argument checking of the API functions: :func:`pydantic.validate_call` against each annotation, one BadInput line.

The verbs' modules import their argument types under ``TYPE_CHECKING`` (``m3ctl plan`` must not import the load
generator to read ``bench``'s annotations): a verb's annotations are resolved on its first call, each name from
the verb's module, else a public name of :mod:`m3ctl.api` (imported then, from its home), else pydantic's
(``StrictInt``).
"""

from __future__ import annotations

import builtins
import functools
import inspect
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, get_args, get_type_hints

import pydantic
from pydantic import ConfigDict, ValidationError, validate_call

from m3ctl import api
from m3ctl.errors import BadInput, argument_error

#: lax (``"8000"`` is a port, ``"abc"`` is not); types that are no pydantic model (a LaunchPlan) by isinstance.
_CONFIG = ConfigDict(arbitrary_types_allowed=True)


class _ApiNames(Mapping[str, Any]):
    """The names an API annotation may use besides its module's (``globalns``, looked up after this mapping, and
    the builtins): the public names of :mod:`m3ctl.api` (each imported from its home when an annotation names
    it) and pydantic's (``StrictInt``)."""

    def __init__(self, globalns: dict[str, Any]) -> None:
        self.globalns = globalns

    def __getitem__(self, name: str) -> Any:
        if name in self.globalns or hasattr(builtins, name):
            raise KeyError(name)  # the module's own name, as get_type_hints finds it
        if name in api.__all__:
            return getattr(api, name)
        if name in pydantic.__all__:
            return getattr(pydantic, name)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _takes_bool(hint: Any) -> bool:
    """Whether an annotation admits ``True``/``False`` (``bool``, ``Any``, a ``Literal`` of them, or a union or
    ``Annotated`` holding one): elsewhere pydantic's lax mode would read ``True`` as the number 1."""
    if hint is bool or hint is Any or hint is True or hint is False:
        return True
    return any(_takes_bool(a) for a in get_args(hint))


def _validated(fn: Callable) -> tuple[dict[str, Any], Callable]:
    """The resolved annotations of ``fn``'s parameters and ``validate_call`` of ``fn`` under them (the return type
    is not checked, so it is not resolved): a copy of ``fn`` carries them, ``fn`` itself is left as written."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__module__, copy.__qualname__ = fn.__module__, _title(fn)  # the title of its ValidationErrors
    copy.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != "return"}
    hints = get_type_hints(copy, localns=_ApiNames(fn.__globals__), include_extras=True)
    copy.__annotations__ = hints
    return hints, validate_call(config=_CONFIG)(copy)


def _title(fn: Callable) -> str:
    """The title of the ValidationErrors of ``fn``'s arguments: a ValidationError that ``fn`` itself raises (a model
    it builds) has another and passes through unchanged."""
    return f"arguments of m3ctl.api.{fn.__name__}"


def _arg_name(sig: inspect.Signature, loc: str | int) -> str:
    """The parameter of an error's first ``loc`` (a name, or the index of a positional argument)."""
    if isinstance(loc, str):
        return loc
    positional = [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if loc < len(positional):
        return positional[loc].name
    return next(p.name for p in sig.parameters.values() if p.kind is p.VAR_POSITIONAL)


def _checked(fn):
    """``fn`` with its arguments checked by :func:`pydantic.validate_call` (lax: ``"8000"`` is a port, ``"abc"``
    is not) before the call: a wrong type is one :class:`~m3ctl.errors.BadInput` line naming the argument
    (``m3ctl.plan(port='abc'): ...``), never a TypeError/AttributeError from deep inside. Values (ranges, names)
    are checked by the library as the CLI's are; ``**knobs``/``**options`` by the model they feed (PlanRequest,
    BenchConfig). Coroutine functions (``abench``) are checked when awaited.

    What validate_call alone would do otherwise, kept here: a wrong call (a missing or unknown argument) reads as
    Python's own TypeError text; ``True``/``False`` is refused where a number is expected (lax pydantic reads
    ``True`` as 1); annotations named under ``TYPE_CHECKING`` are resolved on the first call (:class:`_ApiNames`).
    """
    sig = inspect.signature(fn)
    built: dict[str, Any] = {}

    def check(args: tuple, kwargs: dict) -> Callable:
        """The validating call of ``fn`` (built on the first call) once ``args``/``kwargs`` bind and no switch
        stands for a number."""
        if not built:
            hints, call = _validated(fn)
            built.update(hints=hints, call=call)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise BadInput(f"m3ctl.{fn.__name__}(): {e}", f"see help(m3ctl.api.{fn.__name__})") from None
        for name, value in bound.arguments.items():
            if sig.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                continue  # **knobs/**options: checked by the model they feed
            if (value is True or value is False) and not _takes_bool(built["hints"][name]):
                raise BadInput(
                    f"m3ctl.{fn.__name__}({name}={value}): a switch where a value is expected",
                    f"see help(m3ctl.api.{fn.__name__}) for the type and unit of {name}",
                )
        return built["call"]

    def bad(e: ValidationError, args: tuple, kwargs: dict) -> BadInput:
        """The first error of ``e`` as one line naming the argument and its value as given."""
        err = e.errors()[0]
        name = _arg_name(sig, err["loc"][0])
        value = sig.bind(*args, **kwargs).arguments[name]
        return argument_error(
            f"m3ctl.{fn.__name__}",
            name,
            value,
            err["msg"],
            f"see help(m3ctl.api.{fn.__name__}) for the type and unit of {name}",
        )

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def acall(*args, **kwargs):
            call = check(args, kwargs)
            try:
                return await call(*args, **kwargs)
            except ValidationError as e:
                if e.title != _title(fn):
                    raise
                raise bad(e, args, kwargs) from None

        return acall

    @functools.wraps(fn)
    def call(*args, **kwargs):
        validated = check(args, kwargs)
        try:
            return validated(*args, **kwargs)
        except ValidationError as e:
            if e.title != _title(fn):
                raise
            raise bad(e, args, kwargs) from None

    return call
