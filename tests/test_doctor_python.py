"""python area: interpreter kind, symlinked prefix, broken requirements (real + generated)."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from dsenv.facts.python import pyenv
from dsenv.facts.python.torch_info import read_torch_build, torch_build
from dsenv.verdicts.findings import Status
from tests.harness import pyenvs
from tests.harness.findings import here

PYDIR = f"python{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheels")
    pyenvs.torch_wheel(out, "2.5.1+cpu")
    return out


def write_dist(site, name, version, requires=()):
    """A minimal *.dist-info folder, as pip writes it."""
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
             *(f"Requires-Dist: {r}" for r in requires)]
    (folder / "METADATA").write_text("\n".join(lines) + "\n")


def make_prefix(root, kind=None, cfg=None):
    site = root / "lib" / PYDIR / "site-packages"
    site.mkdir(parents=True)
    if kind == "conda":
        (root / "conda-meta").mkdir()
    if cfg is not None:
        (root / "pyvenv.cfg").write_text(cfg)
    return site


def test_interpreter_real(make_ctx, run_one):
    result = run_one("python.interpreter", make_ctx(environment=sys.executable))
    assert result.status == Status.OK
    assert ".".join(map(str, sys.version_info[:3])) in result.summary
    assert f"at {sys.executable} " in result.summary
    assert f"judged: --env {sys.executable}" in result.evidence


def test_interpreter_conda(tmp_path, make_ctx, run_one):
    prefix = pyenvs.make_conda_prefix(tmp_path / "env")
    result = run_one("python.interpreter", make_ctx(environment=str(prefix)))
    assert result.status == Status.OK and "conda env" in result.summary
    assert f"at {prefix}/bin/python3 " in result.summary


def test_prefix_whose_python_belongs_elsewhere(tmp_path, make_ctx, run_one):
    # a conda-style prefix whose bin/python3 is a symlink to another installation's python:
    # that python runs with its own sys.prefix and never sees this prefix's site-packages
    prefix = pyenvs.make_conda_prefix(tmp_path / "env")
    (prefix / "bin" / "python3").unlink()
    (prefix / "bin" / "python3").symlink_to(os.path.realpath(sys.executable))
    result = run_one("python.interpreter", make_ctx(environment=str(prefix)))
    assert result.status == Status.WARN
    assert f"runs with sys.prefix {sys.base_prefix}, not {prefix}" in result.summary
    assert "python -m venv" in result.fix


def test_prefix_without_an_interpreter_is_judged_from_its_files(tmp_path, make_ctx, run_one):
    make_prefix(tmp_path / "env", kind="conda")  # conda-meta and site-packages, no bin/python
    result = run_one("python.interpreter", make_ctx_with(make_ctx, tmp_path / "env"))
    assert result.status == Status.WARN
    assert result.summary.startswith(f"no python in {tmp_path / 'env'}/bin: ")
    assert "--env" in result.fix


def test_interpreter_that_does_not_run_is_named(tmp_path, make_ctx, run_one):
    prefix = pyenvs.make_venv(tmp_path / "venv")
    broken = tmp_path / "broken-python"  # e.g. an aarch64 env judged on an x86 login node
    broken.write_text("#!/bin/sh\necho 'cannot execute binary file' >&2\nexit 126\n")
    broken.chmod(0o755)
    (prefix / "bin" / "python3").unlink()
    (prefix / "bin" / "python3").symlink_to(broken)
    result = run_one("python.interpreter", make_ctx(environment=str(prefix)))
    assert result.status == Status.WARN
    assert "cannot run here" in result.summary and "exited 126" in result.summary
    assert "judged from its files only" in result.summary


def test_venv_with_system_site_packages_shadowing_torch(tmp_path, make_ctx, run_one, wheels):
    # a user's case: `python -m venv deepspeed-env --system-site-packages` inside an NGC container;
    # `pip install deepspeed` then may pull a second torch into the venv over the container's.
    # Here the base is the interpreter running the tests, with its real torch.
    venv = pyenvs.make_venv(tmp_path / "venv", system_site_packages=True)
    ctx = make_ctx(environment=str(venv))
    result = run_one("python.interpreter", ctx)
    assert result.status == Status.OK, result  # nothing shadowed yet
    assert "venv with system site packages" in result.summary
    base_torch = read_torch_build(sys.path)
    assert torch_build(ctx).version == base_torch.version  # the base's torch is the job's

    pyenvs.uv_install(wheels, "torch==2.5.1+cpu", python=venv / "bin" / "python")
    ctx = make_ctx(environment=str(venv))
    result = run_one("python.interpreter", ctx)
    assert result.status == Status.WARN
    assert f"torch 2.5.1+cpu over the base's {base_torch.version}" in result.summary
    assert "pip uninstall -y torch" in result.fix
    assert torch_build(ctx).version == "2.5.1+cpu"


def make_ctx_with(make_ctx, prefix):
    ctx = make_ctx()
    ctx.python_prefix = prefix
    return ctx


def test_prefix_real_path(make_ctx, run_one):
    assert run_one("python.prefix-symlink", make_ctx(environment=sys.executable)).status \
        == Status.OK


def test_prefix_through_symlink(tmp_path, make_ctx, run_one):
    # a user's case: /home is a symlink to /s/ls4/users; a conda env under it fails in batch jobs
    real_home = tmp_path / "s" / "ls4" / "users"
    make_prefix(real_home / "kristina" / "anaconda3" / "envs" / "ds_env", kind="conda")
    (tmp_path / "home").symlink_to(real_home)
    ctx = make_ctx_with(make_ctx, tmp_path / "home" / "kristina" / "anaconda3" / "envs" / "ds_env")
    result = run_one("python.prefix-symlink", ctx)
    assert result.status == Status.WARN
    real = real_home / "kristina" / "anaconda3" / "envs" / "ds_env"
    assert f"conda activate {real}" in result.fix
    assert str(tmp_path / "home") in result.summary


def test_requirements_real_environment_consistent(make_ctx, run_one):
    result = run_one("python.requirements", make_ctx(environment=sys.executable))
    assert result.status == Status.OK, result.evidence
    assert "deepspeed 0." in result.evidence[0] and "torch 2." in result.evidence[0]


def test_requirements_broken_on_generated_site(tmp_path, make_ctx, run_one):
    site = make_prefix(tmp_path / "env")
    write_dist(site, "transformers", "5.23.0", [
        "huggingface-hub<2.0,>=1.3.0", "tokenizers<=0.23.0,>=0.22.0", "numpy>=1.17",
        "tqdm>=4.27; extra == 'dev'",  # an extra nobody requested: ignored
        "pywin32; sys_platform == 'win32'",  # a marker false here: ignored
    ])
    write_dist(site, "huggingface-hub", "0.36.0", ["filelock"])
    write_dist(site, "numpy", "2.4.6")
    write_dist(site, "deepspeed", "0.19.8", ["numpy", "torch"])
    write_dist(site, "torch", "2.13.0", ["filelock", "sympy>=1.13.3"])
    write_dist(site, "filelock", "3.20.0")
    write_dist(site, "sympy", "1.12")

    report = pyenv.check_requirements([str(site)])
    described = [p.describe() for p in report.problems]
    assert ("transformers 5.23.0 has requirement huggingface-hub<2.0,>=1.3.0, but you have "
            "huggingface-hub 0.36.0") in described
    assert any("tokenizers" in d and "not installed" in d for d in described)
    assert any("sympy>=1.13.3" in d for d in described)
    assert not any("tqdm" in d or "pywin32" in d for d in described)

    result = run_one("python.requirements", make_ctx_with(make_ctx, tmp_path / "env"))
    assert result.status == Status.FAIL
    assert here(result).startswith(f"{tmp_path / 'env' / 'bin' / 'python'} -m pip install ")
    for spec in ("'huggingface-hub<2.0,>=1.3.0'", "'tokenizers<=0.23.0,>=0.22.0'",
                 "'sympy>=1.13.3'"):
        assert spec in here(result)


def test_requirements_names_torchvision_built_for_another_torch(tmp_path, make_ctx, run_one):
    """torchvision's wheel pins the torch its operators were built for (vllm-project/vllm-ascend
    #479: torchvision 0.21 beside torch 2.5.1 -> "operator torchvision::nms does not exist")."""
    site = make_prefix(tmp_path / "env")
    write_dist(site, "torch", "2.5.1", [])
    write_dist(site, "torchvision", "0.21.0", ["numpy", "torch==2.6.0"])
    write_dist(site, "numpy", "2.2.6")
    result = run_one("python.requirements", make_ctx_with(make_ctx, tmp_path / "env"))
    assert result.status == Status.FAIL
    assert "torchvision 0.21.0 has requirement torch==2.6.0, but you have torch 2.5.1" in \
        result.summary + " ".join(result.evidence)
    assert result.mode == "env.torchvision-other-torch"
    # the healthy twin: the pair pip installs together
    shutil.rmtree(site / "torchvision-0.21.0.dist-info")
    write_dist(site, "torchvision", "0.20.1", ["numpy", "torch==2.5.1"])
    result = run_one("python.requirements", make_ctx_with(make_ctx, tmp_path / "env"))
    assert result.status == Status.OK, result
