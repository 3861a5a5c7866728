"""The environment under test is the job's: `dsenv doctor --env PREFIX|PYTHON`, else the
activated one, else python3 on PATH, else dsenv's own interpreter.

Every environment here is real and holds no dsenv: venvs made with `python -m venv`, a
conda-style prefix with its own interpreter, a container-style venv with the system site
packages, packages installed with uv from wheels built here. The doctor runs as a user runs
it, from the interpreter that has dsenv, and must never import the environment's torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from dsenv.doctor import registry
from dsenv.facts.python import target_env
from dsenv.facts.python.torch_info import read_torch_build
from tests.harness import pyenvs
from tests.harness.cli import dsenv
from tests.harness.mountns import FUSE_MOUNT, in_namespace, needs_fuse

SCHEMA = json.loads((Path(registry.__file__).parent / "report_schema.json").read_text())
AREAS = "python,torch,deepspeed,system"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheels")
    pyenvs.torch_wheel(out, "2.5.1+cpu")
    return out


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheels):
    """A venv without dsenv, with the fake torch 2.5.1+cpu."""
    prefix = pyenvs.make_venv(tmp_path_factory.mktemp("venv") / "train")
    pyenvs.uv_install(wheels, "torch==2.5.1+cpu", python=prefix / "bin" / "python")
    return prefix


@pytest.fixture(scope="module")
def conda(tmp_path_factory, wheels):
    prefix = pyenvs.make_conda_prefix(tmp_path_factory.mktemp("conda") / "ds")
    pyenvs.uv_install(wheels, "torch==2.5.1+cpu", python=prefix / "bin" / "python")
    return prefix


def doctor(*args, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`python -m dsenv doctor ARGS` with dsenv's interpreter (dsenv installed elsewhere), no
    activated environment unless ``env`` activates one; FAKE_TORCH_MARK catches any import."""
    full = pyenvs.doctor_env(HOME=str(tmp_path / "home"),
                             DSENV_CACHE_DIR=str(tmp_path / "cache"),
                             **{pyenvs.MARK_VARIABLE: str(tmp_path / "torch-imported")})
    done = dsenv("doctor", *args, base=full, env=env, timeout=300)
    assert not (tmp_path / "torch-imported").exists(), "the environment's torch was imported"
    return done


def report(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode in (0, 1), done.stdout + done.stderr
    data = json.loads(done.stdout)
    jsonschema.validate(data, SCHEMA)
    return data


def result(data: dict, check_id: str) -> dict:
    return next(r for r in data["results"] if r["id"] == check_id)


def activated(prefix: Path, variable: str = "VIRTUAL_ENV") -> dict[str, str]:
    return {variable: str(prefix), "PATH": f"{prefix / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def test_the_environments_hold_no_dsenv(venv, conda, tmp_path):
    for prefix in (venv, conda):  # (from tmp_path: the checkout's dsenv/ folder is no install)
        done = subprocess.run([prefix / "bin" / "python", "-c", "import dsenv"],
                              capture_output=True, text=True, timeout=60,
                              env=pyenvs.doctor_env(), cwd=tmp_path)
        assert done.returncode == 1 and "No module named 'dsenv'" in done.stderr


def test_env_prefix_of_a_venv_is_judged(venv, tmp_path):
    data = report(doctor("--env", venv, "--json", "--only", AREAS, tmp_path=tmp_path))
    env = data["environment"]
    assert env["prefix"] == str(venv) and env["source"] == "option" and env["probed"]
    assert env["chosen_by"] == f"--env {venv}" and not env["own"]
    assert env["executable"].startswith(str(venv / "bin"))
    torch = result(data, "torch.build")
    assert torch["status"] == "ok" and "torch 2.5.1+cpu" in torch["summary"]
    assert str(venv) in torch["evidence"][0]
    interp = result(data, "python.interpreter")
    assert interp["status"] == "ok" and f"at {venv}/bin/python3 (venv)" in interp["summary"]
    assert result(data, "deepspeed.install")["status"] == "fail"  # not in this env, though
    assert result(data, "python.shadowing")["status"] == "ok"  # dsenv's own env has it


def test_env_python_executable_is_judged(venv, tmp_path):
    data = report(doctor("--env", venv / "bin" / "python", "--json", "--only", "python,torch",
                         tmp_path=tmp_path))
    assert data["environment"]["prefix"] == str(venv)
    assert "torch 2.5.1+cpu" in result(data, "torch.build")["summary"]


def test_activated_venv_is_the_default(venv, tmp_path):
    data = report(doctor("--json", "--only", "python,torch", tmp_path=tmp_path,
                         **activated(venv)))
    env = data["environment"]
    assert env["source"] == "VIRTUAL_ENV" and env["prefix"] == str(venv)
    assert "torch 2.5.1+cpu" in result(data, "torch.build")["summary"]


def test_python3_first_on_path_without_activation(venv, tmp_path):
    data = report(doctor("--json", "--only", "python,torch", tmp_path=tmp_path,
                         PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"))
    env = data["environment"]
    assert env["source"] == "PATH" and env["prefix"] == str(venv)
    assert env["chosen_by"] == f"python3 first on PATH: {venv / 'bin' / 'python3'}"
    assert "torch 2.5.1+cpu" in result(data, "torch.build")["summary"]


def test_dsenv_own_interpreter_when_nothing_else(tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    data = report(doctor("--json", "--only", "python,torch", tmp_path=tmp_path,
                         PATH=str(empty)))
    env = data["environment"]
    assert env["source"] == "dsenv" and env["own"] and env["python"] == sys.executable
    torch = result(data, "torch.build")
    assert read_torch_build(sys.path).version in torch["summary"]


def test_activated_conda_prefix(conda, tmp_path):
    data = report(doctor("--json", "--only", "python,torch", tmp_path=tmp_path,
                         **activated(conda, "CONDA_PREFIX")))
    env = data["environment"]
    assert env["source"] == "CONDA_PREFIX" and env["prefix"] == str(conda)
    interp = result(data, "python.interpreter")
    assert interp["status"] == "ok" and "(conda env)" in interp["summary"]
    assert "torch 2.5.1+cpu" in result(data, "torch.build")["summary"]


def test_a_venv_activated_inside_a_conda_env_wins(venv, conda, tmp_path):
    # `conda activate ds` then `. venv/bin/activate`: the venv's bin/ is first on PATH
    path = os.pathsep.join([str(venv / "bin"), str(conda / "bin"), os.environ["PATH"]])
    data = report(doctor("--json", "--only", "python", tmp_path=tmp_path, PATH=path,
                         VIRTUAL_ENV=str(venv), CONDA_PREFIX=str(conda)))
    assert data["environment"]["source"] == "VIRTUAL_ENV"
    assert data["environment"]["prefix"] == str(venv)
    interp = result(data, "python.interpreter")
    assert any(f"CONDA_PREFIX={conda}" in e for e in interp["evidence"])


def test_container_style_env_sees_the_images_packages(tmp_path, wheels):
    # a venv made with --system-site-packages over the image's Python (here: the Python
    # running the tests, with its real torch): the job imports the image's torch
    prefix = pyenvs.make_venv(tmp_path / "container-env", system_site_packages=True)
    pyenvs.uv_install(wheels, "torch==2.5.1+cpu", target=tmp_path / "unused")  # warm the cache
    data = report(doctor("--env", prefix, "--json", "--only", "python,torch",
                         tmp_path=tmp_path))
    base = read_torch_build(sys.path)
    assert f"torch {base.version}" in result(data, "torch.build")["summary"]
    interp = result(data, "python.interpreter")
    assert interp["status"] == "ok" and "venv with system site packages" in interp["summary"]
    assert result(data, "python.shadowing")["status"] == "ok"


def test_header_names_the_environment_and_why(venv, tmp_path):
    done = doctor("--env", venv, "--only", "python", tmp_path=tmp_path)
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("environment "))
    version = ".".join(map(str, sys.version_info[:3]))
    assert header == f"environment {venv} (Python {version}) — --env {venv}"


@pytest.mark.parametrize("value, says", [
    ("/nonexistent/env", "no such file or folder"),
    ("{tmp}", "not a Python environment"),
])
def test_bad_env_is_one_line(tmp_path, value, says):
    done = doctor("--env", value.format(tmp=tmp_path), tmp_path=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsenv doctor: --env ") and says in lines[0]


def test_probe_imports_nothing_and_honours_pythonpath(venv, tmp_path, make_ctx):
    extra = tmp_path / "extra"
    extra.mkdir()
    ctx = make_ctx(env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
                        "PYTHONPATH": str(extra),
                        pyenvs.MARK_VARIABLE: str(tmp_path / "torch-imported")},
                   environment=str(venv))
    env = target_env.environment(ctx)
    assert env.probed and env.path[0] == str(extra)  # PYTHONPATH first, as the job has it
    assert env.modules["torch"].folder == pyenvs.site_packages(venv) / "torch"
    assert env.preloaded == () and not (tmp_path / "torch-imported").exists()


# The environment under test on a Lustre whose one storage target (OST) went down: folders and
# listings answer, files that existed when it went down do not (tests/harness/fusefs.py
# files-hang). A prefix with an interpreter (a script that runs this one on the prefix's
# site-packages), torch's version file and metadata. "everything": the target went down after
# the whole prefix was written; "packages": the interpreter was written after it went down, so
# it starts, and the packages it would import do not answer.
DEAD_OST_ENV = FUSE_MOUNT + """
fuse_mount "$MNT" files-hang
S="$MNT/env/lib/python3.11/site-packages"
mkdir -p "$MNT/env/bin" "$S/torch" "$S/torch-2.13.0.dist-info"
printf "__version__ = '2.13.0+cpu'\\ncuda = None\\n" > "$S/torch/version.py"
echo "from .version import __version__" > "$S/torch/__init__.py"
printf 'Metadata-Version: 2.1\\nName: torch\\nVersion: 2.13.0+cpu\\n' > "$S/torch-2.13.0.dist-info/METADATA"
[ "$DOWN" != packages ] || touch "$MNT/.ost-down"
printf '#!/bin/sh\\nPYTHONPATH=%s exec %s "$@"\\n' "$S" "$PY" > "$MNT/env/bin/python3"
chmod +x "$MNT/env/bin/python3"
[ "$DOWN" != everything ] || touch "$MNT/.ost-down"
timeout -s KILL 60 "$PY" -m dsenv doctor --env "$MNT/env" --only python,torch --probe-timeout 2 --json > "$OUT" || true
[ -z "$LOG" ] || echo "$LOG" | timeout -s KILL 60 "$PY" -m dsenv explain --here --probe-timeout 2 --env "$MNT/env" - > "$OUT.explain" || true
"""
# A log whose cause torch.driver checks (it needs the environment's torch).
DRIVER_LOG = ("UserWarning: CUDA initialization: The NVIDIA driver on your system is too old "
              "(found version 11040).")


def _dead_ost_env(tmp_path, down: str, log: str = "") -> tuple[dict, float]:
    needs_fuse()
    out = tmp_path / "report.json"
    start = time.monotonic()
    done = in_namespace(DEAD_OST_ENV, timeout=120, env={
        "MNT": str(tmp_path / "mnt"), "OUT": str(out), "DOWN": down, "LOG": log,
        "HOME": str(tmp_path / "home")})
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    return {r["id"]: r for r in report["results"]}, seconds


@pytest.mark.parametrize("down, what", [
    ("everything", "the environment (--env) {mnt}/env"),
    ("packages", "the environment's packages in {mnt}/env/lib/python3.11/site-packages")])
def test_an_environment_whose_files_stopped_answering_is_not_judged(tmp_path, down, what):
    """Before, the doctor stayed blocked in a stat of the prefix's bin/python3 (in this
    process, before any check ran) until `timeout -s KILL` ended it at 90 s, with no report.
    Now the prefix and each folder of its search path are statted in a child first
    (mounts.require_files): every check that needs the environment says it was not judged and
    names the folder, none passes on what was not read, none errors, and the doctor exits."""
    found, seconds = _dead_ost_env(tmp_path, down, DRIVER_LOG if down == "everything" else "")
    assert seconds < 60, seconds
    named = what.format(mnt=tmp_path / "mnt")
    needs_env = [r for r in found.values() if r["id"] != "python.workload-packages"]
    assert len(needs_env) > 10
    for result in needs_env:
        assert result["status"] == "warn", result
        assert result["summary"].startswith(f"not judged: {named} gave no answer to a stat"), \
            result["summary"]
        assert "lfs check servers" in result["fix"]
    if down == "everything":  # explain --here rules nothing out on what it could not read
        explained = (tmp_path / "report.json.explain").read_text()
        assert "on this node torch.driver finds: WARN not judged: " in explained, explained
        assert "the check could not read what it needs here (its file system gave no answer), " \
               "so nothing is ruled out" in " ".join(explained.split()), explained


def test_the_same_environment_whose_files_answer_is_read(tmp_path):
    found, seconds = _dead_ost_env(tmp_path, "none")
    assert not [r["id"] for r in found.values() if "not judged" in r["summary"]]
    assert found["torch.build"]["status"] == "ok", found["torch.build"]
    assert "torch 2.13.0+cpu" in found["torch.build"]["summary"]
    assert found["python.interpreter"]["status"] == "ok", found["python.interpreter"]
    assert seconds < 40, seconds
