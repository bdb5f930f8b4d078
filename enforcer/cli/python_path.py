"""No directory the interpreter imports from, or reads compiled modules from, that anyone but root
(the command's user) may write: PYTHONPATH, PYTHONHOME, PYTHONUSERBASE, PYTHONPYCACHEPREFIX; no
PYTHONPLATLIBDIR that moves the standard library out of the interpreter's prefix.

The interpreter imports from there at its start (sitecustomize, encodings, the .pth files of the
user's site-packages), before any of the command's code, and the commands import some modules lazily
after: the egress filter (uid 0 in the host's mount namespace) loads dnspython as an agent's session
starts. A pycache prefix is worth as much: a compiled module found there is run in place of its
source as long as its header names the source's size and time, which the agent may read. Named by
an operator, an agent's workspace would have what the agent planted there run as root from its next
session on. Refused at the first start, before any agent could plant anything.

An empty PYTHONPATH entry (a leading, trailing or doubled separator: `$PYTHONPATH:/opt/lib` with
PYTHONPATH unset) is the working directory, as `.` is: refused like any relative entry.

The dynamic loader's variables have the same effect one level down: LD_LIBRARY_PATH is searched
first for the libraries a C extension needs when it is imported (lazily too: after the agent has
started), LD_PRELOAD and LD_AUDIT name libraries loaded into the process at its start. Held to the
same rules: each LD_LIBRARY_PATH entry as a PYTHONPATH entry (an empty one is the working directory
there too), each library named by a path as a file only root may write; none with a `$` token, which
the loader rewrites after the check. So are the C library's GCONV_PATH (its character set converters,
shared libraries loaded as the interpreter decodes its arguments at its start) and LOCPATH (the
locale files it parses, naming those converters). So is OpenSSL's OPENSSL_CONF, read as hashlib is
first imported (by every enforcer process, `python -I` does not ignore it): its `providers` and
`engines` sections name shared libraries OpenSSL loads at once; it must be a file only root may
write. OPENSSL_MODULES and OPENSSL_ENGINES (where a provider or engine named without a slash is
looked up) and OPENSSL_CONF_INCLUDE (where a relative `.include` is) as PYTHONPATH entries.

Each value a variable has in the environment the process started with is checked: given twice, the
loader takes the last where os.environ shows the first. Checked only when one of them is set (or a
prefix came from `-X pycache_prefix`, or a user site-packages is on sys.path): nothing is imported
otherwise.

Outside a venv, the interpreter started as root also imports the user site-packages below $HOME
(PYTHONUSERBASE's default), running its .pth files: `sudo -E adl-exec --user $USER` keeps the
user's HOME, where the agent (running as that user) may write. Its directory, or the nearest one
above it that exists, is held to PYTHONPATH's rules too."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

# The variables naming directories, with what separates their entries (None: a single one).
NAMES = {
    "PYTHONPATH": os.pathsep,
    "PYTHONHOME": os.pathsep,
    "PYTHONUSERBASE": None,
    "PYTHONPYCACHEPREFIX": None,
    "LD_LIBRARY_PATH": ":;",
    "GCONV_PATH": ":",
    "LOCPATH": ":",
    "OPENSSL_MODULES": None,
    "OPENSSL_ENGINES": None,
    "OPENSSL_CONF_INCLUDE": None,
}
# The loader's variables naming libraries, with what separates them; one named without a slash is
# looked up as any needed library is (LD_LIBRARY_PATH, then the system's directories).
LIBRARIES = {"LD_PRELOAD": ": ", "LD_AUDIT": ":"}
# Files read as the process starts that name libraries to load, by path only (no search).
FILES = {"OPENSSL_CONF"}


def refuse_untrusted(program: str) -> None:
    """Exit (2) naming each directory the interpreter imports from, or reads compiled modules from,
    that is no directory to trust (see above). Returns at once when none is named."""
    watched = (*NAMES, *LIBRARIES, *FILES)
    values = _started_with(watched) if any(name in os.environ for name in watched) else []
    named = [(name, value) for name, value in values if name in NAMES and value]
    prefix = sys.pycache_prefix
    if prefix is not None and os.environ.get("PYTHONPYCACHEPREFIX") != prefix:
        named.append(("-X pycache_prefix", prefix))
    user_site = _user_site()
    if user_site is not None:
        named.append(("the user site-packages (HOME, PYTHONUSERBASE)", user_site))
    platlib = os.environ.get("PYTHONPLATLIBDIR", "")
    libraries = [(name, value) for name, value in values if name in LIBRARIES and value]
    files = [(name, value) for name, value in values if name in FILES and value]
    if not named and not platlib and not libraries and not files:  # an empty variable is as good as unset
        return
    problems = [
        f"{name} names {entry!r}: {why}"
        for name, value in named
        for entry in _split(value, NAMES.get(name))
        if (why := _untrusted(name, entry))
    ]
    problems += [
        f"{name} names {entry!r}: {why}"
        for name, value in libraries
        for entry in _split(value, LIBRARIES[name])
        if "/" in entry and (why := _untrusted_library(name, entry))
    ]
    problems += [f"{name} names {value!r}: {why}" for name, value in files if (why := _untrusted_library(name, value))]
    # The standard library's directory below the interpreter's prefix ("lib64" for "lib"); a path
    # there (absolute, or climbing out with "..") moves the whole standard library elsewhere.
    if platlib and (os.sep in platlib or platlib in (os.curdir, os.pardir)):
        problems.append(f"PYTHONPLATLIBDIR names {platlib!r}: not a directory name below the interpreter's prefix")
    if problems:
        print(
            f"{program}: " + "; ".join(problems) + ". Modules or libraries are loaded from there, as "
            "this process's user (root: an agent's planted code would run as root); unset it, or name "
            "only directories and files nobody else may write",
            file=sys.stderr,
        )
        sys.exit(2)


def _user_site() -> str | None:
    """Where the interpreter imports the user site-packages from, at this start or the next: its
    directory, or the nearest one above it that exists (whoever may write that may create it).
    None when the interpreter imports none (`-s`, `-I`, `-S`, a venv)."""
    if sys.flags.no_site or "site" not in sys.modules:
        return None
    import site

    if not site.ENABLE_USER_SITE or not site.USER_SITE:
        return None
    path = os.path.abspath(site.USER_SITE)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _started_with(names: tuple[str, ...]) -> list[tuple[str, str]]:
    """Each value each of `names` has in the environment this process started with. A name given
    twice there is its first value to os.environ and getenv, its last to the loader: both count."""
    with open("/proc/self/environ", "rb") as block:
        entries = block.read().split(b"\0")
    found = []
    for entry in entries:
        name, equals, value = entry.partition(b"=")
        if equals and (decoded := os.fsdecode(name)) in names:
            found.append((decoded, os.fsdecode(value)))
    return found


def _split(value: str, separators: str | None) -> list[str]:
    if separators is None:
        return [value]
    for separator in separators[1:]:
        value = value.replace(separator, separators[0])
    return value.split(separators[0])


def _untrusted_library(name: str, entry: str) -> str | None:
    """Why the file `entry` (a library, or a file naming libraries) is none to load, None if it is
    one."""
    from ..paths import check_private_file

    return _refused(name, entry, check_private_file)


def _untrusted(name: str, entry: str) -> str | None:
    """Why `entry` is no directory to import from, None if it is one."""
    from ..paths import check_import_directory  # only once something is named: not on the launch path

    if not entry:
        return "an empty entry, which the interpreter reads as the working directory"
    return _refused(name, entry, check_import_directory)


def _refused(name: str, entry: str, check: Callable[[Path], object]) -> str | None:
    """Why `check` refuses the absolute path `entry` of the variable `name`, None if it passes."""
    if not os.path.isabs(entry):
        return "a relative path, resolved against whatever directory a process is in"
    if name.startswith("LD_") and "$" in entry:
        # The loader replaces $ORIGIN, $LIB, $PLATFORM (braced or not) before it looks there.
        return "the loader rewrites its $ tokens: it would look elsewhere than the path checked"
    try:
        check(Path(entry))
    except FileNotFoundError:
        return "it does not exist (whoever may create it could fill it)"
    except OSError as exc:  # PermissionError: who owns or may write it, or above it
        return str(exc)
    return None
