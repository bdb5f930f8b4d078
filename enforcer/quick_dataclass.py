"""`dataclass`, as the standard library's, made faster at import.

Creating a dataclass compiles the source of every method it generates (`__init__`, `__repr__`,
`__eq__`, `__hash__`, and `__setattr__` and `__delattr__` for a frozen one): one `exec` each, which
together are a large part of importing the launch path, paid by every adl-exec. All but `__init__`
depend only on the class's fields: here they are closures over the field names, built without
compiling anything. `__init__` (its signature and defaults are the class's own) and order=True's
comparisons are compiled by the standard library.

The classes are ordinary dataclasses (`dataclasses.fields`, `replace`, `asdict`, pickling, the
type checker all see them as such) and behave exactly as the standard library's would: same
checks, same exceptions and messages, same hash and repr. Only on the Python versions whose
dataclasses module is known here (3.11 and 3.12); on any other the standard library makes them.
"""

from __future__ import annotations

import _thread
import dataclasses
import operator
import sys
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

_T = TypeVar("_T")

# The dataclasses module's helpers replaced while one of these classes is made, each with its
# parameters as the module calls it; any other shape and the standard library's are used.
_REPLACED = {
    "_repr_fn": ("fields", "globals"),
    "_hash_fn": ("fields", "globals"),
    "_frozen_get_del_attr": ("cls", "fields", "globals"),
    "_cmp_fn": ("name", "op", "self_tuple", "other_tuple", "globals"),
}
# The standard library's guard against a repr that reaches its own object again.
_recursive_repr: Callable[[Callable[[Any], str]], Callable[[Any], str]] | None = getattr(
    dataclasses, "_recursive_repr", None
)
_SUPPORTED = (
    sys.version_info[:2] in ((3, 11), (3, 12))
    and callable(_recursive_repr)
    and all(
        getattr(getattr(dataclasses, name, None), "__code__", None) is not None
        and getattr(dataclasses, name).__code__.co_varnames[: len(params)] == params
        for name, params in _REPLACED.items()
    )
)
_SWAP = _thread.RLock()  # one class at a time swaps the module's helpers (reentrant: a class made while one is)


def _values(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """What the generated methods build as `(self.a, self.b, ...)`: the fields' values as a tuple."""
    if not names:
        return lambda _: ()
    if len(names) == 1:
        name = names[0]
        return lambda obj: (getattr(obj, name),)
    return operator.attrgetter(*names)


def _repr_fn(fields: list[dataclasses.Field[Any]], globals: dict[str, Any]) -> Callable[[Any], str]:
    names = tuple(f.name for f in fields)

    def __repr__(self: Any) -> str:
        return self.__class__.__qualname__ + "(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in names) + ")"

    assert _recursive_repr is not None  # else _SUPPORTED is false and this is never called
    return _recursive_repr(__repr__)


def _hash_fn(fields: list[dataclasses.Field[Any]], globals: dict[str, Any]) -> Callable[[Any], int]:
    values = _values(tuple(f.name for f in fields))

    def __hash__(self: Any) -> int:
        return hash(values(self))

    return __hash__


def _frozen_get_del_attr(
    cls: type[Any], fields: list[dataclasses.Field[Any]], globals: dict[str, Any]
) -> tuple[Callable[..., None], Callable[..., None]]:
    names = tuple(f.name for f in fields)
    frozen_error = dataclasses.FrozenInstanceError

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise frozen_error(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise frozen_error(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __setattr__, __delattr__


def _cmp_fn(name: str, op: str, self_tuple: str, other_tuple: str, globals: dict[str, Any]) -> Callable[..., Any]:
    # __eq__ only (order=True's methods are the standard library's). The module hands the fields over
    # as source text, "(self.a,self.b,)": read back, and used only if it is exactly that.
    names = tuple(part.removeprefix("self.") for part in self_tuple[1:-2].split(",")) if self_tuple != "()" else ()
    if (
        name != "__eq__"
        or op != "=="
        or self_tuple != _tuple_str("self", names)
        or other_tuple != _tuple_str("other", names)
    ):
        return _STANDARD["_cmp_fn"](name, op, self_tuple, other_tuple, globals=globals)
    values = _values(names)

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    return __eq__


def _tuple_str(owner: str, names: tuple[str, ...]) -> str:
    """As the dataclasses module writes a tuple of fields."""
    return "(" + ",".join(f"{owner}.{name}" for name in names) + ",)" if names else "()"


_OURS = {
    "_repr_fn": _repr_fn,
    "_hash_fn": _hash_fn,
    "_frozen_get_del_attr": _frozen_get_del_attr,
    "_cmp_fn": _cmp_fn,
}
_STANDARD: dict[str, Any] = {name: getattr(dataclasses, name, None) for name in _OURS}


def _make(cls: type[_T], options: dict[str, Any]) -> type[_T]:
    if not _SUPPORTED:
        return dataclasses.dataclass(cls, **options)
    with _SWAP:
        saved = {name: getattr(dataclasses, name) for name in _OURS}
        try:
            for name, helper in _OURS.items():
                setattr(dataclasses, name, helper)
            return dataclasses.dataclass(cls, **options)
        finally:
            for name, helper in saved.items():
                setattr(dataclasses, name, helper)


@overload
def dataclass(cls: type[_T], /) -> type[_T]: ...


@overload
def dataclass(
    *,
    init: bool = True,
    repr: bool = True,
    eq: bool = True,
    order: bool = False,
    unsafe_hash: bool = False,
    frozen: bool = False,
    match_args: bool = True,
    kw_only: bool = False,
    slots: bool = False,
) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def dataclass(cls: type[_T] | None = None, /, **options: Any) -> Any:
    """dataclasses.dataclass, with the same options (see the module's docstring)."""
    if cls is None:
        return lambda c: _make(c, options)
    return _make(cls, options)
