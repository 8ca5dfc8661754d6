"""What the MPI half of the benchmark measures, as written to and read from its JSON file.

Kept apart from ``mpi_ranks`` because importing mpi4py's ``MPI`` initialises MPI: the parent
process reads these records without ever becoming an MPI process.

Every number here is a measured wall time in seconds (the median over repetitions of the slowest
rank's time); ratios, overheads and targets are derived by ``suite.py``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ALLREDUCE_BYTES = (4 * 1024, 1024 * 1024, 16 * 1024 * 1024)
PINGPONG_BYTES = 8
SENDRECV_BYTES = 1024 * 1024
RANKS = 4


@dataclass(frozen=True)
class AllreduceTiming:
    nbytes: int
    ring_s: float  # problem 03's reference, in place, through the Comm proxy
    builtin_s: float  # mpi4py's Allreduce(MPI.IN_PLACE, buf) on the raw communicator
    builtin_out_of_place_s: float  # mpi4py's Allreduce(sendbuf, recvbuf): not the baseline


@dataclass(frozen=True)
class MpiTimings:
    ranks: int
    quick: bool
    repetitions: dict[str, int]
    allreduce: list[AllreduceTiming]
    pingpong_raw_s: float  # one round trip of PINGPONG_BYTES between ranks 0 and 1
    pingpong_proxy_s: float
    sendrecv_raw_s: float  # one Sendrecv of SENDRECV_BYTES around the ring of every rank
    sendrecv_proxy_s: float
    clocked_raw_s: float  # the same, measured again against the proxy with the online clock on
    clocked_proxy_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MpiTimings":
        values = dict(data)
        values["allreduce"] = [AllreduceTiming(**item) for item in data["allreduce"]]
        return cls(**values)

    @classmethod
    def read(cls, path: Path) -> "MpiTimings":
        return cls.from_json(json.loads(path.read_text()))


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    # A reader never sees half a file, even if the writer is killed mid-write.
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2) + "\n")
    partial.replace(path)
