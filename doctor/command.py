"""``dsenv doctor``: select checks, run them, render, choose the exit code."""

from __future__ import annotations

import os
import sys

from dsenv.workloads.assets import WORKLOAD_NAMES

from dsenv.errors import UsageError

from .distributed import validate_usage
from .distributed_launch import run_distributed
from .probes.context import Context, Options
from .registry import AREAS, all_checks
from .render import exit_code, render_json, render_text
from .runner import run_checks


def run_doctor(args) -> int:
    checks = all_checks()
    if args.list:
        for c in checks:
            print(f"{c.id:32} {c.title}")
        return 0
    known_ids = {c.id for c in checks}
    unknown_areas = [a for a in (args.only or []) if a not in AREAS]
    if unknown_areas:
        raise UsageError(f"--only: unknown area {', '.join(unknown_areas)}; "
                         f"areas are {', '.join(AREAS)}")
    unknown_ids = [i for i in args.skip if i not in known_ids]
    if unknown_ids:
        raise UsageError(f"--skip: unknown check id {', '.join(unknown_ids)}; "
                         "`dsenv doctor --list` shows them")
    if args.deepspeed_config and not args.deepspeed_config.is_file():
        raise UsageError(f"--deepspeed-config: {args.deepspeed_config} is not a file; "
                         "give the path of your ds_config JSON")
    validate_usage(args)
    if args.workload and args.workload not in WORKLOAD_NAMES:
        raise UsageError(f"--for: unknown workload {args.workload!r}; "
                         f"choose one of {', '.join(WORKLOAD_NAMES)}")

    options = Options(target=args.target, launcher=args.launcher, nodes=args.nodes,
                      gpus_per_node=args.gpus_per_node, deepspeed_config=args.deepspeed_config,
                      workload=args.workload, verbose=args.verbose,
                      probe_timeout=args.probe_timeout, probe=args.probe)
    ctx = Context(options=options, env=dict(os.environ), root=args.root)
    selected = [c for c in checks
                if (not args.only or c.area in args.only) and c.id not in args.skip]
    if args.distributed:
        return run_distributed(args, selected, ctx)
    results = run_checks(selected, ctx)
    if args.json:
        sys.stdout.write(render_json(results, ctx) + "\n")
    else:
        sys.stdout.write(render_text(results, ctx, color=None if sys.stdout.isatty() else False))
    return exit_code(results, strict=args.strict)
