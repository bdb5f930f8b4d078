"""The DNS stub inside the agent's namespace, the upstream resolver, and the synthetic addresses
that tell the connection filter which name an agent meant.

An allowed name that exists upstream is answered with a synthetic address from a range private to
the session (one per name, stable for the session); the filter maps it back to the name and dials a
real address it resolved and checked itself. A name the policy does not allow is answered NXDOMAIN
and never sent upstream, so long random subdomains carry nothing out.

dnspython is imported at the first query to parse or name to resolve, not with this module: the
filter's process starts serving without it, and a session that never resolves never loads it. If
it cannot be loaded, queries go unanswered and names unresolved (connections to them refused),
each one audited as usual.
"""

from __future__ import annotations

import functools
import ipaddress
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ..policy import Policy
from ..policy.patterns import PatternError, normalize_host

SYNTHETIC_V4 = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544 benchmark range: never a real destination
SYNTHETIC_V6 = ipaddress.ip_network("fdad:1e9e:5a4d::/96")
ANSWER_TTL = 60
MAX_CACHE_TTL = 300.0  # seconds an upstream answer is reused at most (less when its TTL says so)
NEGATIVE_TTL = 5.0
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@functools.cache  # a failed import is not cached: the next query tries again
def dnspython() -> Any:
    """dnspython's modules this file uses, imported on first use (ImportError if they cannot be)."""
    import dns.exception
    import dns.flags
    import dns.message
    import dns.rcode
    import dns.rdataclass
    import dns.rdatatype
    import dns.resolver
    import dns.rrset

    return SimpleNamespace(
        exception=dns.exception,
        flags=dns.flags,
        message=dns.message,
        rcode=dns.rcode,
        rdataclass=dns.rdataclass,
        rdatatype=dns.rdatatype,
        resolver=dns.resolver,
        rrset=dns.rrset,
    )


class SyntheticAddresses:
    """name <-> synthetic address, both families, for one session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[tuple[str, int], IPAddress] = {}
        self._by_address: dict[IPAddress, str] = {}
        self._next = {4: 1, 6: 1}

    def address_for(self, name: str, version: int) -> IPAddress:
        with self._lock:
            known = self._by_name.get((name, version))
            if known is not None:
                return known
            network = SYNTHETIC_V4 if version == 4 else SYNTHETIC_V6
            index = self._next[version]
            if index >= network.num_addresses - 1:
                raise OverflowError("the session used every synthetic address")
            self._next[version] = index + 1
            address = network[index]
            self._by_name[(name, version)] = address
            self._by_address[address] = name
            return address

    def name_for(self, address: IPAddress) -> str | None:
        return self._by_address.get(address)


class ResolveError(Exception):
    pass


@dataclass
class Resolution:
    addresses: list[IPAddress] = field(default_factory=list)
    nxdomain: bool = False


class UpstreamResolver:
    """A dnspython resolver pointed at exactly one configured server, with a TTL-honouring cache."""

    def __init__(self, server: tuple[str, int] | None, timeout_s: float) -> None:
        self.server = server
        self.timeout_s = timeout_s
        self._resolver: Any = None  # built at the first query
        self._building = threading.Lock()
        # Our own cache in front: a hit is a dict lookup (a hit in dnspython's own cache would be
        # most of what the filter adds to a connection's setup).
        self._cache: dict[tuple[str, int], tuple[float, Resolution]] = {}

    def _upstream(self) -> tuple[Any, Any]:
        """dnspython and the resolver pointed at the configured server; ResolveError if dnspython
        cannot be loaded."""
        try:
            dns = dnspython()
        except Exception as exc:  # an ImportError, or a module that fails as it loads
            raise ResolveError(f"the resolver could not be loaded: {type(exc).__name__}: {exc}") from None
        with self._building:
            if self._resolver is None:
                assert self.server is not None
                resolver = dns.resolver.Resolver(configure=False)
                resolver.nameservers = [self.server[0]]
                resolver.port = self.server[1]
                resolver.lifetime = self.timeout_s
                resolver.timeout = self.timeout_s
                self._resolver = resolver
        return dns, self._resolver

    def lookup(self, name: str, version: int) -> Resolution:
        if self.server is None:
            raise ResolveError("no upstream resolver is configured (ADL_ENFORCER_UPSTREAM_DNS)")
        cached = self._cache.get((name, version))
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        resolution, ttl = self._query(name, version)
        self._cache[(name, version)] = (time.monotonic() + min(ttl, MAX_CACHE_TTL), resolution)
        return resolution

    def _query(self, name: str, version: int) -> tuple[Resolution, float]:
        assert self.server is not None
        dns, upstream = self._upstream()
        rdtype = dns.rdatatype.A if version == 4 else dns.rdatatype.AAAA
        try:
            answer = upstream.resolve(name + ".", rdtype, raise_on_no_answer=False, search=False)
        except dns.resolver.NXDOMAIN:
            return Resolution(nxdomain=True), NEGATIVE_TTL
        except (dns.exception.Timeout, dns.resolver.NoNameservers, dns.resolver.NoAnswer) as exc:
            raise ResolveError(f"upstream resolver {self.server[0]}:{self.server[1]}: {exc}") from None
        except dns.exception.DNSException as exc:
            raise ResolveError(f"upstream resolver: {exc}") from None
        rrset = answer.rrset
        if rrset is None:
            return Resolution([]), NEGATIVE_TTL
        return Resolution([ipaddress.ip_address(r.address) for r in rrset]), float(rrset.ttl)

    def cached_addresses(self, name: str) -> list[IPAddress] | None:
        """What addresses(name) would answer from the cache alone, without waiting for the upstream
        resolver; None when either address family is not cached (or has expired)."""
        found: list[IPAddress] = []
        now = time.monotonic()
        for version in (4, 6):
            cached = self._cache.get((name, version))
            if cached is None or cached[0] <= now:
                return None
            found.extend(cached[1].addresses)
        return found

    def addresses(self, name: str) -> list[IPAddress]:
        """Every address of a name, IPv4 first (the order connections are tried in)."""
        found: list[IPAddress] = []
        errors: list[str] = []
        for version in (4, 6):
            try:
                found.extend(self.lookup(name, version).addresses)
            except ResolveError as exc:
                errors.append(str(exc))
        if not found and errors:
            raise ResolveError(errors[0])
        return found


@dataclass
class DnsOutcome:
    response: bytes | None
    event: dict[str, Any]  # the audit payload


def host_allowed(policy: Policy, name: str) -> tuple[str, bool]:
    """The normalised name, and whether an allowed_hosts pattern matches it (the port-independent
    part of the decision, all a DNS answer or a CONNECT line can be checked against).
    Raises PatternError or UnicodeError for a name that is not a host name."""
    host = normalize_host(name)
    return host, policy.network is not None and policy.network.hosts.first(host) is not None


class DnsStub:
    def __init__(self, policy: Policy, resolver: UpstreamResolver, synthetic: SyntheticAddresses) -> None:
        self.policy = policy
        self.resolver = resolver
        self.synthetic = synthetic

    def allowed(self, name: str) -> tuple[str | None, str, str]:
        """(normalised name or None when denied, rule, text)."""
        try:
            host, ok = host_allowed(self.policy, name)
        except (PatternError, UnicodeError) as exc:
            return None, "net.host_invalid", f"invalid name: {exc}"
        if not ok:
            return None, "net.dns_name_not_allowed", f"'{host}' matches no allowed_hosts pattern; not resolved"
        return host, "net.dns_allowed", f"'{host}' matches allowed_hosts"

    def answer(self, wire: bytes) -> DnsOutcome:
        try:
            dns = dnspython()
        except Exception as exc:  # unanswered: the client retries or gives up, and it is audited
            error = f"the DNS stub could not be loaded: {type(exc).__name__}: {exc}"[:200]
            return DnsOutcome(None, {"decision": "deny", "rules": ["net.dns_unavailable"], "error": error})
        try:
            query = dns.message.from_wire(wire)
            response = dns.message.make_response(query)  # refuses a message that is not a query
        except dns.exception.DNSException as exc:
            return DnsOutcome(None, {"decision": "deny", "rules": ["net.dns_malformed"], "error": str(exc)[:200]})
        response.flags |= dns.flags.RA
        if len(query.question) != 1 or query.opcode() != 0:
            response.set_rcode(dns.rcode.FORMERR if len(query.question) != 1 else dns.rcode.NOTIMP)
            return DnsOutcome(response.to_wire(), {"decision": "deny", "rules": ["net.dns_malformed"]})
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True)
        qtype = dns.rdatatype.to_text(question.rdtype)
        event: dict[str, Any] = {"host": name[:300], "qtype": qtype}
        host, rule, text = self.allowed(name)
        if host is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
            event.update(decision="deny", rules=[rule], reasons=[{"rule": rule, "text": text}], rcode="NXDOMAIN")
            return DnsOutcome(response.to_wire(), event)
        event["host"] = host
        if question.rdtype not in (dns.rdatatype.A, dns.rdatatype.AAAA) or question.rdclass != dns.rdataclass.IN:
            event.update(decision="allow", rules=[rule], rcode="NOERROR", answers=[], note=f"{qtype} is not relayed")
            return DnsOutcome(response.to_wire(), event)
        version = 4 if question.rdtype == dns.rdatatype.A else 6
        try:
            upstream = self.resolver.lookup(host, version)
        except ResolveError as exc:
            response.set_rcode(dns.rcode.SERVFAIL)
            event.update(decision="allow", rules=[rule], rcode="SERVFAIL", error=str(exc))
            return DnsOutcome(response.to_wire(), event)
        if upstream.nxdomain:
            response.set_rcode(dns.rcode.NXDOMAIN)
            event.update(decision="allow", rules=[rule], rcode="NXDOMAIN", upstream=[])
            return DnsOutcome(response.to_wire(), event)
        answers: list[str] = []
        if upstream.addresses:
            synthetic = self.synthetic.address_for(host, version)
            answers.append(str(synthetic))
            response.answer.append(
                dns.rrset.from_text(question.name, ANSWER_TTL, dns.rdataclass.IN, question.rdtype, str(synthetic))
            )
        event.update(
            decision="allow",
            rules=[rule],
            rcode="NOERROR",
            answers=answers,
            upstream=[str(a) for a in upstream.addresses],
        )
        return DnsOutcome(response.to_wire(), event)
