"""The built-ops cache (provision/ops/cache.py) for real: uv builds a DeepSpeed-like sdist
(its setup.py writes installed_ops as DeepSpeed's does and counts its builds), the wheel is
kept in a cache folder, and the next env with the same key installs it instead of building:
miss then hit, a key change misses, a corrupted entry is detected, rebuilt and said so, two
concurrent provisions on one cache folder build once. The real CPU stack twice through
`dsenv provision` is the slow test at the end (and bench/provision_ops_cache.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from dsenv.facts.toolchain.cpu_isa import NativeIsa
from dsenv.provision import ProvisionError
from dsenv.provision.ops.build import verify_installed_ops
from dsenv.provision.ops.cache import (
    ENV_VARIABLE,
    CacheDir,
    ops_key,
    provide_ops,
    read_entry,
    resolve_dir,
)
from dsenv.provision.uvcmd import Sources
from dsenv.provision.venv import make_venv
from tests.harness.tarfiles import add_text as _add

SETUP_PY = '''
import os, time
from setuptools import setup
OPS = {"cpu_adam": "DS_BUILD_CPU_ADAM", "cpu_lion": "DS_BUILD_CPU_LION"}
installed = {name: int(os.environ.get(var, "0")) for name, var in OPS.items()}
count = os.environ.get("DSENV_TEST_BUILD_COUNT")
if count:
    with open(count, "a") as f:
        f.write(f"{os.getpid()} {sorted(k for k, v in installed.items() if v)}\\n")
time.sleep(float(os.environ.get("DSENV_TEST_BUILD_SLEEP", "0")))
with open("deepspeed/git_version_info_installed.py", "w") as f:
    f.write(f"version='0.0.2'\\ninstalled_ops={installed!r}\\naccelerator_name='cpu'\\n")
setup(name="deepspeed", version="0.0.2",
      packages=["deepspeed", "deepspeed.ops", "deepspeed.ops.op_builder"])
'''

BUILDERS = '''
class CPUAdamBuilder:
    BUILD_VAR = "DS_BUILD_CPU_ADAM"
    NAME = "cpu_adam"
class CPULionBuilder:
    BUILD_VAR = "DS_BUILD_CPU_LION"
    NAME = "cpu_lion"
'''

ADAM = {"DS_BUILD_CPU_ADAM": "1"}


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> tuple[Path, str]:
    """(a folder with deepspeed-0.0.2.tar.gz, its requirement line with the sdist's hash)."""
    folder = tmp_path_factory.mktemp("fake-ds-cache")
    path = folder / "deepspeed-0.0.2.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        top = "deepspeed-0.0.2/"
        _add(tar, top + "PKG-INFO", "Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.0.2\n")
        _add(tar, top + "setup.py", textwrap.dedent(SETUP_PY))
        for package in ("deepspeed", "deepspeed/ops", "deepspeed/ops/op_builder"):
            _add(tar, top + package + "/__init__.py", "")
        _add(tar, top + "deepspeed/ops/op_builder/builders.py", BUILDERS)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return folder, f"deepspeed==0.0.2 --hash=sha256:{digest}"


@pytest.fixture
def world(tmp_path, sdist):
    """``provide(name, ops)`` builds or reuses into a fresh venv ``name``; ``builds()``: the
    builds setup.py counted."""
    folder, requirement = sdist
    count = tmp_path / "builds.txt"
    cache = CacheDir(tmp_path / "cache", "test")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "DSENV_TEST_BUILD_COUNT": str(count)}
    said: list[str] = []

    def provide(name: str, ops=ADAM, **kw):
        python = make_venv(tmp_path / name, python=sys.executable, system_site_packages=True)
        return provide_ops(python, ops, {}, deepspeed_requirement=requirement,
                           log=tmp_path / f"{name}.log", cache=kw.pop("cache", cache),
                           sources=Sources.of([folder], no_index=True), compile_bytecode=False,
                           env=kw.pop("env", env), say=said.append, **kw)

    def builds() -> int:
        return len(count.read_text().splitlines()) if count.exists() else 0

    provide.cache, provide.said, provide.builds, provide.env = cache, said, builds, env
    provide.requirement, provide.folder = requirement, folder
    return provide


def entries(cache: CacheDir) -> list[Path]:
    return sorted(p for p in cache.path.iterdir() if not p.name.startswith("."))


def test_miss_then_hit_installs_the_cached_wheel_and_verifies_it(world, tmp_path):
    first = world("env1")
    assert first.cache["result"] == "miss" and world.builds() == 1
    assert first.ops == ["cpu_adam"]
    [entry] = entries(world.cache)
    record = json.loads((entry / "entry.json").read_text())
    assert record["wheel"] == "deepspeed-0.0.2-py3-none-any.whl"
    assert record["key"]["ops"] == ADAM and record["key"]["deepspeed"] == "0.0.2"
    assert record["key"]["sdist_sha256"] == [world.requirement.rsplit(":", 1)[1]]
    assert record["sha256"] == hashlib.sha256((entry / record["wheel"]).read_bytes()).hexdigest()

    second = world("env2")
    assert second.cache["result"] == "hit" and world.builds() == 1  # nothing compiled
    assert second.cache["key"] == first.cache["key"] and second.ops == ["cpu_adam"]
    assert verify_installed_ops(tmp_path / "env2" / "bin" / "python", ["cpu_adam"]) == ([], [])
    log = (tmp_path / "env2.log").read_text()
    assert "DeepSpeed ops from the ops cache" in log
    assert "=== dsenv: installed from the ops cache cpu_adam" in log
    assert not world.said  # nothing to say on a clean hit
    assert [p.name for p in entries(world.cache)] == [entry.name]  # no lock or staging left


def test_a_changed_op_set_misses_and_builds_its_own_entry(world):
    world("env1")
    other = world("env2", ops={"DS_BUILD_CPU_ADAM": "1", "DS_BUILD_CPU_LION": "1"})
    assert other.cache["result"] == "miss" and world.builds() == 2
    assert other.ops == ["cpu_adam", "cpu_lion"]
    assert len(entries(world.cache)) == 2


def test_what_changes_the_bytes_changes_the_key(world, tmp_path):
    python = make_venv(tmp_path / "k", python=sys.executable, system_site_packages=True)
    sources = Sources.of([world.folder], no_index=True)

    def key(ops=ADAM, arch=None, env=None, native=None, requirement=world.requirement):
        return ops_key(python, ops, arch or {}, requirement, sources,
                       env or world.env, native).digest

    native = NativeIsa("c++", "cooperlake", ("-march=cooperlake", "-mavx512f"), ("avx512f",),
                       ("avx512f",))
    older = NativeIsa("c++", "haswell", ("-march=haswell", "-mno-avx512f"), (), ())
    base = key(native=native)
    assert base == key(native=native)  # stable
    assert key(native=older) != base  # another CPU's -march=native
    assert key({"DS_BUILD_CPU_LION": "1"}, native=native) != base
    assert key(arch={"TORCH_CUDA_ARCH_LIST": "8.0"}, native=native) != base
    assert key(env={**world.env, "CXXFLAGS": "-O1"}, native=native) != base
    assert key(requirement="deepspeed==0.0.2 --hash=sha256:" + "0" * 64, native=native) != base
    assert key(env={**world.env, "DS_ACCELERATOR": "cuda"}, native=native) != base


def test_a_corrupted_entry_is_detected_rebuilt_and_said(world):
    world("env1")
    [entry] = entries(world.cache)
    wheel = next(entry.glob("*.whl"))
    wheel.write_bytes(wheel.read_bytes()[:-10] + b"corrupted!")
    again = world("env2")
    assert again.cache["result"].startswith("rebuilt: corrupt entry")
    assert "sha256" in again.cache["result"] and world.builds() == 2
    assert len(world.said) == 1 and "is corrupt" in world.said[0] and "rebuilding" in world.said[0]
    assert again.ops == ["cpu_adam"]
    key = type("K", (), {"digest": again.cache["key"]})()
    assert read_entry(entry, key) is not None  # replaced by a sound entry
    (entry / "entry.json").write_text("{not json")
    third = world("env3")
    assert third.cache["result"].startswith("rebuilt: corrupt entry") and world.builds() == 3


def test_a_run_that_may_not_wait_builds_without_the_cache(world):
    from dsenv import targetlock

    world("env1")
    [entry] = entries(world.cache)
    with targetlock.hold(entry, "another dsenv provision"):  # another run holds the entry
        busy = world("env2", wait=0)
    assert busy.cache["result"] == "busy: built without it" and world.builds() == 2
    assert busy.ops == ["cpu_adam"]
    assert "another dsenv provision" in world.said[0]
    assert world.said[0].endswith("building without the cache")


def test_the_cache_off_builds_every_time(world):
    off = CacheDir(None, "--ops-cache")
    assert world("env1", cache=off).cache["result"] == "off"
    assert world("env2", cache=off).cache["result"] == "off"
    assert world.builds() == 2 and not world.cache.path.exists()


CONCURRENT = r"""
import json, sys
from pathlib import Path
from dsenv.provision.ops.cache import CacheDir, provide_ops
from dsenv.provision.uvcmd import Sources
from dsenv.provision.venv import make_venv
root, cache, folder, requirement = sys.argv[1:5]
python = make_venv(Path(root), python=sys.executable, system_site_packages=True)
said = []
built = provide_ops(python, {"DS_BUILD_CPU_ADAM": "1"}, {}, deepspeed_requirement=requirement,
                    log=Path(root + ".log"), cache=CacheDir(Path(cache), "test"),
                    sources=Sources.of([folder], no_index=True), compile_bytecode=False,
                    wait=120, say=said.append)
print("@@" + json.dumps({"result": built.cache["result"], "ops": built.ops, "said": said}))
"""


def test_two_concurrent_provisions_on_one_cache_build_once(world, tmp_path):
    env = {**world.env, "DSENV_TEST_BUILD_SLEEP": "3"}  # the second starts mid-build
    children = []
    for name in ("a", "b"):
        children.append(subprocess.Popen(
            [sys.executable, "-c", CONCURRENT, str(tmp_path / name), str(world.cache.path),
             str(world.folder), world.requirement], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True))
        time.sleep(0.3)
    results = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        results.append(json.loads(out.split("@@", 1)[1]))
    assert sorted(r["result"] for r in results) == ["hit", "miss"], results
    assert all(r["ops"] == ["cpu_adam"] for r in results)
    assert world.builds() == 1
    waited = [r for r in results if r["result"] == "hit"][0]["said"]
    assert waited and waited[0].startswith("ops cache: waiting for dsenv provision (ops cache)")


def test_where_the_cache_lives(tmp_path):
    env = {"HOME": str(tmp_path / "home")}
    assert resolve_dir(env=env) == CacheDir(tmp_path / "home/.cache/dsenv/ops-cache", "default")
    assert resolve_dir(env={**env, "XDG_CACHE_HOME": str(tmp_path / "xdg")}).path == (
        tmp_path / "xdg/dsenv/ops-cache")
    site = resolve_dir(None, "${SCRATCH}/ops", "daint", {**env, "SCRATCH": "/scratch/u"})
    assert site == CacheDir(Path("/scratch/u/ops"), "site daint")
    env[ENV_VARIABLE] = str(tmp_path / "fromenv")
    assert resolve_dir(None, "/site", "x", env).source == ENV_VARIABLE
    assert resolve_dir(str(tmp_path / "opt"), "/site", "x", env) == CacheDir(
        tmp_path / "opt", "--ops-cache")
    assert resolve_dir("none", "/site", "x", env).path is None
    with pytest.raises(ProvisionError, match="unset variable"):
        resolve_dir(None, "${NO_SUCH_DSENV_VAR}/ops", "x", {"HOME": "/h"})


def test_the_dry_run_names_the_cache(tmp_path):
    from tests.harness.cli import dsenv

    # an ops build is planned (with --ops none nothing is built, and no cache is asked)
    done = dsenv("provision", "--arch", "cpu", "--ops", "cpu_adam", "--dry-run", "--prefix",
                 tmp_path / "env", "--ops-cache", tmp_path / "shared-ops")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert f"ops cache {tmp_path / 'shared-ops'} (--ops-cache)" in text
    # the build keeps its wheel for the cache: uv's cache of this build alone, not --no-cache
    assert "dsenv-ops-XXXXXXXX/uv-cache " in text and "--no-cache" not in text


# The real CPU stack provisioned twice with one cache: tests/provision/test_real_env.py.
