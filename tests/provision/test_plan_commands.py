"""The plan shown is the plan that runs (issue 21): `dsenv provision --dry-run` prints each
step's commands as their builders will run them, and the real run logs each command it runs
in the same rendering (`$ uv venv ...` in dsenv-build.log), so the dry run's commands appear
verbatim and in order in the real run's log. A plan whose printed command differs from what
runs fails the same comparison (its twins below).

Fast: the tiny wheels' lock, --no-index, --ops none (a few seconds). The real CPU stack with
an ops build is compared in test_real_env.py (slow).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from dsenv.provision.ops.choose import OpsChoice
from dsenv.provision.shown import (
    BuildLog,
    Command,
    logged_commands,
    not_carried_out,
    planned_commands,
)
from dsenv.provision.steps import OpsPlan
from dsenv.provision.venv import make_venv, venv_command
from tests.harness.cli import dsenv, explain

WIDE = {"COLUMNS": "400"}  # rich must not wrap a command


def provision(prefix: Path, lock: Path, wheels: Path, *more: str):
    return dsenv("provision", "--arch", "cpu", "--ops", "none", "--no-bytecode", "--lock",
                 lock, "--no-index", "--find-links", wheels, "--prefix", prefix, *more,
                 env=WIDE)


def test_the_real_run_logs_the_commands_the_dry_run_printed(tmp_path, tiny_lock, tiny_wheels):
    prefix = tmp_path / "envs" / "tiny"
    dry = provision(prefix, tiny_lock, tiny_wheels, "--dry-run")
    assert dry.returncode == 0, explain(dry)
    planned = planned_commands(dry.stdout)
    assert [c.split()[:3] for c in planned] == [["uv", "venv", str(prefix)],
                                                ["uv", "pip", "sync"]]
    assert ".tmp-" not in dry.stdout.split("\n- rename ")[0]  # staging shown as the prefix
    real = provision(prefix, tiny_lock, tiny_wheels)
    assert real.returncode == 0, explain(real)
    logged = logged_commands((prefix / "dsenv-build.log").read_text())
    assert not_carried_out(planned, logged) == [], (planned, logged)
    assert logged == planned  # nothing else ran (no offline retry here)


def test_a_log_that_differs_from_the_plan_fails_the_comparison():
    """The twin of the test above: the comparison fails on a doctored log (a word missing,
    the commands swapped, one command not run) and passes on a log that runs more."""
    planned = ["uv venv /e --relocatable --python /p --no-project --no-config --color never",
               "uv pip sync --require-hashes --python /e/bin/python /l.txt"]
    assert not_carried_out(planned, planned) == []
    assert not_carried_out(planned, [planned[0], "uv pip sync --offline", planned[1]]) == []
    drifted = planned[0].replace(" --no-config", "")
    assert not_carried_out(planned, [drifted, planned[1]]) == [planned[0]]
    assert not_carried_out(planned, planned[::-1]) == [planned[1]]
    assert not_carried_out(planned, planned[:1]) == [planned[1]]
    log = "".join(f"$ {command}\n" for command in [drifted, planned[1]])
    assert not_carried_out(planned, logged_commands("uv says hello\n" + log)) == [planned[0]]


def test_the_old_hand_written_venv_command_fails_against_what_make_venv_runs(tmp_path):
    """plan.py used to spell out `uv venv STAGING --relocatable --python PY` itself while
    make_venv also passed --no-project --no-config: that plan fails the comparison; the
    builder's own venv_command passes it."""
    staging, final = tmp_path / ".env.tmp-1", tmp_path / "env"
    log = BuildLog(tmp_path / "build.log", ((str(staging), str(final)),))
    make_venv(staging, python=sys.executable, log=log)
    logged = logged_commands(log.path.read_text())
    old = f"uv venv {final} --relocatable --python {sys.executable}"
    assert not_carried_out([old], logged) == [old]
    shown = venv_command(staging, sys.executable).render(log.names)
    assert not_carried_out([shown], logged) == [] and logged == [shown]
    assert shown.startswith(f"uv venv {final} --relocatable --python ")


def test_a_command_is_shown_without_secrets_and_with_its_folders_named(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_TOKEN", "s3cr3t-token-value")
    command = Command.of(
        ["uv", "pip", "install", "--index-url", "https://me:hunter22@mirror.example/simple",
         "--python", "/envs/.cpu.tmp-42/bin/python", "-r", "/x/s3cr3t-token-value.txt"],
        {"HF_TOKEN": "hf_abcdefgh", "MAX_JOBS": "2", "TORCH_CUDA_ARCH_LIST": "8.0;9.0"},
        cwd="/envs/.cpu.tmp-42")
    text = command.render((("/envs/.cpu.tmp-42", "/envs/cpu"),))
    assert text == ("cd /envs/cpu && HF_TOKEN='***' MAX_JOBS=2 TORCH_CUDA_ARCH_LIST='8.0;9.0' "
                    "uv pip install --index-url https://me:***@mirror.example/simple "
                    "--python /envs/cpu/bin/python -r /x/***.txt")


def test_ops_the_environment_chooses_otherwise_are_said_in_one_line():
    """The plan assumes the ops dsenv's own DeepSpeed chooses; the run chooses with the new
    environment's and says in one line where they differ (nothing when they agree)."""
    switches = {"cpu_adam": "DS_BUILD_CPU_ADAM", "cpu_lion": "DS_BUILD_CPU_LION"}
    assumed = OpsChoice("auto", "cpu", ("cpu_adam", "cpu_lion"), build_vars=switches,
                        deepspeed="0.19.8")
    plan = OpsPlan("auto", assumed)
    assert plan.difference(assumed) is None
    fewer = replace(assumed, build=("cpu_adam",), deepspeed="0.19.9")
    assert plan.difference(fewer) == (
        "ops differ from the plan: the environment's DeepSpeed 0.19.9 builds cpu_adam; the "
        "plan assumed cpu_adam, cpu_lion from DeepSpeed 0.19.8 of dsenv's interpreter")
    more_switches = replace(assumed, build_vars={**switches, "cpu_adagrad": "DS_BUILD_CPU_ADAGRAD"})
    assert "DS_BUILD_CPU_ADAGRAD=0 (plan (unset))" in plan.difference(more_switches)
    assert OpsPlan("none").difference(fewer) is None
    unknown = OpsPlan("auto", None, "no DeepSpeed in dsenv's interpreter").difference(fewer)
    assert unknown == ("ops: the plan could not say which (no DeepSpeed in dsenv's "
                       "interpreter); the environment's DeepSpeed 0.19.9 builds cpu_adam")
