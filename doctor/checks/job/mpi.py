"""mpi: which MPI, how Open MPI was built, what srun offers, whether the launcher can start
this MPI (the PMI crash and the silent-singletons case, predicted before submission), mpi4py."""

from __future__ import annotations

import os
import sys

from dsenv.doctor.catalogue import mode_finding
from dsenv.doctor.context import Context
from dsenv.doctor.registry import check
from dsenv.envs.mpi_launch import (
    PLUGIN_ORDER,
    launch_table,
    mpi_profile,
    mpirun_outcome,
    srun_outcome,
)
from dsenv.facts.launch import slurm
from dsenv.facts.mpi import installation as mpi
from dsenv.facts.mpi import launch_probe as mpi_launch_probe
from dsenv.facts.mpi import mpi4py_abi
from dsenv.facts.python import target_env
from dsenv.verdicts import openmpi as ompi_verdict
from dsenv.verdicts.findings import Finding, fail, info, ok, skip, warn

PROVISION_FIX = ompi_verdict.PROVISION_FIX


def _severe(ctx: Context):
    return fail if ctx.is_compute else warn


# -- mpi.implementation ------------------------------------------------------------------------


@check("mpi.implementation", "MPI implementation")
def implementation(ctx: Context):
    install = mpi.mpi_install(ctx)
    if install is None:
        if ctx.options.launcher == "mpirun":
            return _severe(ctx)("--launcher mpirun but no mpirun/mpiexec on PATH",
                                "`module load openmpi` (or your site's MPI module), or "
                                "`dsenv provision openmpi`")
        return info(f"{mpi.NO_MPI} (mpirun/mpiexec not found, no cray-mpich module)")
    if install.family == "unknown":
        return warn(f"{install.launcher} is not an MPI dsenv recognises",
                    "put Open MPI, MPICH or Intel MPI first on PATH (`module load openmpi`)",
                    *install.evidence)
    where = f" ({install.launcher})" if install.launcher else ""
    evidence = list(install.evidence)
    cray = mpi.cray_mpich(ctx.env)
    if cray and install.family != "craympich":
        evidence.append(f"cray-mpich module also loaded: {cray[1]}")
    return ok(f"{install.describe()}{where}", *evidence)


# -- mpi.ompi-support -----------------------------------------------------------------------------


@check("mpi.ompi-support", "Open MPI Slurm/PMIx support")
def ompi_support(ctx: Context):
    return ompi_verdict.ompi_support(ctx)


# -- mpi.srun-plugins ------------------------------------------------------------------------------


@check("mpi.srun-plugins", "srun MPI plugins")
def srun_plugins(ctx: Context):
    if not ctx.which("srun"):
        return skip("srun not found on PATH")
    listing, how = slurm.srun_mpi_list(ctx)
    if listing is None:
        return (warn if ctx.is_compute else info)(
            f"srun cannot list its MPI plugins: {how}",
            *(["point SLURM_CONF at the cluster's slurm.conf, or run on a Slurm login node"]
              if ctx.is_compute else []))
    chosen, origin = slurm.srun_mpi_type(ctx)
    evidence = [f"{how}: " + ", ".join(listing.plugins + listing.pmix_versions),
                f"plugin in use: {chosen} ({origin})"]
    kinds = listing.kinds
    if slurm.normalize_plugin(chosen) not in kinds:
        summary = f"srun will use --mpi={chosen}, which this Slurm does not offer"
        here = f"export SLURM_MPI_TYPE={_first_offered(kinds)}"
        if slurm.normalize_plugin(chosen) == "pmix":
            return mode_finding(_severe(ctx), "mpi.srun-pmix-plugin-missing", summary,
                                *evidence, here=here)
        return _severe(ctx)(summary, here, *evidence)
    if "pmix" in kinds:
        lib = slurm.find_pmix_library(ctx)
        if lib.plugin:
            evidence.append(f"pmix plugin: {lib.plugin}")
        if lib.found is None:
            finding = _severe(ctx) if slurm.normalize_plugin(chosen) == "pmix" else warn
            return mode_finding(finding, "mpi.srun-pmix-plugin-missing",
                                "srun lists pmix, but the PMIx library its plugin loads is "
                                "missing: `srun --mpi=pmix` fails (\"can not load PMIx library\")",
                                *evidence, "looked for: " + ", ".join(lib.wanted),
                                here="`apt-get install libpmix-dev` provides "
                                + " or ".join(lib.wanted) if lib.wanted else ())
        evidence.append(f"PMIx library: {lib.found}")
    return ok("srun offers " + ", ".join(sorted(kinds)) + f"; in use: {chosen}", *evidence)


def _first_offered(kinds) -> str:
    return next((p for p in PLUGIN_ORDER if p in kinds), "none")


# -- mpi.launch --------------------------------------------------------------------------------------


def _chosen_launcher(ctx: Context) -> tuple[str | None, str]:
    if ctx.options.launcher:
        return ctx.options.launcher, "--launcher"
    if ctx.env.get("SLURM_JOB_ID"):
        return "srun", "inside a Slurm allocation"
    if ctx.which("srun"):
        return "srun", "srun is on PATH"
    return None, ""


def _verdict(ctx: Context, status: str, explicit: bool):
    if status == "ok":
        return ok
    if status == "fail":
        return fail if explicit or ctx.is_compute else warn
    return warn


@check("mpi.launch", "Launcher can start this MPI")
def launch(ctx: Context):
    launcher, why = _chosen_launcher(ctx)
    if launcher is None:
        return skip("no --launcher given, no Slurm allocation and no srun on PATH")
    if launcher in ("deepspeed", "torchrun"):
        return info(f"{launcher} starts ranks itself (RANK/WORLD_SIZE/MASTER_ADDR): MPI is not "
                    "needed to start them")
    install = mpi.mpi_install(ctx)
    if install is None:
        if launcher == "mpirun":
            return mode_finding(_severe(ctx), "mpi.mpirun-not-on-path",
                                "--launcher mpirun but no mpirun on PATH",
                                here="`module load openmpi`, or `dsenv provision openmpi`")
        return skip(f"{mpi.NO_MPI}: srun starts plain processes")
    table = launch_table()
    parsed = mpi.ompi_info(ctx)[0] if install.family == "openmpi" else None
    profile = mpi_profile(install, parsed)
    row = table["mpi"].get(profile, {})
    explicit = why == "--launcher"
    subject = f"{install.describe()} started by {launcher}"
    if launcher == "mpirun":
        outcome = mpirun_outcome(row, parsed)
        says = table["outcomes"][outcome]["says"]
        status = table["outcomes"][outcome]["status"]
        fix = "`dsenv provision openmpi` (Open MPI configured --with-slurm --with-pmix)"
        missing = _root_refusal(ctx, row)
        if status == "ok" and missing:
            return mode_finding(warn, "mpi.run-as-root",
                                f"{subject} as root: mpirun refuses to start ranks unless "
                                f"{' and '.join(missing)} are set (or --allow-run-as-root is "
                                "given)", f"launcher chosen: {why}",
                                here="`export " + " ".join(f"{m}=1" for m in missing)
                                + "` in the job, or run as a normal user")
        return _verdict(ctx, status, explicit)(f"{subject}: {says}", *([fix] if status != "ok" else []),
                                               f"launcher chosen: {why}")
    return _srun_verdict(ctx, install, parsed, row, table, explicit, subject, why)


def _root_refusal(ctx: Context, row: dict) -> list[str]:
    """The variables an MPI wants before it starts ranks as root (none when not root)."""
    if os.geteuid() != 0:
        return []
    return [name for name in row.get("root_needs", ()) if ctx.env.get(name) != "1"]


def _srun_verdict(ctx, install, parsed, row, table, explicit, subject, why) -> Finding:
    chosen, origin = slurm.srun_mpi_type(ctx)
    plugin = slurm.normalize_plugin(chosen)
    listing = slurm.srun_mpi_list(ctx)[0] if ctx.which("srun") else None
    offered = listing.kinds if listing else None
    evidence = [f"launcher chosen: {why}", f"srun plugin: --mpi={chosen} ({origin})",
                f"rule: [mpi.{mpi_profile(install, parsed)}] in envs/mpi_launch.toml"]
    if offered is not None:
        evidence.append("srun offers: " + ", ".join(sorted(offered)))
    outcome, reason = srun_outcome(row, plugin, parsed)
    evidence.append(reason)
    says = table["outcomes"][outcome]["says"]
    if outcome == "ok" and offered is not None and plugin not in offered:
        outcome, says = "fails", f"this Slurm has no --mpi={chosen} plugin"
    if outcome == "ok" and plugin == "pmix" and offered is not None:
        lib = slurm.find_pmix_library(ctx)
        if lib.found is None:
            outcome, says = "fails", ("srun lists pmix but its PMIx library is missing: "
                                      "\"can not load PMIx library\"")
            evidence.append("looked for: " + ", ".join(lib.wanted))
    spec = table["outcomes"][outcome]
    summary = f"{subject} --mpi={chosen}: {says}"
    if spec["status"] == "ok":
        return ok(summary, *evidence)
    verdict = _verdict(ctx, spec["status"], explicit)
    fix = _srun_fix(row, parsed, plugin, offered)
    if outcome == "crash":  # "OMPI was not built with SLURM's PMI support"
        return mode_finding(verdict, "mpi.ompi-no-slurm-pmi", summary, *evidence, here=fix)
    if outcome == "singletons":
        return mode_finding(verdict, "mpi.srun-singletons", summary, *evidence, here=fix)
    return verdict(summary, fix, *evidence)


def _srun_fix(row: dict, parsed, plugin: str, offered) -> str:
    better = [p for p in PLUGIN_ORDER if p != plugin and srun_outcome(row, p, parsed)[0] == "ok"
              and (offered is None or p in offered)]
    if better:
        return f"`srun --mpi={better[0]}` (or `export SLURM_MPI_TYPE={better[0]}` in the job script)"
    return PROVISION_FIX


# -- mpi.launch-probe ------------------------------------------------------------------------------

PROBE_SAYS = {"crash": "the ranks failed to start",
              "hung": "the ranks did not finish within the timeout (a rank waits for a peer "
                      "that never came)",
              "wrong-size": "the ranks saw a world that is not the 2 ranks launched"}


@check("mpi.launch-probe", "Real 2-rank launch (--probe)")
def launch_probe(ctx: Context):
    if not ctx.options.probe:
        return skip("not asked (`dsenv doctor --probe` launches 2 real ranks to confirm "
                    "mpi.launch)")
    launcher, why = _chosen_launcher(ctx)
    if launcher not in ("srun", "mpirun"):
        return skip(f"--probe tests srun/mpirun launches; the launcher is {launcher or 'unknown'}")
    if launcher == "srun" and not ctx.env.get("SLURM_JOB_ID"):
        return skip("outside an allocation srun would queue a new job: run `dsenv doctor "
                    "--probe` inside one (`salloc -n 2`, or in the job script)")
    path = ctx.which(launcher)
    if path is None:
        return skip(f"{launcher} not found on PATH")
    if mpi4py_abi.mpi4py_info(ctx) is None:
        return skip("mpi4py is not installed: the probe's ranks need it to call MPI_Init")
    plugin = slurm.srun_mpi_type(ctx)[0] if launcher == "srun" else None
    python = target_env.environment(ctx).python or sys.executable  # the job's interpreter
    argv = mpi_launch_probe.probe_command(launcher, path, python, plugin)
    result = ctx.run(argv)
    outcome, ranks, detail = mpi_launch_probe.classify_launch(
        result.returncode, result.stdout, result.stderr, result.timed_out)
    shown = " ".join(argv[:-2] + ["-c", "<rank printer>"])
    predicted = launch(ctx)
    evidence = [f"`{shown}` ({why}), {result.seconds:.1f} s", detail,
                f"predicted by mpi.launch: {predicted.status.value}: {predicted.summary}",
                *(f"rank {r.get('rank')} of {r.get('size')} on {r.get('host')}: "
                  f"{r.get('library')}" for r in ranks)]
    if outcome == "ok":
        return ok(f"{launcher} started 2 ranks that found each other", *evidence)
    says = PROBE_SAYS.get(outcome) or launch_table()["outcomes"][outcome]["says"]
    return fail(f"{launcher} --probe: {says} ({detail})", predicted.fix or PROVISION_FIX,
                *evidence)


# -- mpi.mpi4py -------------------------------------------------------------------------------------

REBUILD_FIX = "MPICC=mpicc pip install --no-binary mpi4py --force-reinstall mpi4py"


@check("mpi.mpi4py", "mpi4py matches mpirun")
def mpi4py_check(ctx: Context):
    found = mpi4py_abi.mpi4py_info(ctx)
    if found is None:
        if ctx.options.launcher in ("srun", "mpirun"):
            return warn("mpi4py is not installed: DeepSpeed's MPI discovery (no RANK/WORLD_SIZE "
                        "in the environment) needs it", REBUILD_FIX)
        return skip("mpi4py is not installed")
    name = f"mpi4py {found.version or '?'}"
    evidence = [f"location: {found.location}",
                "variants: " + ", ".join(v or "single build" for v in found.variants),
                f"selected by: {found.how}" if found.how else ""]
    evidence = [e for e in evidence if e]
    if found.problem:
        return _severe(ctx)(f"{name}: {found.problem}", REBUILD_FIX, *evidence)
    install = mpi.mpi_install(ctx)
    lib = f"{found.libmpi} ({found.abi} ABI)" if found.libmpi else f"{found.abi} ABI"
    if found.libmpi is None:
        return mode_finding(_severe(ctx), "loader.mpi-other-abi",
                            f"{name} loads no libmpi ({found.abi} variant: not found)", *evidence)
    if install is None or install.abi is None:
        return info(f"{name} uses {lib}; no mpirun on PATH to compare with", *evidence)
    evidence.append(f"mpirun: {install.describe()} in {install.prefix or '?'}")
    if found.abi != install.abi:
        here = (f"export MPI4PY_MPIABI={install.abi} (with {install.prefix or 'the MPI'}/lib on "
                "LD_LIBRARY_PATH): this mpi4py has that variant"
                if install.abi in found.variants else ())
        return mode_finding(_severe(ctx), "mpi.mpi4py-other-mpi",
                            f"{name} loads {lib} but mpirun is {install.describe()}: ranks "
                            "start as singletons or crash in MPI_Init", *evidence, here=here)
    real = os.path.realpath(found.libmpi)
    if install.prefix and not real.startswith(install.prefix.rstrip("/") + "/"):
        return warn(f"{name} loads {real}, outside {install.describe()}'s prefix "
                    f"{install.prefix}: two installs of the same MPI family",
                    f"put {install.prefix}/lib first on LD_LIBRARY_PATH, or {REBUILD_FIX}",
                    *evidence)
    return ok(f"{name} uses {lib}, the same MPI as mpirun ({install.describe()})", *evidence)
