"""``dsenv provision openmpi``: an Open MPI that Slurm can launch, built by EasyBuild.

    --version --toolchain --pmix   -> OpenMpiBuild   (envs/openmpi.toml; the system's PMIx
                                                      found; the source in --sourcepath; eb,
                                                      Lmod and --env checked: before any write)
    OpenMpiBuild -> easyconfig (plain EasyBuild syntax) + the eb command
    --dry-run: print both, write nothing
    else: <installpath>/dsenv/<module>.eb and .log, eb (timeout, output into the log); a failed
          eb leaves no software folder or module file of this build behind; the built
          ompi_info is judged by the doctor's mpi.ompi-support check; the `module use` /
          `module load` lines are printed and, with --env, written into that environment's
          activate script and manifest.

Stock EasyBuild OpenMPI easyconfigs need a compiler toolchain and ~35 modules, and leave Slurm
out; this one builds with the system compiler and the system's PMIx (the one Slurm's
mpi_pmix plugin loads): 21.6 min on 2 busy cores here (bench/RESULTS.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from dsenv import proc, targetlock
from dsenv.facts.node import JobShape, Node
from dsenv.provision import ProvisionError
from dsenv.provision.openmpi.easyconfig import OpenMpiBuild
from dsenv.provision.openmpi.eb_run import installed_module, run_eb
from dsenv.provision.openmpi.options import (
    Source,
    contradictions,
    find_modules_tool,
    find_source,
    parse_pmix,
    parse_toolchain,
    table,
)
from dsenv.provision.openmpi.record import record_in_env
from dsenv.provision.prefix import resolve_prefix
from dsenv.provision.record.activation import ACTIVATE_NAME
from dsenv.provision.record.manifest import MANIFEST_NAME
from dsenv.verdicts.findings import Finding, Status
from dsenv.verdicts.openmpi import ompi_support

AS_ROOT_VARIABLE = "EASYBUILD_ALLOW_USE_AS_ROOT_AND_ACCEPT_CONSEQUENCES"


def make_build(args, env=None) -> OpenMpiBuild:
    """The parsed ``dsenv provision openmpi`` arguments -> OpenMpiBuild: every choice
    resolved and checked; nothing written (one line on bad input)."""
    env = dict(os.environ if env is None else env)
    data = table()
    dry_run = bool(args.ompi_dry_run or getattr(args, "dry_run", False))
    version = args.ompi_version or data["default_version"]
    if version not in data["versions"]:
        raise ProvisionError(f"--version {version}: dsenv knows Open MPI "
                             f"{', '.join(data['versions'])} (envs/openmpi.toml [versions])")
    entry = data["versions"][version]
    series = data["series"][entry["series"]]
    toolchain = parse_toolchain(args.toolchain or data["default_toolchain"])
    pmix = parse_pmix(args.pmix or data["default_pmix"], toolchain, env)
    configopts = [*series["configopts"], *toolchain.configopts, *pmix.configopts]
    clashes = contradictions(configopts)
    if clashes:
        raise ProvisionError("envs/openmpi.toml gives contradictory configure options: "
                             + "; ".join(clashes))
    # eb's own defaults: $EASYBUILD_INSTALLPATH / $EASYBUILD_SOURCEPATH, else under
    # $EASYBUILD_PREFIX, else ~/.local/easybuild
    eb_prefix = env.get("EASYBUILD_PREFIX") or os.path.join(env.get("HOME", "~"), ".local",
                                                            "easybuild")
    installpath = resolve_prefix(args.installpath or env.get("EASYBUILD_INSTALLPATH")
                                 or eb_prefix)
    sources = [Source(s["file"], s["sha256"], tuple(s["urls"]), s["get"])
               for s in entry["sources"]]
    sourcepaths = [Path(p).expanduser().absolute()
                   for p in (args.sourcepath or "").split(os.pathsep) if p]
    for folder in sourcepaths:
        if not folder.is_dir():
            raise ProvisionError(f"--sourcepath {folder}: no such folder")
    searched = sourcepaths or [Path(p).expanduser() for p in
                               (env.get("EASYBUILD_SOURCEPATH")
                                or os.path.join(eb_prefix, "sources")).split(os.pathsep) if p]
    source, found = find_source(sources, searched, data["name"])
    eb = args.eb or proc.which("eb", env)
    if eb and not (os.path.isfile(eb) and os.access(eb, os.X_OK)):
        raise ProvisionError(f"--eb {eb}: not an executable file")
    tool = find_modules_tool(env)
    env_prefix = None
    if args.env_prefix:
        env_prefix = Path(args.env_prefix).expanduser().absolute()
        missing = [name for name in (ACTIVATE_NAME, MANIFEST_NAME)
                   if not (env_prefix / name).is_file()]
        if missing:
            raise ProvisionError(f"--env {env_prefix}: no {' or '.join(missing)} there: pass "
                                 "an environment made by `dsenv provision` (its prefix)")
    build = OpenMpiBuild(
        version=version, series=series, toolchain=toolchain, pmix=pmix, sources=sources,
        source=source, source_found=found, sourcepaths=sourcepaths, installpath=installpath,
        eb=eb, modules_tool=tool, env_prefix=env_prefix, jobs=args.jobs, robot=args.robot,
        robot_paths=args.robot_paths or "", rebuild=args.rebuild,
        timeout_min=args.timeout or data["default_timeout_min"])

    problems = []
    if found is None and sourcepaths:
        names = " or ".join(s.file for s in sources)
        ways = "; ".join(f"{s.file}: {s.get}" for s in sources)
        problems.append(f"--sourcepath {os.pathsep.join(map(str, sourcepaths))} has no "
                        f"{names} (eb looks in DIR, DIR/{data['name']} and "
                        f"DIR/{data['name'][0].lower()}/{data['name']}): get it on a machine "
                        f"with internet ({ways}) and copy it there")
    if eb is None:
        problems.append("no `eb` on PATH: install EasyBuild (`pip install easybuild`, or "
                        "`module load EasyBuild`), or pass --eb EXE")
    if tool is None:
        problems.append("no Lmod for EasyBuild's modules (no $LMOD_CMD, no lmod in "
                        + ", ".join(data["lmod"]["commands"][:2]) + "): install Lmod "
                        "(Debian/Ubuntu: `apt-get install lmod`, RHEL: `dnf install Lmod`), "
                        "set LMOD_CMD to its libexec/lmod, or set EASYBUILD_MODULES_TOOL to "
                        "the site's modules tool")
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not env.get(AS_ROOT_VARIABLE):
        problems.append(f"running as root, which EasyBuild refuses: build as a normal user, "
                        f"or export {AS_ROOT_VARIABLE}=1 (containers, test machines)")
    if dry_run:
        build.notes += problems
    elif problems:
        raise ProvisionError(problems[0])
    if found is None and not sourcepaths:
        build.notes.append(f"no {source.file} in eb's source path ("
                           f"{os.pathsep.join(map(str, searched))}): eb downloads it, which "
                           "needs internet (offline nodes: --sourcepath DIR)")
    return build


def judge_install(build: OpenMpiBuild) -> Finding:
    """The mpi.ompi-support verdict on the built Open MPI (its bin first on PATH, as
    `module load` puts it), for a compute node about to run `srun --mpi=pmix`."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(build.software_dir / "bin"), env.get("PATH", "")])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(build.software_dir / "lib"), env.get("LD_LIBRARY_PATH", "")) if p)
    ctx = Node(wanted_target="compute", job=JobShape(launcher="srun"), probe_timeout=60,
                  env=env)
    return ompi_support(ctx)


def provision_openmpi(build: OpenMpiBuild, argv: list[str], wait: float | None = None) -> int:
    """Build (unless installed), judge and record; one run at a time per install folder: a
    second run waits for the first, then finds the module installed."""

    def say_wait(owner) -> None:
        print(targetlock.waiting_line(build.software_dir, owner), flush=True)

    # the lock sits beside the easyconfig in the install path's dsenv/ folder, which stays,
    # rather than in software/, which a failed build leaves as it found it
    with targetlock.hold(build.easyconfig_path, "dsenv provision openmpi", wait=wait,
                         on_wait=say_wait):
        return _provision_openmpi(build, argv)


def _provision_openmpi(build: OpenMpiBuild, argv: list[str]) -> int:
    existing = installed_module(build)
    if existing and not build.rebuild:
        print(f"{build.module_name} is already installed ({existing}); --rebuild builds it "
              "again")
    else:
        print(f"building {build.module_name} with eb (output: {build.log_path}) ...",
              flush=True)
        seconds = run_eb(build, argv)
        if installed_module(build) is None:
            raise ProvisionError(f"eb finished but wrote no module file at "
                                 f"{build.module_files()[0]}: does the site's EasyBuild "
                                 "configuration set another module naming scheme or modules "
                                 f"path? (see {build.log_path})")
        print(f"eb built {build.module_name} in {seconds:.0f} s")
    verdict = judge_install(build)
    print(f"doctor mpi.ompi-support: {verdict.status.value}: {verdict.summary}")
    for line in verdict.evidence:
        print(f"  {line}")
    if verdict.status is not Status.OK:
        raise ProvisionError(f"{build.module_name} is installed but the doctor judges it "
                             f"{verdict.status.value}: {verdict.summary}"
                             + (f" ({verdict.fix})" if verdict.fix else ""))
    if build.env_prefix:
        record_in_env(build, verdict, argv)
        print(f"recorded in {build.env_prefix}/activate and dsenv-env.json: "
              f"`. {build.env_prefix}/activate` loads {build.module_name}")
    print("load it with:")
    for line in build.module_lines():
        print(f"    {line}")
    entries = ", ".join(f'"{line.removeprefix("module ").removeprefix("load ")}"'
                        for line in build.module_lines())
    print(f"site profile (envs/sites/<site>.toml): modules = [{entries}]")
    return 0
