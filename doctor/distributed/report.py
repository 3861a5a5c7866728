"""What ``dsenv doctor --distributed`` reports: the ``distributed`` results (one per stage
a run goes through) from rank 0's :class:`.outcome.Outcome`, the ranks and bandwidth tables,
the exit code; with ``--json``, the outcome's JSON as the report's ``distributed`` section.
Ranks other than 0, and ranks under ``--launch``, write their outcome as one marked JSON
line (RESULT_MARK) for the parent to collect."""

from __future__ import annotations

import io
import json
import socket
import sys
import time
from pathlib import Path

from dsenv.doctor import page as doctor_page
from dsenv.doctor.distributed import (
    fingerprint as distributed_fingerprint,
)
from dsenv.doctor.distributed import page as distributed_page
from dsenv.doctor.distributed import (
    pairs as distributed_pairs,
)
from dsenv.doctor.distributed import (
    ranks,
)
from dsenv.doctor.distributed.command import AREA, Plan, defaults
from dsenv.doctor.distributed.outcome import Failure, Outcome, RankRecord
from dsenv.doctor.render import exit_code, redacted_report, render_json, render_text, use_color
from dsenv.doctor.runner import run_checks
from dsenv.envs.sites import load_site
from dsenv.provision import ProvisionError
from dsenv.provision.record.manifest import read_manifest
from dsenv.verdicts.findings import Result, Status

RESULT_MARK = "DSENV-DISTRIBUTED-RESULT "
# Ranks other than 0 that stop before the rendezvous exit this much later than rank 0 would:
# torchrun and mpirun stop every rank as soon as one exits non-zero.
PREFLIGHT_LAG_S = 2.0


# -- verdicts -----------------------------------------------------------------------------------
STAGES = ("launch", "rendezvous", "environment", "devices", "allreduce", "busbw", "links")
TITLES = {"launch": "Ranks and launcher", "rendezvous": "Every rank arrives",
          "environment": distributed_fingerprint.TITLE,
          "devices": "One GPU per rank", "allreduce": "All-reduce is exact",
          "busbw": "All-reduce bus bandwidth", "links": distributed_pairs.TITLE}


def stage_of(failure: Failure | None) -> str | None:
    if failure is None:
        return None
    if failure.kind in ("singletons", "world-size", "launch-env", "launch"):
        return "launch"
    step = failure.step or "start"
    if failure.kind == "aborted" and step == "rendezvous":
        return "devices" if "GPU" in failure.message else "launch"
    if step.startswith("all-reduce check"):
        return "allreduce"
    if step == "host pairs":
        return "links"
    if step.startswith(("bandwidth", "gather", "done")):
        return "busbw"
    return "rendezvous"


def expectation(plan: Plan, hosts: int, prefix: Path | None = None
                ) -> tuple[float | None, str]:
    """(expected busbw GB/s, where it comes from) or (None, how to give one)."""
    if plan.expect_busbw:
        return plan.expect_busbw, "--expect-busbw"
    name = plan.site
    if name is None:
        try:
            recorded = read_manifest(prefix or Path(sys.prefix))
        except ProvisionError:
            recorded = None
        name = recorded.site if recorded is not None else None
    if not name:
        return None, ("no expectation: pass --expect-busbw GBPS or set expect_busbw_gbps in "
                      "the site profile")
    key = "intra_node" if hosts <= 1 else "inter_node"
    value = load_site(name).expect_busbw_gbps.get(key)
    if value is None:
        return None, f"site {name} has no expect_busbw_gbps.{key}; pass --expect-busbw GBPS"
    return float(value), f"site {name}: expect_busbw_gbps.{key}"


def _result(stage: str, status: Status, summary: str, evidence=(), fix=None) -> Result:
    return Result(f"{AREA}.{stage}", AREA, TITLES[stage], status, summary, list(evidence), fix)


FIXES = {
    "singletons": "the launcher did not give the ranks their identity: start MPI programs "
                  "with `srun --mpi=pmix` (or the plugin `dsenv doctor --only mpi` names), "
                  "run one srun step per rank set (`srun -n N dsenv doctor --distributed`), "
                  "or use torchrun / the deepspeed launcher",
    "world-size": "make the launcher start the ranks you plan for (srun -n, mpirun -np, "
                  "torchrun --nnodes x --nproc_per_node) and do not export WORLD_SIZE by hand",
    "launch-env": "export MASTER_ADDR=<first node> (and LOCAL_RANK where the launcher does "
                  "not), or use a launcher that sets them",
    "launch": "run the printed launcher command by hand to see why it failed",
    "absent": "see the launcher's log for that rank: it did not start, or cannot reach "
              "MASTER_ADDR:MASTER_PORT (firewall, wrong interface); a slow start on a "
              "shared file system needs a larger --timeout",
    "exited": "read the named rank's own output (stderr): it ended before the test did",
    "stuck": "inspect the named rank while it hangs: `py-spy dump --pid PID` on its host",
    "stall": "every rank is waiting in the same collective: rerun with NCCL_DEBUG=INFO (GPU) "
             "and check the interface column (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME)",
}


def _failure_fix(failure: Failure, records: list[RankRecord]) -> str:
    kind = failure.kind
    if kind in FIXES:
        return FIXES[kind]
    for state in ("exited", "absent", "stuck"):
        culprit = next((c for c in failure.culprits if c.state == state), None)
        if culprit is None:
            continue
        pid = next((r.get("pid") for r in records if r.get("rank") == culprit.rank), None)
        return FIXES[state].replace("PID", str(pid)) if pid else FIXES[state]
    if kind == "aborted" and "GPU" in failure.message:
        return ("give each rank its own GPU: `srun --gpus-per-task=1`, or one "
                "CUDA_VISIBLE_DEVICES entry per local rank (dsenv uses cuda:LOCAL_RANK)")
    if kind == "aborted":
        return FIXES["world-size"]
    if kind == "store":
        return FIXES["absent"]
    return FIXES["stall"]


def results_from(outcome: Outcome, plan: Plan, prefix: Path | None = None) -> list[Result]:
    """The distributed results for the doctor report, from rank 0's (or the parent's) view."""
    failure = outcome.failure
    failed_at = stage_of(failure)
    records = outcome.ranks
    hosts = sorted(h for h in outcome.hosts() if h)
    world = outcome.world_size
    launcher = outcome.launcher or "?"
    results: list[Result] = []

    def reached(stage: str) -> bool:
        return failed_at is None or STAGES.index(stage) < STAGES.index(failed_at)

    def failed(stage: str) -> Result:
        evidence = [c.detail for c in failure.culprits if c.detail not in failure.message]
        evidence += failure.evidence or []
        if outcome.fault_injected:
            evidence.append("fault injected: " + outcome.fault_injected)
        if outcome.launched:
            evidence.append(f"started with: {outcome.launched.command}")
        return _result(stage, Status.FAIL, failure.message, evidence,
                       _failure_fix(failure, records))

    for stage in STAGES:
        if stage == "environment":  # compared at the rendezvous, shown whatever came later
            if outcome.environment or outcome.preflight != "alone":
                results.append(distributed_fingerprint.result(outcome.environment,
                                                              reached("environment")))
                continue
        if failed_at == stage:
            results.append(failed(stage))
        elif not reached(stage):
            results.append(_result(stage, Status.SKIP, f"not reached: "
                                   f"{TITLES[failed_at].lower()} failed"))
        elif outcome.preflight == "alone" and stage != "launch":
            results.append(_result(stage, Status.SKIP, "one rank: nothing to talk to"))
        else:
            results.append(_passed(stage, outcome, plan, hosts, world, launcher, prefix))
    return results


def _passed(stage, outcome: Outcome, plan, hosts, world, launcher, prefix) -> Result:
    records = outcome.ranks
    if stage == "launch":
        if outcome.preflight == "alone":
            return _result(stage, Status.WARN, f"one rank ({launcher}): nothing to test",
                           [], "run it under the job's launcher (srun -n N, mpirun -np N, "
                           "torchrun --nproc_per_node N, deepspeed) or add --launch torchrun "
                           "-n 2")
        return _result(stage, Status.OK, f"{world} ranks under {launcher} on "
                       f"{len(hosts)} host(s), backend {outcome.backend}",
                       [f"rank {r['rank']}: {r.get('host')}, local rank {r.get('local_rank')}"
                        for r in records[:16]])
    if stage == "rendezvous":
        timing = outcome.timing
        return _result(stage, Status.OK, f"{world}/{world} ranks in "
                       f"{timing.rendezvous_s or 0:.2f} s, {outcome.backend} "
                       f"init {timing.init_s or 0:.2f} s", [f"master {outcome.master}"])
    if stage == "devices":
        gpus = [r for r in records if str(r.get("device", "")).startswith("cuda")]
        if not gpus:
            return _result(stage, Status.SKIP, "ranks run on CPU (gloo): no GPUs to share")
        return _result(stage, Status.OK, f"{len(gpus)} ranks on {len(gpus)} distinct GPUs",
                       [f"rank {r['rank']}: {r.get('device_name')} {r.get('device_uuid')}"
                        for r in gpus[:16]])
    if stage == "links":
        return distributed_pairs.result(outcome.pairs)
    rows = outcome.allreduce
    if stage == "allreduce":
        wrong = [r for r in rows if r.wrong]
        sizes = f"{ranks.format_size(rows[0].bytes)} to {ranks.format_size(rows[-1].bytes)}"
        if wrong:
            first = wrong[0]
            at = first.first_wrong
            return _result(stage, Status.FAIL, f"wrong sum at {ranks.format_size(first.bytes)}"
                           f": {first.wrong} of {first.count} elements differ",
                           [f"first at index {at and at.index}: got {at and at.got}, expected "
                            f"{at and at.expected}"],
                           "the collective corrupts data: rerun with NCCL_ALGO=Ring "
                           "NCCL_PROTO=Simple to isolate it, and report this output to the admins")
        return _result(stage, Status.OK, f"exact at {len(rows)} sizes ({sizes}): the sum of "
                       f"{world} ranks' random data, element by element")
    largest = rows[-1]
    busbw = largest.busbw_gbps
    shown = f"{busbw:.2f} GB/s at {ranks.format_size(largest.bytes)}"
    expected, source = expectation(plan, len(hosts), prefix)
    evidence = [f"{ranks.format_size(r.bytes)}: {r.time_us:.1f} us, algbw "
                f"{r.algbw_gbps:.2f}, busbw {r.busbw_gbps:.2f} GB/s" for r in rows]
    if expected is None:
        return _result(stage, Status.INFO, f"busbw {shown}; {source}", evidence)
    verdict = defaults()["verdict"]
    ratio = busbw / expected
    summary = f"busbw {shown}: {ratio:.0%} of the expected {expected:g} GB/s ({source})"
    if ratio >= verdict["ok_from"]:
        return _result(stage, Status.OK, summary, evidence)
    fix = ("compare the interface column with the fabric you expect (NCCL_SOCKET_IFNAME, "
           "NCCL_IB_HCA), run `dsenv doctor --only comm`, and rerun with NCCL_DEBUG=INFO to "
           "see the transport NCCL chose")
    status = Status.WARN if ratio >= verdict["warn_from"] else Status.FAIL
    return _result(stage, status, summary, evidence, fix)


# -- output -------------------------------------------------------------------------------------
def report(outcome: Outcome, plan: Plan, args, checks, ctx, marked_ok: bool = True) -> int:
    """Print what this process should print; the exit code."""
    failed = outcome.failure is not None
    if plan.marked and marked_ok:
        stream = sys.stdout if outcome.rank == 0 else sys.stderr
        stream.write(RESULT_MARK + json.dumps(outcome.to_json()) + "\n")
        return 1 if failed else 0
    if outcome.rank != 0:  # rank 0 prints the report; the others one line
        if failed:
            here = next((r.get("host") for r in outcome.ranks
                         if r.get("rank") == outcome.rank), None)
            print(f"dsenv doctor --distributed: rank {outcome.rank} on "
                  f"{here or socket.gethostname()}: {outcome.failure.message}",
                  file=sys.stderr, flush=True)
            if outcome.preflight:  # every rank stops at once: let rank 0 report
                time.sleep(PREFLIGHT_LAG_S)  # before a launcher stops it for our exit
        return 1 if failed else 0
    results = results_from(outcome, plan)
    if not failed and checks:
        if ctx.options.launcher is None and outcome.launcher in ("srun", "mpirun",
                                                                 "deepspeed", "torchrun"):
            ctx.options.launcher = outcome.launcher
        results = run_checks(checks, ctx) + results
    outcome.expect_busbw_gbps, outcome.expect_source = expectation(plan, len(outcome.hosts()))
    if getattr(args, "html", None):
        shown = redacted_report(results, ctx, {"distributed": outcome.to_json()}, args.strict)
        doctor_page.write(args.html, shown, distributed_page.sections(shown))
    if args.json:
        sys.stdout.write(render_json(results, ctx, extra={"distributed": outcome.to_json()},
                                     strict=args.strict) + "\n")
    else:
        color = use_color(sys.stdout, ctx.env)  # plain when piped or with NO_COLOR
        sys.stdout.write(render_tables(outcome, color=color))
        sys.stdout.write(render_text(results, ctx, color=color, strict=args.strict))
    return exit_code(results, strict=args.strict)


def _group_size(outcome: Outcome, digest: str) -> int:
    return sum(1 for r in outcome.ranks if (r.get("fingerprint") or {}).get("digest") == digest)


def render_tables(outcome: Outcome, *, color: bool | None = None, width: int = 100) -> str:
    """The ranks table and nccl-tests' bandwidth table, as text."""
    # rich: only rank 0's text report needs it (this module is on every rank's path)
    from rich.console import Console  # rich, as above
    from rich.markup import escape  # rich, as above
    from rich.table import Table  # rich, as above

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, no_color=color is False, width=width,
                      highlight=False, soft_wrap=False)
    world = outcome.world_size
    console.print(f"[bold]dsenv doctor --distributed[/] — {world} rank{'' if world == 1 else 's'}"
                  f" under {outcome.launcher}, backend {outcome.backend or '-'}, "
                  f"{len(outcome.hosts())} host(s), {outcome.seconds:.1f} s")
    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    # environment column only when fingerprints differ: A is the largest group, then B, ...
    digests = sorted({(r.get("fingerprint") or {}).get("digest") for r in outcome.ranks}
                     - {None}, key=lambda d: _group_size(outcome, d), reverse=True)
    letters = {d: chr(ord("A") + i) if i < 26 else "+" for i, d in enumerate(digests)}
    for column in ("rank", "host", "local", "device", "visible", "NUMA", "interface",
                   *(["env"] if len(letters) > 1 else [])):
        table.add_column(column, justify="right" if column in ("rank", "local") else "left")
    for r in outcome.ranks:
        device = r.get("device") or "-"
        if r.get("device_uuid"):
            device += f" {str(r['device_uuid'])[:13]}"
        numa = ",".join(str(n) for n in r.get("numa") or []) or "-"
        if r.get("device_numa") is not None:
            numa += f" (GPU {r['device_numa']})"
        interface = r.get("interface") or "-"
        if r.get("address"):
            interface += f" {r['address']}"
        env = [letters.get((r.get("fingerprint") or {}).get("digest"), "-")] \
            if len(letters) > 1 else []
        table.add_row(str(r.get("rank")), escape(str(r.get("host"))), str(r.get("local_rank")),
                      escape(device), escape(r.get("visible") or "-"), numa, escape(interface),
                      *env)
    console.print(table)
    rows = outcome.allreduce
    if rows and all(r.time_us is not None for r in rows):
        console.print(f"\n[bold]all-reduce[/] (in place, {outcome.warmup} warm-up + "
                      f"{outcome.iters} timed iterations, time averaged over ranks, "
                      "busbw = algbw x 2(n-1)/n)")
        bw = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
        for column in ("size (B)", "count", "type", "redop", "time (us)", "algbw (GB/s)",
                       "busbw (GB/s)", "#wrong"):
            bw.add_column(column, justify="left" if column in ("type", "redop") else "right")
        for r in rows:
            bw.add_row(str(r.bytes), str(r.count), r.type, r.redop, f"{r.time_us:.1f}",
                       f"{r.algbw_gbps:.2f}", f"{r.busbw_gbps:.2f}", str(r.wrong))
        console.print(bw)
    links = (outcome.pairs.rows if outcome.pairs else None) or []
    if links:
        console.print(f"\n[bold]host pairs[/] ({escape(outcome.pairs.selection)}; "
                      "one buffer both ways at once, the fastest of the timed exchanges, "
                      "busbw = bytes / time)")
        pairs = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
        for column in ("host pair", "ranks", "size (B)", "time (us)", "busbw (GB/s)"):
            pairs.add_column(column, justify="left" if column == "host pair" else "right")
        for r in sorted(links, key=lambda r: r.busbw_gbps)[:distributed_pairs.MAX_ROWS_SHOWN]:
            pairs.add_row(escape(f"{r.hosts[0]} - {r.hosts[1]}"), f"{r.ranks[0]},{r.ranks[1]}",
                          str(r.bytes), f"{r.time_us:.1f}", f"{r.busbw_gbps:.2f}")
        console.print(pairs)
    console.print()
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
