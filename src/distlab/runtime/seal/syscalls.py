"""A seccomp filter in the learner process: no kernel object that ranks share outside the seal.

Why. The sandbox (sandbox.py) gives each rank's learner its own mount, PID, network and IPC
namespaces, but every learner of a check runs as the same user (nobody) in the same user
namespace, on the same files. An outside tester passed problem 03 with 12/12 while the counted
communicator carried only zeros, through two channels that those namespaces do not split:

- the kernel keyring: ``add_key`` into uid nobody's user keyring in one rank, ``keyctl``
  (KEYCTL_SEARCH, KEYCTL_READ) in another; the keys even outlive the check;
- POSIX byte-range locks on an inode every rank can read (the solution file itself, read-only):
  rank 0 takes an F_RDLCK at offset 2^40 + value, rank 1 reads the offset back with F_GETLK
  (and /proc/locks lists every lock of the machine).

tests/fixtures/03/covert_keyring.py and covert_locks.py are those attacks. Of the same kind, and
refused with them: request_key, flock(2), open file description locks (F_OFD_*), leases
(F_SETLEASE, F_GETLEASE), dnotify (F_NOTIFY) and inotify and fanotify (a watch in one rank sees
which of two files another rank opens). Each fails with EPERM, so learner code sees an ordinary
PermissionError; every other call, every other fcntl command included, is allowed. System V
shared memory and message queues (shmget, msgget) and memfd_create are refused too: the
learner's IPC namespace is its own, but a segment it does not map, a queue, or a memfd whose
descriptor it sent into a socket's queue (an outside tester kept 48 MiB there) holds memory that
the memory probe (runtime/rank/memory.py), reading the learner's mappings, descriptors and files,
would not count. So are new sockets (socket, socketpair): the learner's one socket, the opener of
its further lines to its agent, is made by the agent; an outside tester kept 18 MiB of optimizer state queued in
socketpairs of its own (8 MiB a socket, as many as its descriptors), and pipes' descriptors in
flight in a socket's queue, where no process holds them (the network namespace is empty anyway).

The doorbell's pipes (doorbell.py): a pipe's two ends share one lock, which the agent takes in
its every read and ring (uninterruptibly, whatever its descriptor's flags). ``splice`` from an
idle socket into the pipe the learner rings on held it for good: an outside tester left its
rank's agent asleep in the kernel until the job's deadline, the rank said to be "still
computing". So the calls that can wait while they hold a pipe's lock are refused: splice, tee,
vmsplice and sendfile (which splices), io_uring (whose workers make those calls where no filter
sees them) and userfaultfd (a page fault of a pipe's read or write that waits for the learner).
Python's own copies fall back without them (shutil.copyfile tries sendfile first).

How. ``install`` runs last in the learner's privilege drop, after no_new_privs (which lets a
process without capabilities install a filter; it is kept by every thread and process the learner
starts, and cannot be removed). The learner is a fresh fork there, with one thread, so
PR_SET_SECCOMP covers all of it. The program is classic BPF on ``struct seccomp_data``
(nr at offset 0, arch at 4, args[i] at 16 + 8 i, its low 32 bits first on little-endian x86_64):

     0  ld  [4]                        A = arch
     1  jeq #AUDIT_ARCH_X86_64, 0, deny  another ABI (i386 through int 0x80, whose fcntl64 and
                                       keyctl have numbers of their own): all refused
     2  ld  [0]                        A = nr
     3  jge #0x40000000, deny          the x32 ABI: the same arch, bit 30 set in nr
     4  jeq #add_key (248), deny
     5  jeq #request_key (249), deny
     6  jeq #keyctl (250), deny
     7  jeq #flock (73), deny
     8  jeq #inotify_init (253), deny
     9  jeq #inotify_init1 (294), deny
    10  jeq #inotify_add_watch (254), deny
    11  jeq #fanotify_init (300), deny
    12  jeq #shmget (29), deny
    13  jeq #msgget (68), deny
    14  jeq #memfd_create (319), deny
    15  jeq #socket (41), deny
    16  jeq #socketpair (53), deny
    17  jeq #splice (275), deny
    18  jeq #tee (276), deny
    19  jeq #vmsplice (278), deny
    20  jeq #sendfile (40), deny
    21  jeq #io_uring_setup (425), deny
    22  jeq #userfaultfd (323), deny
    23  jeq #fcntl (72), 0, allow
    24  ld  [24]                       A = args[1], fcntl's cmd: its low half, all the kernel
                                       reads of it (an unsigned int)
    25  jeq #F_GETLK (5), deny
    26  jeq #F_SETLK (6), deny
    27  jeq #F_SETLKW (7), deny
    28  jeq #F_OFD_GETLK (36), deny
    29  jeq #F_OFD_SETLK (37), deny
    30  jeq #F_OFD_SETLKW (38), deny
    31  jeq #F_SETLEASE (1024), deny
    32  jeq #F_GETLEASE (1025), deny
    33  jeq #F_NOTIFY (1026), deny
    34  allow: ret #SECCOMP_RET_ALLOW
    35  deny:  ret #SECCOMP_RET_ERRNO | EPERM

(``listing()`` prints the program as built, in this form.) Elsewhere than x86_64 (the sandbox's
numbers are x86_64's) or on a kernel without seccomp, nothing is installed, and ``DESCRIPTION``,
which the sandbox's description of the seal ends with (``distlab check -v``), says so.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
from pathlib import Path

# x86_64 system call numbers (asm/unistd_64.h); refused outright.
REFUSED_CALLS = {"add_key": 248, "request_key": 249, "keyctl": 250, "flock": 73, "inotify_init": 253,
                 "inotify_init1": 294, "inotify_add_watch": 254, "fanotify_init": 300,
                 "shmget": 29, "msgget": 68, "memfd_create": 319, "socket": 41, "socketpair": 53,
                 # Each can wait while it holds a pipe's lock, which the agent's end shares:
                 "splice": 275, "tee": 276, "vmsplice": 278, "sendfile": 40,
                 "io_uring_setup": 425, "userfaultfd": 323}
SYS_FCNTL = 72
# fcntl commands refused: locks, OFD locks, leases, dnotify. Others (F_GETFL, F_SETFD, F_DUPFD,
# F_ADD_SEALS...) stay allowed.
REFUSED_FCNTL = {"F_GETLK": 5, "F_SETLK": 6, "F_SETLKW": 7, "F_OFD_GETLK": 36, "F_OFD_SETLK": 37,
                 "F_OFD_SETLKW": 38, "F_SETLEASE": 1024, "F_GETLEASE": 1025, "F_NOTIFY": 1026}

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
NR_OFFSET, ARCH_OFFSET, ARG1_LOW_OFFSET = 0, 4, 16 + 8 * 1  # in struct seccomp_data
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2

SUPPORTED = platform.machine() == "x86_64" and sys.maxsize > 2**32
DESCRIPTION = ("no keyring, file locks, leases or file-change notifications (a seccomp filter "
               "refuses them: ranks could share data through them), nor System V shared memory, "
               "message queues or memfds, nor splice, tee, sendfile, io_uring or userfaultfd "
               "(they could hold the agent in a read)")
UNFILTERED = (f"no syscall filter ({'the kernel has no seccomp' if SUPPORTED else 'not x86_64'}): "
              "the kernel keyring and file locks are shared with other ranks")


class SockFilter(ctypes.Structure):
    """struct sock_filter: one BPF instruction."""

    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    """struct sock_fprog: the program's length and its instructions."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


DENY, ALLOW = "deny", "allow"
Jump = int | str  # a relative jump, or a label resolved by ``program``


def program() -> list[tuple[int, int, int, int]]:
    """The filter's instructions (code, jt, jf, k), as the module docstring lists them."""
    body: list[tuple[int, Jump, Jump, int]] = [
        (BPF_LD_W_ABS, 0, 0, ARCH_OFFSET),
        (BPF_JEQ_K, 0, DENY, AUDIT_ARCH_X86_64),
        (BPF_LD_W_ABS, 0, 0, NR_OFFSET),
        (BPF_JGE_K, DENY, 0, X32_SYSCALL_BIT),
        *((BPF_JEQ_K, DENY, 0, nr) for nr in REFUSED_CALLS.values()),
        (BPF_JEQ_K, 0, ALLOW, SYS_FCNTL),
        (BPF_LD_W_ABS, 0, 0, ARG1_LOW_OFFSET),
        *((BPF_JEQ_K, DENY, 0, command) for command in REFUSED_FCNTL.values()),
    ]
    labels = {ALLOW: len(body), DENY: len(body) + 1}
    body += [(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW), (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM)]

    def offset(at: int, jump: Jump) -> int:
        return labels[jump] - at - 1 if isinstance(jump, str) else jump

    return [(code, offset(at, jt), offset(at, jf), k) for at, (code, jt, jf, k) in enumerate(body)]


def listing() -> str:
    """The program as built, one instruction a line, jumps as absolute targets."""
    names = {v: k for k, v in REFUSED_CALLS.items()}
    commands = {v: k for k, v in REFUSED_FCNTL.items()}
    lines = []
    for at, (code, jt, jf, k) in enumerate(program()):
        if code == BPF_LD_W_ABS:
            text = f"ld  [{k}]"
        elif code == BPF_RET_K:
            text = "ret #SECCOMP_RET_ALLOW" if k == SECCOMP_RET_ALLOW else f"ret #SECCOMP_RET_ERRNO | {k & 0xFFFF}"
        else:
            loaded_cmd = at > len(REFUSED_CALLS) + 4
            name = (commands if loaded_cmd else names).get(k, "fcntl" if k == SYS_FCNTL else hex(k))
            text = f"{'jeq' if code == BPF_JEQ_K else 'jge'} #{name} ({k}), {at + 1 + jt}, {at + 1 + jf}"
        lines.append(f"{at:2d}  {text}")
    return "\n".join(lines)


def available() -> bool:
    """Whether ``install`` will install the filter here: x86_64, and a kernel with seccomp."""
    if not SUPPORTED:
        return False
    try:
        return "Seccomp:" in Path("/proc/self/status").read_text()
    except OSError:
        return False


def description() -> str:
    """What the seal's description of the sandbox ends with on this machine."""
    return DESCRIPTION if available() else UNFILTERED


def install() -> bool:
    """Installs the filter in this process (no_new_privs must be set), for good; returns whether
    it did (not elsewhere than x86_64 or without seccomp). Raises OSError if the kernel refuses."""
    if not available():
        return False
    code = program()
    instructions = (SockFilter * len(code))(*(SockFilter(*i) for i in code))
    fprog = SockFprog(len(code), ctypes.cast(instructions, ctypes.POINTER(SockFilter)))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter: {os.strerror(err)}")
    return True
