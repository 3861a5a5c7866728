"""Where DeepSpeed's engine spends a step that a plain PyTorch loop does not.

One process, one GPU, one model shape (BERT-base QA: 12 x 768, seq 384, micro-batch 32 by
default): a plain loop (what a user writes without DeepSpeed) against DeepSpeed engine
configurations, each timed after warm-up, then the same steps split into forward / backward
/ step by CUDA events and by host time, and a short torch.profiler table of the slowest
kernels. Prints one JSON line per result (``SPLIT {...}``) and writes ``--out FILE``.

    python bench/gpu_engine_split.py --out split.json          # on a GPU node
    python bench/gpu_engine_split.py --cpu-tiny --out s.json   # syntax check on a CPU

A variant that raises is recorded with its error and the rest go on.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=384)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--only", default="", help="comma-separated variant names")
    p.add_argument("--cpu-tiny", action="store_true")
    return p.parse_args()


ARGS = parse()
if ARGS.cpu_tiny:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")

import torch  # noqa: E402
from transformers import BertConfig, BertForQuestionAnswering  # noqa: E402

GPU = torch.cuda.is_available() and not ARGS.cpu_tiny
DEV = torch.device("cuda" if GPU else "cpu")
B, L = (4, 32) if ARGS.cpu_tiny else (ARGS.batch, ARGS.seq)
STEPS, WARM = (3, 1) if ARGS.cpu_tiny else (ARGS.steps, ARGS.warm)
CFG = (BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=128, vocab_size=2000) if ARGS.cpu_tiny else BertConfig())
RESULTS: dict = {"device": torch.cuda.get_device_name() if GPU else "cpu",
                 "torch": torch.__version__, "batch": B, "seq": L, "steps": STEPS}


def save() -> None:
    with open(ARGS.out + ".tmp", "w") as f:
        json.dump(RESULTS, f, indent=1)
    os.replace(ARGS.out + ".tmp", ARGS.out)


def sync() -> None:
    if GPU:
        torch.cuda.synchronize()


torch.manual_seed(0)
IDS = torch.randint(5, CFG.vocab_size, (B, L), device=DEV)
BATCH = {"input_ids": IDS, "attention_mask": torch.ones_like(IDS),
         "start_positions": torch.randint(0, L, (B,), device=DEV),
         "end_positions": torch.randint(0, L, (B,), device=DEV)}
AUTOCAST = torch.autocast(DEV.type, dtype=torch.bfloat16)


def model():
    torch.manual_seed(0)
    return BertForQuestionAnswering(CFG)


class Plain:
    """What a user writes without DeepSpeed: autocast bf16, fused AdamW, clipping."""

    def __init__(self, bf16_weights=False):
        self.m = model().to(DEV)
        if bf16_weights:
            self.m = self.m.to(torch.bfloat16)
        self.bf16_weights = bf16_weights
        self.opt = torch.optim.AdamW(self.m.parameters(), lr=3e-5, weight_decay=0.01,
                                     fused=GPU)

    def forward(self):
        if self.bf16_weights:
            return self.m(**BATCH).loss
        with torch.autocast(DEV.type, dtype=torch.bfloat16):
            return self.m(**BATCH).loss

    def backward(self, loss):
        loss.backward()

    def step(self):
        torch.nn.utils.clip_grad_norm_(self.m.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class Engine:
    def __init__(self, config, client_opt=False, allreduce=False, module_forward=False):
        import deepspeed

        m = model()
        base = {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1,
                "train_batch_size": B, "steps_per_print": 10**6}
        cfg = {**base, **config}
        opt = None
        if client_opt:
            cfg.pop("optimizer", None)
            opt = torch.optim.AdamW(m.parameters(), lr=3e-5, weight_decay=0.01, fused=GPU)
        self.e, self.o, *_ = deepspeed.initialize(model=m, model_parameters=m.parameters(),
                                                  config=cfg, optimizer=opt)
        if not allreduce and self.e.zero_optimization_stage() == 0:
            self.e.enable_backward_allreduce = False  # what dsenv does for one rank at stage 0
        self.module_forward = module_forward

    def forward(self):
        if self.module_forward:
            with AUTOCAST:
                return self.e.module(**BATCH).loss
        return self.e(**BATCH).loss

    def backward(self, loss):
        self.e.backward(loss)

    def step(self):
        self.e.step()


ADAM = {"optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "weight_decay": 0.01}}}
OFF = {"timers": {"throughput": {"enabled": False}}}
CLIP = {"gradient_clipping": 1.0}
AUTOCAST_CFG = {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}}
VARIANTS = {
    "plain_autocast": lambda: Plain(),
    "plain_bf16_weights": lambda: Plain(bf16_weights=True),
    # dsenv's bf16 preset as of 2026-11: bf16 + ZeRO 0 + clipping (+ allreduce off for 1 rank)
    "ds_bf16_preset": lambda: Engine({**ADAM, **CLIP, "bf16": {"enabled": True},
                                      "zero_optimization": {"stage": 0}}),
    "ds_bf16_timers_off": lambda: Engine({**ADAM, **CLIP, **OFF, "bf16": {"enabled": True},
                                          "zero_optimization": {"stage": 0}}),
    "ds_autocast_z0": lambda: Engine({**ADAM, **CLIP, **OFF, **AUTOCAST_CFG,
                                      "zero_optimization": {"stage": 0}}),
    "ds_autocast_z0_timers_on": lambda: Engine({**ADAM, **CLIP, **AUTOCAST_CFG,
                                                "zero_optimization": {"stage": 0}}),
    "ds_autocast_z0_allreduce": lambda: Engine({**ADAM, **CLIP, **OFF, **AUTOCAST_CFG,
                                                "zero_optimization": {"stage": 0}},
                                               allreduce=True),
    "ds_autocast_z0_noclip": lambda: Engine({**ADAM, **OFF, **AUTOCAST_CFG,
                                             "gradient_clipping": 0.0,
                                             "zero_optimization": {"stage": 0}}),
    "ds_autocast_z0_torch_adamw": lambda: Engine({**CLIP, **OFF, **AUTOCAST_CFG,
                                                  "zero_optimization": {"stage": 0}},
                                                 client_opt=True),
    "ds_autocast_z0_module_forward": lambda: Engine({**ADAM, **CLIP, **OFF, **AUTOCAST_CFG,
                                                     "zero_optimization": {"stage": 0}},
                                                    module_forward=True),
    "ds_bf16_z1_noovf": lambda: Engine({**ADAM, **CLIP, **OFF,
                                        "bf16": {"enabled": True, "check_grad_overflow": False},
                                        "zero_optimization": {"stage": 1}}),
    "ds_fp16_z0": lambda: Engine({**ADAM, **CLIP, **OFF,
                                  "fp16": {"enabled": True, "loss_scale": 0,
                                           "initial_scale_power": 16},
                                  "zero_optimization": {"stage": 0}}),
}


def one_step(v):
    loss = v.forward()
    v.backward(loss)
    v.step()


def throughput(v) -> float:
    for _ in range(WARM):
        one_step(v)
    sync()
    t = time.perf_counter()
    for _ in range(STEPS):
        one_step(v)
    sync()
    return B * STEPS / (time.perf_counter() - t)


def split(v, n=8) -> dict:
    """Per phase: GPU time (CUDA events, synchronised) and host time without a sync."""
    out = {}
    if GPU:
        ev = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(n)]
        for i in range(n):
            ev[i][0].record()
            loss = v.forward()
            ev[i][1].record()
            v.backward(loss)
            ev[i][2].record()
            v.step()
            ev[i][3].record()
        sync()
        for k, name in enumerate(("forward", "backward", "step")):
            out[f"gpu_ms_{name}"] = round(sum(e[k].elapsed_time(e[k + 1]) for e in ev) / n, 2)
    host = {"forward": 0.0, "backward": 0.0, "step": 0.0}
    sync()
    for _ in range(n):
        t0 = time.perf_counter()
        loss = v.forward()
        t1 = time.perf_counter()
        v.backward(loss)
        t2 = time.perf_counter()
        v.step()
        t3 = time.perf_counter()
        host["forward"] += t1 - t0
        host["backward"] += t2 - t1
        host["step"] += t3 - t2
    sync()
    for name, secs in host.items():
        out[f"host_ms_{name}"] = round(1000 * secs / n, 2)
    return out


def profile(v, n=4) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if GPU else [])
    sync()
    t = time.perf_counter()
    with prof(activities=acts) as p:
        for _ in range(n):
            one_step(v)
        sync()
    wall = (time.perf_counter() - t) / n
    key = "self_device_time_total" if GPU else "self_cpu_time_total"
    rows = []
    for e in sorted(p.key_averages(), key=lambda e: -getattr(e, key, 0))[:15]:
        rows.append({"name": e.key[:90], "calls_per_step": e.count / n,
                     "self_ms_per_step": round(getattr(e, key, 0) / 1000 / n, 3),
                     "cpu_ms_per_step": round(e.cpu_time_total / 1000 / n, 3)})
    busy = sum(getattr(e, key, 0) for e in p.key_averages()) / 1000 / n
    syncs = [e for e in p.key_averages()
             if any(s in e.key for s in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                         "aten::item", "aten::_local_scalar_dense",
                                         "cudaMemcpy", "cudaEventSynchronize"))]
    return {"wall_ms_per_step": round(1000 * wall, 2), "busy_ms_per_step": round(busy, 2),
            "top": rows,
            "syncs": [{"name": e.key, "calls_per_step": e.count / n,
                       "cpu_ms_per_step": round(e.cpu_time_total / 1000 / n, 3)} for e in syncs]}


def main() -> None:
    import deepspeed

    RESULTS["deepspeed"] = deepspeed.__version__
    deepspeed.init_distributed(dist_backend="nccl" if GPU else "gloo")
    names = [n for n in VARIANTS if not ARGS.only or n in ARGS.only.split(",")]
    if not GPU:
        names = [n for n in names if "fp16" not in n]
    for name in names:
        started = time.perf_counter()
        try:
            v = VARIANTS[name]()
            entry = {"samples_per_s": round(throughput(v), 1)}
            if isinstance(v, Engine):
                entry["optimizer"] = type(v.o).__name__
            entry.update(split(v))
            if name in ("plain_autocast", "ds_autocast_z0", "ds_bf16_preset"):
                entry["profile"] = profile(v)
            del v
        except Exception as exc:  # recorded, the next variant goes on
            entry = {"error": f"{type(exc).__name__}: {exc}"[:400],
                     "where": traceback.format_exc().splitlines()[-3:]}
        entry["seconds"] = round(time.perf_counter() - started, 1)
        plain = (RESULTS.get("plain_autocast") or {}).get("samples_per_s")
        if plain and "samples_per_s" in entry:
            entry["ratio_to_plain_autocast"] = round(entry["samples_per_s"] / plain, 3)
        RESULTS[name] = entry
        print("SPLIT", json.dumps({name: {k: v for k, v in entry.items() if k != "profile"}}),
              flush=True)
        save()
        if GPU:
            torch.cuda.empty_cache()


main()
