"""The compiled-policy cache: a launch with the same documents skips validating and compiling them.

An entry is the pickled (Policy, Baseline) pair, filed under a key that digests every input of the
compilation: the bytes of the ADL and AAIF documents, the region map and the runtime baseline, the
compile options, the host's kernel features, the caller's uid and a fingerprint of the enforcer's
own code and schemas. An entry is a compiled policy the launch will enforce, and reading a pickle
runs code: whoever can write one owns every later launch. So each entry carries an HMAC under a
secret kept in the caller's kernel keyring, which no sandboxed agent can reach (seccomp denies
the keyring calls) even when it runs as the same uid and could write to the cache directory. It
is also read only from a directory no other user can write to (every directory above it
included), from a file the caller owns, when its header names the expected key, and through an
unpickler that only builds the types a compiled policy is made of. Anything else is a miss: the
documents are compiled again. Without a keyring there is no cache.

Compiling depends on the time only through the lifecycle sunset and the attestation expiry
(compiler.time_boundaries): an entry records the interval between the boundaries around the time
it was compiled, and is used only inside it.
"""

from __future__ import annotations

import contextlib
import copyreg
import hashlib
import hmac
import io
import os
import pickle
import stat
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from . import data, paths
from .keyring import KeyringUnavailable, user_secret
from .quick_dataclass import dataclass

if TYPE_CHECKING:
    from .policy.model import Policy
    from .sandbox.plan import Baseline, HostFeatures

MAGIC = b"adl-enforcer compiled policy 1\n"
KEYRING_NAME = "adl-enforcer:policy-cache"
# Larger documents are refused by the loader; they are never cached either.
MAX_INPUT_BYTES = 4 * 1024 * 1024
MAX_ENTRY_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 256
_PACKAGE = Path(__file__).resolve().parent
# The code a compiled policy depends on; the libraries that validate documents are in the key by
# their installed files, so an upgrade misses too.
_CODE = (
    "policy",
    "documents.py",
    "policy_cache.py",
    "sandbox/plan.py",
    "version.py",
    "data/__init__.py",
    "data/parsed.py",
    "data/parsed.json",
)
_LIBRARIES = ("jsonschema", "jsonschema_rs", "referencing", "rfc8785", "idna", "ruamel")


class UntrustedCache(Exception):
    """The cache directory or an entry could be written by someone else: it is not read."""


@dataclass(frozen=True)
class Loaded:
    policy: Policy
    baseline: Baseline
    status: str  # hit | miss | off
    warning: str | None = None  # why the cache was not used, when that needs the operator
    adl_bytes: bytes = b""  # the ADL document's bytes the policy was compiled from


@dataclass(frozen=True)
class _Inputs:
    adl: bytes
    aaif: bytes | None
    regions: bytes | None
    baseline: bytes
    baseline_path: str  # the cached Baseline names it (launch records show it)


def load(
    adl_path: Path,
    aaif_path: Path | None,
    regions_path: Path | None,
    baseline_path: Path,
    *,
    production: bool,
    home_region: str | None,
    features: HostFeatures,
    directory: Path | None,
    spec_dir: Path | None = None,
    now: datetime | None = None,
) -> Loaded:
    """The compiled policy and baseline for these files, from the cache in `directory` when it holds
    them (None: no cache). `spec_dir`: the schemas to validate with (None: the package's own).

    Raises what compiling raises (PolicyFileError, DocumentRejected, PlanError, OSError)."""
    now = now or datetime.now(UTC)
    if regions_path is None and data.REGIONS.is_file():
        regions_path = data.REGIONS
    inputs = _Inputs(
        adl=_read(adl_path),
        aaif=_read(aaif_path) if aaif_path else None,
        regions=_read(regions_path) if regions_path else None,
        baseline=_read(baseline_path),
        baseline_path=str(baseline_path),
    )
    key = entry_key(inputs, production, home_region, features, spec_dir)
    warning = None
    secret = b""
    if directory is not None:
        try:
            secret = user_secret(KEYRING_NAME)
        except KeyringUnavailable:
            directory = None
    if directory is not None:
        try:
            found = _read_entry(directory, key, now, secret)
        except UntrustedCache as exc:
            warning, directory = f"compiled-policy cache not used: {exc}", None
        else:
            if found is not None:
                return Loaded(found[0], found[1], "hit", adl_bytes=inputs.adl)
    policy, baseline, valid = _compile(
        inputs, adl_path, aaif_path, regions_path, baseline_path, production, home_region, now, spec_dir
    )
    if directory is not None:
        try:
            _write_entry(directory, key, valid, (policy, baseline), secret)
        except UntrustedCache as exc:
            warning = f"compiled-policy cache not used: {exc}"
        except OSError:
            pass  # a cache that cannot be written costs the next launch a compile, nothing else
    return Loaded(policy, baseline, "miss" if directory is not None else "off", warning, inputs.adl)


def _read(path: Path) -> bytes:
    from .documents import PolicyFileError

    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise PolicyFileError(str(path), f"cannot read: {exc.strerror}") from exc


def entry_key(
    inputs: _Inputs, production: bool, home_region: str | None, features: HostFeatures, spec_dir: Path | None
) -> str:
    digest = hashlib.sha256(MAGIC)
    parts: list[bytes | None] = [
        code_fingerprint(spec_dir).encode(),
        str(os.geteuid()).encode(),
        inputs.adl,
        inputs.aaif,
        inputs.regions,
        inputs.baseline,
        inputs.baseline_path.encode(),
        repr((production, home_region)).encode(),
        repr(features).encode(),
    ]
    for part in parts:
        # Length-prefixed, so no two different inputs serialise alike.
        digest.update(b"-" if part is None else len(part).to_bytes(8, "big") + hashlib.sha256(part).digest())
    return digest.hexdigest()


def code_fingerprint(spec_dir: Path | None) -> str:
    """Size and modification time of the enforcer's policy code, its schemas (`spec_dir`'s too) and
    the validating libraries: a reinstall or an edit changes it."""
    digest = hashlib.sha256(sys.version.encode())
    roots = [_PACKAGE / p for p in _CODE] + [_PACKAGE / "data" / "schemas"]
    digest.update(repr(str(spec_dir) if spec_dir else None).encode())
    if spec_dir:
        roots.append(spec_dir)
    for root in roots:
        _stat_tree(root, digest)
    # A library's directory changes when an upgrade replaces its files.
    for library in _library_paths():
        _stat_tree(library, digest, recurse=False)
    return digest.hexdigest()


def _library_paths() -> list[Path]:
    found = []
    for entry in sys.path:
        for name in _LIBRARIES:
            for candidate in (Path(entry) / name, Path(entry) / f"{name}.py"):
                if candidate.exists():
                    found.append(candidate)
    return found


def _stat_tree(path: Path, digest: Any, recurse: bool = True) -> None:
    try:
        st = os.stat(path)
    except OSError:
        digest.update(f"{path}:absent\n".encode())
        return
    digest.update(f"{path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}\n".encode())
    if recurse and stat.S_ISDIR(st.st_mode):
        for name in sorted(os.listdir(path)):
            if name != "__pycache__":
                _stat_tree(path / name, digest)


def _compile(
    inputs: _Inputs,
    adl_path: Path,
    aaif_path: Path | None,
    regions_path: Path | None,
    baseline_path: Path,
    production: bool,
    home_region: str | None,
    now: datetime,
    spec_dir: Path | None,
) -> tuple[Policy, Baseline, tuple[float, float]]:
    from .documents import compile_documents, document_from_bytes, regions_from_bytes
    from .policy.compiler import time_boundaries
    from .policy.model import CompileOptions
    from .policy.regions import RegionMap
    from .sandbox.plan import PlanError, load_baseline

    # Compiled from the very bytes the key digests: a file changed meanwhile cannot be filed
    # under the old content's key.
    adl = document_from_bytes(inputs.adl, str(adl_path), "adl")
    aaif = document_from_bytes(inputs.aaif, str(aaif_path), "aaif") if inputs.aaif is not None else None
    regions = regions_from_bytes(inputs.regions, str(regions_path)) if inputs.regions is not None else RegionMap.empty()
    options = CompileOptions(production=production, regions=regions, home_region=home_region)
    policy = compile_documents(adl, aaif, options, now, spec_dir)
    baseline = load_baseline(baseline_path)
    if baseline.digest != "sha256:" + hashlib.sha256(inputs.baseline).hexdigest():
        raise PlanError(f"{baseline_path} changed while it was read")
    boundaries = [b.timestamp() for b in time_boundaries(adl)]
    moment = now.timestamp()
    valid = (
        max((b for b in boundaries if b <= moment), default=float("-inf")),
        min((b for b in boundaries if b > moment), default=float("inf")),
    )
    return policy, baseline, valid


def parsed_table() -> dict[str, dict[str, dict[str, Any]]]:
    """What enforcer/data/parsed.json must hold (see enforcer.data.parsed): each packaged YAML file
    as its reader parses it, by the SHA-256 of its bytes. Raises ValueError for a value JSON would
    not carry unchanged."""

    from .documents import document_from_bytes
    from .sandbox.plan import parse_baseline

    readers = {
        "yaml-document": (data.REGIONS, lambda raw, name: document_from_bytes(raw, name)),
        "baseline": (data.RUNTIME_BASELINE, lambda raw, name: parse_baseline(raw)),
    }
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for reader, (path, parse) in readers.items():
        raw = path.read_bytes()
        value = parse(raw, path.name)
        if not _plain_json(value):
            raise ValueError(f"{path} does not parse to plain JSON values")
        table[reader] = {hashlib.sha256(raw).hexdigest(): {"file": path.name, "value": value}}
    return table


def _plain_json(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            if not all(type(key) is str for key in item):
                return False
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
        elif type(item) not in (str, int, float, bool, type(None)) or item != item:
            return False  # a tuple, a timestamp, a parser's own scalar type, NaN
    return True


# ---- entries on disk ---------------------------------------------------------------------------


def _trusted_directory(directory: Path, create: bool) -> int:
    """An O_PATH-free descriptor of `directory` once it and every directory above it are writable
    only by root or the caller (a root-owned sticky directory such as /tmp may be above it)."""
    try:
        real = paths.make_private_dir(directory, 0o700) if create else paths.check_private(directory)
    except PermissionError as exc:
        raise UntrustedCache(str(exc)) from exc
    except OSError as exc:
        raise UntrustedCache(f"cannot {'create' if create else 'check'} {directory}: {exc.strerror}") from exc
    fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st, named = os.fstat(fd), os.lstat(real)
    if (st.st_dev, st.st_ino) != (named.st_dev, named.st_ino):
        os.close(fd)
        raise UntrustedCache(f"{real} changed while it was checked")
    return fd


def _read_entry(directory: Path, key: str, now: datetime, secret: bytes) -> tuple[Policy, Baseline] | None:
    if not directory.is_dir():
        return None
    dir_fd = _trusted_directory(directory, create=False)
    try:
        try:
            fd = os.open(key, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UntrustedCache(f"entry {key}: {exc.strerror}") from exc
        with open(fd, "rb") as handle:
            st = os.fstat(handle.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
                raise UntrustedCache(f"entry {directory / key} is not a private file of uid {os.geteuid()}")
            raw = handle.read(MAX_ENTRY_BYTES + 1)
    finally:
        os.close(dir_fd)
    return _decode(raw, key, now.timestamp(), secret)


def _decode(raw: bytes, key: str, moment: float, secret: bytes) -> tuple[Policy, Baseline] | None:
    """The entry's payload when its MAC and header match; None (a miss) for anything else."""
    stream = io.BytesIO(raw)
    if len(raw) > MAX_ENTRY_BYTES or stream.readline() != MAGIC:
        return None
    header = [stream.readline().rstrip(b"\n") for _ in range(4)]
    mac = hmac.new(secret, MAGIC + b"\n".join(header[:3]) + b"\n", hashlib.sha256).hexdigest().encode()
    if not hmac.compare_digest(header[3], mac) or header[0] != key.encode():
        return None
    try:
        valid_from, valid_until = (float(v) for v in header[1].split(b" "))
    except ValueError:
        return None
    payload = stream.read()
    if header[2] != hashlib.sha256(payload).hexdigest().encode() or not valid_from <= moment < valid_until:
        return None
    try:
        value = _Unpickler(io.BytesIO(payload)).load()
    except Exception:
        return None
    return value if isinstance(value, tuple) and len(value) == 2 else None


def _write_entry(
    directory: Path, key: str, valid: tuple[float, float], value: tuple[Policy, Baseline], secret: bytes
) -> None:
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=5)
    pickler.dispatch_table = {**copyreg.dispatch_table, MappingProxyType: _reduce_mapping}
    pickler.dump(value)
    payload = buffer.getvalue()
    header = b"".join(
        [
            MAGIC,
            key.encode() + b"\n",
            f"{valid[0]!r} {valid[1]!r}\n".encode(),
            hashlib.sha256(payload).hexdigest().encode() + b"\n",
        ]
    )
    mac = hmac.new(secret, header, hashlib.sha256).hexdigest().encode()
    entry = header + mac + b"\n" + payload
    dir_fd = _trusted_directory(directory, create=True)
    try:
        paths.replace_file(dir_fd, key, entry, 0o600)
        _prune(dir_fd)
    finally:
        os.close(dir_fd)


def _prune(dir_fd: int) -> None:
    """Keep the newest MAX_ENTRIES entries."""
    entries = []
    for name in os.listdir(dir_fd):
        try:
            entries.append((os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime_ns, name))
        except FileNotFoundError:
            continue
    for _, name in sorted(entries)[: max(0, len(entries) - MAX_ENTRIES)]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)


def _reduce_mapping(value: MappingProxyType[Any, Any]) -> tuple[Any, ...]:
    return (read_only, (dict(value),))


def read_only(value: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    """Unpickles a mapping proxy (the type itself has no importable name)."""
    return MappingProxyType(value)


# What a compiled policy and baseline are built from; an entry naming anything else is refused.
_ALLOWED = {
    "builtins": {"frozenset", "set", "object", "complex"},
    "copyreg": {"_reconstructor"},
    "enforcer.policy_cache": {"read_only"},
    "re": {"_compile"},
    "pathlib": {"PosixPath", "Path"},
    "ipaddress": {"IPv4Address", "IPv6Address", "IPv4Network", "IPv6Network"},
    "enforcer.policy.model": None,
    "enforcer.policy.patterns": None,
    "enforcer.policy.regions": None,
    "enforcer.policy.errors": None,
    "enforcer.policy.argschema": {"ArgumentSchema"},
    "enforcer.policy.conditions": {"compile_condition"},
    "enforcer.sandbox.plan": {"Baseline"},
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get(module, ())
        if allowed is not None and name not in allowed:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a compiled policy")
        found = super().find_class(module, name)
        if allowed is None and not (isinstance(found, type) and found.__module__ == module):
            # Of a policy module, only the classes it defines (not what it imported).
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a compiled policy")
        return found
