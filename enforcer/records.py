"""`dataclass`, as the standard library's, made faster at import.

Creating a dataclass compiles the source of every method it generates (`__init__`, `__repr__`,
`__eq__`, `__hash__`, and `__setattr__` and `__delattr__` for a frozen one): one `exec` each, which
together are a large part of importing the launch path, paid by every adl-exec. Four of them do not
depend on the class's source at all, only on its fields: here they are closures over the field
names, built without compiling anything. `__init__` and `__eq__` are generated as before.

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
}
_SUPPORTED = (
    sys.version_info[:2] in ((3, 11), (3, 12))
    and callable(getattr(dataclasses, "_recursive_repr", None))
    and all(
        getattr(getattr(dataclasses, name, None), "__code__", None) is not None
        and getattr(dataclasses, name).__code__.co_varnames[: len(params)] == params
        for name, params in _REPLACED.items()
    )
)
_SWAP = _thread.allocate_lock()  # one class at a time swaps the module's helpers


def _repr_fn(fields: list[dataclasses.Field[Any]], globals: dict[str, Any]) -> Callable[[Any], str]:
    names = tuple(f.name for f in fields)

    def __repr__(self: Any) -> str:
        return self.__class__.__qualname__ + "(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in names) + ")"

    return dataclasses._recursive_repr(__repr__)  # type: ignore[attr-defined]


def _hash_fn(fields: list[dataclasses.Field[Any]], globals: dict[str, Any]) -> Callable[[Any], int]:
    # hash of the same tuple the generated method hashes: (self.a, self.b, ...)
    if not fields:

        def __hash__(self: Any) -> int:
            return hash(())

    elif len(fields) == 1:
        name = fields[0].name

        def __hash__(self: Any) -> int:
            return hash((getattr(self, name),))

    else:
        values = operator.attrgetter(*(f.name for f in fields))

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


_OURS = {"_repr_fn": _repr_fn, "_hash_fn": _hash_fn, "_frozen_get_del_attr": _frozen_get_del_attr}


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
