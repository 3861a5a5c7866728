"""dsenv's ReFrame checks run by the real ReFrame (reframe-hpc from PyPI) on this machine's
local scheduler, with a site config the test writes: the doctor, a bert-squad smoke and the
distributed test pass and the performance log records samples_per_s (against a site's
references file) and busbw; a smoke that cannot learn (the hidden --shuffle-labels) and a
doctor asked for a GPU this node lacks fail, each with dsenv's own reason in ReFrame's
report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsenv.workloads import registry

pytest.importorskip("reframe")

SMOKE = "DsenvSmoke%workload=bert-squad%preset=fp32%launcher=none$"
SITE_CONFIG = """
site_configuration = {
    'systems': [{
        'name': 'here', 'descr': 'this machine, as a site would describe it',
        'hostnames': ['.*'],
        'partitions': [{'name': 'local', 'scheduler': 'local', 'launcher': 'local',
                        'environs': ['dsenv'], 'max_jobs': 1}],
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
SITE_REFERENCES = """
[[bert-squad-smoke]]
device = "*"
world_size = 1
preset = "fp32"
samples_per_s = 20
tolerance = 0.5
source = "this site's own measurement"
"""


def checks_path() -> str:
    done = subprocess.run(["dsenv", "reframe", "--path"], capture_output=True, text=True,
                          check=True)
    return done.stdout.strip()


def reframe(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run reframe in tmp_path with the test's site config; (process, its JSON run report)."""
    (tmp_path / "site.py").write_text(SITE_CONFIG)
    report = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
    done = subprocess.run([shutil.which("reframe") or "reframe", "-C", "site.py",
                           "-c", checks_path(), "--exec-policy=serial", "--nocolor",
                           "--report-file", str(report), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
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
                             "print(sorted(m for m in sys.modules if 'reframe' in m))"],
                            capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "['dsenv.workloads.reframe_checks']"


def test_reframe_lists_every_check_with_its_parameters_and_the_fetch_fixture(tmp_path):
    done, _ = reframe(tmp_path, "-l")
    assert done.returncode == 0, done.stdout + done.stderr
    listing = done.stdout
    assert "- DsenvDoctor" in listing
    for workload in registry.smoke_names():
        assert f"- DsenvSmoke %workload={workload} %preset=fp32 %launcher=none" in listing
    for workload in registry.full_names():
        assert f"- DsenvRun %workload={workload} %preset=bf16 %launcher=srun" in listing
    assert "^DsenvFetch" in listing  # the session fixture of every full run
    for launcher in ("torchrun", "mpirun", "srun"):
        assert f"- DsenvDistributed %launcher={launcher}" in listing


@pytest.mark.slow
def test_checks_pass_here_and_the_perflog_has_samples_per_s_and_busbw(tmp_path):
    (tmp_path / "site-references.toml").write_text(SITE_REFERENCES)
    done, data = reframe(tmp_path, "-r", "-n", "DsenvDoctor$", "-n", SMOKE,
                         "-n", "DsenvDistributed%launcher=torchrun$",
                         "-S", f"DsenvSmoke.references={tmp_path / 'site-references.toml'}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    ran = cases(data)
    assert {name: case["result"] for name, case in ran.items()} == {
        "DsenvDoctor": "pass",
        "DsenvSmoke %workload=bert-squad %preset=fp32 %launcher=none": "pass",
        "DsenvDistributed %launcher=torchrun": "pass"}
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
    assert "this site's own measurement" in perf["detail"]
    busbw_log = (tmp_path / "perflogs/here/local/DsenvDistributed.log").read_text()
    assert "busbw=" in busbw_log and "GB/s" in busbw_log, busbw_log


@pytest.mark.slow
def test_a_sabotaged_smoke_and_an_unready_node_fail_with_dsenvs_reason(tmp_path):
    done, data = reframe(tmp_path, "-r", "-n", "DsenvDoctor$", "-n", SMOKE,
                         "-S", "DsenvSmoke.extra_options=--shuffle-labels",
                         "-S", "DsenvDoctor.doctor_options=--target=compute,--gpus-per-node=1")
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
