"""enforcer/'s imports point down: no module imports from a layer above its own or from a sibling
group of the same layer, and no import cycle runs through the modules, function-level imports
included (a lazy import is still a dependency).

The layers, lowest first. A module may import from its own group and from any group of a lower
layer, nothing else.

  0 foundation    enforcer (the package), version, paths, data, v1 (generated), framing (the launch
                  socket's frames), egress_values (the egress filter's settings as plain values, and
                  their validators), text (printing what agents chose), command_start (0-2 held
                  open and no import from the working directory, first thing in a command),
                  quick_dataclass (dataclasses made without compiling what needs no compiling)
  1 egress_settings
                  the egress filter's settings model (pydantic), validated by egress_values
  2 settings      the settings model the commands load (and its pydantic-free launch reader)
  3 policy        the pure policy core: documents in, decisions out, no I/O
  4 documents, keyring, explain
                  reading documents and keys from disk; explaining a compiled policy
  5 audit         the tamper-evident log
  6 sandbox       one module per kernel mechanism, the launch plan and the stage
  7 egress        the egress filter process (runs in namespaces the sandbox layer builds)
  8 session, policy_cache
                  one whole session (sandbox + egress + audit); the compiled-policy cache
  9 launching     one launch from a request (policy, plan, session, refusals): adl-exec's and the
                  daemon's
 10 daemon, client
                  adl-enforcerd; the gRPC client the integrations use
 11 cli, integrations
                  the commands and the agent-framework integrations
"""

from __future__ import annotations

import ast
from pathlib import Path

import enforcer

ROOT = Path(enforcer.__file__).parent

LAYERS: list[tuple[str, ...]] = [
    (
        "enforcer",
        "version",
        "paths",
        "data",
        "v1",
        "framing",
        "egress_values",
        "text",
        "command_start",
        "quick_dataclass",
    ),
    ("egress_settings",),
    ("settings",),
    ("policy",),
    ("documents", "keyring", "explain"),
    ("audit",),
    ("sandbox",),
    ("egress",),
    ("session", "policy_cache"),
    ("launching",),
    ("daemon", "client"),
    ("cli", "integrations"),
]
RANK = {group: rank for rank, groups in enumerate(LAYERS) for group in groups}


def module_name(path: Path) -> str:
    parts = ["enforcer", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py")) if "v1" not in p.relative_to(ROOT).parts}


def group_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "enforcer"


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Every enforcer module `module` imports, at any depth of its code: `from . import x` names the
    submodule x when there is one, else the package."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in known else target)
    return {name for name in found if name == "enforcer" or name.startswith("enforcer.")}


def graph() -> dict[str, set[str]]:
    modules = sources()
    known = set(modules) | {"enforcer.v1"}
    return {module: imports_of(module, path, known) - {module} for module, path in modules.items()}


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = sorted({group_of(m) for m in sources()} - set(RANK))
    assert not unplaced, f"place these in LAYERS (tests/unit/test_layering.py): {unplaced}"


def test_imports_point_down() -> None:
    wrong = []
    for module, targets in graph().items():
        source = group_of(module)
        for target in sorted(targets):
            group = group_of(target)
            if group == source or target == "enforcer":
                continue
            if RANK[group] >= RANK[source]:
                direction = "sideways" if RANK[group] == RANK[source] else "up"
                where = f"{source} is layer {RANK[source]}, {group} {RANK[group]}"
                wrong.append(f"{module} -> {target} ({direction}: {where})")
    assert not wrong, "imports that do not point down:\n" + "\n".join(wrong)


def test_no_import_cycle() -> None:
    """Between modules (a package's __init__ that re-exports its own submodules aside: importing it
    imports them, which is not a dependency of the submodule on its siblings)."""
    edges = {
        module: {t for t in targets if not (sources_is_package(t) and module.startswith(t + "."))}
        for module, targets in graph().items()
    }
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def sources_is_package(module: str) -> bool:
    return (ROOT.joinpath(*module.split(".")[1:]) / "__init__.py").exists() or module == "enforcer"


def test_the_checker_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    """Control: the walker itself finds a lazy relative import that points up."""
    path = tmp_path / "plan.py"
    path.write_text("def f():\n    from ..daemon import service\n    from . import stage\n")
    found = imports_of("enforcer.sandbox.plan", path, {"enforcer.daemon.service", "enforcer.sandbox.stage"})
    assert found == {"enforcer.daemon.service", "enforcer.sandbox.stage"}
    assert RANK[group_of("enforcer.daemon.service")] > RANK[group_of("enforcer.sandbox.plan")]
