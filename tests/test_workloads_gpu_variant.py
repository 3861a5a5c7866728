"""A preset's GPU configuration (presets.toml [NAME.gpu]), dsenv's own gradient clipping
between backward and step, and the per-phase split of a step in the report.

The GPU variant's reason is measured on a real GPU (bench/data/h200-2026-11-26-engine-split.json,
recorded on one NVIDIA H200 with bench/gpu_engine_split.py); here: which configuration is
chosen, and that clipping outside the engine trains exactly as DeepSpeed's own does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dsenv.workloads.training import dsconfig
from dsenv.workloads.training.phases import PhaseClock

ROOT = Path(__file__).resolve().parents[1]


def build(preset, on_gpu, user=None, tmp_path=None):
    path = None
    if user is not None:
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(user))
    return dsconfig.build_config(preset, 1, on_gpu=on_gpu, default_micro_batch=8,
                                 default_lr=1e-4, user_config=path)


def test_bf16_on_a_gpu_runs_torch_autocast_with_dsenv_clipping():
    planned = build("bf16", on_gpu=True)
    assert planned.variant == "gpu"
    assert planned.config["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"}
    assert "bf16" not in planned.config
    assert planned.config["timers"] == {"throughput": {"enabled": False}}
    assert planned.config["gradient_clipping"] == 0.0
    assert planned.outside_clipping == 1.0
    assert "H200" in planned.variant_source
    assert planned.summary()["outside_clipping"] == 1.0


def test_bf16_on_the_cpu_keeps_the_default_config():
    planned = build("bf16", on_gpu=False)
    assert planned.variant == "default"
    assert planned.config["bf16"] == {"enabled": True}
    assert planned.config["gradient_clipping"] == 1.0
    assert planned.outside_clipping == 0.0


def test_fp16_on_a_gpu_turns_timers_off_and_keeps_deepspeeds_clipping():
    planned = build("fp16", on_gpu=True)
    assert planned.variant == "gpu"
    assert planned.config["timers"] == {"throughput": {"enabled": False}}
    assert planned.config["gradient_clipping"] == 1.0  # loss-scaled: DeepSpeed unscales first
    assert planned.outside_clipping == 0.0


def test_a_user_config_with_its_own_precision_keeps_the_default_variant(tmp_path):
    planned = build("bf16", on_gpu=True, user={"bf16": {"enabled": True}}, tmp_path=tmp_path)
    assert planned.variant == "default"
    assert "torch_autocast" not in planned.config
    assert planned.outside_clipping == 0.0


def test_a_deepspeed_without_torch_autocast_keeps_the_default_variant(monkeypatch):
    """Asked of the installed package's files: a DeepSpeed without runtime/torch_autocast.py
    (older releases) runs the preset's default config."""
    monkeypatch.setattr(dsconfig, "_deepspeed_has", lambda relative: False)
    planned = build("bf16", on_gpu=True)
    assert planned.variant == "default"
    assert planned.config["bf16"] == {"enabled": True}


def test_the_installed_deepspeed_is_asked_for_the_file():
    assert dsconfig._deepspeed_has("runtime/torch_autocast.py")
    assert not dsconfig._deepspeed_has("runtime/no_such_file.py")


@pytest.mark.parametrize("config, expected", [
    ({"gradient_clipping": 1.0, "zero_optimization": {"stage": 0}}, 1.0),
    ({"gradient_clipping": 0.5, "torch_autocast": {"enabled": True, "dtype": "bfloat16"}}, 0.5),
    ({"gradient_clipping": 1.0, "zero_optimization": {"stage": 2}}, 0.0),  # partitioned grads
    ({"gradient_clipping": 1.0, "fp16": {"enabled": True}}, 0.0),  # loss-scaled grads
    ({"gradient_clipping": 1.0, "torch_autocast": {"enabled": True, "dtype": "float16"}}, 0.0),
    ({"gradient_clipping": 0.0}, 0.0),
])
def test_outside_clipping_only_where_gradients_are_whole_and_unscaled(config, expected):
    assert dsconfig.outside_clipping(config) == expected


def test_without_gradient_sync_turns_outside_clipping_off():
    planned = build("bf16", on_gpu=True)
    assert dsconfig.without_gradient_sync(planned).outside_clipping == 0.0


def test_phase_clock_splits_timed_steps_only():
    clock = PhaseClock(on_gpu=False)
    assert clock.summary(1) == {"source": "not measured (no timed steps)"}
    for step in range(4):
        for index in range(4):
            clock.mark(index, timed=step >= 2)
    split = clock.summary(2)
    assert split["micro_steps"] == 2 and split["source"] == "host clock"
    assert {"forward_ms", "backward_ms", "optimizer_ms", "wall_ms", "other_ms"} <= set(split)
    # the phases lie within the step's wall time; each of the four figures is rounded to a
    # microsecond, so on these microsecond-long steps the sum may pass the wall by 2 us
    # (a fresh-clone CI run saw 0.004 vs 0.001 + 0.001 + 0.003)
    phases = split["forward_ms"] + split["backward_ms"] + split["optimizer_ms"]
    assert split["wall_ms"] + 0.002 >= phases


def test_phase_split_takes_phases_and_wall_over_the_same_micro_steps():
    # a slow last micro-step (preempted, a checkpoint) has no wall of its own (there is no
    # next start): its phases must not enter the means the wall is compared with, or the
    # phases pass the wall and "other" goes negative (a fresh-clone CI run: 0.012 > 0.009)
    clock = PhaseClock(on_gpu=False)
    clock.marks = [[0.000, 0.001, 0.002, 0.003], [0.004, 0.005, 0.006, 0.007],
                   [0.008, 0.020, 0.030, 0.040]]
    split = clock.summary(1)
    assert (split["forward_ms"], split["backward_ms"], split["optimizer_ms"]) == (1.0, 1.0, 1.0)
    assert split["wall_ms"] == 4.0 and split["other_ms"] == 1.0
    # one micro-step only: no wall, and the phases are that step's
    clock.marks = [[0.0, 0.002, 0.005, 0.006]]
    alone = clock.summary(1)
    assert (alone["forward_ms"], alone["backward_ms"], alone["optimizer_ms"]) == (2.0, 3.0, 1.0)
    assert "wall_ms" not in alone and "other_ms" not in alone


CLIP_RUN = textwrap.dedent("""
    import json, os, sys, torch, deepspeed
    from dsenv.workloads.training import engine
    from dsenv.workloads.training import runtime
    outside = float(sys.argv[1]); inside = float(sys.argv[2])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    class Out:
        def __init__(self, loss): self.loss = loss
    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__(); self.m = m
        def forward(self, x, y):
            return Out(((self.m(x) - y) ** 2).mean() * 1000)  # big gradients: clipping bites
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "train_batch_size": 4, "steps_per_print": 10**6, "gradient_clipping": inside,
              "zero_optimization": {"stage": 0},
              "optimizer": {"type": "SGD", "params": {"lr": 0.01}}}
    rt = runtime.start(quiet=True)
    engine.init_distributed(rt, config)
    ds = engine.initialize(Wrap(model), config)
    g = torch.Generator().manual_seed(1)
    def batches():
        while True:
            yield {"x": torch.randn(4, 8, generator=g), "y": torch.randn(4, 1, generator=g)}
    stats = engine.train(ds, rt, batches(), 3, 1, clip_norm=outside)
    print("@@" + json.dumps([p.detach().flatten().tolist() for p in model.parameters()]))
""")


def _weights(outside, inside, tmp_path):
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "WORLD_SIZE": "1", "RANK": "0",
           "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561"}
    done = subprocess.run([sys.executable, "-c", CLIP_RUN, str(outside), str(inside)],
                          capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("@@")][-1]
    return json.loads(line[2:])


@pytest.mark.slow
def test_clipping_outside_the_engine_trains_as_deepspeeds_own(tmp_path):
    """Same seeds: DeepSpeed clipping at 1.0 and dsenv's clipping at 1.0 end in the same
    weights; no clipping at all ends elsewhere (the clipping did bite)."""
    deepspeed_clips = _weights(0.0, 1.0, tmp_path)
    dsenv_clips = _weights(1.0, 0.0, tmp_path)
    unclipped = _weights(0.0, 0.0, tmp_path)
    flat = [v for layer in deepspeed_clips for v in layer]
    assert flat == pytest.approx([v for layer in dsenv_clips for v in layer], rel=1e-5,
                                 abs=1e-6)
    assert flat != pytest.approx([v for layer in unclipped for v in layer], rel=1e-3)
