"""The four bundled smokes run inside an environment provisioned from envs/locks/cpu.txt: the
lock carries what they import beyond torch and DeepSpeed (accelerate for gpt2-wikitext's
transformers Trainer, rouge-score for t5-xsum's ROUGE, sentencepiece for T5 tokenizers), as
a user's own Trainer script needs it.

Slow: the package's one real environment (tests/provision/conftest.py: `dsenv provision
--arch cpu --ops cpu_adam`), then `dsenv smoke all --env PREFIX` from dsenv's own
interpreter: the smokes run in the env's interpreter (issue 24), with nothing of dsenv added
to the env.
The smokes run with their default settings and must pass their sanity verdicts there, as a
user runs them (their broken twin, learning rate 0, is in test_workloads_smoke_all.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from dsenv import proc
from dsenv.provision.locks import lock_path, parse_lock
from tests.harness.workload_runs import MAIN_METRIC, SMOKE_ALL, explain

pytestmark = pytest.mark.slow

NEEDED = ("accelerate", "rouge-score", "sentencepiece")


def test_the_locks_carry_what_the_workloads_and_a_trainer_script_import():
    for stack in ("cpu", "cuda13.0"):
        pins = parse_lock(lock_path(stack).read_text())
        assert all(name in pins for name in NEEDED), (stack, [n for n in NEEDED
                                                              if n not in pins])


@pytest.fixture
def provisioned(cpu_env) -> Path:
    """The env's python."""
    return cpu_env[0] / "bin" / "python"


def test_the_four_smokes_pass_in_the_provisioned_env(provisioned, tmp_path, run_env,
                                                     no_references):
    """`dsenv smoke all --env PREFIX` and the smokes' default settings: each runs in the env's
    interpreter and passes its sanity verdict, one table, exit 0 (with the old lock t5-xsum
    and gpt2-wikitext stop: "needs rouge-score", "needs accelerate")."""
    out = tmp_path / "all"
    prefix = provisioned.parent.parent
    assert _imported_from(provisioned, "dsenv", ok=False) == ""  # nothing of dsenv added
    result = proc.run([sys.executable, "-m", "dsenv", "smoke", "all", "--env", str(prefix),
                       "--output-dir",
                       str(out), "--references", no_references, "--examples", "1", "--report",
                       str(tmp_path / "all.json")], timeout=1500, env=_no_port(run_env),
                      cwd=str(tmp_path))
    assert not result.timed_out and result.returncode == 0, explain(result)
    assert result.stdout.splitlines()[0].startswith(f"environment {prefix} (Python ")
    summary = json.loads((tmp_path / "all.json").read_text())
    assert [row["workload"] for row in summary["workloads"]] == SMOKE_ALL
    stdout = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", result.stdout)
    table = stdout[stdout.index("dsenv smoke all: 4 workloads in"):]
    for row in summary["workloads"]:
        name = row["workload"]
        doc = json.loads((out / name / "report.json").read_text())
        assert doc["workload"] == name and doc["mode"] == "smoke"
        assert (row["status"], doc["status"], row["sanity"]) == ("PASS", "PASS", "PASS"), name
        assert row["performance"] == "REPORTED"  # the empty reference table
        assert doc["run"]["world_size"] == 1 and doc["run"]["launcher"] == "none"
        assert int(doc["run"]["master"].removeprefix("127.0.0.1:")) > 0  # the port it bound
        assert Path(doc["environment"]["running"]).parent == prefix / "bin", name
        metric, floor = MAIN_METRIC[name]
        value = doc["metrics"][metric]
        if floor is None:
            assert value <= 20.0, (name, doc["metrics"])
        else:
            assert value >= floor, (name, doc["metrics"])
        assert f"{metric} {value:.1f}" in row["metrics"]
        assert re.search(rf"│ {re.escape(name)}\s+│ PASS\s+│ PASS\s+│ REPORTED", table), name
        assert (out / name / "model" / "config.json").is_file()
        log = (out / name / "smoke.log").read_text()
        assert not re.search(r"ModuleNotFoundError|ImportError|requires the .* library", log), \
            (name, log[-2000:])
    logs = {name: (out / name / "smoke.log").read_text() for name in SMOKE_ALL}
    assert "generated summaries" in logs["t5-xsum"] and "classified pairs" in logs["bert-mrpc"]
    assert "continuations" in logs["gpt2-wikitext"]
    assert all(f"dsenv smoke {name}: PASS" in log for name, log in logs.items())
    # the env's own copies, not this interpreter's (the venv does not see its site-packages)
    for module in ("accelerate", "rouge_score", "sentencepiece"):
        assert _imported_from(provisioned, module).startswith(str(prefix)), module


def _no_port(env: dict) -> dict:
    """As a user runs `dsenv smoke all` by hand: no MASTER_PORT, so each single-process smoke
    asks the kernel for its port when it binds. (A port chosen before a 60 s run, plus an
    offset per workload, was taken by another process in CI: EADDRINUSE.)"""
    return {k: v for k, v in env.items() if k != "MASTER_PORT"}


def _imported_from(python: Path, module: str, ok: bool = True) -> str:
    done = proc.run([str(python), "-c", f"import {module}; print({module}.__file__)"],
                    timeout=120, cwd="/")  # not a checkout's root: its dsenv/ would answer
    assert done.ok == ok, done.stderr
    return done.stdout.strip() if ok else ""
