"""DeepSpeed ops build: DS_BUILD_* reinstall through uv, installed_ops verified, failures
pointing at the log. Fast tests use a fake ``deepspeed`` sdist whose setup.py behaves like
DeepSpeed's (installed_ops written at build time, incompatible ops skipped, a failing
compile); the real cpu_adam build is in test_real_env.py (slow)."""

from __future__ import annotations

import io
import json
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from dsenv.provision import ProvisionError
from dsenv.provision.ops.build import (
    build_ops,
    compare_ops,
    error_summary,
    read_deepspeed,
    requested_ops,
    verify_installed_ops,
)
from dsenv.provision.venv import make_venv
from tests.harness.tarfiles import add_text as _add
from tests.harness.tinywheels import offline

SETUP_PY = '''
import json, os, sys
from setuptools import setup
ALL_OPS = {"cpu_adam": "DS_BUILD_CPU_ADAM", "broken_op": "DS_BUILD_BROKEN_OP",
           "async_io": "DS_BUILD_AIO", "pin_memory": "DS_BUILD_PIN_MEMORY"}
INCOMPATIBLE = {"async_io"}
default = int(os.environ.get("DS_BUILD_OPS", "0"))
installed = dict.fromkeys(ALL_OPS, False)
for name, var in ALL_OPS.items():
    if not int(os.environ.get(var, default)) or name in INCOMPATIBLE:
        continue  # DeepSpeed skips an incompatible op silently when its variable is set
    if name == "broken_op":
        print("csrc/broken/broken.cpp:1:10: fatal error: dsenv_missing.h: No such file or "
              "directory", file=sys.stderr)
        print("error: command '/usr/bin/g++' failed with exit code 1", file=sys.stderr)
        sys.exit(1)
    installed[name] = 1
with open("deepspeed/git_version_info_installed.py", "w") as f:
    f.write(f"version='0.0.1'\\ninstalled_ops={installed!r}\\naccelerator_name='cpu'\\n"
            "torch_info={'version': '0.0'}\\n")
with open("deepspeed/build_env.json", "w") as f:
    json.dump({k: os.environ.get(k) for k in ("MAX_JOBS", "TORCH_CUDA_ARCH_LIST",
              "DS_BUILD_BROKEN_OP", "DS_ACCELERATOR")}, f)
setup(name="deepspeed", version="0.0.1",
      packages=["deepspeed", "deepspeed.ops", "deepspeed.ops.op_builder",
                "deepspeed.ops.op_builder.cuda_only"],
      package_data={"deepspeed": ["build_env.json"]})
'''

BUILDERS = '''
class CPUAdamBuilder:
    BUILD_VAR = "DS_BUILD_CPU_ADAM"
    NAME = "cpu_adam"
class BrokenBuilder:
    BUILD_VAR = "DS_BUILD_BROKEN_OP"
    NAME = "broken_op"
class AsyncIOBuilder:
    BUILD_VAR = "DS_BUILD_AIO"
    NAME = "async_io"
class PinMemoryBuilder:
    BUILD_VAR = "DS_BUILD_PIN_MEMORY"
    NAME = "pin_memory"
'''

CUDA_BUILDERS = '''
class FusedLambBuilder:
    BUILD_VAR = "DS_BUILD_FUSED_LAMB"
    NAME = "fused_lamb"
'''


@pytest.fixture(scope="module")
def fake_deepspeed(tmp_path_factory) -> Path:
    """A folder with deepspeed-0.0.1.tar.gz, a fake DeepSpeed sdist."""
    folder = tmp_path_factory.mktemp("fake-ds")
    with tarfile.open(folder / "deepspeed-0.0.1.tar.gz", "w:gz") as tar:
        top = "deepspeed-0.0.1/"
        _add(tar, top + "PKG-INFO", "Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.0.1\n")
        _add(tar, top + "setup.py", textwrap.dedent(SETUP_PY))
        _add(tar, top + "deepspeed/__init__.py", "")
        _add(tar, top + "deepspeed/ops/__init__.py", "")
        _add(tar, top + "deepspeed/ops/op_builder/__init__.py", "")
        _add(tar, top + "deepspeed/ops/op_builder/builders.py", BUILDERS)
        _add(tar, top + "deepspeed/ops/op_builder/cuda_only/__init__.py", CUDA_BUILDERS)
    return folder


@pytest.fixture
def env_python(tmp_path, fake_deepspeed):
    """A --system-site-packages venv (setuptools from the base) with the fake deepspeed."""
    python = make_venv(tmp_path / "env", python=sys.executable, system_site_packages=True)
    build_ops(python, {}, {}, deepspeed_requirement="deepspeed==0.0.1",
              log=tmp_path / "install.log", sources=offline(fake_deepspeed),
              compile_bytecode=False)
    return python


def _build(python, ops, tmp_path, fake_deepspeed, arch=None, **kw):
    return build_ops(python, ops, arch or {}, deepspeed_requirement="deepspeed==0.0.1",
                     log=tmp_path / "logs" / "build.log", sources=offline(fake_deepspeed),
                     compile_bytecode=False, **kw)


def _build_env(python) -> dict:
    site = next(Path(python).parent.parent.glob("lib/python*/site-packages"))
    return json.loads((site / "deepspeed" / "build_env.json").read_text())


def test_requested_op_is_built_verified_and_timed(env_python, tmp_path, fake_deepspeed,
                                                  monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)  # CI exports cpu; not the point here
    monkeypatch.setenv("DS_BUILD_BROKEN_OP", "1")  # inherited switches are dropped
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "5.0")  # so are inherited archs
    built = _build(env_python, {"DS_BUILD_CPU_ADAM": "1"}, tmp_path, fake_deepspeed,
                   arch={"TORCH_CUDA_ARCH_LIST": "8.0;9.0"}, jobs=3)
    assert built.requested == ("cpu_adam",) and built.ops == ["cpu_adam"]
    assert built.deepspeed_version == "0.0.1" and built.accelerator == "cpu"
    assert built.seconds > 0 and built.variables["MAX_JOBS"] == "3"
    assert _build_env(env_python) == {"MAX_JOBS": "3", "TORCH_CUDA_ARCH_LIST": "8.0;9.0",
                                      "DS_BUILD_BROKEN_OP": None, "DS_ACCELERATOR": None}
    log = (tmp_path / "logs" / "build.log").read_text()
    assert "$ DS_BUILD_CPU_ADAM=1 MAX_JOBS=3 TORCH_CUDA_ARCH_LIST='8.0;9.0' uv pip install" in log
    assert "--no-build-isolation --reinstall --no-deps --no-cache" in log
    assert "=== dsenv: built cpu_adam in" in log
    assert verify_installed_ops(env_python, ["cpu_adam"]) == ([], [])
    assert verify_installed_ops(env_python, ["fused_adam"]) == (["fused_adam"], ["cpu_adam"])


def test_max_jobs_defaults_to_the_usable_cpus(env_python, tmp_path, fake_deepspeed):
    import os

    _build(env_python, {"DS_BUILD_CPU_ADAM": "1"}, tmp_path, fake_deepspeed)
    assert _build_env(env_python)["MAX_JOBS"] == str(len(os.sched_getaffinity(0)))


# A terminal's width in COLUMNS (exported by some shells, and by pytest-xdist's workers) made
# uv wrap the compiler's line inside its error report; the summary quoted half of it.
@pytest.mark.parametrize("columns", [None, "80"])
def test_a_failing_compile_is_one_line_with_the_error_and_the_log(env_python, tmp_path,
                                                                   fake_deepspeed, monkeypatch,
                                                                   columns):
    if columns:
        monkeypatch.setenv("COLUMNS", columns)
    else:
        monkeypatch.delenv("COLUMNS", raising=False)
    with pytest.raises(ProvisionError) as err:
        _build(env_python, {"DS_BUILD_CPU_ADAM": "1", "DS_BUILD_BROKEN_OP": "1"}, tmp_path,
               fake_deepspeed)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("DeepSpeed ops build (cpu_adam, broken_op) failed after ")
    assert "fatal error: dsenv_missing.h: No such file or directory" in message
    assert message.endswith(f"full log: {tmp_path / 'logs' / 'build.log'}")
    # The env keeps the deepspeed it had: uv builds before it uninstalls.
    assert read_deepspeed(env_python)["version"] == "0.0.1"


def test_an_op_deepspeed_skips_is_a_difference_naming_the_log(env_python, tmp_path,
                                                               fake_deepspeed):
    # async_io is "incompatible" here and fused_lamb is a CUDA op the CPU accelerator does
    # not build: DeepSpeed installs without them and without an error.
    with pytest.raises(ProvisionError) as err:
        _build(env_python, {"DS_BUILD_AIO": "1", "DS_BUILD_FUSED_LAMB": "1"}, tmp_path,
               fake_deepspeed)
    message = str(err.value)
    assert "\n" not in message
    assert "requested but not precompiled: async_io, fused_lamb" in message
    assert "DeepSpeed built for its cpu accelerator" in message
    assert f"full log: {tmp_path / 'logs' / 'build.log'}" in message


def test_unknown_switches_are_refused_before_building(env_python, tmp_path, fake_deepspeed):
    with pytest.raises(ProvisionError, match="DS_BUILD_CPU_ADAMM is not a switch of DeepSpeed"):
        _build(env_python, {"DS_BUILD_CPU_ADAMM": "1"}, tmp_path, fake_deepspeed)
    with pytest.raises(ProvisionError, match="TORCH_CUDA_ARCH_LIST are not DS_BUILD"):
        _build(env_python, {"TORCH_CUDA_ARCH_LIST": "8.0"}, tmp_path, fake_deepspeed)
    assert not (tmp_path / "logs").exists()


def test_requested_ops_follow_deepspeeds_rules():
    variables = {"DS_BUILD_CPU_ADAM": ["cpu_adam"], "DS_BUILD_AIO": ["async_io"],
                 "DS_BUILD_NOT_IMPLEMENTED": ["not_implemented", "deepspeed_not_implemented"],
                 "DS_BUILD_FUSED_LAMB": ["fused_lamb"]}
    known = ["cpu_adam", "async_io", "deepspeed_not_implemented"]
    assert requested_ops({"DS_BUILD_CPU_ADAM": "1", "DS_BUILD_AIO": "0"}, variables,
                         known) == ["cpu_adam"]
    assert requested_ops({"DS_BUILD_NOT_IMPLEMENTED": "1"}, variables, known) == [
        "deepspeed_not_implemented"]  # the accelerator's name for the switch
    assert requested_ops({"DS_BUILD_OPS": "1", "DS_BUILD_AIO": "0"}, variables, known) == [
        "cpu_adam", "deepspeed_not_implemented"]
    assert requested_ops({"DS_BUILD_FUSED_LAMB": "1"}, variables, known) == ["fused_lamb"]
    assert compare_ops({"async_io": 1, "pin_memory": 1, "cpu_adam": False},
                       ["async_io"]) == ([], [])  # DeepSpeed adds pin_memory for async_io
    assert compare_ops({"pin_memory": 1}, []) == ([], ["pin_memory"])


def test_verify_reads_installed_ops_without_importing_deepspeed(tmp_path):
    pkg = tmp_path / "deepspeed"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise SystemExit('imported!')\n")
    (pkg / "git_version_info_installed.py").write_text(
        "version='0.19.8'\ninstalled_ops={'cpu_adam': 1, 'fused_adam': False, "
        "'deepspeed_shm_comm': True}\naccelerator_name='cpu'\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    assert verify_installed_ops(sys.executable, ["cpu_adam", "fused_adam"], env=env) == (
        ["fused_adam"], ["deepspeed_shm_comm"])
    bare = make_venv(tmp_path / "bare", python=sys.executable)  # no deepspeed at all
    with pytest.raises(ProvisionError, match="deepspeed is not installed in the env of"):
        verify_installed_ops(bare, [])


def test_error_summary_picks_the_last_error_lines(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("old run: error: earlier failure\n")
    start = log.stat().st_size
    with open(log, "a") as handle:
        handle.write("DEBUG g++ -Werror -c x.cpp\nDEBUG x.cpp:3: error: 'foo' was not declared\n"
                     "DEBUG warning: something\nDEBUG error: command 'g++' failed\n"
                     "DEBUG done\n")
    assert error_summary(log, start) == ("x.cpp:3: error: 'foo' was not declared | error: "
                                         "command 'g++' failed")
    assert error_summary(tmp_path / "nolog") == "(no build log)"


def test_a_console_gets_one_spinner_line_and_the_log_gets_the_output(env_python, tmp_path,
                                                                     fake_deepspeed):
    from rich.console import Console

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=200)
    _build(env_python, {"DS_BUILD_CPU_ADAM": "1"}, tmp_path, fake_deepspeed, console=console)
    shown = screen.getvalue()
    assert "building DeepSpeed ops (cpu_adam)" in shown
    assert "Install Ops" not in shown and "setuptools" not in shown  # build output: log only
    assert "installing to build" in (tmp_path / "logs" / "build.log").read_text()
