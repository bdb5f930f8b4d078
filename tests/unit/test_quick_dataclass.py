"""enforcer.quick_dataclass.dataclass: the standard library's dataclasses, with all methods but __init__ made without
compiling source. Each class shape below is made both ways and must behave the same."""

from __future__ import annotations

import dataclasses
import pickle
import sys
from typing import Any, ClassVar

import pytest

from enforcer import quick_dataclass
from enforcer.policy import model
from enforcer.sandbox import plan

FAST = sys.version_info[:2] in ((3, 11), (3, 12))
NAN = float("nan")  # one object: a NaN's hash is its identity's


def shapes(make: Any) -> dict[str, type]:
    """The same class definitions, made by `make` (dataclasses.dataclass or quick_dataclass.dataclass)."""

    @make(frozen=True)
    class Frozen:
        a: int
        b: str = "x"
        c: list[int] = dataclasses.field(default_factory=list, compare=False)
        d: float = dataclasses.field(default=0.0, repr=False)

    @make(frozen=True)
    class Empty:
        pass

    @make(frozen=True)
    class One:
        value: float

    @make(frozen=True)
    class Child(Frozen):
        e: int = 5

    @make
    class Plain:
        a: int
        b: list[Any] = dataclasses.field(default_factory=list)

    @make(unsafe_hash=True)
    class Hashed:
        a: int
        b: int = dataclasses.field(default=0, hash=False)

    @make(frozen=True, eq=False)
    class NoEq:
        a: int

    @make(order=True)
    class Ordered:
        a: int
        b: str = dataclasses.field(default="", compare=False)

    @make(frozen=True, repr=False)
    class OwnRepr:
        a: int

        def __repr__(self) -> str:
            return "own"

    return {c.__name__: c for c in (Frozen, Empty, One, Child, Plain, Hashed, NoEq, Ordered, OwnRepr)}


def instances(classes: dict[str, type]) -> list[Any]:
    plain = classes["Plain"](1)
    plain.b.append(plain)  # a recursive repr
    return [
        classes["Frozen"](1, "y", [2], 1.5),
        classes["Empty"](),
        classes["One"](NAN),
        classes["Child"](1, "y", [3], 2.5, 9),
        plain,
        classes["Hashed"](1, 2),
        classes["NoEq"](1),
        classes["Ordered"](1, "z"),
        classes["OwnRepr"](1),
    ]


def behaviour(obj: Any) -> dict[str, Any]:
    """Everything observable of an instance, as comparable values (class names, not classes)."""
    out: dict[str, Any] = {"repr": repr(obj), "fields": [f.name for f in dataclasses.fields(obj)]}
    try:
        out["hash"] = "identity" if hash(obj) == object.__hash__(obj) else hash(obj)
    except TypeError as exc:
        out["hash"] = f"TypeError: {exc}"
    out["eq_self"] = obj == obj
    out["eq_copy"] = obj == dataclasses.replace(obj)
    out["eq_other_type"] = obj.__eq__(object())
    for name in ("a", "zz"):
        try:
            setattr(obj, name, 7)
            out[f"set {name}"] = "ok"
        except dataclasses.FrozenInstanceError as exc:
            out[f"set {name}"] = f"FrozenInstanceError: {exc}"
        try:
            delattr(obj, name)
            out[f"del {name}"] = "ok"
        except dataclasses.FrozenInstanceError as exc:
            out[f"del {name}"] = f"FrozenInstanceError: {exc}"
        except AttributeError as exc:
            out[f"del {name}"] = f"AttributeError: {exc}"
    try:
        out["after"] = repr(obj)
    except AttributeError as exc:  # a plain record whose field was deleted
        out["after"] = f"AttributeError: {exc}"
    return out


def test_every_shape_behaves_as_the_standard_librarys() -> None:
    ours, theirs = instances(shapes(quick_dataclass.dataclass)), instances(shapes(dataclasses.dataclass))
    for mine, reference in zip(ours, theirs, strict=True):
        assert behaviour(mine) == behaviour(reference), type(mine).__name__


def test_the_classes_are_dataclasses_with_the_same_parameters() -> None:
    ours, theirs = shapes(quick_dataclass.dataclass), shapes(dataclasses.dataclass)
    for name, cls in ours.items():
        reference = theirs[name]
        assert dataclasses.is_dataclass(cls)
        assert repr(cls.__dataclass_params__) == repr(reference.__dataclass_params__)  # type: ignore[attr-defined]
        assert cls.__match_args__ == reference.__match_args__  # type: ignore[attr-defined]
        assert cls.__doc__ == reference.__doc__
        for method in ("__repr__", "__eq__", "__lt__", "__hash__", "__setattr__", "__delattr__"):
            mine, reference_method = cls.__dict__.get(method), reference.__dict__.get(method)
            assert (mine is None) == (reference_method is None), (name, method)
            if callable(mine):
                assert mine.__qualname__ == reference_method.__qualname__  # type: ignore[union-attr]


def test_hashes_and_equality_agree_across_the_two() -> None:
    ours, theirs = shapes(quick_dataclass.dataclass), shapes(dataclasses.dataclass)
    # The same identical-NaN rule: a field holding the very same NaN object compares (and hashes) equal.
    assert ours["One"](NAN) == ours["One"](NAN)
    assert theirs["One"](NAN) == theirs["One"](NAN)
    assert hash(ours["One"](NAN)) == hash(theirs["One"](NAN))
    assert ours["One"](float("nan")) != ours["One"](float("nan"))
    assert theirs["One"](float("nan")) != theirs["One"](float("nan"))
    assert hash(ours["Frozen"](1, "y", [9])) == hash(theirs["Frozen"](1, "y", [1]))  # c is not compared
    assert hash(ours["Child"](1)) == hash(theirs["Child"](1))
    assert hash(ours["Hashed"](1, 2)) == hash(theirs["Hashed"](1, 3))  # b is not hashed
    assert ours["Frozen"](1, "y", [9]) == ours["Frozen"](1, "y", [1])  # c is not compared
    assert ours["Frozen"](1, "y") != ours["Frozen"](1, "z")
    assert ours["Child"](1) != ours["Frozen"](1)  # another class: NotImplemented both ways
    assert ours["Ordered"](1, "x") < ours["Ordered"](2, "a") and ours["Ordered"](1, "x") == ours["Ordered"](1, "y")


@pytest.mark.skipif(not FAST, reason="the standard library makes them on this Python")
def test_only_init_is_compiled_per_class() -> None:
    cls = shapes(quick_dataclass.dataclass)["Frozen"]
    for method in ("__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__"):
        function = getattr(cls.__dict__[method], "__wrapped__", cls.__dict__[method])
        assert function.__code__.co_filename == quick_dataclass.__file__, method
    assert cls.__dict__["__init__"].__code__.co_filename == "<string>"  # still generated


def test_the_standard_library_is_left_as_it_was() -> None:
    helpers = {name: getattr(dataclasses, name) for name in ("_repr_fn", "_hash_fn", "_frozen_get_del_attr", "_cmp_fn")}
    shapes(quick_dataclass.dataclass)
    assert {name: getattr(dataclasses, name) for name in helpers} == helpers
    assert all(function.__module__ == "dataclasses" for function in helpers.values())


def test_the_launch_paths_records_pickle_and_compare_as_before() -> None:
    limits = model.ResourceLimits(max_memory_mb=64, max_duration_sec=10)
    assert pickle.loads(pickle.dumps(limits)) == limits
    assert hash(pickle.loads(pickle.dumps(limits))) == hash(limits)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'max_memory_mb'"):
        limits.max_memory_mb = 1  # type: ignore[misc]
    layer = plan.Layer("files", "landlock", "active", ["a"])
    assert dataclasses.asdict(layer) == {"name": "files", "mechanism": "landlock", "status": "active", "details": ["a"]}


def test_a_record_made_while_another_is_made_gets_the_same_methods() -> None:
    """A class whose processing makes another (here from a default's descriptor, which the
    dataclasses module reads) neither deadlocks nor leaves the helpers swapped."""

    class MakesOne:
        made: ClassVar[list[type]] = []

        def __get__(self, obj: object, owner: type | None = None) -> int:
            if not self.made:
                self.made.append(shapes(quick_dataclass.dataclass)["Frozen"])
            return 0

    @quick_dataclass.dataclass(frozen=True)
    class Outer:
        a: int = MakesOne()  # type: ignore[assignment]

    inner = MakesOne.made[0]
    assert behaviour(inner(1, "y", [2], 1.5)) == behaviour(shapes(dataclasses.dataclass)["Frozen"](1, "y", [2], 1.5))
    assert repr(Outer()) == "test_a_record_made_while_another_is_made_gets_the_same_methods.<locals>.Outer(a=0)"
    test_the_standard_library_is_left_as_it_was()
