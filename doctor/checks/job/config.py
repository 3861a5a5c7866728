"""job: the DeepSpeed config parses, its batch values are ones DeepSpeed takes and fit the
planned world, its precision fits the GPUs. The file is read and judged by
dsenv/facts/python/dsconfig.py, the reader `dsenv smoke/run --deepspeed-config` use too."""

from __future__ import annotations

from pathlib import Path

from dsenv.doctor.catalogue import mode_finding
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.envs import archs
from dsenv.facts.host import machine as host
from dsenv.facts.python import deepspeed_info, dsconfig
from dsenv.verdicts.findings import Finding, fail, ok, skip
from dsenv.workloads.cli import DEFAULT_PRESET, full_run_settings
from dsenv.workloads.training import dsconfig as workload_configs


def _config_or_skip(ctx: Context) -> dsconfig.LoadedConfig | Finding:
    """The parsed config, or the skip that says why there is none to judge. With --for
    WORKLOAD and no file: the config `dsenv run WORKLOAD` would use (its default preset)."""
    if ctx.options.deepspeed_config is None:
        if ctx.options.workload:
            return _workload_default(ctx)
        return skip("no --deepspeed-config FILE given")
    config = dsconfig.loaded(ctx)
    if config.data is None:
        return skip(f"{config.path} does not parse: see job.ds-config")
    return config


@check("job.ds-config", "DeepSpeed config parses")
def ds_config(ctx: Context):
    if ctx.options.deepspeed_config is None:
        config = _config_or_skip(ctx)
        if isinstance(config, Finding):
            return config
        return ok(f"no --deepspeed-config: judging {config.path}, whose train_batch_size "
                  "dsenv derives from the world size", ", ".join(sorted(config.data)))
    config = dsconfig.loaded(ctx)
    if config.data is None:
        return fail(config.error, f"make {config.path} one JSON object, each key once "
                    f"(`python -m json.tool {config.path}` points at a syntax error)")
    keys = ", ".join(sorted(config.data)[:12])
    return ok(f"{config.path}: valid JSON, {len(config.data)} top-level keys", keys)


def _workload_default(ctx: Context) -> dsconfig.LoadedConfig | Finding:
    workload = ctx.options.workload
    settings = full_run_settings(workload)
    if settings is None:
        return skip(f"workload {workload} has no full run yet; pass --deepspeed-config FILE")
    world, _ = planned_world(ctx)
    planned = workload_configs.build_config(
        DEFAULT_PRESET, world or 1, on_gpu=bool(deepspeed_info.visible_gpus(ctx)),
        default_micro_batch=settings.micro_batch, default_lr=settings.lr)
    return dsconfig.LoadedConfig(Path(f"<dsenv run {workload} --preset {DEFAULT_PRESET}>"),
                                 planned.config)


def planned_world(ctx: Context) -> tuple[int | None, str]:
    """(ranks, how they were counted); ranks None when nothing says."""
    o = ctx.options
    if o.nodes and o.gpus_per_node:
        return o.nodes * o.gpus_per_node, f"--nodes {o.nodes} x --gpus-per-node {o.gpus_per_node}"
    alloc = host.slurm_allocation(ctx)
    if alloc.inside and o.launcher not in ("torchrun", "deepspeed"):
        nodes = alloc.integer("SLURM_NNODES") or alloc.integer("SLURM_JOB_NUM_NODES")
        per_node = alloc.integer("SLURM_NTASKS_PER_NODE")
        if nodes and per_node:
            return nodes * per_node, f"SLURM_NNODES {nodes} x SLURM_NTASKS_PER_NODE {per_node}"
        tasks = alloc.integer("SLURM_NTASKS")
        if tasks:
            return tasks, f"SLURM_NTASKS {tasks}"
    gpus = deepspeed_info.visible_gpus(ctx)
    if gpus:
        nodes = o.nodes or 1
        return nodes * len(gpus), f"{nodes} node(s) x {len(gpus)} visible GPU(s)"
    return None, ""


@check("job.batch-size", "Batch sizes fit the planned world size")
def batch_size(ctx: Context):
    config = _config_or_skip(ctx)
    if isinstance(config, Finding):
        return config
    refused = dsconfig.judge_values(config.data)  # NaN, "sixteen", 0: whatever the world
    if refused:
        return fail(refused.summary, refused.fix, f"in {config.path}")
    world, how = planned_world(ctx)
    if world is None:
        return skip("world size unknown: give --nodes N --gpus-per-node G (or run inside the "
                    "allocation)")
    sequence_parallel = config.data.get("sequence_parallel_size")
    evidence = [f"world: {world} rank(s) from {how}"]
    if isinstance(sequence_parallel, int) and sequence_parallel > 1:
        world //= sequence_parallel
        evidence.append(f"sequence_parallel_size {sequence_parallel}: {world} data-parallel "
                        "rank(s)")
    verdict = dsconfig.judge_batch(config.data, world)
    if verdict.detail:
        evidence.append(verdict.detail)
    if verdict.good:
        return ok(verdict.summary, *evidence)
    return mode_finding(fail, "job.batch-size-mismatch", verdict.summary, *evidence,
                        here=verdict.fix)


@check("job.precision", "fp16/bf16 supported by the GPUs")
def precision(ctx: Context):
    config = _config_or_skip(ctx)
    if isinstance(config, Finding):
        return config
    flags = dsconfig.precision_flags(config.data)
    shown = ", ".join(f"{k}.enabled={v}" for k, v in flags.items())
    if flags["fp16"] is True and flags["bf16"] is True:
        return fail("fp16 and bf16 both enabled: DeepSpeed asserts 'bfloat16 and fp16 modes "
                    "cannot be simultaneously enabled'",
                    'keep one: "bf16": {"enabled": false} (or fp16 off on A100/H100/MI200+)',
                    shown)
    gpus = deepspeed_info.visible_gpus(ctx)
    if not gpus:
        return skip("no GPU visible to judge fp16/bf16 support", shown)
    archs_seen = sorted({g.arch for g in gpus})
    evidence = [shown, "GPUs: " + ", ".join(sorted({f"{g.name} ({g.arch})" for g in gpus}))]
    if flags["bf16"] is True:
        lacking = [a for a in archs_seen if not archs.bf16_supported(a)]
        if lacking:
            return mode_finding(fail, "job.bf16-unsupported-gpu",
                                f"bf16 enabled but arch {', '.join(lacking)} has no bf16 (needs "
                                "compute capability >= 8.0 or MI200+)", *evidence,
                                here='switch to fp16: "bf16": {"enabled": false}, "fp16": '
                                '{"enabled": true}')
    mode = next((k for k, v in flags.items() if v is True), None)
    auto = [k for k, v in flags.items() if v == dsconfig.AUTO]
    summary = (f"{mode} on {', '.join(archs_seen)}" if mode else "fp32 (no fp16/bf16)")
    if auto:
        summary += f"; {', '.join(auto)} \"auto\" follows the Trainer's --fp16/--bf16"
    return ok(summary, *evidence)
