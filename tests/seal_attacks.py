"""Solutions that attack the seal, for tests/test_seal_attacks.py: each a function ``work(comm, *args)``
run by tests/programs.py's ``call_solution`` in a sealed rank's learner process."""

import gc
import os
import socket
import subprocess
import sys
import time

import numpy as np

# What the learner process must hold no instance of: the engine, the proxy and its counters, the
# clock and its platform, the fault plan, the rank's state slot.
HARNESS_TYPES = {"Comm", "CommStats", "Timekeeper", "Platform", "FaultPlan", "MessageFaults",
                 "ProcessFaults", "RankSlot", "MpiEngine", "GlooEngine", "TraceRecorder", "Job"}


def _refused(action):
    try:
        action()
    except (OSError, AttributeError) as exc:
        return type(exc).__name__
    return "allowed"


def _listing(folder):
    try:
        return sorted(os.listdir(folder))
    except OSError as exc:
        return type(exc).__name__


def facts(comm, bank_reference, package_file, port):
    """What this process can see and do, as plain values."""
    from mpi4py import MPI

    return {
        "harness objects": sorted({type(o).__name__ for o in gc.get_objects()} & HARNESS_TYPES),
        "mpi initialized": MPI.Is_initialized(),
        "engine variables": sorted(k for k in os.environ
                                   if k.startswith(("OMPI_", "PMIX_", "MASTER_", "DISTLAB_ZYGOTE"))),
        "parent pid": os.getppid(),
        "uid": os.getuid(),
        "root's home": _listing("/root"),
        "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "tmp": sorted(os.listdir("/tmp")),
        "reference bytes": _refused(lambda: open(bank_reference).read()) if not os.path.exists(bank_reference)
        else len(open(bank_reference).read()),
        "bank bytecode": _listing(os.path.join(os.path.dirname(bank_reference), "__pycache__")),
        "write into distlab": _refused(lambda: open(package_file, "a").close()),
        "connect to the host": _refused(lambda: socket.create_connection(("127.0.0.1", port), 1)),
        "comm.stats": _refused(lambda: comm.stats),
        "own folder writable": _refused(lambda: open("mine.txt", "w").close()) == "allowed",
    }


def search_memory(comm, first_half, second_half):
    """Whether this process's memory holds first_half directly followed by second_half, found
    without ever joining the two: the whole string exists only where the job put it."""
    import ctypes

    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: a change of uid turned it off
    first, second = first_half.encode(), second_half.encode()
    found = regions = 0
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", buffering=0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except (OSError, OverflowError, ValueError):
                continue
            regions += 1
            at = data.find(first)
            while at >= 0:
                if data[at + len(first):at + len(first) + len(second)] == second:
                    found += 1
                at = data.find(first, at + 1)
    return {"found": found, "regions": regions}


def hold_the_ring_pipe(comm):
    """An outside tester's attack on the doorbell (doorbell.py): grow the pipe it rings on, leave
    a stray byte in it (the agent's next poll says readable), and splice into it from a socket
    that never gets data, which holds the pipe's lock, shared with the agent's end, while it
    waits: the agent then slept in the kernel in its read until the job's deadline. What the
    splice answered, and the Barrier after it, which the agent must serve."""
    import fcntl
    import threading

    lines = comm._end
    answered = []
    if comm.Get_rank() == 0:
        write_fd = lines.first._bell.write_fd
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 8192)
        os.set_blocking(write_fd, True)
        os.set_blocking(lines._opener.fileno(), True)
        os.write(write_fd, b"!")

        def hold():
            try:
                os.splice(lines._opener.fileno(), write_fd, 1)
                answered.append("spliced")
            except OSError as exc:
                answered.append(type(exc).__name__)

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        holder.join(2)
    comm.Barrier()
    if comm.Get_rank():
        return "not asked"
    return answered[0] if answered else "still in splice"


def forge_request(comm):
    """Writes a request into the arena behind the client's back, then calls as usual."""
    end = comm._end.first  # the main thread's line
    end._call_id += 1
    end.arena.write_block("request", end._call_id, b"\0" * 64)
    end._bell.ring()
    while end.arena.block_id("reply") != end._call_id:  # the agent has read it (and answered)
        time.sleep(0.001)
    comm.Barrier()


def forge_reply(comm):
    """Answers its own Allreduce: writes the sum (what every rank would get) as the agent's reply
    without sending the request, then a Barrier through the agent as usual."""
    from distlab.runtime.seal import wire

    end = comm._end.first  # the main thread's line
    end._call_id += 1
    end.arena.write_block("reply", end._call_id, wire.framed(wire.encode_reply(wire.Reply(wire.OK))))
    got = np.full(1, float(comm.Get_size()))  # the answer, without the call
    comm.Barrier()
    return float(got[0])


def forge_deep_result(comm, depth):
    """Hands the agent a result of its own making: ``depth`` lists nested in one another (a pickle of
    2 bytes a level; pickle.dumps itself would recurse past the limit), then returns as usual."""
    from distlab.runtime.seal.calls import Call

    data = b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."
    comm._end.call(Call.RESULT, (0, 1), inputs=(np.frombuffer(data, dtype=np.uint8),))
    return 1


def leave_a_child(comm, marker):
    """Starts a process in a session of its own, which would outlive an unsealed rank."""
    subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(60)  # {marker}"],
                     start_new_session=True)
    comm.Barrier()


def start_until_refused(comm, marker, most):
    """Starts processes that sleep, up to ``most``, until the kernel refuses one: how many it started
    and what refused the next (they are gone with the learner's namespace when the run ends)."""
    started, refused = 0, None
    for _ in range(most):
        try:
            subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(60)  # {marker}"])
        except OSError as exc:
            refused = type(exc).__name__
            break
        started += 1
    comm.Barrier()
    return started, refused


def fill_scratch(comm, folder):
    """Writes 32 MiB files into ``folder`` until a write fails: MiB written and the errno."""
    block, written, errno = b"x" * (32 << 20), 0, None
    try:
        for n in range(1000):
            with open(os.path.join(folder, f"fill-{n}"), "wb") as out:
                out.write(block)
            written += 32
    except OSError as exc:
        errno = exc.errno
    comm.Barrier()
    return written, errno


def signal_everyone(comm, supervisor_pid):
    """SIGKILL and SIGSTOP to every process this one can name (its parent, all at once, and the
    supervisor by its pid on the host), then a collective: whatever they reached, the agent
    still answers it."""
    import signal

    tried = {}
    for name, pid in (("parent", os.getppid()), ("everyone", -1), ("supervisor", supervisor_pid)):
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill(pid, sig)
                tried[f"{sig.name} to {name}"] = "sent"
            except OSError as exc:
                tried[f"{sig.name} to {name}"] = type(exc).__name__
    return tried, total_of(comm)


def total_of(comm):
    got = np.zeros(1)
    comm.Allreduce(np.ones(1), got)
    return float(got[0])


def die_in_recv(comm, how="exit", in_thread=False):
    """Rank 1 dies while blocked in a Recv: a timer ends its process with status 3, or by SIGINT
    (whose handler in the rank's agent is Python's, which only a main thread may reset). With
    ``in_thread``, the Recv is another thread's, which the main thread waits for."""
    import signal
    import threading

    if comm.Get_rank() == 1:
        if how == "exit":
            threading.Timer(0.5, os._exit, [3]).start()
        else:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            threading.Timer(0.5, os.kill, [os.getpid(), signal.SIGINT]).start()
        if in_thread:
            receiver = threading.Thread(target=comm.Recv, args=(np.empty(1),), kwargs={"source": 0})
            receiver.start()
            receiver.join()
        comm.Recv(np.empty(1), source=0)
    comm.Barrier()


def call_on_a_forged_communicator(comm):
    """A client of a communicator handle the agent never gave out, made by hand."""
    forged = type(comm)(comm._end, comm.Get_rank(), comm.Get_size(), 7)
    try:
        forged.Barrier()
    except Exception:  # noqa: BLE001 - the refusal is the agent's record, not this exception
        pass
    comm.Barrier()



def shared_kernel_objects(comm):
    """What each call of the seccomp filter's list gives (runtime/seal/syscalls.py): an errno's
    name, or "allowed"; the keyring's calls on this process's own keyring, the locks and watches
    on this file, which every rank can read. And ordinary fcntl commands and a read, which must
    still work."""
    import ctypes
    import errno
    import fcntl
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    process_keyring = ctypes.c_int(-2)  # KEY_SPEC_PROCESS_KEYRING: gone with this process

    def syscall(*args):
        done = libc.syscall(*args)
        return "allowed" if done >= 0 else errno.errorcode[ctypes.get_errno()]

    def call(action):
        try:
            action()
        except OSError as exc:
            return errno.errorcode[exc.errno]
        return "allowed"

    fd = os.open(__file__, os.O_RDONLY)
    pipe_read, pipe_write = os.pipe()
    lock = struct.pack("hhqqi", fcntl.F_RDLCK, os.SEEK_SET, 1 << 40, 1, 0)
    return {
        "add_key": syscall(248, b"user", b"distlab-probe", b"x", 1, process_keyring),
        "keyctl": syscall(250, 0, process_keyring, 1),  # KEYCTL_GET_KEYRING_ID, creating it
        "F_SETLK": call(lambda: fcntl.fcntl(fd, fcntl.F_SETLK, lock)),
        "F_GETLK": call(lambda: fcntl.fcntl(fd, fcntl.F_GETLK, lock)),
        "flock": call(lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)),
        "inotify_init1": syscall(294, 0),
        "fanotify_init": syscall(300, 0x200, os.O_RDONLY),  # FAN_REPORT_FID: allowed unprivileged
        "shmget": syscall(29, 0, 1 << 20, 0o1600),  # IPC_PRIVATE, IPC_CREAT | 0600: memory no mapping shows
        "msgget": syscall(68, 0, 0o1600),
        "memfd_create": call(lambda: os.close(os.memfd_create("distlab-probe"))),
        "socketpair": call(lambda: [s.close() for s in __import__("socket").socketpair()]),
        "socket": call(lambda: __import__("socket").socket().close()),
        # Each could wait holding a pipe's lock, which the agent shares (doorbell.py):
        "splice": call(lambda: os.splice(fd, pipe_write, 1)),
        "tee": syscall(276, pipe_read, pipe_write, 1, 0),
        "vmsplice": syscall(278, pipe_write, 0, 0, 0),
        "sendfile": call(lambda: os.sendfile(pipe_write, fd, 0, 1)),
        "io_uring_setup": syscall(425, 8, ctypes.create_string_buffer(120)),
        "userfaultfd": syscall(323, 1),  # UFFD_USER_MODE_ONLY: what an unprivileged process may ask
        "copyfile": call(lambda: __import__("shutil").copyfile(__file__, "/tmp/copied.py")),
        "F_GETFL": fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY,
        "F_SETFD": call(lambda: fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC)),
        "F_DUPFD": call(lambda: os.close(fcntl.fcntl(fd, fcntl.F_DUPFD, 100))),
        "read": len(os.read(fd, 1 << 20)) == os.fstat(fd).st_size > 0,
    }


def what_uid_0_could_write(comm):
    """What a learner left uid 0 (a folder it needs is root's alone and too large to copy) could
    reach that a uid checks: the kernel's settings (core_pattern runs a program as root outside
    every namespace) and the host's disks (root's, 0600; a read-only mount does not stop a device)."""
    seen = {"uid": os.getuid(), "dev": sorted(os.listdir("/dev"))}
    for path in ("/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger"):
        seen[path] = _refused(lambda: open(path, "w").close())
    return seen


def read_where_users_write(comm, path):
    """What the learner finds at ``path`` (a file left where users may write) and in /home."""
    return {"file": _refused(lambda: open(path).read()), "/home": _listing("/home"),
            "/sys/fs/cgroup": _listing("/sys/fs/cgroup")}


def forge_endless_result(comm, parts):
    """Hands the agent ``parts`` result parts of 32 MiB, none of them the last, then returns as usual."""
    from distlab.runtime.seal.calls import Call

    part = np.zeros(32 << 20, dtype=np.uint8)
    for _ in range(parts):
        comm._end.call(Call.RESULT, (0, 0), inputs=(part,))
    return 1


def lower_oom_score(comm):
    """The learner's oom_score_adj, and what lowering it to 0 says."""
    with open("/proc/self/oom_score_adj") as adj:
        score = int(adj.read())
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("0")
        lowered = "lowered"
    except OSError as exc:
        lowered = type(exc).__name__
    comm.Barrier()
    return score, lowered


def ask_for_lines(comm, how_many):
    """Asks its agent for ``how_many`` further lines at once (seal/lines.py), past the number its
    client ever opens, and reads every answer; then closes what it was given."""
    opener = comm._end._opener
    opener.sendall(b"+" * how_many)
    given = 0
    for _ in range(how_many):
        answer, fds, _, _ = socket.recv_fds(opener, 1, 2)
        given += bool(fds)
        for fd in fds:
            os.close(fd)
    comm.Barrier()
    return given


def flood_the_opener(comm, seconds):
    """Asks for lines for ``seconds`` without end, never reading an answer; then calls as usual."""
    import time

    opener = comm._end._opener
    opener.setblocking(False)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            opener.send(b"+" * 65536)
        except BlockingIOError:
            continue
        except OSError:
            break  # shut by the agent
    comm.Barrier()


def result_from_a_thread(comm):
    """Hands in a result from a thread, whose calls go on a line of their own: the task protocol is
    the first line's alone."""
    import threading

    from distlab.runtime.seal.calls import Call

    said = []

    def hand_in():
        try:
            comm._end.call(Call.RESULT, (0, 1), inputs=(np.frombuffer(b"\x80\x04K\x01.", dtype=np.uint8),))
        except Exception as exc:  # noqa: BLE001 - what the learner's code would see
            said.append(type(exc).__name__)

    thread = threading.Thread(target=hand_in)
    thread.start()
    thread.join()
    comm.Barrier()
    return said


def fork_and_fill(comm, children, mib):
    """Starts ``children`` processes that each fill ``mib`` MiB, each within the rank's memory
    limit and all of them together far past it; returns how each ended (0: it exited)."""
    import time

    pids = []
    for _ in range(children):
        pid = os.fork()
        if pid == 0:
            try:
                block = np.ones((mib << 20) // 8)
                time.sleep(2)
                del block
            finally:
                os._exit(0)
        pids.append(pid)
    return [os.waitpid(pid, 0)[1] for pid in pids]


def fill_and_wait_on_children(comm, children, mib):
    """As fork_and_fill, but the children hold their memory until they are ended, and the learner
    waits for every one of them: one the kernel ended leaves it waiting on the others."""
    import time

    pids = []
    for _ in range(children):
        pid = os.fork()
        if pid == 0:
            try:
                block = np.ones((mib << 20) // 8)
                while block.size:
                    time.sleep(1)
            finally:
                os._exit(0)
        pids.append(pid)
    return [os.waitpid(pid, 0)[1] for pid in pids]


def call_from_a_forked_child(comm):
    """A child forked by the solution calls comm (its parent's lines): what it is told."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            comm.Barrier()
            said = "called"
        except BaseException as exc:  # noqa: BLE001 - what the child's code sees
            said = f"{type(exc).__name__}: {exc}"
        os.write(write, said.encode()[:500])
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    said = os.read(read, 500).decode()
    comm.Barrier()
    return said
