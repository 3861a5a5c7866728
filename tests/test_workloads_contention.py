"""A performance verdict knows when it cannot judge (issue 24). Real contention: CPU hogs
started by the test on the run's one core; a real slow idle case: the same run restricted
to one core and one thread with nobody else on it. Below the reference, the busy node's
verdict is INCONCLUSIVE (exit 0, the measurement and what to do), the idle node's is FAIL.
The reference is set above what one core can do, so "slow" is certain; the measurements
and the verdict logic are the run's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from dsenv.facts.host import contention
from tests.harness.cli import explain, run
from tests.harness.workload_runs import MODULE

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
HOG = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass"
CORE = 0


def hogs(n: int) -> list[subprocess.Popen]:
    """``n`` busy loops on CORE (each ends by itself after 120 s if the test dies)."""
    started = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]
    for child in started:
        os.sched_setaffinity(child.pid, {CORE})
    return started


def stop(children) -> None:
    for child in children:
        child.kill()
        child.wait(timeout=30)


def test_the_probe_sees_others_on_the_runs_core():
    busy = hogs(1)
    try:
        before = contention.sample((CORE,))
        time.sleep(1.5)
        found = contention.between(before, contention.sample((CORE,)), {os.getpid()})
    finally:
        stop(busy)
    assert found.others_share > 0.6, found
    assert busy[0].pid in [pid for _name, pid, _cpu in found.top]
    # its healthy twin: nobody on the core
    before = contention.sample((CORE,))
    time.sleep(1.5)
    idle = contention.between(before, contention.sample((CORE,)), {os.getpid()})
    assert idle.others_share < 0.25, idle


def test_the_probe_reads_nvidia_smis_compute_apps():
    # nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader, as it prints
    text = "12345, /usr/bin/python3\n23456, [Not Found]\nNo running processes found\n"
    assert contention.parse_compute_apps(text) == [(12345, "/usr/bin/python3"),
                                                   (23456, "[Not Found]")]
    assert contention.parse_compute_apps("") == []


@pytest.fixture
def slow_reference(tmp_path):
    path = tmp_path / "references.toml"
    path.write_text('[[bert-squad-smoke]]\ndevice = "cpu*"\nsamples_per_s = 1000000\n'
                    'tolerance = 0.2\nsource = "above what one core can do (test)"\n')
    return path


def pinned_smoke(tmp_path, run_env, references):
    out = tmp_path / "out"
    env = {**run_env, "OMP_NUM_THREADS": "1"}
    done = run(["taskset", "-c", str(CORE), sys.executable, "-m", MODULE, "smoke",
                "bert-squad", "--output-dir", str(out), "--references", str(references)],
               env=env, timeout=600)
    return done, json.loads((out / "report.json").read_text())


def _performance(report):
    return next(v for v in report["verdicts"] if v["name"] == "performance")


def test_a_busy_node_is_inconclusive_not_failed(tmp_path, run_env, slow_reference):
    busy = hogs(2)
    try:
        done, report = pinned_smoke(tmp_path, run_env, slow_reference)
    finally:
        stop(busy)
    perf = _performance(report)
    assert perf["status"] == "INCONCLUSIVE", perf
    assert done.returncode == 0, explain(done)  # sanity passed: no failure of the stack
    assert report["status"] == "INCONCLUSIVE"
    assert "the node was busy: other processes took" in perf["detail"]
    assert "idle or exclusive node" in perf["detail"]
    load = report["training"]["contention"]
    assert load["others_share"] >= 0.25 and load["cores"] == 1
    assert any(p["pid"] in {h.pid for h in busy} for p in load["top_others"])


def test_a_slow_idle_node_still_fails(tmp_path, run_env, slow_reference):
    done, report = pinned_smoke(tmp_path, run_env, slow_reference)
    perf = _performance(report)
    assert perf["status"] == "FAIL", perf
    assert done.returncode == 1 and report["status"] == "FAIL"
    assert report["training"]["contention"]["others_share"] < 0.25
