"""gpu.compute-mode, gpu.mig and system.threads: how the job's ranks share this node's GPUs
and CPUs.

Each compares a node setting with the planned ranks per node (--gpus-per-node, else Slurm's
task count): a GPU in Exclusive_Process mode takes one CUDA context, a CUDA process enumerates
one MIG instance however many it is shown, and OpenMP starts one thread per CPU it may run on
in every rank unless OMP_NUM_THREADS says otherwise.
"""

from __future__ import annotations

from collections import Counter

from dsenv.doctor.catalogue import mode_finding
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.facts.gpu import inventory
from dsenv.facts.gpu import modes as gpumodes
from dsenv.facts.launch import joblayout
from dsenv.redact import show_variable
from dsenv.verdicts.findings import Finding, Status, fail, info, ok, skip, warn

EXCLUSIVE_FIX = ("start exactly one rank per GPU (`--gpus-per-node {gpus}`, "
                 "`#SBATCH --ntasks-per-node={gpus}` with srun, device = LOCAL_RANK) and keep CUDA "
                 "out of DataLoader workers; ask the admins for Default compute mode if ranks "
                 "must share a GPU")


def _severe(ctx: Context):
    """fail on a compute target, warn on a login node (the compute nodes may differ)."""
    return fail if ctx.is_compute else warn


@check("gpu.compute-mode", "GPU compute mode (Exclusive_Process)")
def compute_mode(ctx: Context):
    report = gpumodes.compute_modes(ctx)
    if report.result is None:
        return skip("no NVIDIA driver: nvidia-smi is not on PATH (compute modes are an "
                    "NVIDIA setting)")
    if not report.result.ok:
        return skip("nvidia-smi did not report compute modes (gpu.nvidia-smi reports the tool)",
                    report.result.describe())
    if not report.visible:
        return skip("no GPU visible to the job" + (f" ({report.hidden} hidden by "
                                                   "CUDA_VISIBLE_DEVICES)" if report.hidden else ""))
    evidence = [m.describe() for m in report.visible]
    prohibited = [m for m in report.visible if m.kind == "prohibited"]
    if prohibited:
        return _severe(ctx)(f"{len(prohibited)} GPU(s) in Prohibited compute mode: no process "
                            "can create a CUDA context on them",
                            "ask the admins to reset the compute mode (`nvidia-smi -c DEFAULT`) "
                            "or keep the job off the node: `sbatch --exclude=$(hostname)`",
                            *evidence)
    exclusive = [m for m in report.visible if m.kind == "exclusive"]
    if not exclusive:
        return ok(f"{len(report.visible)} GPU(s) in Default compute mode", *evidence)
    gpus = len(report.visible)
    ranks = joblayout.ranks_per_node(ctx)
    evidence.append(f"ranks per node: {ranks.value or '?'} ({ranks.source})")
    if ranks.value and ranks.value > gpus:
        return mode_finding(
            _severe(ctx), "gpu.exclusive-process-mode",
            f"{ranks.value} ranks per node on {gpus} GPU(s) in Exclusive_Process mode: the "
            "second rank on a GPU fails with 'all CUDA-capable devices are busy or "
            "unavailable'", *evidence, here=EXCLUSIVE_FIX.format(gpus=gpus))
    apps, result = gpumodes.compute_apps(ctx)
    taken_uuids = {m.uuid for m in exclusive if m.uuid}
    taken = [a for a in apps if a.gpu_uuid in taken_uuids or not taken_uuids]
    if taken:
        return mode_finding(
            _severe(ctx), "gpu.exclusive-process-mode",
            f"{len(taken)} process(es) already hold a GPU in Exclusive_Process mode: a rank "
            "placed there fails with 'all CUDA-capable devices are busy or unavailable'",
            *evidence, *[a.describe() for a in taken],
            here="stop the leftover processes (`nvidia-smi --query-compute-apps=pid,"
            "process_name --format=csv` lists them) or keep the job off the node: "
            "`sbatch --exclude=$(hostname)`")
    if not result.ok:
        evidence.append("processes on the GPUs unknown: " + result.describe())
    return info(f"{len(exclusive)} of {gpus} GPU(s) in Exclusive_Process mode: one rank per "
                "GPU works; a second CUDA context on a GPU (a DataLoader worker, a monitor) "
                "fails", *evidence)


MIG_FIX = ("give each rank exactly one MIG instance before it starts: `nvidia-smi -L` lists their "
           "UUIDs; start one process per instance with `CUDA_VISIBLE_DEVICES=MIG-<uuid>` (Slurm: "
           "`--gres=gpu:<profile>:1` per task); for one job over several GPUs ask for whole GPUs "
           "(a partition without MIG)")
LAUNCHERS_THAT_FORK_RANKS = ("torchrun", "deepspeed")  # every rank inherits one environment


def _listed(gpu: inventory.ListedGpu) -> str:
    if not gpu.mig:
        return f"GPU {gpu.index} {gpu.name}: whole (no MIG device)"
    profiles = ", ".join(f"{n} x {p}" for p, n in Counter(d.profile for d in gpu.mig).items())
    return f"GPU {gpu.index} {gpu.name}: {len(gpu.mig)} MIG device(s) ({profiles})"


@check("gpu.mig", "MIG instances: one per CUDA process")
def mig(ctx: Context):
    """NVIDIA's MIG user guide (CUDA device enumeration): a CUDA process enumerates a single
    MIG instance, whatever CUDA_VISIBLE_DEVICES lists; torch's device count may say more, so
    the second rank on a node fails (pytorch#130181, #131650)."""
    listing = inventory.gpu_list(ctx)
    if listing.result is None:
        return skip("no NVIDIA driver: nvidia-smi is not on PATH (MIG is an NVIDIA feature)")
    if not listing.result.ok:
        return skip("nvidia-smi -L did not answer (gpu.nvidia-smi reports the tool)",
                    listing.result.describe())
    if not listing.gpus:
        return skip("nvidia-smi -L listed no GPU")
    listed = [_listed(g) for g in listing.gpus]
    view = gpumodes.mig_view(list(listing.gpus), ctx.env)
    shown = show_variable("CUDA_VISIBLE_DEVICES", ctx.env.get("CUDA_VISIBLE_DEVICES", ""))
    if view.unknown:  # one verdict, one home: a device that does not exist
        return skip(f"{shown} names {view.unknown[0]}, no MIG instance of this node "
                    "(gpu.visible-devices reports it)", *listed)
    if not any(g.mig for g in listing.gpus):
        return ok(f"no GPU is MIG-partitioned: {len(listing.gpus)} whole GPU(s)", *listed)
    if not view.devices:
        return ok(f"the MIG-partitioned GPU(s) are hidden ({shown}): the job uses "
                  f"{len(view.whole)} whole GPU(s)", *listed)
    ranks = joblayout.ranks_per_node(ctx)
    usable = len(view.whole) + 1  # one MIG instance per process, beside any whole GPUs
    visible = [d.describe() for d in view.devices[:8]]
    evidence = [*listed, f"ranks per node: {ranks.value or '?'} ({ranks.source})",
                f"{len(view.devices)} MIG device(s) visible to a process: " + "; ".join(visible)]
    # srun/mpirun under Slurm give each task its own CUDA_VISIBLE_DEVICES: one MIG UUID here
    # is this task's; torchrun and DeepSpeed's runner hand one environment to every rank
    per_task = view.named == 1 and ctx.options.launcher not in LAUNCHERS_THAT_FORK_RANKS
    if ranks.value and ranks.value > usable and not per_task:
        return mode_finding(_severe(ctx), "gpu.mig-one-instance-per-process",
                            f"{ranks.value} ranks per node, but a CUDA process enumerates one "
                            f"MIG instance: each rank sees {usable} device(s) and rank "
                            f"{usable} fails ('invalid device ordinal', or torch's num_gpus "
                            "assert)", *evidence, here=MIG_FIX)
    if len(view.devices) > 1:
        return mode_finding(warn, "gpu.mig-one-instance-per-process",
                            f"{len(view.devices)} MIG instances visible to one process: CUDA "
                            "enumerates one of them, the others stay idle", *evidence,
                            here=MIG_FIX)
    return ok(f"one MIG instance for this process: {view.devices[0].describe()}", *evidence)


def _omp_threads(value: str) -> int | None:
    """OMP_NUM_THREADS '8' -> 8; OpenMP's nested list '8,2' -> 8 (the outer level)."""
    first = value.split(",", 1)[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


OVERSUBSCRIBED = "system.omp-oversubscription"  # the catalogue mode of the thread warnings


@check("system.threads", "OpenMP threads per rank (OMP_NUM_THREADS)")
def threads(ctx: Context):
    ranks = joblayout.ranks_per_node(ctx)
    count = ranks.value or 1
    share = joblayout.cpu_share(ctx, count)
    per_rank = max(share.per_rank, 1)
    evidence = [f"ranks per node: {ranks.value or 1} ({ranks.source})", *share.evidence]
    fix = f"export OMP_NUM_THREADS={per_rank} (the CPUs each rank gets)"
    value = ctx.env.get("OMP_NUM_THREADS", "").strip()
    if share.per_rank == 0:
        return warn(f"{count} ranks per node on {share.available} CPU(s): fewer CPUs than "
                    "ranks, every rank competes for them", "ask for more CPUs per node "
                    "(`#SBATCH --cpus-per-task=...`) or plan fewer ranks per node", *evidence)
    if not value:
        if count == 1:
            return ok(f"OMP_NUM_THREADS unset with 1 rank per node: OpenMP uses the "
                      f"{share.available} CPU(s) it may run on", *evidence)
        if ctx.options.launcher == "torchrun":
            return Finding(Status.INFO, f"OMP_NUM_THREADS unset: torchrun sets it to 1 for "
                           f"each of the {count} ranks, leaving CPU work (DataLoader, "
                           f"DeepSpeed's cpu_adam) 1 of the {per_rank} CPUs per rank",
                           tuple(evidence), fix)
        if ctx.options.launcher == "srun" and "SLURM_CPUS_PER_TASK" in ctx.env:
            return Finding(Status.INFO, "OMP_NUM_THREADS unset: srun gives each rank its own "
                           f"{per_rank} CPU(s) and OpenMP sizes itself to them when Slurm binds "
                           "tasks; Slurm's docs still ask for it to be set", tuple(evidence), fix)
        return mode_finding(warn, OVERSUBSCRIBED,
                            f"OMP_NUM_THREADS unset with {count} ranks per node: each rank "
                            "starts one OpenMP thread per CPU it may run on "
                            f"({count} x {share.available} threads on {share.available} CPUs)",
                            *evidence, here=fix)
    shown = show_variable("OMP_NUM_THREADS", value)
    wanted = _omp_threads(value)
    if wanted is None:
        return mode_finding(warn, OVERSUBSCRIBED, f"{shown} is not a positive thread count: "
                            "OpenMP ignores it and starts one thread per CPU", *evidence,
                            here=fix)
    if wanted > per_rank:
        return mode_finding(warn, OVERSUBSCRIBED,
                            f"{shown} x {count} rank(s) per node = {wanted * count} threads on "
                            f"{per_rank * count if share.per_rank else share.available} CPU(s): "
                            "the node is oversubscribed and CPU work (data loading, cpu_adam) "
                            "slows down", *evidence, here=fix)
    if wanted == 1 and per_rank >= 4:
        return Finding(Status.INFO, f"{shown} leaves {per_rank - 1} of the {per_rank} CPUs of "
                       "each rank idle for CPU work (DeepSpeed's cpu_adam under ZeRO-Offload "
                       "runs on one thread)", tuple(evidence), fix)
    return ok(f"{shown} x {count} rank(s) per node fits the {per_rank} CPU(s) per rank",
              *evidence)
