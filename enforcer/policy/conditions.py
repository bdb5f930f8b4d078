"""AAIF structured conditions, evaluated deterministically.

Supported: always, never, jsonpath (jsonpath-ng), jmespath, jsonlogic (panzi-json-logic, with its
side-effecting `log` operation removed). CEL is not evaluated here: a CEL condition is an
"unsupported condition language" and is handled per the agent's safety_level by the compiler.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from ..quick_dataclass import dataclass

# Each language's library is imported by the first condition in it: most documents have none.
SUPPORTED_LANGUAGES = frozenset({"always", "never", "jsonpath", "jmespath", "jsonlogic"})


@cache
def _jsonlogic_operations() -> dict[str, Any]:
    from json_logic.builtins import BUILTINS

    return {k: v for k, v in BUILTINS.items() if k != "log"}


class UnsupportedCondition(ValueError):
    """The condition's language is not evaluated here, or its expression does not compile."""


@dataclass(frozen=True)
class CompiledCondition:
    lang: str
    source: Any
    _evaluate: Callable[[Any], bool]

    def __call__(self, context: Any) -> bool:
        try:
            return bool(self._evaluate(context))
        except Exception:
            return True

    def __reduce__(self) -> tuple[Any, ...]:
        # The evaluator is a closure: a copy (the policy cache) compiles the source again.
        return (compile_condition, (self.source,))


def _truthy(value: Any) -> bool:
    return value not in (None, False, "", [], {}, 0)


def compile_condition(condition: Any) -> CompiledCondition:
    """Compile a structured condition; raise UnsupportedCondition for what cannot be evaluated."""
    if not isinstance(condition, dict):
        raise UnsupportedCondition("a natural-language condition is a hint, not an expression")
    lang = condition.get("lang")
    expr = condition.get("expr")
    if lang == "always":
        return CompiledCondition(lang, condition, lambda _ctx: True)
    if lang == "never":
        return CompiledCondition(lang, condition, lambda _ctx: False)
    if lang == "jsonpath":
        if not isinstance(expr, str):
            raise UnsupportedCondition("jsonpath expr must be a string")
        from jsonpath_ng.ext import parse as jsonpath_parse

        try:
            compiled = jsonpath_parse(expr)
        except Exception as exc:  # jsonpath-ng raises JsonPathParserError and, for some input, others
            raise UnsupportedCondition(f"jsonpath {expr!r} does not parse: {exc}") from exc
        return CompiledCondition(lang, condition, lambda ctx: any(_truthy(m.value) for m in compiled.find(ctx)))
    if lang == "jmespath":
        if not isinstance(expr, str):
            raise UnsupportedCondition("jmespath expr must be a string")
        import jmespath

        try:
            jm = jmespath.compile(expr)
        except jmespath.exceptions.JMESPathError as exc:
            raise UnsupportedCondition(f"jmespath {expr!r} does not parse: {exc}") from exc
        return CompiledCondition(lang, condition, lambda ctx: _truthy(jm.search(ctx)))
    if lang == "jsonlogic":
        if not isinstance(expr, dict | bool):
            raise UnsupportedCondition("jsonlogic expr must be a rule object")
        import json_logic

        operations = _jsonlogic_operations()
        return CompiledCondition(lang, condition, lambda ctx: _truthy(json_logic.jsonLogic(expr, ctx, operations)))
    raise UnsupportedCondition(f"condition language {lang!r} is not evaluated by this enforcer")
