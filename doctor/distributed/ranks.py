"""The ranks of a distributed job as facts: how many ranks the launcher announced, which
ranks share a GPU, who is missing or stuck, and nccl-tests' bandwidth arithmetic.

Pure functions over the environment, per-rank records and progress; ``dsenv doctor
--distributed`` (doctor/distributed/command.py) feeds them what each rank reported.

A rank record is a JSON object (it travels between ranks through the job's store), typed as
:class:`.outcome.RankRecord`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from dsenv.doctor.distributed.outcome import Culprit
from dsenv.facts.launch.slurmlists import SlurmListError, expand_hostlist, tasks_per_node

SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"\s*(\d+)\s*([KMG]?)(?:I?B)?\s*", re.IGNORECASE)


# -- sizes and bandwidth (nccl-tests' definitions, doc/PERFORMANCE.md) ------------------------
def parse_size(text: str) -> int:
    """'64M' -> 67108864, '4K' -> 4096, '1GiB' -> 1073741824, '512' -> 512 (bytes)."""
    match = _SIZE.fullmatch(text)
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not a size: write bytes with an optional K, M or G "
                         "(e.g. 64K,1M,64M)")
    return int(match.group(1)) * SIZE_UNITS[match.group(2).upper()]


def format_size(size: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"


def algorithm_bandwidth(size_bytes: int, seconds: float) -> float:
    """GB/s (1e9 bytes per second) of an all-reduce of ``size_bytes`` that took ``seconds``."""
    return size_bytes / seconds / 1e9 if seconds > 0 else 0.0


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' busbw for all-reduce: algbw x 2(n-1)/n, comparable to the link speed
    whatever the number of ranks (0 for a single rank: nothing crosses a link)."""
    return algbw * 2 * (world_size - 1) / world_size if world_size > 0 else 0.0


COEFFICIENT_PERIOD = 64


def rank_coefficient(rank: int) -> int:
    """c_r in the correctness pattern A + c_r B: rank + 1, repeating every 64 ranks so the
    exact sum stays within float32's exact integers for worlds of up to ~250,000 ranks. A
    rank missing, counted twice or sending another rank's data changes the sum, except an
    exchange between two ranks 64 apart."""
    return rank % COEFFICIENT_PERIOD + 1


def coefficient_sum(world_size: int) -> int:
    full, rest = divmod(world_size, COEFFICIENT_PERIOD)
    period = COEFFICIENT_PERIOD * (COEFFICIENT_PERIOD + 1) // 2
    return full * period + rest * (rest + 1) // 2


def exact_value_bound(world_size: int) -> int:
    """The largest m such that A and B drawn from [-m, m] keep every partial sum of the
    pattern A + c_r B over ``world_size`` ranks below 2**24, where float32 holds every
    integer exactly: any reduction order then gives exactly n A + (sum of c_r) B."""
    n = max(1, world_size)
    return max(1, (2**24 - 1) // (n + coefficient_sum(n)))


# -- what the launcher announced ----------------------------------------------------------------
ANNOUNCING_VARIABLES = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")
MPI_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def _count(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() else None


def announced_world_sizes(env: Mapping[str, str]) -> dict[str, int]:
    """Every rank count a launcher exported: {'WORLD_SIZE': 2, 'SLURM_STEP_NUM_TASKS': 2}."""
    return {name: n for name in ANNOUNCING_VARIABLES if (n := _count(env, name)) is not None}


def world_size_problems(launcher: str, world_size: int, env: Mapping[str, str],
                        expected: int | None, expected_from: str = "--expect-world-size"
                        ) -> list[str]:
    """Ways the world this rank will join differs from the one it was asked for.

    A WORLD_SIZE exported by hand (launcher "env") under mpirun or srun must equal the rank
    count that launcher started, or the rendezvous waits for ranks that never come.
    torchrun and the deepspeed launcher start several ranks per task, so their WORLD_SIZE
    legitimately differs from the MPI or Slurm task count and is not compared.
    """
    problems = []
    if expected is not None and world_size != expected:
        problems.append(f"{launcher} gives a world of {world_size} rank(s), {expected_from} "
                        f"says {expected}")
    if launcher == "env":
        for name in (*MPI_SIZE_VARIABLES, "SLURM_STEP_NUM_TASKS"):
            started = _count(env, name)
            if started is not None and started != world_size:
                problems.append(f"WORLD_SIZE={world_size} was set by hand, but the launcher "
                                f"started {started} rank(s) ({name}={started})")
    return problems


def singleton_evidence(world_size: int, env: Mapping[str, str],
                       siblings: Iterable[str] = ()) -> list[str]:
    """Why a process that sees itself as rank 0 of 1 is really one of several lone ranks.

    ``siblings``: descriptions of other copies of this same command started next to it
    (same parent process) that also run now. Empty when the process is alone for real.
    """
    if world_size != 1:
        return []
    evidence = [f"{name}={n}: the launcher started {n} ranks, this one sees a world of 1"
                for name, n in announced_world_sizes(env).items() if n > 1]
    tasks = _count(env, "SLURM_NTASKS")
    if tasks and tasks > 1 and "SLURM_STEP_ID" not in env and "SLURM_STEPID" not in env:
        evidence.append(f"SLURM_NTASKS={tasks} but no srun step: the job script ran this "
                        "command once, without srun")
    evidence.extend(siblings)
    return evidence


# -- devices ------------------------------------------------------------------------------------
def normalize_uuid(uuid: str | None) -> str | None:
    """'GPU-a75cda02-...' (nvidia-smi) and 'a75cda02-...' (torch) name the same GPU."""
    if not uuid:
        return None
    uuid = str(uuid).strip().lower()
    return uuid.removeprefix("gpu-") or None


def shared_devices(records: Iterable[Mapping]) -> list[tuple[str, list[int]]]:
    """GPUs used by more than one rank: [('GPU a75cda02-... on node1', [0, 1])].

    A GPU is known by its UUID (unique across hosts), else by host and PCI bus id. Ranks on
    CPU never share a "device" in this sense.
    """
    groups: dict[tuple, list[int]] = {}
    names: dict[tuple, str] = {}
    for record in records:
        if not str(record.get("device", "")).startswith("cuda"):
            continue
        uuid = normalize_uuid(record.get("device_uuid"))
        if uuid:
            key = ("uuid", uuid)
            names[key] = f"GPU {uuid} on {record.get('host')}"
        elif record.get("device_bus_id"):
            key = ("bus", record.get("host"), str(record["device_bus_id"]).lower())
            names[key] = f"GPU at PCI {record['device_bus_id']} on {record.get('host')}"
        else:
            continue
        groups.setdefault(key, []).append(int(record["rank"]))
    return [(names[key], sorted(ranks)) for key, ranks in groups.items() if len(ranks) > 1]


# -- NUMA ---------------------------------------------------------------------------------------
def parse_cpulist(text: str) -> set[int]:
    """'0-3,8-11' -> {0, 1, 2, 3, 8, 9, 10, 11} (the kernel's cpulist format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part.strip():
            continue
        first, _, last = part.strip().partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def numa_nodes_of(cpus: Iterable[int], root: Path = Path("/")) -> list[int]:
    """The NUMA nodes whose CPUs intersect ``cpus`` (a rank's affinity); [] without sysfs."""
    wanted = set(cpus)
    folder = root / "sys/devices/system/node"
    nodes = []
    for node in sorted(folder.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            if parse_cpulist((node / "cpulist").read_text()) & wanted:
                nodes.append(int(node.name[4:]))
        except (OSError, ValueError):
            continue
    return nodes


# -- who is missing or stuck --------------------------------------------------------------------
def slurm_step_hosts(env: Mapping[str, str], world_size: int) -> dict[int, str]:
    """rank -> host as Slurm places the tasks of this step, so that a rank that never
    reported is still named with its host: block (consecutive ranks fill one node, then the
    next) or cyclic (one rank per node in turn, sbatch's default when a job asks for one
    task per node). Empty under any other launcher or distribution, or when the layout does
    not add up to the world."""
    nodelist = env.get("SLURM_STEP_NODELIST", "")
    distribution = env.get("SLURM_DISTRIBUTION", "block").split(":")[0]
    if not nodelist or distribution not in ("block", "cyclic"):
        return {}
    try:
        hosts = expand_hostlist(nodelist)
        counts = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", ""))
    except SlurmListError:
        return {}
    if len(counts) != len(hosts) or sum(counts) != world_size:
        return {}
    if distribution == "block":
        placed = [host for host, n in zip(hosts, counts, strict=True) for _ in range(n)]
    else:
        placed, left = [], list(counts)
        while len(placed) < world_size:
            for index, host in enumerate(hosts):
                if left[index]:
                    placed.append(host)
                    left[index] -= 1
    return dict(enumerate(placed))


def rank_name(rank: int, hosts: Mapping[int, str]) -> str:
    host = hosts.get(rank)
    return f"rank {rank} ({host})" if host else f"rank {rank} (host unknown: it never reported)"


def diagnose(world_size: int, hosts: Mapping[int, str], steps: Mapping[int, int],
             exited: Mapping[int, int], step_names: list[str]) -> list[Culprit]:
    """The ranks to blame when the run did not finish, most certain first.

    ``hosts``: rank -> host of every rank that reported; ``steps``: rank -> index (in
    ``step_names``) of the step each rank last entered; ``exited``: rank -> step index of
    ranks whose connection closed before they finished. A rank that exited is blamed first,
    then ranks that never arrived, then ranks behind the furthest one (alive but stuck).
    Empty when every rank is alive at the same step: nobody is behind, the step itself
    did not complete (the transport stalls).
    """
    def step(index: int | None) -> str:
        if index is None or not 0 <= index < len(step_names):
            return "?"
        return step_names[index]

    culprits = []
    for rank in sorted(exited):
        culprits.append(Culprit(rank, hosts.get(rank), "exited", step(exited[rank]),
                                f"{rank_name(rank, hosts)} exited before the end: its last "
                                f"step was '{step(exited[rank])}' (its connection closed)"))
    absent = [r for r in range(world_size) if r not in steps and r not in exited]
    for rank in absent:
        culprits.append(Culprit(rank, hosts.get(rank), "absent", None,
                                f"{rank_name(rank, hosts)} did not arrive: it never reached "
                                "the rendezvous"))
    alive = {r: s for r, s in steps.items() if r not in exited}
    if alive:
        furthest = max(alive.values())
        for rank, index in sorted(alive.items()):
            if index < furthest:
                culprits.append(Culprit(rank, hosts.get(rank), "stuck", step(index),
                                        f"{rank_name(rank, hosts)} stopped answering: its "
                                        f"last step was '{step(index)}', others reached "
                                        f"'{step(furthest)}'"))
    return culprits
