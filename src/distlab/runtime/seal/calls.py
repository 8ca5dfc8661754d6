"""The calls a learner process may ask of its agent: op codes and what each request may carry.

One entry per method of the learner's ``comm`` (runtime/comm/proxy.py, collectives.py,
requests.py), plus HELLO (a ping: the channel's own tests use it; a task's rank and size come
with NEXT_TASK). This is the table the
decoder holds every request against (wire.py); the bounds here are static (a rank below 2**20, a
tag below 2**31), and whether a rank exists in this communicator stays the proxy's check, as today.

A blocking call (``timed``) may carry one float more, its own ``timeout=``, which the agent
applies to that call alone; the communicator's own timeout is the agent's (TIMEOUT). The
argument order follows mpi4py's, and what the agent answers
(``ints`` of the reply) is noted per call. Nonblocking receives declare their buffer at Irecv
(the agent receives into its own array of that shape) and pass it again as the output of the
Wait or Test that completes them.

Every request names the communicator it is made on (wire.py's header: 0 is the task's, and
Split and Create_group answer with the handle of the new one). NEXT_TASK, TASK_ARGS and RESULT
are the task protocol (runtime/seal/service.py): the learner process asks
for the next task of the batch, fetches its arguments (pickled by the agent, which the learner
trusts) in parts of at most the arena's size, and hands back its result in parts: kind 0 is the
program's return value, kind 1 a failure (values.py says how each is encoded and read).
"""

from __future__ import annotations

from enum import IntEnum

from ..engines.base import UNDEFINED
from .wire import Int, Signature

MAX_RANK = 2**20 - 1
MAX_TAG = 2**31 - 1
MAX_REQUEST = 2**31 - 1
REDUCE_OPS = ("SUM", "PROD", "MAX", "MIN")  # distlab.ops.BY_NAME's operators, by code

DEST = Int("dest", 0, MAX_RANK)
SOURCE = Int("source", -1, MAX_RANK)  # -1: ANY_SOURCE
ROOT = Int("root", 0, MAX_RANK)
SEND_TAG = Int("tag", 0, MAX_TAG)
RECV_TAG = Int("tag", -1, MAX_TAG)  # -1: ANY_TAG
REQUEST = Int("request", 0, MAX_REQUEST)
REDUCE_OP = Int("op", 0, len(REDUCE_OPS) - 1)
ONE, MAYBE = range(1, 2), range(0, 2)
KEY = 256  # the longest store key, in bytes
TIMED = Int("timed", 0, 1)  # 1: the float that follows is the call's own timeout
MAX_STORE_VALUE = 64 * 1024  # the largest value a store get returns across the seal


class Call(IntEnum):
    HELLO = 1  # -> (rank, size)
    SEND = 2
    SSEND = 3
    RECV = 4  # -> (source, tag, count)
    ISEND = 5  # -> (request,)
    IRECV = 6  # -> (request,)
    SENDRECV = 7  # -> (source, tag, count)
    WAIT = 8  # -> (source, tag, count)
    TEST = 9  # -> (done, source, tag, count)
    WAITALL = 10
    BARRIER = 11
    BCAST = 12
    REDUCE = 13
    ALLREDUCE = 14
    IALLREDUCE = 15  # -> (request,)
    REDUCE_SCATTER = 16
    REDUCE_SCATTER_BLOCK = 17
    ALLGATHER = 18
    ABORT = 19
    COMPUTE = 20  # ints: 0 for seconds, 1 for flops; floats: the amount; text: the label
    MARK = 21
    NOW = 22  # floats -> (virtual time,)
    NEXT_TASK = 23  # -> (task index or -1 when the batch is done, bytes of its arguments, rank, size)
    TASK_ARGS = 24  # ints: (offset,); output: the next part of the task's pickled arguments
    RESULT = 25  # ints: (kind, last part); input: a part of the task's result (values.py)
    SPLIT = 26  # -> (communicator handle or -1 for none, rank, size)
    CREATE_GROUP = 27  # input: the group's ranks (int64); -> (communicator handle, rank, size)
    FREE = 28
    GATHER = 29
    SCATTER = 30
    # inputs: the block, (counts, displacements) as one row of int64, and the receive buffer as
    # it is (laid where the output goes: what no block covers keeps the learner's values)
    ALLGATHERV = 31
    ALLTOALL = 32
    WAITANY = 33  # ints: the requests; outputs: the buffers of those that have one, in order
    #  -> (index or -1 when none is pending, source, tag, count)
    TESTALL = 34  # as WAITALL -> (all done,)
    IBCAST = 35  # -> (request,)
    IALLGATHER = 36  # -> (request,)
    IREDUCE_SCATTER_BLOCK = 37  # -> (request,)
    ALLTOALLV = 38  # inputs: the send buffer, both layouts as one row of int64, the receive buffer
    PROBE = 39  # -> (source, tag, bytes)
    IPROBE = 40  # -> (found, source, tag, bytes)
    # The task's store (runtime/comm/store.py); the text is the key (wait: keys joined by NUL).
    STORE_SET = 41  # input: the value
    STORE_GET = 42  # ints: (has a timeout,); floats: (timeout,); output: a place for the value
    STORE_ADD = 43  # ints: (amount,) -> (total,)
    STORE_COMPARE_SET = 44  # inputs: expected, desired; output: a place for the value then
    STORE_WAIT = 45  # ints: (has a timeout,); floats: (timeout,)
    STORE_DELETE = 46  # -> (deleted,)
    STORE_NUM_KEYS = 47  # -> (keys,)
    STORE_TIMEOUT = 48  # floats: (timeout,)
    # comm.set_timeout / get_timeout: ints (0 get, 1 set to the float, 2 clear), floats (seconds,)
    #  -> (has a timeout,) and floats (the timeout, 0 for none)
    TIMEOUT = 49
    # Survivors (runtime/comm/survivors.py)
    REVOKE = 50
    IS_REVOKED = 51  # -> (revoked,)
    AGREE = 52  # ints: (flag,) -> (agreed flag,)
    GET_FAILED = 53  # -> the failed ranks of the communicator
    ACK_FAILED = 54  # -> (acknowledged,)
    SHRINK = 55  # -> (communicator handle, rank, size)
    ADMIT = 56  # -> (communicator handle, rank, size); handle -1: the same communicator
    # The harness's code is loaded, the learner's file is next: the agent reads the learner's
    # memory before answering (Task.memory; rank/memory.py). Once, before the first task.
    BEFORE_SOLUTION = 57


CALLS: dict[int, Signature] = {
    Call.HELLO: Signature("HELLO"),
    Call.SEND: Signature("Send", (DEST, SEND_TAG), inputs=ONE, timed=True),
    Call.SSEND: Signature("Ssend", (DEST, SEND_TAG), inputs=ONE, timed=True),
    Call.RECV: Signature("Recv", (SOURCE, RECV_TAG), outputs=ONE, timed=True),
    Call.ISEND: Signature("Isend", (DEST, SEND_TAG), inputs=ONE),
    Call.IRECV: Signature("Irecv", (SOURCE, RECV_TAG), outputs=ONE),
    Call.SENDRECV: Signature("Sendrecv", (DEST, SEND_TAG, SOURCE, Int("recvtag", -1, MAX_TAG)),
                             inputs=ONE, outputs=ONE, timed=True),
    Call.WAIT: Signature("Wait", (REQUEST,), outputs=MAYBE, timed=True),
    Call.TEST: Signature("Test", (REQUEST,), outputs=MAYBE),
    # wire.py's 32 buffers
    Call.WAITALL: Signature("Waitall", more=REQUEST, outputs=range(0, 33), timed=True),
    Call.BARRIER: Signature("Barrier", timed=True),
    Call.BCAST: Signature("Bcast", (ROOT,), inputs=MAYBE, outputs=ONE, timed=True),
    Call.REDUCE: Signature("Reduce", (REDUCE_OP, ROOT), inputs=ONE, outputs=MAYBE, timed=True),
    Call.ALLREDUCE: Signature("Allreduce", (REDUCE_OP,), inputs=ONE, outputs=ONE, timed=True),
    Call.IALLREDUCE: Signature("Iallreduce", (REDUCE_OP,), inputs=ONE, outputs=ONE),
    Call.REDUCE_SCATTER: Signature("Reduce_scatter", (REDUCE_OP,), more=Int("count", 0, 2**40),
                                   inputs=ONE, outputs=ONE, timed=True),
    Call.REDUCE_SCATTER_BLOCK: Signature(
        "Reduce_scatter_block", (REDUCE_OP,), inputs=ONE, outputs=ONE, timed=True),
    Call.ALLGATHER: Signature("Allgather", inputs=ONE, outputs=ONE, timed=True),
    Call.ABORT: Signature("Abort", (Int("errorcode", -(2**31), 2**31 - 1),)),
    Call.COMPUTE: Signature("compute", (Int("per", 0, 1),), floats=1, text=256),
    Call.MARK: Signature("mark", text=256),
    Call.NOW: Signature("now"),
    Call.NEXT_TASK: Signature("next task"),
    Call.TASK_ARGS: Signature("task arguments", (Int("offset", 0, 2**40),), outputs=ONE),
    Call.RESULT: Signature("result", (Int("kind", 0, 1), Int("last", 0, 1)), inputs=ONE),
    Call.SPLIT: Signature("Split", (Int("color", UNDEFINED, 2**31 - 1), Int("key", -(2**31), 2**31 - 1))),
    Call.CREATE_GROUP: Signature("Create_group", (Int("tag", 0, MAX_TAG),), inputs=ONE),
    Call.FREE: Signature("Free"),
    Call.GATHER: Signature("Gather", (ROOT,), inputs=ONE, outputs=MAYBE, timed=True),
    Call.SCATTER: Signature("Scatter", (ROOT,), inputs=MAYBE, outputs=ONE, timed=True),
    Call.ALLGATHERV: Signature("Allgatherv", inputs=range(3, 4), outputs=ONE, timed=True),
    Call.ALLTOALL: Signature("Alltoall", inputs=ONE, outputs=ONE, timed=True),
    Call.WAITANY: Signature("Waitany", more=REQUEST, outputs=range(0, 33), timed=True),
    Call.TESTALL: Signature("Testall", more=REQUEST, outputs=range(0, 33)),
    Call.IBCAST: Signature("Ibcast", (ROOT,), inputs=MAYBE, outputs=ONE),
    Call.IALLGATHER: Signature("Iallgather", inputs=ONE, outputs=ONE),
    Call.IREDUCE_SCATTER_BLOCK: Signature("Ireduce_scatter_block", (REDUCE_OP,), inputs=ONE,
                                          outputs=ONE),
    Call.ALLTOALLV: Signature("Alltoallv", inputs=range(3, 4), outputs=ONE, timed=True),
    Call.PROBE: Signature("Probe", (SOURCE, RECV_TAG), timed=True),
    Call.IPROBE: Signature("Iprobe", (SOURCE, RECV_TAG)),
    Call.STORE_SET: Signature("store.set", inputs=ONE, text=KEY),
    Call.STORE_GET: Signature("store.get", (TIMED,), floats=1, outputs=ONE, text=KEY),
    Call.STORE_ADD: Signature("store.add", (Int("amount", -(2**62), 2**62),), text=KEY),
    Call.STORE_COMPARE_SET: Signature("store.compare_set", inputs=range(2, 3), outputs=ONE, text=KEY),
    Call.STORE_WAIT: Signature("store.wait", (TIMED,), floats=1, text=1024),
    Call.STORE_DELETE: Signature("store.delete_key", text=KEY),
    Call.STORE_NUM_KEYS: Signature("store.num_keys"),
    Call.STORE_TIMEOUT: Signature("store.set_timeout", floats=1),
    Call.TIMEOUT: Signature("set_timeout", (Int("action", 0, 2),), floats=1),
    Call.REVOKE: Signature("Revoke"),
    Call.IS_REVOKED: Signature("Is_revoked"),
    Call.AGREE: Signature("Agree", (Int("flag", -(2**31), 2**31 - 1),)),
    Call.GET_FAILED: Signature("Get_failed"),
    Call.ACK_FAILED: Signature("Ack_failed"),
    Call.SHRINK: Signature("Shrink"),
    Call.ADMIT: Signature("Admit"),
    Call.BEFORE_SOLUTION: Signature("before the solution"),
}
