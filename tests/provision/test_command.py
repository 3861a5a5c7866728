"""`dsenv provision` end to end on small locks: the plan, the staging folder, the rename, the
activate script and manifest, and one clear line for every kind of bad input.

Fast: the environments are installed from the tiny wheels of conftest.py (--no-index
--find-links); the real CPU stack with cpu_adam precompiled is test_real_env.py's (slow).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dsenv.envs.stacks import get_stack
from dsenv.provision import ProvisionError
from dsenv.provision.prefix import NEEDED_GIB, free_space_check
from tests.harness.cli import dsenv
from tests.harness.cli import one_line as _one_line
from tests.harness.tinywheels import provision_tiny as tiny


def one_line(done) -> str:
    return _one_line(done, "dsenv provision: ")


def siblings(prefix: Path) -> list[str]:
    return sorted(p.name for p in prefix.parent.iterdir())


def test_dry_run_prints_every_step_and_writes_nothing(tmp_path):
    prefix = tmp_path / "envs" / "cpu"
    done = dsenv("provision", "--arch", "cpu", "--ops", "cpu_adam", "--prefix", str(prefix),
                 "--dry-run", env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for expected in ("stack   cpu: torch==2.13.0+cpu", "envs/locks/cpu.txt",
                     "uv venv", "--relocatable", "uv pip sync --require-hashes",
                     "--no-build-isolation", "DS_BUILD_OPS=0", "MAX_JOBS=",
                     "ops (DeepSpeed 0.19.8 here): build cpu_adam",
                     "rename .cpu.tmp-"):
        assert expected in out, expected
    assert not (tmp_path / "envs").exists()


def test_dry_run_for_a100_shows_arch_variable_and_omitted_ops(tmp_path):
    done = dsenv("provision", "--arch", "A100", "--dry-run", "--prefix", str(tmp_path / "e"),
                 env={"COLUMNS": "250"})
    assert done.returncode == 0, done.stderr
    assert "TORCH_CUDA_ARCH_LIST=8.0" in done.stdout
    assert "stack   cuda13.0" in done.stdout and "ops: omit " in done.stdout


@pytest.mark.parametrize("args, expected", [
    (["--arch", "sm_99"], "--arch sm_99: 'sm_99' is neither a GPU architecture nor a GPU name"),
    (["--arch", "cpu", "--lock", "/nonexistent/lock.txt"], "no lock for stack cpu (venv): "
                                                           "/nonexistent/lock.txt does not exist"),
    (["--arch", "cpu", "--ops", "no_such_op"], "--ops no_such_op: unknown op(s) no_such_op; "
                                                "DeepSpeed "),
    (["--arch", "H100", "--site", "lumi"], "--stack rocm7.2 cannot serve nvidia sm_90"),
])
def test_bad_input_is_one_line(tmp_path, args, expected):
    done = dsenv("provision", *args, "--prefix", str(tmp_path / "env"), "--dry-run")
    line = one_line(done)
    assert expected in line, line
    assert not (tmp_path / "env").exists()


def test_auto_on_a_node_without_gpus_says_to_pass_arch(tmp_path):
    line = one_line(dsenv("provision", "--arch", "auto", "--dry-run", "--prefix",
                          str(tmp_path / "env"), env={"PATH": "/usr/bin:/bin"}))
    assert "--arch" in line and "no GPU" in line


def test_tiny_env_is_built_aside_renamed_and_usable(tmp_path, tiny_lock, tiny_wheels):
    prefix = tmp_path / "envs" / "tiny"
    done = tiny(prefix, tiny_lock, tiny_wheels)
    assert done.returncode == 0, done.stdout + done.stderr
    assert siblings(prefix) == ["tiny"]  # no staging folder, no log left beside it
    for name in ("activate", "dsenv-env.json", "dsenv-build.log", "pyvenv.cfg"):
        assert (prefix / name).exists(), name
    manifest = json.loads((prefix / "dsenv-env.json").read_text())
    assert manifest["env_dir"] == str(prefix) and manifest["kind"] == "venv"
    assert manifest["packages"] == {"dsenv-tiny-a": "1.0", "dsenv-tiny-b": "1.0"}
    assert manifest["ops"]["requested"] == []
    # the renamed venv works: its console script and the activate script
    script = subprocess.run([str(prefix / "bin" / "dsenv-tiny-a")], capture_output=True,
                            text=True, timeout=60)
    assert script.returncode == 0 and f"tiny-a ok {prefix}" in script.stdout
    shell = subprocess.run(["sh", "-c", f'. "{prefix}/activate" && echo "$TORCH_EXTENSIONS_DIR"'
                            ' && python -c "import sys, dsenvtinyb; print(sys.prefix)"'],
                           capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.split() == [str(prefix / "torch_extensions"), str(prefix)]


def test_existing_prefix_needs_force_and_a_failed_rebuild_leaves_it_untouched(
        tmp_path, tiny_lock, tiny_wheels):
    prefix = tmp_path / "envs" / "tiny"
    assert tiny(prefix, tiny_lock, tiny_wheels).returncode == 0
    before = (prefix / "dsenv-env.json").read_text()

    line = one_line(tiny(prefix, tiny_lock, tiny_wheels))
    assert line.startswith(f"{prefix} already exists: pass --force")

    tampered = tmp_path / "tampered.txt"  # one hash changed: uv must refuse the wheel
    text = tiny_lock.read_text()
    start = text.index("--hash=sha256:") + len("--hash=sha256:")
    tampered.write_text(text[:start] + ("0" if text[start] != "0" else "1") + text[start + 1:])
    line = one_line(tiny(prefix, tampered, tiny_wheels, "--force"))
    assert "dsenv-tiny" in line and "hash" in line.lower()
    assert (prefix / "dsenv-env.json").read_text() == before  # the old env is still there
    left = siblings(prefix)  # the failed build's own log stays, named after its run
    assert left[0] == "tiny" and len(left) == 2 and re.fullmatch(r"tiny\.build-\d+\.log", left[1])
    assert "hash" in (prefix.parent / left[1]).read_text().lower()

    assert tiny(prefix, tiny_lock, tiny_wheels, "--force").returncode == 0
    assert siblings(prefix) == ["tiny"]


def test_prefix_through_a_symlink_is_resolved(tmp_path, tiny_lock, tiny_wheels):
    real = tmp_path / "scratch" / "users"
    real.mkdir(parents=True)
    (tmp_path / "home").symlink_to(real)  # as on clusters whose /home links to the storage
    done = tiny(tmp_path / "home" / "tiny", tiny_lock, tiny_wheels)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((real / "tiny" / "dsenv-env.json").read_text())
    assert manifest["env_dir"] == str(real / "tiny")
    assert str(real / "tiny") in (real / "tiny" / "activate").read_text()


def test_too_little_free_space_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(NEEDED_GIB, "cpu", 10**6)  # a million GiB: never free
    with pytest.raises(ProvisionError, match=r"no space for the environment: .* GiB free"):
        free_space_check(tmp_path / "env", get_stack("cpu"))


def test_kind_container_installs_only_what_the_image_lacks(tmp_path, tiny_lock, tiny_wheels):
    """This interpreter plays the vendor image: its site-packages stay visible, the lock's
    tiny packages (absent from it) are installed into the venv and import-checked."""
    prefix = tmp_path / "envs" / "ctr"
    done = tiny(prefix, tiny_lock, tiny_wheels, "--kind", "container", "--python",
                sys.executable)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 from the image, 2 to install" in done.stdout
    assert "every locked package imports" in done.stdout
    assert "include-system-site-packages = true" in (prefix / "pyvenv.cfg").read_text()
    out = subprocess.run([str(prefix / "bin" / "python"), "-c",
                          "import dsenvtinyb, rich, sys; print(sys.prefix)"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == str(prefix), out.stderr
    assert json.loads((prefix / "dsenv-env.json").read_text())["kind"] == "container"
