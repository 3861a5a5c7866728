"""The causes the doctor's checks now tell apart, each reported as its catalogue mode with the
mode's fix (doctor/modes/*.toml) and this node's specifics as "here:" lines (issue 24, item 5):
real files, real commands on PATH, real sockets; the cases that are healthy stay ok."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dsenv.doctor import catalogue
from dsenv.doctor.checks.job.launch_hosts import _ssh_mode
from dsenv.doctor.checks.software import torch_build
from dsenv.facts.gpu.inventory import Gpu, visible_gpus
from dsenv.facts.python import torch_info as tp
from dsenv.facts.python.torch_info import TorchBuild
from dsenv.verdicts.findings import Status
from tests.harness.findings import here
from tests.harness.recorded import fixture_text
from tests.harness.sysfs import ibstat_to_sysfs


def _names(result, mode_id: str) -> None:
    assert result.mode == mode_id, result
    assert result.fix == catalogue.fix_for(mode_id)


def _script(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


# -- toolkit.compiler: a gcc newer than nvcc's host_config.h allows ---------------------------


def test_gcc_newer_than_nvcc_accepts_is_named_and_ccbin_clears_it(tmp_path, make_ctx, run_one):
    cuda = tmp_path / "cuda-12.1"
    _script(cuda / "bin", "nvcc", "echo 'Cuda compilation tools, release 12.1, V12.1.105'\n")
    (cuda / "include" / "crt").mkdir(parents=True)
    (cuda / "include" / "crt" / "host_config.h").write_text(  # as CUDA 12.1 ships it
        "#if defined(__GNUC__)\n#if __GNUC__ > 12\n#error -- unsupported GNU version! gcc "
        "versions later than 12 are not supported!\n#endif\n#endif\n")
    bin_dir = tmp_path / "bin"
    _script(bin_dir, "c++", "echo 'c++ (GCC) 14.2.0'\n")
    _script(bin_dir, "ninja", "echo 1.11.1\n")
    env = {"PATH": str(bin_dir), "CUDA_HOME": str(cuda), "HOME": str(tmp_path)}
    result = run_one("toolkit.compiler", make_ctx(env=env))
    assert result.status is Status.WARN and "newer than nvcc accepts (gcc 12" in result.summary
    _names(result, "jit.gcc-too-new-for-nvcc")
    assert "CXX=g++-12" in here(result)
    told = run_one("toolkit.compiler", make_ctx(env={**env, "NVCC_PREPEND_FLAGS": "-ccbin g++-12"}))
    assert told.status is Status.OK, told
    _script(bin_dir, "c++", "echo 'c++ (GCC) 12.3.0'\n")
    assert run_one("toolkit.compiler", make_ctx(env=env)).status is Status.OK


# -- toolkit.compiler: a g++ older than the judged torch builds extensions with --------------


def test_gcc_older_than_torch_accepts_is_named_from_torchs_own_table(tmp_path, make_ctx,
                                                                     run_one):
    """The minimum comes from the installed torch's utils/cpp_extension.py (its CUDA row, else
    MINIMUM_GCC_VERSION), never from a table of ours: RHEL 7's g++ 4.8.5 fails against this
    CPU torch (minimum 5.0.0); g++ 5.4.0 passes it but fails against CUDA 11.6's row
    (6.0.0); g++ 12 passes both; no torch, nothing to compare."""
    import torch
    location = str(Path(torch.__file__).parent)
    bin_dir = tmp_path / "bin"
    _script(bin_dir, "ninja", "echo 1.11.1\n")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}

    def compiler(version: str, build: TorchBuild | None):
        _script(bin_dir, "c++", f"echo 'c++ (GCC) {version}'\n")
        ctx = make_ctx(env=env, target="compute")
        ctx.memo(tp.torch_build.memo_key, lambda: build or TorchBuild(None))
        return run_one("toolkit.compiler", ctx)

    cpu = TorchBuild("2.13.0+cpu", location=location)
    cu116 = TorchBuild("2.13.0+cu116", cuda="11.6", location=location)
    old = compiler("4.8.5 20150623 (Red Hat 4.8.5-44)", cpu)
    assert old.status is Status.FAIL and "older than torch 2.13.0+cpu" in old.summary, old
    assert "(g++ 5.0.0 or newer)" in old.summary
    _names(old, "toolkit.gcc-too-old-for-torch")
    assert "module load gcc" in here(old)
    assert compiler("5.4.0", cpu).status is Status.OK
    five = compiler("5.4.0", cu116)
    assert five.status is Status.FAIL and "(g++ 6.0.0 or newer)" in five.summary
    assert compiler("12.3.0", cu116).status is Status.OK
    assert compiler("4.8.5", None).status is Status.OK  # no torch to build against


# -- comm.infiniband: ports without a loadable libibverbs --------------------------------------


def test_rdma_ports_without_libibverbs_are_named(tmp_path, make_ctx, run_one):
    root = tmp_path / "root"
    ibstat_to_sysfs(fixture_text("comm/ibstat-ib-active.txt"), root)
    bin_dir = tmp_path / "bin"
    _script(bin_dir, "ldconfig", "echo '1 libs found in cache'\n")  # a cache without it
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    result = run_one("comm.infiniband", make_ctx(env=env, root=root, target="compute"))
    assert result.status is Status.FAIL and "libibverbs.so.1 cannot be loaded" in result.summary
    _names(result, "comm.ibverbs-unloadable")
    lib = tmp_path / "rdma"
    lib.mkdir()
    (lib / "libibverbs.so.1").write_bytes(b"")
    found = run_one("comm.infiniband", make_ctx(env={**env, "LD_LIBRARY_PATH": str(lib)},
                                                root=root, target="compute"))
    assert found.status is Status.OK, found


# -- system.slurm: srun drops --cpus-per-task ---------------------------------------------------


def test_batch_step_without_srun_cpus_per_task_is_named(make_ctx, run_one):
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_CPUS_PER_TASK": "8",
           "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "4"}
    result = run_one("system.slurm", make_ctx(env=env, target="compute"))
    assert result.status is Status.WARN and "SRUN_CPUS_PER_TASK is unset" in result.summary
    _names(result, "job.srun-cpus-per-task-dropped")
    assert here(result) == "export SRUN_CPUS_PER_TASK=8"
    fixed = run_one("system.slurm", make_ctx(env={**env, "SRUN_CPUS_PER_TASK": "8"},
                                             target="compute"))
    assert fixed.status is Status.OK and not fixed.mode
    in_step = run_one("system.slurm", make_ctx(env={**env, "SLURM_STEP_ID": "0"},
                                               target="compute"))
    assert in_step.status is Status.OK  # srun already started this step with its CPUs


# -- system.container: Apptainer without --nv -----------------------------------------------------


def test_apptainer_with_gpus_but_no_bound_driver_is_named(tmp_path, make_ctx, run_one):
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    (root / "dev" / "nvidia0").write_bytes(b"")
    (root / ".singularity.d" / "libs").mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "APPTAINER_CONTAINER": "/scratch/train.sif"}
    result = run_one("system.container", make_ctx(env=env, root=root))
    assert result.status is Status.WARN and "started without --nv" in result.summary
    _names(result, "container.apptainer-no-nv")
    (root / ".singularity.d" / "libs" / "libcuda.so.1").write_bytes(b"")
    bound = run_one("system.container", make_ctx(env=env, root=root))
    assert bound.status is Status.INFO and not bound.mode


# -- gpu.nvidia-smi: the driver's own messages ------------------------------------------------------


def test_nvidia_smi_messages_name_their_cause(tmp_path, make_ctx, run_one):
    bin_dir = tmp_path / "bin"
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    for message, mode_id in (
            ("Failed to initialize NVML: Driver/library version mismatch",
             "gpu.driver-library-mismatch"),
            ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.",
             "gpu.driver-module-not-loaded"),
            ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.",
             "container.host-driver-missing")):
        _script(bin_dir, "nvidia-smi", f"echo \"{message}\"\nexit 9\n")
        result = run_one("gpu.nvidia-smi", make_ctx(env=env, target="compute"))
        assert result.status is Status.FAIL, result
        _names(result, mode_id)
    _script(bin_dir, "nvidia-smi", "echo 'Unknown Error'\nexit 9\n")
    other = run_one("gpu.nvidia-smi", make_ctx(env=env, target="compute"))
    assert other.status is Status.FAIL and not other.mode  # no cause named: the check's own fix
    assert other.fix and "nvidia-smi" in other.fix


def test_ssh_messages_name_their_cause():
    assert _ssh_mode("Host key verification failed.") == "launch.ssh-host-key"
    assert _ssh_mode("user@node2: Permission denied (publickey,password).") == \
        "launch.ssh-publickey"
    assert _ssh_mode("ssh: connect to host node2 port 22: Connection refused") == \
        "launch.sshd-refused"
    assert _ssh_mode("ssh: Could not resolve hostname node-0: Name or service not known") == \
        "launch.host-unreachable"


# -- launch.port: a port a Python process holds is most likely another run's store --------------


def test_port_held_by_a_python_process_names_the_shared_store(make_ctx, run_one):
    holder = subprocess.Popen(  # another run's Python listening where this one would
        [sys.executable, "-c", "import socket, time; s = socket.socket(); "
         "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); "
         "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(holder.stdout.readline())
        env = {"PATH": "/usr/bin:/bin", "MASTER_PORT": str(port)}
        result = run_one("launch.port", make_ctx(env=env, root="/", target="compute"))
    finally:
        holder.kill()
        holder.wait()
    assert result.status is Status.FAIL and "already in use" in result.summary, result
    assert f"pid {holder.pid}" in result.summary
    _names(result, "launch.store-shared")
    assert here(result).startswith("export MASTER_PORT=")


# -- torch: which driver or build gap --------------------------------------------------------------

BUILD = "dsenv.facts.python.torch_info.torch_build"
RUNTIME = "dsenv.facts.python.torch_info.torch_runtime"
CU124 = TorchBuild("2.4.1+cu124", cuda="12.4", location="/site/torch")
CU128 = TorchBuild("2.11.0+cu128", cuda="12.8", location="/site/torch")


def _seeded(make_ctx, gpus, torch, runtime=None, **env):
    ctx = make_ctx(env={"PATH": "/usr/bin:/bin", **env}, target="compute")
    ctx.memo(visible_gpus.memo_key, lambda: list(gpus))
    ctx.memo(BUILD, lambda: torch)
    if runtime is not None:
        ctx.memo(RUNTIME, lambda: runtime)
    return ctx


def _gpu(name, arch, driver="580.65.06"):
    return Gpu("nvidia", 0, name, arch, 32768, driver)


def test_driver_gaps_name_their_cause(tmp_path, make_ctx, run_one):
    a100 = _gpu("NVIDIA A100-SXM4-80GB", "8.0", "470.103.01")
    old = run_one("torch.driver", _seeded(make_ctx, [a100], CU124))
    assert old.status is Status.FAIL
    _names(old, "gpu.driver-too-old")
    compat = tmp_path / "cuda-12.4" / "compat"
    compat.mkdir(parents=True)
    (compat / "libcuda.so.1").write_bytes(b"")
    forward = run_one("torch.driver", _seeded(make_ctx, [a100], CU124,
                                              LD_LIBRARY_PATH=str(compat)))
    assert forward.status is Status.FAIL and "cuda-compat" in forward.summary
    _names(forward, "gpu.forward-compat-unsupported")
    minor = run_one("torch.driver", _seeded(make_ctx, [_gpu("A100", "8.0", "535.54.03")], CU124))
    assert minor.status is Status.WARN
    _names(minor, "gpu.ptx-newer-than-driver")
    assert any("comm.nccl-newer-than-driver" in line for line in minor.evidence)


def test_a_gpu_older_than_the_build_is_told_from_one_newer(make_ctx, run_one):
    probe = tp.parse_probe_output(fixture_text("gpu/torch_probe_cu128_v100.txt"))
    v100 = run_one("torch.arch-list", _seeded(make_ctx, [_gpu("Tesla V100-SXM2-32GB", "7.0")],
                                              CU128, probe))
    assert v100.status is Status.FAIL
    _names(v100, "gpu.too-old-for-torch")  # the cu128 wheel starts at sm_75
    assert torch_build._lacking_mode([_gpu("B300", "10.3")], ["sm_75", "sm_80", "sm_90"]) == \
        "gpu.torch-build-lacks-arch"
    assert torch_build._lacking_mode([Gpu("amd", 0, "MI50", "gfx906", 0, "")], ["gfx90a"]) == \
        "gpu.rocm-gfx-unsupported"


def test_cuda_init_errors_name_the_driver_stack_cause():
    assert torch_build._driver_stack_mode(
        "RuntimeError: CUDA error: system not yet initialized (802)") == \
        "gpu.fabric-manager-not-running"
    assert torch_build._driver_stack_mode(
        "RuntimeError: CUDA unknown error - this may be due to an incorrectly set up "
        "environment") == "gpu.cuda-unknown-error-driver"
    assert torch_build._driver_stack_mode("RuntimeError: No CUDA GPUs are available") == ""


# -- gpu.devices: the wrong node, or a job given no GPU --------------------------------------------


def test_no_gpu_tells_the_wrong_node_from_a_job_given_none(tmp_path, make_ctx, run_one):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    wrong_node = run_one("gpu.devices", make_ctx(env=env, target="compute", gpus_per_node=4))
    assert wrong_node.status is Status.FAIL
    _names(wrong_node, "gpu.no-gpu-on-node")  # no driver tool answers here at all
    _script(bin_dir, "nvidia-smi", "exit 0\n")  # the driver answers and lists no GPU
    given_none = run_one("gpu.devices", make_ctx(env=env, target="compute", gpus_per_node=4))
    assert given_none.status is Status.FAIL
    _names(given_none, "gpu.no-visible-gpu")


def test_no_driver_inside_a_container_is_a_container_started_without_the_gpus(
        tmp_path, make_ctx, run_one):
    # Docker brings /dev/nvidia* and the driver's tools in only for `docker run --gpus`
    # (pytorch/pytorch#2985); Apptainer binds the host's /dev whatever its flags, so no device
    # node there is a node without GPUs.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    docker_root = tmp_path / "docker"
    docker_root.mkdir()
    (docker_root / ".dockerenv").touch()
    plain = run_one("gpu.devices", make_ctx(env=env, root=docker_root, target="compute",
                                            gpus_per_node=4))
    assert plain.status is Status.FAIL
    _names(plain, "container.no-gpu-runtime")
    assert any("inside a Docker container (/.dockerenv exists)" in e for e in plain.evidence)
    assert "docker run --gpus all" in plain.fix
    apptainer = run_one("gpu.devices", make_ctx(
        env={**env, "APPTAINER_CONTAINER": "/images/train.sif"}, root=tmp_path / "root",
        target="compute", gpus_per_node=4))
    _names(apptainer, "gpu.no-gpu-on-node")
    # healthy twin: the container was given the GPU (the driver answers and lists it)
    recorded = tmp_path / "nvidia-smi.out"
    recorded.write_text(fixture_text("gpu/nvidia_smi_titanv_ada.csv"))
    _script(bin_dir, "nvidia-smi", f"cat '{recorded}'\n")
    given = run_one("gpu.devices", make_ctx(env=env | {"PATH": f"{bin_dir}:/usr/bin:/bin"},
                                            root=docker_root, target="compute",
                                            gpus_per_node=1))
    assert given.status is Status.OK, given.summary
    # the probe finds nothing on a login node: no verdict about the container at all
    login = run_one("gpu.devices", make_ctx(env=env | {"PATH": str(tmp_path / "none")},
                                            root=docker_root, target="login"))
    assert login.status is Status.INFO and "container" not in login.summary
