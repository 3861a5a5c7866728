"""The node a probe looks at: its environment variables, filesystem root, commands, memo.

Facts know nothing of the doctor: a :class:`Node` carries what probes need (where the
filesystem is, which variables are set, which Python environment the job runs, what the job
will look like) and no command-line options. The doctor's Context is a Node with options.

The Python environment under test is the job's, not dsenv's own: ``environment`` names it (a
prefix or an interpreter), else it is resolved from the activated environment
(:mod:`dsenv.facts.python.target_env`); ``python_prefix`` pins it to a prefix.

Probes that read /sys, /proc or /dev go through :meth:`Node.path`, so tests point them at a
recorded tree; commands go through :meth:`Node.run`, which always has a timeout. Probes shared
by several callers (nvidia-smi, ompi_info, ...) run once per Node, even when two threads ask
for them at the same moment; :meth:`Node.start` begins a slow one in the background so that
it overlaps the probes its askers wait on first. Each probe's start and duration are kept
(:meth:`Node.probe_times`) for reports that show where the time went.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import wraps
from pathlib import Path
from typing import TypeVar

from dsenv import proc
from dsenv.facts.host import mounts

T = TypeVar("T")

TARGETS = ("login", "compute", "auto")
DEFAULT_PROBE_TIMEOUT = 10.0


@dataclass(frozen=True)
class JobShape:
    """What the job will look like, as far as the caller knows it (None: not said)."""

    launcher: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    deepspeed_config: Path | None = None
    workload: str | None = None


@dataclass
class Node:
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    root: Path = Path("/")
    # The environment under test as a prefix (tests, and callers that know it); None: from
    # ``environment``, else what the job would run (dsenv/facts/python/target_env.py).
    python_prefix: Path | None = None
    environment: str | None = None  # a prefix or interpreter the job runs in (--env)
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    job: JobShape = field(default_factory=JobShape)
    # Probes that take seconds (asking DeepSpeed's op builders or torch itself, which import
    # torch) run only when True; otherwise they answer from a cache, say "not asked", or ask
    # something cheaper (the CUDA driver instead of torch: dsenv/facts/python/torch_info.py).
    thorough: bool = False
    wanted_target: str = "auto"  # login, compute, or auto: decided from the node
    target: str = ""  # resolved from wanted_target
    target_reason: str = ""

    def __post_init__(self):
        self.root = Path(self.root)
        self._memo: dict[str, Future] = {}
        self._memo_lock = threading.Lock()
        self._born = time.monotonic()
        self._times: dict[str, tuple[float, float]] = {}  # key -> (started, seconds)
        if not self.target:
            self.target, self.target_reason = resolve_target(self)

    # -- the machine, seen through the root and the environment --------------------------
    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def which(self, name: str) -> str | None:
        return proc.which(name, self.env, self.searchable_path())

    def run(self, argv, timeout: float | None = None) -> proc.CommandResult:
        path = None if os.sep in str(argv[0]) else self.searchable_path()
        return proc.run(argv, timeout or self.probe_timeout, env=self.env, path=path)

    def searchable_path(self) -> str:
        """PATH without the folders whose files gave no answer to a stat in a child
        (:func:`unanswered_folders`): a command is looked up in this process, and a stat on a
        file server that stopped answering blocks it in the kernel, where no deadline reaches."""
        unanswered = set(unanswered_folders(self, "PATH"))
        return os.pathsep.join(f for f in _search_path(self, "PATH") if f not in unanswered)

    def library_path(self) -> list[str]:
        """LD_LIBRARY_PATH's folders, without those whose files gave no answer to a stat in a
        child (:func:`unanswered_folders`): libraries there are statted and read here."""
        unanswered = set(unanswered_folders(self, "LD_LIBRARY_PATH"))
        return [f for f in _search_path(self, "LD_LIBRARY_PATH") if f and f not in unanswered]

    @property
    def is_compute(self) -> bool:
        return self.target == "compute"

    # -- probes: one run per node, shared between threads -------------------------------
    def memo(self, key: str, compute: Callable[[], T]) -> T:
        with self._memo_lock:
            future = self._memo.get(key)
            owner = future is None
            if owner:
                future = self._memo[key] = Future()
        if owner:
            start = time.monotonic()
            try:
                future.set_result(compute())
            except BaseException as exc:  # handed to every waiter, raised in each
                future.set_exception(exc)
            finally:
                self._times[key] = (start - self._born, time.monotonic() - start)
        return future.result()

    def start(self, probe_func: Callable[[Node], object]) -> None:
        """Begin ``probe_func(self)`` in a daemon thread unless it has begun; whoever asks
        later waits for that one run (and gets its answer, or its exception, there)."""
        key = getattr(probe_func, "memo_key", None)
        with self._memo_lock:
            if key is None or key in self._memo:
                return

        def ask() -> None:
            try:
                probe_func(self)
            except BaseException:  # kept in the memo: raised in whoever asks for it
                pass

        threading.Thread(target=ask, daemon=True, name=f"start {key}").start()

    def pending_probes(self) -> list[str]:
        """The keys of the probes that began and have not answered yet (a hung one)."""
        with self._memo_lock:
            return sorted(k for k, f in self._memo.items() if not f.done())

    def probe_times(self) -> list[tuple[str, float, float]]:
        """(probe key, started s after the node was made, seconds) of every probe run."""
        return sorted(((k, *v) for k, v in list(self._times.items())), key=lambda t: t[1])


SEARCH_PATHS = ("PATH", "LD_LIBRARY_PATH")  # where this process looks commands and libraries up


def _search_path(node: Node, variable: str) -> list[str]:
    default = os.defpath if variable == "PATH" else ""
    return node.env.get(variable, default).split(os.pathsep)


def unanswered_folders(node: Node, variable: str) -> tuple[str, ...]:
    """The folders of a search path (PATH, LD_LIBRARY_PATH) on a mount that can hang (network,
    FUSE, autofs) whose entries gave no answer to a stat in a child (mounts.files_answer:
    /apps/cuda/bin on an NFS server or a Lustre storage target that went down). Both paths'
    folders are walked at once, once per node: each that hangs costs the probe deadline."""

    def find() -> dict[str, bool]:
        folders = [f for f in dict.fromkeys(f for var in SEARCH_PATHS
                                            for f in _search_path(node, var))
                   if f and mounts.may_hang(node, f)]
        return mounts.walk_folders(node, folders, 1)

    answered = node.memo(f"{__name__}.unanswered_folders", find)
    return tuple(f for f in dict.fromkeys(_search_path(node, variable))
                 if not answered.get(f, True))


def probe(func: Callable[[Node], T]) -> Callable[[Node], T]:
    """Decorate ``func(node)`` so it runs once per node, whoever asks first."""
    key = f"{func.__module__}.{func.__qualname__}"

    @wraps(func)
    def cached(node: Node) -> T:
        return node.memo(key, lambda: func(node))

    cached.memo_key = key  # tests seed a probe's answer: node.memo(probe.memo_key, ...)
    return cached


def resolve_target(node: Node) -> tuple[str, str]:
    chosen = node.wanted_target
    if chosen in ("login", "compute"):
        return chosen, "--target " + chosen
    if node.env.get("SLURM_JOB_ID"):
        return "compute", f"inside Slurm allocation {node.env['SLURM_JOB_ID']}"
    gpu_nodes = sorted(p.name for p in node.path("/dev").glob("nvidia[0-9]*"))
    if gpu_nodes:
        return "compute", "GPU device nodes visible: " + ", ".join(gpu_nodes)
    if node.path("/dev/kfd").exists():
        return "compute", "AMD GPU device node /dev/kfd visible"
    return "login", "no Slurm allocation and no GPU device nodes"
