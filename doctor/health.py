"""``dsenv doctor --node-health``: the doctor as a node health check (Slurm's
HealthCheckProgram, a prolog, LBNL NHC).

What it runs: only the checks about the node itself (:data:`NODE_CHECKS`): /dev/shm, the
locked-memory limit, the GPU tools answering and the GPUs visible and usable, the driver
against torch's CUDA, the fabric ports and the interfaces the site's NCCL settings name, file
locks in the cache folders. No ds_config, no launcher, no probe that imports torch (the CUDA
driver runs the kernel), no environment-import probes. The node is judged as a compute node.

The budget (``--budget S``, default :data:`DEFAULT_BUDGET`) is hard and counts from the
process's start: each external probe gets a share of it (:data:`PROBE_SHARE`; the CUDA driver
probe twice that) and is killed past it, and a check still running when the budget is spent
becomes a failure, "did not finish within the S s budget", naming the probes it waits on: on
a node, a probe that does not answer is what a hung driver or file system looks like.
The children still running are killed, and the process exits without waiting for them.

Output and exit: one line per failure on stdout, ``ERROR: dsenv: <check>: <reason>`` (the
form NHC's and Slurm's health-check scripts use), nothing when the node is healthy; warnings go
to stderr as ``WARNING: dsenv: ...`` lines and fail only with ``--strict``. Exit 0: healthy;
1: a failure (or, with --strict, a warning); 2: usage error.

``--drain`` (after a failure only) sets the node DRAIN with ``Reason="dsenv: <check>:
<reason>"`` through ``scontrol``, each call with a timeout. It never resumes a node. A node
already drained, failing, in maintenance or down by someone else keeps its state and reason
(the rule LBNL NHC's node-mark-offline follows with its "NHC:" leader); one dsenv drained gets
the new reason.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import psutil

from dsenv import proc
from dsenv.doctor.checks.node.gpu import slurm_gpu_variables
from dsenv.doctor.context import Context, Options
from dsenv.doctor.registry import Check, all_checks
from dsenv.doctor.runner import run_check
from dsenv.errors import UsageError
from dsenv.facts.host import mounts
from dsenv.facts.python import target_env, torch_info
from dsenv.verdicts.findings import Result, Status, skip

# The checks about the node itself, in report order. Left out on purpose: the environment's
# packages and imports (python.*, deepspeed.*, toolkit.*: a user's choice, and seconds),
# the job's plan (job.*, launch.*, mpi.*, system.slurm, system.threads), per-user cache and
# NCCL debugging settings, and torch's own import (torch.usable asks the CUDA driver).
NODE_CHECKS = (
    "system.shm",           # /dev/shm present and large enough for NCCL and DataLoaders
    "system.memlock",       # ulimit -l with RDMA devices present
    "gpu.nvidia-smi",       # the NVIDIA tool answers (a hang is a stuck driver)
    "gpu.rocm",             # amd-smi / rocminfo / rocm-smi answer
    "gpu.devices",          # the GPUs the node must show (--gpus-per-node) are visible
    "gpu.compute-mode",     # no GPU in Prohibited mode, no leftover process on an exclusive one
    "torch.driver",         # the driver is new enough for the environment's torch CUDA
    "torch.usable",         # a kernel runs on each GPU (through the CUDA driver: no torch import)
    "comm.infiniband",      # RDMA ports ACTIVE
    "comm.socket-ifname",   # the interfaces the site's NCCL_SOCKET_IFNAME names exist here
    "comm.ib-hca",          # the HCAs NCCL_IB_HCA names exist here
    "cache.flock",          # file locks work in the cache folders (a mount without flock)
)
DEFAULT_BUDGET = 5.0
# Of the budget, for each external probe (nvidia-smi, ...); the CUDA driver probe gets twice
# that: each is killed, and its check says so, before the budget ends the run.
PROBE_SHARE = 0.3
CHECK_FLOOR = 0.5  # of the budget: the checks get at least this, however slow the start
SCONTROL_TIMEOUT = 5.0
REASON_LEADER = "dsenv:"
MAX_REASON = 200  # characters of the drain reason (sinfo -R and scontrol show it whole)
KEEP_STATES = ("drain", "drng", "fail", "maint", "down")  # sinfo %T: someone else's decision


def validate_usage(args) -> None:
    """--node-health runs a fixed set of checks on this node: the options that shape other
    runs are refused, and --drain/--budget need it."""
    if not getattr(args, "node_health", False):
        for flag, given in (("--drain", getattr(args, "drain", False)),
                            ("--budget", getattr(args, "budget", None) is not None)):
            if given:
                raise UsageError(f"{flag} goes with --node-health: "
                                 f"`dsenv doctor --node-health {flag}`")
        return
    refused = [flag for flag, given in (
        ("--json", args.json), ("--list", args.list), ("--only", args.only),
        ("--fix", getattr(args, "fix", False)), ("--distributed", args.distributed),
        ("--deepspeed-config", args.deepspeed_config), ("--for", args.workload),
        ("--launcher", args.launcher), ("--nodes", args.nodes), ("--probe", args.probe),
        ("--verbose", args.verbose), ("--target", args.target != "auto")) if given]
    if refused:
        raise UsageError(f"--node-health runs the node's own checks on a compute node: "
                         f"drop {', '.join(refused)} (keep --env, --skip, --strict, "
                         "--gpus-per-node, --budget, --drain)")
    unknown = [i for i in args.skip if i not in NODE_CHECKS]
    if unknown:
        raise UsageError(f"--skip: {', '.join(unknown)} is not a node-health check; they are "
                         + ", ".join(NODE_CHECKS))


def run_node_health(args) -> int:
    budget = args.budget if args.budget is not None else DEFAULT_BUDGET
    now = time.monotonic()
    deadline = max(now + budget - process_age(), now + budget * CHECK_FLOOR)
    env = dict(os.environ)
    gpus = args.gpus_per_node
    if gpus is None and not slurm_gpu_variables(env):
        gpus = 0  # no GPU count given or allocated: a node without GPUs is healthy
    options = Options(target="compute", gpus_per_node=gpus, environment=args.environment,
                      probe_timeout=max(0.1, budget * PROBE_SHARE))
    ctx = Context(options=options, env=env, root=args.root)
    try:
        target_env.choose(ctx)  # a bad --env is a usage error (exit 2), before any check runs
    except mounts.NoAnswer:
        pass  # its file system stopped answering: each check that needs it says so
    by_id = {c.id: c for c in all_checks()}
    by_id["torch.usable"] = without_torch_import(by_id["torch.usable"])
    checks = [by_id[i] for i in NODE_CHECKS if i in by_id and i not in args.skip]
    results, late = run_until(checks, ctx, deadline, budget)
    failing = [r for r in results
               if r.status.failing or (args.strict and r.status is Status.WARN)]
    for r in failing:
        sys.stdout.write(f"ERROR: dsenv: {r.id}: {one_line(r.summary)}\n")
    for r in results:
        if r.status is Status.WARN and not args.strict:
            sys.stderr.write(f"WARNING: dsenv: {r.id}: {one_line(r.summary)}\n")
    sys.stdout.flush()
    if failing and args.drain:
        drain(node_name(env), drain_reason(failing), env)
    code = 1 if failing else 0
    if late:  # a thread stuck in a probe: end its children, and do not wait for it
        kill_children()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    kill_children()
    return code


def without_torch_import(check: Check) -> Check:
    """``check`` (torch.usable) where the CUDA driver answers it: a CUDA torch whose
    libtorch_cuda.so is here. Otherwise (a ROCm build, a torch laid out otherwise) it would
    import torch, seconds (4.4 s on an H200 node): a health check says so and skips it."""

    def judge(ctx: Context):
        build = torch_info.torch_build(ctx)
        if build.kind == "hip" or (build.kind == "cuda"
                                   and torch_info.cuda_library(ctx, build) is None):
            return skip(f"{build.describe()}: only torch itself can run work on these GPUs, "
                        "and importing it takes seconds; `dsenv doctor` runs it")
        return check.func(ctx)

    return Check(check.id, check.title, judge)


def process_age() -> float:
    """Seconds since this process started (the interpreter's start and the imports count)."""
    try:  # both counted from boot in clock ticks (psutil's create_time rounds the boot time)
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - started / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def run_until(checks: list[Check], ctx: Context, deadline: float,
              budget: float) -> tuple[list[Result], bool]:
    """Each check in a daemon thread; those not done by ``deadline`` become failures. The
    second value says whether any was late."""
    results: list[Result | None] = [None] * len(checks)

    def work(i: int, check: Check) -> None:
        results[i] = run_check(check, ctx)

    threads = [threading.Thread(target=work, args=(i, c), daemon=True, name=c.id)
               for i, c in enumerate(checks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    late = False
    for i, check in enumerate(checks):
        if results[i] is None:
            late = True
            waiting = ctx.pending_probes()
            results[i] = Result(
                check.id, check.area, check.title, Status.ERROR,
                f"did not finish within the {budget:g} s budget"
                + (f" (waiting on {', '.join(w.rsplit('.', 1)[-1] for w in waiting)})"
                   if waiting else ""),
                fix="run `dsenv doctor --verbose` on the node to see which probe hangs")
    return results, late  # type: ignore[return-value]


def one_line(text: str) -> str:
    return " ".join(text.split())


def drain_reason(failing: list[Result]) -> str:
    first = failing[0]
    more = f" (+{len(failing) - 1} more)" if len(failing) > 1 else ""
    text = f"{REASON_LEADER} {first.id}: {one_line(first.summary)}"
    if len(text) + len(more) > MAX_REASON:
        text = text[:MAX_REASON - len(more) - 3].rstrip() + "..."
    return text + more


def node_name(env) -> str:
    """Slurm's name for this node: SLURMD_NODENAME (set for prologs and health checks where
    slurmd runs under another name), else the short host name."""
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0]


def node_state(node: str, env) -> tuple[str, str] | None:
    """(state, reason) as sinfo shows them (``drained``, ``idle``, ...); None: unknown."""
    shown = proc.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T %E"], SCONTROL_TIMEOUT,
                     env=env)
    lines = shown.stdout.strip().splitlines() if shown.ok else []
    if not lines:
        return None
    state, _, reason = lines[0].partition(" ")
    return state.lower(), reason.strip()


def drain(node: str, reason: str, env, out=None) -> bool:
    """DRAIN ``node`` with ``reason`` unless someone else has taken it out; True if drained."""
    out = out or sys.stderr
    current = node_state(node, env)
    if current is not None:
        state, old = current
        if state.startswith(KEEP_STATES) and not old.startswith(REASON_LEADER):
            out.write(f"dsenv: {node} is already {state} (Reason={old or 'none'}): left as "
                      "it is\n")
            return False
        if state.startswith("down"):
            out.write(f"dsenv: {node} is down: left as it is\n")
            return False
        if old == reason:
            return True
    done = proc.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN",
                     f"Reason={reason}"], SCONTROL_TIMEOUT, env=env)
    if not done.ok:
        out.write(f"dsenv: could not drain {node}: {done.describe()}\n")
        return False
    out.write(f"dsenv: drained {node}: {reason}\n")
    return True


def kill_children(rounds: int = 3) -> None:
    """End the probes still running (a hung nvidia-smi and what it started): each began in
    a session of its own (dsenv.proc), so its whole group goes. A few rounds: a late check's
    thread may start its next probe while the first round kills."""
    for attempt in range(rounds):
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        if not children:
            return
        for child in children:
            try:
                if os.getpgid(child.pid) == child.pid:
                    os.killpg(child.pid, signal.SIGKILL)
                else:
                    child.kill()
            except (ProcessLookupError, PermissionError, psutil.Error):
                pass
        if attempt + 1 < rounds:
            time.sleep(0.05)
