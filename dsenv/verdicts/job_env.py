"""What the job's environment lacks of what a job imports: one verdict for `dsenv doctor
--for WORKLOAD` (python.workload-packages) and for `dsenv smoke|run`, which refuses in one
line to start a workload in an environment that cannot import it."""

from __future__ import annotations

import re
from importlib import metadata

from dsenv.facts.node import Node
from dsenv.facts.python import target_env


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(node: Node) -> dict[str, str]:
    """{canonical distribution name: version} importable in the job's environment (its import
    path as its interpreter reports it; the first of each name wins, as for imports)."""
    found: dict[str, str] = {}
    for dist in metadata.distributions(path=list(target_env.search_path(node))):
        name = dist.metadata["Name"]
        if name and canonical(name) not in found:
            found[canonical(name)] = dist.version
    return found


def missing_imports(node: Node, wanted: tuple[str, ...] | list[str]) -> list[str]:
    """The distributions of ``wanted`` the job's environment does not have, in order."""
    have = installed(node)
    return [name for name in wanted if canonical(name) not in have]
