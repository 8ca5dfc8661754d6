"""What MPI itself carried, counted below the learner's communicator by Open MPI's monitoring.

Why: the proxy (runtime/comm) counts every call that goes through it, but a candidate can reach mpi4py
however the import is disguised and call ``MPI.COMM_WORLD.Allreduce`` or ``Send`` around it. Open
MPI's monitoring components (pml, coll and osc "monitoring", shipped in the wheel) count every
message below every communicator, whoever sent it. Exam grading turns them on and compares.

How a job is made comparable (``Job.mpi_monitoring``, MPI backend only; gloo has no such counters):

* ``monitoring_env`` is added to mpiexec's environment: each rank writes
  ``mpi-monitoring.<world rank>.prof`` into the job folder at MPI_Finalize (parsed by
  ``parse_monitoring``): external point-to-point messages per destination world rank, whatever
  the communicator ("E" lines); the messages inside collectives ("I", not used: they depend on the
  algorithm Open MPI picks); one-sided traffic ("# OSC"); and per communicator, by name, how many
  collective operations ran and their bytes ("D" blocks).
* ``harness_engine`` (runtime/engines/counted.py, in the rank) moves the whole harness off MPI_COMM_WORLD: the probe is
  ``COMM_WORLD.Dup()`` and the harness runs on ``probe.Dup()``. Both duplications start from the
  same state on every rank, so they cost the same agreement collectives, the first on
  MPI_COMM_WORLD and the second on the probe, which carries nothing else. Whatever else
  MPI_COMM_WORLD carries is not the harness's.
* ``CountedEngine`` (the same file) counts every point-to-point message the harness hands to MPI (the proxy's
  sends as it forwards them, the online clock's time stamps, nothing dropped by a fault plan).
  The harness's own collectives (barriers between tasks, splits, the proxy's built-in
  collectives, the clock's allreduce) run on harness communicators and send no external message.

The rule (``unexplained``), one sentence for the report: MPI carried something the proxy did not
if, on some rank, it sent more point-to-point messages (or bytes) to a peer than the harness
handed it, ran more collective operations on MPI_COMM_WORLD than on the probe, or carried any
one-sided traffic. Honest code (through ``comm``, built-in collectives included) meets each of
these with equality or zero; a direct call on ``MPI.COMM_WORLD`` breaks one of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engines.counted import PROBE_NAME, WORLD_NAME

FILE_STEM = "mpi-monitoring"

_PEER_LINE = re.compile(r"^([EISR])\t(\d+)\t(\d+)\t(\d+) bytes\t(\d+) msgs sent")
_COMM_LINE = re.compile(r"^D\t(.*)\tprocs: ")
_OP_LINE = re.compile(r"^(O2A|A2O|A2A)\t(\d+)\t(\d+) bytes\t(\d+) msgs sent")


def monitoring_env(job_dir: Path) -> dict[str, str]:
    """The variables that make every rank of an mpiexec count its traffic into ``job_dir``."""
    return {
        # 2 keeps point-to-point messages the program sent ("E") apart from those inside
        # collectives ("I"); 1 would lump them together.
        "OMPI_MCA_pml_monitoring_enable": "2",
        # Written at MPI_Finalize, one file per rank, to the filename + ".<rank>.prof".
        "OMPI_MCA_pml_monitoring_enable_output": "3",
        "OMPI_MCA_pml_monitoring_filename": str(job_dir / FILE_STEM),
    }


def monitoring_path(job_dir: Path, rank: int) -> Path:
    return job_dir / f"{FILE_STEM}.{rank}.prof"


@dataclass(frozen=True)
class Traffic:
    """Messages (for a collective: operations) and their payload bytes."""

    messages: int = 0
    bytes: int = 0

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.messages + other.messages, self.bytes + other.bytes)

    def beyond(self, allowed: Traffic) -> Traffic:
        """What this exceeds ``allowed`` by, counted apart in messages and bytes (never negative)."""
        return Traffic(max(0, self.messages - allowed.messages), max(0, self.bytes - allowed.bytes))

    def __bool__(self) -> bool:
        return self.messages > 0 or self.bytes > 0


@dataclass
class RankMonitoring:
    """One rank's monitoring file. Peers are world ranks."""

    rank: int
    external: dict[int, Traffic] = field(default_factory=dict)  # point to point, sent to a peer
    internal: dict[int, Traffic] = field(default_factory=dict)  # inside collectives, to a peer
    one_sided: dict[int, Traffic] = field(default_factory=dict)  # RMA, to or from a peer
    collectives: dict[str, Traffic] = field(default_factory=dict)  # communicator name -> operations


def parse_monitoring(text: str, rank: int) -> RankMonitoring:
    """Reads a ``.prof`` file. Lines end with a size histogram that is ignored; communicators with
    one name (several tasks' "distlab.task") are summed."""
    found = RankMonitoring(rank)
    kinds = {"E": found.external, "I": found.internal, "S": found.one_sided, "R": found.one_sided}
    communicator: str | None = None
    for line in text.splitlines():
        if peer_line := _PEER_LINE.match(line):
            kind, _src, peer, nbytes, messages = peer_line.groups()
            table = kinds[kind]
            table[int(peer)] = table.get(int(peer), Traffic()) + Traffic(int(messages), int(nbytes))
        elif comm_line := _COMM_LINE.match(line):
            communicator = comm_line.group(1)
        elif (op_line := _OP_LINE.match(line)) and communicator is not None:
            _kind, _rank, nbytes, operations = op_line.groups()
            so_far = found.collectives.get(communicator, Traffic())
            found.collectives[communicator] = so_far + Traffic(int(operations), int(nbytes))
    return found


def read_job(job_dir: Path, world_size: int) -> dict[int, RankMonitoring]:
    """The monitoring files of every rank that reached MPI_Finalize (the others are absent)."""
    ranks = {}
    for rank in range(world_size):
        try:
            text = monitoring_path(job_dir, rank).read_text(errors="replace")
        except OSError:
            continue
        ranks[rank] = parse_monitoring(text, rank)
    return ranks


@dataclass
class Unexplained:
    """Traffic MPI carried that the harness did not hand it, summed over ranks (and launches)."""

    point_to_point: Traffic = Traffic()
    world_collectives: Traffic = Traffic()
    one_sided: Traffic = Traffic()
    launches_measured: int = 0
    ranks_unmeasured: int = 0  # ranks whose file was missing (they did not finalize in time)

    @property
    def flagged(self) -> bool:
        return bool(self.point_to_point or self.world_collectives or self.one_sided)

    def add(self, other: Unexplained) -> None:
        self.point_to_point += other.point_to_point
        self.world_collectives += other.world_collectives
        self.one_sided += other.one_sided
        self.launches_measured += other.launches_measured
        self.ranks_unmeasured += other.ranks_unmeasured

    def sentence(self) -> str:
        """"MPI carried 2 point-to-point messages (160 B) ... that the proxy did not"."""
        parts = []
        if self.point_to_point:
            p = self.point_to_point
            parts.append(f"{p.messages} point-to-point message(s) ({p.bytes} B)")
        if self.world_collectives:
            c = self.world_collectives
            parts.append(f"{c.messages} collective operation(s) on MPI_COMM_WORLD ({c.bytes} B)")
        if self.one_sided:
            o = self.one_sided
            parts.append(f"{o.messages} one-sided message(s) ({o.bytes} B)")
        if not parts:
            return "MPI carried nothing the proxy did not"
        return "MPI carried " + " and ".join(parts) + " that the proxy did not"

    def to_json(self) -> dict[str, Any]:
        return {
            "flagged": self.flagged,
            "point_to_point": {"messages": self.point_to_point.messages, "bytes": self.point_to_point.bytes},
            "world_collectives": {
                "operations": self.world_collectives.messages, "bytes": self.world_collectives.bytes
            },
            "one_sided": {"messages": self.one_sided.messages, "bytes": self.one_sided.bytes},
            "launches_measured": self.launches_measured,
            "ranks_unmeasured": self.ranks_unmeasured,
            "sentence": self.sentence(),
        }


def unexplained(
    carried: dict[int, RankMonitoring],
    handed: dict[int, dict[int, tuple[int, int]]],
    world_size: int,
) -> Unexplained:
    """The rule of the module docstring, for one launch. ``handed[rank][peer]`` is (messages,
    bytes) the harness gave MPI for that peer (``CountedEngine``)."""
    found = Unexplained(launches_measured=1)
    for rank in range(world_size):
        mine = carried.get(rank)
        if mine is None:
            found.ranks_unmeasured += 1
            continue
        sent_by_harness = handed.get(rank, {})
        for peer, traffic in mine.external.items():
            allowed = Traffic(*sent_by_harness.get(peer, (0, 0)))
            found.point_to_point += traffic.beyond(allowed)
        world = mine.collectives.get(WORLD_NAME, Traffic())
        probe = mine.collectives.get(PROBE_NAME, Traffic())
        found.world_collectives += world.beyond(probe)
        for traffic in mine.one_sided.values():
            found.one_sided += traffic
    return found
