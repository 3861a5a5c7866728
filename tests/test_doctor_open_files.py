"""system.open-files: the soft open-file limit the job inherits, judged before the job, and
`dsenv explain --here` on the real log of a job that ran out of it (an H200 node, record3.sh:
`ulimit -n 64`, DataLoader workers passing 256 tensors an item: "unable to open shared memory
object ... Too many open files (24)"). Each case sets the limit for real in the child process
(setrlimit before exec), as a job script's `ulimit -n` does."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

from tests.harness.cli import dsenv

LOG = Path(__file__).parent / "fixtures" / "explain_gpu" / "nofile_dataloader.log"


def limited(soft: int):
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < soft:
        pytest.skip(f"the hard open-file limit here is {hard}, below {soft}")
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_files(soft: int, *args: str) -> dict:
    done = dsenv("doctor", "--only", "system", "--json", *args, preexec_fn=limited(soft))
    return next(r for r in json.loads(done.stdout)["results"] if r["id"] == "system.open-files")


def test_a_limit_below_the_usual_default_fails_on_a_compute_node():
    result = open_files(64, "--target", "compute")
    assert result["status"] == "fail", result
    assert result["summary"].startswith("ulimit -n is 64 (hard limit ")
    assert result["mode"] == "system.too-many-open-files" and "ulimit -n" in result["fix"]
    assert open_files(64, "--target", "login")["status"] == "warn"  # the job inherits it


def test_the_common_default_is_reported_as_a_fact():
    result = open_files(1024)
    assert result["status"] == "info", result
    assert result["mode"] == "system.too-many-open-files", result


def test_a_roomy_limit_passes():
    result = open_files(8192)
    assert result["status"] == "ok" and result["summary"].startswith("ulimit -n is 8192"), result
    assert result["mode"] == ""


def test_explain_here_finds_the_low_limit_the_log_ran_out_of(tmp_path):
    log = tmp_path / "nofile.log"
    log.write_text(LOG.read_text().partition("\n")[2])
    done = dsenv("explain", "--here", "--json", str(log), preexec_fn=limited(64))
    match = json.loads(done.stdout)["matches"][0]
    assert match["id"] == "system.too-many-open-files", match
    here = " ".join(match["here"])
    assert "system.open-files finds: WARN ulimit -n is 64" in here, here
    assert "the cause is present here" in here, here
    # the twin: a limit that leaves room
    done = dsenv("explain", "--here", "--json", str(log), preexec_fn=limited(8192))
    here = " ".join(json.loads(done.stdout)["matches"][0]["here"])
    assert "finds: OK ulimit -n is 8192" in here and "not found here" in here, here
