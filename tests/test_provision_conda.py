"""--kind conda: the real conda-lock locks a local channel served on 127.0.0.1 (through a
micromamba-compatible command backed by rattler), install_conda installs that lock with every
hash checked. Nothing reaches a conda channel or PyPI: the pip part comes from a local simple
index on the same server. rattler only ever runs in subprocesses."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dsenv.provision import ProvisionError
from dsenv.provision.conda import recipe as pc
from dsenv.provision.conda.install import InstallReport, install_conda
from dsenv.provision.conda.locking import find_conda_exe, lock_conda
from dsenv.staging import staged_dir
from tests.harness.condachannel import (
    build_package,
    build_python_package,
    build_wheel,
    index_channel,
    serve,
    simple_index,
    write_micromamba_shim,
)

yaml = pytest.importorskip("yaml")
pytest.importorskip("conda_lock")
pytest.importorskip("rattler")
if importlib.util.find_spec("uv") is None and shutil.which("uv") is None:
    pytest.skip("uv (the pip part of a conda lock) is not installed", allow_module_level=True)

PY = "{}.{}".format(*sys.version_info[:2])
RECIPES = Path(__file__).resolve().parents[1] / "envs" / "conda"


@dataclass
class World:
    root: Path
    www: Path  # served: www/channel (conda), www/pypi/simple (pip)
    url: str
    bindir: Path
    mapping: Path
    lock: Path
    env: dict


def _env(root: Path, **extra) -> dict:
    env = dict(os.environ)
    # caches of conda-lock's pip solver and uv stay inside the test
    env.update(XDG_CACHE_HOME=str(root / "xdg-cache"), UV_CACHE_DIR=str(root / "uv-cache"))
    env.update(extra)
    return env


def _recipe(path: Path, url: str, specs: list[str], pip: list[str] = ()) -> Path:
    text = f"channels:\n  - {url}/channel\n"
    if pip:
        text += f"pip-repositories:\n  - {url}/pypi/simple\nallow-pypi-requests: false\n"
    text += "dependencies:\n" + "".join(f"  - {s}\n" for s in specs)
    if pip:
        text += "  - pip:\n" + "".join(f"      - {p}\n" for p in pip)
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("conda")
    www = root / "www"
    channel = www / "channel"
    build_package(channel, "libgreet", "1.0", files={"share/greet/data.txt": "data\n"},
                  prefix_files={"etc/greet.conf": "prefix=/opt/anaconda1anaconda2anaconda3\n"})
    build_package(channel, "greet", "1.0", depends=["libgreet"],
                  files={"share/greet/hello.txt": "old\n"})
    build_package(channel, "greet", "2.0", depends=["libgreet >=1.0"],
                  files={"share/greet/hello.txt": "hello\n"}, fmt="conda")
    build_package(channel, "greetpy", "1.0", depends=["python"], noarch="python",
                  files={"site-packages/greetpy.py": "def main():\n    print('greetpy here')\n"},
                  entry_points=["greet-cli = greetpy:main"])
    build_package(channel, "pip", "25.0", files={"share/pip-stub.txt": "pip\n"})
    build_package(channel, "cuda-version", "12.6")
    build_package(channel, "gpukernel", "1.0", depends=["__cuda >=12", "cuda-version >=12.6"],
                  files={"share/gpukernel.txt": "sm_90\n"})
    build_python_package(channel)
    index_channel(channel)
    wheels = root / "wheels"
    simple_index(www / "pypi", [
        build_wheel(wheels, "tinydep", "1.0", "X = 1\n"),
        build_wheel(wheels, "tinyhello", "0.3", "def main():\n    print('hello 0.3')\n",
                    scripts={"tinyhello": "tinyhello:main"}),
        build_wheel(wheels, "tinyhello", "0.4",
                    "import tinydep\n\ndef main():\n    print('hello 0.4', tinydep.X)\n",
                    requires=["tinydep>=1"], scripts={"tinyhello": "tinyhello:main"}),
    ])
    mapping = root / "pypi-to-conda.json"
    mapping.write_text("{}\n")
    bindir = write_micromamba_shim(root / "bin")
    env = _env(root)
    with serve(www) as url:
        recipe = _recipe(root / "demo.yml", url, [f"python {PY}.*", "greet >=2", "greetpy"],
                         pip=["tinyhello >=0.3"])
        lock = lock_conda(recipe, root / "locks" / "demo.conda-lock.yml",
                             conda_exe=str(bindir / "micromamba"), pypi_to_conda_lookup=mapping,
                             timeout=120, env=env)
        yield World(root, www, url, bindir, mapping, lock, env)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _install(world: World, lockfile: Path, prefix: Path, **kwargs) -> InstallReport:
    kwargs.setdefault("cache_dir", prefix.parent / f"{prefix.name}-pkgs")
    return install_conda(lockfile, prefix, timeout=120, env=world.env, **kwargs)


def _edit_lock(src: Path, dst: Path, edit) -> Path:
    data = yaml.safe_load(src.read_text())
    for entry in data["package"]:
        edit(entry)
    dst.write_text(yaml.safe_dump(data, sort_keys=False))
    return dst


# --------------------------------------------------------------------------- lock_conda


def test_real_conda_lock_locks_the_local_channel_with_hashes(world):
    lock = pc.read_conda_lock(world.lock)
    assert lock.platforms == ("linux-64",)
    conda = {p.name: p for p in lock.packages if p.manager == "conda"}
    pip = {p.name: p for p in lock.packages if p.manager == "pip"}
    assert set(conda) == {"greet", "libgreet", "greetpy", "pip", "python"}
    assert conda["greet"].version == "2.0" and conda["greet"].url.endswith(".conda")
    assert {p: pip[p].version for p in pip} == {"tinyhello": "0.4", "tinydep": "1.0"}
    for pkg in conda.values():
        assert pkg.url.startswith(world.url + "/channel/")
        local = world.www / pkg.url[len(world.url) + 1:]
        assert pkg.sha256 == _sha256(local)
        assert pkg.md5 == hashlib.md5(local.read_bytes()).hexdigest()
    for pkg in pip.values():
        assert pkg.url.startswith(world.url + "/pypi/")
        assert pkg.sha256 == _sha256(world.www / pkg.url[len(world.url) + 1:])
    text = world.lock.read_text()
    assert "--lockfile demo.conda-lock.yml" in text  # not the temporary name
    assert [p.name for p in world.lock.parent.iterdir()] == ["demo.conda-lock.yml"]


def test_lock_conda_unsolvable_recipe_is_one_line_naming_the_package(world, tmp_path):
    recipe = _recipe(tmp_path / "bad.yml", world.url, [f"python {PY}.*", "nosuchpkg >=1"])
    out = tmp_path / "out" / "bad.conda-lock.yml"
    with pytest.raises(ProvisionError) as err:
        lock_conda(recipe, out, conda_exe=str(world.bindir / "micromamba"), timeout=120,
                      env=world.env)
    message = str(err.value)
    assert "nosuchpkg" in message and "bad.yml" in message and "\n" not in message
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_lock_conda_offers_cuda_from_the_recipes_cuda_version_pin(world, tmp_path):
    # `cuda-version 12.6.*` in the recipe -> --with-cuda 12.6: a package needing __cuda
    # >=12 solves, whatever GPU the locking machine has (none here).
    micromamba = str(world.bindir / "micromamba")
    recipe = _recipe(tmp_path / "gpu.yml", world.url, ["cuda-version 12.6.*", "gpukernel"])
    assert pc.recipe_cuda(recipe) == "12.6"
    lock = lock_conda(recipe, tmp_path / "gpu.conda-lock.yml", conda_exe=micromamba,
                         timeout=120, env=world.env)
    names = {p.name for p in pc.read_conda_lock(lock).packages}
    assert names == {"cuda-version", "gpukernel"}  # no virtual package in the lock
    # Without a cuda-version pin the solve assumes no CUDA at all (--without-cuda).
    recipe = _recipe(tmp_path / "cpu.yml", world.url, ["gpukernel"])
    with pytest.raises(ProvisionError, match="could not lock cpu.yml .*__cuda"):
        lock_conda(recipe, tmp_path / "cpu.conda-lock.yml", conda_exe=micromamba,
                      timeout=120, env=world.env)


def test_lock_conda_without_any_conda_executable(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CONDA_EXE", raising=False)
    monkeypatch.delenv("MAMBA_EXE", raising=False)
    recipe = tmp_path / "r.yml"
    recipe.write_text("channels: [conda-forge]\ndependencies: [python 3.11.*]\n")
    with pytest.raises(ProvisionError) as err:
        lock_conda(recipe, tmp_path / "r.conda-lock.yml")
    message = str(err.value)
    assert "micromamba, mamba or conda" in message and "commit" in message
    assert "install micromamba" in message and "\n" not in message
    assert not (tmp_path / "r.conda-lock.yml").exists()


def test_lock_conda_named_executable_missing(tmp_path):
    recipe = tmp_path / "r.yml"
    recipe.write_text("channels: [conda-forge]\ndependencies: [python 3.11.*]\n")
    with pytest.raises(ProvisionError, match="'/nowhere/micromamba' not found"):
        lock_conda(recipe, tmp_path / "out.yml", conda_exe="/nowhere/micromamba")
    with pytest.raises(ProvisionError, match="recipe .*missing.yml not found"):
        lock_conda(tmp_path / "missing.yml", tmp_path / "out.yml")


def test_find_conda_exe_prefers_explicit_then_env_then_path(tmp_path):
    bindir = write_micromamba_shim(tmp_path / "bin")
    conda = tmp_path / "other" / "conda"
    conda.parent.mkdir()
    conda.write_text("#!/bin/sh\n")
    conda.chmod(0o755)
    env = {"PATH": str(bindir)}
    assert find_conda_exe(None, env) == str(bindir / "micromamba")
    assert find_conda_exe(None, {**env, "CONDA_EXE": str(conda)}) == str(conda)
    assert find_conda_exe("micromamba", {**env, "CONDA_EXE": str(conda)}) == str(
        bindir / "micromamba")


# --------------------------------------------------------------------------- install_conda


def test_install_into_staging_writes_the_final_path_everywhere(world, tmp_path):
    target = tmp_path / "envs" / "demo"
    cache = tmp_path / "pkgs"
    with staged_dir(target) as staging:
        report = _install(world, world.lock, staging, final_prefix=target, cache_dir=cache)
    assert report.final_prefix == target and report.downloaded == 5 and report.reused == 0
    assert sorted(report.conda) == ["greet=2.0", "greetpy=1.0", "libgreet=1.0", "pip=25.0",
                                    f"python={'{}.{}.{}'.format(*sys.version_info[:3])}"]
    assert sorted(report.pip) == ["tinydep=1.0", "tinyhello=0.4"]

    assert (target / "share/greet/hello.txt").read_text() == "hello\n"  # 2.0, the .conda
    assert (target / "etc/greet.conf").read_text() == f"prefix={target}\n"
    assert (target / "bin/greet-cli").read_text().startswith(f"#!{target}/bin/python")
    assert (target / "bin/tinyhello").read_text().startswith(f"#!{target}/bin/python")
    for script, expected in (("greet-cli", "greetpy here"), ("tinyhello", "hello 0.4 1")):
        out = subprocess.run([str(target / "bin" / script)], capture_output=True, text=True,
                             timeout=60)
        assert out.stdout.strip() == expected, out.stderr
    greet = next((target / "conda-meta").glob("greet-2.0-*.json")).read_text()
    assert f"{world.url}/channel/noarch/greet-2.0-h0_0.conda" in greet
    assert not (target / ".dsenv-extract").exists()
    leftovers = [p for p in target.rglob("*") if p.is_file() and not p.is_symlink()
                 and staging.name.encode() in p.read_bytes()]
    assert leftovers == []

    # A second environment takes the checked archives from the cache.
    again = _install(world, world.lock, tmp_path / "second", cache_dir=cache)
    assert (again.downloaded, again.reused) == (0, 5)


def test_paths_written_are_real_paths_not_through_a_symlink(world, tmp_path):
    # an environment reached through a /home symlink cannot be activated on compute nodes
    # that lack the link (the HPC5 guide, github.com/chrissark/ds-HPC5); files name the real path
    (tmp_path / "real").mkdir()
    (tmp_path / "home").symlink_to(tmp_path / "real")
    target = tmp_path / "home" / "env"
    with staged_dir(target) as staging:
        _install(world, world.lock, staging, final_prefix=target, cache_dir=tmp_path / "pkgs")
    real = tmp_path / "real" / "env"
    assert (real / "etc/greet.conf").read_text() == f"prefix={real}\n"
    assert (real / "bin/tinyhello").read_text().startswith(f"#!{real}/bin/python")


@pytest.mark.parametrize("scheme", ["http", "file"])
def test_tampered_package_in_the_channel_is_refused_before_anything_is_linked(
        world, tmp_path, scheme):
    www = tmp_path / "www"
    shutil.copytree(world.www, www)
    # Another build under the same file name: same name and version, different bytes.
    other = build_package(tmp_path / "evil", "libgreet", "1.0",
                          files={"share/greet/data.txt": "evil\n"})
    shutil.copyfile(other, www / "channel/noarch" / other.name)
    prefix = tmp_path / "prefix"
    with serve(www) as url:
        base = url if scheme == "http" else www.as_uri()
        lock = _edit_lock(world.lock, tmp_path / "moved.conda-lock.yml",
                          lambda e: e.update(url=e["url"].replace(world.url, base)))
        with pytest.raises(ProvisionError) as err:
            _install(world, lock, prefix)
    message = str(err.value)
    assert message.startswith("conda package libgreet=1.0 (") and "sha256" in message
    assert "\n" not in message
    assert not prefix.exists() or list(prefix.iterdir()) == []


def test_tampered_hash_in_the_lock_is_refused(world, tmp_path):
    def edit(entry):
        if entry["name"] == "greet":
            entry["hash"]["sha256"] = "0" * 64
    lock = _edit_lock(world.lock, tmp_path / "t.conda-lock.yml", edit)
    with pytest.raises(ProvisionError, match=r"^conda package greet=2\.0 .*sha256 .*differs "
                                             r"from the lock's 0000"):
        _install(world, lock, tmp_path / "prefix")


def test_tampered_md5_in_the_lock_is_refused(world, tmp_path):
    def edit(entry):
        if entry["name"] == "libgreet":
            entry["hash"]["md5"] = "f" * 32
    lock = _edit_lock(world.lock, tmp_path / "t.conda-lock.yml", edit)
    with pytest.raises(ProvisionError, match=r"^conda package libgreet=1\.0 .*md5"):
        _install(world, lock, tmp_path / "prefix")


def test_tampered_pip_hash_is_refused_naming_the_package(world, tmp_path):
    def edit(entry):
        if entry["name"] == "tinyhello":
            entry["hash"]["sha256"] = "1" * 64
    lock = _edit_lock(world.lock, tmp_path / "t.conda-lock.yml", edit)
    with pytest.raises(ProvisionError) as err:
        _install(world, lock, tmp_path / "prefix")
    message = str(err.value)
    assert message.startswith("pip package tinyhello=0.4 (") and "sha256" in message
    assert "\n" not in message


def test_missing_lockfile_and_wrong_platform(world, tmp_path):
    with pytest.raises(ProvisionError, match="conda lock .*nope.yml not found: make it with "
                                             "`dsenv lock --kind conda"):
        install_conda(tmp_path / "nope.yml", tmp_path / "prefix")
    with pytest.raises(ProvisionError, match="no packages for osx-arm64 .*made for linux-64"):
        install_conda(world.lock, tmp_path / "prefix", platform="osx-arm64")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ProvisionError, match="is not empty"):
        install_conda(world.lock, tmp_path / "full")


def test_read_conda_lock_rejects_what_is_not_a_v1_lock(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("version: 1\npackage: [\n")
    with pytest.raises(ProvisionError, match="not valid YAML"):
        pc.read_conda_lock(bad)
    bad.write_text("version: 2\npackage: []\n")
    with pytest.raises(ProvisionError, match="version 2, expected 1"):
        pc.read_conda_lock(bad)
    bad.write_text("name: env\ndependencies: [python]\n")
    with pytest.raises(ProvisionError, match="not a conda-lock.yml"):
        pc.read_conda_lock(bad)


# --------------------------------------------------------------------------- recipes


def test_shipped_recipes_parse_and_say_how_to_relock(tmp_path):
    from conda_lock.src_parser.environment_yaml import parse_environment_file

    mapping = tmp_path / "mapping.json"
    mapping.write_text("{}\n")
    names = pc.available_recipes()
    assert "cpu" in names and any(pc.recipe_cuda(pc.recipe_path(n)) for n in names)
    for name in names:
        path = pc.recipe_path(name)
        text = path.read_text()
        assert f"dsenv lock --kind conda --stack {name}" in text
        assert "discontinued" in text
        data = yaml.safe_load(text)
        assert data["channels"][0] == "conda-forge" and "pytorch" not in data["channels"]
        assert "defaults" not in data["channels"]
        spec = parse_environment_file(path, ["linux-64"], mapping_url=str(mapping))
        deps = {d.name: d for d in spec.dependencies["linux-64"]}
        assert deps["python"].version == "3.11.*"
        assert {"deepspeed", "transformers"} <= {d for d in deps if deps[d].manager == "pip"}
        torch = "pytorch-gpu" if pc.recipe_cuda(path) else "pytorch-cpu"
        assert deps[torch].manager == "conda"
    assert pc.lock_path("cpu") == RECIPES / "cpu.conda-lock.yml"
    with pytest.raises(ProvisionError, match="no conda recipe for stack 'rocm9'.*cpu"):
        pc.recipe_path("rocm9")


# --------------------------------------------------------------------------- the command
def test_dsenv_provision_kind_conda_builds_activates_and_records(world, tmp_path):
    prefix = tmp_path / "envs" / "demo"
    done = subprocess.run([sys.executable, "-m", "dsenv", "provision", "--kind", "conda",
                           "--arch", "cpu", "--ops", "none", "--lock", str(world.lock),
                           "--prefix", str(prefix)], capture_output=True, text=True,
                          timeout=300, env=world.env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["demo"]
    manifest = json.loads((prefix / "dsenv-env.json").read_text())
    assert (manifest["kind"], manifest["env_dir"]) == ("conda", str(prefix))
    shell = subprocess.run(["sh", "-c", f'. "{prefix}/activate" && echo "$CONDA_PREFIX" && '
                            "greet-cli && tinyhello"], capture_output=True, text=True,
                           timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.split("\n")[:3] == [str(prefix), "greetpy here", "hello 0.4 1"]
