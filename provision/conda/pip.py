"""The pip part of a conda lock: its pip packages installed into the conda prefix with
``uv pip install --require-hashes --no-deps`` (every file checked against the lock's sha256)."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from dsenv.proc import CommandResult
from dsenv.provision import ProvisionError
from dsenv.provision.conda.recipe import LockedPackage, display_url
from dsenv.provision.uvcmd import run_uv, uv_binary, uv_error


def pip_install(pkgs: Sequence[LockedPackage], prefix: Path, timeout: float,
                 env: Mapping[str, str]) -> None:
    python = prefix / "bin" / "python"
    if not python.exists():
        raise ProvisionError(f"the lock has pip packages but its conda part installed no "
                             f"Python ({python} missing): add python to the recipe and relock")
    uv_binary()  # a missing uv is one clear line before anything runs
    with tempfile.TemporaryDirectory(prefix="dsenv-conda-pip-") as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text("".join(f"{p.name} @ {p.url} --hash=sha256:{p.sha256}\n"
                                        for p in pkgs), encoding="utf-8")
        result = run_uv(["pip", "install", "--require-hashes", "--no-deps",
                         "--python", str(python), "-r", str(requirements)],
                        timeout=timeout, env=env)
    if result.timed_out:
        raise ProvisionError(f"uv pip install of the lock's {len(pkgs)} pip packages did not "
                             f"finish within {timeout:.0f} s (killed): retry with a longer "
                             "timeout")
    if not result.ok:
        raise ProvisionError(_uv_failure(result, pkgs))


def _uv_failure(result: CommandResult, pkgs: Sequence[LockedPackage]) -> str:
    text = result.stderr + "\n" + result.stdout
    mismatch = re.search(r"Hash mismatch for `([^`@ ]+)", text)
    if mismatch:
        name = mismatch.group(1)
        pkg = next((p for p in pkgs if p.name.lower() == name.lower()), None)
        computed = re.search(r"Computed:\s*(sha256:[0-9a-f]+)", text)
        got = f" (got {computed.group(1)[:23]}...)" if computed else ""
        where = f"{pkg.spec} ({display_url(pkg.url)})" if pkg else name
        return (f"pip package {where}: sha256 differs from the lock's{got}: the file changed "
                "since the lock was made; relock (`dsenv lock --kind conda`) only if the "
                "index really replaced it")
    return (uv_error(result, "uv could not install the lock's pip packages")
            + ": check the index is reachable (HTTPS_PROXY) and the lock is current")
