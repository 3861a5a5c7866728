"""Running dsenv workloads as subprocesses in tests: environment, timeouts, one-line errors.

Every run is a subprocess with a timeout that kills its whole process group (the runner of
tests/harness/cli.py). Distributed runs talk over loopback only (MASTER_ADDR=127.0.0.1,
GLOO_SOCKET_IFNAME=lo, a free port).
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from tests.harness.cli import explain, run

MODULE = "dsenv.workloads.cli"
SMOKE = [sys.executable, "-m", MODULE, "smoke", "bert-squad"]
RUN = [sys.executable, "-m", MODULE, "run", "bert-squad"]
# `dsenv smoke all`: the workloads in the order it runs them, and the main metric each healthy
# smoke must reach at its default settings (None: perplexity, judged <= 20 instead)
SMOKE_ALL = ["bert-squad", "t5-xsum", "gpt2-wikitext", "bert-mrpc"]
MAIN_METRIC = {"bert-squad": ("exact_match", 60.0), "t5-xsum": ("rouge1", 70.0),
               "gpt2-wikitext": ("perplexity", None), "bert-mrpc": ("accuracy", 80.0)}
# what mpirun passes on to its ranks (-x), for every workload's 2-rank tests
MPI_EXPORTED = ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS",
                "TORCH_EXTENSIONS_DIR", "DS_ACCELERATOR", "HF_HUB_OFFLINE", "PATH",
                "PYTHONUNBUFFERED")


def smoke(workload: str) -> list[str]:
    return [sys.executable, "-m", MODULE, "smoke", workload]


def full_run(workload: str) -> list[str]:
    return [sys.executable, "-m", MODULE, "run", workload]


def launched(name: str, env: dict, workload: str = "bert-squad") -> list[str]:
    """``dsenv smoke WORKLOAD`` under a launcher with 2 ranks (loopback, env's port)."""
    if name == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", env["MASTER_PORT"],
                "-m", MODULE, "smoke", workload]
    if name == "deepspeed":  # sets MASTER_ADDR=127.0.0.1; --num_gpus, or it counts NUMA nodes
        return [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2",
                "--master_port", env["MASTER_PORT"], "--module", MODULE, "smoke", workload]
    if shutil.which("mpirun", path=env.get("PATH")) is None:
        pytest.skip("mpirun not installed")
    return ["mpirun", "--allow-run-as-root", "-np", "2",
            *[arg for var in MPI_EXPORTED if var in env for arg in ("-x", var)], *smoke(workload)]
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_SIZE",
                 "CROSS_RANK", "CROSS_SIZE", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")
LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "MPI_LOCAL")


def run_dsenv(tmp_path, env, *extra, command=SMOKE, timeout=300, name="out"):
    """``command`` with --output-dir tmp_path/name; (result, parsed report.json or None)."""
    out = tmp_path / name
    result = run([*command, "--output-dir", str(out), "--examples", "1", *extra],
                 timeout=timeout, env=env, cwd=tmp_path)  # a timeout fails the test
    report_path = out / "report.json"
    doc = json.loads(report_path.read_text()) if report_path.exists() else None
    return result, doc


def bad_input(tmp_path, env, *args, command=SMOKE):
    return run([*command, "--output-dir", str(tmp_path / "out"), *args],
               timeout=120, env=env, cwd=tmp_path)


def one_line(result) -> str:
    assert result.returncode == 2, explain(result)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def site_references(source: str) -> str:
    """A site's own references table (TOML): bert-squad's smoke, any device, world size 1,
    fp32, 20 samples/s - 50%: low, so a node other tests keep busy still meets it, and the
    band is drawn whatever machine runs the test; ``source`` names it in the verdict."""
    return (f'[[bert-squad-smoke]]\ndevice = "*"\nworld_size = 1\npreset = "fp32"\n'
            f'samples_per_s = 20\ntolerance = 0.5\nsource = "{source}"\n')
