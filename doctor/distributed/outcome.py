"""What a run of ``dsenv doctor --distributed`` found, as typed records: the :class:`Outcome`
that a rank's run (:mod:`.rank`), a preflight or the ``--launch`` parent (:mod:`.launch`)
hands to the report (:mod:`.report`), and its parts. Pure data: no torch, no I/O.

An outcome crosses processes as JSON (a rank's marked line for the ``--launch`` parent) and
ends as the report's ``distributed`` section (doctor/report_schema.json): :meth:`to_json` is
the only place that writes it and :meth:`from_json` the only place that reads it back.
Where the section has no key (a preflight has no ``warmup``; a row is not timed yet), the
field is ``None`` and the key is left out; each field's comment says when. Two parts stay
JSON objects: a rank's record (:class:`RankRecord`, a TypedDict: it travels between ranks
through the job's store, and a preflight's record is only the :class:`RankIdentity`), and rank
0's comparison of the environments (:func:`.fingerprint.compare`'s, read only there).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypedDict


def _optional(**kwargs) -> Any:
    """A field whose JSON key exists only while it is not None."""
    return field(default=None, metadata={"omit_none": True}, **kwargs)


def _json(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


class _Record:
    """``to_json``: every field in order, less the optional ones that are None."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: _json(getattr(self, f.name)) for f in fields(self)
                if f.metadata.get("json", True)
                and not (f.metadata.get("omit_none") and getattr(self, f.name) is None)}


# -- what each rank reports about itself -----------------------------------------------------
class Fingerprint(TypedDict):
    """A rank's environment in its record (:mod:`.fingerprint`)."""

    digest: str  # 16 hex digits of the facts every rank of a host should share
    per_rank: dict[str, str]  # the facts of this rank only (GPU visibility variables)


class RankIdentity(TypedDict):
    """Who a rank is: the whole record of a run stopped at its preflight."""

    rank: int
    local_rank: int
    world_size: int  # the world this rank was told it is part of
    local_size: int | None  # ranks on its host, when the launcher says
    launcher: str  # deepspeed | torchrun | env | mpirun | srun | none
    host: str  # socket.gethostname()
    pid: int


class RankRecord(RankIdentity, total=False):
    """What a rank reports about itself (:func:`.record.local_record`); rank 0 reads every
    rank's from the store. JSON as it is: tests and the report read it key by key."""

    visible: str  # the *_VISIBLE_DEVICES setting as "NAME=value", "" when none is set
    device: str  # "cuda:0", "cpu"
    device_name: str | None  # the GPU's model
    device_uuid: str | None  # the GPU's UUID (torch's spelling)
    device_bus_id: str | None  # the GPU's PCI address, "0000:94:00.0"
    device_numa: int | None  # the GPU's NUMA node
    numa: list[int]  # the NUMA nodes of the rank's CPU affinity
    interface: str  # the interface its sockets use towards MASTER_ADDR (and what chose it)
    address: str | None  # its local address on that interface
    fingerprint: Fingerprint
    arrived_epoch: float  # wall clock when it posted this record at the rendezvous
    phases: dict[str, float]  # rank 0 adds each rank's seconds per phase (RANK_PHASES)


# Each rank's own seconds per phase, gathered by rank 0 with the bandwidth times (.allreduce).
RANK_PHASES = ("rendezvous_s", "init_s", "check_s", "bandwidth_s")


# -- how a run ended -------------------------------------------------------------------------
@dataclass
class Culprit(_Record):
    """A rank blamed for a run that did not finish (:func:`.ranks.diagnose`)."""

    rank: int
    host: str | None  # None: it never reported and no launcher layout names its host
    state: str  # exited (its connection closed), absent (never arrived), stuck (behind)
    step: str | None  # the step it last entered; None: it never arrived
    detail: str  # the sentence that names it in the report

    @classmethod
    def from_json(cls, data: dict) -> Culprit:
        return cls(**data)


@dataclass
class Failure(_Record):
    """Why the run did not pass."""

    # a rank's run: timeout, exited, rank0-exited, terminated, error, aborted, store;
    # a preflight: singletons, world-size, launch-env; --launch: launch (no rank reported)
    kind: str
    message: str  # the verdict, one line
    step: str | None  # the step the run stopped in ("start": before the rendezvous)
    culprits: list[Culprit] = field(default_factory=list)  # most certain first
    evidence: list[str] | None = _optional()  # more lines (preflight, --launch); None: no key

    @classmethod
    def from_json(cls, data: dict) -> Failure:
        return cls(data["kind"], data["message"], data.get("step"),
                   [Culprit.from_json(c) for c in data.get("culprits") or []],
                   data.get("evidence"))


# -- what the ranks measured -------------------------------------------------------------------
@dataclass
class WrongElement(_Record):
    """The first element of an all-reduce that differs from the exact sum."""

    index: int
    got: float
    expected: float


@dataclass
class AllreduceRow(_Record):
    """One size of the all-reduce sweep (:mod:`.allreduce`), as nccl-tests prints a row."""

    bytes: int  # the buffer's size
    count: int  # its float32 elements
    type: str = "float"
    redop: str = "sum"
    wrong: int = 0  # elements that differ from the exact sum
    first_wrong: WrongElement | None = _optional()  # None (no key) when none is wrong
    time_us: float | None = _optional()  # per all-reduce, averaged over the ranks; the three
    algbw_gbps: float | None = _optional()  # timings are None (no keys) until the ranks'
    busbw_gbps: float | None = _optional()  # times are gathered; busbw = algbw x 2(n-1)/n

    @classmethod
    def from_json(cls, data: dict) -> AllreduceRow:
        wrong = data.get("first_wrong")
        return cls(**{**data, "first_wrong": WrongElement(**wrong) if wrong else None})


@dataclass
class Timing(_Record):
    """Seconds each phase took on the rank that wrote the outcome; None (no key): not run."""

    rendezvous_s: float | None = _optional()  # store, records, rank 0's go
    init_s: float | None = _optional()  # init_process_group
    check_s: float | None = _optional()  # the exact all-reduce checks
    bandwidth_s: float | None = _optional()  # the timed all-reduces
    pairs_s: float | None = _optional()  # the host pairs


@dataclass
class PairRow(_Record):
    """One host pair's bandwidth (:mod:`.pairs`)."""

    hosts: list[str | None]  # the pair's two hosts
    ranks: list[int]  # the rank that timed each end
    bytes: int  # the buffer exchanged both ways at once
    time_us: float  # the fastest exchange
    busbw_gbps: float  # bytes / time

    @classmethod
    def from_json(cls, data: dict) -> PairRow:
        return cls(**data)


@dataclass
class PairPlan(_Record):
    """The host pairs to time (rank 0's choice, :func:`.pairs.plan_pairs`) and their rows."""

    selection: str | None = _optional()  # what was chosen and why; None (no key) on a peer,
    pairs: list[list[int]] = field(default_factory=list)  # which knows only [a, b, round]s
    rows: list[PairRow] | None = _optional()  # rank 0's timings; None (no key): not timed

    @classmethod
    def from_json(cls, data: dict) -> PairPlan:
        rows = data.get("rows")
        return cls(data.get("selection"), data.get("pairs") or [],
                   None if rows is None else [PairRow.from_json(r) for r in rows])


@dataclass
class Launched(_Record):
    """``--launch``: the launcher command the parent ran and how it ended."""

    launcher: str  # mpirun | torchrun
    nprocs: int
    command: str  # the argv, joined by spaces
    returncode: int | None
    timed_out: bool
    seconds: float


# -- the whole outcome -------------------------------------------------------------------------
@dataclass(kw_only=True)
class Outcome(_Record):
    """What one process of ``dsenv doctor --distributed`` hands to the report (the fields in
    the order of the JSON section)."""

    rank: int = 0  # the rank that wrote it (0 unless rank 0 never reported)
    launcher: str | None  # deepspeed | torchrun | env | mpirun | srun | none; None: unknown
    backend: str | None = None  # nccl | gloo; None: no rank got that far
    world_size: int | None  # the ranks in the world; None: discovery failed
    master: str | None = None  # MASTER_ADDR:MASTER_PORT; None: no rendezvous was tried
    timeout_s: float  # what the whole run may take
    seconds: float = 0.0  # what it took, up to this outcome
    warmup: int | None = None  # untimed all-reduces per size (a rank's run only)
    iters: int | None = None  # timed all-reduces per size (a rank's run only)
    ranks: list[RankRecord] = field(default_factory=list)  # the records known, by rank (a
    # preflight's: its RankIdentity)
    allreduce: list[AllreduceRow] = field(default_factory=list)  # one row per size
    timing: Timing = field(default_factory=Timing)
    failure: Failure | None = None  # None: nothing failed
    environment: dict | None = None  # rank 0's fingerprint comparison (a rank's run only)
    pairs: PairPlan | None = None  # the host pairs (a rank's run only); None: not reached
    preflight: str | None = _optional()  # singletons | world-size | launch-env | alone, set
    # when the run stopped before the ranks talked; None (no key): it did not
    fault_injected: str | None = None  # the test hook DSENV_DISTRIBUTED_TEST_FAULT's fault
    launched: Launched | None = _optional()  # --launch: the parent's command; None: no key
    expect_busbw_gbps: float | None = None  # the bandwidth expected, and where that comes
    expect_source: str | None = _optional()  # from: rank 0's report sets both (no keys before)
    # Written by a rank's run (RankRun), not a preflight nor the --launch parent's own word:
    # only then does the JSON have warmup, iters, environment and pairs, null or not.
    from_run: bool = field(default=False, metadata={"json": False})

    _RUN_ONLY = ("warmup", "iters", "environment", "pairs")

    def to_json(self) -> dict[str, Any]:
        """The report's ``distributed`` section; a rank's marked line."""
        data = super().to_json()
        if not self.from_run:
            for name in self._RUN_ONLY:
                del data[name]
        if self.expect_source is None:
            del data["expect_busbw_gbps"]
        return data

    @classmethod
    def from_json(cls, data: dict) -> Outcome:
        """An outcome a rank wrote (:meth:`to_json`), read back."""
        failure, pairs, launched = data.get("failure"), data.get("pairs"), data.get("launched")
        return cls(
            rank=data.get("rank", 0), launcher=data.get("launcher"), backend=data.get("backend"),
            world_size=data.get("world_size"), master=data.get("master"),
            timeout_s=data["timeout_s"], seconds=data.get("seconds", 0.0),
            warmup=data.get("warmup"), iters=data.get("iters"), ranks=data.get("ranks") or [],
            allreduce=[AllreduceRow.from_json(r) for r in data.get("allreduce") or []],
            timing=Timing(**(data.get("timing") or {})),
            failure=Failure.from_json(failure) if failure else None,
            environment=data.get("environment"),
            pairs=PairPlan.from_json(pairs) if pairs is not None else None,
            preflight=data.get("preflight"), fault_injected=data.get("fault_injected"),
            launched=Launched(**launched) if launched else None,
            expect_busbw_gbps=data.get("expect_busbw_gbps"),
            expect_source=data.get("expect_source"),
            from_run=any(name in data for name in cls._RUN_ONLY))

    def hosts(self) -> set[str | None]:
        """The hosts of the ranks that reported."""
        return {r.get("host") for r in self.ranks}
