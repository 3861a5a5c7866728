"""Shared fixtures (the helpers they stand on are tests/harness/). Tests talk to loopback
only and never reach a model hub."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dsenv.doctor.context import Context, Options
from dsenv.doctor.registry import CHECKS, all_checks
from dsenv.doctor.runner import run_check
from dsenv.net import free_port
from tests.harness.tinywheels import build_tiny_wheels, offline
from tests.harness.workload_runs import LAUNCHER_PREFIXES, LAUNCHER_VARS

# Loopback only, and nothing may reach a hub or a package index from a test.
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"

# pytest-xdist's workers share the cores: each worker's processes get its share of OpenMP
# threads. Left unset, torch in every worker starts one thread per core and the workers'
# OpenMP barriers wait on each other's descheduled threads: two bert-mrpc smokes at once took
# 80 s each on this 2-core machine, against 13.6 s each with one thread (13.5 s alone).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))


# ----------------------------------------------------------------------------- two phases
# README's test command runs the suite in two phases: everything else on both cores
# (pytest-xdist, `-n 2 --dist loadgroup -m "not serial"`), then these modules alone
# (`-m serial`). They need the machine to themselves: timings and performance verdicts judged
# against an idle node, DeepSpeed jobs that already keep both cores busy (on the test Slurm's
# namespaced hosts too), and tests whose deadlines are a few seconds wide. Groups of modules
# that share one expensive fixture run on one worker of the first phase (xdist_group).
SERIAL_MODULES = {
    # the test Slurm's namespaced hosts running training jobs, and tight deadlines there
    "test_doctor_node_health.py", "test_multihost_distributed.py", "test_multihost_launch.py",
    "test_reframe_checks.py",
    # timings and performance verdicts that need an idle node
    "test_explain_speed.py", "test_html_reports.py", "test_readme_screens.py",
    "test_workloads_contention.py",
    # training runs on both cores
    "test_workloads_bert_mrpc.py", "test_workloads_bert_squad.py",
    "test_workloads_bert_squad_full.py", "test_workloads_gpt2_wikitext.py",
    "test_workloads_smoke_all.py", "test_workloads_t5_xsum.py",
}
# The other modules of the test Slurm (tests/harness/slurmcluster.py, netns.py) wait on its
# daemons and on deadlines far more than they compute: they run in the first phase, all on one
# worker (one cluster per session: a second worker would start a second), while the other
# worker uses the core they leave idle.
SLURM_GROUP_MODULES = {
    "test_doctor_distributed_env.py", "test_doctor_mpi_slurm.py", "test_launch_slurm.py",
    "test_multihost_doctor.py", "test_netns.py", "test_slurmcluster.py",
}
# The real environment (tests/provision/conftest.py cpu_env, built once for the package's two
# modules) also runs in the first phase on one worker: its cpu_adam build compiles its two
# sources one after the other, a core the other worker uses meanwhile.
REAL_ENV_MODULES = {"test_real_env.py", "test_smokes_in_env.py"}


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
        elif item.path.name in SLURM_GROUP_MODULES:
            item.add_marker(pytest.mark.xdist_group("test-slurm"))
        elif item.path.name in REAL_ENV_MODULES:
            item.add_marker(pytest.mark.xdist_group("real-env"))


@pytest.fixture
def make_ctx(tmp_path):
    """Build a doctor Context: ``make_ctx(env={...}, root=..., target="compute", **options)``.

    The environment starts from a minimal PATH unless ``env`` says otherwise, so a test
    decides exactly which commands exist.
    """

    def build(env=None, root=None, target="login", **options):
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home")} if env is None else env
        return Context(options=Options(target=target, **options), env=env,
                       root=Path(root) if root else tmp_path / "root")

    return build


@pytest.fixture
def run_one():
    """Run one registered check by id and return its Result."""
    all_checks()

    def run(check_id: str, ctx: Context):
        return run_check(CHECKS[check_id], ctx)

    return run


@pytest.fixture
def fake_bin(tmp_path):
    """``fake_bin("nvidia-smi", script)`` writes an executable shell script; returns its dir."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)

    def write(name: str, script: str) -> Path:
        path = folder / name
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return folder

    return write


# ----------------------------------------------------------------------------- workloads
@pytest.fixture(scope="session")
def extensions_dir() -> Path:
    path = Path(os.environ.get("TORCH_EXTENSIONS_DIR")
                or Path.home() / ".cache" / "dsenv-tests" / "torch_extensions")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def run_env(extensions_dir):
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo",
               TORCH_EXTENSIONS_DIR=str(extensions_dir), DS_ACCELERATOR="cpu",
               HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


@pytest.fixture
def no_references(tmp_path) -> str:
    """An empty reference table: performance is 'reported only', so a busy CI machine
    cannot turn a sanity test red (the verdict logic has its own tests)."""
    path = tmp_path / "references.toml"
    path.write_text("# empty\n")
    return str(path)


# ----------------------------------------------------------------------------- provision
@pytest.fixture(scope="session")
def tiny_wheels(tmp_path_factory) -> Path:
    """A folder with dsenv_tiny_a-1.0 (console script ``dsenv-tiny-a``) and dsenv_tiny_b-1.0
    (requires dsenv-tiny-a), built with ``pip wheel`` (tests/harness/tinywheels.py)."""
    return build_tiny_wheels(tmp_path_factory.mktemp("tiny-src"),
                             tmp_path_factory.mktemp("tiny-wheels"))


@pytest.fixture(scope="session")
def tiny_lock(tiny_wheels, tmp_path_factory) -> Path:
    """A hashed lock of dsenv-tiny-b (and so dsenv-tiny-a), written by compile_lock."""
    from dsenv.provision.locks import compile_lock

    out = tmp_path_factory.mktemp("tiny-lock") / "tiny.txt"
    return compile_lock(["dsenv-tiny-b==1.0"], out, sources=offline(tiny_wheels),
                        regenerate="dsenv lock --stack tiny")


# ----------------------------------------------------------------------------- Slurm
@pytest.fixture(scope="session")
def slurm_cluster():
    """``slurm_cluster(mpi_default="none", pmix_library=True, hosts=0)`` -> a running Slurm:
    one node on 127.0.0.1, or ``hosts`` namespaced hosts h1..hN (tests/harness/netns.py).

    One cluster at a time: asking for another configuration restarts it.
    Stopped at the end of the session; skips the test when this machine cannot run it.
    """
    from tests.harness import netns, slurmcluster

    def start(mpi_default: str = "none", pmix_library: bool = True, hosts: int = 0):
        try:
            return slurmcluster.start(mpi_default, pmix_library, hosts)
        except (slurmcluster.SlurmUnavailable, netns.NetnsUnavailable) as exc:
            pytest.skip(f"no test Slurm cluster: {exc}")

    yield start
    slurmcluster.stop()


@pytest.fixture
def slurm(slurm_cluster):
    """The default test cluster: MpiDefault=none, PMIx library present."""
    return slurm_cluster()
