"""envs/training_stack.toml's DeepSpeed section: the ops a first run JIT-compiles and how
long each first build takes (the one home of those times)."""

from __future__ import annotations

from dataclasses import dataclass

from dsenv.data import load_table


@dataclass(frozen=True)
class JitBuild:
    op: str
    accelerator: str  # the DeepSpeed accelerator the time was measured with
    seconds: int
    source: str


def _deepspeed(table: dict | None = None) -> dict:
    return (table or load_table("dsenv.envs", "training_stack.toml"))["deepspeed"]


def jit_builds(table: dict | None = None) -> dict[str, JitBuild]:
    """op -> its measured first JIT build (``table``: a parsed training_stack.toml, for
    tests; default the shipped one)."""
    return {row["op"]: JitBuild(**row) for row in _deepspeed(table)["jit_build"]}


def jit_seconds(op: str) -> int | None:
    """The measured first-build time of ``op`` (with whichever accelerator), None if never
    measured."""
    build = jit_builds().get(op)
    return build.seconds if build else None


def first_run_ops(accelerator: str) -> list[tuple[str, int | None]]:
    """(op, seconds) a first run on ``accelerator`` JIT-compiles; seconds only when the time
    was measured with that accelerator."""
    builds = jit_builds()
    out = []
    for row in _deepspeed()["first_run_ops"]:
        if row["accelerator"] != accelerator:
            continue
        build = builds.get(row["op"])
        out.append((row["op"], build.seconds if build and build.accelerator == accelerator
                    else None))
    return out
