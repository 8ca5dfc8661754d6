"""The cases of problem 15 and the checker's own rules: the lab's devices, the split of a global
batch and its usual misreadings, the placement of layers, and the hidden variants drawn from a
seed. A device is the dict the learner's functions get.

A rank imports this module (the rank program does), so what only the checker may know lives in
judging.py (the card's split and placement, the expected values), and a training case reaches a
rank as its view (Training.for_rank): its own samples, drawn by its agent, and no key of them: with
the case's seed, or any rank's stream key, every rank's samples (and with them the whole global
batch's gradient) would follow, and a key is short enough to smuggle to the other ranks inside a
message of the right size."""

from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import cache

import numpy as np

from distlab.grading import Platform, Widener, resolve

LAB, RATE = "seed-lab", "resnet50_img_per_s"  # the card's platform, and the rate it measured per device
HOST_EXTRA = 0.3  # each layer on the host that the accelerator could run adds 30% to a sample's time
STEPS, LEARNING_RATE = 4, 0.5
IMAGE, VOCAB, TAGS, CLASSES = 16, 40, 4, 4  # a sample: 16 image features, 4 hashtags of 40; 4 classes
OPS = ("embedding_bag", "fft", "unique", "nonzero", "linear", "conv2d", "relu", "layer_norm", "cross_entropy")
HEAD = (("image", "linear"), ("act", "relu"), ("head", "linear"), ("loss", "cross_entropy"))
MODELS = {"tags": (("tags", "embedding_bag"), *HEAD), "spectrum": (("spectrum", "fft"), *HEAD),
          "both": (("tags", "embedding_bag"), ("spectrum", "fft"), *HEAD)}  # (layer name, op), in order


@cache
def lab() -> Platform:
    return resolve(LAB)


def lab_device(name: str, called: str = "") -> dict:
    profile = lab().devices[name].profile
    return {"name": called or name, "profile": profile.name, "samples_per_s": profile.throughput[RATE],
            "flops": profile.flops, "unsupported_ops": sorted(profile.unsupported_ops)}


def by_kind() -> dict[str, list[str]]:
    """The lab's device names by profile."""
    kinds: dict[str, list[str]] = {}
    for name, device in lab().devices.items():
        kinds.setdefault(device.profile.name, []).append(name)
    return kinds


@dataclass(frozen=True)
class Job:
    """A global batch over a mix of devices: rank r runs on devices[r]."""

    devices: tuple[dict, ...]
    global_batch: int

    @property
    def p(self) -> int:
        return len(self.devices)

    def shares(self, by: str = "samples_per_s") -> list[Fraction]:
        """Each rank's exact share of the global batch, in proportion to ``by``."""
        speeds = [Fraction(d[by]) for d in self.devices]
        return [self.global_batch * s / sum(speeds) for s in speeds]

    def platform(self) -> Platform:
        """The lab's nodes, links and profiles, with the job's ranks on its devices."""
        whole = lab()
        return Platform(f"{LAB}-job", whole.description, whole.profiles, list(whole.nodes.values()),
                        list(whole.links.values()), [d["name"] for d in self.devices], whole.source)

    def label(self) -> str:
        kinds = ", ".join(d["profile"] for d in self.devices)
        return f"B = {self.global_batch} over {self.p} ranks ({kinds})"


def largest_remainder(shares: list[Fraction]) -> list[int]:
    """Every share rounded down, then one more each for the largest fractional parts."""
    split = [int(s) for s in shares]
    left = round(sum(shares)) - sum(split)
    for r in sorted(range(len(shares)), key=lambda r: split[r] - shares[r])[:left]:
        split[r] += 1
    return split


def equal_split(job: Job) -> list[int]:
    return [job.global_batch // job.p + (r < job.global_batch % job.p) for r in range(job.p)]


def split_faults(job: Job, split: list[int]) -> list[str]:
    """How ``split`` breaks the card's rule: the sum, then each rank against its share."""
    faults, total = [], sum(split)
    if total != job.global_batch:
        faults.append(f"the split sums to {total}, not {job.global_batch}: {abs(total - job.global_batch)} "
                      f"sample(s) {'added' if total > job.global_batch else 'lost'} every step")
    for r, (b, share) in enumerate(zip(split, job.shares())):
        if abs(b - share) >= 1:
            d = job.devices[r]
            faults.append(f"rank {r} ({d['name']}, {d['profile']}: {d['samples_per_s']:g} samples/s) gets {b}, "
                          f"but its share is {float(share):.2f} (within 1)")
    return faults


# The split's usual misreadings: each one's own answer (to draw a table that tells them apart) and
# what any answer of it looks like (to name it when every answer of the learner's table does).
MISREADINGS = {
    "equal": (equal_split,  # B // p each, the remainder anywhere (or dropped)
              lambda job, b: min(b) >= job.global_batch // job.p >= max(b) - job.global_batch % job.p),
    "flops": (lambda job: largest_remainder(job.shares("flops")),
              lambda job, b: sum(b) == job.global_batch
              and all(abs(x - s) < 1 for x, s in zip(b, job.shares("flops")))),
    "floor": (lambda job: [int(s) for s in job.shares()], lambda job, b: b == [int(s) for s in job.shares()]),
    "round": (lambda job: [round(s) for s in job.shares()],  # to even, or half up
              lambda job, b: b in ([round(s) for s in job.shares()], [int(s + Fraction(1, 2)) for s in job.shares()])),
}


def misreading(table: list[Job], answers: list[list[int] | None]) -> str | None:
    """The one misreading that every well-formed answer of the table fits, if exactly one does."""
    pairs = [(job, b) for job, b in zip(table, answers) if b is not None]
    fitting = [name for name, (_, fits) in MISREADINGS.items() if pairs and all(fits(job, b) for job, b in pairs)]
    return fitting[0] if len(fitting) == 1 else None


def tells_apart(table: list[Job]) -> bool:
    """Each misreading's own answers break the rule somewhere and are named as that misreading."""
    return all(misreading(table, [answer(j) for j in table]) == name
               and any(split_faults(j, answer(j)) for j in table) for name, (answer, _) in MISREADINGS.items())


def idle_share(job: Job, split: list[int], slowdown: list[float] | None = None) -> float:
    """Sum over ranks of (slowest - own compute time), over p times the slowest's."""
    slowdown = slowdown or [1.0] * job.p
    times = [b * slow / d["samples_per_s"] for b, slow, d in zip(split, slowdown, job.devices)]
    return 1 - sum(times) / (len(times) * max(times)) if max(times) > 0 else 0.0


def needless_host(layers: tuple, device: dict, placement: dict | None) -> list[str]:
    """The layers placed on the host although the device runs their op."""
    on_host = [name for name, where in (placement or {}).items() if where == "host"]
    return [name for name, op in layers if name in on_host and op not in device["unsupported_ops"]]


@dataclass(frozen=True)
class PlaceCase:
    layers: tuple[tuple[str, str], ...]
    device: dict

    def label(self) -> str:
        lacking, layers = ", ".join(self.device["unsupported_ops"]), ", ".join(f"{n} ({op})" for n, op in self.layers)
        return f"{self.device['name']}, {self.device['profile']} lacking [{lacking}], layers [{layers}]"


@dataclass(frozen=True)
class Table:
    """split_batch on jobs and place on layer lists: pure calls, on rank 0."""

    jobs: tuple[Job, ...]
    places: tuple[PlaceCase, ...]


@dataclass(frozen=True, eq=False)
class Own:
    """A rank's part of a training, drawn by its agent from the case's seed: the rank, the key every
    rank shares (the model's start, the labels' teacher), and for each of the STEPS steps the first
    ``rows`` samples of the rank's own stream (image, tags, and the noise of their labels), as the
    stream's generators drew them. ``rows`` is twice the global batch: no split the program trains
    on gives a rank more (a larger sum is not trained). No key of the stream is kept, nor any other
    rank's samples."""

    rank: int
    shared_key: int
    steps: tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]

    @property
    def rows(self) -> int:
        return len(self.steps[0][0]) if self.steps else 0

    def drawn(self, step: int, rank: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The first ``count`` samples of ``rank``'s stream at ``step``, as draw_stream gives them."""
        if rank != self.rank:
            raise ValueError(f"rank {self.rank}'s view of the training holds no samples of rank {rank}")
        if not (0 <= step < len(self.steps) and 0 <= count <= self.rows):
            raise ValueError(f"rank {self.rank}'s view of the training holds the first {self.rows} samples of "
                             f"steps 0 to {len(self.steps) - 1}; asked for {count} of step {step}")
        return tuple(a[:count].copy() for a in self.steps[step])

    def __repr__(self) -> str:
        return f"Own(rank={self.rank}, shared_key={self.shared_key}, {len(self.steps)} steps of {self.rows} samples)"


@dataclass(frozen=True)
class Training:
    """A job trained on a model; given_split: one step with this split (grades sync_gradients alone).

    Each rank draws its samples from a stream of its own (rank r's batch of b samples is the first
    b of its stream at that step), and the global batch is the ranks' batches together. The
    checker holds the seed, and with it every rank's stream; a rank holds its view (for_rank):
    the key the ranks share (the model's start, the labels' teacher) and its own samples, drawn,
    no key of them and none of another rank's."""

    job: Job
    arch: str
    seed: int  # the checker's; -1 in a rank's view, which holds its own samples instead
    given_split: tuple[int, ...] | None = None
    own: Own | None = field(default=None, compare=False)  # a rank's view: its own samples

    @property
    def layers(self) -> tuple[tuple[str, str], ...]:
        return MODELS[self.arch]

    def label(self) -> str:
        return f"{self.arch} model, {self.job.label()}"

    @property
    def shared_key(self) -> int:
        """The key of what every rank shares: the model's first weights, the labels' teacher."""
        return self.own.shared_key if self.own is not None else data_keys(self.seed, 0)[0]

    def samples(self, step: int, rank: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rank ``rank``'s first ``count`` samples of a step: image, tags, label. The checker draws
        them from the seed; a rank's view reads them from what its agent drew (its own only)."""
        if self.own is not None:
            image, tags, noise = self.own.drawn(step, rank, count)
        else:
            image, tags, noise = draw_stream(data_keys(self.seed, rank)[1], step, count)
        return image, tags, labels(self.shared_key, image, tags, noise)

    def for_rank(self, rank: int) -> "Training":
        """What rank ``rank``'s process is handed: its own samples of every step, drawn here (by its
        agent), and no key of them (with the keys, one process could compute the global batch's
        gradient alone, and a key fits in any message)."""
        key, rows = data_keys(self.seed, rank)[1], 2 * self.job.global_batch
        steps = tuple(draw_stream(key, step, rows) for step in range(STEPS))
        # Of the checker's split, its own batch only (-1 for the others'): the whole of it is the
        # answer split_batch is graded on, which a rank's code could keep for the training.
        given = None if self.given_split is None else tuple(b if r == rank else -1 for r, b in enumerate(self.given_split))
        return replace(self, seed=-1, own=Own(rank, self.shared_key, steps), given_split=given)


def draw_stream(key: int, step: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first ``count`` samples of a step of the stream of ``key``: image, tags and the noise of
    their labels, each field from its own generator, so that sample j is the same whatever count is
    (a split that adds samples draws more)."""
    fields = [np.random.default_rng([key, step, i]) for i in range(3)]
    image, tags = fields[0].standard_normal((count, IMAGE)), fields[1].integers(0, VOCAB, (count, TAGS))
    return image, tags, fields[2].standard_normal((count, CLASSES))


def labels(shared: int, image: np.ndarray, tags: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """The samples' labels: the teacher's (drawn from the shared key) class, with noise."""
    teacher = np.random.default_rng([shared, 3])
    w, e = teacher.standard_normal((IMAGE, CLASSES)), teacher.standard_normal((VOCAB, CLASSES))
    return np.argmax(image @ w + e[tags].mean(axis=1) + 0.5 * noise, axis=1)


def data_keys(seed: int, rank: int) -> tuple[int, int]:
    """The shared key and ``rank``'s stream key, both drawn from the case's seed (the checker's
    only: a rank's view keeps the shared key and its samples, drawn from its stream key)."""
    shared = int(np.random.default_rng([seed, 15, 0]).integers(2**62))
    return shared, int(np.random.default_rng([seed, 15, 2, rank]).integers(2**62))


def draw_job(rng: np.random.Generator, p: int, per_rank: tuple[int, int]) -> Job:
    """p of the lab's devices, one of each kind at least, in random rank order; B not divisible by p."""
    names = [str(rng.choice(names)) for names in by_kind().values()]
    rest = [name for name in lab().devices if name not in names]
    names += [str(name) for name in rng.choice(rest, p - len(names), replace=False)]
    names = [names[i] for i in rng.permutation(p)]
    batch = int(rng.integers(per_rank[0] * p, per_rank[1] * p))
    return Job(tuple(lab_device(n) for n in names), batch + (batch % p == 0))


def other_lab(rng: np.random.Generator, p: int) -> Job:
    """Devices of another lab, with speeds of their own: a split wired to 940, 370 and 770 fails."""
    devices = tuple({"name": f"x-gpu{r}", "profile": f"gpu-{'abcde'[r]}", "unsupported_ops": [],
                     "samples_per_s": float(rng.integers(150, 1500)), "flops": float(rng.integers(8, 60)) * 1e12}
                    for r in range(p))
    return Job(devices, int(rng.integers(20, 400)))


def place_cases(rng: np.random.Generator) -> tuple[PlaceCase, ...]:
    """Each model on each of the lab's kinds, then random layers, every other one on a device that
    lacks other ops than the Ascend."""
    kinds = [lab_device(names[0]) for names in by_kind().values()]
    cases = [PlaceCase(layers, device) for layers in MODELS.values() for device in kinds]
    while len(cases) < 16:
        ops = rng.choice(OPS, int(rng.integers(3, 7)), replace=False)
        layers = tuple((f"layer{i}", str(op)) for i, op in enumerate(ops))
        lacks = sorted(str(op) for op in rng.choice(OPS, int(rng.integers(1, 4)), replace=False))
        device = kinds[int(rng.integers(3))] if len(cases) % 2 else \
            {"name": "y-npu0", "profile": "npu-y", "samples_per_s": 500.0, "flops": 20e12, "unsupported_ops": lacks}
        cases.append(PlaceCase(layers, device))
    return tuple(cases)


def hidden(seed: int) -> tuple[Table, tuple[Training, ...]]:
    """Two training jobs (3-4 ranks, then 5-6), and the table of pure calls."""
    rng, widen = np.random.default_rng([seed, 15]), Widener(seed, 15)
    trainings = tuple(Training(draw_job(rng, int(rng.integers(lo, lo + 2)), (100, 200)),
                               str(rng.choice(list(MODELS))), widen(int(rng.integers(1 << 31)))) for lo in (3, 5))
    return Table(split_jobs(rng, [t.job for t in trainings]), place_cases(rng)), trainings


def split_jobs(rng: np.random.Generator, trained: list[Job]) -> tuple[Job, ...]:
    """The training jobs, random ones of the lab (small and large batches), three of another lab;
    drawn again until the table tells the misreadings apart."""
    while True:
        lab_jobs = [draw_job(rng, int(rng.integers(3, 7)), (2, 40) if i % 2 else (40, 200)) for i in range(19)]
        jobs = [*trained, *lab_jobs, *(other_lab(rng, int(rng.integers(2, 6))) for _ in range(3))]
        if tells_apart(jobs):
            return tuple(jobs)


def gradient_case(training: Training) -> Training:
    """The same job, one step with the card's split (the largest remainders of the shares): what
    sync_gradients alone is graded on."""
    return replace(training, given_split=tuple(largest_remainder(training.job.shares())))
