"""deepspeed.async-io: whether libaio links the way DeepSpeed tests it before building its
async_io op (NVMe offload), and `dsenv explain --here` on the real log of a node without it.

Recorded on a lent H200 (tests/fixtures/explain_gpu/ds_aio.log, record3.sh): DeepSpeed 0.19.8
on a node with no libaio died with "Unable to JIT load the async_io op due to it not being
compatible"; --here then ran deepspeed.ops, a check that judges the precompiled ops, and said
"not found here" on that very node. The failing case here is built for real: in a private
mount namespace libaio.so is an empty file, so the linker refuses it; the healthy twin is this
machine as CI installs it (libaio-dev); without a C compiler the check skips with the reason."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.cli import dsenv
from tests.harness.mountns import in_namespace, needs_namespace

LOG = Path(__file__).parent / "fixtures" / "explain_gpu" / "ds_aio.log"


def libaio_so() -> str:
    """The libaio.so the linker takes for -laio here; the test skips without one."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler here")
    found = subprocess.run([cc, "-print-file-name=libaio.so"], capture_output=True, text=True,
                           timeout=30).stdout.strip()
    if not found.startswith("/"):
        pytest.skip("libaio.so is not installed here (CI installs libaio-dev)")
    return str(Path(found).resolve())


def async_io(report: dict) -> dict:
    return next(r for r in report["results"] if r["id"] == "deepspeed.async-io")


def hidden(command: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``command`` (sh) with an empty file bound over libaio.so: the linker cannot use it."""
    needs_namespace()
    target = libaio_so()
    done = in_namespace(f'mount --bind /dev/null "{target}"\n{command}', timeout=240,
                        env={"TMPDIR": str(tmp_path)})
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_libaio_links_here_so_the_check_passes():
    libaio_so()
    done = dsenv("doctor", "--only", "deepspeed", "--json")
    result = async_io(json.loads(done.stdout))
    assert result["status"] == "ok", result
    assert "libaio links" in result["summary"] and "-laio" in result["evidence"][0]


def test_a_libaio_that_does_not_link_is_reported(tmp_path):
    done = hidden('"$PY" -m dsenv doctor --only deepspeed --json', tmp_path)
    result = async_io(json.loads(done.stdout))
    # nothing given to the doctor needs NVMe offload: a fact, with the mode and its fix
    assert result["status"] == "info", result
    assert result["mode"] == "deepspeed.async-io-no-libaio" and result["fix"], result
    assert any(line.startswith("the linker: ") and "libaio" in line
               for line in result["evidence"]), result


def test_an_nvme_offload_config_fails_without_libaio(tmp_path):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
                                                            "nvme_path": "/local_nvme"}}}))
    done = hidden(f'"$PY" -m dsenv doctor --only deepspeed --json --deepspeed-config {config}',
                  tmp_path)
    result = async_io(json.loads(done.stdout))
    assert result["status"] == "fail", result
    assert f"{config} offloads param to NVMe" in result["summary"], result
    # its healthy twin: the same config where libaio links
    done = dsenv("doctor", "--only", "deepspeed", "--json", "--deepspeed-config", str(config))
    assert async_io(json.loads(done.stdout))["status"] == "ok"


def test_without_a_c_compiler_it_skips_with_the_reason(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    done = dsenv("doctor", "--only", "deepspeed", "--json",
                 env={"PATH": str(empty), "CC": ""})
    result = async_io(json.loads(done.stdout))
    assert result["status"] == "skip", result
    assert "no C compiler on PATH" in result["summary"], result


def test_explain_here_on_the_recorded_log_finds_the_cause_on_a_node_without_libaio(tmp_path):
    log = tmp_path / "ds_aio.log"
    log.write_text(LOG.read_text().partition("\n")[2])
    done = hidden(f'"$PY" -m dsenv explain --here --json {log}', tmp_path)
    match = json.loads(done.stdout)["matches"][0]
    assert match["id"] == "deepspeed.async-io-no-libaio", match
    here = " ".join(match["here"])
    assert "on this node deepspeed.async-io finds: INFO libaio does not link" in here, here
    assert "the cause is present here" in here and "fix here:" in here, here
    # the twin: this node as it is, where libaio links
    done = dsenv("explain", "--here", "--json", str(log))
    here = " ".join(json.loads(done.stdout)["matches"][0]["here"])
    assert "deepspeed.async-io finds: OK libaio links" in here and "not found here" in here
