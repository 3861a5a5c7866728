"""--kind venv: uv venv --relocatable + uv pip sync --require-hashes, built in staging and
renamed into place."""

from __future__ import annotations

import os
import subprocess

import pytest

from dsenv.provision import ProvisionError
from dsenv.provision.uvcmd import Sources
from dsenv.provision.venv import create_venv, venv_python
from dsenv.staging import staged_dir
from tests.harness.tinywheels import offline


def _run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


def test_venv_built_in_staging_works_after_the_rename(tiny_lock, tiny_wheels, tmp_path):
    final = tmp_path / "envs" / "tiny"
    log = tmp_path / "provision.log"
    with staged_dir(final) as staging:
        create_venv(staging, tiny_lock, sources=offline(tiny_wheels), log=log)
        staged_path = str(staging)
    assert final.is_dir() and not os.path.exists(staged_path)
    assert "+ dsenv-tiny-a==1.0" in log.read_text()
    py = venv_python(final)
    out = _run([str(py), "-c", "import sys, dsenvtinya, dsenvtinyb; print(sys.prefix)"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(final)
    # The console script's shebang is relative to the script: it runs from the new place.
    script = final / "bin" / "dsenv-tiny-a"
    assert staged_path not in script.read_text()
    out = _run([str(script)])
    assert out.returncode == 0 and out.stdout.strip() == f"tiny-a ok {final}", out
    # bin/activate finds the renamed prefix too.
    out = _run(["bash", "-c", f". {final}/bin/activate && echo $VIRTUAL_ENV && "
                "command -v python && dsenv-tiny-a"])
    assert out.stdout.split() == [str(final), str(py), "tiny-a", "ok", str(final)], out
    # .pyc files were written (compile_bytecode default)
    assert list(final.glob("lib/python*/site-packages/dsenvtinya/__pycache__/*.pyc"))
    cfg = (final / "pyvenv.cfg").read_text()
    assert "relocatable = true" in cfg and "include-system-site-packages = false" in cfg


def test_a_tampered_hash_fails_with_one_line_naming_the_package(tiny_lock, tiny_wheels,
                                                                  tmp_path):
    text = tiny_lock.read_text()
    marker = "dsenv-tiny-a==1.0 \\\n    --hash=sha256:"
    at = text.index(marker) + len(marker)
    digit = text[at]
    tampered = tmp_path / "tampered.txt"
    tampered.write_text(text[:at] + ("0" if digit != "0" else "1") + text[at + 1:])
    with pytest.raises(ProvisionError) as err:
        create_venv(tmp_path / "env", tampered, sources=offline(tiny_wheels),
                    compile_bytecode=False)
    message = str(err.value)
    assert "\n" not in message
    assert "dsenv-tiny-a==1.0 does not match the lock's hash" in message
    assert "regenerate the lock with `dsenv lock`" in message


def test_a_lock_without_hashes_is_refused(tiny_wheels, tmp_path):
    lock = tmp_path / "nohash.txt"
    lock.write_text("dsenv-tiny-a==1.0\n")
    with pytest.raises(ProvisionError, match="must have a hash") as err:
        create_venv(tmp_path / "env", lock, sources=offline(tiny_wheels))
    assert "\n" not in str(err.value)


def test_unreachable_index_falls_back_to_uvs_cache_and_find_links(tiny_lock, tiny_wheels,
                                                                   tmp_path, no_retries):
    # The index is a closed port: the first sync fails on the network, the offline retry
    # installs from the local wheels (and uv's cache) without UV_OFFLINE being set.
    closed = Sources.of([tiny_wheels], "http://127.0.0.1:9/simple")
    create_venv(tmp_path / "env", tiny_lock, sources=closed, compile_bytecode=False)
    assert _run([str(venv_python(tmp_path / "env")), "-c", "import dsenvtinyb"]).returncode == 0
    with pytest.raises(ProvisionError) as err:
        create_venv(tmp_path / "env2", tiny_lock, sources=closed, offline=False)
    assert "cannot reach the package index" in str(err.value) and "\n" not in str(err.value)


def test_bad_inputs_are_one_line(tiny_lock, tmp_path):
    with pytest.raises(ProvisionError, match="does not exist"):
        create_venv(tmp_path / "env", tmp_path / "no-such-lock.txt")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "file").write_text("x")
    with pytest.raises(ProvisionError, match="is not empty"):
        create_venv(busy, tiny_lock)
    with pytest.raises(ProvisionError, match="create venv") as err:
        create_venv(tmp_path / "env3", tiny_lock, python=tmp_path / "no-python")
    assert "\n" not in str(err.value)
