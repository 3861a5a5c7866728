"""python.shadowing: what the job will import, not what the metadata says.

Each case is built on disk for real (venvs, a conda-style prefix, folders filled by
`uv pip install --target`, .pth files, a user site under a temporary HOME) and judged with
the environment's own interpreter; each has a healthy twin that must not warn. The fake
torch leaves a mark when imported: nothing may import it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from dsenv.facts.python.torch_info import read_torch_build, torch_build
from dsenv.verdicts.findings import Status
from tests.harness import pyenvs

OWN = "torch==2.5.1+cpu"
OTHER = "torch==9.9.0"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheels")
    for version in ("2.5.1+cpu", "9.9.0", "2.4.0"):
        pyenvs.torch_wheel(out, version)
    pyenvs.simple_wheel(out, "dsenv-unrelated", "1.0")
    return out


@pytest.fixture
def judge(tmp_path, make_ctx, run_one):
    """judge(prefix, **env) -> (python.shadowing result, the torch build the job imports)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    mark = tmp_path / "torch-imported"

    def run(prefix, **env):
        full = {"PATH": os.environ["PATH"], "HOME": str(home), pyenvs.MARK_VARIABLE: str(mark),
                **env}
        ctx = make_ctx(env=full, environment=str(prefix))
        found = run_one("python.shadowing", ctx)
        assert not mark.exists(), "the environment's torch was imported"
        return found, torch_build(ctx)

    run.home = home
    return run


def venv_with_torch(path, wheels, system_site_packages=False):
    prefix = pyenvs.make_venv(path, system_site_packages)
    pyenvs.uv_install(wheels, OWN, python=prefix / "bin" / "python")
    return prefix


# -- PYTHONPATH ---------------------------------------------------------------------------


def test_pythonpath_copy_shadows_the_environments(tmp_path, wheels, judge):
    prefix = venv_with_torch(tmp_path / "venv", wheels)
    folder = tmp_path / "pp"
    pyenvs.uv_install(wheels, OTHER, target=folder)
    found, torch = judge(prefix, PYTHONPATH=str(folder))
    assert found.status is Status.WARN
    assert found.summary.startswith(f"torch 9.9.0 from PYTHONPATH ({folder}) shadows torch "
                                    f"2.5.1+cpu in the environment's site-packages")
    assert found.fix.startswith(f"unset PYTHONPATH (or drop {folder} from it)")
    assert torch.version == "9.9.0"  # every torch check judges what is imported


def test_pythonpath_without_torch_is_fine(tmp_path, wheels, judge):
    prefix = venv_with_torch(tmp_path / "venv", wheels)
    folder = tmp_path / "pp"
    pyenvs.uv_install(wheels, "dsenv-unrelated==1.0", target=folder)
    found, torch = judge(prefix, PYTHONPATH=str(folder))
    assert found.status is Status.OK, found
    assert torch.version == "2.5.1+cpu"
    assert any(line.startswith("torch 2.5.1+cpu from ") for line in found.evidence)


def test_stale_metadata_on_pythonpath(tmp_path, wheels, judge):
    # a folder that kept torch-9.9.0.dist-info after its torch/ was deleted: pip and
    # importlib.metadata report 9.9.0, `import torch` loads the environment's 2.5.1
    prefix = venv_with_torch(tmp_path / "venv", wheels)
    folder = tmp_path / "pp"
    pyenvs.uv_install(wheels, OTHER, target=folder)
    shutil.rmtree(folder / "torch")
    found, torch = judge(prefix, PYTHONPATH=str(folder))
    assert found.status is Status.WARN
    assert "says torch 9.9.0, but holds no torch package" in found.summary
    assert found.fix == f"remove the stale metadata: `rm -r {folder / 'torch-9.9.0.dist-info'}`"
    assert torch.version == "2.5.1+cpu"


# -- the user site (~/.local, bound into containers through $HOME) -------------------------


def test_user_site_copy_shadows_the_conda_envs(tmp_path, wheels, judge):
    prefix = pyenvs.make_conda_prefix(tmp_path / "conda")
    pyenvs.uv_install(wheels, OWN, python=prefix / "bin" / "python")
    user = pyenvs.user_site(judge.home)
    pyenvs.uv_install(wheels, OTHER, target=user)
    found, torch = judge(prefix)
    assert found.status is Status.WARN
    assert found.summary.startswith(f"torch 9.9.0 from user site ({user}) shadows torch "
                                    "2.5.1+cpu in the environment's site-packages")
    assert found.fix.startswith("export PYTHONNOUSERSITE=1 in the job script")
    assert f"rm -r {user / 'torch'} {user / 'torch-9.9.0.dist-info'}" in found.fix
    assert torch.version == "9.9.0"

    # the healthy twin: the fix applied
    fixed, torch = judge(prefix, PYTHONNOUSERSITE="1")
    assert fixed.status is Status.OK, fixed
    assert torch.version == "2.5.1+cpu"


def test_user_site_copy_shadows_the_container_images(tmp_path, wheels, judge):
    # a container's venv over the image's Python (--system-site-packages; the image here is
    # the Python running the tests, with its real torch): $HOME is bound in, and a torch
    # once installed with `pip install --user` comes before the image's
    prefix = pyenvs.make_venv(tmp_path / "venv", system_site_packages=True)
    image = read_torch_build(sys.path).version
    user = pyenvs.user_site(judge.home)
    pyenvs.uv_install(wheels, OTHER, target=user)
    found, torch = judge(prefix)
    assert found.status is Status.WARN
    assert found.summary.startswith(f"torch 9.9.0 from user site ({user}) shadows torch "
                                    f"{image} in the base interpreter's site-packages")
    assert torch.version == "9.9.0"

    fixed, torch = judge(prefix, PYTHONNOUSERSITE="1")
    assert fixed.status is Status.OK, fixed
    assert torch.version == image


def test_user_site_is_ignored_by_an_isolated_venv(tmp_path, wheels, judge):
    # a venv without the system site packages never reads ~/.local
    prefix = venv_with_torch(tmp_path / "venv", wheels)
    pyenvs.uv_install(wheels, OTHER, target=pyenvs.user_site(judge.home))
    found, torch = judge(prefix)
    assert found.status is Status.OK, found
    assert torch.version == "2.5.1+cpu"


# -- .pth files ----------------------------------------------------------------------------


def test_pth_file_adds_a_second_copy(tmp_path, wheels, judge):
    prefix = venv_with_torch(tmp_path / "venv", wheels)
    folder = tmp_path / "dev-torch"  # e.g. what `pip install -e` of a checkout adds
    pyenvs.uv_install(wheels, OTHER, target=folder)
    pth = pyenvs.site_packages(prefix) / "dev-torch.pth"
    pth.write_text(f"# added by hand\n{folder}\n")
    found, torch = judge(prefix)
    assert found.status is Status.WARN
    assert found.summary.startswith("torch 2.5.1+cpu from the environment's site-packages")
    assert f"shadows torch 9.9.0 in .pth file {pth} ({folder})" in found.summary
    assert found.fix == f"remove the line that adds {folder} from {pth}"
    assert torch.version == "2.5.1+cpu"


def test_pth_file_in_the_user_site_comes_first(tmp_path, wheels, judge):
    prefix = pyenvs.make_conda_prefix(tmp_path / "conda")
    pyenvs.uv_install(wheels, OWN, python=prefix / "bin" / "python")
    folder = tmp_path / "dev-torch"
    pyenvs.uv_install(wheels, OTHER, target=folder)
    user = pyenvs.user_site(judge.home)
    user.mkdir(parents=True)
    pth = user / "dev.pth"
    pth.write_text(f"{folder}\n")
    found, torch = judge(prefix)
    assert found.status is Status.WARN
    assert found.summary.startswith(f"torch 9.9.0 from .pth file {pth} ({folder}) shadows")
    assert found.fix == f"remove the line that adds {folder} from {pth}"
    assert torch.version == "9.9.0"


def test_pth_file_without_torch_is_fine(tmp_path, wheels, judge):
    prefix = venv_with_torch(tmp_path / "venv", wheels)
    folder = tmp_path / "tools"
    pyenvs.uv_install(wheels, "dsenv-unrelated==1.0", target=folder)
    (pyenvs.site_packages(prefix) / "tools.pth").write_text(f"{folder}\n")
    found, torch = judge(prefix)
    assert found.status is Status.OK, found
    assert torch.version == "2.5.1+cpu"


# -- one package installed twice -------------------------------------------------------------


def test_two_installs_in_one_folder(tmp_path, wheels, judge):
    # pip over conda in one site-packages: two torch-*.dist-info, one torch/ of mixed files
    prefix = venv_with_torch(tmp_path / "venv", wheels)
    older = tmp_path / "older"
    pyenvs.uv_install(wheels, "torch==2.4.0", target=older)
    site = pyenvs.site_packages(prefix)
    shutil.move(older / "torch-2.4.0.dist-info", site / "torch-2.4.0.dist-info")
    (site / "torch-2.4.0.dist-info" / "INSTALLER").write_text("conda\n")
    found, torch = judge(prefix)
    assert found.status is Status.WARN
    assert found.summary.startswith(f"torch is installed twice in {site} (the environment's "
                                    "site-packages)")
    assert "installed by conda" in found.summary and "installed by uv" in found.summary
    assert "pip uninstall -y torch" in found.fix
    assert torch.version == "2.5.1+cpu"  # torch/version.py says which files are there


def test_one_install_is_fine(tmp_path, wheels, judge):
    found, torch = judge(venv_with_torch(tmp_path / "venv", wheels))
    assert found.status is Status.OK, found
    assert found.summary.startswith("1 training packages, each imported from the one copy")
    assert torch.version == "2.5.1+cpu"


@pytest.mark.parametrize("recorded, status", [("2.4.0", Status.WARN), ("2.5.1", Status.OK)])
def test_pip_torch_over_conda_pytorch(tmp_path, wheels, judge, recorded, status):
    prefix = pyenvs.make_conda_prefix(tmp_path / "conda")
    pyenvs.uv_install(wheels, OWN, python=prefix / "bin" / "python")
    (prefix / "conda-meta" / f"pytorch-{recorded}-py3.11_cpu_0.json").write_text(
        json.dumps({"name": "pytorch", "version": recorded}))
    found, _ = judge(prefix)
    assert found.status is status, found
    if status is Status.WARN:
        assert found.summary.startswith("conda's record says pytorch 2.4.0, but torch "
                                        "2.5.1+cpu is what imports")
        assert "conda remove --force pytorch" in found.fix


def test_the_job_sees_what_the_doctor_says(tmp_path, wheels):
    # the shadowing verdict is what Python really does: ask the interpreter itself
    prefix = venv_with_torch(tmp_path / "venv", wheels)
    folder = tmp_path / "pp"
    pyenvs.uv_install(wheels, OTHER, target=folder)
    done = subprocess.run([prefix / "bin" / "python", "-c",
                           "import torch, importlib.metadata as m; "
                           "print(torch.__version__, m.version('torch'))"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(folder)})
    assert done.stdout.split() == ["9.9.0", "9.9.0"], done.stderr
    assert sys.executable != str(prefix / "bin" / "python")


def test_an_editable_install_is_one_copy(tmp_path, wheels, judge):
    # `pip install -e ./accelerate` (a path .pth): metadata in site-packages, the package in
    # the checkout; one install, nothing to warn about
    prefix = venv_with_torch(tmp_path / "venv", wheels)
    checkout = tmp_path / "src" / "accelerate"
    (checkout / "accelerate").mkdir(parents=True)
    (checkout / "accelerate" / "__init__.py").write_text("from .state import *  # noqa\n")
    site = pyenvs.site_packages(prefix)
    meta = site / "accelerate-1.2.0.dev0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: accelerate\nVersion: 1.2.0.dev0\n")
    (meta / "INSTALLER").write_text("pip\n")
    (meta / "direct_url.json").write_text(json.dumps(
        {"url": f"file://{checkout}", "dir_info": {"editable": True}}))
    (site / "__editable__.accelerate-1.2.0.dev0.pth").write_text(f"{checkout}\n")
    found, _ = judge(prefix)
    assert found.status is Status.OK, found
    assert any(line.startswith(f"accelerate 1.2.0.dev0 from {checkout / 'accelerate'} (.pth")
               for line in found.evidence), found.evidence
