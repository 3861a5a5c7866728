"""`dsenv launch`: the sbatch script and the Kubeflow MPIJob, checked by running them.

The script's pieces run for real in bash: the preamble (modules, environment, variables,
rendezvous through the real `scontrol show hostnames` against a daemon-less slurm.conf),
then the preflight and launcher arrays are printed word by word, so quoting is proved by
what bash hands the programs, not by looking at the text. The real jobs are in
test_launch_slurm.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dsenv.envs.sites import load_site
from dsenv.provision.record.activation import write_activation
from dsenv.provision.targets import resolve_arch
from dsenv.staging import write_file_atomically as write_atomically
from tests.harness.cli import dsenv, dsenv_in_process
from tests.harness.recorded import fixture_text

PY = sys.executable
WEIRD = 'dir with space/$HOME "q" \'s\''  # spaces, a dollar, both quotes
UNIT_SLURM_CONF = ("ClusterName=unit\nSlurmctldHost=localhost\n"
                   "NodeName=nid[01-04] CPUs=8\nPartitionName=p Nodes=nid[01-04]\n")


@pytest.fixture(scope="module")
def scontrol():
    """The real scontrol (Slurm's client, installed like the test cluster's)."""
    from tests.harness import slurmcluster

    try:
        slurmcluster.ensure_installed()
    except slurmcluster.SlurmUnavailable as exc:
        pytest.skip(f"no Slurm client: {exc}")
    return shutil.which("scontrol")


def render(capsys, tmp_path, *args, workload_args=()) -> str:
    """``dsenv launch bert-squad ARGS --print -- WORKLOAD_ARGS`` in this process."""
    argv = ["launch", "bert-squad", *args, "--print"]
    if workload_args:
        argv += ["--", *workload_args]
    done = dsenv_in_process(capsys, *argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_pieces(script: str, tmp_path: Path, *, nodelist="nid[01-02]", job_id="4242",
               env=None, variables=()) -> dict:
    """Run the script's preamble in bash as a job would (SLURM_* set), then print the
    preflight and launcher arrays word by word and the named variables."""
    preamble = script.split("\n# -- preflight")[0]
    arrays = re.findall(r"^DSENV_(?:PREFLIGHT|LAUNCH)=\(\n.*?^\)$", script, re.M | re.S)
    assert len(arrays) == 2, script
    dump = tmp_path / "dump"
    dump.mkdir(exist_ok=True)
    conf = tmp_path / "unit-slurm.conf"
    conf.write_text(UNIT_SLURM_CONF)
    printer = [f'printf "%s\\0" "${{DSENV_{a}[@]}}" > {dump}/{a}' for a in ("PREFLIGHT", "LAUNCH")]
    printer += [f'printf "%s" "${{{v}-UNSET}}" > {dump}/{v}' for v in variables]
    body = "\n".join([preamble, *arrays, *printer]) + "\n"
    run_env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path),
               "USER": "ada", "SLURM_CONF": str(conf), "SLURM_JOB_ID": job_id,
               "SLURM_JOB_NODELIST": nodelist, **(env or {})}
    done = subprocess.run(["bash", "-c", body], env=run_env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = {a.lower(): (dump / a).read_text().split("\0")[:-1] for a in ("PREFLIGHT", "LAUNCH")}
    result.update({v: (dump / v).read_text() for v in variables})
    result["stdout"], result["stderr"] = done.stdout, done.stderr
    return result


SMOKE = ["-m", "dsenv.workloads.cli", "smoke", "bert-squad"]


# -- launcher lines, as bash runs them -------------------------------------------------------


@pytest.mark.parametrize("launcher", ["srun", "mpirun", "torchrun", "deepspeed"])
def test_launcher_lines_as_bash_runs_them(capsys, tmp_path, scontrol, launcher):
    script = render(capsys, tmp_path, "--nodes", "2", "--gpus-per-node", "4", "--launcher",
                    launcher, "--account", "proj1", "--partition", "gpu", "--time", "00:30:00",
                    workload_args=["--steps", "300"])
    got = run_pieces(script, tmp_path, variables=("MASTER_ADDR", "MASTER_PORT",
                                                  "DSENV_OUTPUT_DIR", "OMP_NUM_THREADS",
                                                  "SLURM_MPI_TYPE", "DS_ACCELERATOR"),
                     env={"SLURM_CPUS_PER_TASK": "8"})
    out = str(tmp_path / f"dsenv-output/bert-squad-smoke-{launcher}-4242")
    program = [*SMOKE, "--steps", "300", "--output-dir", out]
    expected = {
        "srun": ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", "--nodes=2", "--ntasks=8",
                 "--ntasks-per-node=4", PY, *program],
        "mpirun": ["mpirun", "-np", "8", PY, *program],
        "torchrun": ["srun", "--kill-on-bad-exit=1", "--nodes=2", "--ntasks=2",
                     "--ntasks-per-node=1", PY, "-m", "torch.distributed.run", "--nnodes=2",
                     "--nproc-per-node=4", "--rdzv-backend=c10d", "--rdzv-endpoint=nid01:24242",
                     "--rdzv-id=4242", *program],
        "deepspeed": [PY, "-m", "deepspeed.launcher.runner", f"--hostfile={out}/hostfile",
                      "--master_addr=nid01", "--master_port=24242", "--num_nodes=2",
                      "--num_gpus=4", "--module", *program[1:]],
    }[launcher]
    if launcher == "srun":  # the plugin comes from the rules for the MPI on PATH
        assert got["launch"][1] in ("--mpi=pmix", "--mpi=pmi2")
        expected[1] = got["launch"][1]
    assert got["launch"] == expected
    assert got["MASTER_ADDR"] == "nid01" and got["MASTER_PORT"] == str(20000 + 4242)
    assert got["DSENV_OUTPUT_DIR"] == out and Path(out).is_dir()
    # 8 CPUs per task: one rank per task (srun, mpirun), four ranks per task (the others)
    assert got["OMP_NUM_THREADS"] == ("8" if launcher in ("srun", "mpirun") else "2")
    assert got["SLURM_MPI_TYPE"] == (expected[1][6:] if launcher == "srun" else "UNSET")
    assert got["DS_ACCELERATOR"] == "UNSET"
    assert got["preflight"] == [PY, "-m", "dsenv", "doctor", "--target", "compute", "--launcher",
                                launcher, "--nodes", "2", "--gpus-per-node", "4"]
    if launcher == "deepspeed":
        assert Path(out, "hostfile").read_text() == "nid01 slots=4\nnid02 slots=4\n"
    sbatch = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    per_node = "4" if launcher in ("srun", "mpirun") else "1"
    cpus = "1" if launcher in ("srun", "mpirun") else "4"
    assert sbatch == [f"#SBATCH --job-name=dsenv-bert-squad-{launcher}", "#SBATCH --nodes=2",
                      f"#SBATCH --ntasks-per-node={per_node}", f"#SBATCH --cpus-per-task={cpus}",
                      "#SBATCH --gpus-per-node=4", "#SBATCH --account=proj1",
                      "#SBATCH --partition=gpu", "#SBATCH --time=00:30:00",
                      f"#SBATCH --output={tmp_path}/%x-%j.out"]  # --print: this folder
    assert "\nset -euo pipefail\n" in script


def test_deepspeed_on_one_node_skips_the_ssh_check(capsys, tmp_path, scontrol):
    script = render(capsys, tmp_path, "--gpus-per-node", "2", "--cpu", "--launcher",
                    "deepspeed")
    got = run_pieces(script, tmp_path, nodelist="nid03", variables=("DS_ACCELERATOR",))
    assert "--no_ssh_check" in got["launch"] and "--num_nodes=1" in got["launch"]
    out = tmp_path / "dsenv-output/bert-squad-smoke-deepspeed-4242"
    assert (out / "hostfile").read_text() == "nid03 slots=2\n"
    assert got["DS_ACCELERATOR"] == "cpu"
    # a CPU job asks Slurm for no GPU, and its preflight tells the doctor it expects none
    assert "gpus-per-node" not in "".join(line for line in script.splitlines()
                                          if line.startswith("#SBATCH"))
    preflight = got["preflight"]
    assert preflight[preflight.index("--gpus-per-node") + 1] == "0"
    assert "--skip" not in preflight


def test_deepspeed_on_two_nodes_writes_what_remote_ranks_need(capsys, tmp_path, scontrol):
    """DS_ENV_FILE: the job's variables the other hosts need, never a secret, never a value
    DeepSpeed's `export NAME=VALUE;` line would break; nothing of the kind on one node."""
    script = render(capsys, tmp_path, "--nodes", "2", "--gpus-per-node", "1", "--cpu",
                    "--launcher", "deepspeed")
    got = run_pieces(script, tmp_path, variables=("DS_ENV_FILE",), env={
        "HF_HOME": "/scratch/hf cache", "HF_TOKEN": "hf_abcdef123456", "GLOO_SOCKET_IFNAME":
        "hsn0", "NCCL_DEBUG": 'say "hi"', "TORCH_EXTENSIONS_DIR": "/x/$y",
        "MY_API_KEY": "k-123456", "UNRELATED": "1"})
    out = tmp_path / "dsenv-output/bert-squad-smoke-deepspeed-4242"
    assert got["DS_ENV_FILE"] == str(out / ".deepspeed_env")
    carried = dict(line.split("=", 1) for line in
                   (out / ".deepspeed_env").read_text().splitlines())
    assert carried["HF_HOME"] == "/scratch/hf cache"
    assert carried["GLOO_SOCKET_IFNAME"] == "hsn0"
    assert carried["DS_ACCELERATOR"] == "cpu" and carried["OMP_NUM_THREADS"] == "1"
    assert "PATH" in carried
    for left_out in ("HF_TOKEN", "MY_API_KEY", "UNRELATED", "NCCL_DEBUG",
                     "TORCH_EXTENSIONS_DIR"):
        assert left_out not in carried
    assert "hf_abcdef123456" not in (out / ".deepspeed_env").read_text()
    one = render(capsys, tmp_path, "--gpus-per-node", "1", "--cpu", "--launcher", "deepspeed")
    assert "DS_ENV_FILE" not in one


def test_full_run_preflight_checks_the_workloads_assets(capsys, tmp_path, scontrol):
    script = render(capsys, tmp_path, "--full", "--launcher", "mpirun", "--gpus-per-node", "4")
    got = run_pieces(script, tmp_path)
    assert got["launch"][3:8] == [PY, "-m", "dsenv.workloads.cli", "run", "bert-squad"]
    assert got["launch"][-1] == str(tmp_path / "dsenv-output/bert-squad-run-mpirun-4242")
    assert got["preflight"][-2:] == ["--for", "bert-squad"]  # the smoke needs no assets


def test_exported_master_addr_wins_and_port_follows_the_job(capsys, tmp_path, scontrol):
    script = render(capsys, tmp_path, "--launcher", "torchrun")
    first = run_pieces(script, tmp_path, job_id="7", env={"MASTER_ADDR": "127.0.0.1"},
                       variables=("MASTER_ADDR", "MASTER_PORT"))
    second = run_pieces(script, tmp_path, job_id="8", variables=("MASTER_ADDR", "MASTER_PORT"))
    assert first["MASTER_ADDR"] == "127.0.0.1" and second["MASTER_ADDR"] == "nid01"
    assert (first["MASTER_PORT"], second["MASTER_PORT"]) == ("20007", "20008")


# -- quoting -----------------------------------------------------------------------------------


def test_paths_with_spaces_dollars_and_quotes_reach_the_programs_intact(capsys, tmp_path,
                                                                       scontrol):
    env_dir = tmp_path / WEIRD / "env"
    env_dir.mkdir(parents=True)
    (env_dir / "pyvenv.cfg").write_text("home = /usr/bin\n")
    write_activation(env_dir, load_site("generic"), resolve_arch("cpu"), None)
    ds_config = tmp_path / WEIRD / "ds config.json"
    ds_config.write_text("{}")
    output = tmp_path / WEIRD / "out #1"
    script = render(capsys, tmp_path, "--gpus-per-node", "2", "--cpu", "--launcher", "mpirun",
                    "--env", str(env_dir), "--output-dir", str(output), "--deepspeed-config",
                    str(ds_config), "--job-name", "a b#c",
                    workload_args=["--report", f"{tmp_path}/{WEIRD}/r`id`\ntouch pwned"])
    assert subprocess.run(["bash", "-n"], input=script, text=True, timeout=30).returncode == 0
    got = run_pieces(script, tmp_path, variables=("VIRTUAL_ENV", "DSENV_OUTPUT_DIR",
                                                  "TORCH_EXTENSIONS_DIR"))
    assert got["VIRTUAL_ENV"] == str(env_dir)  # the environment's activate was sourced
    assert got["TORCH_EXTENSIONS_DIR"] == str(env_dir / "torch_extensions")
    assert got["DSENV_OUTPUT_DIR"] == f"{output}-4242" and Path(f"{output}-4242").is_dir()
    assert got["launch"] == ["mpirun", "-np", "2", "python", *SMOKE, "--deepspeed-config",
                             str(ds_config), "--report", f"{tmp_path}/{WEIRD}/r`id`\ntouch pwned",
                             "--output-dir", f"{output}-4242"]
    # the preflight runs the dsenv that made the script, judging the job's environment
    assert got["preflight"][:3] == [sys.executable, "-m", "dsenv"]
    assert got["preflight"][-4:] == ["--env", str(env_dir), "--deepspeed-config",
                                     str(ds_config)]
    assert '#SBATCH --job-name="a b#c"' in script
    assert not (tmp_path / "pwned").exists()  # the newline stayed inside its argument


def test_containers_wrap_every_rank_and_the_preflight(capsys, tmp_path, scontrol, fake_bin):
    fake_bin("module", "true\n")  # LUMI's modules are not here
    image = tmp_path / WEIRD / "image.sif"
    env_dir = tmp_path / WEIRD / "env"
    script = render(capsys, tmp_path, "--site", "lumi", "--nodes", "2", "--gpus-per-node", "8",
                    "--launcher", "srun", "--container", f"apptainer:{image}", "--env",
                    str(env_dir))
    got = run_pieces(script, tmp_path, env={"SCRATCH": "/scratch/p 1"})
    out_parent = str(tmp_path / "dsenv-output")
    wrapper = ["apptainer", "exec", "--bind", "/scratch/p 1:/scratch", "--bind",
               f"{out_parent}:{out_parent}", "--bind", f"{env_dir}:{env_dir}", str(image),
               "bash", "-c", '. "$1" && shift && exec "$@"', "dsenv-activate",
               f"{env_dir}/activate", "python"]
    assert got["launch"][:6] == ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", "--nodes=2",
                                 "--ntasks=16", "--ntasks-per-node=8"]
    assert got["launch"][6:6 + len(wrapper)] == wrapper
    assert got["preflight"][:len(wrapper)] == wrapper
    # the activate script runs inside the image, and the wrapper really hands it over
    shim = subprocess.run(wrapper[9:12] + ["dsenv-activate", "/dev/null", "echo", "ran", "$x"],
                          capture_output=True, text=True, timeout=30)
    assert shim.stdout == "ran $x\n"


def test_sarus_mounts_and_the_site_srun_plugin(capsys, tmp_path, scontrol, fake_bin):
    fake_bin("module", "true\n")  # Daint's modules are not here
    script = render(capsys, tmp_path, "--site", "daint", "--nodes", "2", "--launcher", "srun")
    got = run_pieces(script, tmp_path, env={"SCRATCH": "/scratch/snx/ada"},
                     variables=("HF_HOME", "OMP_NUM_THREADS", "NCCL_SOCKET_IFNAME"))
    assert got["launch"][1] == "--mpi=pmi2"  # daint's srun_mpi, not the MPI on this PATH
    out_parent = str(tmp_path / "dsenv-output")
    assert got["launch"][6:10] == [
        "sarus", "run", "--mount=type=bind,source=/scratch/snx/ada,destination=/scratch/snx/ada",
        f"--mount=type=bind,source={out_parent},destination={out_parent}"]
    assert got["launch"][10:12] == ["nvcr.io/nvidia/pytorch:22.08-py3", "python"]
    assert got["HF_HOME"] == "/scratch/snx/ada/huggingface"
    assert got["NCCL_SOCKET_IFNAME"] == "ipogif0" and got["OMP_NUM_THREADS"] == "1"


def test_site_modules_load_before_the_environment(capsys, tmp_path, scontrol, fake_bin):
    log = tmp_path / "module.log"
    fake_bin("module", f'echo "$*" >> {log}\n')  # Lmod's `module`, as a command here
    script = render(capsys, tmp_path, "--site", "daint", "--launcher", "mpirun", "--container",
                    "none")
    got = run_pieces(script, tmp_path, env={"SCRATCH": "/s"}, variables=("HF_HUB_OFFLINE",))
    assert log.read_text() == "load daint-gpu\nload sarus\nload OpenMPI/4.1.2\n"
    assert got["HF_HUB_OFFLINE"] == "1" and got["launch"][:4] == ["mpirun", "-np", "1", PY]


LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")


@pytest.mark.skipif(not LMOD_INIT.is_file(), reason="Lmod is not installed")
def test_a_batch_shell_finds_lmod_and_loads_the_site_modules(capsys, tmp_path):
    modules = tmp_path / "modulefiles" / "cuda"
    modules.mkdir(parents=True)
    (modules / "12.6.lua").write_text('setenv("CUDA_MODULE_LOADED", "12.6")\n')
    script = render(capsys, tmp_path, "--site", "hpc5", "--launcher", "mpirun")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "1",
           "MODULEPATH": str(tmp_path / "modulefiles")}  # no `module` yet: a batch shell
    preamble = script.split("\n# -- variables")[0]
    done = subprocess.run(["bash", "-c", preamble + '\necho "cuda=$CUDA_MODULE_LOADED"'],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "cuda=12.6"


def test_a_missing_module_stops_the_job_before_anything_runs(capsys, tmp_path, fake_bin):
    fake_bin("module", 'echo "Lmod has detected the following error: $*" >&2; exit 1\n')
    script = render(capsys, tmp_path, "--site", "hpc5", "--launcher", "mpirun")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_JOB_ID": "1",
                               "HOME": str(tmp_path)})
    assert done.returncode == 1 and "load cuda/12.6" in done.stderr
    assert "preflight" not in done.stdout


def test_outside_slurm_the_script_says_to_submit_it(capsys, tmp_path):
    script = render(capsys, tmp_path, "--launcher", "srun")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "submit this script with sbatch" in done.stderr


@pytest.mark.parametrize("site", ["generic", "lumi", "daint", "hpc5"])
@pytest.mark.parametrize("launcher", ["srun", "mpirun", "torchrun", "deepspeed"])
def test_every_script_parses(capsys, tmp_path, site, launcher):
    script = render(capsys, tmp_path, "--site", site, "--launcher", launcher, "--cpu")
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True,
                           timeout=30)
    assert check.returncode == 0, check.stderr


def test_no_credentials_from_the_environment(tmp_path, monkeypatch):
    secret = "hf_secretvalue123"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-456")
    done = subprocess.run([PY, "-m", "dsenv", "launch", "bert-squad", "--launcher", "srun",
                           "--", "--report", secret], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    script = (tmp_path / "dsenv-launch" / "bert-squad-srun.sbatch").read_text()
    # the workload still gets its argument; the header's copy of the command line is masked
    assert script.count(secret) == 1 and "--report hf_secretvalue123" not in script.split(
        "#SBATCH")[0]
    for text in (script, done.stdout, done.stderr):
        assert "wandb-secret-456" not in text and "HF_TOKEN" not in text


# -- writing, submitting, refusing -----------------------------------------------------------------


def test_written_atomically_and_executable(tmp_path):
    done = subprocess.run([PY, "-m", "dsenv", "launch", "bert-squad", "--launcher", "torchrun",
                           "--out", "jobs/run.sbatch"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "jobs" / "run.sbatch"
    assert done.stdout.strip() == str(path)
    assert os.access(path, os.X_OK) and path.read_text().startswith("#!/bin/bash\n")
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.sbatch"]  # no temp left
    assert f"#SBATCH --output={path.parent}/%x-%j.out" in path.read_text()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "job.sbatch"
    target.mkdir()  # a folder in the way: the rename fails
    (target / "keep").write_text("old")
    with pytest.raises(OSError):
        write_atomically(target, "#!/bin/bash\n")
    assert (target / "keep").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["job.sbatch"]


def _refused(tmp_path, *args, env=None) -> str:
    done = dsenv("launch", *args, base=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert not (tmp_path / "dsenv-launch").exists()
    return done.stderr


@pytest.mark.parametrize("args, message", [
    (["no-such-workload", "--launcher", "srun"], "unknown workload 'no-such-workload'"),
    (["bert-squad"], "--launcher is required"),
    (["bert-squad", "--launcher", "srun", "--site", "mars"], "--site mars: unknown site"),
    (["bert-squad", "--launcher", "srun", "--container", "singularity"], "write RUNTIME:IMAGE"),
    (["bert-squad", "--launcher", "srun", "--container", "podman:x"],
     "runtime 'podman' cannot run ranks in a Slurm job"),
    (["bert-squad", "--launcher", "deepspeed", "--nodes", "2", "--container", "sarus:img"],
     "cannot enter the container"),
    (["bert-squad", "--launcher", "srun", "--time", "soon"], "is not a Slurm time"),
    (["bert-squad", "--launcher", "srun", "--partition", "gpu;rm"], "is not a Slurm partition"),
    (["bert-squad", "--launcher", "srun", "--env", "/nonexistent/env"], "no activate script"),
    (["bert-squad", "--launcher", "srun", "--deepspeed-config", "nope.json"], "not a file"),
    (["bert-squad", "--launcher", "srun", "--", "--stepz", "3"], "unrecognized arguments"),
    (["bert-squad", "--launcher", "srun", "--", "--output-dir", "x"],
     "give --output-dir to `dsenv launch` itself"),
    (["bert-squad", "--launcher", "srun", "--print", "--submit"], "--print writes no file"),
    (["bert-squad", "--k8s"], "--k8s needs an image"),
    (["bert-squad", "--k8s", "--container", "singularity:/x/img.sif"], "is an image file"),
    (["bert-squad", "--k8s", "--launcher", "torchrun", "--container", "docker:a/b"],
     "drop --launcher torchrun"),
    (["bert-squad", "--k8s", "--container", "docker:a/b", "--job-name", "Bad_Name"],
     "DNS-1123 label"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    err = _refused(tmp_path, *args)
    assert message in err and err.count("\n") == 1, err


def test_nodes_zero_is_refused_by_the_parser(tmp_path):
    assert "must be 1 or more" in _refused(tmp_path, "bert-squad", "--launcher", "srun",
                                            "--nodes", "0")


def test_submit_without_sbatch_says_so(tmp_path):
    env = {"PATH": str(Path(PY).parent), "HOME": str(tmp_path)}  # python, but no Slurm
    done = subprocess.run([PY, "-m", "dsenv", "launch", "bert-squad", "--launcher", "mpirun",
                           "--submit"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("dsenv launch: sbatch not found on PATH")
    assert done.stderr.count("\n") == 1
    assert (tmp_path / "dsenv-launch" / "bert-squad-mpirun.sbatch").is_file()  # whole, kept


# -- the srun plugin -----------------------------------------------------------------------------


def _mpi_on_path(fake_bin, tmp_path, version_fixture: str) -> dict:
    target = tmp_path / "version.txt"
    target.write_text(fixture_text(version_fixture))
    folder = fake_bin("mpirun", f'exec /bin/cat "{target}"\n')
    return {"PATH": f"{folder}:/usr/bin:/bin", "HOME": str(tmp_path)}


def test_srun_plugin_follows_the_rules_for_the_mpi_on_path(tmp_path, fake_bin):
    from dsenv.workloads.launch.command import choose_srun_mpi

    generic = load_site("generic")
    mpich = _mpi_on_path(fake_bin, tmp_path, "mpi/mpich-5.0.2-wheel.mpiexec-version.txt")
    plugin, why = choose_srun_mpi(generic, mpich)
    assert plugin == "pmi2" and "[mpi.mpich]" in why  # pmix fails for MPICH (FACTS.md)
    assert choose_srun_mpi(generic, {"PATH": str(tmp_path / "empty")})[0] == "pmix"
    assert choose_srun_mpi(load_site("daint"), mpich) == ("pmi2", "site daint's srun_mpi")
    if shutil.which("ompi_info"):  # Debian's Open MPI: its ext3x component serves pmix
        plugin, why = choose_srun_mpi(generic, os.environ)
        assert plugin == "pmix" and "[mpi.openmpi-orte]" in why


# -- the Kubeflow MPIJob -------------------------------------------------------------------------

# What kubeflow.org/v2beta1 MPIJob requires, from the mpi-operator's CRD schema
# (manifests/base/kubeflow.org_mpijobs.yaml: spec.required, pod template containers, volumes,
# volume mounts) and its validation (pkg/apis/kubeflow/validation/validation.go).
CRD_REQUIRED = {
    "": ["apiVersion", "kind", "metadata", "spec"],
    "metadata": ["name"],
    "spec": ["mpiReplicaSpecs", "slotsPerWorker", "runPolicy", "sshAuthMountPath",
             "mpiImplementation"],
    "spec.runPolicy": ["cleanPodPolicy"],
    "spec.mpiReplicaSpecs.*": ["replicas", "restartPolicy", "template"],
    "spec.mpiReplicaSpecs.*.template": ["spec"],
    "spec.mpiReplicaSpecs.*.template.spec": ["containers"],
    "spec.mpiReplicaSpecs.*.template.spec.containers[]": ["name"],
    "spec.mpiReplicaSpecs.*.template.spec.containers[].volumeMounts[]": ["mountPath", "name"],
    "spec.mpiReplicaSpecs.*.template.spec.containers[].env[]": ["name"],
    "spec.mpiReplicaSpecs.*.template.spec.volumes[]": ["name"],
}
ENUMS = {"cleanPodPolicy": {"None", "Running", "All"}, "restartPolicy": {"Never", "OnFailure"},
         "mpiImplementation": {"OpenMPI", "Intel"}}


def _at(document, path: str) -> list:
    """Every node at a dotted path; '*' is every map value, '[]' every list item."""
    nodes = [document]
    for step in [s for s in path.split(".") if s]:
        name, many = (step[:-2], True) if step.endswith("[]") else (step, False)
        nodes = [v for n in nodes for v in (n.values() if name == "*" else [n.get(name)])
                 if v is not None]
        if many:
            nodes = [item for n in nodes for item in n]
    return nodes


def crd_problems(job: dict) -> list[str]:
    problems = []
    for path, required in CRD_REQUIRED.items():
        for node in _at(job, path):
            problems += [f"{path or '.'}: {key} missing" for key in required if key not in node]
    if job.get("apiVersion") != "kubeflow.org/v2beta1" or job.get("kind") != "MPIJob":
        problems.append("not a kubeflow.org/v2beta1 MPIJob")
    specs = job["spec"]["mpiReplicaSpecs"]
    if set(specs) != {"Launcher", "Worker"} or specs["Launcher"]["replicas"] != 1:
        problems.append("needs one Launcher and the Workers")
    if specs["Worker"]["replicas"] < 1 or job["spec"]["slotsPerWorker"] < 0:
        problems.append("worker replicas >= 1, slots >= 0")
    for key, allowed in ENUMS.items():
        for node in _at(job, "spec") + _at(job, "spec.runPolicy") + _at(job, "spec.mpiReplicaSpecs.*"):
            if key in node and node[key] not in allowed:
                problems.append(f"{key} {node[key]!r} not in {sorted(allowed)}")
    hostname = f"{job['metadata']['name']}-worker-{specs['Worker']['replicas'] - 1}"
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", hostname) or len(hostname) > 63:
        problems.append(f"{hostname} is not a DNS-1123 label")
    for spec in specs.values():
        pod = spec["template"]["spec"]
        names = {v["name"] for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            for mount in container.get("volumeMounts", []):
                if mount["name"] not in names:
                    problems.append(f"mount {mount['name']} has no volume")
    return problems


def _mpijob(capsys, tmp_path, *args) -> dict:
    text = render(capsys, tmp_path, "--k8s", *args)
    return yaml.safe_load(text)


def test_mpijob_has_what_the_crd_requires(capsys, tmp_path):
    job = _mpijob(capsys, tmp_path, "--nodes", "3", "--gpus-per-node", "4", "--container",
                  "docker:nvcr.io/nvidia/pytorch:25.01-py3", "--cpus-per-rank", "2")
    assert crd_problems(job) == []
    specs = job["spec"]["mpiReplicaSpecs"]
    assert job["spec"]["slotsPerWorker"] == 4 and specs["Worker"]["replicas"] == 3
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    worker = specs["Worker"]["template"]["spec"]["containers"][0]
    command = launcher["command"]
    assert command[0] == "mpirun" and command[command.index("-np") + 1] == "12"
    assert command[-7:] == ["python", *SMOKE, "--output-dir",
                            "/cache/dsenv-output/dsenv-bert-squad-smoke"]
    exported = {command[i + 1] for i, w in enumerate(command) if w == "-x"}
    env = {e["name"]: e["value"] for e in launcher["env"]}
    assert exported == set(env) and env["HF_HUB_OFFLINE"] == "1"
    assert env["MASTER_ADDR"] == "dsenv-bert-squad-smoke-worker-0.dsenv-bert-squad-smoke"
    assert worker["resources"]["limits"] == {"cpu": "8", "nvidia.com/gpu": 4}
    assert worker["image"] == launcher["image"] == "nvcr.io/nvidia/pytorch:25.01-py3"
    mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
    assert mounts == {"data": "/data", "cache": "/cache"} and env["HF_HOME"].startswith("/cache/")
    security = specs["Worker"]["template"]["spec"]["securityContext"]
    assert security == {"runAsUser": os.getuid(), "runAsGroup": os.getgid(),
                        "fsGroup": os.getgid()}


def test_mpijob_for_a_cpu_run_on_an_amd_site(capsys, tmp_path):
    job = _mpijob(capsys, tmp_path, "--site", "lumi", "--cpu", "--gpus-per-node", "2",
                  "--job-name", "smoke-1")
    assert crd_problems(job) == []
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"] == {"cpu": "2"}  # no GPU asked for
    assert worker["image"] == "rocm/pytorch:latest"  # the site's image, without docker://
    env = {e["name"]: e["value"] for e in worker["env"]}
    assert env["DS_ACCELERATOR"] == "cpu" and env["NCCL_SOCKET_IFNAME"] == "hsn"
    assert "MIOPEN_USER_DB_PATH" not in env  # ${SLURM_NODEID} means nothing in a pod
    gpu_job = _mpijob(capsys, tmp_path, "--site", "lumi")
    limits = gpu_job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "resources"]["limits"]
    assert limits["amd.com/gpu"] == 1


def test_crd_check_catches_a_broken_manifest(capsys, tmp_path):
    job = _mpijob(capsys, tmp_path, "--container", "docker:a/b:1")
    del job["spec"]["runPolicy"]["cleanPodPolicy"]
    job["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] = "Always"
    job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].pop("name")
    problems = crd_problems(job)
    assert len(problems) == 3, problems


def test_yaml_round_trips_odd_strings(capsys, tmp_path):
    from dsenv.workloads.launch.mpijob import to_yaml

    document = {"a": ["x: y", "- z", "#c", "yes", "1.0", "", 'q"uote', "ünï"], "b": {},
                "c": [{"d": [{"e": 1, "f": True}], "g": []}], "nvidia.com/gpu": 2}
    assert yaml.safe_load(to_yaml(document)) == document
    job_text = render(capsys, tmp_path, "--k8s", "--container", "docker:a/b:1",
                      workload_args=["--report", "/out/a: b #c.json"])
    assert json.dumps(yaml.safe_load(job_text)).count("/out/a: b #c.json") == 1
