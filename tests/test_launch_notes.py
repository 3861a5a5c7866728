"""`dsenv launch` says what the job script leaves to Slurm's defaults and warns about paths a
compute node keeps to itself (issue 24, item 7).

- No --time, --account or --partition from the options, the site profile or sbatch's own
  SBATCH_* variables: one line names the missing ones and where to give them.
- The job log (#SBATCH --output), the output dir, the environment or the ds_config under
  /tmp, /var/tmp or /dev/shm, or on a local file system by the mount table (tmpfs, a local
  disk): one warning line. Run for real: from pytest's /tmp folders, with --out under the real
  /dev/shm, and in a private mount namespace on a tmpfs and on a FUSE mount (the shared case:
  a mount the node does not own, as NFS, Lustre or GPFS are).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from dsenv.envs.sites import load_site
from dsenv.workloads.launch import command as launch_command
from tests.harness.cli import dsenv, dsenv_in_process, explain
from tests.harness.mountns import FUSE_MOUNT, in_namespace, needs_fuse, needs_namespace

UNSET = "sets no"
LOCAL = "dsenv launch: warning: node-local paths"
NO_SBATCH = ("SBATCH_",)  # the test's own environment must not decide what is missing


def notes(done, start: str) -> list[str]:
    return [line for line in done.stderr.splitlines() if start in line]


def launch(tmp_path, *args, env=None):
    done = dsenv("launch", "bert-squad", "--launcher", "mpirun", "--cpu", *args, cwd=tmp_path,
                 env=env, drop=NO_SBATCH, timeout=120)
    assert done.returncode == 0, explain(done)
    return done


# -- time, account, partition --------------------------------------------------------------


def test_a_script_without_time_account_or_partition_says_so_in_one_line(tmp_path):
    done = launch(tmp_path)
    script = Path(done.stdout.strip()).read_text()
    assert not re.search(r"^#SBATCH --(time|account|partition)", script, re.M)
    [line] = notes(done, UNSET)
    assert line.startswith("dsenv launch: the job script sets no --time, --account or "
                           "--partition (site generic names none): ")
    assert "--time/--account/--partition" in line and "envs/sites/generic.toml" in line


def test_only_what_is_still_missing_is_named(tmp_path):
    done = launch(tmp_path, "--time", "00:30:00", "--account", "proj1")
    [line] = notes(done, UNSET)
    assert "sets no --partition (site generic names none)" in line and "--time" not in line
    script = Path(done.stdout.strip()).read_text()
    assert "#SBATCH --time=00:30:00" in script and "#SBATCH --account=proj1" in script


def test_nothing_is_said_when_all_three_are_given_or_sbatch_reads_them_here(tmp_path):
    done = launch(tmp_path, "--time", "10", "--account", "proj1", "--partition", "debug")
    assert notes(done, UNSET) == [], done.stderr
    # sbatch takes SBATCH_PARTITION from the environment it is run in
    done = launch(tmp_path, "--time", "10", "--account", "proj1",
                  env={"SBATCH_PARTITION": "debug"})
    assert notes(done, UNSET) == [], done.stderr


def test_a_site_profile_that_names_them_fills_the_script(capsys, tmp_path, monkeypatch):
    site = replace(load_site("generic"), name="mysite", partition="normal", time="01:00:00")
    monkeypatch.setattr(launch_command, "load_site", lambda name=None: site)
    for name in launch_command.SBATCH_VARIABLES.values():
        monkeypatch.delenv(name, raising=False)
    done = dsenv_in_process(capsys, "launch", "bert-squad", "--launcher", "mpirun", "--cpu",
                            "--print", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --partition=normal" in done.stdout and "#SBATCH --time=01:00:00" in done.stdout
    [line] = notes(done, UNSET)
    assert "sets no --account (site mysite names none)" in line
    # the option wins over the profile
    done = dsenv_in_process(capsys, "launch", "bert-squad", "--launcher", "mpirun", "--cpu",
                            "--print", "--time", "5", cwd=tmp_path)
    assert "#SBATCH --time=5" in done.stdout and "01:00:00" not in done.stdout


def test_a_broken_time_in_the_site_profile_is_one_line(capsys, tmp_path, monkeypatch):
    site = replace(load_site("generic"), time="half an hour")
    monkeypatch.setattr(launch_command, "load_site", lambda name=None: site)
    done = dsenv_in_process(capsys, "launch", "bert-squad", "--launcher", "mpirun", "--print",
                            cwd=tmp_path)
    assert done.returncode == 2
    assert "time = 'half an hour' of envs/sites/generic.toml is not a Slurm time" in done.stderr


def test_a_kubeflow_manifest_gets_neither_line(tmp_path):
    done = launch(tmp_path, "--k8s", "--container", "docker:a/b:1", "--print")
    assert notes(done, UNSET) == notes(done, LOCAL) == [], done.stderr


# -- node-local paths ----------------------------------------------------------------------


def test_run_from_tmp_the_log_and_the_output_are_node_local(tmp_path):
    """pytest's tmp_path is under /tmp: as a user who runs `dsenv launch` from /tmp."""
    assert str(tmp_path.resolve()).startswith("/tmp/")
    done = launch(tmp_path)
    [line] = notes(done, LOCAL)
    assert f"job log (#SBATCH --output) {tmp_path}/dsenv-launch/%x-%j.out (under /tmp)" in line
    assert f"output dir {tmp_path}/dsenv-output/bert-squad-smoke-mpirun (under /tmp)" in line
    assert line.endswith("keep them on a shared file system (home, project, scratch): --out, "
                         "--output-dir")
    printed = launch(tmp_path, "--print")  # --print: the log goes to the folder it ran in
    [line] = notes(printed, LOCAL)
    assert f"{tmp_path}/%x-%j.out (under /tmp)" in line and "run --print from there" in line


def test_an_environment_and_a_log_in_dev_shm_are_named(tmp_path):
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    shm = Path(tempfile.mkdtemp(prefix="dsenv-launch-", dir="/dev/shm"))
    try:
        env = shm / "env"
        env.mkdir()
        (env / "activate").write_text("")
        done = launch(tmp_path, "--out", shm / "job.sbatch", "--env", env)
        [line] = notes(done, LOCAL)
        assert f"job log (#SBATCH --output) {shm}/%x-%j.out (under /dev/shm)" in line
        assert f"environment {env} (under /dev/shm)" in line and line.endswith("--out, "
                                                                               "--output-dir, --env")
    finally:
        shutil.rmtree(shm, ignore_errors=True)


NAMESPACE_RUN = FUSE_MOUNT + """
mount -t tmpfs -o size=4m none /mnt
mkdir -p /mnt/local /mnt/shared
cd /mnt/local && "$PY" -m dsenv launch bert-squad --launcher mpirun --cpu --print \
    --time 10 --account a --partition p > /dev/null 2> /mnt/local.err
fuse_mount /mnt/shared local
cd /mnt/shared && "$PY" -m dsenv launch bert-squad --launcher mpirun --cpu --print \
    --time 10 --account a --partition p > /dev/null 2> /mnt/shared.err
cd /
echo "=local"; cat /mnt/local.err; echo "=shared"; cat /mnt/shared.err; echo "=done"
"""


def test_the_mount_table_decides_outside_the_tmp_folders():
    """On a tmpfs mounted on /mnt: node-local by the mount table. On a FUSE mount (a file
    system the node does not own, as a network one): no warning."""
    needs_namespace()
    needs_fuse()
    done = in_namespace(NAMESPACE_RUN, timeout=180)
    # (the exit status is the FUSE trap's: the server is gone by then)
    assert done.stdout.endswith("=done\n"), done.stdout + done.stderr
    assert "Traceback" not in done.stdout, done.stdout
    local, shared = done.stdout.split("=shared\n")
    [line] = [x for x in local.splitlines() if LOCAL in x]
    assert ("job log (#SBATCH --output) /mnt/local/%x-%j.out (tmpfs on /mnt, a local file "
            "system)") in line
    assert "output dir /mnt/local/dsenv-output/bert-squad-smoke-mpirun (tmpfs on /mnt" in line
    assert LOCAL not in shared and "warning" not in shared, shared
