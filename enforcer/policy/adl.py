"""ADL document validation: the version's JSON Schema, then every semantic rule, in one pass.

VAL-01..VAL-28 (ADL 0.1-0.3) and VAL-29..VAL-37 (0.3), the lifecycle rules (ADL-5001..5003),
attestation expiry (ADL-4003), key strength (ADL-4001) and the signature itself (ADL-4002).
Every rule is defensive about types: it runs even when the schema already failed, so a document
gets all its errors at once.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import jsonschema_rs

from . import patterns
from .argschema import build_validator
from .errors import Finding, pointer
from .formats import is_adl_urn, is_uri, parse_timestamp
from .jsonvalues import arr, iter_strings, obj, unsafe_integers
from .signature import SignatureResult, key_strength_problem, verify
from .specs import PROFILES, SchemaSet, supported_schema_version, unknown_members

SENSITIVITY_ORDER = {"public": 0, "internal": 1, "confidential": 2, "restricted": 3}
CATEGORIES = {"pii", "phi", "financial", "credentials", "intellectual_property", "regulatory"}
RESOURCE_TYPES = {"vector_store", "knowledge_base", "file", "api", "database"}
AUTH_TYPES = {"none", "api_key", "oauth2", "oidc", "mtls"}
ATTESTATION_TYPES = {"self", "third_party", "verifiable_credential"}
ERROR_ACTIONS = {"abort", "continue", "retry"}
OUTPUT_FORMATS = {"text", "json", "markdown", "html"}
MODEL_CAPABILITIES = {"function_calling", "vision", "code_execution", "streaming"}
LIFECYCLE_STATUSES = {"draft", "active", "deprecated", "retired"}
DEGRADATION_ACTIONS = {"halt", "pause", "fallback", "continue"}
TOOL_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
TEMPLATE_VAR = re.compile(r"(?<!\\)\{\{\s*([^{}]*?)\s*\}\}")
VAR_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
NEAR_EXPIRY = timedelta(days=30)


def schema_problem(schema: Any, enforced: bool) -> tuple[str, tuple[str | int, ...]] | None:
    """Why `schema` is not a valid JSON Schema (message, path inside it), or None. An `enforced`
    schema (tool parameters) must also resolve every `$ref` offline, since arguments are checked
    against it and a schema that cannot be checked must not let calls through."""
    try:
        if not jsonschema_rs.meta.is_valid(schema):
            jsonschema_rs.meta.validate(schema)
        if enforced:
            build_validator(schema)
    except jsonschema_rs.ValidationError as exc:
        return exc.message.splitlines()[0], tuple(exc.instance_path)
    except (jsonschema_rs.ReferencingError, ValueError, TypeError) as exc:
        return str(exc).splitlines()[0], ()
    return None


_SCHEMA_CODES = {
    "required": "ADL-1003",
    "type": "ADL-1004",
    "enum": "ADL-1005",
    "const": "ADL-1005",
    "pattern": "ADL-1006",
}


def _is_in(value: Any, allowed: set[str]) -> bool:
    # Membership without hashing: a list or object where a string belongs must not crash a rule.
    return isinstance(value, str) and value in allowed


class _Check:
    """Collects findings for one document; one method per rule group."""

    def __init__(self, doc: dict[str, Any], version: str, now: datetime) -> None:
        self.doc = doc
        self.version = version
        self.v03 = version >= "0.3.0"
        self.now = now
        self.findings: list[Finding] = []

    def add(self, code: str, detail: str, *path: str | int, severity: str = "error") -> None:
        self.findings.append(Finding(code, detail, pointer(*path), severity))  # type: ignore[arg-type]

    # VAL-02..04, VAL-13
    def unique_names(self) -> None:
        for member, code in (("tools", "ADL-2002"), ("resources", "ADL-2003"), ("prompts", "ADL-2004")):
            seen: dict[str, int] = {}
            for i, entry in enumerate(arr(self.doc.get(member))):
                name = obj(entry).get("name")
                if not isinstance(name, str):
                    continue
                if name in seen:
                    kind = member[:-1]
                    self.add(
                        code,
                        f"{kind.capitalize()} name '{name}' already defined at index {seen[name]}",
                        member,
                        i,
                        "name",
                    )
                else:
                    seen[name] = i
                if member == "tools" and not TOOL_NAME.match(name):
                    self.add("ADL-2008", f"Tool name '{name}' does not match ^[a-z][a-z0-9_]*$", member, i, "name")

    # VAL-05, VAL-10, VAL-11, VAL-06, VAL-12 for the members the drafts name explicitly.
    def timestamps_and_uris(self) -> None:
        lifecycle = obj(self.doc.get("lifecycle"))
        attestation = obj(obj(self.doc.get("security")).get("attestation"))
        for container, base, keys in (
            (lifecycle, ("lifecycle",), ("effective_date", "sunset_date")),
            (attestation, ("security", "attestation"), ("issued_at", "expires_at")),
        ):
            for key in keys:
                value = container.get(key)
                if value is not None and parse_timestamp(value) is None:
                    self.add("ADL-2005", f"{key} {value!r} is not an ISO 8601 timestamp with timezone", *base, key)
        successor = lifecycle.get("successor")
        if successor is not None and not is_uri(successor):
            self.add("ADL-2006", f"successor {successor!r} is not a valid URI", "lifecycle", "successor")
        ident = self.doc.get("id")
        if ident is not None and not is_uri(ident):
            self.add("ADL-2006", f"id {ident!r} is not a valid URI or URN", "id")

    # VAL-07
    def json_schemas(self) -> None:
        places: list[tuple[Any, tuple[str | int, ...]]] = []
        for i, tool in enumerate(arr(self.doc.get("tools"))):
            for key in ("parameters", "returns"):
                if key in obj(tool):
                    places.append((tool[key], ("tools", i, key)))
        for i, resource in enumerate(arr(self.doc.get("resources"))):
            if "schema" in obj(resource):
                places.append((resource["schema"], ("resources", i, "schema")))
        for i, prompt in enumerate(arr(self.doc.get("prompts"))):
            if "arguments" in obj(prompt):
                places.append((prompt["arguments"], ("prompts", i, "arguments")))
        for schema, path in places:
            if not isinstance(schema, dict | bool):
                self.add("ADL-2007", "a JSON Schema must be an object or a boolean", *path)
                continue
            # jsonschema-rs checks against the meta-schema: the pure-Python check_schema dominated
            # compiling a large document.
            problem = schema_problem(schema, enforced=path[-1] == "parameters")
            if problem:
                self.add("ADL-2007", f"invalid JSON Schema: {problem[0]}", *path, *problem[1])

    # VAL-08: profiles known and their schemas satisfied (schema part runs in schema_errors).
    def profiles(self) -> None:
        for i, identifier in enumerate(arr(self.doc.get("profiles"))):
            if isinstance(identifier, str) and identifier not in PROFILES and identifier.startswith("urn:adl:profile:"):
                self.add("ADL-3002", f"Profile '{identifier}' is not a known standard profile", "profiles", i)
            elif isinstance(identifier, str) and identifier not in PROFILES:
                self.add(
                    "ADL-3002",
                    f"Profile '{identifier}' is unknown to this enforcer; its requirements cannot be checked",
                    "profiles",
                    i,
                )

    # VAL-09, ADL-5002, ADL-5003
    def lifecycle(self) -> None:
        lifecycle = self.doc.get("lifecycle")
        if not isinstance(lifecycle, dict):
            return
        status = lifecycle.get("status")
        if status is not None and not _is_in(status, LIFECYCLE_STATUSES):
            self.add(
                "ADL-5001",
                f"lifecycle.status {status!r} is not one of draft, active, deprecated, retired",
                "lifecycle",
                "status",
            )
        if "successor" in lifecycle and status in ("active", "draft"):
            self.add(
                "ADL-5002",
                f"Member 'successor' is not valid while lifecycle.status is '{status}'",
                "lifecycle",
                "successor",
            )
        effective = parse_timestamp(lifecycle.get("effective_date"))
        sunset = parse_timestamp(lifecycle.get("sunset_date"))
        if sunset and effective and sunset <= effective:
            self.add("ADL-5003", "sunset_date is not after effective_date", "lifecycle", "sunset_date")
        elif sunset and sunset <= self.now and status in ("active", "draft"):
            self.add(
                "ADL-5003",
                f"sunset_date {lifecycle['sunset_date']} has passed but status is '{status}'",
                "lifecycle",
                "sunset_date",
            )
        elif sunset and sunset <= self.now and status == "deprecated":
            # Valid, but a deprecated agent past its sunset is treated as retired: it never runs.
            self.add(
                "ADL-5003",
                f"sunset_date {lifecycle['sunset_date']} has passed: the deprecated agent is treated as retired",
                "lifecycle",
                "sunset_date",
                severity="warning",
            )
        elif sunset and self.now < sunset <= self.now + NEAR_EXPIRY and status != "retired":
            self.add(
                "ENF-2007",
                f"sunset_date {lifecycle['sunset_date']} is within 30 days",
                "lifecycle",
                "sunset_date",
                severity="warning",
            )

    # VAL-14..20
    def enumerations(self) -> None:
        for i, resource in enumerate(arr(self.doc.get("resources"))):
            rtype = obj(resource).get("type")
            if rtype is not None and not _is_in(rtype, RESOURCE_TYPES):
                self.add("ADL-2009", f"Resource type {rtype!r} is not a valid resource type", "resources", i, "type")
        model = obj(self.doc.get("model"))
        temperature = model.get("temperature")
        if temperature is not None and (
            isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0.0 <= temperature <= 2.0
        ):
            self.add("ADL-2010", f"model.temperature {temperature!r} is outside 0.0-2.0", "model", "temperature")
        for i, capability in enumerate(arr(model.get("capabilities"))):
            if not _is_in(capability, MODEL_CAPABILITIES):
                self.add("ADL-2015", f"Model capability {capability!r} is not valid", "model", "capabilities", i)
        security = obj(self.doc.get("security"))
        auth_type = obj(security.get("authentication")).get("type")
        if auth_type is not None and not _is_in(auth_type, AUTH_TYPES):
            self.add(
                "ADL-2011", f"Authentication type {auth_type!r} is not valid", "security", "authentication", "type"
            )
        att_type = obj(security.get("attestation")).get("type")
        if att_type is not None and not _is_in(att_type, ATTESTATION_TYPES):
            self.add("ADL-2012", f"Attestation type {att_type!r} is not valid", "security", "attestation", "type")
        runtime = obj(self.doc.get("runtime"))
        action = obj(runtime.get("error_handling")).get("on_tool_error")
        if action is not None and not _is_in(action, ERROR_ACTIONS):
            self.add(
                "ADL-2013",
                f"on_tool_error {action!r} is not abort, continue or retry",
                "runtime",
                "error_handling",
                "on_tool_error",
            )
        fmt = obj(runtime.get("output_handling")).get("format")
        if fmt is not None and not _is_in(fmt, OUTPUT_FORMATS):
            self.add("ADL-2014", f"output format {fmt!r} is not valid", "runtime", "output_handling", "format")

    # VAL-21..23 (+ commands), VAL-34
    def permission_patterns(self) -> None:
        permissions = obj(self.doc.get("permissions"))
        checks: list[tuple[str, str, patterns.Flavour, str]] = [
            ("network", "allowed_hosts", "host", "ADL-2016"),
            ("environment", "allowed_variables", "env", "ADL-2018"),
            ("environment", "denied_variables", "env", "ADL-2018"),
            ("execution", "allowed_commands", "command", "ADL-2018"),
            ("execution", "denied_commands", "command", "ADL-2018"),
            ("filesystem", "denied_paths", "path", "ADL-2017"),
        ]
        for domain, member, flavour, code in checks:
            for i, pattern in enumerate(arr(obj(permissions.get(domain)).get(member))):
                self._pattern(pattern, flavour, code, "permissions", domain, member, i)
        for i, entry in enumerate(arr(obj(permissions.get("filesystem")).get("allowed_paths"))):
            if "path" in obj(entry):
                self._pattern(
                    entry["path"], "path", "ADL-2017", "permissions", "filesystem", "allowed_paths", i, "path"
                )
        if self.v03:
            delegation = obj(permissions.get("delegation"))
            for member in ("match", "deny"):
                for i, pattern in enumerate(arr(delegation.get(member))):
                    self._pattern(pattern, "host", "ADL-6006", "permissions", "delegation", member, i)
            depth = delegation.get("max_depth")
            if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
                self.add(
                    "ADL-6007", f"max_depth {depth!r} must be an integer >= 1", "permissions", "delegation", "max_depth"
                )

    # §4.4 and the security considerations: bare '*' MUST be warned about; patterns that grant
    # nothing, or more than they look like, SHOULD be.
    def pattern_warnings(self) -> None:
        permissions = obj(self.doc.get("permissions"))
        network, environment = obj(permissions.get("network")), obj(permissions.get("environment"))
        execution, filesystem = obj(permissions.get("execution")), obj(permissions.get("filesystem"))
        for i, host in enumerate(arr(network.get("allowed_hosts"))):
            if host == "*":
                self._warn(
                    "ENF-2003", "bare '*' in allowed_hosts allows every host name", "network", "allowed_hosts", i
                )
            elif isinstance(host, str):
                first = host.split(".", 1)[0]
                if first.startswith("*") and first != "*" and "." in host:
                    domain = host[1:]
                    self._warn(
                        "ENF-2011",
                        f"'{host}' also matches names such as 'evil{domain}': '*' matches within a label; "
                        f"for a domain and its subdomains write '{domain.lstrip('.')}' and '*.{domain.lstrip('.')}'",
                        "network",
                        "allowed_hosts",
                        i,
                    )
        for i, name in enumerate(arr(environment.get("allowed_variables"))):
            if name == "*":
                self._warn(
                    "ENF-2003",
                    "bare '*' in allowed_variables passes every variable of the launcher's environment",
                    "environment",
                    "allowed_variables",
                    i,
                )
        for i, command in enumerate(arr(execution.get("allowed_commands"))):
            if command == "*":
                self._warn("ENF-2003", "bare '*' in allowed_commands allows every command", "execution",
                           "allowed_commands", i)  # fmt: skip
        for member in ("allowed_commands", "denied_commands"):
            for i, command in enumerate(arr(execution.get(member))):
                if isinstance(command, str) and "/" in command and not _normal_absolute(command):
                    self._warn(
                        "ENF-2011",
                        f"command path '{command}' is not a normalised absolute path: it never matches the "
                        "resolved path of a program, so it "
                        + ("allows nothing" if member == "allowed_commands" else "denies nothing"),
                        "execution",
                        member,
                        i,
                    )
        for i, entry in enumerate(arr(filesystem.get("allowed_paths"))):
            path = obj(entry).get("path")
            if not isinstance(path, str):
                continue
            if patterns.is_bare_wildcard(path):
                self._warn("ENF-2003", f"'{path}' grants the whole filesystem", "filesystem", "allowed_paths", i,
                           "path")  # fmt: skip
            elif path != "/" and "*" not in path.rsplit("/", 1)[-1] and "." not in path.rsplit("/", 1)[-1]:
                directory = path.rstrip("/")
                self._warn(
                    "ENF-2011",
                    f"'{path}' grants that one path only; if it is a directory, its contents need '{directory}/**'",
                    "filesystem",
                    "allowed_paths",
                    i,
                    "path",
                )

    def _warn(self, code: str, detail: str, *path: str | int) -> None:
        self.add(code, detail, "permissions", *path, severity="warning")

    def _pattern(self, pattern: Any, flavour: patterns.Flavour, code: str, *path: str | int) -> None:
        reason = patterns.validate(pattern, flavour)
        if reason:
            self.add(code, f"Pattern {pattern!r} is not a valid {flavour} pattern: {reason}", *path)

    # VAL-24
    def digest_fields(self) -> None:
        signature = obj(obj(obj(self.doc.get("security")).get("attestation")).get("signature"))
        if signature.get("signed_content") == "digest":
            missing = [k for k in ("digest_algorithm", "digest_value") if k not in signature]
            if missing:
                self.add(
                    "ADL-2019",
                    f"digest-mode signature lacks {', '.join(missing)}",
                    "security",
                    "attestation",
                    "signature",
                )

    # VAL-25..28
    def data_classification(self) -> None:
        top = self.doc.get("data_classification")
        top_level = self._classification(top, ("data_classification",))
        for member in ("tools", "resources"):
            for i, entry in enumerate(arr(self.doc.get(member))):
                dc = obj(entry).get("data_classification")
                if dc is None:
                    continue
                level = self._classification(dc, (member, i, "data_classification"))
                if level is not None and top_level is not None and level > top_level:
                    name = obj(entry).get("name", i)
                    self.add(
                        "ADL-2023",
                        f"{member[:-1].capitalize()} '{name}' has sensitivity '{dc['sensitivity']}' "
                        f"which exceeds top-level '{obj(top).get('sensitivity')}'",
                        member,
                        i,
                        "data_classification",
                        "sensitivity",
                    )

    def _classification(self, dc: Any, path: tuple[str | int, ...]) -> int | None:
        if not isinstance(dc, dict):
            return None
        sensitivity = dc.get("sensitivity")
        level = SENSITIVITY_ORDER.get(sensitivity) if isinstance(sensitivity, str) else None
        if "sensitivity" in dc and level is None:
            self.add(
                "ADL-2020",
                f"sensitivity {sensitivity!r} is not public, internal, confidential or restricted",
                *path,
                "sensitivity",
            )
        extra = self._profile_categories()
        for i, category in enumerate(arr(dc.get("categories"))):
            if not _is_in(category, CATEGORIES) and not _is_in(category, extra):
                self.add("ADL-2021", f"category {category!r} is not a valid data category", *path, "categories", i)
        retention = obj(dc.get("retention"))
        low, high = retention.get("min_days"), retention.get("max_days")
        if isinstance(low, int | float) and isinstance(high, int | float) and low > high:
            self.add("ADL-2022", f"retention min_days {low} exceeds max_days {high}", *path, "retention", "min_days")
        return level

    def _profile_categories(self) -> set[str]:
        # Profiles MAY define additional category values (healthcare, financial).
        declared = {p for p in arr(self.doc.get("profiles")) if isinstance(p, str)}
        extra: set[str] = set()
        if "urn:adl:profile:healthcare:1.0" in declared:
            extra |= {"phi", "clinical", "genomic"}
        if "urn:adl:profile:financial:1.0" in declared:
            extra |= {"cardholder_data", "transaction", "npi"}
        return extra

    # ADL-1006 (0.1/0.2) or ADL-2024 (0.3): undefined template variables
    def templates(self) -> None:
        code = "ADL-2024" if self.v03 else "ADL-1006"
        prompt = self.doc.get("system_prompt")
        if isinstance(prompt, dict) and isinstance(prompt.get("template"), str):
            variables = obj(prompt.get("variables"))
            for name in self._template_vars(prompt["template"], ("system_prompt", "template"), code):
                if name not in variables:
                    self.add(
                        code, f"template variable '{name}' is not defined in variables", "system_prompt", "template"
                    )
        for i, entry in enumerate(arr(self.doc.get("prompts"))):
            template = obj(entry).get("template")
            if isinstance(template, str):
                list(self._template_vars(template, ("prompts", i, "template"), code))

    def _template_vars(self, template: str, path: tuple[str | int, ...], code: str) -> Iterator[str]:
        for match in TEMPLATE_VAR.finditer(template):
            name = match.group(1)
            if not VAR_NAME.match(name):
                self.add(code, f"template variable '{name}' is not a valid variable name", *path)
            else:
                yield name

    # ADL-4001, ADL-4003
    def security(self) -> None:
        key = obj(obj(self.doc.get("cryptographic_identity")).get("public_key"))
        if key:
            problem = key_strength_problem(key.get("algorithm"), key.get("value"))
            if problem:
                self.add("ADL-4001", problem, "cryptographic_identity", "public_key")
        attestation = obj(obj(self.doc.get("security")).get("attestation"))
        expires = parse_timestamp(attestation.get("expires_at"))
        if expires is not None:
            if expires <= self.now:
                self.add(
                    "ADL-4003",
                    f"attestation expired at {attestation['expires_at']}",
                    "security",
                    "attestation",
                    "expires_at",
                )
            elif expires - self.now <= NEAR_EXPIRY:
                self.add(
                    "ENF-2008",
                    f"attestation expires at {attestation['expires_at']} (within 30 days)",
                    "security",
                    "attestation",
                    "expires_at",
                    severity="warning",
                )

    # VAL-29..33, VAL-35a, VAL-36, VAL-37 (ADL 0.3)
    def runtime_limits(self) -> None:
        if not self.v03:
            return
        permissions = obj(self.doc.get("permissions"))
        self._budget(
            obj(permissions.get("resource_limits")).get("budget"), ("permissions", "resource_limits", "budget")
        )
        runtime = obj(self.doc.get("runtime"))
        invocation = obj(runtime.get("tool_invocation"))
        for key in ("max_iterations", "max_tool_calls_per_session"):
            value = invocation.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                self.add("ADL-6004", f"{key} {value!r} must be an integer >= 1", "runtime", "tool_invocation", key)
        loop = obj(invocation.get("loop_detection"))
        window = loop.get("window")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 2):
            self.add(
                "ADL-6005",
                f"loop_detection.window {window!r} must be an integer >= 2",
                "runtime",
                "tool_invocation",
                "loop_detection",
                "window",
            )
        if "on_detected" in loop:
            self._degradation_response(
                loop["on_detected"], ("runtime", "tool_invocation", "loop_detection", "on_detected")
            )
        degradation = runtime.get("degradation")
        for cause, response in obj(degradation).items():
            if cause == "extensions":
                continue
            if not re.match(r"^on_[a-z0-9_]+$", cause):
                self.add(
                    "ADL-6008",
                    f"degradation cause {cause!r} does not match ^on_[a-z0-9_]+$",
                    "runtime",
                    "degradation",
                    cause,
                )
            self._degradation_response(response, ("runtime", "degradation", cause))
        self._sub_agents(permissions.get("sub_agents"))
        for path, value in iter_strings(self.doc):
            if value.lower().startswith("urn:adl:") and not is_adl_urn(value):
                self.add("ADL-2025", f"{value!r} does not conform to the adl-urn production", *path)

    def _budget(self, budget: Any, path: tuple[str | int, ...]) -> None:
        for dimension, caps in obj(budget).items():
            if dimension == "extensions":
                continue
            if isinstance(caps, dict):
                for key, value in caps.items():
                    if key in ("per_session", "per_day", "per_call", "per_run") and (
                        isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
                    ):
                        self.add(
                            "ADL-6001",
                            f"budget {dimension}.{key} {value!r} must be a number > 0",
                            *path,
                            dimension,
                            key,
                        )
                session, day = caps.get("per_session"), caps.get("per_day")
                if isinstance(session, int | float) and isinstance(day, int | float) and session > day:
                    self.add(
                        "ADL-6002",
                        f"budget {dimension}.per_session {session} exceeds per_day {day}",
                        *path,
                        dimension,
                        "per_session",
                    )
            elif isinstance(caps, int | float) and not isinstance(caps, bool) and caps <= 0:
                self.add("ADL-6001", f"budget {dimension} {caps!r} must be > 0", *path, dimension)

    def _degradation_response(self, response: Any, path: tuple[str | int, ...]) -> None:
        action = obj(response).get("action")
        if action is not None and not _is_in(action, DEGRADATION_ACTIONS):
            self.add(
                "ADL-6003", f"degradation action {action!r} is not halt, pause, fallback or continue", *path, "action"
            )

    def _sub_agents(self, sub_agents: Any) -> None:
        parent_tools = {t["name"] for t in arr(self.doc.get("tools")) if isinstance(obj(t).get("name"), str)}
        seen: set[str] = set()
        for i, entry in enumerate(arr(sub_agents)):
            name = obj(entry).get("name")
            if not isinstance(name, str) or not name:
                self.add("ADL-6009", "sub-agent has no name", "permissions", "sub_agents", i)
            elif name in seen:
                self.add("ADL-6009", f"sub-agent name '{name}' is not unique", "permissions", "sub_agents", i, "name")
            else:
                seen.add(name)
            for j, tool in enumerate(arr(obj(entry).get("tools"))):
                if not _is_in(tool, parent_tools):
                    self.add(
                        "ADL-6009",
                        f"sub-agent tool {tool!r} is not one of the parent's tools",
                        "permissions",
                        "sub_agents",
                        i,
                        "tools",
                        j,
                    )


def _normal_absolute(path: str) -> bool:
    return path.startswith("/") and not path.startswith("//") and posixpath.normpath(path) == path


def _schema_findings(validator: Any, document: dict[str, Any], profile_members: frozenset[str]) -> Iterator[Finding]:
    from .schema_errors import iter_leaf_errors

    for error in iter_leaf_errors(validator, document):
        path = tuple(error.absolute_path)
        if error.validator == "required":
            missing = re.match(r"^'(.*)' is a required property$", error.message)
            name = missing.group(1) if missing else error.message
            code, detail = "ADL-1003", f"Required member '{name}' is missing"
            member = path[0] if path else name
        elif error.validator == "format":
            code = {"date-time": "ADL-2005", "uri": "ADL-2006"}.get(error.validator_value, "ADL-1004")
            detail, member = error.message, None
        elif error.validator in ("unevaluatedProperties", "additionalProperties"):
            code, detail = "ADL-1004", f"{error.message} (not defined by ADL, a declared profile or an extension)"
            member = path[0] if path else None
        else:
            code, detail = _SCHEMA_CODES.get(str(error.validator), "ADL-1004"), error.message
            member = path[0] if path else None
        if code in ("ADL-1003", "ADL-1004") and member in profile_members:
            code, detail = "ADL-3001", f"{detail} (required by a declared profile)"
        yield Finding(code, detail, pointer(*path))


RULES: tuple[Callable[[_Check], None], ...] = (
    _Check.unique_names,
    _Check.timestamps_and_uris,
    _Check.json_schemas,
    _Check.profiles,
    _Check.lifecycle,
    _Check.enumerations,
    _Check.permission_patterns,
    _Check.pattern_warnings,
    _Check.digest_fields,
    _Check.data_classification,
    _Check.templates,
    _Check.security,
    _Check.runtime_limits,
)


def validate_adl(document: dict[str, Any], schemas: SchemaSet, now: datetime) -> tuple[list[Finding], SignatureResult]:
    """All findings (errors and warnings) for an ADL document, plus its signature state."""
    findings: list[Finding] = []
    adl_spec = document.get("adl_spec")
    version = supported_schema_version(adl_spec)
    if "adl_spec" not in document:
        findings.append(Finding("ADL-1003", "Required member 'adl_spec' is missing", ""))
    elif version is None:
        findings.append(
            Finding(
                "ADL-2001",
                f"adl_spec {adl_spec!r} is not a supported version (supported: 0.1.x, 0.2.x, 0.3.x)",
                "/adl_spec",
            )
        )
    schema_version = version or "0.3.0"
    profiles = tuple(p for p in arr(document.get("profiles")) if isinstance(p, str) and p in PROFILES)
    if not schemas.adl_accepts(schema_version, profiles, document):
        validator = schemas.adl_validator(schema_version, profiles)
        for f in _schema_findings(validator, document, schemas.profile_members(profiles)):
            if version is None and (f.pointer == "/adl_spec" or (f.code == "ADL-1003" and "'adl_spec'" in f.detail)):
                continue
            findings.append(f)
    for member in unknown_members(schemas, schema_version, profiles, document):
        findings.append(
            Finding(
                "ADL-1004",
                f"Member '{member}' is not defined by ADL {schema_version}, a declared "
                "profile or the extension mechanism",
                pointer(member),
            )
        )
    check = _Check(document, schema_version, now)
    for rule in RULES:
        rule(check)
    findings.extend(check.findings)
    signature = verify(document)
    findings.extend(_unsafe_integer_findings(document, signed="signature" in signature_member(document)))
    findings.extend(signature.findings)
    return _dedupe(findings), signature


def signature_member(document: dict[str, Any]) -> dict[str, Any]:
    """The attestation object, where a signature would be."""
    return obj(obj(document.get("security")).get("attestation"))


def _unsafe_integer_findings(document: dict[str, Any], signed: bool) -> Iterator[Finding]:
    """An integer beyond ±(2^53-1) is valid JSON; it matters only for JCS (RFC 8785), which cannot
    canonicalise it: a signed document holding one cannot be verified, an unsigned one cannot
    be signed."""
    for path in unsafe_integers(document):
        consequence = (
            "the signature cannot be verified over it" if signed else "the document cannot be signed (RFC 8785)"
        )
        yield Finding(
            "ENF-1007",
            f"integer is outside the I-JSON range ±(2^53-1): {consequence}",
            pointer(*path),
            "error" if signed else "warning",
        )


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen: set[tuple[str, str, str]] = set()
    out: list[Finding] = []
    for f in findings:
        key = (f.code, f.pointer, f.detail)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out
