"""Modules planted by the agent where root imports from. `python -m enforcer.cli.exec` puts its
working directory first on sys.path, adl-exec imports some modules only when it first needs them
(after the agent has started: its report, the end of the session), and the agent may write to that
directory when it is its workspace. Every module name the interpreter could look up is planted
there while the session runs; none may be imported by root."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

from ..helpers.sandbox import AGENT_GID, AGENT_UID, AGENT_USER, Sandbox, needs_root

pytestmark = needs_root

PLANT = """
import os
names, markers = os.environ["ALLOWED_NAMES"].split(), os.environ["ALLOWED_MARKERS"]
for name in names:
    with open(name + ".py", "w") as f:
        f.write(f"open({markers!r} + '/{name}', 'w').close()\\n")
print("PLANTED", len(names), flush=True)
for denied in (os.environ["ALLOWED_OUTSIDE"], "/etc/shadow"):  # kernel denials: the report explains them
    try:
        open(denied).read()
    except OSError:
        pass
"""


def module_names() -> list[str]:
    """Every top-level name the launcher's interpreter might import: the standard library's and
    those of each installed distribution."""
    names = set(sys.stdlib_module_names)
    for dist in importlib.metadata.distributions():
        top = dist.read_text("top_level.txt") or ""
        names.update(top.split())
        names.update(p.parts[0].removesuffix(".py") for p in dist.files or () if len(p.parts) >= 1)
    return sorted(n for n in names if n.isidentifier() and n not in {"__future__", "__main__", "enforcer"})


def test_root_imports_nothing_the_agent_plants_in_the_working_directory(sandbox: Sandbox, tmp_path: Path) -> None:
    markers = tmp_path / "imported"  # root writes a name here when it runs a planted module
    markers.mkdir()
    names = module_names()
    environ = sandbox.environ(
        {
            "ALLOWED_NAMES": " ".join(names),
            "ALLOWED_MARKERS": str(markers),
            "ALLOWED_OUTSIDE": str(sandbox.outside / "private.txt"),
        }
    )
    argv = [sys.executable, "-m", "enforcer.cli.exec", "--adl", str(sandbox.policy()), "--report"]
    proc = subprocess.run(
        [*argv, "--user", AGENT_USER, "--", "python3", "-c", PLANT],
        cwd=sandbox.ws,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    planted = [n for n in names if (sandbox.ws / f"{n}.py").exists()]
    assert proc.returncode == 0 and f"PLANTED {len(names)}" in proc.stdout, proc.stdout + proc.stderr
    assert len(planted) == len(names) > 300  # the control: the agent could write every one of them
    assert sorted(p.name for p in markers.iterdir()) == [], proc.stderr


def test_a_python_path_others_may_write_is_refused_before_anything_runs(sandbox: Sandbox, tmp_path: Path) -> None:
    """The operator's PYTHONPATH names a directory the agent may write (its workspace, owned by its
    uid). The interpreter imports from there at its start (sitecustomize, encodings: the agent's
    code as root, before any of adl-exec's), and adl-exec lazily after (the egress filter, uid 0,
    loads dnspython as the session starts: a dns.py planted in an earlier session ran there). Only
    a refusal at the first start, before any agent ran with it, keeps the agent from planting: each
    entry must be a directory only root (this process's user) may write, as must those above it."""
    trusted = tmp_path / "lib"
    trusted.mkdir(mode=0o755)
    (trusted / "harmless.py").write_text("")
    for entries in ([str(sandbox.ws)], [str(trusted), str(sandbox.ws)], ["relative/lib"], [str(tmp_path / "gone")]):
        ran = sandbox.python("print('ran')", env={"PYTHONPATH": os.pathsep.join(entries)})
        assert ran.code == 2 and ran.out == "" and ran.records == [], (entries, ran.code, ran.out, ran.err)
        assert "PYTHONPATH" in ran.err and entries[-1] in ran.err, ran.err
    control = sandbox.python("print('ran')", env={"PYTHONPATH": str(trusted)})  # root's own, 0755
    assert control.code == 0 and control.out.strip() == "ran", control.err


def test_an_empty_python_path_entry_is_refused_as_the_working_directory(sandbox: Sandbox, tmp_path: Path) -> None:
    """An empty PYTHONPATH entry (`$PYTHONPATH:/opt/lib` with PYTHONPATH unset, a trailing or
    doubled separator) is the working directory to the interpreter, as `.` is, whichever directory
    the operator starts from: the agent's workspace, say. Refused like a relative entry."""
    trusted = tmp_path / "lib"
    trusted.mkdir(mode=0o755)
    for value in (f":{trusted}", f"{trusted}:", f"{trusted}::{trusted}"):
        ran = sandbox.python("print('ran')", env={"PYTHONPATH": value})
        assert ran.code == 2 and ran.out == "" and ran.records == [], (value, ran.code, ran.out, ran.err)
        assert "PYTHONPATH names '': an empty entry" in ran.err, ran.err


def test_a_pycache_prefix_or_user_base_others_may_write_is_refused(sandbox: Sandbox, tmp_path: Path) -> None:
    """A pycache prefix is where the interpreter reads compiled modules from, in place of their
    sources (the standard library's encodings included, at its start): a module compiled by the
    agent, its header naming the size and time of the source it stands for (which the agent may
    stat), runs as root at the next import of that module. PYTHONUSERBASE names the user's
    site-packages, whose .pth files run at the interpreter's start. Each is checked as a
    PYTHONPATH entry is, -X pycache_prefix included."""
    for name, value in (
        ("PYTHONPYCACHEPREFIX", str(sandbox.ws)),  # the agent's own
        ("PYTHONPYCACHEPREFIX", str(sandbox.ws / "pycache")),  # not there yet: the agent may make it
        ("PYTHONPYCACHEPREFIX", "pycache"),  # relative to whatever directory a process is in
        ("PYTHONUSERBASE", str(sandbox.ws)),
    ):
        ran = sandbox.python("print('ran')", env={name: value})
        assert ran.code == 2 and ran.out == "" and ran.records == [], (name, value, ran.code, ran.out, ran.err)
        assert f"{name} names {value!r}" in ran.err, ran.err
    argv = sandbox.exec_argv("python3", "-c", "print('ran')", args=("--report",))
    assert argv[len(sandbox.wrap)] == sys.executable
    argv[len(sandbox.wrap) + 1 : len(sandbox.wrap) + 1] = ["-X", f"pycache_prefix={sandbox.ws}"]
    proc = subprocess.run(argv, env=sandbox.environ(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    assert f"-X pycache_prefix names {str(sandbox.ws)!r}" in proc.stderr, proc.stderr
    trusted = tmp_path / "pycache"  # root's own, 0755: still runs, compiled modules read from there
    trusted.mkdir(mode=0o755)
    control = sandbox.python("print('ran')", env={"PYTHONPYCACHEPREFIX": str(trusted), "PYTHONUSERBASE": str(trusted)})
    assert control.code == 0 and control.out.strip() == "ran", control.err


def test_a_platlibdir_that_moves_the_standard_library_is_refused(sandbox: Sandbox) -> None:
    """PYTHONPLATLIBDIR names the standard library's directory below the interpreter's prefix
    ("lib64" for "lib"); a path climbing out of it ("../../..") or an absolute one moves the whole
    standard library (encodings, imported at the start; lib-dynload's C modules) there: to a
    directory the agent may write, where it mirrors the real one (links to it, here) until it
    replaces a module. Refused unless a plain directory name."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    planted = sandbox.ws / "stdlib"
    planted.mkdir()
    (planted / version).symlink_to(Path(sys.base_prefix) / sys.platlibdir / version)
    climb = os.path.relpath(planted, sys.base_prefix)
    assert climb.startswith("..") and os.sep in climb
    for value in (climb, str(planted)):
        ran = sandbox.python("print('ran')", env={"PYTHONPLATLIBDIR": value})
        assert ran.code == 2 and ran.out == "" and ran.records == [], (value, ran.code, ran.out, ran.err[-2000:])
        assert f"PYTHONPLATLIBDIR names {value!r}" in ran.err, ran.err
    control = sandbox.python("print('ran')", env={"PYTHONPLATLIBDIR": sys.platlibdir})  # the usual one
    assert control.code == 0 and control.out.strip() == "ran", control.err


def test_a_library_path_or_preload_others_may_write_is_refused(sandbox: Sandbox, tmp_path: Path) -> None:
    """The dynamic loader's variables do for C libraries what PYTHONPATH does for modules:
    LD_LIBRARY_PATH is searched first for what a C extension needs as it is imported (lazily too,
    once the agent runs: a libssl.so.3 the agent planted there would be loaded by root), and an
    empty entry there is the working directory; LD_PRELOAD and LD_AUDIT load the library they name
    into root's process at its start. Each is held to PYTHONPATH's rules, a library named by a path
    to a file only root may write; one named without a slash is looked up in the checked path."""
    planted = sandbox.ws / "libplanted.so"
    planted.write_bytes(b"")
    os.chown(planted, AGENT_UID, AGENT_GID)  # the agent's, as if it had written it
    for name, value in (
        ("LD_LIBRARY_PATH", str(sandbox.ws)),
        ("LD_LIBRARY_PATH", f"/usr/lib:{sandbox.ws}"),
        ("LD_LIBRARY_PATH", "/usr/lib:"),  # the working directory
        ("LD_LIBRARY_PATH", "/usr/lib;lib"),
        ("LD_PRELOAD", str(planted)),
        ("LD_AUDIT", str(planted)),
    ):
        # The loader reads the variable for adl-exec's own start as well: it must load nothing
        # there, the planted library being empty (and so refused by the loader with a warning).
        ran = sandbox.python("print('ran')", env={name: value})
        assert ran.code == 2 and ran.out == "" and ran.records == [], (name, value, ran.code, ran.out, ran.err)
        assert f"{name} names " in ran.err, ran.err
    trusted = tmp_path / "lib"
    trusted.mkdir(mode=0o755)
    control = sandbox.python("print('ran')", env={"LD_LIBRARY_PATH": str(trusted), "LD_PRELOAD": "libc.so.6"})
    assert control.code == 0 and control.out.strip() == "ran", control.err


def test_a_loader_path_with_a_token_the_loader_rewrites_is_refused(sandbox: Sandbox, tmp_path: Path) -> None:
    """The loader rewrites $LIB, $PLATFORM and $ORIGIN (braced or not) in LD_LIBRARY_PATH and in
    the libraries LD_PRELOAD and LD_AUDIT name before it looks there: '<base>/$LIB' is searched as
    '<base>/lib/x86_64-linux-gnu' (say). A directory literally named '$LIB' that only root may write
    passed the check while the loader searched one the agent may write. Refused."""
    base = tmp_path / "base"
    base.mkdir(mode=0o755)
    (base / "$LIB").mkdir(mode=0o755)  # what the check saw
    (base / "${PLATFORM}").mkdir(mode=0o755)
    (base / "$LIB" / "libx.so").write_bytes(b"")
    for name, value in (
        ("LD_LIBRARY_PATH", f"{base}/$LIB"),
        ("LD_LIBRARY_PATH", f"/usr/lib:{base}/${{PLATFORM}}"),
        ("LD_PRELOAD", f"{base}/$LIB/libx.so"),
        ("LD_AUDIT", f"{base}/$LIB/libx.so"),
    ):
        ran = sandbox.python("print('ran')", env={name: value})
        assert ran.code == 2 and ran.out == "" and ran.records == [], (name, value, ran.code, ran.out, ran.err)
        assert f"{name} names " in ran.err and "$ tokens" in ran.err, ran.err


def test_a_converter_or_locale_path_others_may_write_is_refused(sandbox: Sandbox, tmp_path: Path) -> None:
    """The C library loads its character set converters from GCONV_PATH: a gconv-modules file
    there naming a converter for UTF-8 has its shared library run as the interpreter decodes its
    arguments at its start (the converter's init ran as uid 0 in `env -i GCONV_PATH=<dir> python3`),
    the egress filter's and every later start included. LOCPATH names the locale files it parses,
    which name the converters. Both are held to PYTHONPATH's rules."""
    for name, value in (
        ("GCONV_PATH", str(sandbox.ws)),
        ("GCONV_PATH", f"/usr/lib:{sandbox.ws}"),
        ("GCONV_PATH", "gconv"),
        ("LOCPATH", str(sandbox.ws)),
    ):
        ran = sandbox.python("print('ran')", env={name: value})
        assert ran.code == 2 and ran.out == "" and ran.records == [], (name, value, ran.code, ran.out, ran.err)
        assert f"{name} names " in ran.err, ran.err
    trusted = tmp_path / "gconv"
    trusted.mkdir(mode=0o755)
    control = sandbox.python("print('ran')", env={"GCONV_PATH": str(trusted), "LOCPATH": str(trusted)})
    assert control.code == 0 and control.out.strip() == "ran", control.err


# Execs its arguments with the environment it got plus one more entry, ADL_TEST_DUPLICATE's value:
# a variable given twice, which no mapping (subprocess's env) can express.
GIVE_TWICE = """
import ctypes, os, sys
extra = os.environb.pop(b"ADL_TEST_DUPLICATE")
envp = [b"%s=%s" % item for item in os.environb.items()] + [extra]
argv = [os.fsencode(arg) for arg in sys.argv[1:]]
strings = lambda items: (ctypes.c_char_p * (len(items) + 1))(*items, None)
ctypes.CDLL(None, use_errno=True).execve(argv[0], strings(argv), strings(envp))
sys.exit(f"execve: {os.strerror(ctypes.get_errno())}")
"""


def test_a_loader_variable_given_twice_is_checked_in_each_value(sandbox: Sandbox, tmp_path: Path) -> None:
    """An environment may name a variable twice. os.environ (and getenv) then hold the first value,
    the loader takes the last: LD_LIBRARY_PATH given as a root 0755 directory and then as the
    agent's workspace passed the check (made on the first) while the loader searched the
    workspace (seen with LD_DEBUG=libs). So did an empty first value, taken as unset. Each value
    is checked."""
    trusted = tmp_path / "lib"
    trusted.mkdir(mode=0o755)
    sandbox.wrap = [sys.executable, "-c", GIVE_TWICE]
    for first in (str(trusted), ""):
        ran = sandbox.python(
            "print('ran')",
            env={"LD_LIBRARY_PATH": first, "ADL_TEST_DUPLICATE": f"LD_LIBRARY_PATH={sandbox.ws}"},
        )
        assert ran.code == 2 and ran.out == "" and ran.records == [], (first, ran.code, ran.out, ran.err)
        assert f"LD_LIBRARY_PATH names '{sandbox.ws}'" in ran.err, ran.err
    control = sandbox.python(
        "print('ran')", env={"LD_LIBRARY_PATH": "", "ADL_TEST_DUPLICATE": f"LD_LIBRARY_PATH={trusted}"}
    )
    assert control.code == 0 and control.out.strip() == "ran", control.err
