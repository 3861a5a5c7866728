"""The `dsenv provision openmpi` command line, apart from provision/openmpi.py so that
building the parser (`dsenv --help`) loads only argparse and the data file."""

from __future__ import annotations

from . import ProvisionError

ENV_OPTIONS = ("arch", "kind", "site", "stack", "prefix", "lock", "python", "find_links",
               "index_url")
ENV_FLAGS = ("no_index", "no_bytecode", "force")


def add_openmpi_parser(subparsers) -> None:
    from dsenv.argtypes import positive_float, positive_int
    from dsenv.data import load_table

    data = load_table("dsenv.envs", "openmpi.toml")
    p = subparsers.add_parser(
        "openmpi", help="build an Open MPI with Slurm and PMIx support with EasyBuild",
        description="Write an EasyBuild easyconfig for Open MPI configured --with-slurm and "
                    "with PMIx (the system's, an EasyBuild module, or the bundled one), build "
                    "it with eb (offline with --sourcepath), check its ompi_info with the "
                    "doctor, and print the module to load (with --env: written into that "
                    "environment's activate script and manifest). Exit 0: built (or already "
                    "installed) and judged ok; 2: bad input or a failed step (one line).")
    p.add_argument("--version", dest="ompi_version", metavar="V",
                   help=f"Open MPI version: {', '.join(data['versions'])} (default "
                        f"{data['default_version']})")
    p.add_argument("--toolchain", metavar="SYSTEM|NAME/VER",
                   help="SYSTEM (the OS compilers, default) or a site's EasyBuild compiler "
                        "toolchain, e.g. GCC/13.2.0")
    p.add_argument("--pmix", metavar="SPEC",
                   help="system (the PMIx Slurm uses, found with pkg-config; default), "
                        "system:DIR, eb:PMIx/4.2.6-GCCcore-13.2.0 (an EasyBuild module, needs a "
                        "compiler toolchain), or internal (bundled with Open MPI)")
    p.add_argument("--sourcepath", metavar="DIR[:DIR]",
                   help="where the source tarball is (offline compute nodes); default: eb's "
                        "source path, downloading when the tarball is not there")
    p.add_argument("--installpath", metavar="DIR",
                   help="EasyBuild install path: software/ and modules/all/ go there "
                        "(default $EASYBUILD_INSTALLPATH, else $EASYBUILD_PREFIX or "
                        "~/.local/easybuild, as eb)")
    p.add_argument("--robot", action="store_true",
                   help="let eb build missing dependencies (toolchain, PMIx module)")
    p.add_argument("--robot-paths", metavar="PATH[:PATH]",
                   help="easyconfig folders eb searches for dependencies")
    p.add_argument("--env", dest="env_prefix", metavar="PREFIX",
                   help="an environment made by `dsenv provision`: its activate script loads "
                        "the module and its manifest records it")
    p.add_argument("--eb", metavar="EXE", help="the eb command (default: eb on PATH)")
    p.add_argument("--jobs", type=positive_int, metavar="N",
                   help="parallel build jobs (eb --parallel; default: eb's, every core)")
    p.add_argument("--timeout", type=positive_float, metavar="MIN",
                   help=f"minutes eb may run (default {data['default_timeout_min']})")
    p.add_argument("--rebuild", action="store_true",
                   help="build again although the module exists")
    p.add_argument("--dry-run", dest="ompi_dry_run", action="store_true",
                   help="print the easyconfig and the eb command; write nothing")


def run_openmpi(args, argv: list[str]) -> int:
    from .openmpi import make_build, provision_openmpi

    given = [f"--{name.replace('_', '-')}" for name in ENV_OPTIONS if getattr(args, name, None)]
    given += [f"--{name.replace('_', '-')}" for name in ENV_FLAGS if getattr(args, name, False)]
    if given:
        raise ProvisionError(f"{', '.join(given)} belong to `dsenv provision` (Python "
                             "environments), not to `dsenv provision openmpi`: see "
                             "`dsenv provision openmpi --help`")
    build = make_build(args)
    if args.ompi_dry_run or args.dry_run:
        print(build.render())
        return 0
    for line in build.header():
        print(line)
    return provision_openmpi(build, argv)
