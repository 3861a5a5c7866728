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


class PhaseClock:
    def __init__(self, on_gpu: bool):
        self.on_gpu = on_gpu
        self.marks: list[list] = []  # per micro-step: 4 marks (before forward .. after step)
        self._current: list | None = None

    def _now(self):
        if self.on_gpu:
            import torch  # torch: only once a run starts

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

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
        if self.on_gpu:
            def span(a, b):
                return a.elapsed_time(b)
        else:
            def span(a, b):
                return 1000 * (b - a)
        spans = [[span(m[i], m[i + 1]) for i in range(3)] for m in done]
        per_micro = [sum(s[i] for s in spans) / len(spans) for i in range(3)]
        walls = [span(a[0], b[0]) for a, b in zip(done, done[1:], strict=False)]
        out = {"source": "CUDA events" if self.on_gpu else "host clock",
               "micro_steps": len(done)}
        for name, ms in zip(PHASES, per_micro, strict=True):
            out[f"{name}_ms"] = round(ms * micro_steps_per_step, 3)
        if walls:
            wall = sum(walls) / len(walls)
            out["wall_ms"] = round(wall * micro_steps_per_step, 3)
            out["other_ms"] = round((wall - sum(per_micro)) * micro_steps_per_step, 3)
        return out
