"""The compiled-policy cache: hits give the policy a compile gives, any changed input misses, and
an entry nobody but this launcher could have written is the only kind ever read."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import pickle
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from enforcer import policy_cache
from enforcer.policy import NetworkConnect, ProcessExec, ToolCall, decide
from enforcer.policy.errors import DocumentRejected
from enforcer.sandbox.plan import HostFeatures

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "policies" / "examples"
FEATURES = HostFeatures(landlock_abi=7, cgroups="v1")
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, source in {
        "adl": EXAMPLES / "invoice-processor.adl.json",
        "aaif": EXAMPLES / "invoice-processor.aaif.json",
        "regions": REPO / "policies" / "regions.yaml",
        "baseline": REPO / "policies" / "runtime-baseline.yaml",
    }.items():
        out[name] = tmp_path / source.name
        shutil.copyfile(source, out[name])
    out["cache"] = tmp_path / "cache"
    return out


def load(files: dict[str, Path], now: datetime = NOW, **kw: object) -> policy_cache.Loaded:
    return policy_cache.load(
        files["adl"],
        files["aaif"],
        files["regions"],
        files["baseline"],
        production=False,
        home_region=None,
        features=FEATURES,
        directory=files["cache"],
        now=now,
        **kw,  # type: ignore[arg-type]
    )


def unsigned(files: dict[str, Path]) -> dict:
    """An unsigned document to edit (the invoice example's attestation would no longer verify)."""
    files["aaif"].unlink()
    files["aaif"].write_text(json.dumps({"sc_standard": "SC-006", "sc_version": "3.2.0"}))
    return json.loads((EXAMPLES / "research-agent.adl.json").read_text())


def entry_path(files: dict[str, Path]) -> Path:
    (entry,) = [p for p in files["cache"].iterdir() if not p.name.startswith(".")]
    return entry


def test_a_second_load_is_a_hit_and_decides_as_the_compiled_policy(files):
    first, second = load(files), load(files)
    assert (first.status, second.status) == ("miss", "hit")
    assert first.warning is None and second.warning is None
    assert second.policy.digest == first.policy.digest and second.baseline == first.baseline
    actions = [
        ToolCall("approve_payment", {"invoice_id": "INV-1", "amount": 50_000}),  # the AAIF condition: ASK
        ToolCall("approve_payment", {"invoice_id": "INV-1", "amount": 5}),
        ToolCall("approve_payment", {"invoice_id": 7}),  # fails the argument schema
        ToolCall("nonexistent", {}),
        NetworkConnect("api.stripe.com", 443, "https"),
        NetworkConnect("evil.example", 443, "https"),
        ProcessExec("/bin/sh", ["sh"]),
    ]
    for action in actions:
        assert decide(second.policy, action) == decide(first.policy, action), action


def test_the_entry_is_private_to_the_caller(files):
    load(files)
    mode = entry_path(files).stat().st_mode & 0o777
    assert mode == 0o600 and files["cache"].stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("name", ["adl", "aaif", "regions", "baseline"])
def test_a_changed_document_baseline_or_region_map_misses(files, name):
    load(files)
    assert load(files).status == "hit"
    path = files[name]
    path.write_bytes(path.read_bytes() + b"\n")  # same meaning, other bytes: still a different key
    assert load(files).status == "miss"
    assert load(files).status == "hit"


def test_changed_options_or_kernel_features_miss(files):
    load(files)
    base = dict(production=False, home_region=None, features=FEATURES, directory=files["cache"], now=NOW)
    args = (files["adl"], files["aaif"], files["regions"], files["baseline"])
    assert policy_cache.load(*args, **base).status == "hit"  # type: ignore[arg-type]
    for change in (
        {"production": True},
        {"home_region": "EU"},
        {"features": HostFeatures(landlock_abi=6, cgroups="v1")},
        {"features": HostFeatures(landlock_abi=7, cgroups="v1", egress_tools_missing=("nft",))},
    ):
        assert policy_cache.load(*args, **{**base, **change}).status == "miss", change  # type: ignore[arg-type]


def _rewrite(entry: Path, payload: bytes, secret: bytes) -> None:
    lines = entry.read_bytes().split(b"\n", 5)
    header = b"\n".join([lines[0], lines[1], lines[2], hashlib.sha256(payload).hexdigest().encode()]) + b"\n"
    mac = hmac.new(secret, header, hashlib.sha256).hexdigest().encode()
    entry.write_bytes(header + mac + b"\n" + payload)


def _permissive_payload(files: dict[str, Path]) -> bytes:
    """The cached pair with every network host allowed: what a poisoned entry would carry."""
    loaded = load(files)
    permissive = json.loads(files["adl"].read_text())
    permissive["permissions"]["network"]["allowed_hosts"] = ["*"]
    other = dict(files, adl=files["adl"].with_name("permissive.adl.json"), cache=files["cache"].with_name("other"))
    other["adl"].write_text(json.dumps(permissive))
    forged = load(other).policy
    assert decide(forged, NetworkConnect("evil.example", 443, "https")).verdict == "ALLOW"
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=5)
    pickler.dispatch_table = {
        **policy_cache.copyreg.dispatch_table,
        policy_cache.MappingProxyType: policy_cache._reduce_mapping,
    }  # type: ignore[attr-defined]
    pickler.dump((forged, loaded.baseline))
    return buffer.getvalue()


def test_an_entry_without_the_keyring_secret_is_not_read(files):
    """An agent running as the caller's uid may write to the cache directory: without the secret in
    the caller's keyring, which seccomp keeps from it, its entry is a miss."""
    files["adl"].write_text(json.dumps(unsigned(files)))
    files["aaif"] = None  # type: ignore[assignment]
    payload = _permissive_payload(files)
    entry = entry_path(files)
    _rewrite(entry, payload, b"\0" * 32)  # well-formed, digest right, MAC under another secret
    loaded = load(files)
    assert loaded.status == "miss"
    assert decide(loaded.policy, NetworkConnect("evil.example", 443, "https")).verdict == "DENY"
    # Control: under the keyring's secret the same entry is read, so the MAC is what refused it.
    _rewrite(entry, payload, policy_cache.user_secret(policy_cache.KEYRING_NAME))
    loaded = load(files)
    assert loaded.status == "hit"
    assert decide(loaded.policy, NetworkConnect("evil.example", 443, "https")).verdict == "ALLOW"


class _Global:
    """Pickles as a reference to module.name, called with `args`."""

    def __init__(self, module: str, name: str, *args: object) -> None:
        self.module, self.name, self.args = module, name, args

    def __reduce__(self):  # type: ignore[no-untyped-def]
        import importlib

        return (getattr(importlib.import_module(self.module), self.name), self.args)


@pytest.mark.parametrize(
    ("module", "name"),
    [("os", "system"), ("enforcer.policy.model", "cached_property"), ("enforcer.policy.argschema", "build_validator")],
)
def test_the_unpickler_builds_only_policy_types(files, tmp_path, module, name):
    """Even an entry that passes every check cannot make the launcher call anything else: not a
    foreign function, nor what a policy module merely imported, nor its functions."""
    load(files)
    marker = tmp_path / "ran"
    secret = policy_cache.user_secret(policy_cache.KEYRING_NAME)
    _rewrite(entry_path(files), pickle.dumps((_Global(module, name, f"touch {marker}"), None)), secret)
    assert load(files).status == "miss"
    assert not marker.exists()


def test_the_same_baseline_under_another_path_misses(files):
    load(files)
    moved = files["baseline"].with_name("elsewhere.yaml")
    shutil.copyfile(files["baseline"], moved)
    loaded = load(dict(files, baseline=moved))
    assert loaded.status == "miss" and loaded.baseline.path == moved


@pytest.mark.parametrize("damage", ["truncate", "flip", "rename"])
def test_a_damaged_or_misfiled_entry_misses(files, damage):
    load(files)
    entry = entry_path(files)
    raw = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(raw[:-10])
    elif damage == "flip":
        entry.write_bytes(raw[:-5] + bytes([raw[-5] ^ 1]) + raw[-4:])
    else:  # an intact entry for other documents, filed under this key
        other = dict(files, adl=files["adl"].with_name("other.adl.json"))
        other["adl"].write_bytes(files["adl"].read_bytes() + b" ")
        load(other)
        (theirs,) = [p for p in files["cache"].iterdir() if p != entry]
        os.replace(theirs, entry)
    assert load(files).status == "miss"


def test_a_directory_others_can_write_is_not_used(files):
    load(files)
    files["cache"].chmod(0o777)
    loaded = load(files)
    assert loaded.status == "off" and "writable by group or others" in (loaded.warning or "")
    files["cache"].chmod(0o700)
    files["cache"].parent.chmod(0o777)  # an ancestor that is not a root-owned sticky directory
    try:
        loaded = load(files)
    finally:
        files["cache"].parent.chmod(0o755)
    assert loaded.status == "off" and "writable by group or others" in (loaded.warning or "")
    assert load(files).status == "hit"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_an_entry_or_directory_owned_by_another_user_is_not_used(files):
    load(files)
    entry = entry_path(files)
    os.chown(entry, 65534, 65534)
    loaded = load(files)
    assert loaded.status == "off" and "not a private file" in (loaded.warning or "")
    os.chown(files["cache"], 65534, 65534)
    loaded = load(files)
    assert loaded.status == "off" and "owned by uid 65534" in (loaded.warning or "")


def test_an_entry_is_used_only_between_the_time_boundaries_around_its_compile(files):
    sunset = NOW + timedelta(days=60)
    doc = unsigned(files)
    files["aaif"] = None  # type: ignore[assignment]
    doc["lifecycle"] = {"status": "active", "sunset_date": sunset.strftime("%Y-%m-%dT%H:%M:%SZ")}
    files["adl"].write_text(json.dumps(doc))
    assert load(files).status == "miss"
    assert load(files, NOW + timedelta(days=29)).status == "hit"
    assert load(files, NOW - timedelta(days=400)).status == "hit"  # no boundary before it either
    near = load(files, sunset - timedelta(days=1))  # within 30 days of the sunset: recompiled, warned
    assert near.status == "miss" and near.policy.lifecycle.verdict == "warn"
    with pytest.raises(DocumentRejected):
        load(files, sunset + timedelta(seconds=1))  # past the sunset while active: refused


def test_a_changed_parsed_yaml_table_changes_the_code_fingerprint(tmp_path, monkeypatch):
    # The table stands in for parsing the packaged region map and baseline: entries compiled with
    # another table must miss.
    package = tmp_path / "enforcer"
    for part in policy_cache._CODE:
        source = policy_cache._PACKAGE / part
        if source.is_dir():
            shutil.copytree(source, package / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (package / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, package / part)
    shutil.copytree(policy_cache._PACKAGE / "data" / "schemas", package / "data" / "schemas")
    monkeypatch.setattr(policy_cache, "_PACKAGE", package)
    before = policy_cache.code_fingerprint(None)
    assert policy_cache.code_fingerprint(None) == before
    table = package / "data" / "parsed.json"
    table.write_text(table.read_text().replace('"file"', '"file" ', 1))
    assert policy_cache.code_fingerprint(None) != before


def test_the_code_that_reads_the_parsed_yaml_table_is_in_the_code_fingerprint(tmp_path, monkeypatch):
    # enforcer/data/parsed.py decides which bytes the table stands in for, as plan.py and the loader
    # decide how other bytes parse: an edit of it must make compiled entries miss too.
    package = tmp_path / "enforcer"
    (package / "data").mkdir(parents=True)
    shutil.copyfile(policy_cache._PACKAGE / "data" / "parsed.py", package / "data" / "parsed.py")
    monkeypatch.setattr(policy_cache, "_PACKAGE", package)
    before = policy_cache.code_fingerprint(None)
    assert policy_cache.code_fingerprint(None) == before
    lookup = package / "data" / "parsed.py"
    lookup.write_text(lookup.read_text() + "\n")
    assert policy_cache.code_fingerprint(None) != before
