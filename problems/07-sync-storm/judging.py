"""How problem 07 judges the sums: the expected values, computed here (every rank's gradients summed tensor by
tensor, as one Allreduce per tensor would; the model trained on the global batch in one process), and
``diagnose_sums``, which names what is wrong the way a reviewer would (a float32 buffer, a partial buffer never
sent, an average).

Nothing a rank returns is taken on trust: the learner's code shares the process that produced it. A result is
first checked for its form (``malformed``), the sums against the per-tensor sums recomputed here (no rank holds
another rank's data, so right sums must have come through the collectives), and then the collectives
themselves, as the agents recorded them, must have carried every byte of every step (``unreduced``). The size
of every buffer is read from the agents' records too (``buffers_seen``), not from the harness's RecordingComm,
which the learner's code can go around or rewrite."""

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from distlab.grading import CaseRun, Counts, agreement, first_mismatch

from . import cases as model
from .cases import Case

OWN_BUFFER = "pack each dtype in a buffer of its own"
MARKS = ("step",)  # the marks the harness's program sets (Task.marks): one "step" per training step


def per_tensor_sums(case: Case, params: dict, step: int) -> tuple[list[dict], dict]:
    """Every rank's gradients of ``step``, and what one Allreduce(SUM) per tensor gives."""
    per_rank = [model.gradients(case.spec, params, *model.make_batch(case.spec, 0, step, r)) for r in range(case.p)]
    return per_rank, {name: sum(grads[name] for grads in per_rank) for name in per_rank[0]}


def single_process_training(case: Case) -> list[np.ndarray]:
    params = model.init_params(case.spec)
    for step in range(case.steps):
        model.apply_update(case.spec, params, per_tensor_sums(case, params, step)[1], case.p)
    return model.flat_params(params)


@functools.lru_cache(maxsize=16)
def first_step(case: Case) -> tuple[list[list[np.ndarray]], list[np.ndarray]]:
    """Every rank's gradients of step 0, and their per-tensor sums (computed once per case)."""
    per_rank, sums = per_tensor_sums(case, model.init_params(case.spec), 0)
    return [list(grads.values()) for grads in per_rank], list(sums.values())


def right(got: np.ndarray, want: np.ndarray) -> bool:
    """Ints exact; floats up to summation order (float64 far tighter than float32)."""
    return (isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
            and bool(agreement(got, want, **tolerance(want)).all()))


def tolerance(want: np.ndarray) -> dict[str, float]:
    rtol = 0.0 if want.dtype.kind in "iu" else 1e-5 if want.dtype == np.float32 else 1e-12
    return {"rtol": rtol, "atol": rtol * (float(np.abs(want).max(initial=0.0)) or 1.0)}


def collectives(counts: Counts) -> tuple[int, str]:
    """How many collectives a phase made, and which: (12, 'Allreduce x12')."""
    used = {op: counts.calls[op] for op in counts.collectives_used()}
    return sum(used.values()), ", ".join(f"{op} x{n}" for op, n in sorted(used.items()))


def first_wrong(results: list[CaseRun]) -> str | None:
    """The first wrong sum of any training case (the results check's message), or None: a result of the wrong
    form, a wrong sum, then sums that no collective carried (right values are not enough)."""
    for result in results:
        for rank, value in enumerate(result.values):
            if message := malformed(result.case, rank, value):
                return message
    for result in results:
        per_rank, want = first_step(result.case)
        for rank, value in enumerate(result.values):
            made = collectives(result.task.counts(rank, "step"))[0]
            if message := diagnose_sums(result.case, rank, value.first_sums, want, per_rank[rank], made):
                return message
    return unreduced(results)


def is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer))


def malformed(case: Case, rank: int, value: Any) -> str | None:
    """What is wrong with the form of what a rank returned (the harness's CaseResult), or None."""
    head = f"{case.label()}: rank {rank} returned"
    names = ("first_sums", "allreduces", "final", "final_digest")
    if not all(hasattr(value, name) for name in names):
        return f"{head} a {type(value).__name__}, not the harness's CaseResult"
    arrays = value.first_sums
    if not isinstance(arrays, list) or not all(isinstance(a, np.ndarray) and a.dtype.kind in "biuf" for a in arrays):
        return f"{head} step 0's sums as something other than a list of numeric NumPy arrays"
    if not is_int(value.final_digest) or not isinstance(value.allreduces, list):
        return f"{head} a parameter digest or Allreduce record of the wrong type"
    if rank == 0:
        want = model.flat_params(model.init_params(case.spec))
        final = value.final
        if (not isinstance(final, list) or len(final) != len(want)
                or not all(isinstance(g, np.ndarray) and g.shape == w.shape and g.dtype == w.dtype
                           for g, w in zip(final, want))):
            return f"{head} final parameters that are not the model's {len(want)} arrays (shapes and dtypes)"
    return None


def carried(counts: Counts) -> int:
    """The buffer bytes of a phase's collectives, as the rank's agent counted them."""
    return sum(int(counts.op_bytes.get(op, 0)) for op in counts.collectives_used())


def unreduced(results: list[CaseRun]) -> str | None:
    """The first step of any rank whose collectives carried fewer bytes than its gradients (every tensor must be
    reduced, whatever values the rank returns), as a message, or None."""
    for result in results:
        case = result.case
        total = sum(case.nbytes_by_dtype().values())
        for rank in range(case.p):
            steps = result.task.phases(rank, "step")
            if len(steps) != case.steps:
                return (f"{case.label()}: rank {rank} ran {len(steps)} training step(s), not the harness's "
                        f"{case.steps}: it set {len(steps)} marks \"step\" where the harness sets one per step "
                        "(your own marks may have other names)")
            for s, step in enumerate(steps):
                if (sent := carried(step)) < total:
                    calls = collectives(step)[1] or "no collective at all"
                    return (f"{case.label()}, step {s}: rank {rank}'s collectives carried {sent} bytes ({calls}), "
                            f"fewer than the step's {total} bytes of gradients: every tensor must be reduced "
                            "across the ranks by a collective, whatever values it ends with")
    return None


def timed_wrong(case: Case, rank: int, sample: Any) -> str | None:
    """What is wrong with a rank's sample of the timed fused step (the first 4 elements of every tensor)."""
    want = first_step(case)[1]
    if not isinstance(sample, list) or len(sample) != len(want):
        return f"{case.label()}: rank {rank} returned no sample of its {len(want)} tensors from the timed step"
    for i, (g, w) in enumerate(zip(sample, want)):
        if not right(g, w[:4]):
            return f"{case.label()}: rank {rank}'s tensor #{i} is wrong in the timed step"
    return None


def timed_evidence(case: Case, fused: Any, base: Any) -> str | None:
    """What the agents recorded of the timed tasks, checked against what they must hold, as a message, or None:
    the fused step's collectives carry every byte; the baseline is one Allreduce per tensor and nothing else;
    neither declares any compute (the harness declares none)."""
    total = sum(case.nbytes_by_dtype().values())
    for task, what in ((fused, "the timed fused step"), (base, "the timed per-tensor baseline")):
        for rank in range(case.p):
            spans = task.timeline().events(rank, "compute")
            if spans:
                return (f"the declared compute differs from the harness's: in {what}, rank {rank} declared "
                        f"{len(spans)} compute span(s) ({spans[0].name!r}, {spans[0].seconds:.3g} s); the harness "
                        "declares none")
            counts = task.counts(rank)
            if task is fused and (sent := carried(counts)) < total:
                calls = collectives(counts)[1] or "no collective at all"
                return (f"{case.label()}, {what}: rank {rank}'s collectives carried {sent} bytes ({calls}), fewer "
                        f"than the step's {total} bytes of gradients: every tensor must be reduced")
            if task is base and (collectives(counts) != (case.tensors, f"Allreduce x{case.tensors}")
                                 or carried(counts) != total or counts.messages_sent):
                return (f"{case.label()}, {what}: rank {rank} made {collectives(counts)[1] or 'no collective'} "
                        f"({carried(counts)} bytes, {counts.messages_sent} messages), not one Allreduce per tensor "
                        f"({case.tensors}, {total} bytes): the harness's baseline was altered")
    return None


def diagnose_sums(case: Case, rank: int, got: list[np.ndarray], want: list[np.ndarray], own: list[np.ndarray],
                  made: int) -> str | None:
    """None if rank's sums are right; else what is wrong, named the way a reviewer would (``made``: the
    collectives of the rank's step)."""
    head = f"{case.label()}: after step 0's flush(), rank {rank}"
    if len(got) != len(want):
        return f"{head} holds {len(got)} tensors, expected {len(want)}"
    wrong = [i for i in range(len(want)) if not right(got[i], want[i])]
    if not wrong:
        return None

    def tensor(i: int) -> str:
        return f"tensor #{i} {list(model.step_shapes(case.spec))[i]} ({got[i].dtype}, shape {got[i].shape})"

    if all(np.array_equal(got[i], own[i]) for i in wrong):
        if len(wrong) == len(want) or not made:
            sent = f"{made} collective(s)" if made else "no collective at all"
            return (f"{head}: every tensor still holds this rank's own gradient ({sent} in the step): add() and "
                    "flush() must reduce every tensor across the ranks")
        if tails := unsent_tails(got, wrong):
            return (f"{head}: the last {tails} tensors added still hold this rank's own gradient: the last partial "
                    "buffer was never sent; flush() must send every buffer that is not empty")
        return f"{head}: {len(wrong)} tensors were never reduced, e.g. {', '.join(tensor(i) for i in wrong[:3])}"
    for i in wrong:
        g, w = got[i], want[i]
        if w.dtype == np.float64 and g.shape == w.shape and np.allclose(g, w, rtol=1e-6, atol=1e-6):
            rel = float(np.max(np.abs(g - w) / np.maximum(np.abs(w), 1e-30)))
            return (f"{head}: {tensor(i)} equals the per-tensor sum only to float32 precision (relative error up "
                    f"to {rel:.1e}): it went through a float32 buffer; {OWN_BUFFER}")
        if w.dtype == np.int64 and g.shape == w.shape and (buffer := rounded_through(g, w, case.p)):
            off, top = int(np.max(np.abs(g.astype(object) - w.astype(object)))), max(int(np.abs(w).max()), 1)
            return (f"{head}: {tensor(i)} is off by up to {off} (values up to 2^{int(np.log2(top))}, more than a "
                    f"{buffer}'s {np.finfo(buffer).nmant + 1} bits), and every value it holds is one a {buffer} "
                    f"holds exactly: its integers went through a {buffer} buffer, which cannot hold 64-bit "
                    f"integers exactly; {OWN_BUFFER}")
    i, g, w = wrong[0], got[wrong[0]], want[wrong[0]]
    if g.shape == w.shape and case.p > 1 and w.dtype.kind in "fi":
        averaged = "the sum divided by p: Fusion sums (SUM); averaging is the caller's business"
        for factor, what in ((1.0 / case.p, averaged), (float(case.p), "p times the sum: was a buffer reduced twice?")):
            if np.allclose(g, w * factor, rtol=1e-4, atol=1e-6 if w.dtype.kind == "f" else 1.0):
                return f"{head}: {tensor(i)} holds {what}"
    if g.shape != w.shape or g.dtype != w.dtype:
        return f"{head}: {tensor(i)} came back as {g.dtype} {g.shape}"
    first = first_mismatch(g, w, **tolerance(w))
    assert first is not None  # tensor #i is wrong
    seen = (f"{head}: {tensor(i)}, element {first.index}: expected {first.expected!r}, saw {first.seen!r} "
            f"({len(wrong)} of {len(want)} tensors wrong)")
    if w.dtype.kind in "iu":  # no float rounding explains it (above): say so, and what that leaves
        top = int(np.abs(w).max())
        exact = next((f"values up to {top}, which a {f} holds exactly" for f, bits in (("float32", 24),
                      ("float64", 53)) if top < 2**bits), "not what float64 or float32 rounding of them gives")
        return (f"{seen}: not a floating-point buffer's rounding ({exact}); the integers were summed wrong or "
                "copied back to the wrong place: are the offsets of each tensor in its buffer right?")
    return seen


def rounded_through(got: np.ndarray, want: np.ndarray, p: int) -> str:
    """The float dtype ("float64", "float32") whose rounding explains int64 sums that came back wrong, or '':
    the right sums need more bits than its mantissa, every value got is one that dtype holds exactly (a float
    buffer cast back), and each is within what rounding p values and their sum moves them (2(p+1) ulps)."""
    seen, right = got.ravel().tolist(), want.ravel().tolist()
    top = max(map(abs, right), default=0)
    for dtype in (np.float64, np.float32):
        bits = np.finfo(dtype).nmant + 1
        if (top >= 2**bits and all(int(dtype(v)) == v for v in seen)
                and all(abs(a - b) <= 2 * (p + 1) * top * 2.0**-bits for a, b in zip(seen, right))):
            return np.dtype(dtype).name
    return ""


def unsent_tails(got: list[np.ndarray], wrong: list[int]) -> str:
    """'3 float32 and 1 int64' when the never-reduced tensors are, per dtype, exactly the last ones of that dtype
    in add order (a partial buffer left behind); '' otherwise."""
    by_dtype: dict[str, list[int]] = {}
    for i, g in enumerate(got):
        by_dtype.setdefault(str(g.dtype), []).append(i)
    mine = {dtype: [i for i in wrong if i in set(indices)] for dtype, indices in by_dtype.items()}
    if any(mine[d] != indices[len(indices) - len(mine[d]):] for d, indices in by_dtype.items()):
        return ""
    return " and ".join(f"{len(tail)} {dtype}" for dtype, tail in mine.items() if tail)


def human(nbytes: float) -> str:
    return f"{nbytes / 1024:.1f} KiB" if nbytes >= 1024 else f"{int(nbytes)} B"


Buffers = list[list[list[tuple[str, int]]]]  # per rank, per step: (dtype, bytes) of each Allreduce


def agent_sizes(task: Any, rank: int) -> list[list[int]]:
    """Per "step" phase of the rank, the bytes of each Allreduce (or Iallreduce) as its agent traced it. A phase
    ends at the next "step" mark or the task's end: a mark of another name (the learner's) cuts nothing."""
    steps: list[list[int]] = []
    for span in task.timeline().events(rank):
        if span.kind == "mark" and span.name == "step":
            steps.append([])
        elif steps and span.kind in ("coll", "icoll") and span.name == "Allreduce":
            steps[-1].append(int(span.nbytes))
    return steps


def own_marks_note(task: Any, rank: int) -> str:
    """A note naming the marks the rank set besides the harness's (its learner's code's), or ''."""
    own = sorted({name for name, _ in task.timeline().marks(rank) if name not in MARKS + MEMORY_MARKS})
    if not own:
        return ""
    return (f": your own mark(s) {', '.join(map(repr, own[:3]))} do not end the harness's \"step\" phase; every "
            "collective from one \"step\" mark to the next counts")


def buffers_seen(result: CaseRun) -> Buffers:
    """Every Allreduce of every step of every rank as (dtype, bytes), the bytes as the agent traced them. The
    dtype is the harness's note (RecordingComm's) where its notes of the step agree with the agent's sizes and
    put each dtype's bytes of the step in buffers of that dtype; else (the comm under the harness's was called,
    or the notes rewritten) it is inferred from the size: the dtype of all of whose bytes it is, else the most
    lenient one."""
    case, by_dtype = result.case, result.case.nbytes_by_dtype()
    out: Buffers = []
    for rank, value in enumerate(result.values):
        noted = value.allreduces if isinstance(getattr(value, "allreduces", None), list) else []
        steps = []
        for s, sizes in enumerate(agent_sizes(result.task, rank)):
            calls = noted[s] if s < len(noted) and isinstance(noted[s], list) else []
            if notes_agree(calls, sizes, by_dtype):
                steps.append([(str(d), int(n)) for d, n in calls])
            else:
                steps.append([(inferred_dtype(case, n), n) for n in sizes])
        out.append(steps)
    return out


def notes_agree(calls: list, sizes: list[int], by_dtype: dict[str, int]) -> bool:
    if not all(isinstance(c, tuple) and len(c) == 2 and isinstance(c[0], str) and c[0] in by_dtype and is_int(c[1])
               for c in calls):  # a list as the dtype's name once crashed the membership test
        return False
    if [int(n) for _, n in calls] != sizes or any(n % np.dtype(d).itemsize for d, n in calls):
        return False
    return all(sum(n for dd, n in calls if dd == d) == b for d, b in by_dtype.items())


def inferred_dtype(case: Case, nbytes: int) -> str:
    by_dtype = case.nbytes_by_dtype()
    whole = [d for d, b in by_dtype.items() if b == nbytes]
    fits = [d for d, b in by_dtype.items() if nbytes % np.dtype(d).itemsize == 0] or list(by_dtype)
    return whole[0] if whole else max(fits, key=lambda d: case.largest(d))


def unnoted_buffer(results: list[CaseRun]) -> str | None:
    """A buffer past threshold + its largest tensor that the harness's RecordingComm did not note as the agent
    traced it (the fusion reduced through the comm under it, or the notes were rewritten), as a message, or
    None."""
    for result in results:
        case, by_dtype = result.case, result.case.nbytes_by_dtype()
        for rank, value in enumerate(result.values):
            noted = value.allreduces if isinstance(getattr(value, "allreduces", None), list) else []
            for s, sizes in enumerate(agent_sizes(result.task, rank)):
                calls = noted[s] if s < len(noted) and isinstance(noted[s], list) else []
                if notes_agree(calls, sizes, by_dtype):
                    continue
                for nbytes in sizes:
                    dtype = inferred_dtype(case, nbytes)
                    if nbytes <= (limit := case.threshold + case.largest(dtype)):
                        continue
                    return (f"{case.label()}, step {s}: rank {rank} reduced a buffer of {nbytes} bytes in one "
                            f"Allreduce (as its agent traced it), past threshold + its largest tensor = {limit} "
                            f"bytes, which the harness's RecordingComm never noted (it noted {len(calls)} of the "
                            f"step's {len(sizes)} Allreduces): reduce through the comm Fusion is given, and "
                            "send a buffer as soon as it holds threshold_bytes")
    return None


def recorded(result: Any) -> Buffers:
    """The harness's own notes (RecordingComm), as ``buffers_seen`` reads them: the unit tests' fake runs."""
    return [value.allreduces for value in result.values]


def too_big_buffer(results: list[CaseRun], seen: Callable[[Any], Buffers] = recorded) -> str | None:
    """A buffer past threshold + its largest tensor, as a message, or None: of all such buffers, the first whose
    cause the evidence names alone (why_too_big), else the first. ``seen``: each result's buffers (the check
    passes ``buffers_seen``, the agents' record)."""
    found = []
    for result in results:
        case, by_dtype = result.case, result.case.nbytes_by_dtype()
        for rank, steps in enumerate(seen(result)):
            for s, calls in enumerate(steps):
                for dtype, nbytes in calls:
                    limit = case.threshold + case.largest(dtype) if dtype in by_dtype else 0
                    if nbytes > limit:
                        why, sure = why_too_big(case, dtype, [n for d, n in calls if d == dtype])
                        found.append((not sure, f"{case.label()}, step {s}: rank {rank} reduced a {dtype} buffer of "
                                      f"{nbytes} bytes in one Allreduce; a buffer may hold at most threshold + its "
                                      f"largest tensor = {limit} bytes: {why}"))
    return min(found, key=lambda f: f[0])[1] if found else None  # min: the first of the sure ones, if any


def why_too_big(case: Case, dtype: str, sizes: list[int]) -> tuple[str, bool]:
    """Why a step's buffers of ``dtype`` (their sizes, in order) went past threshold + its largest tensor, and
    whether the evidence rules out the other cause: one buffer of every byte only if counting elements would
    have cut it, buffers of itemsize x threshold (+ a tensor) only if they are not that one buffer."""
    total, threshold = case.nbytes_by_dtype().get(dtype, 0), case.threshold
    big, item = (case.largest(dtype), np.dtype(dtype).itemsize) if total else (0, 1)
    whole = (f"one buffer of all {total} {dtype} bytes of the step: the threshold was ignored until flush(); send a "
             "buffer as soon as it holds threshold_bytes")
    elements = (f"buffers of {item} x the threshold: is the threshold compared with a number of elements "
                "instead of bytes?")
    counted = item > 1 and all(item * threshold <= n <= item * threshold + big for n in sizes[:-1]) \
        and sizes[-1] <= item * threshold + big
    if sizes == [total] and total:
        return (whole, True) if not counted else (f"{whole}; or {elements}", False)
    if counted:
        return elements, True
    return "the buffer grew past the threshold before it was sent", False


# -- memory: what the learner's process holds while add() runs, read by its agent ----------------------

MEMORY_MARKS = ("fuse", "added")  # per step, after "step": the step's tensors made; every one added
# The allowance beyond the budget: pages, the interpreter's own objects and the heap's (measured: well
# under a MiB); a fusion that copies early holds the memory case's whole step, 12-16 MiB.
HELD_SLACK = 4 << 20
# What an array of the harness's holds besides its data: the object, its name and its place in a dict or
# list (measured: 265 B a gradient tensor); the memory case has some 20,000 of them.
ARRAY_BYTES = 320
COPIED_EARLY = "are tensors copied long before their buffer is due?"


def budget(case: Case) -> int:
    """What a fusion may hold while add() runs: a buffer per dtype of at most threshold + its largest tensor
    (never more than the dtype's bytes), and a receive copy of the largest."""
    buffers = [min(b, case.threshold + case.largest(d)) for d, b in case.nbytes_by_dtype().items()]
    return sum(buffers) + max(buffers)


def harness_bytes(case: Case) -> int:
    """What the harness's program holds at its first mark "step": the rank's batches and the parameters."""
    shapes = model.step_shapes(case.spec)
    params = [n for name, (_, n) in shapes.items() if name.split("[")[0] in ("emb", "wide", "proj", "bias")]
    return case.steps * model.BATCH * (len(case.spec.vocab) + 1) * 8 + sum(params) + len(params) * ARRAY_BYTES


def gradients_bytes(case: Case) -> int:
    """What the harness's program makes from a step's "step" to its "fuse": the step's gradient tensors."""
    return sum(case.nbytes_by_dtype().values()) + case.tensors * ARRAY_BYTES


def memory_problem(results: list[CaseRun]) -> str | None:
    """The first case, step and rank whose learner process held past its budget while add() ran (or held
    more than the harness's arrays when it began), as its agent read it from /proc, or None."""
    for result in results:
        case, task = result.case, result.task
        want = ["step", *MEMORY_MARKS] * case.steps
        for rank in range(case.p):
            held = task.memory(rank)
            got = [name for name, _, _ in held.marks if name in want]
            if got != want:
                return (f"{case.label()}: rank {rank} set the marks {', '.join(map(repr, got))} where the program "
                        f"sets {', '.join(map(repr, want))}: the memory check reads at the program's marks")
            for step in range(case.steps):
                largest = largest_while_adding(task, rank, step)
                if problem := held_problem(case, rank, held, step, largest):
                    return problem
    return None


def largest_while_adding(task: Any, rank: int, step: int) -> int:
    """The rank's largest collective from the step's mark "fuse" to "added", as its agent traced it."""
    largest, adding, seen = 0, False, -1
    for span in task.timeline().events(rank):
        if span.kind == "mark" and span.name in MEMORY_MARKS:
            seen += span.name == "fuse"
            adding = span.name == "fuse" and seen == step
        elif adding and span.kind in ("coll", "icoll"):
            largest = max(largest, int(span.nbytes))
    return largest


def held_problem(case: Case, rank: int, held: Any, step: int = 0, largest_buffer: int = 0) -> str | None:
    """None if, while the step's tensors were added, rank ``rank``'s fusion held at most one buffer per dtype
    (the budget) beyond what its process held at "fuse", and the process held no more than the harness's
    arrays before (``held``: grading's HeldMemory, read by the rank's agent from /proc): at the case's first
    "step" beyond what it held before the learner's file was imported, at "fuse" beyond the step's gradients
    made since "step". ``largest_buffer``: the rank's largest collective of the step, as its agent traced
    it; past threshold + the largest tensor, it is named as the cause."""
    # The most held from "fuse" to "added", as the agent sampled it: not only at "added", where the
    # learner's code, which sets the mark, could drop its copies for the moment of the reading.
    added = held.peak_to("added", step) - held.at("fuse", step)
    start = held.at("step") - held.before_solution - harness_bytes(case) if held.before_solution >= 0 else 0
    made = held.at("fuse", step) - held.at("step", step) - gradients_bytes(case)
    early, allowed = max(start if step == 0 else 0, made), budget(case)
    where = f"{case.label()}, step {step}: rank {rank}'s process"
    if added + max(early, 0) <= allowed + HELD_SLACK:
        return None
    if early > HELD_SLACK:
        return (f"{where} already held {mib(early)} more when the step's first tensor was about to be added than "
                f"the harness's arrays and the interpreter account for, then up to {mib(added)} more while add() "
                f"ran, against one buffer per dtype, {mib(allowed)}: memory kept from the import of your file or "
                "an earlier case counts (a module-level array, or a large library such as torch: the check cannot "
                "tell them apart)")
    head = (f"{where} held up to {mib(added)} more while add() ran than before the step's first add() (read "
            f"from /proc by its agent), against one buffer per dtype of threshold + its largest tensor and one "
            f"receive copy, {mib(allowed)}")
    if largest_buffer > case.threshold + case.largest():
        return f"{head}: its buffers reached {mib(largest_buffer)}, past threshold + the largest tensor"
    return f"{head}: {COPIED_EARLY}"


def mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"
