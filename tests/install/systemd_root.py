"""Boot systemd as PID 1 of a throwaway root, so that a unit can be tested under a real service manager
without any write reaching the host.

The root is an overlay of `/` with a tmpfs upper layer, entered with pivot_root in new mount, PID and
cgroup namespaces, with fresh /proc, /sys (read-only), /dev, /run and /tmp. Every service, socket,
timer, path, mount, automount and swap unit except journald and the units under test is masked and
the generators are removed, so udev, logind, tmpfiles (which would empty /tmp) and the host's
enabled services never start. cgroups: the boot runs in a fresh cgroup of each v1 hierarchy (and the
unified one), which the cgroup namespace makes its root. `Booted.close()` kills PID 1 (and with it
the whole PID namespace) and removes those cgroups.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PR_SET_PDEATHSIG = 1
KEEP_UNITS = {"systemd-journald.service", "systemd-journald.socket", "systemd-journald-dev-log.socket"}
MASKED_SUFFIXES = (".service", ".socket", ".timer", ".path", ".mount", ".automount", ".swap")
UNIT_DIRS = ("etc/systemd/system", "lib/systemd/system", "usr/lib/systemd/system", "run/systemd/system")

INNER = r"""
set -euo pipefail
W=$1; CONSOLE=$2; shift 2
mount -t tmpfs -o mode=0700 adl-boot "$W"
mkdir "$W/upper" "$W/work" "$W/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$W/upper,workdir=$W/work" "$W/root"
R=$W/root
mount -t proc proc "$R/proc"
mount -t sysfs sysfs "$R/sys"
mount -t tmpfs -o mode=0755 cgroup "$R/sys/fs/cgroup"
for h in $HIERARCHIES; do
  mkdir "$R/sys/fs/cgroup/$h"
  case $h in
    unified) mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup/unified" ;;
    systemd) mount -t cgroup -o none,name=systemd,xattr cgroup "$R/sys/fs/cgroup/systemd" ;;
    *) mount -t cgroup -o "$h" cgroup "$R/sys/fs/cgroup/$h" ;;
  esac
done
mount -o remount,ro,bind "$R/sys/fs/cgroup"
mount -o remount,ro,bind "$R/sys"
mount -t tmpfs -o mode=0755,nosuid dev "$R/dev"
for d in null zero full random urandom tty; do touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
touch "$R/dev/console"; mount --bind "$CONSOLE" "$R/dev/console"
mkdir "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$R/dev/pts"; ln -s pts/ptmx "$R/dev/ptmx"
mount -t tmpfs -o mode=1777 shm "$R/dev/shm"
mount -t tmpfs -o mode=0755,nosuid,nodev run "$R/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmp "$R/tmp"
"$@" "$R"
cd "$R"; mkdir -p .oldroot; pivot_root . .oldroot; cd /
umount -l /.oldroot
exec env -i container=adl-boot PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  /lib/systemd/systemd --unit=adl-boot.target --log-target=journal --show-status=no
"""


def available() -> str | None:
    """Why a boot cannot be done here, or None."""
    if os.geteuid() != 0:
        return "needs root"
    if not Path("/lib/systemd/systemd").exists():
        return "systemd is not installed"
    for tool in ("unshare", "pivot_root", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "no overlay filesystem"
    if not (CGROUP_ROOT / "systemd" / "cgroup.procs").exists():
        return "not a cgroup v1 host with a name=systemd hierarchy"
    return None


def _hierarchies() -> list[str]:
    # cpuset is left out: a new cpuset cgroup has no CPUs until configured, and systemd does not use it.
    names = []
    for entry in sorted(CGROUP_ROOT.iterdir()):
        if entry.name != "cpuset" and not entry.is_symlink() and (entry / "cgroup.procs").exists():
            names.append(entry.name)
    return names


def _own_cgroup(hierarchy: str) -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        names = controllers.split(",")
        if (hierarchy == "unified" and controllers == "") or hierarchy in names or f"name={hierarchy}" in names:
            return path
    return "/"


def prepare_root(root: Path, units: list[str]) -> None:
    """Mask every unit below `root` but journald and `units`, boot into a target that wants them, and
    remove the generators and fstab."""
    system = root / "etc/systemd/system"
    names: set[str] = set()
    for directory in UNIT_DIRS:
        base = root / directory
        if base.is_dir():
            names |= {p.name for p in base.iterdir() if p.name.endswith(MASKED_SUFFIXES) and "@" not in p.name}
    for name in sorted(names - KEEP_UNITS - set(units)):
        target = system / name
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to("/dev/null")
    for wants in system.glob("*.wants"):
        shutil.rmtree(wants)
    for directory in (
        "lib/systemd/system-generators",
        "usr/lib/systemd/system-generators",
        "etc/systemd/system-generators",
    ):
        generators = root / directory
        if generators.is_dir() and not generators.is_symlink():
            for generator in generators.iterdir():
                generator.unlink()
    (root / "etc/fstab").write_text("")
    wanted = " ".join(["systemd-journald.service", *units])
    (system / "adl-boot.target").write_text(f"[Unit]\nDescription=adl-enforcer boot test\nWants={wanted}\n")


@dataclass
class Booted:
    process: subprocess.Popen[bytes]
    console: Path
    cgroups: list[Path]
    pid1: int = 0
    closed: bool = field(default=False)

    def run(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A command inside the booted root (its mount, PID and cgroup namespaces)."""
        enter = ["nsenter", "-t", str(self.pid1), "-m", "-p", "-C", "--"]
        return subprocess.run([*enter, *command], capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for pid in (self.pid1, self.process.pid):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=20)
        for base in self.cgroups:
            _remove_tree(base)


def _remove_tree(base: Path) -> None:
    deadline = time.monotonic() + 20
    while base.exists() and time.monotonic() < deadline:
        for directory in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()
        if base.exists():
            for procs in base.rglob("cgroup.procs"):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.1)


def boot(workdir: Path, prepare: list[str], timeout: float = 60) -> Booted:
    """Boot; `prepare` is a command given the new root's path as its last argument, run before
    pivot_root (it sees the host's / and the new root)."""
    tag = f"adl-boot-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    hierarchies = _hierarchies()
    cgroups: list[Path] = []
    for hierarchy in hierarchies:
        directory = CGROUP_ROOT / hierarchy / _own_cgroup(hierarchy).lstrip("/") / tag
        directory.mkdir()
        cgroups.append(directory)
    mountpoint = workdir / "mnt"
    mountpoint.mkdir()
    console = workdir / "console.log"
    console.touch()
    joins = " ".join(f"echo $$ > {c}/cgroup.procs;" for c in cgroups)
    outer = f'{joins} exec unshare --mount --pid --cgroup --kill-child --propagation private bash -c "$0" inner "$@"'
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "HIERARCHIES": " ".join(hierarchies)}
    process = subprocess.Popen(
        ["bash", "-c", outer, INNER, str(mountpoint), str(console), *prepare],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "boot.err").open("wb"),
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    booted = Booted(process, console, cgroups)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            booted.pid1 = _systemd_pid(process.pid)
            if booted.pid1 or process.poll() is not None:
                break
            time.sleep(0.1)
        if not booted.pid1:
            raise RuntimeError(f"systemd did not start: {(workdir / 'boot.err').read_text()[-2000:]}")
        while time.monotonic() < deadline:
            state = booted.run("systemctl", "is-system-running", timeout=10).stdout.strip()
            if state in ("running", "degraded"):
                return booted
            time.sleep(0.2)
        raise RuntimeError(f"systemd did not finish starting ({state}): {console.read_text()[-3000:]}")
    except BaseException:
        booted.close()
        raise


def _die_with_parent() -> None:
    # If the test process dies without close(), unshare dies, and --kill-child takes PID 1 with it.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _systemd_pid(unshare_pid: int) -> int:
    """The host PID of the namespace's PID 1 once it runs systemd."""
    with contextlib.suppress(OSError):
        children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
        for child in children:
            if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                return int(child)
    return 0


if __name__ == "__main__":
    # `python systemd_root.py UNIT... ROOT`: keep these units (already installed below ROOT) and mask
    # the rest; the last step of a boot's `prepare` command.
    *keep, new_root = sys.argv[1:]
    prepare_root(Path(new_root), keep)
