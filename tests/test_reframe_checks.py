"""dsenv's ReFrame checks run by the real ReFrame (reframe-hpc from PyPI) on this machine's
local scheduler, with a site config the test writes: the doctor, a bert-squad smoke and the
distributed test pass and the performance log records samples_per_s (against a site's
references file) and busbw; a smoke that cannot learn (the hidden --shuffle-labels) and a
doctor asked for a GPU this node lacks fail, each with dsenv's own reason in ReFrame's
report. On the test Slurm (sbatch, squeue, srun ranks) the same checks pass, and a cluster
whose srun cannot start this MPI fails the preflight with the doctor's reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsenv.workloads import registry
from tests.harness.workload_runs import site_references

pytest.importorskip("reframe")

SMOKE = "DsenvSmoke%workload=bert-squad%preset=fp32%launcher=none$"
SITE_CONFIG = """  # one system, one partition: the local scheduler and launcher
site_configuration = {
    'systems': [{
        'name': 'here', 'descr': 'this machine, as a site would describe it',
        'hostnames': ['.*'],
        'partitions': [{'name': 'local', 'scheduler': 'local', 'launcher': 'local',
                        'environs': ['dsenv'], 'max_jobs': 1}],  # one job at a time
    }],
    'environments': [{'name': 'dsenv'}],
    'logging': [{
        'handlers': [{'type': 'stream', 'name': 'stdout', 'level': 'info',
                      'format': '%(message)s'}],
        'handlers_perflog': [{
            'type': 'filelog', 'prefix': '%(check_system)s/%(check_partition)s',
            'level': 'info', 'basedir': 'perflogs', 'append': True,
            'format': '%(check_display_name)s|%(check_perfvalues)s',
            'format_perfvars': '%(check_perf_var)s=%(check_perf_value)s '
                               '%(check_perf_unit)s ref=%(check_perf_ref)s '
                               'lower=%(check_perf_lower_thres)s|',
        }],
    }],
}
"""
# A site's own table: any device, so the reference holds on whatever machine runs the test;
# low, so that a node other tests keep busy still meets it (a slow busy run is INCONCLUSIVE
# to dsenv, and the check then sets no reference).
SITE_REFERENCES = site_references("this site's own measurement")


def checks_path() -> str:
    done = subprocess.run(["dsenv", "reframe", "--path"], capture_output=True, text=True,
                          check=True)
    return done.stdout.strip()


def reframe(tmp_path: Path, *args: str, env: dict | None = None, config: str = SITE_CONFIG,
            slurm=None) -> tuple[subprocess.CompletedProcess, dict]:
    """Run reframe in tmp_path with a site config the test writes (on the test Slurm's login
    node with ``slurm``); (the process, ReFrame's JSON run report)."""
    (tmp_path / "site.py").write_text(config)
    report = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
    argv = [shutil.which("reframe") or "reframe", "-C", "site.py", "-c", checks_path(),
            "--nocolor", "--report-file", str(report), *args]
    if slurm is not None:
        done = slurm.run(argv, timeout=300, env=env, cwd=tmp_path)
    else:
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env=env)
    data = json.loads(report.read_text()) if report.exists() else {}
    return done, data


def cases(data: dict) -> dict[str, dict]:
    """ReFrame's run report: display name -> test case."""
    return {case["display_name"]: case for run in data.get("runs", [])
            for case in run["testcases"]}


def test_path_is_the_packaged_checks_file_and_dsenv_never_imports_reframe():
    path = Path(checks_path())
    assert path.name == "dsenv_checks.py" and path.is_file()
    assert path.parent.name == "reframe_checks"
    loaded = subprocess.run([sys.executable, "-c", "import sys; import dsenv.cli; "
                             "dsenv.cli.build_parser(); "
                             "print(sorted(m for m in sys.modules if 'reframe' in m))"],
                            capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "['dsenv.workloads.reframe_checks']"


def test_reframe_lists_every_check_with_its_parameters_and_the_fetch_fixture(tmp_path):
    done, _ = reframe(tmp_path, "-l")
    assert done.returncode == 0, done.stdout + done.stderr
    listing = done.stdout
    assert "- DsenvDoctor" in listing and "- DsenvNodeHealth" in listing
    for workload in registry.smoke_names():
        assert f"- DsenvSmoke %workload={workload} %preset=fp32 %launcher=none" in listing
    for workload in registry.full_names():
        assert f"- DsenvRun %workload={workload} %preset=bf16 %launcher=srun" in listing
    assert "^DsenvFetch" in listing  # the session fixture of every full run
    for launcher in ("torchrun", "mpirun", "srun"):
        assert f"- DsenvDistributed %launcher={launcher}" in listing


@pytest.mark.slow
def test_checks_pass_here_and_the_perflog_has_samples_per_s_and_busbw(tmp_path, run_env):
    (tmp_path / "site-references.toml").write_text(SITE_REFERENCES)
    done, data = reframe(tmp_path, "-r", "-n", "DsenvDoctor$", "-n", SMOKE,
                         "-n", "DsenvDistributed%launcher=torchrun$", "-n", "DsenvNodeHealth$",
                         "-S", f"DsenvSmoke.references={tmp_path / 'site-references.toml'}",
                         env=run_env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    ran = cases(data)
    assert {name: case["result"] for name, case in ran.items()} == {
        "DsenvDoctor": "pass", "DsenvNodeHealth": "pass",
        "DsenvSmoke %workload=bert-squad %preset=fp32 %launcher=none": "pass",
        "DsenvDistributed %launcher=torchrun": "pass"}
    # this node alone, under the local scheduler: its own file, empty (healthy)
    health = Path(ran["DsenvNodeHealth"]["outputdir"])
    assert [p.read_text() for p in health.glob("node-health.*")] == [""]
    smoke_log = (tmp_path / "perflogs/here/local/DsenvSmoke.log").read_text()
    # the site's reference (20 samples/s, tolerance 0.5), not the shipped table's
    assert "samples_per_s=" in smoke_log and "ref=20.0 lower=-0.5" in smoke_log, smoke_log
    value = float(smoke_log.split("samples_per_s=")[1].split()[0])
    assert value > 0
    # dsenv's own verdict judged the same table: the run's report.json says so
    kept = Path(ran["DsenvSmoke %workload=bert-squad %preset=fp32 %launcher=none"]
                ["outputdir"])  # ReFrame keeps report.json with the job's output
    perf = next(v for v in json.loads((kept / "report.json").read_text())["verdicts"]
                if v["name"] == "performance")
    assert "<svg" in (kept / "report.html").read_text()  # its page kept beside it
    assert "dsenv doctor on" in (Path(ran["DsenvDoctor"]["outputdir"]) / "doctor.html").read_text()
    assert "this site's own measurement" in perf["detail"]
    busbw_log = (tmp_path / "perflogs/here/local/DsenvDistributed.log").read_text()
    assert "busbw=" in busbw_log and "GB/s" in busbw_log, busbw_log


@pytest.mark.slow
def test_a_sabotaged_smoke_and_an_unready_node_fail_with_dsenvs_reason(tmp_path, run_env):
    done, data = reframe(tmp_path, "-r", "-n", "DsenvDoctor$", "-n", SMOKE,
                         "-S", "DsenvSmoke.extra_options=--shuffle-labels,--steps=80",
                         "-S", "DsenvDoctor.doctor_options=--target=compute,--gpus-per-node=1",
                         env=run_env)
    assert done.returncode != 0
    ran = cases(data)
    smoke = ran["DsenvSmoke %workload=bert-squad %preset=fp32 %launcher=none"]
    assert smoke["result"] == "fail" and smoke["fail_phase"] == "sanity"
    # dsenv's sanity verdict, in its own words: the task metric under its floor
    assert "dsenv smoke bert-squad: sanity FAIL: loss drop" in smoke["fail_reason"]
    assert "exact_match" in smoke["fail_reason"] and "< 60" in smoke["fail_reason"]
    doctor = ran["DsenvDoctor"]
    assert doctor["result"] == "fail" and doctor["fail_phase"] == "sanity"
    assert "dsenv doctor: not ready:" in doctor["fail_reason"]
    assert "gpu.devices: no GPU visible, but the job expects GPUs" in doctor["fail_reason"]
    # ... and the same reasons on ReFrame's screen
    assert "Reason: sanity error: dsenv smoke bert-squad: sanity FAIL" in done.stdout
    assert "gpu.devices: no GPU visible" in done.stdout


# The test Slurm (tests/harness/slurmcluster.py): a partition as a site declares one, jobs
# submitted with sbatch and polled with squeue (no accounting database), ranks started by srun.
SLURM_CONFIG = SITE_CONFIG.replace("'name': 'here'", "'name': 'testslurm'").replace(
    "'name': 'local', 'scheduler': 'local', 'launcher': 'local'",
    "'name': 'debug', 'scheduler': 'squeue', 'launcher': 'srun', 'access': ['-p debug']").replace(
    "'max_jobs': 1", "'max_jobs': 3")
SLURM_RUN = ("-n", "DsenvDoctor$", "-n",
             "DsenvSmoke%workload=bert-squad%preset=fp32%launcher=srun$",
             "-n", "DsenvDistributed%launcher=srun$")


def slurm_env(cluster, run_env) -> dict:
    """The submitting environment, less a fixed MASTER_PORT: the smoke and the distributed
    test run side by side on the one node, and each job's ranks pick their own port."""
    env = cluster.env({**run_env, "OMP_NUM_THREADS": "1"})
    env.pop("MASTER_PORT", None)
    return env


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the test Slurm runs as root")
def test_a_broken_slurm_host_fails_the_preflight_with_dsenvs_reason(tmp_path, slurm_cluster,
                                                                     run_env):
    """The default test cluster: srun's MpiDefault=none and an Open MPI without Slurm's PMI,
    so every MPI rank srun starts would abort in MPI_Init: the doctor's launch verdict."""
    cluster = slurm_cluster()
    done, data = reframe(tmp_path, "-r", "-n", "DsenvDoctor$", env=slurm_env(cluster, run_env),
                         config=SLURM_CONFIG, slurm=cluster)
    assert done.returncode != 0
    doctor = cases(data)["DsenvDoctor"]
    assert doctor["result"] == "fail" and doctor["fail_phase"] == "sanity"
    assert "dsenv doctor: not ready:" in doctor["fail_reason"]
    assert "mpi.launch: Open MPI" in doctor["fail_reason"]
    assert "srun --mpi=none" in doctor["fail_reason"]


@pytest.mark.slow
def test_a_full_run_waits_for_the_fetch_fixture_and_reports_dsenvs_verdict(tmp_path):
    """The session fixture DsenvFetch runs `dsenv fetch bert-squad` against a Hub (the test's
    own, serving a tiny BERT and a SQuAD-shaped data set), then DsenvRun's `dsenv run` reads
    them from the cache; two steps of a random tiny model cannot answer SQuAD, so ReFrame
    reports dsenv's sanity verdict in its own words."""
    from tests.harness.hubserver import HubServer, bert_squad_repos, hub_env

    repos = bert_squad_repos(tmp_path / "hub-content")
    with HubServer(repos) as hub:
        env = hub_env(tmp_path / "hf", hub.url, MASTER_ADDR="127.0.0.1",
                      GLOO_SOCKET_IFNAME="lo", DS_ACCELERATOR="cpu")
        env.pop("HF_HUB_OFFLINE", None)  # the fixture's node has internet
        done, data = reframe(tmp_path, "-r", "-n",
                             "DsenvRun%workload=bert-squad%preset=fp32%launcher=none$",
                             "-S", "DsenvFetch.workloads=bert-squad",
                             "-S", "DsenvRun.max_steps=2",  # the tiny model's 128 positions:
                             "-S", "DsenvRun.extra_options=--max-length=128,--doc-stride=32,"
                                   "--examples=0", env=env)
    ran = cases(data)
    fetch = next(case for name, case in ran.items() if name.startswith("DsenvFetch"))
    assert fetch["result"] == "pass" and fetch["fixture"], done.stdout[-3000:]
    assert (tmp_path / "hf" / "hub" / "models--google-bert--bert-base-uncased").is_dir()
    full = ran["DsenvRun %workload=bert-squad %preset=fp32 %launcher=none"]
    assert full["result"] == "fail" and full["fail_phase"] == "sanity", full["fail_reason"]
    assert full["fail_reason"].startswith("sanity error: dsenv run bert-squad: sanity FAIL: "
                                          "loss drop"), full["fail_reason"]
    kept = json.loads((Path(full["stagedir"]) / "report.json").read_text())  # kept: failed
    assert (kept["mode"], kept["training"]["steps"]) == ("run", 2)


TWO_HOSTS = ("-S", "nodes=2", "-S", "ranks_per_node=1")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="namespaced hosts need root")
def test_on_two_hosts_the_checks_pass_and_a_broken_host_fails_by_name(tmp_path, slurm_cluster,
                                                                      run_env, no_references):
    """The multi-host test Slurm (h1, h2; ReFrame on h1, the login node; jobs submitted with
    sbatch and polled with squeue, no accounting database; srun speaks PMIx, so the doctor
    has nothing to fail): the doctor as a batch job, each node's health, a bert-squad smoke
    with one srun rank per host over the fabric, and the distributed test pass, the perflog
    has samples/s and busbw; then h1's /dev/shm is made 64 MB and the node health check fails
    naming h1 with the doctor's line, h2 not named."""
    cluster = slurm_cluster(mpi_default="pmix", hosts=2)  # as SLURM_CONFIG's cluster: no
    # MPI rank srun starts would abort, so the doctor inside the distributed test passes
    env = cluster.env({**run_env, "GLOO_SOCKET_IFNAME": "hsn0", "OMP_NUM_THREADS": "1"})
    env = {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    smoke = "DsenvSmoke %workload=bert-squad %preset=fp32 %launcher=srun"
    done, data = reframe(tmp_path, "-r", "-n", "DsenvNodeHealth$", *SLURM_RUN, *TWO_HOSTS,
                         "-S", f"DsenvSmoke.references={no_references}",
                         env=env, config=SLURM_CONFIG, slurm=cluster)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    ran = cases(data)
    assert {name: (case["result"], case["scheduler"]) for name, case in ran.items()} == {
        "DsenvDoctor": ("pass", "squeue"), "DsenvNodeHealth": ("pass", "squeue"),
        smoke: ("pass", "squeue"), "DsenvDistributed %launcher=srun": ("pass", "squeue")}
    health = Path(ran["DsenvNodeHealth"]["outputdir"])
    assert sorted(p.name for p in health.glob("node-health.*")) == ["node-health.h1",
                                                                    "node-health.h2"]
    run = json.loads((Path(ran[smoke]["outputdir"]) / "report.json").read_text())["run"]
    assert (run["launcher"], run["world_size"], run["hosts"]) == ("srun", 2, ["h1", "h2"])
    logs = tmp_path / "perflogs/testslurm/debug"
    assert float((logs / "DsenvSmoke.log").read_text().split("samples_per_s=")[1].split()[0]) > 0
    busbw = (logs / "DsenvDistributed.log").read_text()
    assert float(busbw.split("busbw=")[1].split()[0]) > 0, busbw
    distributed = json.loads((Path(ran["DsenvDistributed %launcher=srun"]["outputdir"])
                              / "doctor.json").read_text())
    assert distributed["distributed"]["world_size"] == 2, distributed["distributed"]

    broken = tmp_path / "broken"
    broken.mkdir()
    cluster.hosts["h1"].mount_tmpfs("/dev/shm", 64)
    try:
        done, data = reframe(broken, "-r", "-n", "DsenvNodeHealth$", *TWO_HOSTS, env=env,
                             config=SLURM_CONFIG, slurm=cluster)
    finally:
        cluster.hosts["h1"].undo_mounts()
    assert done.returncode != 0
    health = cases(data)["DsenvNodeHealth"]
    assert health["result"] == "fail" and health["fail_phase"] == "sanity"
    assert health["fail_reason"].startswith(
        "sanity error: h1: ERROR: dsenv: system.shm: /dev/shm is 64 MiB"), health["fail_reason"]
    assert "h2:" not in health["fail_reason"]
