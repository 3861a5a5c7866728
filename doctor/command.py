"""``dsenv doctor``: select checks, run them, render, choose the exit code."""

from __future__ import annotations

import os
import sys
import time

from dsenv.doctor import page
from dsenv.doctor.catalogue import by_check
from dsenv.doctor.context import Context, Options
from dsenv.doctor.distributed.command import validate_usage
from dsenv.doctor.distributed.launch import run_distributed
from dsenv.doctor.fix.command import run_fixes
from dsenv.doctor.health import run_node_health
from dsenv.doctor.health import validate_usage as validate_health_usage
from dsenv.doctor.registry import AREAS, all_checks
from dsenv.doctor.render import exit_code, redacted_report, render_json, render_text
from dsenv.doctor.runner import run_checks
from dsenv.errors import UsageError
from dsenv.facts.host import mounts
from dsenv.facts.python import target_env
from dsenv.workloads.fetch.assets import WORKLOAD_NAMES


def run_doctor(args) -> int:
    validate_health_usage(args)
    if getattr(args, "node_health", False):
        return run_node_health(args)
    checks = all_checks()
    if args.list:
        modes, width = by_check(), max(len(c.title) for c in checks)
        print(f"{'check':32} {'title':{width}}  catalogue")
        for c in checks:
            ids = ", ".join(m.id for m in modes.get(c.id, ())) or "-"
            print(f"{c.id:32} {c.title:{width}}  {ids}")
        return 0
    validate_fix_usage(args)
    known_ids = {c.id for c in checks}
    unknown_areas = [a for a in (args.only or []) if a not in AREAS]
    if unknown_areas:
        raise UsageError(f"--only: unknown area {', '.join(unknown_areas)}; "
                         f"areas are {', '.join(AREAS)}")
    unknown_ids = [i for i in args.skip if i not in known_ids]
    if unknown_ids:
        raise UsageError(f"--skip: unknown check id {', '.join(unknown_ids)}; "
                         "`dsenv doctor --list` shows them")
    validate_usage(args)
    if args.workload and args.workload not in WORKLOAD_NAMES:
        raise UsageError(f"--for: unknown workload {args.workload!r}; "
                         f"choose one of {', '.join(WORKLOAD_NAMES)}")

    options = Options(target=args.target, launcher=args.launcher, nodes=args.nodes,
                      gpus_per_node=args.gpus_per_node, deepspeed_config=args.deepspeed_config,
                      workload=args.workload, verbose=args.verbose,
                      probe_timeout=args.probe_timeout, probe=args.probe,
                      environment=getattr(args, "environment", None))
    ctx = Context(options=options, env=dict(os.environ), root=args.root)
    # a config on a file server that stopped answering is statted in a child first: the
    # job.* checks say it was not read, rather than this stat blocking before any check
    if args.deepspeed_config and mounts.files_answer(ctx, args.deepspeed_config) \
            and not args.deepspeed_config.is_file():
        raise UsageError(f"--deepspeed-config: {args.deepspeed_config} is not a file; "
                         "give the path of your ds_config JSON")
    try:
        target_env.choose(ctx)  # a bad --env is a usage error (exit 2), before any check runs
    except mounts.NoAnswer:
        pass  # its file system stopped answering: each check that needs it says so
    selected = [c for c in checks
                if (not args.only or c.area in args.only) and c.id not in args.skip]
    if args.distributed:
        return run_distributed(args, selected, ctx)
    start = time.monotonic()
    results = run_checks(selected, ctx)
    timing = timing_section(ctx, time.monotonic() - start)
    fix = getattr(args, "fix", False)
    if args.html:
        page.write(args.html, redacted_report(results, ctx, {"timing": timing},
                                              strict=args.strict))
    if args.json:
        extra: dict = {"timing": timing}
        if fix:  # the screen of --fix goes to stderr; the report keeps what it did
            results, records = run_fixes(results, ctx, yes=args.yes, dry_run=args.dry_run,
                                         strict=args.strict, out=sys.stderr)
            extra["fixes"] = [r.to_json() for r in records]
        sys.stdout.write(render_json(results, ctx, extra, strict=args.strict) + "\n")
    else:  # colour only on a terminal without NO_COLOR (render.use_color)
        sys.stdout.write(render_text(results, ctx, strict=args.strict))
        if fix:
            results, _ = run_fixes(results, ctx, yes=args.yes, dry_run=args.dry_run,
                                   strict=args.strict)
    return exit_code(results, strict=args.strict)


def timing_section(ctx: Context, checks_s: float) -> dict:
    """Where the run's time went: the checks' wall time (they run in parallel, so it is
    about the slowest one's), and each probe's start and seconds (a probe runs once
    however many checks ask; its seconds include the probes it waits on)."""
    return {"checks_s": round(checks_s, 4),
            "probes": [{"id": key, "started_s": round(started, 4), "seconds": round(seconds, 4)}
                       for key, started, seconds in ctx.probe_times()]}


def validate_fix_usage(args) -> None:
    fix = getattr(args, "fix", False)
    for flag, given in (("--yes", getattr(args, "yes", False)),
                        ("--dry-run", getattr(args, "dry_run", False))):
        if given and not fix:
            raise UsageError(f"{flag} goes with --fix: `dsenv doctor --fix {flag}`")
    if fix and args.distributed:
        raise UsageError("--fix judges this node: run it without --distributed")
