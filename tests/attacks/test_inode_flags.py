"""Inode flags from inside a real sandbox: FS_IOC_SETFLAGS and FS_IOC_FSSETXATTR (chattr) need only
ownership and a descriptor opened for reading, and no Landlock right covers them, so an agent could
change the flags of a file it owns beneath a read-only grant (nodump hides it from backups, sync and
noatime change how it is written)."""

from __future__ import annotations

import array
import fcntl
import os
import textwrap

from ..helpers.sandbox import AGENT_UID, PROBE_CHECK, Sandbox, needs_root

pytestmark = needs_root

FS_IOC_GETFLAGS = 0x80086601
FS_IOC_FSGETXATTR = 0x801C581F

PROBE = (
    PROBE_CHECK
    + """
import array, fcntl, struct
libc.syscall.restype = ctypes.c_long
path = os.environ["ALLOWED_FILE"]
fd = os.open(path, os.O_RDONLY)
def setflags():
    flags = array.array("l", [0])
    fcntl.ioctl(fd, 0x80086601, flags, True)  # FS_IOC_GETFLAGS
    flags[0] |= 0x40 | 0x80  # FS_NODUMP_FL | FS_NOATIME_FL
    fcntl.ioctl(fd, 0x40086602, flags, True)  # FS_IOC_SETFLAGS
def setflags32():
    flags = array.array("i", [0x40])
    fcntl.ioctl(fd, 0x40046602, flags, True)  # FS_IOC32_SETFLAGS
def fssetxattr():
    attr = bytearray(28)
    fcntl.ioctl(fd, 0x801c581f, attr, True)  # FS_IOC_FSGETXATTR
    struct.pack_into("I", attr, 0, struct.unpack_from("I", attr)[0] | 0x80)  # FS_XFLAG_NODUMP
    fcntl.ioctl(fd, 0x401c5820, bytes(attr))  # FS_IOC_FSSETXATTR
def file_setattr():
    attr = ctypes.create_string_buffer(24)  # struct file_attr
    struct.pack_into("Q", attr, 0, 0x80)  # FS_XFLAG_NODUMP
    args = [ctypes.c_long(-100), ctypes.c_char_p(path.encode()), attr, ctypes.c_long(24), ctypes.c_long(0)]
    if libc.syscall(ctypes.c_long(469), *args) != 0:  # file_setattr: the same flags by path, no descriptor
        raise OSError(ctypes.get_errno(), "file_setattr")
check("FS_IOC_SETFLAGS", setflags)
check("file_setattr", file_setattr)
check("FS_IOC32_SETFLAGS", setflags32)
check("FS_IOC_FSSETXATTR", fssetxattr)
print("READ", os.read(fd, 100).decode().strip())
"""
)


def flags(path: str) -> tuple[int, bytes]:
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf, True)
        attr = bytearray(28)
        fcntl.ioctl(fd, FS_IOC_FSGETXATTR, attr, True)
        return buf[0], bytes(attr)
    finally:
        os.close(fd)


def test_inode_flags_of_a_read_only_file_stay(sandbox: Sandbox) -> None:
    target = sandbox.ref / "doc.txt"
    os.chown(target, AGENT_UID, AGENT_UID)  # the agent's own file, granted read-only
    before = flags(str(target))
    result = sandbox.python(textwrap.dedent(PROBE), env={"ALLOWED_FILE": str(target)})
    assert "ESCAPED" not in result.out, result.out + result.err
    assert result.out.count("BLOCKED") == 4, result.out + result.err
    assert flags(str(target)) == before
    assert "READ reference doc" in result.out, result.out + result.err  # control: reading still works
