"""What the learner process can see and do: namespaces, a read-only filesystem, no capabilities.

Three steps, one per process of runtime/rank/learner_main.py (the waiter, the namespace's first process,
the learner):

``isolate(hidden)``  (the waiter, still root) new mount, PID, network and IPC namespaces; every
                     mount read-only; a fresh, empty, writable tmpfs on /tmp and /dev/shm (the job
                     folders, Open MPI's session sockets and shared memory, other ranks' files
                     are all under them, or in ``hidden``, each covered by an empty tmpfs or
                     /dev/null); the network is a loopback that is down.
``mount_proc()``     (the first process) a /proc of the new PID namespace: the learner sees its
                     own processes only, so it cannot name the agent, the supervisor or a peer
                     to signal, trace or read (/proc/PID/mem).
``drop_privileges()`` (the learner) every capability gone, for good: the bounding set emptied,
                     SECBIT_NOROOT locked (an exec does not give root its capabilities back) and
                     no_new_privs. It stays uid 0, a root that can undo none of the above: the
                     interpreter and the virtual environment may live under /root (0700), where
                     another uid could not even start Python.

Where the harness cannot mount (not root, or root without CAP_SYS_ADMIN, as in a container's
default profile), only a user namespace around a PID namespace is tried (the detached-process
guarantee); the filesystem, the network and /proc are then the learner's as they are the
harness's, and ``isolate`` says so in what it returns.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Sequence

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
PR_SET_SECUREBITS, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 28, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECBIT_NOROOT_AND_LOCKED = 0x3  # SECBIT_NOROOT | SECBIT_NOROOT_LOCKED
SYS_CAPSET, SYS_MOUNT_SETATTR = 126, 442  # x86_64
AT_RECURSIVE, MOUNT_ATTR_RDONLY = 0x8000, 0x1
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)

CAP_SYS_ADMIN = 21  # what mount namespaces and mounts need

FULL = "own mount, PID, network and IPC namespaces; read-only filesystem; no capabilities"
PID_ONLY = ("own user and PID namespaces only (not root with CAP_SYS_ADMIN: the filesystem, "
            "network and /proc are shared)")
NONE = "none (no namespace could be made: processes the learner starts may outlive the check)"


def can_mount() -> bool:
    """Root with CAP_SYS_ADMIN in effect: what the full sandbox needs. A container's root
    usually lacks it; so does a process whose bounding set dropped it."""
    if os.geteuid() != 0:
        return False
    try:
        status = Path("/proc/self/status").read_text()
        effective = int(status.split("CapEff:", 1)[1].split()[0], 16)
    except (OSError, IndexError, ValueError):
        return False
    return bool(effective >> CAP_SYS_ADMIN & 1)


def expected() -> str:
    """Which isolation ``isolate`` will give on this machine, said before any rank starts."""
    if can_mount():
        return FULL
    try:
        allowed = int(Path("/proc/sys/user/max_user_namespaces").read_text()) > 0
    except (OSError, ValueError):
        allowed = False
    return PID_ONLY if allowed else NONE


class SandboxError(OSError):
    """A step of the sandbox failed where it should not (root, and the kernel has the feature)."""


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SandboxError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                       ctypes.c_ulong(flags), data and data.encode()), f"mount {fstype or source} on {target}")


def isolate(hidden: Sequence[str], kept: Sequence[str]) -> str:
    """Namespaces and mounts for the learner to come (module docstring); returns which hold.
    ``kept``: paths the learner needs (its solution file, the problem's folder) that the fresh
    /tmp or /dev/shm would cover: bound back at the same path, read-only."""
    if not can_mount():
        return PID_ONLY if _libc.unshare(CLONE_NEWUSER | CLONE_NEWPID) == 0 else NONE
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    for path in hidden:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0555")
        elif os.path.exists(path):
            _mount("/dev/null", path, None, MS_BIND)
    root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        attr = (ctypes.c_uint64 * 4)(MOUNT_ATTR_RDONLY, 0, 0, 0)  # set, clear, propagation, userns
        _check(_libc.syscall(SYS_MOUNT_SETATTR, root, b"", AT_RECURSIVE | 0x1000, attr, 32),
               "read-only /")  # 0x1000: AT_EMPTY_PATH, the fd itself
    finally:
        os.close(root)
    scratches = ("/tmp", "/dev/shm")
    covered = sorted({os.path.realpath(p) for p in kept
                      if any(os.path.realpath(p).startswith(s + "/") for s in scratches)})
    # A folder inside another kept one comes with it (bound last, it would be bound over).
    covered = [p for p in covered if not any(p.startswith(q + "/") for q in covered if q != p)]
    # Opened before the scratch mounts cover them, bound back from the descriptor afterwards.
    keep_fds = [(os.path.realpath(p), os.open(p, os.O_PATH)) for p in covered if os.path.exists(p)]
    for scratch in scratches:
        _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "size=1g,mode=1777")
    for path, fd in keep_fds:
        is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
        os.makedirs(path if is_dir else os.path.dirname(path), exist_ok=True)
        if not is_dir:
            open(path, "a").close()
        # Recursive, so that a hidden file inside a kept folder stays hidden; read-only, as the
        # mount it comes from.
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    return FULL


def mount_proc() -> None:
    """A /proc that shows this PID namespace only (the caller is its first process)."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def drop_privileges() -> None:
    """No capability now or after any exec (module docstring)."""
    _check(_libc.prctl(PR_SET_SECUREBITS, SECBIT_NOROOT_AND_LOCKED, 0, 0, 0), "securebits")
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; two words each: all zero
    _check(_libc.syscall(SYS_CAPSET, header, data), "capset")
