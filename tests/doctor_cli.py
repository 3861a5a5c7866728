"""`python -m dsenv doctor --json` in a clean environment, and fake tools that print recorded
outputs: what the comm_env, node and launch tests share."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from tests.conftest import fixture_text

# Variables of the test runner's own shell that would change what these checks see.
DROPPED = ("NCCL_", "GLOO_", "MASTER_", "SLURM_", "OMP_", "DS_", "DSENV_", "HF_", "TORCH_", "TRITON_",
           "CUDA_", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED)}
    env.update(extra)
    return env


def doctor(*args, env: dict[str, str], cwd=None, preexec_fn=None, timeout=120) -> dict[str, dict]:
    """Run the real CLI; {check id: result} from its JSON report (a traceback fails)."""
    done = subprocess.run([sys.executable, "-m", "dsenv", "doctor", "--json", *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout,
                          preexec_fn=preexec_fn)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return {r["id"]: r for r in json.loads(done.stdout)["results"]}


def tool(folder: Path, name: str, body: str) -> Path:
    """An executable shell script ``folder/name``; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def printing(folder: Path, fixture: str) -> str:
    """A shell command printing a recorded output (its '# source:' line left out)."""
    data = folder / ("out-" + fixture.replace("/", "-"))
    folder.mkdir(parents=True, exist_ok=True)
    data.write_text(fixture_text(fixture))
    return f"{shutil.which('cat')} {shlex.quote(str(data))}"  # works with any PATH


def fake_nvidia_smi(folder: Path, modes: str | None = None, apps: str | None = None,
                    topo: str | None = None) -> Path:
    """nvidia-smi answering the compute-mode, compute-apps and `topo -m` queries with recorded
    outputs; anything else fails as an unknown query would."""
    cases = []
    for pattern, fixture in (("*--query-compute-apps*", apps), ("*compute_mode*", modes),
                             ("*topo*", topo)):
        if fixture == "":  # no rows: the header of the recorded compute-apps output alone
            cases.append(f"  {pattern}) echo 'gpu_uuid, process_name' ;;")
        elif fixture:
            cases.append(f"  {pattern}) {printing(folder / 'data', fixture)} ;;")
    body = 'case "$*" in\n' + "\n".join(cases) + '\n  *) echo "unknown query: $*" >&2; exit 2 ;;\nesac\n'
    return tool(folder / "bin", "nvidia-smi", body)
