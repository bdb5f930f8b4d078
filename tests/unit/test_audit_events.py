"""Payload builders of records written outside a session: the egress filter's one-rule decisions
and the lines of a kernel-denial summary, member for member."""

from __future__ import annotations

from enforcer.audit.events import denial_tally, one_rule


def test_a_one_rule_decision_names_its_rule_and_its_pointer_when_it_has_one() -> None:
    assert one_rule("deny", "net.filter_error", "OSError: gone") == {
        "decision": "deny",
        "rules": ["net.filter_error"],
        "reasons": [{"rule": "net.filter_error", "text": "OSError: gone"}],
    }
    assert one_rule("deny", "net.host_not_allowed", "not listed", "/permissions/network/allowed_hosts") == {
        "decision": "deny",
        "rules": ["net.host_not_allowed"],
        "reasons": [
            {"rule": "net.host_not_allowed", "text": "not listed", "pointer": "/permissions/network/allowed_hosts"}
        ],
    }
    assert "pointer" not in one_rule("allow", "net.allowed", "listed", "")["reasons"][0]


def test_a_denial_tally_describes_the_first_occurrence() -> None:
    first = {
        "mechanism": "landlock",
        "access": "read",
        "path": "/etc/shadow",
        "command": "cat",
        "rules": ["fs.not_allowed", "fs.other"],
        "hint": "add the path",
        "grant": {"value": {"path": "/etc/shadow"}},
        "pid": 7,  # not a facet of the tally
    }
    facets = {"mechanism": "landlock", "access": "read", "path": "/etc/shadow", "port": None, "syscall": None}
    expected = {"count": 3, **facets, "command": "cat", "rule": "fs.not_allowed", "hint": "add the path"}
    assert denial_tally(3, first) == expected
    assert denial_tally(3, first, with_grant=True) == {**expected, "grant": {"value": {"path": "/etc/shadow"}}}
    assert denial_tally(1, {})["rule"] == "kernel.denied"  # a denial explained by no rule
