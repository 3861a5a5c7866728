"""The programs family (doctor/explain/families/programs.py, doctor/explain/programs.toml): a
program the job runs by name that is not on its PATH, in each shell's and tool's wording, on
the texts users posted (tests/fixtures/explain_symptoms/) and on the wordings of the shells
themselves (bash, dash, zsh, Python's subprocess, which, setuptools, slurmstepd), produced here
by the real programs. A program the table does not know, a file given by its path and empty
text give no reading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsenv.doctor import catalogue
from dsenv.doctor.explain.command import explain_text
from dsenv.doctor.explain.families import programs
from tests.harness import symptoms


def first_cause(text: str) -> str:
    _, _, sure, _ = explain_text(text)
    return sure[0].id if sure else ""


@pytest.mark.parametrize("table,url_end,mode,program", [
    ("python", "DeepSpeed/issues/3308", "env.scripts-not-on-path", "deepspeed"),  # bash script
    ("python", "DeepSpeed/issues/1927", "env.scripts-not-on-path", "ds_report"),  # bash
    ("build", "second.pytorch/issues/7", "jit.cuda-home-missing", "nvcc"),  # dash
    ("build", "CCNet/issues/56", "jit.cuda-home-missing", "nvcc"),  # a script run by dash
    ("launch", "DeepSpeed/issues/6565", "launch.numactl-missing", "numactl"),  # subprocess
    ("python", "pytorch-ddp-examples/issues/1", "env.scripts-not-on-path", "torchrun"),  # slurmstepd
    ("mpi", "mindyolo/issues/274", "mpi.mpirun-not-on-path", "mpirun"),  # bash
    ("mpi", "bevfusion/issues/21", "mpi.mpirun-not-on-path", "mpirun"),  # dash under torchpack
    ("python", "Retrieval-based-Voice-Conversion-WebUI/issues/104", "env.ffmpeg-binary-missing",
     "ffmpeg"),  # subprocess's bare name
])
def test_users_texts_name_the_program_and_its_mode(table, url_end, mode, program):
    text = symptoms.text(symptoms.rows(table), url_end)
    assert symptoms.parts(programs, text, mode)["program"] == program
    assert first_cause(text) == mode


def _run_missing(argv: list[str], env: dict | None = None) -> str:
    """What a real shell or tool prints when the program is not on PATH (PATH holds only an
    empty folder; the shell itself is called by its full path)."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          env={"PATH": "/nonexistent", **(env or {})})
    return done.stdout + done.stderr


@pytest.mark.parametrize("shell", ["/bin/bash", "/bin/sh"])
def test_the_shells_own_wordings_are_read(shell):
    if not os.path.exists(shell):
        pytest.skip(f"no {shell} here")
    text = _run_missing([shell, "-c", "nvcc --version"])
    assert "nvcc" in text and "not found" in text, text
    assert [r.mode for r in programs.read(text)] == ["jit.cuda-home-missing"], text
    assert first_cause(text) == "jit.cuda-home-missing"


def test_pythons_subprocess_wording_is_read():
    code = "import subprocess; subprocess.check_call(['ninja', '--version'])"
    text = _run_missing([sys.executable, "-c", code])
    assert "FileNotFoundError" in text, text
    assert first_cause(text) == "jit.ninja-missing"


def test_which_and_zsh_and_slurmstepd_wordings():
    # GNU which (RHEL-family nodes; Debian's which prints nothing), zsh (not installed here)
    # and Slurm's step daemon, as they print it
    assert first_cause("/usr/bin/which: no g++ in (/usr/local/bin:/usr/bin)") \
        == "toolkit.cxx-compiler-missing"
    assert first_cause("zsh: command not found: torchrun") == "env.scripts-not-on-path"
    assert first_cause("slurmstepd: error: execve(): torchrun: No such file or directory") \
        == "env.scripts-not-on-path"
    assert first_cause("error: command 'g++' failed: No such file or directory") \
        == "toolkit.cxx-compiler-missing"


def test_slurmstepd_execve_reads_the_program_and_only_when_it_is_not_found():
    # srun's step daemon, with a full path and on several tasks: the program and the folder
    text = ("slurmstepd: error: execve(): /opt/env/bin/deepspeed: No such file or directory\n"
            "slurmstepd: error: execve(): /opt/env/bin/deepspeed: No such file or directory\n"
            "srun: error: node3: tasks 0-1: Exited with exit code 2")
    parts = symptoms.parts(programs, text, "env.scripts-not-on-path")
    assert parts["program"] == "deepspeed" and parts["looked in"] == "/opt/env/bin"
    assert first_cause(text) == "env.scripts-not-on-path"
    # healthy twins: a program that exists but cannot be executed is not a missing one
    for denied in ("slurmstepd: error: execve(): torchrun: Permission denied\n"
                   "srun: error: my-node01: task 0: Exited with exit code 13",
                   "slurmstepd: error: execve(): accelerate: Exec format error"):
        assert programs.read(denied) == [], denied
        assert first_cause(denied) != "env.scripts-not-on-path", denied
    # slurmstepd lines of another kind: the batch script gone from the spool, a cancelled step
    gone = "slurmstepd: error: execve(): /tmp/slurmd/job2997814/slurm_script: No such file or directory"
    assert programs.read(gone) == []
    assert first_cause(gone) == "slurm.node-fault"
    assert programs.read("slurmstepd: error: *** STEP 19389846.0 ON cdr2550 CANCELLED AT "
                         "2023-11-27T16:36:09 ***") == []
    # a program the table does not know (hostname under srun --export=VAR) is not named
    assert programs.read("slurmstepd: error: execve(): hostname: No such file or directory") == []


def test_unknown_programs_paths_and_empty_text_give_no_reading():
    assert programs.read("bash: frobnicate: command not found") == []
    assert first_cause("bash: frobnicate: command not found") == ""
    # a data file that does not exist is not a program
    assert programs.read("FileNotFoundError: [Errno 2] No such file or directory: "
                         "'config.json'") == []
    # a CUDA_HOME that is a path list is the malformed-home mode, not a missing nvcc
    assert first_cause("/bin/sh: 1: :/usr/local/cuda/bin/nvcc: not found") \
        == "toolkit.cuda-home-malformed"
    assert programs.read("") == [] and programs.read("all good") == []


def test_every_row_names_a_mode_of_the_catalogue_and_a_public_source():
    rows = {name: row for name, row in programs.programs().items()}
    assert "nvcc" in rows and "ninja" in rows
    for name, row in rows.items():
        assert catalogue.mode(row["mode"]) is not None, (name, row["mode"])
        assert row["source"].startswith("https://"), name


def test_a_whole_command_line_given_to_subprocess_is_not_a_missing_program():
    # the mpiexec of DeepMimic#4 and IMPACT-T#3 was installed: the code passed one string
    # ("mpiexec -n 8 python3 ...") to subprocess without shell=True (a code bug)
    lookalikes = Path(__file__).parent / "fixtures" / "explain_lookalikes" / "mpi.jsonl"
    rows = [json.loads(line) for line in lookalikes.read_text().splitlines() if line.strip()]
    assert sum(r["not_mode"] == "mpi.mpirun-not-on-path" for r in rows) == 2
    for row in rows:
        if row["not_mode"] == "mpi.mpirun-not-on-path":
            assert not programs.read(row["text"]), row["url"]
            assert first_cause(row["text"]) != "mpi.mpirun-not-on-path", row["url"]

