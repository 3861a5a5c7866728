"""Where a training step's time goes: forward, backward, optimizer step, and the rest.

On a GPU, CUDA events around each phase (recorded without a host sync, read once after the
last step), so the split is the device's timeline, idle gaps included; on a CPU, the host
clock. The report carries it beside samples/s: a run slower than its peer shows which phase
holds the difference (a per-parameter sync in the optimizer step, a CPU-bound forward...).
"""

from __future__ import annotations

import time

PHASES = ("forward", "backward", "optimizer")
MAX_STEPS = 64  # enough for a stable mean; bounds the events kept on the device
MAX_STEP_MARKS = 100_000  # per-step times: a long run's first 100k steps (a few MB)


def _now(on_gpu: bool):
    """A point on the device's timeline (a recorded CUDA event: no host sync), else the
    host clock."""
    if on_gpu:
        import torch  # torch: only once a run starts

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _seconds(a, b) -> float:
    return a.elapsed_time(b) / 1000 if hasattr(a, "elapsed_time") else b - a


class StepTimes:
    """Every optimizer step's duration, for samples/s per step in the report's plot: one
    mark at each step boundary (a CUDA event on a GPU, read once after the last step)."""

    def __init__(self, on_gpu: bool):
        self.on_gpu = on_gpu
        self.marks: list = []

    def mark(self) -> None:
        if len(self.marks) <= MAX_STEP_MARKS:
            self.marks.append(_now(self.on_gpu))

    def seconds(self) -> list[float]:
        """Seconds of each step marked (call after a sync)."""
        return [round(_seconds(a, b), 6) for a, b in zip(self.marks, self.marks[1:],
                                                          strict=False)]


class PhaseClock:
    def __init__(self, on_gpu: bool):
        self.on_gpu = on_gpu
        self.marks: list[list] = []  # per micro-step: 4 marks (before forward .. after step)
        self._current: list | None = None

    def _now(self):
        return _now(self.on_gpu)

    def mark(self, index: int, timed: bool) -> None:
        """Boundary ``index`` (0: before forward, 1: after forward, 2: after backward,
        3: after step) of this micro-step; only timed steps, at most MAX_STEPS."""
        if not timed or len(self.marks) >= MAX_STEPS and index == 0:
            self._current = None
            return
        if index == 0:
            self._current = []
            self.marks.append(self._current)
        if self._current is not None:
            self._current.append(self._now())

    def summary(self, micro_steps_per_step: int) -> dict:
        """Mean milliseconds per optimizer step of each phase, the step's wall time (from one
        micro-step's start to the next's) and ``other_ms``: wall minus the phases (data
        loading and copies, logging, waits). Call after a sync."""
        done = [m for m in self.marks if len(m) == 4]
        if not done:
            return {"source": "not measured (no timed steps)"}
        def span(a, b):  # milliseconds
            return 1000 * _seconds(a, b)

        walls = [span(a[0], b[0]) for a, b in zip(done, done[1:], strict=False)]
        # the phases are averaged over the micro-steps that have a wall (all but the last),
        # so wall - phases is taken over the same steps and never goes below zero: a slow
        # last micro-step once made the phases exceed the wall (0.012 vs 0.009 ms)
        timed = done[:-1] if walls else done
        spans = [[span(m[i], m[i + 1]) for i in range(3)] for m in timed]
        per_micro = [sum(s[i] for s in spans) / len(spans) for i in range(3)]
        out = {"source": "CUDA events" if self.on_gpu else "host clock",
               "micro_steps": len(done)}
        for name, ms in zip(PHASES, per_micro, strict=True):
            out[f"{name}_ms"] = round(ms * micro_steps_per_step, 3)
        if walls:
            wall = sum(walls) / len(walls)
            out["wall_ms"] = round(wall * micro_steps_per_step, 3)
            out["other_ms"] = round((wall - sum(per_micro)) * micro_steps_per_step, 3)
        return out
