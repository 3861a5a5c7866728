"""``dsenv provision``: locked environments with DeepSpeed ops precompiled (issue #4).

How the pieces fit (each module has one job). ``dsenv provision`` reads as plan, then act:
its arguments become a Plan in one step (plan.py), printed for --dry-run or carried out in a
staging folder renamed into place at the end (build.py).

    parsers.py        the `dsenv provision` (and `openmpi`) / `dsenv lock` command lines:
                      argparse and data files only, light for `dsenv --help`
    command.py        running them: run_provision, run_openmpi, run_lock
    plan.py           arguments -> Plan: site, Target, Stack, lock, prefix, sources, steps;
                      checked before anything is written
    steps.py          the Plan's steps, each with the commands its builder will run
    build.py          Plan -> environment: install, ops, checks, activate, manifest, rename
    shown.py          a command as --dry-run prints it and the run logs it (`$ uv ...`)
    targets.py        --arch SPEC -> Target (`auto` through dsenv/facts' GPU inventory);
                      Target + this node's nvcc -> Stack (envs/stacks.toml), refusals with a
                      way out
    prefix.py         where the environment goes: --prefix resolved, the site's default, the
                      free space it needs
    uvcmd.py          running uv; Sources (where packages come from, a stack's included);
                      uv's errors as one line
    locks.py          `dsenv lock`: uv pip compile --generate-hashes per stack -> envs/locks/;
                      reading a lock
    venv.py           --kind venv: uv venv + uv pip sync --require-hashes from a lock
    container.py      --kind container: venv --system-site-packages inside a vendor image,
                      installing only what the image lacks
    verify/           a built environment checked:
      imports.py        every module of every locked package imports in the environment
      shared_libs.py    shared libraries the loader cannot find, each with its fix
    conda/            --kind conda:
      recipe.py         the recipes (envs/conda/) and the conda-lock.yml read
      locking.py        `dsenv lock --kind conda`: conda-lock with micromamba/mamba/conda
      install.py        installing a conda-lock.yml: every archive's sha256/md5 checked,
                        linked by py-rattler for the final prefix
      rattler.py        the linking subprocess (python -m dsenv.provision.conda.rattler)
      pip.py            the lock's pip packages through uv --require-hashes
    ops/              DeepSpeed's ops:
      builders.py       what the installed DeepSpeed's op builders say, asked in a subprocess
      reasons.py        why an op cannot be built: for the target, or on this node
      choose.py         --ops auto|none|all|LIST -> OpsChoice (ops to build, omitted ops with
                        their reasons)
      command.py        the ops build's commands, for the plan and the run alike
      build.py          DS_BUILD_<OP>=1 reinstall of deepspeed in the env (--no-build-isolation),
                        then installed_ops must equal the requested set
      cache.py          built ops wheels kept and reused across environments (--ops-cache)
      cuda.py           the CUDA toolkit an ops build uses (CUDA_HOME, or nvcc from wheels)
    record/           what a built environment records:
      settings.py       what activating the env sets, described once (site modules, the
                        env, TORCH_EXTENSIONS_DIR, archs, HF offline, NCCL/RCCL variables)
      activation.py     the env's activate script: those settings in POSIX sh
      modulefile.py     the env's Lmod modulefile (--modulefile DIR): the same settings in
                        Lua, whatis/help, the Open MPI module as depends_on
      manifest.py       the env's manifest (lock hash, arch, ops, versions, command, host,
                        date), read back by `dsenv doctor` to report drift

`dsenv provision openmpi` (an Open MPI that Slurm can launch, built by EasyBuild), openmpi/:

    provide.py         arguments -> OpenMpiBuild (checked before any write), then eb, the
                       Open MPI verdict (dsenv/verdicts/openmpi.py) on the result, the record
    options.py         the choices (toolchain, PMIx, source tarball, modules tool) against
                       envs/openmpi.toml
    easyconfig.py      OpenMpiBuild: EasyBuild's names, the easyconfig, the eb command
    eb_run.py          eb run offline with --sourcepath, output into a log, no leftovers
    record.py          the module lines in an environment's activate script and manifest

Errors are :class:`ProvisionError`: one line saying what is wrong and how to fix it.
"""

from dsenv.errors import DsenvError


class ProvisionError(DsenvError):
    """Bad input or a failed step: the message is one line with what is wrong and the fix."""
