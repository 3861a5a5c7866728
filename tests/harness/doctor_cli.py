"""`python -m dsenv doctor --json` in a clean environment, its report read back (also from a
launcher's output), and fake tools that print recorded outputs: what the comm_env, node,
launch and distributed tests share."""

from __future__ import annotations

import json
import shlex
import shutil
import stat
from pathlib import Path

import jsonschema

from dsenv.doctor import registry
from tests.harness.cli import dsenv, environment
from tests.harness.recorded import fixture_text

SCHEMA = json.loads((Path(registry.__file__).parent / "report_schema.json").read_text())
# Variables of the test runner's own shell that would change what these checks see.
DROPPED = ("NCCL_", "GLOO_", "MASTER_", "SLURM_", "OMP_", "DS_", "DSENV_", "HF_", "TORCH_",
           "TRITON_", "CUDA_", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without DROPPED, with ``extra``."""
    return environment(extra, drop=DROPPED)


def doctor(*args, env: dict[str, str], cwd=None, preexec_fn=None,
           timeout=120) -> dict[str, dict]:
    """`dsenv doctor --json ARGS` with exactly ``env``; {check id: result} from its report
    (a traceback fails)."""
    done = dsenv("doctor", "--json", *args, base=env, cwd=cwd, timeout=timeout,
                 preexec_fn=preexec_fn)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return {r["id"]: r for r in json.loads(done.stdout)["results"]}


def report_of(stdout: str) -> dict:
    """The JSON report in a launcher's stdout (the deepspeed launcher logs there too),
    valid against the report's schema."""
    lines = stdout.splitlines()
    start = lines.index("{")
    end = len(lines) - 1 - lines[::-1].index("}")
    report = json.loads("\n".join(lines[start:end + 1]))
    jsonschema.validate(report, SCHEMA)
    return report


def statuses(report: dict) -> dict[str, str]:
    """{check id: status} of the distributed area."""
    return {r["id"]: r["status"] for r in report["results"] if r["area"] == "distributed"}


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
                    topo: str | None = None, listing: str | None = None,
                    inventory: str | None = None) -> Path:
    """nvidia-smi answering the compute-mode, compute-apps, `topo -m`, `-L` and inventory
    queries with recorded outputs; anything else fails as an unknown query would."""
    cases = []
    for pattern, fixture in (("*--query-compute-apps*", apps), ("*compute_mode*", modes),
                             ("*topo*", topo), ("-L", listing), ("*pci.bus_id*", inventory)):
        if fixture == "":  # no rows: the header of the recorded compute-apps output alone
            cases.append(f"  {pattern}) echo 'gpu_uuid, process_name' ;;")
        elif fixture:
            cases.append(f"  {pattern}) {printing(folder / 'data', fixture)} ;;")
    body = 'case "$*" in\n' + "\n".join(cases) + '\n  *) echo "unknown query: $*" >&2; exit 2 ;;\nesac\n'
    return tool(folder / "bin", "nvidia-smi", body)
