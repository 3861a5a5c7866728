"""DeepSpeed's overhead on the bert-squad smoke's training steps, against a plain PyTorch loop.

    python bench/smoke_overhead.py [--steps 100] [--rounds 7] [--chunk 10] [--threads N]
                                   [--json FILE]

Both sides train the smoke's own model (the tiny BERT that ``make_smoke_assets`` saves, loaded
back with ``from_pretrained``) on the smoke's own micro-batches (``engine.micro_batches``, same
seed), for the same steps, with the same optimizer, schedule and clipping:

* DeepSpeed: ``engine.initialize`` with the smoke's fp32 config (``dsconfig.build_config``:
  ZeRO stage 0, fp32, CPU, torch's AdamW), then ``engine(**batch)``, ``engine.backward``,
  ``engine.step``, as ``engine.train`` does (``--backward-allreduce`` puts back the
  world-size-1 gradient all-reduce that ``engine.initialize`` turns off);
* plain: ``torch.optim.AdamW`` with the config's optimizer params, the config's
  WarmupLR/WarmupDecayLR schedule as a ``LambdaLR`` (the same floats DeepSpeed computes),
  ``torch.nn.utils.clip_grad_norm_`` to the config's ``gradient_clipping`` (DeepSpeed's
  default when unset: 1.0 since DeepSpeed PR 8068), ``loss.backward()``, ``optimizer.step()``,
  ``scheduler.step()``, ``zero_grad(set_to_none=True)``.

Every round starts both sides from the same initial weights (fresh model, fresh engine), then
runs them in alternating chunks of ``--chunk`` steps (plain first in even chunks, DeepSpeed
first in odd ones) until each has run ``--steps``: a burst of load from other processes lands
on both sides alike. Only the steps are timed (``time.perf_counter``): no model load, engine
init or batch slicing. The two loss curves must agree (fp32, same math; only the clipping
norm's float rounding differs, and with ``"gradient_clipping": 0`` they are bit-identical):
the largest difference is printed, so a comparison that is not like for like shows. Prints
per-round times, the medians, and the median of the per-round ratios DeepSpeed / plain.
Goal (issue): ratio <= 1.05.

``--steps`` behaves like the smoke's own hidden ``--steps``: the schedule is the smoke's for
that many steps (warm-up = steps // 10); ``--steps 500`` is the full smoke.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dsenv.net import free_port

GOAL = 1.05
SIDES = ("plain", "deepspeed")


# ----------------------------------------------------------------------------- the plain side
def lr_factors(config: dict, steps: int) -> list[float]:
    """The learning rate DeepSpeed's configured scheduler gives optimizer step k (k = 0 ..
    steps - 1), as a factor of the optimizer's lr, computed as deepspeed.runtime.lr_schedules
    does: the scheduler starts at iteration -1 (min lr for step 0), engine.step() advances it
    after each optimizer step, and warm-up lasts at least 2 steps."""
    base = float(config["optimizer"]["params"]["lr"])
    sched = config.get("scheduler")
    if not sched:
        return [1.0] * steps
    kind, p = sched.get("type"), sched.get("params") or {}
    if kind not in ("WarmupLR", "WarmupDecayLR"):
        raise SystemExit(f"scheduler {kind!r}: this bench mirrors WarmupLR and WarmupDecayLR "
                         f"only")
    lo = float(p.get("warmup_min_lr", 0.0))
    hi = float(p.get("warmup_max_lr", base if kind == "WarmupLR" else 0.001))
    warm = max(2, int(p.get("warmup_num_steps", 1000)))
    total = int(p.get("total_num_steps", 0))
    log_warmup = p.get("warmup_type", "log") != "linear"

    def gamma(i: int) -> float:
        if i < warm:
            return math.log(i + 1) / math.log(warm) if log_warmup else i / warm
        if kind == "WarmupLR":
            return 1.0
        return max(0.0, float(total - i) / float(max(1.0, total - warm)))

    if lo == 0.0 and hi == base:  # dsconfig's schedule: LambdaLR's lr * gamma is bit for
        return [0.0] + [gamma(k) for k in range(steps - 1)]  # bit DeepSpeed's 0 + lr * gamma
    return [(lo if k == 0 else lo + (hi - lo) * gamma(k - 1)) / base if base else 0.0
            for k in range(steps)]


def gradient_clipping(config: dict) -> float:
    """The max gradient norm DeepSpeed clips to: the config's, else DeepSpeed's default
    (1.0 since DeepSpeed PR 8068, 2026; 0.0, no clipping, before)."""
    from deepspeed.runtime.constants import GRADIENT_CLIPPING, GRADIENT_CLIPPING_DEFAULT

    return float(config.get(GRADIENT_CLIPPING, GRADIENT_CLIPPING_DEFAULT) or 0.0)


class Plain:
    """torch.optim.AdamW/Adam with exactly the params DeepSpeed passes it (torch_adam), the
    config's schedule, and the config's clipping."""

    name = "plain"

    def __init__(self, model, config: dict, steps: int):
        import torch

        opt = config["optimizer"]
        kind = str(opt.get("type", "")).lower()
        params = dict(opt.get("params") or {})
        if kind not in ("adam", "adamw") or not params.pop("torch_adam", False):
            raise SystemExit(f"optimizer {opt.get('type')!r} without torch_adam: this bench "
                             f"compares against torch.optim.AdamW only")
        adam_w_mode = params.pop("adam_w_mode", True)
        params["foreach"] = params.pop("foreach", None)
        cls = torch.optim.AdamW if (kind == "adamw" or adam_w_mode) else torch.optim.Adam
        self.model = model
        self.optimizer = cls(model.parameters(), **params)
        factors = lr_factors(config, steps + 1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda k: factors[k])
        self.clip = gradient_clipping(config)
        self.clip_grad_norm_ = torch.nn.utils.clip_grad_norm_
        self.losses: list = []
        model.train()

    def run(self, batches: list[dict]) -> float:
        model, optimizer, scheduler, clip = self.model, self.optimizer, self.scheduler, self.clip
        losses = self.losses
        start = time.perf_counter()
        for batch in batches:
            loss = model(**batch).loss
            loss.backward()
            if clip > 0.0:
                self.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        return time.perf_counter() - start

    def describe(self) -> dict:
        return {"optimizer": type(self.optimizer).__name__, "hyper": _hyper(self.optimizer),
                "lr_after": self.optimizer.param_groups[0]["lr"], "gradient_clipping": self.clip}


class DeepSpeed:
    """The smoke's engine loop: engine(**batch), engine.backward(loss), engine.step()."""

    name = "deepspeed"

    def __init__(self, engine, backward_allreduce: bool = False):
        self.engine = engine
        if backward_allreduce:  # DeepSpeed's own default, which engine.initialize turns off
            engine.enable_backward_allreduce = True  # for stage 0 at world size 1
        self.losses: list = []
        engine.train()

    def run(self, batches: list[dict]) -> float:
        ds, losses = self.engine, self.losses
        start = time.perf_counter()
        for batch in batches:
            loss = ds(**batch).loss
            ds.backward(loss)
            ds.step()
            losses.append(loss.detach())
        return time.perf_counter() - start

    def describe(self) -> dict:
        ds = self.engine
        return {"optimizer": type(ds.optimizer).__name__, "hyper": _hyper(ds.optimizer),
                "lr_after": ds.get_lr()[0], "gradient_clipping": float(ds.gradient_clipping()),
                "backward_allreduce": bool(ds.enable_backward_allreduce)}


def _hyper(optimizer) -> list[dict]:
    """Each param group's hyper-parameters but lr (scheduled) and params, for comparison."""
    return [{k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()
             if k not in ("params", "lr", "initial_lr")} for group in optimizer.param_groups]


# ----------------------------------------------------------------------------- the smoke's data
def _smoke_train_features(bert_squad, assets: Path, s, seed: int) -> dict:
    """The smoke's training windows, read back and tokenized by bert_squad's own code."""
    init_model = assets / "init-model"
    if hasattr(bert_squad, "make_features"):  # read_json_files + make_features
        tokenizer = bert_squad.load_tokenizer(init_model)
        data = bert_squad.read_json_files(assets / "data")
        return bert_squad.make_features(data, tokenizer, s, False, seed).train_f
    from transformers import AutoTokenizer  # the earlier layout: load_features

    tokenizer = AutoTokenizer.from_pretrained(init_model)
    train_file, dev_file = bert_squad.data_files(assets / "data")
    return bert_squad.load_features(train_file, dev_file, tokenizer, s, False, seed)[2]


def interleaved(sides: dict, batches: list[dict], chunk: int) -> dict[str, float]:
    """Run every side over ``batches`` in alternating chunks; seconds per side."""
    seconds = dict.fromkeys(sides, 0.0)
    names = list(sides)
    gc.collect()
    for c, i in enumerate(range(0, len(batches), chunk)):
        for name in names if c % 2 == 0 else reversed(names):
            seconds[name] += sides[name].run(batches[i:i + chunk])
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100,
                        help="optimizer steps per side per round (default 100)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--chunk", type=int, default=10,
                        help="steps per side before switching sides (default 10; --chunk "
                             "STEPS runs the sides one after the other)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads for both sides (default: all cores)")
    parser.add_argument("--warmup-steps", type=int, default=10,
                        help="untimed steps per side before the rounds (default 10)")
    parser.add_argument("--seed", type=int, default=1234, help="the smoke's seed (default 1234)")
    parser.add_argument("--deepspeed-config", metavar="FILE",
                        help="a ds_config merged over the fp32 preset, as the smoke takes it")
    parser.add_argument("--backward-allreduce", action="store_true",
                        help="DeepSpeed's default: all-reduce the gradients in backward() even "
                             "at world size 1 (engine.initialize turns that identity off for "
                             "stage 0); measures the engine without that change")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="then cProfile N DeepSpeed steps and print the top functions")
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON here")
    parser.add_argument("--verbose", action="store_true", help="keep DeepSpeed's logging")
    args = parser.parse_args()
    if min(args.steps, args.rounds, args.chunk, args.threads) < 1 or args.warmup_steps < 0:
        parser.error("--steps, --rounds, --chunk and --threads must be >= 1")

    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("GLOO_SOCKET_IFNAME", "lo"),
                       ("DS_ACCELERATOR", "cpu"), ("HF_HUB_OFFLINE", "1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        os.environ.pop(key, None)  # one process, whatever shell this runs in

    wall = time.perf_counter()
    load_before = os.getloadavg()[0]
    import torch
    import transformers
    from transformers import BertForQuestionAnswering

    from dsenv.workloads import bert_squad, runner
    from dsenv.workloads.training import dsconfig, engine, runtime

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    s = bert_squad.SMOKE
    if args.steps != s.steps:  # as the smoke's own --steps does
        from dataclasses import replace

        s = replace(s, steps=args.steps, warmup_steps=max(1, args.steps // 10))
    rt = runtime.start(quiet=True)
    if rt.on_gpu or rt.world_size != 1:
        print("this bench is for one process on CPU (fp32, stage 0)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    planned = dsconfig.build_config("fp32", 1, on_gpu=False, default_micro_batch=s.micro_batch,
                                    default_lr=s.lr, user_config=args.deepspeed_config,
                                    warmup_steps=s.warmup_steps, total_steps=s.steps)
    config = planned.config
    if planned.batch.grad_accum != 1:
        print("this bench compares gradient_accumulation_steps 1 only", file=sys.stderr)
        return 2
    timings = engine.init_distributed(rt, config, verbose=args.verbose)
    if timings["ops_built"]:
        print(f"note: DeepSpeed JIT-compiled {', '.join(timings['ops_built'])} first "
              f"({timings['init_distributed_s']:.0f} s, not timed)")

    with tempfile.TemporaryDirectory(prefix="dsenv-smoke-overhead-") as tmp:
        assets = Path(tmp) / "assets"
        runner.make_smoke_assets(bert_squad, assets, s, args.seed, None)
        init_model = assets / "init-model"
        train_f = _smoke_train_features(bert_squad, assets, s, args.seed)
        keys = ("input_ids", "token_type_ids", "attention_mask", "start_positions",
                "end_positions")
        train_t = engine.to_tensors(train_f, keys)
        stream = engine.micro_batches(train_t, planned.batch.micro_batch, rt, args.seed)
        batches = [next(stream) for _ in range(args.steps)]  # the smoke's first N steps

        def fresh_model():
            torch.manual_seed(args.seed)
            return BertForQuestionAnswering.from_pretrained(init_model)

        def fresh_sides(steps: int) -> dict:
            ds = DeepSpeed(engine.initialize(fresh_model(), config, verbose=args.verbose),
                           args.backward_allreduce)
            torch.set_num_threads(args.threads)  # whatever initialize did
            return {"plain": Plain(fresh_model(), config, steps), "deepspeed": ds}

        if args.warmup_steps:
            interleaved(fresh_sides(args.warmup_steps), batches[:args.warmup_steps],
                        args.chunk)

        times: dict[str, list[float]] = {side: [] for side in SIDES}
        ratios, loss_diffs, checks = [], [], {}
        print(f"bert-squad smoke steps: {args.steps} steps x {args.rounds} rounds per side in "
              f"alternating chunks of {args.chunk}, micro-batch {planned.batch.micro_batch}, "
              f"{torch.get_num_threads()} torch threads, {rt.device_type}")
        print(f"{'round':>5} {'plain s':>8} {'deepspeed s':>11} {'ratio':>6} {'max |dloss|':>11}")
        for r in range(args.rounds):
            sides = fresh_sides(args.steps)
            if r % 2:  # the other side starts odd rounds
                sides = dict(reversed(sides.items()))
            got = interleaved(sides, batches, args.chunk)
            for side in SIDES:
                times[side].append(got[side])
            plain_loss = torch.stack(sides["plain"].losses).double()
            ds_loss = torch.stack(sides["deepspeed"].losses).double()
            diff = float((plain_loss - ds_loss).abs().max())
            loss_diffs.append(diff)
            ratios.append(got["deepspeed"] / got["plain"])
            if r == 0:
                plain, ds = sides["plain"].describe(), sides["deepspeed"].describe()
                checks = {
                    "loss_first": [float(plain_loss[0]), float(ds_loss[0])],
                    "loss_last": [float(plain_loss[-1]), float(ds_loss[-1])],
                    "max_abs_loss_diff": diff,
                    "identical_curves": bool(torch.equal(plain_loss, ds_loss)),
                    "optimizers": [plain["optimizer"], ds["optimizer"]],
                    "gradient_clipping": [plain["gradient_clipping"], ds["gradient_clipping"]],
                    "lr_after": [plain["lr_after"], ds["lr_after"]],
                    "hyper_equal": (plain["hyper"] == ds["hyper"]
                                    and plain["gradient_clipping"] == ds["gradient_clipping"]
                                    and plain["lr_after"] == ds["lr_after"]),
                    "hyper_deepspeed": ds["hyper"],
                    "backward_allreduce": ds["backward_allreduce"],
                }
            print(f"{r + 1:>5} {got['plain']:>8.3f} {got['deepspeed']:>11.3f} "
                  f"{ratios[-1]:>6.3f} {diff:>11.2e}")
            del sides
            gc.collect()

        profile_text = _profile(engine.initialize(fresh_model(), config), batches,
                                args.profile) if args.profile else None

    medians = {side: statistics.median(values) for side, values in times.items()}
    ratio = statistics.median(ratios)
    ms = {side: 1000 * m / args.steps for side, m in medians.items()}
    print(f"\n{'side':<10} {'median s':>9} {'min s':>7} {'max s':>7} {'ms/step':>8}")
    for side, values in times.items():
        print(f"{side:<10} {medians[side]:>9.3f} {min(values):>7.3f} {max(values):>7.3f} "
              f"{ms[side]:>8.2f}")
    print(f"\nloss (round 1): plain {checks['loss_first'][0]:.4f} -> {checks['loss_last'][0]:.4f}"
          f", deepspeed {checks['loss_first'][1]:.4f} -> {checks['loss_last'][1]:.4f}; max "
          f"|difference| over the curve {checks['max_abs_loss_diff']:.2e} "
          f"({'bit-identical' if checks['identical_curves'] else 'not bit-identical'}), over "
          f"all rounds {max(loss_diffs):.2e}")
    print(f"optimizers: plain {checks['optimizers'][0]}, deepspeed {checks['optimizers'][1]}; "
          f"gradient clipping {checks['gradient_clipping'][0]:g} vs "
          f"{checks['gradient_clipping'][1]:g}; lr after {args.steps} steps "
          f"{checks['lr_after'][0]:.6g} vs {checks['lr_after'][1]:.6g}; hyper-parameters "
          f"{'equal' if checks['hyper_equal'] else 'DIFFERENT'}; DeepSpeed "
          f"{'all-reduced' if checks['backward_allreduce'] else 'skipped the all-reduce of'} "
          f"the gradients in backward()")
    # the clipping norm's rounding (torch's vector_norm vs DeepSpeed's pow-sum-sqrt) is the
    # only difference: ~1e-6 over 100 steps, growing with more (measured)
    like_for_like = checks["hyper_equal"] and max(loss_diffs) <= 1e-2
    if not like_for_like:
        print("WARNING: the two sides did not train alike: the ratio does not compare like "
              "with like")
    print(f"\nmedian ratio deepspeed/plain: {ratio:.3f}  (goal <= {GOAL:.2f}: "
          f"{'met' if ratio <= GOAL else 'NOT met'}); ratio of medians "
          f"{medians['deepspeed'] / medians['plain']:.3f}, of minima "
          f"{min(times['deepspeed']) / min(times['plain']):.3f}; DeepSpeed adds "
          f"{ms['deepspeed'] - ms['plain']:.2f} ms/step")
    spread = max(times["plain"]) / min(times["plain"])
    # the 1-minute load average also counts a run that just ended (this bench's own, too)
    if spread > 1.5 or load_before > 0.5 * (os.cpu_count() or 1):
        print(f"note: the plain side's rounds varied {spread:.1f}-fold, load average "
              f"{load_before:.1f} at the start: other processes were using the cores, and "
              f"torch threads sharing cores slow down unevenly; rerun when the machine is quiet")
    wall_s = time.perf_counter() - wall
    print(f"bench wall time {wall_s:.0f} s")
    if profile_text:
        print(f"\ncProfile of {args.profile} DeepSpeed steps (top by own time):\n{profile_text}")

    if args.json:
        from dsenv.jsonfiles import write_json_atomically

        write_json_atomically(args.json, {
            "bench": "smoke_overhead", "workload": "bert-squad", "steps": args.steps,
            "rounds": args.rounds, "chunk": args.chunk, "warmup_steps": args.warmup_steps,
            "threads": torch.get_num_threads(), "device_type": rt.device_type,
            "backward_allreduce": checks["backward_allreduce"],
            "versions": runtime.versions(), "ds_config": config,
            "times_s": times, "median_s": medians, "ms_per_step": ms,
            "ratios": ratios, "median_ratio": ratio, "goal": GOAL, "goal_met": ratio <= GOAL,
            "loss_check": checks, "max_abs_loss_diff_all_rounds": max(loss_diffs),
            "like_for_like": like_for_like, "plain_spread": spread,
            "load_average_at_start": load_before,
            "ops_built": timings["ops_built"],
            "wall_s": wall_s}, indent=2)
    runtime.shutdown()
    return 0


def _profile(ds, batches: list[dict], steps: int) -> str:
    """cProfile ``steps`` steps of a fresh engine (after 5 untimed ones)."""
    import cProfile
    import io
    import pstats

    side = DeepSpeed(ds)
    side.run(batches[:5])
    prof = cProfile.Profile()
    todo = [batches[(5 + i) % len(batches)] for i in range(steps)]
    prof.enable()
    side.run(todo)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).strip_dirs().sort_stats("tottime").print_stats(25)
    return out.getvalue()


if __name__ == "__main__":
    raise SystemExit(main())
