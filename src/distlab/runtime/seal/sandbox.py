"""What the learner process can see and do: namespaces, a read-only filesystem, no capabilities.

Three steps, one per process of runtime/rank/learner_main.py (the waiter, the namespace's first process,
the learner):

``isolate(hidden)``  (the waiter, still root) new mount, PID, network and IPC namespaces; every
                     mount read-only; a fresh, empty, writable tmpfs on /tmp (``scratch_mb``:
                     a quarter of the rank's address space, at most 1 GiB), /var/tmp and
                     /dev/shm (64 MiB each), an empty one on every folder at the top of the
                     filesystem but the system's (``user_folders``: what users may write) and on
                     /sys/fs/cgroup (``HOST_STATE``), a /dev
                     of the devices a program opens only (the job
                     folders, Open MPI's session sockets and shared memory, other ranks' files
                     are all under them, or in ``hidden``, each covered by an empty tmpfs or
                     /dev/null); the network is a loopback that is down.
``mount_proc()``     (the first process) a /proc of the new PID namespace: the learner sees its
                     own processes only, so it cannot name the agent, the supervisor or a peer
                     to signal, trace or read (/proc/PID/mem).
``drop_privileges()`` (the learner) the unprivileged user ``nobody``, running at most
                     Limits.processes processes and threads at once (RLIMIT_NPROC: a fork bomb
                     is refused), with every capability gone for good: the bounding set emptied, SECBIT_NOROOT locked (an exec does
                     not give root its capabilities back), no_new_privs, and last the seccomp
                     filter of syscalls.py (``filter_syscalls``: no keyring, file locks, leases or
                     file-change notifications, kernel objects through which ranks could pass
                     data outside the seal). What it must read
                     behind a folder others cannot enter (the interpreter under /root, 0700; a
                     solution in a private temporary folder) was bound back over an empty tmpfs
                     there; a file or folder only root may read is copied to a readable one
                     first. Where that would mean copying a large folder, or where the harness is
                     root of a user namespace that has no user nobody, it stays uid 0 without
                     capabilities, and ``isolate`` says so.

Where the harness cannot mount (not root, or root without CAP_SYS_ADMIN, as in a container's
default profile), only a user namespace around a PID namespace is tried (the detached-process
guarantee); the filesystem, the network and /proc are then the learner's as they are the
harness's, and ``isolate`` says so in what it returns. The learner still gets no_new_privs and the
seccomp filter there (``filter_syscalls``): the keyring and the locks are shared there too.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import resource
import shutil
import stat
from pathlib import Path
from typing import Sequence

from . import syscalls

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_SECUREBITS, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 28, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECBIT_NOROOT_AND_LOCKED = 0x3  # SECBIT_NOROOT | SECBIT_NOROOT_LOCKED
SYS_CAPSET, SYS_MOUNT_SETATTR = 126, 442  # x86_64
AT_RECURSIVE, MOUNT_ATTR_RDONLY = 0x8000, 0x1
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)

CAP_SYS_ADMIN = 21  # what mount namespaces and mounts need

# What the seccomp filter refuses (syscalls.py), or that there is none here: every level ends with it.
FILTER = syscalls.description()
FULL = ("own mount, PID, network and IPC namespaces; read-only filesystem; user nobody (its "
        f"processes and threads capped), no capabilities; {FILTER}")
FULL_AS_ROOT = ("own mount, PID, network and IPC namespaces; read-only filesystem; uid 0 without "
                f"capabilities (a large folder it needs is readable by root only); {FILTER}")
FULL_AS_NAMESPACE_ROOT = ("own mount, PID, network and IPC namespaces; read-only filesystem; uid 0 of "
                          "the harness's user namespace without capabilities (user nobody is not "
                          f"mapped in it); {FILTER}")
MOUNTED = (FULL, FULL_AS_ROOT, FULL_AS_NAMESPACE_ROOT)  # with the learner's own mounts and /proc
COPY_LIMIT_BYTES = 64 << 20  # a folder only root may read is copied for the learner up to this size
PID_ONLY = ("own user and PID namespaces only (not root with CAP_SYS_ADMIN: the filesystem, "
            f"network and /proc are shared); {FILTER}")
NONE = f"none (no namespace could be made: processes the learner starts may outlive the check); {FILTER}"


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


def can_become_nobody() -> bool:
    """Whether this process's user namespace maps user and group nobody and lets it drop its
    groups: not so for root of a namespace that maps only itself (``unshare -r``, some rootless
    containers), where setgroups is denied and uid 65534 does not exist."""
    uid, gid = _nobody()
    try:
        allowed = Path("/proc/self/setgroups").read_text().strip() == "allow"
        return allowed and _mapped(uid, "uid_map") and _mapped(gid, "gid_map")
    except OSError:
        return False


def _mapped(inner_id: int, table: str) -> bool:
    for line in Path(f"/proc/self/{table}").read_text().splitlines():
        start, _, count = (int(x) for x in line.split())
        if start <= inner_id < start + count:
            return True
    return False


def expected() -> str:
    """Which isolation ``isolate`` will give on this machine, said before any rank starts."""
    if can_mount():
        return FULL if can_become_nobody() else FULL_AS_NAMESPACE_ROOT
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


def first_to_go_out_of_memory() -> None:
    """Makes this process and every one it starts the kernel's first choice when the machine runs
    out of memory (oom_score_adj 1000), before the supervisor, the agents and the rest of the
    machine. Each of the learner's processes has the rank's address-space limit, but together they
    have none (a memory cgroup would); a learner cannot lower it again (that takes
    CAP_SYS_RESOURCE, and its /proc is read-only where it has mounts). Best effort: a kernel
    without the file leaves the default."""
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("1000")
    except OSError:
        pass


def scratch_mb(address_space_mb: int) -> int:
    """The size of the learner's /tmp: a quarter of the rank's address-space limit, at most 1 GiB.
    Its pages are memory that no limit of the learner's process counts (the supervisor shares the
    machine's memory out as address space, supervisor/memory.py), so it follows that share: eight
    ranks could fill /tmp, /var/tmp and /dev/shm at 1 GiB each: 24 GiB, this machine's all."""
    return max(SMALL_SCRATCH_MB, min(1024, address_space_mb // 4))


SMALL_SCRATCH_MB = 64  # /var/tmp and /dev/shm, which programs use for small things

# The folders at the top of the filesystem that hold the system (root's to write); every other
# one is emptied for the learner (``user_folders``), and what it needs there is bound back.
SYSTEM_FOLDERS = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc",
                            "sys", "tmp"})
# Host state that every learner of the machine could read alike: the memory cgroups, each
# learner's beside its peers' (an outside tester passed numbers between ranks through the
# tmpfs pages a learner held, read in a sibling group's memory.stat within milliseconds).
HOST_STATE = ("/sys/fs/cgroup",)


def user_folders() -> list[str]:
    """Every folder at the top of the filesystem but the system's own (/home, /var, /run, /srv,
    /opt, /mnt, a checkout's /work...): what the candidate's account could write lies there, and
    a solution submitted before an exam's deadline must not read code written there after it
    (an outside tester's stub ran, at grading, a file it wrote after the deadline in a folder
    its account could write). Links (/bin -> usr/bin) are left: a mount over one lands on its
    target."""
    return sorted(f"/{entry.name}" for entry in os.scandir("/")
                  if entry.is_dir(follow_symlinks=False) and entry.name not in SYSTEM_FOLDERS)


def isolate(hidden: Sequence[str], kept: Sequence[str], tmp_mb: int) -> str:
    """Namespaces and mounts for the learner to come (module docstring); returns which hold.
    ``kept``: paths the learner needs (its solution file, the problem's folder) that the fresh
    /tmp or /dev/shm would cover: bound back at the same path, read-only. ``tmp_mb``: the size of
    the fresh /tmp (``scratch_mb``); /var/tmp and /dev/shm get SMALL_SCRATCH_MB each."""
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
    scratches = tuple(p for p in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(p) or p == "/dev/shm")
    emptied = (*user_folders(), *(p for p in HOST_STATE if os.path.isdir(p)))
    kept = [os.path.realpath(p) for p in kept if os.path.exists(p)]
    # /root and the like, which the learner as nobody could not enter (under /tmp the fresh tmpfs
    # makes them anew, open).
    closed = [c for c in closed_folders(kept)
              if not any(c == e or c.startswith(e + "/") for e in (*scratches, *emptied))]
    covers = (*scratches, *emptied, *closed)
    covered = sorted({p for p in kept if any(p.startswith(c + "/") for c in covers)})
    # A folder inside another kept one comes with it (bound last, it would be bound over).
    covered = [p for p in covered if not any(p.startswith(q + "/") for q in covered if q != p)]
    private = [p for p in kept if not readable_by_others(p)]
    as_namespace_root = not can_become_nobody()
    as_root = as_namespace_root or any(_size(p) > COPY_LIMIT_BYTES for p in private)
    # Opened before the covering mounts, bound back from the descriptor afterwards.
    keep_fds = [(p, os.open(p, os.O_PATH)) for p in covered]
    _minimal_dev()
    for folder in (*emptied, *closed):  # root's own, 0755: the learner may pass, not write
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    for scratch in scratches:  # /var/tmp inside an emptied /var: its mount point made anew
        os.makedirs(scratch, exist_ok=True)
        size = tmp_mb if scratch == "/tmp" else SMALL_SCRATCH_MB
        _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size}m,mode=1777")
    for path, fd in keep_fds:
        _bind(f"/proc/self/fd/{fd}", path)
        os.close(fd)
    if private and not as_root:  # copies the learner may read, bound over the originals
        os.makedirs("/tmp/.distlab-kept", mode=0o755, exist_ok=True)
        for n, path in enumerate(private):
            copy = f"/tmp/.distlab-kept/{n}"
            _readable_copy(path, copy)
            _bind(copy, path)
    return FULL_AS_NAMESPACE_ROOT if as_namespace_root else FULL_AS_ROOT if as_root else FULL


# The devices a program may open; the host's others (its disks among them, root's and 0600, which
# a learner left uid 0 could write: a read-only mount does not stop a device) are not there.
DEVICES = ("null", "zero", "full", "random", "urandom")


def _minimal_dev() -> None:
    """A /dev of DEVICES only (each bound from the host's node), the links to /proc/self/fd, and
    an empty shm for the scratch mount: read-only, no set-uid, nothing executable."""
    nodes = [(name, os.open(f"/dev/{name}", os.O_PATH)) for name in DEVICES]
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name, fd in nodes:
        open(f"/dev/{name}", "a").close()
        _mount(f"/proc/self/fd/{fd}", f"/dev/{name}", None, MS_BIND)
        os.close(fd)
    os.symlink("/proc/self/fd", "/dev/fd")
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{number}", f"/dev/{name}")
    os.mkdir("/dev/shm")
    _mount(None, "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def closed_folders(paths: Sequence[str]) -> list[str]:
    """For each path, the outermost folder above it that others may not enter (no o+x)."""
    found: dict[str, None] = {}
    for path in paths:
        for parent in reversed(Path(path).parents[:-1]):  # from the top, "/" excepted
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                found[str(parent)] = None
                break
    return [f for f in found if not any(f.startswith(g + "/") for g in found)]


def readable_by_others(path: str) -> bool:
    """Whether a uid other than the owner's may read it (a folder: list and enter it too)."""
    mode = os.stat(path).st_mode
    if stat.S_ISDIR(mode):
        return mode & (stat.S_IROTH | stat.S_IXOTH) == stat.S_IROTH | stat.S_IXOTH
    return bool(mode & stat.S_IROTH)


def _size(path: str) -> int:
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _readable_copy(source: str, target: str) -> None:
    if os.path.isdir(source):
        shutil.copytree(source, target, symlinks=True)
        for folder, dirs, files in os.walk(target):
            os.chmod(folder, 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
    else:
        shutil.copyfile(source, target)
        os.chmod(target, 0o644)


def _bind(source: str, path: str) -> None:
    """Binds source at path (recursively, so that a hidden file inside stays hidden; read-only
    where the source's mount is), making the mount point first."""
    is_dir = os.path.isdir(source)
    os.makedirs(path if is_dir else os.path.dirname(path), exist_ok=True)
    if not is_dir and not os.path.exists(path):
        open(path, "a").close()
    _mount(source, path, None, MS_BIND | MS_REC)


def mount_proc() -> None:
    """A /proc that shows this PID namespace only (the caller is its first process), read-only:
    a learner left uid 0 (FULL_AS_ROOT) could otherwise write /proc/sys (core_pattern: a program
    the kernel runs as root, outside every namespace) and /proc/sysrq-trigger, which check the
    uid, not a capability."""
    _mount("proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def drop_privileges(isolation: str, processes: int) -> None:
    """User nobody (uid 0 for FULL_AS_ROOT and FULL_AS_NAMESPACE_ROOT) and no capability, now or
    after any exec, and last the seccomp filter (module docstring). As nobody, at most
    ``processes`` processes and threads at once. The caller sets its parent-death signal again: a
    change of uid clears it."""
    _check(_libc.prctl(PR_SET_SECUREBITS, SECBIT_NOROOT_AND_LOCKED, 0, 0, 0), "securebits")
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if isolation == FULL:
        uid, gid = _nobody()
        # A PID namespace ends every process the learner starts, but bounds no count: a fork bomb
        # would fill the machine until the check ends. The kernel counts a user's processes and
        # threads (uid 0 is exempt, hence nobody only), those of every learner of the machine
        # together; set while root, so that the learner cannot raise it.
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; two words each: all zero
    _check(_libc.syscall(SYS_CAPSET, header, data), "capset")
    filter_syscalls()


def filter_syscalls() -> None:
    """no_new_privs (where ``drop_privileges`` has not set it: the levels without mounts) and the
    seccomp filter of syscalls.py, for good: the learner's last step at every isolation level."""
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    try:
        syscalls.install()
    except OSError as exc:
        raise SandboxError(exc.errno or 0, exc.strerror or str(exc)) from exc


def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534
