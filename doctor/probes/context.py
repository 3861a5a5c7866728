"""What every check sees: the options, the environment, the filesystem root, shared probes.

The Python environment under test is the job's, not dsenv's own: ``--env`` names it (a
prefix or an interpreter), else it is resolved from the activated environment
(:mod:`.target_env`); ``python_prefix`` pins it to a prefix.

Checks that read /sys, /proc or /dev go through :meth:`Context.path`, so tests point them
at a recorded tree; commands go through :meth:`Context.run`, which always has a timeout.
Probes shared by several checks (nvidia-smi, ompi_info, ...) run once per doctor run, even
when two checks ask for them at the same moment from different threads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import wraps
from pathlib import Path
from typing import TypeVar

from dsenv import proc

T = TypeVar("T")

TARGETS = ("login", "compute", "auto")
DEFAULT_PROBE_TIMEOUT = 10.0


@dataclass
class Options:
    target: str = "auto"
    launcher: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    deepspeed_config: Path | None = None
    workload: str | None = None
    verbose: bool = False
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    probe: bool = False  # launch real ranks where a check can (mpi.launch-probe)
    environment: str | None = None  # --env PREFIX|PYTHON: the environment the job runs in


@dataclass
class Context:
    options: Options = field(default_factory=Options)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    root: Path = Path("/")
    # The environment under test as a prefix (tests, and callers that know it); None: from
    # options.environment, else what the job would run (doctor/probes/target_env.py).
    python_prefix: Path | None = None
    target: str = ""  # resolved from options.target ("auto" decided here)
    target_reason: str = ""

    def __post_init__(self):
        self.root = Path(self.root)
        self._memo: dict[str, Future] = {}
        self._memo_lock = threading.Lock()
        if not self.target:
            self.target, self.target_reason = resolve_target(self)

    # -- the machine, seen through the root and the environment --------------------------
    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def which(self, name: str) -> str | None:
        return proc.which(name, self.env)

    def run(self, argv, timeout: float | None = None) -> proc.CommandResult:
        return proc.run(argv, timeout or self.options.probe_timeout, env=self.env)

    @property
    def is_compute(self) -> bool:
        return self.target == "compute"

    # -- probes: one run per doctor run, shared between threads -------------------------
    def memo(self, key: str, compute: Callable[[], T]) -> T:
        with self._memo_lock:
            future = self._memo.get(key)
            owner = future is None
            if owner:
                future = self._memo[key] = Future()
        if owner:
            try:
                future.set_result(compute())
            except BaseException as exc:  # handed to every waiter, raised in each
                future.set_exception(exc)
        return future.result()


def probe(func: Callable[[Context], T]) -> Callable[[Context], T]:
    """Decorate ``func(ctx)`` so it runs once per context, whoever asks first."""
    key = f"{func.__module__}.{func.__qualname__}"

    @wraps(func)
    def cached(ctx: Context) -> T:
        return ctx.memo(key, lambda: func(ctx))

    cached.memo_key = key  # tests seed a probe's answer: ctx.memo(probe.memo_key, ...)
    return cached


def resolve_target(ctx: Context) -> tuple[str, str]:
    chosen = ctx.options.target
    if chosen in ("login", "compute"):
        return chosen, "--target " + chosen
    if ctx.env.get("SLURM_JOB_ID"):
        return "compute", f"inside Slurm allocation {ctx.env['SLURM_JOB_ID']}"
    gpu_nodes = sorted(p.name for p in ctx.path("/dev").glob("nvidia[0-9]*"))
    if gpu_nodes:
        return "compute", "GPU device nodes visible: " + ", ".join(gpu_nodes)
    if ctx.path("/dev/kfd").exists():
        return "compute", "AMD GPU device node /dev/kfd visible"
    return "login", "no Slurm allocation and no GPU device nodes"
