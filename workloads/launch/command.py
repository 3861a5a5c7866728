"""``dsenv launch WORKLOAD``: write (and with --submit, submit) a Slurm job script for a
bundled workload, or with --k8s a Kubeflow MPIJob manifest.

    add_launch_parser(subparsers)   # adds "launch" to dsenv's sub-commands
    run_launch(args) -> int         # 0 written (and submitted), 2 bad input / sbatch refused

The script is rendered by workloads/launch/jobscript.py from envs/launchers.toml, the manifest
by workloads/launch/mpijob.py; both are written atomically (a temporary file beside the target,
then a rename), so a failed launch leaves no half-written file. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

from dsenv import proc
from dsenv.argtypes import positive_float, positive_int
from dsenv.envs.launchers import LAUNCHERS
from dsenv.envs.mpi_launch import mpi_profile, working_plugins
from dsenv.envs.sites import Container, load_site
from dsenv.facts.host import mounts
from dsenv.facts.mpi import installation as mpi
from dsenv.facts.node import DEFAULT_PROBE_TIMEOUT, Node
from dsenv.redact import Redactor
from dsenv.staging import write_file_atomically
from dsenv.workloads import registry
from dsenv.workloads.cli import add_workload_parsers
from dsenv.workloads.errors import LaunchError
from dsenv.workloads.launch.jobscript import JobPlan, render_script, table
from dsenv.workloads.launch.mpijob import render_mpijob, to_yaml

_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.,@+-]+")
DEFAULT_SCRIPT_DIR = "dsenv-launch"
SLURM_OPTIONS = ("time", "account", "partition")
# sbatch reads these from the environment it runs in when the script has no such line
SBATCH_VARIABLES = {"time": "SBATCH_TIMELIMIT", "account": "SBATCH_ACCOUNT",
                    "partition": "SBATCH_PARTITION"}
# Folders that are node-local whatever the mount table says: a compute node has its own.
NODE_LOCAL_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm")


def add_launch_parser(subparsers) -> None:
    launch = subparsers.add_parser(
        "launch", help="write (and submit) a Slurm job script for a workload, or a Kubeflow "
                       "MPIJob",
        description="Write an sbatch script that loads the site's modules and variables, "
                    "activates the environment, sets the rendezvous from the allocation, runs "
                    "`dsenv doctor --target compute` as a preflight (its failure ends the job "
                    "before any rank starts) and starts `dsenv smoke WORKLOAD` (or `dsenv run` "
                    "with --full) under the chosen launcher. Arguments after `--` go to the "
                    "workload. Exit 0: written (and submitted); 2: bad input or sbatch refused.")
    launch.add_argument("workload", metavar="WORKLOAD",
                        help="a bundled workload: " + ", ".join(sorted(registry.smoke_names())))
    launch.add_argument("--nodes", type=positive_int, default=1, metavar="N",
                        help="nodes (default 1)")
    launch.add_argument("--gpus-per-node", type=positive_int, default=1, metavar="G",
                        help="GPUs per node: one rank each (default 1)")
    launch.add_argument("--cpu", action="store_true",
                        help="CPU ranks: G ranks per node without asking Slurm for GPUs "
                             "(DeepSpeed's CPU accelerator)")
    launch.add_argument("--cpus-per-rank", type=positive_int, default=1, metavar="C",
                        help="CPU cores per rank (default 1); OMP_NUM_THREADS follows")
    launch.add_argument("--launcher", choices=LAUNCHERS,
                        help="how ranks start (default: the site profile's launcher)")
    launch.add_argument("--container", metavar="RUNTIME:IMAGE",
                        help="run the ranks in this image: singularity:IMAGE, apptainer:IMAGE "
                             "or sarus:IMAGE (default: the site's, for container sites); "
                             "`none` for no container")
    launch.add_argument("--site", metavar="NAME", help="site profile (envs/sites/; default "
                                                       "generic)")
    launch.add_argument("--env", metavar="PREFIX",
                        help="a dsenv environment: its PREFIX/activate is sourced in the job")
    launch.add_argument("--account", metavar="A", help="#SBATCH --account")
    launch.add_argument("--partition", metavar="P", help="#SBATCH --partition")
    launch.add_argument("--time", metavar="T", help="#SBATCH --time (e.g. 00:30:00)")
    launch.add_argument("--job-name", metavar="NAME",
                        help="#SBATCH --job-name (default dsenv-WORKLOAD-LAUNCHER)")
    launch.add_argument("--full", action="store_true",
                        help="the full run (`dsenv run WORKLOAD`) instead of the smoke")
    launch.add_argument("--deepspeed-config", metavar="FILE",
                        help="a ds_config JSON for the workload; the preflight doctor checks "
                             "it against the planned world")
    launch.add_argument("--output-dir", metavar="DIR",
                        help="the workload's output folder; the job appends -JOBID (default "
                             "./dsenv-output/WORKLOAD-MODE-LAUNCHER)")
    launch.add_argument("--out", metavar="FILE",
                        help="where to write the script (default ./dsenv-launch/"
                             "WORKLOAD-LAUNCHER.sbatch, or WORKLOAD-mpijob.yaml with --k8s)")
    launch.add_argument("--print", dest="print_only", action="store_true",
                        help="print the script (or manifest) instead of writing a file")
    launch.add_argument("--submit", action="store_true", help="submit the script with sbatch")
    launch.add_argument("--sbatch-timeout", type=positive_float, default=60.0, metavar="S",
                        help="seconds sbatch may take to answer (default 60)")
    launch.add_argument("--probe-timeout", type=positive_float, default=DEFAULT_PROBE_TIMEOUT,
                        metavar="S", help="seconds each probe here may take (ompi_info for "
                        "srun's --mpi, a stat of the job's paths; default 10)")
    launch.add_argument("--k8s", action="store_true",
                        help="write a Kubeflow MPIJob (kubeflow.org/v2beta1) manifest instead")


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message):
        raise LaunchError(message)


def _check_workload_args(mode: str, workload: str, args: list[str]) -> None:
    """Parse the workload's arguments as `dsenv smoke|run` will, so a typo fails now and
    not in the queue; refuse the ones launch owns."""
    parser = _RaisingParser(prog="dsenv", add_help=False)
    add_workload_parsers(parser.add_subparsers(dest="command", parser_class=_RaisingParser))
    try:
        parsed = parser.parse_args([mode, workload, *args])
    except LaunchError as exc:
        raise LaunchError(f"arguments for `dsenv {mode} {workload}`: {exc}") from None
    defaults = parser.parse_args([mode, workload])
    for name, flag in (("output_dir", "--output-dir"), ("deepspeed_config", "--deepspeed-config")):
        if getattr(parsed, name) != getattr(defaults, name):
            raise LaunchError(f"give {flag} to `dsenv launch` itself, not after `--` (the job "
                              "script and its preflight use it)")


def _container(spec: str | None, site):
    if spec is None:
        return site.container if site.default_kind == "container" else None
    if spec == "none":
        return None
    runtime, sep, image = spec.partition(":")
    if not sep or not image:
        raise LaunchError(f"--container {spec!r}: write RUNTIME:IMAGE, e.g. "
                          "singularity:/scratch/images/pytorch.sif")
    return Container(runtime, image, site.container.binds if site.container else ())


def choose_srun_mpi(site, env, timeout: float = DEFAULT_PROBE_TIMEOUT) -> tuple[str, str]:
    """(plugin, why) for `srun --mpi=`: the site's srun_mpi, else the first plugin the
    doctor's launch rules (envs/mpi_launch.toml) say starts the MPI on PATH, else pmix."""
    if site.srun_mpi:
        return site.srun_mpi, f"site {site.name}'s srun_mpi"
    ctx = Node(wanted_target="login", probe_timeout=timeout, env=dict(env))
    install = mpi.mpi_install(ctx)
    if install is None:
        return "pmix", "no MPI on PATH here: pmix, Slurm's usual plugin"
    parsed = mpi.ompi_info(ctx)[0] if install.family == "openmpi" else None
    working = working_plugins(install, parsed)
    if working:
        return working[0], (f"{install.describe()}: rule [mpi.{mpi_profile(install, parsed)}] "
                            "of envs/mpi_launch.toml")
    return "pmix", f"no rule names a plugin that starts {install.describe()}: pmix"


def _absolute(path: str) -> str:
    """An absolute path without resolving symlinks (a site's /scratch link stays as typed)."""
    return os.path.abspath(os.path.expanduser(path))


def build_plan(args, env=None):
    """The JobPlan ``args`` ask for; LaunchError (one line) for anything impossible."""
    env = os.environ if env is None else env
    mode = "run" if args.full else "smoke"
    workloads = registry.full_names() if args.full else registry.smoke_names()
    if args.workload not in workloads:
        raise LaunchError(f"unknown workload {args.workload!r} for `dsenv {mode}`; choose one "
                          f"of {', '.join(sorted(workloads))}")
    site = load_site(args.site)  # UsageError (one line) for an unknown or broken site
    launcher = args.launcher or site.launcher
    if args.k8s:
        if launcher not in (None, "", "mpirun") and args.launcher:
            raise LaunchError(f"--k8s writes an MPIJob, whose launcher pod starts ranks with "
                              f"mpirun: drop --launcher {args.launcher}")
        launcher = "mpirun"
    if not launcher:
        raise LaunchError(f"--launcher is required (site {site.name} names none): one of "
                          f"{', '.join(LAUNCHERS)}")
    container = _container(args.container, site)
    runtimes = table()["container"]
    if container is not None and not args.k8s and container.runtime not in runtimes:
        raise LaunchError(f"container runtime {container.runtime!r} cannot run ranks in a "
                          f"Slurm job; use {', '.join(sorted(runtimes))} (or --container none)")
    spec = table()["launcher"][launcher]
    if container is not None and args.nodes > 1 and not spec["container_multi_node"]:
        raise LaunchError(f"--launcher {launcher} on {args.nodes} nodes reaches the other nodes "
                          "over pdsh/ssh, which cannot enter the container: use --launcher "
                          "mpirun, srun or torchrun")
    slurm = {}  # --account/--partition/--time, else the site profile's
    for name in SLURM_OPTIONS:
        value = getattr(args, name)
        given = f"--{name} {value!r}"
        if value is None and getattr(site, name):
            value = getattr(site, name)
            given = f"{name} = {value!r} of envs/sites/{site.name}.toml"
        if value is None or value == "":
            continue
        if name == "time" and not _TIME.fullmatch(value):
            raise LaunchError(f"{given} is not a Slurm time: minutes, MM:SS, HH:MM:SS or "
                              "D-HH[:MM[:SS]]")
        if name != "time" and not _SLURM_NAME.fullmatch(value):
            raise LaunchError(f"{given} is not a Slurm {name} name (letters, digits, "
                              "_ . , @ + -)")
        slurm[name] = value
    workload_args = list(getattr(args, "workload_args", None) or [])
    _check_workload_args(mode, args.workload, workload_args)

    if args.k8s:  # these name files inside the pods: nothing here can check them
        for flag, value in (("--env", args.env), ("--deepspeed-config", args.deepspeed_config),
                            ("--output-dir", args.output_dir)):
            if value and not os.path.isabs(value):
                raise LaunchError(f"{flag} {value}: with --k8s it is a path inside the pods "
                                  "(the image or a volume); give it absolute")
    env_prefix = None
    if args.env:
        env_prefix = _absolute(args.env)
        if container is None and not args.k8s and not Path(env_prefix, "activate").is_file():
            raise LaunchError(f"--env {args.env}: no activate script at {env_prefix}/activate; "
                              "give the PREFIX of an environment `dsenv provision` made")
    ds_config = None
    if args.deepspeed_config:
        ds_config = _absolute(args.deepspeed_config)
        if not args.k8s and not Path(ds_config).is_file():
            raise LaunchError(f"--deepspeed-config {args.deepspeed_config}: not a file; give "
                              "the path of your ds_config JSON")
    output_dir = _absolute(args.output_dir or
                           f"dsenv-output/{args.workload}-{mode}-{launcher}")
    # Slurm does not create the output's folder: the script's own (made when it is written),
    # or for --print the folder it was printed in
    job_output_dir = _absolute("." if args.print_only else
                               str(Path(args.out).parent) if args.out else DEFAULT_SCRIPT_DIR)
    if "%" in job_output_dir:
        raise LaunchError(f"{job_output_dir}: Slurm reads % in an output path as a pattern; "
                          "write the script in a folder without %")
    binds = ()
    if container is not None:
        if any(":" in p for p in (output_dir, env_prefix or "")):
            raise LaunchError("a path bound into the container cannot contain ':' (the "
                              "runtime's SOURCE:DESTINATION separator)")
        binds = tuple(p for p in (str(Path(output_dir).parent), env_prefix) if p)
    srun_mpi, origin = ("pmix", "")
    if launcher == "srun" and not args.k8s:
        srun_mpi, origin = choose_srun_mpi(site, env, args.probe_timeout)
    python = "python" if (env_prefix or container is not None) else sys.executable
    return JobPlan(
        workload=args.workload, mode=mode, launcher=launcher, nodes=args.nodes,
        ranks_per_node=args.gpus_per_node, site=site, python=python, output_dir=output_dir,
        job_output_dir=job_output_dir, on_gpus=not args.cpu, cpus_per_rank=args.cpus_per_rank,
        container=container, env_prefix=env_prefix, workload_args=tuple(workload_args),
        deepspeed_config=ds_config,
        job_name=args.job_name or f"dsenv-{args.workload}-{launcher}",
        account=slurm.get("account"), partition=slurm.get("partition"),
        time=slurm.get("time"),
        srun_mpi=srun_mpi, srun_mpi_origin=origin,
        command_line=Redactor(env).scrub(shlex.join(["dsenv", *getattr(args, "argv", [])])),
        extra_binds=binds, doctor_python=sys.executable if env_prefix else "")


def _or_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def unset_slurm_line(plan: JobPlan, env) -> str | None:
    """One line when the script asks Slurm for no time limit, account or partition (neither
    the options nor the site profile gave one, nor sbatch's SBATCH_* variables here): the
    cluster's defaults then decide, often a short time limit or a refusal."""
    missing = [name for name in SLURM_OPTIONS
               if not getattr(plan, name) and not env.get(SBATCH_VARIABLES[name])]
    if not missing:
        return None
    flags = [f"--{name}" for name in missing]
    return (f"dsenv launch: the job script sets no {_or_list(flags)} (site {plan.site.name} "
            f"names none): Slurm applies the cluster's defaults, which may refuse the job or "
            f"end it early; add {'/'.join(flags)} or set them in your site's profile "
            f"(envs/sites/{plan.site.name}.toml)")


def node_local(node: Node, path: str) -> str | None:
    """Why ``path`` is node-local (a compute node has its own copy, out of reach after the
    job), or None: under /tmp, /var/tmp or /dev/shm, or on a local file system by the mount
    table (tmpfs, a local disk; not NFS, Lustre, GPFS, BeeGFS, ...)."""
    # realpath stats each part of the path: only where its file system answers
    real = os.path.realpath(path) if mounts.answers(node, path) else path
    for candidate in dict.fromkeys((path, real)):
        for folder in NODE_LOCAL_FOLDERS:
            if candidate == folder or candidate.startswith(folder + "/"):
                return f"under {folder}"
    mount = mounts.mount_for(node, path)
    if mount is not None and not mount.shared:
        return f"{mount.fstype} on {mount.point}, a local file system"
    return None


def path_lines(plan: JobPlan, print_only: bool, env,
               timeout: float = DEFAULT_PROBE_TIMEOUT) -> list[str]:
    """Warning lines about the paths the job writes or reads: those that gave no answer to a
    stat here (a file server that stopped answering: the job would hang on them too), and
    those that are node-local."""
    node = Node(wanted_target="login", probe_timeout=timeout, env=dict(env))
    paths = [("job log (#SBATCH --output)", f"{plan.job_output_dir}/%x-%j.out",
              "run --print from there" if print_only else "--out"),
             ("output dir", plan.output_dir, "--output-dir")]
    if plan.env_prefix:
        paths.append(("environment", plan.env_prefix, "--env"))
    if plan.deepspeed_config:
        paths.append(("ds_config", plan.deepspeed_config, "--deepspeed-config"))
    # the job log's name holds Slurm's %x-%j: its folder is what is there to look at
    folder = {label: os.path.dirname(path) if "log" in label else path
              for label, path, _ in paths}
    lines = [f"dsenv launch: warning: {problem}; a job touching it hangs there too: ask the "
             f"site about the mount, or choose another with {flag}"
             for label, _, flag in paths
             if (problem := mounts.unanswered(node, folder[label], label))]
    local = [(label, path, flag, why) for label, path, flag in paths
             if (why := node_local(node, folder[label]))]
    if local:
        named = ", ".join(f"{label} {path} ({why})" for label, path, _, why in local)
        flags = list(dict.fromkeys(flag for _, _, flag, _ in local))
        lines.append(f"dsenv launch: warning: node-local paths, which a job on another node "
                     f"cannot share with you: {named}; keep them on a shared file system "
                     f"(home, project, scratch): {', '.join(flags)}")
    return lines


def submit(script: Path, timeout: float) -> str:
    """sbatch the script from its folder; the job id, or LaunchError with sbatch's reason."""
    result = proc.run(["sbatch", "--parsable", str(script)], timeout=timeout,
                      cwd=str(script.parent))
    if result.not_found:
        raise LaunchError(f"sbatch not found on PATH: run this on a Slurm login node, or "
                          f"submit {script} yourself")
    if result.timed_out:
        raise LaunchError(f"sbatch did not answer within {timeout:.0f} s (slurmctld down?); "
                          f"{script} is written, submit it later")
    job_id = result.stdout.strip().split(";")[0]
    if result.returncode != 0 or not job_id.isdigit():
        reason = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise LaunchError(f"sbatch refused {script}: {reason[-1] if reason else 'no reason'} "
                          f"(exit {result.returncode})")
    return job_id


def split_workload_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``dsenv launch ... -- ARGS``: (dsenv's own arguments, the workload's ARGS). argparse
    cannot take options after a positional list, so the split happens before parsing."""
    if "--" not in argv or "launch" not in argv[:argv.index("--")]:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def run_launch(args, argv: list[str] | None = None) -> int:
    """``argv``: the command line as typed (for the script's header)."""
    args.argv = argv if argv is not None else []
    if args.print_only and args.submit:
        raise LaunchError("--print writes no file to submit: drop --print or --submit")
    if args.k8s and args.submit:
        raise LaunchError("--submit runs sbatch; apply an MPIJob with `kubectl apply -f "
                          "FILE`")
    plan = build_plan(args)
    notes = []  # said once the script is out: a command that fails ends in its one line
    if not args.k8s:  # a manifest names paths inside the pods and asks Slurm nothing
        notes = [line for line in (unset_slurm_line(plan, os.environ),
                                   *path_lines(plan, args.print_only, os.environ,
                                              args.probe_timeout)) if line]
    if args.k8s:
        text = to_yaml(render_mpijob(plan, args.output_dir, args.job_name))
        default = f"{plan.workload}-mpijob.yaml"
    else:
        text = render_script(plan)
        default = f"{plan.workload}-{plan.launcher}.sbatch"
    if args.print_only:
        sys.stdout.write(text)
    else:
        path = Path(_absolute(args.out or f"{DEFAULT_SCRIPT_DIR}/{default}"))
        write_file_atomically(path, text, 0o644 if args.k8s else 0o755)
        print(path)
        if args.submit:
            print(f"submitted job {submit(path, args.sbatch_timeout)}")
    sys.stdout.flush()
    for line in notes:
        print(line, file=sys.stderr)
    return 0
