"""The command lines of ``dsenv provision`` (with ``dsenv provision openmpi``) and ``dsenv
lock``: argparse and the data files only, so that building them (``dsenv --help``) loads
nothing that provisioning needs. What runs them is command.py."""

from __future__ import annotations

from dsenv.argtypes import positive_float, positive_int
from dsenv.envs.sites import site_names
from dsenv.provision.openmpi.options import table
from dsenv.targetlock import add_wait_arguments

KINDS = ("venv", "container", "conda")
# How long a run waits for another run building the same prefix (an op build takes minutes
# on a CPU node, a CUDA one longer) before it says so in one line.
DEFAULT_WAIT = 3600.0


def add_parsers(subparsers) -> None:
    p = subparsers.add_parser(
        "provision", help="build a locked environment with DeepSpeed ops precompiled for a "
                          "GPU arch",
        description="Build a reproducible environment from a lock (venv with uv, a venv inside "
                    "a vendor container, or conda), precompile DeepSpeed's ops for the GPU "
                    "architecture, verify them, and write an activate script and a manifest. "
                    "Built beside --prefix and renamed into place at the end. Exit 0: done; "
                    "2: bad input or a failed step (one line).")
    p.add_argument("--arch", metavar="SPEC",
                   help="7.0, 8.0;9.0, sm_80, gfx90a, a GPU name (V100, A100, H100, MI250X...), "
                        "cpu, or auto (the GPUs of this node; default: the site's, else auto)")
    p.add_argument("--kind", choices=KINDS, help="environment kind (default: the site's)")
    p.add_argument("--site", choices=site_names(), help="site profile (default generic)")
    p.add_argument("--stack", metavar="NAME", help="software stack from envs/stacks.toml "
                                                   "(default: chosen from the arch)")
    p.add_argument("--ops", default="auto", metavar="auto|none|all|LIST",
                   help="DeepSpeed ops to precompile (default auto: every op DeepSpeed allows "
                        "for the arch that can be built here)")
    p.add_argument("--prefix", metavar="DIR", help="where the environment goes (default: "
                                                   "the site's env root, else ./dsenv-envs/"
                                                   "STACK-KIND)")
    p.add_argument("--lock", metavar="FILE",
                   help="install this lock instead of the stack's (e.g. ENV/dsenv-lock.txt: "
                        "a lock made on site, to rebuild that environment); a stack with no "
                        "committed lock is locked on site against its index")
    p.add_argument("--python", metavar="PY", help="interpreter the venv is based on (default: "
                                                  "this one; --kind container: the image's)")
    p.add_argument("--find-links", action="append", metavar="DIR",
                   help="local wheel folder (default: the stack's, when present)")
    p.add_argument("--index-url", metavar="URL", help="package index (default PyPI)")
    p.add_argument("--no-index", action="store_true",
                   help="install only from --find-links folders and uv's cache (offline)")
    p.add_argument("--no-bytecode", action="store_true",
                   help="do not write .pyc files at install (faster install, slower first "
                        "import)")
    p.add_argument("--no-toolkit-wheels", action="store_true",
                   help="when this node's nvcc cannot build the stack's CUDA ops, stop "
                        "instead of installing the stack's CUDA toolkit from NVIDIA's wheels")
    p.add_argument("--dry-run", action="store_true",
                   help="print the whole plan: arch variables, ops, every step, command "
                        "and variable (a missing lock as the step that locks on site); "
                        "write nothing")
    p.add_argument("--force", action="store_true", help="replace an existing --prefix")
    p.add_argument("--ops-cache", metavar="DIR|none",
                   help="keep and reuse built DeepSpeed wheels here (default: "
                        "$DSENV_OPS_CACHE, else the site's ops_cache, else "
                        "~/.cache/dsenv/ops-cache; none: build every time)")
    p.add_argument("--modulefile", metavar="DIR|none",
                   help="also write an Lmod modulefile DIR/NAME/VERSION.lua that sets what the "
                        "activate script sets (`module use DIR; module load NAME/VERSION`; "
                        "default: the site's modulefiles folder, else none)")
    p.add_argument("--module-name", metavar="NAME/VERSION",
                   help="the module's name (default dsenv-STACK/LOCKHASH8, GPU archs "
                        "appended)")
    add_wait_arguments(p, DEFAULT_WAIT, "--prefix")
    what = p.add_subparsers(dest="provision_what", metavar="WHAT", required=False,
                            title="also provisions (optional)")
    _add_openmpi_parser(what)

    lock = subparsers.add_parser(
        "lock", help="regenerate a stack's hashed lock (uv pip compile / conda-lock)",
        description="Resolve envs/requirements/STACK.in (venv) or envs/conda/STACK.yml (conda) "
                    "into a lock with hashes, written atomically into envs/.")
    lock.add_argument("--kind", choices=("venv", "conda"), default="venv")
    lock.add_argument("--stack", required=True, metavar="NAME")
    lock.add_argument("--find-links", action="append", metavar="DIR")
    lock.add_argument("--index-url", metavar="URL")
    lock.add_argument("--out", metavar="FILE", help="write here instead of envs/")
    lock.add_argument("--upgrade", action="store_true", help="re-resolve to newest versions")
    lock.add_argument("--conda", metavar="EXE", help="conda/mamba/micromamba for conda-lock")
    add_wait_arguments(lock, DEFAULT_WAIT, "lock file")


def _add_openmpi_parser(subparsers) -> None:
    data = table()
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
    add_wait_arguments(p, DEFAULT_WAIT, "EasyBuild install path")
