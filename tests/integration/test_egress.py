"""The egress filter from inside real sandboxes, against the tests' own network lab."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from enforcer.audit.query import iter_records

from ..helpers.daemon import RunningDaemon
from ..helpers.netlab import NetLab, needs_nft, payloads
from ..helpers.sandbox import AGENT_USER, Sandbox, needs_root

pytestmark = [needs_root, needs_nft]


def curl(box: Sandbox, *args: str, **kw: Any) -> Any:
    return box.run("curl", "-sS", "--noproxy", "*", "--max-time", "5", *args, **kw)


def test_allowed_host_by_name_over_http_and_https(net_sandbox: Sandbox, netlab: NetLab) -> None:
    r = curl(net_sandbox, "http://api.example.test/")
    assert r.code == 0 and "host=api.example.test" in r.out, r.err
    dns = payloads(r, "net.dns")
    assert dns and all(d["decision"] == "allow" and d["host"] == "api.example.test" for d in dns)
    [connect] = payloads(r, "net.connect")
    assert connect["decision"] == "allow" and connect["rules"] == ["net.allowed"]
    assert connect["protocol"] == "http" and connect["http_host"] == "api.example.test" and connect["port"] == 80
    assert connect["address"] in ("198.51.100.10", "2001:db8:1::10")
    [close] = payloads(r, "net.close")
    assert close["bytes_in"] > 0 and close["bytes_out"] > 0 and close["duration_ms"] >= 0
    assert r.record("exit")["payload"]["network"]["connections"]["allowed"] == 1

    ca = str(netlab.ca_dir / "lab-ca.pem")
    r = curl(net_sandbox, "--cacert", ca, "https://api.example.test/")
    assert r.code == 0 and "host=api.example.test" in r.out, r.err
    [connect] = payloads(r, "net.connect")
    assert connect["protocol"] == "https" and connect["sni"] == "api.example.test" and connect["port"] == 443


def test_denied_host_fails_fast_with_a_clear_error(net_sandbox: Sandbox, netlab: NetLab) -> None:
    started = time.monotonic()
    r = curl(net_sandbox, "http://other.example.test/")
    assert r.code == 6 and "Could not resolve host: other.example.test" in r.err
    assert time.monotonic() - started < 4
    denied = [d for d in payloads(r, "net.dns") if d["decision"] == "deny"]
    assert denied and denied[0]["host"] == "other.example.test" and denied[0]["rules"] == ["net.dns_name_not_allowed"]
    assert not [e for e in netlab.server_events() if e.get("dns") == "other.example.test"], (
        "a denied name went upstream"
    )


def test_wildcard_matches_exactly_one_label(net_sandbox: Sandbox) -> None:
    code = (
        "import json, urllib.request\n"
        "out = {}\n"
        "for host in ['a.sub.example.test', 'b.sub.example.test', 'sub.example.test', 'deep.x.sub.example.test']:\n"
        "    try:\n"
        "        out[host] = urllib.request.urlopen(f'http://{host}/', timeout=3).read().decode()\n"
        "    except Exception as exc:\n"
        "        out[host] = 'ERROR ' + repr(exc)\n"
        "print(json.dumps(out))\n"
    )
    r = net_sandbox.python(code)
    out = json.loads(r.out)
    assert "host=a.sub.example.test" in out["a.sub.example.test"]
    assert "host=b.sub.example.test" in out["b.sub.example.test"]
    assert out["sub.example.test"].startswith("ERROR") and out["deep.x.sub.example.test"].startswith("ERROR")
    denied = {d["host"] for d in payloads(r, "net.dns") if d["decision"] == "deny"}
    assert {"sub.example.test", "deep.x.sub.example.test"} <= denied


def test_port_and_protocol_rules(net_sandbox: Sandbox, netlab: NetLab) -> None:
    https_only = net_sandbox.policy(
        permissions={
            "network": {
                "allowed_hosts": ["api.example.test"],
                "allowed_ports": [443, 8080],
                "allowed_protocols": ["https"],
            }
        }
    )
    ca = str(netlab.ca_dir / "lab-ca.pem")
    r = curl(net_sandbox, "--cacert", ca, "https://api.example.test/", policy=https_only)
    assert r.code == 0 and "host=api.example.test" in r.out, r.err
    r = curl(net_sandbox, "http://api.example.test:8080/", policy=https_only)
    assert "403" not in r.err and "net.protocol_not_allowed" in r.out  # plain HTTP gets a readable refusal
    assert payloads(r, "net.connect")[0]["rules"] == ["net.protocol_not_allowed"]
    r = curl(net_sandbox, "http://api.example.test:80/", policy=https_only)
    assert "net.protocol_not_allowed" in r.out or "net.port_not_allowed" in r.out
    port_80 = net_sandbox.policy(
        permissions={"network": {"allowed_hosts": ["api.example.test"], "allowed_ports": [80]}}
    )
    r = curl(net_sandbox, "http://api.example.test:8080/", policy=port_80)
    assert "net.port_not_allowed" in r.out and "port 8080 is not allowed" in r.out
    [connect] = payloads(r, "net.connect")
    assert connect["decision"] == "deny" and connect["port"] == 8080


def test_residency_names_the_region(net_sandbox: Sandbox, netlab: NetLab) -> None:
    aaif = {
        "sc_standard": "SC-006",
        "sc_version": "3.2.0",
        "agent_id": "a1c0ffee-0000-4000-8000-00000000e6e5",
        "status": "active",
        "agent": {
            "name": "Sandboxed",
            "goal": "egress residency test",
            "tools": [],
            "compliance": {"safety_level": "standard", "data_residency": "EU"},
        },
    }
    aaif_path = net_sandbox.root / "agent.aaif.json"
    aaif_path.write_text(json.dumps(aaif))
    policy = net_sandbox.policy(
        permissions={
            "network": {
                "allowed_hosts": ["*.eu.example.test", "*.us.example.test", "api.nowhere.test"],
                "allowed_ports": [80],
            }
        }
    )
    code = (
        "import json, urllib.request\n"
        "out = {}\n"
        "for host in ['api.eu.example.test', 'api.us.example.test', 'api.nowhere.test']:\n"
        "    try:\n"
        "        out[host] = urllib.request.urlopen(f'http://{host}/', timeout=3).read().decode()\n"
        "    except Exception as exc:\n"
        "        out[host] = 'ERROR ' + str(getattr(exc, 'read', lambda: b'')().decode() or exc)\n"
        "print(json.dumps(out))\n"
    )
    args = ("--aaif", str(aaif_path), "--regions", str(netlab.regions))
    r = net_sandbox.python(code, policy=policy, args=args)
    out = json.loads(r.out)
    assert "host=api.eu.example.test" in out["api.eu.example.test"], r.err
    assert "region US; data must stay in EU" in out["api.us.example.test"]
    assert "region of 'api.nowhere.test' is unknown" in out["api.nowhere.test"]
    rules = {c["host"]: c["rules"][0] for c in payloads(r, "net.connect")}
    assert rules == {
        "api.eu.example.test": "net.allowed",
        "api.us.example.test": "net.residency",
        "api.nowhere.test": "net.residency_unknown",
    }


@pytest.mark.daemon
def test_daemon_launches_get_the_same_filter(agent_tmp_path: Path, netlab: NetLab) -> None:
    tmp_path = agent_tmp_path
    box = Sandbox(tmp_path / "box")
    box.permissions["execution"]["allowed_commands"].append("curl")
    box.permissions["network"] = {"allowed_hosts": ["api.example.test"], "allowed_ports": [80]}
    daemon = RunningDaemon(tmp_path, box)
    daemon.wrap, daemon.extra_env = netlab.wrap(), netlab.env()
    daemon.write_agents()
    try:
        daemon.start()
        ok = daemon.adl_exec("curl", "-sS", "--max-time", "5", "http://api.example.test/")
        denied = daemon.adl_exec("curl", "-sS", "--max-time", "5", "http://other.example.test/")
    finally:
        daemon.cleanup()
    assert ok.returncode == 0 and "host=api.example.test" in ok.stdout, ok.stderr
    assert denied.returncode == 6 and "Could not resolve host" in denied.stderr
    records = daemon.records()
    connects = [r["payload"] for r in records if r["intent"] == "adl.enforcer.net.connect"]
    dns_denied = [
        r["payload"]["host"]
        for r in records
        if r["intent"] == "adl.enforcer.net.dns" and r["payload"]["decision"] == "deny"
    ]
    assert [c["decision"] for c in connects] == ["allow"] and "other.example.test" in dns_denied
    assert daemon.sessions_left() == []


def test_cross_border_restricted_keeps_data_in_the_home_region(net_sandbox: Sandbox, netlab: NetLab) -> None:
    policy = net_sandbox.policy(
        permissions={"network": {"allowed_hosts": ["*.eu.example.test", "*.us.example.test"], "allowed_ports": [80]}},
        data_classification={"sensitivity": "internal", "handling": {"cross_border_restricted": True}},
    )
    args = ("--regions", str(netlab.regions))
    env = {"ADL_ENFORCER_HOME_REGION": "EU"}
    eu = curl(net_sandbox, "http://api.eu.example.test/", policy=policy, args=args, env=env)
    us = curl(net_sandbox, "http://api.us.example.test/", policy=policy, args=args, env=env)
    assert eu.code == 0 and "host=api.eu.example.test" in eu.out, eu.err
    assert "net.residency" in us.out and "region US; data must stay in EU" in us.out
    [denied] = payloads(us, "net.connect")
    assert denied["reasons"][0]["pointer"] == "/data_classification/handling/cross_border_restricted"


def test_the_filter_is_also_an_https_proxy_for_clients_that_want_one(net_sandbox: Sandbox, netlab: NetLab) -> None:
    ca = str(netlab.ca_dir / "lab-ca.pem")
    proxy = {"HTTPS_PROXY": "http://127.0.0.1:15001", "http_proxy": "http://127.0.0.1:15001"}  # curl: lowercase
    ok = net_sandbox.run("curl", "-sS", "--max-time", "5", "--cacert", ca, "https://api.example.test/", env=proxy)
    assert ok.code == 0 and "host=api.example.test" in ok.out, ok.err
    [connect] = payloads(ok, "net.connect")
    assert connect["via"] == "connect" and connect["sni"] == "api.example.test" and connect["decision"] == "allow"
    denied = net_sandbox.run("curl", "-sS", "--max-time", "5", "--cacert", ca, "https://other.example.test/", env=proxy)
    assert denied.code != 0 and "403" in denied.err
    plain = net_sandbox.run("curl", "-sS", "--max-time", "5", "http://api.example.test/", env=proxy)
    assert "only CONNECT is served here" in plain.out
    rules = [c["rules"][0] for c in payloads(denied, "net.connect") + payloads(plain, "net.connect")]
    assert rules == ["net.host_not_allowed", "net.proxy_request"]


LAUNCHER = """
import json, sys
from enforcer.cli.exec import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""
# What serves connections and queries: the filter's process loads it after it said "ready", so the
# launch does not wait for it; the launcher never does.
SERVING = ("dns", "enforcer.egress.server", "enforcer.egress.filter", "enforcer.egress.sniff", "concurrent.futures")


def test_the_launcher_loads_none_of_what_serves_the_agents_connections(net_sandbox: Sandbox, netlab: NetLab) -> None:
    env = net_sandbox.environ(netlab.env())
    argv = [
        *netlab.wrap(), sys.executable, "-c", LAUNCHER, "--adl", str(net_sandbox.policy()), "--user", AGENT_USER,
        "--", "curl", "-sS", "--noproxy", "*", "--max-time", "5", "http://api.example.test/",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "host=api.example.test" in proc.stdout, proc.stdout  # resolved and relayed by the filter
    modules = set(json.loads(proc.stdout.splitlines()[-1])["modules"])
    assert "enforcer.egress.process" in modules
    assert not {m for m in modules if m.split(".")[0] == "dns" or m.startswith(SERVING)}
    # The filter recorded net.start (synced) before it answered the first query.
    kinds = [r["intent"].removeprefix("adl.enforcer.") for r in iter_records(net_sandbox.audit)]
    net = [k for k in kinds if k.startswith("net.")]
    assert net[0] == "net.start" and "net.dns" in net and "net.connect" in net, net
