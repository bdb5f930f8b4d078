"""decide() against Cedar (cedarpy) and Rego (regopy) on the same large policy, in one run.

Policy: 1,000 tools and 500 host patterns (250 exact names, 250 '*.zone-N' wildcards), port 443.
Each engine gets its idiomatic, pre-parsed form (Cedar: a parsed PolicySet and Entities, tool and
exact-host membership through entity parents; Rego: data documents and a compiled bundle).
Semantics differ at the edges (Cedar's `like` lets '*' cross dots); the workload is the same.

Run: .venv/bin/python bench/decide.py   (needs: pip install -e '.[bench]')

`bench/decide.py scale [ROUNDS]` (no extra packages): decide() on a host matched by one of N host
patterns whose wildcards sit in the same label (`svc-K-*.example.com`, `*-K.example.org`), timed
interleaved (A B A B ...) against the same decide() on a one-pattern policy, with the per-round
ratio; and compile time per pattern at N = 250 ... 4,000 (linear when it stays flat).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from enforcer.policy import CompileOptions, NetworkConnect, SchemaSet, ToolCall, compile_policy, decide, spec_root
from enforcer.policy.loader import MAX_DOCUMENT_BYTES, parse_document

N_TOOLS, N_EXACT, N_WILD = 1000, 250, 250
NOW = datetime(2026, 11, 21, tzinfo=UTC)


def adl_document(pad_to: int = 0) -> dict[str, Any]:
    tools = [
        {
            "name": f"tool_{i}",
            "description": f"tool number {i}",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
        for i in range(N_TOOLS)
    ]
    hosts = [f"svc-{i}.example.com" for i in range(N_EXACT)] + [f"*.zone-{i}.example.net" for i in range(N_WILD)]
    doc = {
        "adl_spec": "0.3.0",
        "name": "Bench",
        "description": "benchmark",
        "version": "1.0.0",
        "data_classification": {"sensitivity": "internal"},
        "tools": tools,
        "permissions": {"network": {"allowed_hosts": hosts, "allowed_ports": [443], "deny_private": True}},
    }
    if pad_to:
        size = len(json.dumps(doc))
        for t in tools:
            t["description"] += " " + "x" * max(0, (pad_to - size) // N_TOOLS - 2)
    return doc


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def pcts(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99) - 1]


def cedar_engine() -> dict[str, Callable[[], Any]]:
    import cedarpy

    wild = "\n".join(
        f'permit(principal, action == Action::"connect", resource) when {{ context.port == 443 && '
        f'context.host like "*.zone-{i}.example.net" }};'
        for i in range(N_WILD)
    )
    policies = cedarpy.PolicySet.from_str(
        'permit(principal, action == Action::"call", resource in ToolGroup::"declared");\n'
        'permit(principal, action == Action::"connect", resource in HostGroup::"allowed") '
        "when { context.port == 443 };\n" + wild
    )
    entities = [
        {"uid": {"type": "Tool", "id": f"tool_{i}"}, "attrs": {}, "parents": [{"type": "ToolGroup", "id": "declared"}]}
        for i in range(N_TOOLS)
    ]
    entities += [
        {
            "uid": {"type": "Host", "id": f"svc-{i}.example.com"},
            "attrs": {},
            "parents": [{"type": "HostGroup", "id": "allowed"}],
        }
        for i in range(N_EXACT)
    ]
    ents = cedarpy.Entities.from_json_str(json.dumps(entities))

    def call(tool: str) -> Callable[[], Any]:
        req = {"principal": 'Agent::"bench"', "action": 'Action::"call"', "resource": f'Tool::"{tool}"', "context": {}}
        return lambda: cedarpy.is_authorized(req, policies, ents).allowed

    def connect(host: str) -> Callable[[], Any]:
        req = {
            "principal": 'Agent::"bench"',
            "action": 'Action::"connect"',
            "resource": f'Host::"{host}"',
            "context": {"host": host, "port": 443},
        }
        return lambda: cedarpy.is_authorized(req, policies, ents).allowed

    return _cases(call, connect)


def rego_engine() -> dict[str, Callable[[], Any]]:
    from regopy import Interpreter

    rego = Interpreter()
    rego.add_module(
        "adl",
        """package adl
import rego.v1
default allow_tool := false
allow_tool if data.tools[input.tool]
default allow_connect := false
allow_connect if {
  input.port == 443
  data.exact_hosts[input.host]
}
allow_connect if {
  input.port == 443
  some pattern in data.wild_hosts
  glob.match(pattern, ["."], input.host)
}
""",
    )
    rego.add_data(
        {
            "tools": {f"tool_{i}": True for i in range(N_TOOLS)},
            "exact_hosts": {f"svc-{i}.example.com": True for i in range(N_EXACT)},
            "wild_hosts": [f"*.zone-{i}.example.net" for i in range(N_WILD)],
        }
    )
    bundle = rego.build(None, ["adl/allow_tool", "adl/allow_connect"])

    def run(entry: str, value: dict[str, Any]) -> Callable[[], Any]:
        def go() -> Any:
            rego.set_input(value)
            return rego.query_bundle_entrypoint(bundle, entry)

        return go

    return _cases(
        lambda tool: run("adl/allow_tool", {"tool": tool}),
        lambda host: run("adl/allow_connect", {"host": host, "port": 443}),
    )


def enforcer_engine() -> dict[str, Callable[[], Any]]:
    policy = compile_policy(adl_document(), None, SchemaSet(spec_root()), NOW, CompileOptions())
    return _cases(
        lambda tool: lambda: decide(policy, ToolCall(tool, {"q": "x"})).verdict,
        lambda host: lambda: decide(policy, NetworkConnect(host, 443, "https")).verdict,
    )


def _cases(call: Callable[[str], Callable[[], Any]], connect: Callable[[str], Callable[[], Any]]) -> dict[str, Any]:
    return {
        "tool allowed": call("tool_777"),
        "tool undeclared": call("tool_x"),
        "connect exact": connect("svc-200.example.com"),
        "connect wildcard": connect("api.zone-200.example.net"),
        "connect denied": connect("evil.example.org"),
    }


def check_agreement(engines: dict[str, dict[str, Callable[[], Any]]]) -> None:
    expected = {
        "tool allowed": True,
        "tool undeclared": False,
        "connect exact": True,
        "connect wildcard": True,
        "connect denied": False,
    }
    for name, cases in engines.items():
        for case, fn in cases.items():
            result = fn()
            got = (
                '"expressions":[true]' in str(result).replace(" ", "") if name == "rego" else result in ("ALLOW", True)
            )
            if got != expected[case]:
                sys.exit(f"{name} disagrees on {case!r}: {result!r}")


def bench_compile() -> tuple[int, float]:
    doc = adl_document(pad_to=MAX_DOCUMENT_BYTES - 20_000)
    data = json.dumps(doc).encode()
    schemas = SchemaSet(spec_root())
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        parsed = parse_document(data, "big.json")
        compile_policy(parsed.document, None, schemas, NOW, CompileOptions())
        runs.append(time.perf_counter() - t0)
    return len(data), statistics.median(runs)


def _host_policy(hosts: list[str]) -> Any:
    doc = {
        "adl_spec": "0.3.0",
        "name": "Bench",
        "description": "benchmark",
        "version": "1.0.0",
        "data_classification": {"sensitivity": "internal"},
        "permissions": {"network": {"allowed_hosts": hosts, "allowed_ports": [443], "deny_private": True}},
    }
    return compile_policy(doc, None, SchemaSet(spec_root()), NOW, CompileOptions())


def scale(rounds: int) -> None:
    from enforcer.policy.patterns import PatternList

    big = _host_policy([f"svc-{i}-*.example.com" for i in range(250)] + [f"*-{i}.example.org" for i in range(250)])
    # (host, verdict, the one pattern of the baseline policy)
    cases = {
        "prefix wildcard": ("svc-200-api.example.com", "ALLOW", "svc-200-*.example.com"),
        "suffix wildcard": ("api-200.example.org", "ALLOW", "*-200.example.org"),
        "denied": ("svc-200.example.net", "DENY", "svc-200-*.example.com"),
    }
    print(f"decide() p50 in microseconds, 500 host patterns vs 1, interleaved, {rounds} rounds of 2000 calls")
    print(f"{'case':<16} {'500 patterns':>13} {'1 pattern':>10}  ratio per round: median (range)")
    for case, (host, verdict, pattern) in cases.items():
        action = NetworkConnect(host, 443, "https")
        one = _host_policy([pattern])
        if decide(big, action).verdict != verdict or decide(one, action).verdict != verdict:
            sys.exit(f"unexpected verdict for {case}")
        big_p50, one_p50, ratios = [], [], []
        for _ in range(rounds):
            a = statistics.median(timed(lambda a=action: decide(big, a), 2000))  # type: ignore[misc]
            b = statistics.median(timed(lambda a=action, p=one: decide(p, a), 2000))  # type: ignore[misc]
            big_p50.append(a)
            one_p50.append(b)
            ratios.append(a / b)
        print(
            f"{case:<16} {statistics.median(big_p50):13.2f} {statistics.median(one_p50):10.2f}  "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        )
    print("compile N same-position wildcard host patterns (PatternList.compile), median of 5")
    for n in (250, 500, 1000, 2000, 4000):
        pats = [f"svc-{i}-*.example.com" for i in range(n)]
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            PatternList.compile(pats, "host")
            runs.append(time.perf_counter() - t0)
        med = statistics.median(runs)
        print(f"  N={n:<5} {med * 1000:7.2f} ms  {med / n * 1e6:5.2f} us per pattern")


def main() -> None:
    if sys.argv[1:2] == ["scale"]:
        scale(int(sys.argv[2]) if len(sys.argv) > 2 else 5)
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    engines = {"enforcer": enforcer_engine(), "cedar": cedar_engine(), "rego": rego_engine()}
    check_agreement(engines)
    results: dict[str, dict[str, tuple[float, float]]] = {}
    for name, cases in engines.items():
        results[name] = {}
        for case, fn in cases.items():
            timed(fn, 200)  # warm-up
            results[name][case] = pcts(timed(fn, n if name != "rego" else max(300, n // 5)))
    print(f"decide(): p50 / p99 in microseconds, {n} iterations (rego: {max(300, n // 5)})")
    print(f"{'case':<18} {'enforcer':>17} {'cedar':>17} {'rego':>19} {'cedar/enf':>10} {'rego/enf':>9}")
    for case in engines["enforcer"]:
        e, c, r = results["enforcer"][case], results["cedar"][case], results["rego"][case]
        print(
            f"{case:<18} {e[0]:7.2f} / {e[1]:7.2f} {c[0]:7.2f} / {c[1]:7.2f} {r[0]:8.1f} / {r[1]:8.1f} "
            f"{c[0] / e[0]:9.1f}x {r[0] / e[0]:8.1f}x"
        )
    size, seconds = bench_compile()
    print(f"compile largest document: {size} bytes (1,000 tools, 500 host patterns) in {seconds:.3f} s (median of 5)")


if __name__ == "__main__":
    main()
