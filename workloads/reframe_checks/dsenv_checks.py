"""dsenv's checks for ReFrame (reframe-hpc 4): ``reframe -C SITE.py -c "$(dsenv reframe
--path)" -r``. Load them with a ReFrame installed beside dsenv (the same Python): the
parameters and references come from dsenv's own tables.

- ``DsenvDoctor``: ``dsenv doctor`` as a preflight; sanity is the doctor's verdict, and a
  failure names each failing finding (``gpu.devices: no GPU visible, ...``).
- ``DsenvNodeHealth``: ``dsenv doctor --node-health`` on each node of the job (srun, one
  task per node; this node alone elsewhere); a failure names the host and the doctor's
  ``ERROR: dsenv: <check>: <reason>`` line.
- ``DsenvSmoke %workload %preset %launcher``: ``dsenv smoke WORKLOAD --preset P --report
  report.json``; sanity is dsenv's sanity verdict (its own detail text when it fails), the
  performance variable ``samples_per_s`` (per device, as dsenv judges it) is checked against
  dsenv's reference for the device type, world size and preset the run reports
  (workloads/references.toml; ``-S references=FILE`` gives a site's table, to dsenv too).
- ``DsenvRun %workload %preset %launcher``: the full run (``dsenv run``), after the
  session fixture ``DsenvFetch`` (``dsenv fetch``, or ``--from`` a bundle with ``-S
  DsenvFetch.bundle=DIR``) filled the offline cache.
- ``DsenvDistributed %launcher``: ``dsenv doctor --distributed``; sanity is the doctor's
  verdict, ``busbw`` (GB/s at the largest size) a performance variable with the expected
  bandwidth as reference when the site profile or ``-S expect_busbw=GBPS`` gives one.

Launchers (``%launcher``): ``none`` one process; ``torchrun`` and ``deepspeed`` start
``ranks_per_node`` ranks on one node (ReFrame's local launcher); ``srun`` and ``mpirun`` are
ReFrame's launchers of those names, ``nodes`` x ``ranks_per_node`` tasks (srun: Slurm
partitions only). Select with ``-n``: ``-n 'DsenvSmoke%workload=bert-squad%preset=fp32
%launcher=none$'`` (no spaces).
"""

from __future__ import annotations

import json
import os

import reframe as rfm
import reframe.utility.typecheck as typ
from reframe.core.backends import getlauncher
from reframe.core.builtins import (
    fixture,
    parameter,
    performance_function,
    run_after,
    run_before,
    sanity_function,
    variable,
)
from reframe.core.exceptions import SanityError

from dsenv.data import load_table
from dsenv.envs.launchers import LAUNCHERS
from dsenv.workloads import registry
from dsenv.workloads.report import find_reference, load_references
from dsenv.workloads.training.dsconfig import preset_names

ONE_PROCESS = "none"
NODE_LAUNCHERS = ("torchrun", "deepspeed")  # one launcher on one node forks its ranks
PARTITION_LAUNCHERS = ("srun", "mpirun")  # ReFrame's own launchers of those names
WORKLOAD_LAUNCHERS = (ONE_PROCESS, *LAUNCHERS)
PRESETS = preset_names()
REPORT = "report.json"
DOCTOR_REPORT = "doctor.json"
PAGE = "report.html"  # the run's HTML page, written beside --report
DOCTOR_PAGE = "doctor.html"
NODE_HEALTH = "node-health"


def _tail(path: str, lines: int = 3) -> str:
    """The last lines of a job's output, for a failure that left no report."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = [line.strip() for line in handle if line.strip()]
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def _read_json(path: str, what: str, stderr: str) -> dict:
    """A report dsenv wrote; a SanityError naming dsenv's own last words when it wrote none."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        start = text.find("{")  # under srun, other ranks' lines may come first
        return json.JSONDecoder().raw_decode(text[max(start, 0):])[0]
    except (OSError, ValueError):
        said = _tail(stderr)
        raise SanityError(f"{what} wrote no report ({os.path.basename(path)})"
                          + (f": {said}" if said else "")) from None


def _doctor_verdict(report: dict) -> bool:
    """True when the doctor said ready; else a SanityError with each failing finding."""
    verdict = report.get("verdict", {})
    if verdict.get("ready"):
        return True
    failing = [r for r in report.get("results", []) if r.get("status") in ("fail", "error")]
    if not failing:  # --strict: the warnings failed it
        failing = [r for r in report.get("results", []) if r.get("status") == "warn"]
    findings = "; ".join(f"{r['id']}: {r['summary']}" for r in failing)
    raise SanityError(f"dsenv doctor: {verdict.get('line', 'not ready')}"
                      + (f": {findings}" if findings else ""))


class _DsenvCheck(rfm.RunOnlyRegressionTest):
    """What every dsenv check shares: the command, the environment, the ranks."""

    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    maintainers = ["dsenv"]
    #: the dsenv command on the compute nodes
    dsenv = variable(str, value="dsenv")
    #: the Python environment the job runs in (`--env`): a prefix or an interpreter
    environment = variable(str, value="")
    #: ranks per node for the multi-rank launchers, and nodes for srun/mpirun
    ranks_per_node = variable(int, value=2)
    nodes = variable(int, value=1)
    #: more options for the dsenv command (e.g. `--micro-batch 8`)
    extra_options = variable(typ.List[str], value=[])

    def _env_options(self) -> list[str]:
        return ["--env", self.environment] if self.environment else []

    def _python(self) -> str:
        """The environment's interpreter, for the launchers that start `python -m`."""
        if not self.environment:
            return "python3"
        if os.path.isdir(self.environment):
            return os.path.join(self.environment, "bin", "python")
        return self.environment

    def _launch(self, launcher: str, module_args: list[str]) -> None:
        """Start ``dsenv MODULE_ARGS`` the way ``launcher`` names."""
        if launcher in PARTITION_LAUNCHERS:
            self.skip_if(launcher == "srun" and self.current_partition.scheduler.registered_name
                         not in ("slurm", "squeue"),
                         "srun needs a Slurm partition")
            self.job.launcher = getlauncher(launcher)()
            self.num_tasks = self.nodes * self.ranks_per_node
            self.num_tasks_per_node = self.ranks_per_node
            self.executable = self.dsenv
            self.executable_opts = module_args
            return
        self.job.launcher = getlauncher("local")()
        self.num_tasks = 1
        if launcher == ONE_PROCESS:
            self.executable = self.dsenv
            self.executable_opts = module_args
            return
        self.skip_if(self.nodes > 1, f"{launcher} starts one node's ranks here; use srun or "
                                     "mpirun for several nodes")
        self.executable = self._python()
        if launcher == "torchrun":
            head = ["-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={self.ranks_per_node}", "-m"]
        else:  # deepspeed: its runner, on this node only (no hostfile, no ssh)
            head = ["-m", "deepspeed.launcher.runner", "--no_ssh_check",
                    f"--num_gpus={self.ranks_per_node}", "--module"]
        self.executable_opts = [*head, "dsenv.workloads.cli", *module_args]


@rfm.simple_test
class DsenvDoctor(_DsenvCheck):
    """``dsenv doctor`` as a preflight: ready, or the failing findings in ReFrame's report."""

    descr = "dsenv doctor: is this node ready for DeepSpeed jobs?"
    keep_files = [DOCTOR_REPORT, DOCTOR_PAGE]
    tags = {"dsenv", "preflight"}
    #: options for the doctor (e.g. `--target compute --gpus-per-node 4 --strict`)
    doctor_options = variable(typ.List[str], value=[])

    @run_after("setup")
    def set_command(self):
        self._launch(ONE_PROCESS, ["doctor", *self._env_options(), *self.doctor_options,
                                   *self.extra_options, "--html", DOCTOR_PAGE, "--json", ">",
                                   DOCTOR_REPORT])

    @sanity_function
    def doctor_ready(self):
        return _doctor_verdict(_read_json(os.path.join(self.stagedir, DOCTOR_REPORT),
                                          "dsenv doctor",
                                          os.path.join(self.stagedir, self.stderr.evaluate())))


@rfm.simple_test
class DsenvNodeHealth(_DsenvCheck):
    """``dsenv doctor --node-health`` on every node of the job, one task per node: the node's
    own checks within ``budget`` seconds; a failing host is named with the doctor's line."""

    descr = "dsenv doctor --node-health: every node of the job, its own checks"
    tags = {"dsenv", "preflight"}
    keep_files = [f"{NODE_HEALTH}.*"]
    #: seconds each node's checks may take (the doctor's --budget)
    budget = variable(float, value=10.0)

    @run_after("setup")
    def set_command(self):
        # one file per host, named by the host itself: srun's output does not say which
        # host printed a line, and the reason must name the broken one
        run = (f"{self.dsenv} doctor --node-health --budget {self.budget:g} "
               f"{' '.join(self.extra_options)} > {NODE_HEALTH}.$(hostname) 2>&1")
        scheduled = self.current_partition.scheduler.registered_name in ("slurm", "squeue")
        self._launch("srun" if scheduled else ONE_PROCESS, ["-c", f"'{run}'"])
        self.executable = "sh"
        if scheduled:
            self.num_tasks, self.num_tasks_per_node = self.nodes, 1

    @sanity_function
    def nodes_healthy(self):
        reports = sorted(name for name in os.listdir(self.stagedir)
                         if name.startswith(f"{NODE_HEALTH}."))
        hosts = [name.split(".", 1)[1] for name in reports]
        expected = self.num_tasks or 1
        if len(hosts) < expected:
            raise SanityError(f"dsenv doctor --node-health: {len(hosts)} of {expected} nodes "
                              f"reported ({', '.join(hosts) or 'none'}): "
                              f"{_tail(os.path.join(self.stagedir, self.stderr.evaluate()))}")
        failing = []
        for host, name in zip(hosts, reports, strict=True):
            with open(os.path.join(self.stagedir, name), encoding="utf-8",
                      errors="replace") as handle:
                failing += [f"{host}: {line.strip()}" for line in handle
                            if line.startswith("ERROR:")]
        if failing:
            raise SanityError("; ".join(failing))
        return True


class _DsenvWorkload(_DsenvCheck):
    """A workload's run: sanity is dsenv's sanity verdict, samples_per_s its throughput."""

    mode = "smoke"
    keep_files = [REPORT, PAGE]  # dsenv's report and its page beside ReFrame's output
    #: a site's references table (TOML, references.toml's layout), for ReFrame and dsenv
    references = variable(str, value="")

    def _command(self) -> list[str]:
        return [self._verb(), self.workload,
                "--preset", self.preset, "--report", REPORT, "--output-dir", "dsenv-output",
                *self._env_options(),
                *(["--references", os.path.abspath(self.references)] if self.references else []),
                *self.extra_options]

    def _verb(self) -> str:
        """The dsenv command: `dsenv smoke` or, for the full mode, `dsenv run`."""
        return "smoke" if self.mode == "smoke" else "run"

    @run_after("setup")
    def set_command(self):
        self._launch(self.launcher, self._command())

    def _report(self) -> dict:
        return _read_json(os.path.join(self.stagedir, REPORT), f"dsenv {self._verb()} "
                          f"{self.workload}", os.path.join(self.stagedir, self.stderr.evaluate()))

    @sanity_function
    def dsenv_sanity(self):
        report = self._report()
        verdict = next((v for v in report.get("verdicts", []) if v["name"] == "sanity"), None)
        if verdict is None:
            raise SanityError(f"dsenv {self._verb()} {self.workload}: no sanity verdict in "
                              f"{REPORT} (status {report.get('status')})")
        if verdict["status"] != "PASS":
            raise SanityError(f"dsenv {self._verb()} {self.workload}: sanity "
                              f"{verdict['status']}: {verdict['detail']}")
        return True

    @run_before("performance")
    def set_reference(self):
        """dsenv's reference for the device, world size and preset the run reports, as
        ReFrame's (value, lower, upper, unit): lower is minus dsenv's tolerance."""
        report = self._report()
        run = report.get("run", {})
        performance = next((v for v in report.get("verdicts", [])
                            if v["name"] == "performance"), {})
        if performance.get("status") == "INCONCLUSIVE":  # a busy node: dsenv judges nothing
            return
        table = load_references(self.references or None)
        found = find_reference(table, registry.reference_key(self.workload, self.mode),
                               str(run.get("device_type", "")), int(run.get("world_size", 1)),
                               report.get("batch", {}).get("preset", self.preset))
        if found is not None:
            self.reference = {"*": {"samples_per_s": (
                float(found["samples_per_s"]), -float(found.get("tolerance", 0.2)), None,
                "samples/s")}}

    @performance_function("samples/s")
    def samples_per_s(self):
        """Samples/s per device after the warm-up, the figure dsenv's references hold."""
        return float(self._report()["training"]["samples_per_s_per_device"])

    @performance_function("samples/s")
    def samples_per_s_total(self):
        return float(self._report()["training"]["samples_per_s"])


@rfm.simple_test
class DsenvSmoke(_DsenvWorkload):
    descr = "dsenv smoke: a bundled workload's tiny training run"
    tags = {"dsenv", "smoke"}
    mode = "smoke"
    workload = parameter(registry.smoke_names())
    preset = parameter(PRESETS)
    launcher = parameter(WORKLOAD_LAUNCHERS)


class DsenvFetch(rfm.RunOnlyRegressionTest):
    """The fixture of the full runs: ``dsenv fetch`` on a node with internet, or ``dsenv
    fetch --from BUNDLE`` where a bundle was made elsewhere."""

    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    descr = "dsenv fetch: the full runs' models and data into the offline cache"
    dsenv = variable(str, value="dsenv")
    #: the workloads whose assets to fetch ("all": every fetchable one)
    workloads = variable(typ.List[str], value=["all"])
    #: a bundle made by `dsenv fetch --cache-dir DIR` elsewhere, imported without network
    bundle = variable(str, value="")
    executable = "dsenv"

    @run_after("setup")
    def set_command(self):
        self.job.launcher = getlauncher("local")()
        self.executable = self.dsenv
        self.executable_opts = ["fetch", *(["--from", self.bundle] if self.bundle else []),
                                *self.workloads]

    @sanity_function
    def fetched(self):
        if self.job.exitcode == 0:
            return True
        said = _tail(os.path.join(self.stagedir, self.stderr.evaluate()))
        raise SanityError(f"dsenv fetch exited {self.job.exitcode}" + (f": {said}" if said
                                                                       else ""))


@rfm.simple_test
class DsenvRun(_DsenvWorkload):
    descr = "dsenv run: a bundled workload's full run from the offline cache"
    tags = {"dsenv", "full"}
    mode = "full"
    workload = parameter(registry.full_names())
    preset = parameter(PRESETS)
    launcher = parameter(WORKLOAD_LAUNCHERS)
    assets = fixture(DsenvFetch, scope="session")
    #: stop after N optimizer steps (0: the whole run)
    max_steps = variable(int, value=0)

    def _command(self) -> list[str]:
        steps = ["--max-steps", str(self.max_steps)] if self.max_steps else []
        return [*super()._command(), *steps]


@rfm.simple_test
class DsenvDistributed(_DsenvCheck):
    """``dsenv doctor --distributed``: every rank talks to every other; busbw measured."""

    descr = "dsenv doctor --distributed: rendezvous, exact all-reduce, bus bandwidth"
    tags = {"dsenv", "distributed"}
    launcher = parameter(("torchrun", "mpirun", "srun"))
    keep_files = [DOCTOR_REPORT, DOCTOR_PAGE]
    #: expected bus bandwidth in GB/s (default: the site profile's expect_busbw_gbps)
    expect_busbw = variable(float, value=0.0)
    doctor_options = variable(typ.List[str], value=[])

    @run_after("setup")
    def set_command(self):
        expect = ["--expect-busbw", str(self.expect_busbw)] if self.expect_busbw else []
        common = ["doctor", "--distributed", *self._env_options(), *expect,
                  *self.doctor_options, *self.extra_options, "--html", DOCTOR_PAGE, "--json"]
        if self.launcher == "srun":
            world = self.nodes * self.ranks_per_node
            self._launch("srun", [*common, "--expect-world-size", str(world)])
        else:  # the doctor starts the ranks on this node itself
            self._launch(ONE_PROCESS, [*common, "--launch", self.launcher,
                                       "-n", str(self.ranks_per_node)])
        self.executable_opts = [*self.executable_opts, ">", DOCTOR_REPORT]

    def _report(self) -> dict:
        return _read_json(os.path.join(self.stagedir, DOCTOR_REPORT), "dsenv doctor "
                          "--distributed", os.path.join(self.stagedir, self.stderr.evaluate()))

    @sanity_function
    def doctor_ready(self):
        return _doctor_verdict(self._report())

    @run_before("performance")
    def set_reference(self):
        """The expected busbw (site profile or -S expect_busbw) as ReFrame's reference; the
        lower bound is where the doctor's verdict turns to a failure (distributed.toml)."""
        expected = self._report().get("distributed", {}).get("expect_busbw_gbps")
        if expected:
            fail_below = load_table("dsenv.doctor", "distributed.toml")["verdict"]["warn_from"]
            self.reference = {"*": {"busbw": (float(expected), -(1.0 - fail_below), None,
                                              "GB/s")}}

    @performance_function("GB/s")
    def busbw(self):
        """Bus bandwidth at the largest all-reduce size (nccl-tests' busbw)."""
        return float(self._report()["distributed"]["allreduce"][-1]["busbw_gbps"])
