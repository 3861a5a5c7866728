"""Real Python environments for the doctor's tests: venvs (with or without the system site
packages), a conda-style prefix with its own interpreter, tiny wheels built here and
installed with uv from a local folder (no index). None of them contains dsenv.

The fake ``torch`` wheels are a package with a real ``torch/version.py``; importing one
appends a line to ``$FAKE_TORCH_MARK``, so a test can prove nothing imported it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

PYDIR = f"python{sys.version_info.major}.{sys.version_info.minor}"
MARK_VARIABLE = "FAKE_TORCH_MARK"
TORCH_INIT = (f"import os\nwith open(os.environ.get({MARK_VARIABLE!r}) or os.devnull, 'a') as f:\n"
              "    f.write(__file__ + '\\n')\nfrom .version import __version__  # noqa\n")


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_wheel(out: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel ``name-version`` holding ``files`` (path in the wheel -> text)."""
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    info = f"{stem}.dist-info"
    entries = {**files,
               f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
               f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: dsenv-tests\n"
                                "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},{_record_hash(text.encode())},{len(text.encode())}"
              for path, text in entries.items()]
    entries[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    wheel = out / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in entries.items():
            zf.writestr(zipfile.ZipInfo(path, date_time=(2024, 1, 1, 0, 0, 0)), text)
    return wheel


def torch_wheel(out: Path, version: str, cuda: str | None = None) -> Path:
    """A fake torch: torch/version.py as PyTorch writes it, an __init__ that leaves a mark."""
    version_py = (f"__version__ = {version!r}\ndebug = False\ncuda = {cuda!r}\n"
                  "git_version = 'dsenv-tests'\nhip = None\n")
    return build_wheel(out, "torch", version, {"torch/__init__.py": TORCH_INIT,
                                               "torch/version.py": version_py})


def simple_wheel(out: Path, name: str, version: str) -> Path:
    module = re.sub(r"[-.]+", "_", name)
    return build_wheel(out, name, version,
                       {f"{module}/__init__.py": f"__version__ = {version!r}\n"})


def _run(argv: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300,
                          **kwargs)
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return done


def make_venv(path: Path, system_site_packages: bool = False) -> Path:
    """``python -m venv`` (no pip: packages come from uv) of the interpreter running the tests."""
    argv = [sys.executable, "-m", "venv", "--without-pip", path]
    if system_site_packages:
        argv.insert(4, "--system-site-packages")
    _run(argv)
    return path


def make_conda_prefix(path: Path) -> Path:
    """A conda-style prefix: conda-meta/, bin/pythonX.Y (a copy of the base interpreter, so
    ``sys.prefix`` is this folder), lib/pythonX.Y with the base's standard library linked in
    and an empty site-packages. No pyvenv.cfg: Python finds its prefix as in a conda env."""
    base = Path(sys.base_prefix) / "lib" / PYDIR
    (path / "bin").mkdir(parents=True)
    shutil.copy2(os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
                 path / "bin" / PYDIR)
    for alias in ("python3", "python"):
        (path / "bin" / alias).symlink_to(PYDIR)
    lib = path / "lib" / PYDIR
    lib.mkdir(parents=True)
    for entry in base.iterdir():
        if entry.name != "site-packages":
            (lib / entry.name).symlink_to(entry)
    (lib / "site-packages").mkdir()
    (path / "conda-meta").mkdir()
    (path / "conda-meta" / "history").write_text("")
    return path


def make_source_build_prefix(path: Path, without: tuple[str, ...] = ()) -> Path:
    """A Python prefix as a source build (pyenv, a site's module) leaves it: bin/pythonX.Y (a
    copy of the base interpreter), the base's standard library linked in, and lib-dynload
    holding every compiled module of the base but those in ``without`` (``"_lzma"``): what
    CPython's build leaves out when the library's headers are missing on the build host."""
    make_conda_prefix(path)
    shutil.rmtree(path / "conda-meta")
    dynload = path / "lib" / PYDIR / "lib-dynload"
    dynload.unlink()
    dynload.mkdir()
    for entry in (Path(sys.base_prefix) / "lib" / PYDIR / "lib-dynload").iterdir():
        if entry.name.split(".")[0] not in without:
            (dynload / entry.name).symlink_to(entry)
    return path


def site_packages(prefix: Path) -> Path:
    return prefix / "lib" / PYDIR / "site-packages"


def user_site(home: Path) -> Path:
    """``~/.local/lib/pythonX.Y/site-packages`` for HOME=``home``."""
    return home / ".local" / "lib" / PYDIR / "site-packages"


def uv_install(wheels: Path, *requirements: str, python: Path | None = None,
               target: Path | None = None) -> None:
    """``uv pip install`` from the ``wheels`` folder only, into ``python``'s environment or
    into the folder ``target`` (as `pip install --target` does)."""
    argv = ["uv", "pip", "install", "--offline", "--no-index", "--find-links", wheels,
            "--no-deps", "--link-mode", "copy"]
    if target is not None:
        argv += ["--target", target, "--python", python or sys.executable]
    else:
        argv += ["--python", python]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "CONDA"))}
    _run(argv + list(requirements), env=env)


def doctor_env(**extra: str) -> dict[str, str]:
    """This process's environment without any activated environment or PYTHONPATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "DSENV_ENV",
                        "PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    env.update(extra)
    return env
