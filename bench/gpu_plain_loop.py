"""Plain PyTorch against DeepSpeed configurations on one bert-base-shaped QA model, in one
process, then a short torch.profiler run of each side: where does the engine's step go?

    python bench/gpu_plain_loop.py --json J [--key loops] [--ds-config-from REPORT ...]
        [--tiny] [--micro-batch 32] [--seq 384] [--warm 5] [--steps 30] [--profile-steps 5]
        [--deadline EPOCH]

Every side trains ``BertForQuestionAnswering(BertConfig())`` (bert-base-uncased's shape, random
weights; ``--tiny``: 2 x 32 for a CPU dry run) on one fixed random micro-batch (sequence
length 384, micro-batch 32), samples/s over ``--steps`` steps after ``--warm`` warm-up steps,
``torch.cuda.synchronize()`` only around the timed block (no ``loss.item()`` per step):

* plain_autocast: ``torch.autocast(bfloat16)`` + ``torch.optim.AdamW(fused=True)`` +
  ``clip_grad_norm_(1.0)``, the loop a user writes without DeepSpeed;
* plain_bf16_weights: the model in bf16, same optimizer and clipping;
* DeepSpeed variants over dsenv's bf16 preset as dsenv builds it (the ``ds_config`` of the full
  run's report.json, else of a smoke's report with the batch sizes replaced, else dsenv's
  presets.toml found in the installed package): the preset itself; timers off;
  ``torch_autocast`` bf16 (ZeRO-0); the same with a client ``torch.optim.AdamW(fused=True)``;
  the same without gradient clipping; bf16 ZeRO-1 without the gradient-overflow check; fp16
  with dynamic loss scaling. ZeRO-0 engines get ``enable_backward_allreduce = False`` at world
  size 1, as dsenv's engine wrapper does.

Per side: samples/s, ms/step, the ratio to plain_autocast, peak GPU memory, the optimizer
classes DeepSpeed chose, host time in forward/backward/step (perf_counter, no sync). Then
plain_autocast, the dsenv preset and the fastest DeepSpeed variant are profiled for
``--profile-steps`` steps (torch.profiler): the top 12 GPU kernels by time, GPU busy time (the
union of kernel and copy intervals) against the step's wall time (how much of the step the GPU
sits idle), the record_function ranges forward/backward/step (host and GPU time), the top host
ops and the synchronising calls. Each side is bounded and any exception is recorded, not raised.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import put  # noqa: E402  (bench/ is not a package)

PHASES = ("forward", "backward", "step")
TIMERS_OFF = {"timers": {"throughput": {"enabled": False}}}


# ----------------------------------------------------------------------------- the preset
def _presets_toml() -> dict | None:
    """dsenv's presets table, wherever the installed package keeps it."""
    from importlib import resources

    import tomllib

    root = Path(str(resources.files("dsenv")))
    for path in sorted(root.rglob("presets.toml")):
        return tomllib.loads(path.read_text())
    return None


def dsenv_bf16_config(reports: list[str], micro_batch: int,
                      on_gpu: bool) -> tuple[dict, str, bool]:
    """dsenv's bf16 preset as dsenv built it for a run, the batch sizes set to ours, and
    whether that run clipped gradients itself (its report's ``outside_clipping``)."""
    config, source, outside = None, None, False
    for report in reports:
        try:
            doc = json.loads(Path(report).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc.get("ds_config"), dict) and (doc.get("batch") or {}).get(
                "preset", "bf16") == "bf16":
            config, source = copy.deepcopy(doc["ds_config"]), f"ds_config of {report}"
            outside = bool((doc.get("batch") or {}).get("outside_clipping"))
            break
    if config is None:
        table = _presets_toml() or {}
        if "bf16" in table:
            config = copy.deepcopy(table["bf16"]["config"])
            config.setdefault("optimizer", {}).setdefault("params", {})["lr"] = 3e-5
            source = "dsenv presets.toml [bf16] (installed package), lr 3e-5"
    if config is None:
        raise RuntimeError("no dsenv bf16 config found (no report, no presets.toml)")
    config["train_micro_batch_size_per_gpu"] = micro_batch
    config["gradient_accumulation_steps"] = 1
    config["train_batch_size"] = micro_batch
    if not on_gpu:  # dsenv does this on CPU too: no fused_adam build there
        config.setdefault("optimizer", {}).setdefault("params", {}).setdefault(
            "torch_adam", True)
    return config, source, outside


def merged(base: dict, *changes: dict, drop: tuple[str, ...] = ()) -> dict:
    config = copy.deepcopy(base)
    for key in drop:
        config.pop(key, None)
    for change in changes:
        for key, value in change.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = merged(config[key], value)
            else:
                config[key] = copy.deepcopy(value)
    return config


def variants(base: dict, dsenv_clips: bool = False) -> dict[str, tuple[dict, bool, bool]]:
    """name -> (config, client fused AdamW?, clip_grad_norm_ between backward and step
    outside the engine, as dsenv's runs do where the preset says ``clip_outside_engine``)"""
    autocast = {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}}
    # DeepSpeed clips (1.0) unless a variant says otherwise: dsenv's own ds_config may carry 0
    auto = merged(base, autocast, TIMERS_OFF, {"gradient_clipping": 1.0}, drop=("bf16", "fp16"))
    no_clip = {"gradient_clipping": 0.0}
    return {
        "dsenv_bf16": (copy.deepcopy(base), False, dsenv_clips),
        "bf16_timers_off": (merged(base, TIMERS_OFF), False, False),
        "autocast_z0_timers_off": (auto, False, False),
        "autocast_client_fused_adamw": (merged(auto, drop=("optimizer",)), True, False),
        "autocast_no_clip": (merged(auto, no_clip), False, False),
        # dsenv's [bf16.gpu] recipe: DeepSpeed's clipping off, torch's clip_grad_norm_ outside
        "autocast_outside_clip": (merged(auto, no_clip), False, True),
        "autocast_client_fused_outside_clip": (
            merged(auto, no_clip, drop=("optimizer",)), True, True),
        "bf16_z1_no_overflow_check": (merged(
            base, {"bf16": {"enabled": True, "check_grad_overflow": False},
                   "zero_optimization": {"stage": 1, "overlap_comm": False}}, TIMERS_OFF),
            False, False),
        "fp16_timers_off": (merged(
            base, {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}},
            TIMERS_OFF, drop=("bf16",)), False, False),
    }


# ----------------------------------------------------------------------------- timing
class HostPhases:
    """Host time per phase (perf_counter, no synchronisation), or profiler ranges."""

    def __init__(self, profiler_ranges: bool = False, prefix: str = ""):
        self.total = dict.fromkeys(PHASES, 0.0)
        self.ranges = profiler_ranges
        self.prefix = prefix

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.ranges:
            from torch.profiler import record_function

            with record_function(f"{self.prefix}.{name}"):
                yield
            return
        started = time.perf_counter()
        yield
        self.total[name] += time.perf_counter() - started


def no_phase(name: str):
    return contextlib.nullcontext()


def sync(on_gpu: bool) -> None:
    if on_gpu:
        import torch

        torch.cuda.synchronize()


def timed(step, a, on_gpu: bool) -> dict:
    for _ in range(a.warm):
        step(no_phase)
    sync(on_gpu)
    started = time.perf_counter()
    for _ in range(a.steps):
        step(no_phase)
    sync(on_gpu)
    seconds = time.perf_counter() - started
    phases = HostPhases()
    for _ in range(a.profile_steps):
        step(phases)
    sync(on_gpu)
    n = max(1, a.profile_steps)
    return {"samples_per_s": round(a.micro_batch * a.steps / seconds, 1),
            "ms_per_step": round(1000 * seconds / a.steps, 2),
            "host_ms_per_phase": {k: round(1000 * v / n, 2) for k, v in phases.total.items()}}


# ----------------------------------------------------------------------------- profiling
def _attr(obj, *names, default=0.0):
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return default


def profile(step, prefix: str, a, on_gpu: bool, ms_per_step: float | None) -> dict:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    for _ in range(2):
        step(no_phase)
    sync(on_gpu)
    n = max(1, a.profile_steps)
    with torch.profiler.profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(n):
            step(HostPhases(profiler_ranges=True, prefix=prefix))
        sync(on_gpu)
        wall = time.perf_counter() - started
    out = {"steps": n, "profiled_wall_ms_per_step": round(1000 * wall / n, 2)}
    kernels, intervals = {}, []
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            start, end = event.time_range.start, event.time_range.end
            row = kernels.setdefault(event.name[:160], [0.0, 0])
            row[0] += end - start
            row[1] += 1
            intervals.append((start, end))
    if intervals:
        intervals.sort()
        busy, (cur_start, cur_end) = 0.0, intervals[0]
        for start, end in intervals[1:]:
            if start > cur_end:
                busy += cur_end - cur_start
                cur_start, cur_end = start, end
            else:
                cur_end = max(cur_end, end)
        busy += cur_end - cur_start
        summed = sum(v[0] for v in kernels.values())
        busy_ms = busy / 1000 / n
        out["gpu_busy_ms_per_step"] = round(busy_ms, 3)
        out["gpu_kernel_sum_ms_per_step"] = round(summed / 1000 / n, 3)
        out["gpu_span_ms_per_step"] = round(
            (intervals[-1][1] - intervals[0][0]) / 1000 / n, 3)
        out["gpu_events_per_step"] = round(len(intervals) / n, 1)
        if ms_per_step:
            out["unprofiled_ms_per_step"] = ms_per_step
            out["gpu_idle_fraction_of_step"] = round(max(0.0, 1 - busy_ms / ms_per_step), 3)
        out["top_gpu_kernels"] = [
            {"name": name, "ms_per_step": round(us / 1000 / n, 3),
             "calls_per_step": round(count / n, 1), "share_of_busy": round(us / busy, 3)}
            for name, (us, count) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:12]]
    averages = prof.key_averages()
    ranges, host_ops, syncing, launches = {}, [], [], 0
    for avg in averages:
        key, count = avg.key, max(1, avg.count)
        if key.startswith(prefix + "."):
            ranges[key] = {
                "calls_per_step": round(avg.count / n, 1),
                "host_ms_per_call": round(_attr(avg, "cpu_time_total") / count / 1000, 3),
                "gpu_ms_per_call": round(
                    _attr(avg, "device_time_total", "cuda_time_total") / count / 1000, 3)}
            continue
        self_cpu = _attr(avg, "self_cpu_time_total")
        host_ops.append((self_cpu, key, avg.count))
        if any(s in key for s in ("Synchronize", "_local_scalar_dense", "cudaMemcpy",
                                  "aten::item", "cudaStreamWaitEvent")):
            syncing.append({"name": key, "calls_per_step": round(avg.count / n, 1),
                            "host_ms_per_step": round(self_cpu / 1000 / n, 3)})
        if key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                   "cuLaunchKernelEx"):
            launches += avg.count
    out["ranges"] = ranges
    out["kernel_launches_per_step"] = round(launches / n, 1)
    out["syncing_calls"] = syncing
    host_ops.sort(reverse=True)
    out["top_host_ops_self"] = [
        {"name": key[:160], "self_host_ms_per_step": round(us / 1000 / n, 3),
         "calls_per_step": round(count / n, 1)} for us, key, count in host_ops[:12]]
    out["host_self_ms_per_step_total"] = round(sum(h[0] for h in host_ops) / 1000 / n, 3)
    return out


# ----------------------------------------------------------------------------- the sides
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_plain_loop.py")
    p.add_argument("--json", required=True)
    p.add_argument("--key", default="loops")
    p.add_argument("--ds-config-from", action="append", default=[], metavar="REPORT")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=384)
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--deadline", type=float, default=0.0)
    p.add_argument("--plain-only", action="store_true",
                   help="only the plain PyTorch sides (a peer figure beside a dsenv run)")
    a = p.parse_args(argv)
    J, K = a.json, a.key

    def out_of_time(reserve: float) -> bool:
        return bool(a.deadline) and time.time() > a.deadline - reserve

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                        ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(name, value)
    import torch
    from transformers import BertConfig, BertForQuestionAnswering
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    on_gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if on_gpu else "cpu")
    B, L = a.micro_batch, a.seq
    cfg = (BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64) if a.tiny else BertConfig())
    put(J, f"{K}.setup", {"device": torch.cuda.get_device_name() if on_gpu else "cpu",
                          "micro_batch": B, "seq": L, "warm": a.warm, "steps": a.steps,
                          "profile_steps": a.profile_steps, "hidden": cfg.hidden_size,
                          "layers": cfg.num_hidden_layers, "torch": torch.__version__})
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 2000, (B, L), generator=gen).to(dev)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "start_positions": torch.randint(0, L, (B,), generator=gen).to(dev),
             "end_positions": torch.randint(0, L, (B,), generator=gen).to(dev)}

    def fresh_model():
        torch.manual_seed(0)
        return BertForQuestionAnswering(cfg)

    def fused_adamw(params):
        try:
            return torch.optim.AdamW(params, lr=3e-5, weight_decay=0.01, fused=True), True
        except (RuntimeError, ValueError):  # no fused AdamW for this device/dtype
            return torch.optim.AdamW(params, lr=3e-5, weight_decay=0.01), False

    def peak_reset():
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()

    def peak_gib():
        return round(torch.cuda.max_memory_allocated() / 2**30, 2) if on_gpu else None

    def release():
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()

    results, profiles = {}, {}
    plain_rate = None

    def record(name: str, row: dict) -> None:
        if plain_rate and row.get("samples_per_s"):
            row["ratio_to_plain_autocast"] = round(row["samples_per_s"] / plain_rate, 3)
        results[name] = row
        put(J, f"{K}.results.{name}", row)
        print(f"[gpu_plain_loop] {name}: {json.dumps(row)}", flush=True)

    def failed(exc: BaseException) -> dict:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}",
                "traceback_tail": traceback.format_exc().strip().splitlines()[-6:]}

    # ---- plain PyTorch
    for name, bf16_weights in (("plain_autocast", False), ("plain_bf16_weights", True)):
        if out_of_time(30):
            record(name, {"skipped": "time budget"})
            continue
        model = opt = None
        try:
            peak_reset()
            model = fresh_model().to(dev)
            if bf16_weights:
                model = model.to(torch.bfloat16)
            opt, fused = fused_adamw(model.parameters())
            use_autocast = not bf16_weights

            def plain_step(phase, model=model, opt=opt, use_autocast=use_autocast):
                with phase("forward"):
                    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_autocast):
                        loss = model(**batch).loss
                with phase("backward"):
                    loss.backward()
                with phase("step"):
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    opt.zero_grad(set_to_none=True)

            row = timed(plain_step, a, on_gpu)
            row.update({"optimizer": f"torch.optim.AdamW(fused={fused})",
                        "peak_gib": peak_gib()})
            if name == "plain_autocast":
                plain_rate = row["samples_per_s"]
            record(name, row)
            if name == "plain_autocast" and not out_of_time(40):
                try:
                    profiles[name] = profile(plain_step, "plain", a, on_gpu, row["ms_per_step"])
                except Exception as exc:  # noqa: BLE001 - recorded, the next side goes on
                    profiles[name] = failed(exc)
                put(J, f"{K}.profiles.{name}", profiles[name])
        except Exception as exc:  # noqa: BLE001
            record(name, failed(exc))
        del model, opt
        release()

    if a.plain_only:
        return 0
    # ---- DeepSpeed
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if arch and any(c.isalpha() for c in arch.replace("PTX", "")):
        # DeepSpeed 0.19.8's JIT builder parses every entry as numbers ("9.0a" raises):
        # the suffix-free list for this process, recorded
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(
            e.rstrip("abf") for e in arch.replace(" ", ";").split(";") if e)
        put(J, f"{K}.arch_list_for_deepspeed", {"given": arch,
                                                 "used": os.environ["TORCH_CUDA_ARCH_LIST"]})
    try:
        import deepspeed
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)
        base, source, dsenv_clips = dsenv_bf16_config(a.ds_config_from, B, on_gpu)
        put(J, f"{K}.dsenv_preset_source", source)
        put(J, f"{K}.dsenv_preset_config", base)
        with contextlib.redirect_stdout(sys.stderr):
            deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo",
                                       auto_mpi_discovery=False)
    except Exception as exc:  # noqa: BLE001
        put(J, f"{K}.deepspeed_error", failed(exc))
        return 1
    table = variants(base, dsenv_clips)
    put(J, f"{K}.variants", {name: {"config": cfg_, "client_fused_adamw": client,
                                    "clip_outside_engine": outside}
                             for name, (cfg_, client, outside) in table.items()})

    def build(name: str):
        config, client, outside_clip = table[name]
        model = fresh_model()
        optimizer = fused_adamw(model.parameters())[0] if client else None
        engine, ds_opt, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), optimizer=optimizer,
            config=copy.deepcopy(config))
        if engine.zero_optimization_stage() == 0:
            engine.enable_backward_allreduce = False  # as dsenv's engine wrapper, world size 1
        engine.train()

        def ds_step(phase, engine=engine):
            with phase("forward"):
                loss = engine(**batch).loss
            with phase("backward"):
                engine.backward(loss)
            with phase("step"):
                if outside_clip:
                    torch.nn.utils.clip_grad_norm_(engine.module.parameters(), 1.0)
                engine.step()

        inner = getattr(ds_opt, "optimizer", None)
        classes = {"optimizer": type(ds_opt).__name__ if ds_opt is not None else None,
                   "inner_optimizer": type(inner).__name__ if inner is not None else None,
                   "basic_optimizer": type(getattr(engine, "basic_optimizer", None)).__name__}
        return engine, ds_opt, model, ds_step, classes

    for name in table:
        if out_of_time(30):
            record(name, {"skipped": "time budget"})
            continue
        engine = ds_opt = model = ds_step = None
        try:
            peak_reset()
            started = time.perf_counter()
            engine, ds_opt, model, ds_step, classes = build(name)
            init_s = round(time.perf_counter() - started, 2)
            row = timed(ds_step, a, on_gpu)
            row.update(classes)
            row.update({"init_s": init_s, "peak_gib": peak_gib(),
                        "zero_stage": engine.zero_optimization_stage(),
                        "skipped_steps": getattr(engine, "skipped_steps", None)})
            scaler = getattr(ds_opt, "cur_scale", None) or getattr(
                getattr(ds_opt, "loss_scaler", None), "cur_scale", None)
            if scaler is not None:
                row["loss_scale"] = float(scaler)
            record(name, row)
            if name == "dsenv_bf16" and not out_of_time(40):
                try:
                    profiles[name] = profile(ds_step, "ds", a, on_gpu, row["ms_per_step"])
                except Exception as exc:  # noqa: BLE001
                    profiles[name] = failed(exc)
                put(J, f"{K}.profiles.{name}", profiles[name])
        except Exception as exc:  # noqa: BLE001
            record(name, failed(exc))
        del engine, ds_opt, model, ds_step
        release()

    rated = {n: r["samples_per_s"] for n, r in results.items()
             if n in table and isinstance(r.get("samples_per_s"), (int, float))}
    if rated:
        best = max(rated, key=rated.get)
        put(J, f"{K}.best_deepspeed", {"name": best, "samples_per_s": rated[best],
                                       "ratio_to_plain_autocast":
                                           results[best].get("ratio_to_plain_autocast")})
        if best not in profiles and not out_of_time(40):
            engine = ds_opt = model = ds_step = None
            try:
                engine, ds_opt, model, ds_step, _ = build(best)
                profiles[best] = profile(ds_step, "ds", a, on_gpu, results[best]["ms_per_step"])
            except Exception as exc:  # noqa: BLE001
                profiles[best] = failed(exc)
            put(J, f"{K}.profiles.{best}", profiles[best])
            del engine, ds_opt, model, ds_step
            release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
