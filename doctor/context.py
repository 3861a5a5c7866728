"""What every check sees: a Node (dsenv.facts.node) plus the doctor's command-line options."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dsenv.facts.node import DEFAULT_PROBE_TIMEOUT, JobShape, Node

TARGETS = ("login", "compute", "auto")


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
class Context(Node):
    """The node as the doctor sees it: its facts follow the options (--env, --nodes, ...)."""

    options: Options = field(default_factory=Options)

    def __post_init__(self):
        o = self.options
        self.environment = o.environment
        self.probe_timeout = o.probe_timeout
        self.wanted_target = o.target
        self.thorough = o.verbose
        self.job = JobShape(launcher=o.launcher, nodes=o.nodes, gpus_per_node=o.gpus_per_node,
                            deepspeed_config=o.deepspeed_config, workload=o.workload)
        super().__post_init__()
