"""``dsenv provision``: locked environments with DeepSpeed ops precompiled (issue #4).

How the pieces fit (each module has one job; command.py composes them into a plan, prints it
for --dry-run, or carries it out in a staging folder renamed into place at the end):

    targets.py     --arch SPEC -> Target (vendor, archs, GPU names, bf16), `auto` through the
                   doctor's GPU probes; Target + toolkit -> Stack (envs/stacks.toml: cpu, CUDA
                   and ROCm stacks, which torch build, which lock), refusals with a way out
    ops.py         --ops auto|none|all|LIST -> OpsChoice (ops to build, omitted ops with
                   their reasons), from the op builders of the deepspeed package itself
    locks.py       `dsenv lock`: uv pip compile --generate-hashes per stack -> envs/locks/
    venv.py        --kind venv: uv venv + uv pip sync --require-hashes from a lock
    container.py   --kind container: venv --system-site-packages inside a vendor image,
                   installing only what the image lacks; import and shared-library checks
    conda.py       --kind conda: conda-lock recipes (envs/conda/), install from
                   conda-lock.yml with hash checks (py-rattler), pip part through uv
    build_ops.py   DS_BUILD_<OP>=1 reinstall of deepspeed in the env (--no-build-isolation),
                   then installed_ops must equal the requested set
    activation.py  the env's activate script (site modules, HF offline, NCCL/RCCL variables,
                   TORCH_EXTENSIONS_DIR inside the env)
    manifest.py    the env's manifest (lock hash, arch, ops, versions, command, host, date),
                   read back by `dsenv doctor` to report drift
    command.py     the `dsenv provision` / `dsenv lock` commands
    openmpi.py     `dsenv provision openmpi`: an EasyBuild easyconfig for Open MPI with Slurm
                   and PMIx (envs/openmpi.toml), eb run offline with --sourcepath, the
                   doctor's verdict on the result, the module recorded in an environment
                   (command line in openmpi_cli.py)

Errors are :class:`ProvisionError`: one line saying what is wrong and how to fix it.
"""

from dsenv.errors import DsenvError


class ProvisionError(DsenvError):
    """Bad input or a failed step: the message is one line with what is wrong and the fix."""
