"""The doctor is honest about the environment it judges (issue 24): one that cannot import
torch or DeepSpeed is not ready, on a login target as on a compute target, and the finding
says which environment was judged and why; `--for WORKLOAD` also asks for what that workload
imports. Real environments: a bare venv (nothing installed) and this interpreter's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.harness.cli import dsenv


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    venv = tmp_path_factory.mktemp("envs") / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    return venv


def doctor(*args):
    done = dsenv("doctor", "--only", "python,torch,deepspeed", "--json", *args)
    report = json.loads(done.stdout)
    return done.returncode, report, {r["id"]: r for r in report["results"]}


@pytest.mark.parametrize("target", ["login", "compute"])
def test_an_environment_without_torch_and_deepspeed_is_not_ready(bare, target):
    code, report, results = doctor("--env", str(bare), "--target", target)
    assert code == 1 and report["verdict"]["ready"] is False
    assert report["verdict"]["line"].startswith("not ready: 2 failures")
    torch, ds = results["torch.build"], results["deepspeed.install"]
    assert torch["status"] == ds["status"] == "fail"
    judged = f"{bare}, the environment judged (--env {bare})"
    assert judged in torch["summary"] and "first import fails" in torch["summary"]
    assert judged in ds["summary"] and "`import deepspeed` fails" in ds["summary"]


def test_the_environment_that_has_them_is_ready():
    code, report, results = doctor("--env", sys.executable, "--target", "login")
    assert results["torch.build"]["status"] == results["deepspeed.install"]["status"] == "ok"
    assert code == 0 and report["verdict"]["ready"] is True


def test_for_workload_asks_for_what_it_imports(bare):
    _, _, results = doctor("--env", str(bare), "--for", "t5-xsum")
    found = results["python.workload-packages"]
    assert found["status"] == "fail"
    assert found["summary"].startswith("torch, deepspeed, transformers, tokenizers, datasets, "
                                       "rouge-score not installed in ")
    assert found["mode"] == "env.package-missing"
    assert found["evidence"][-1].endswith("-m pip install torch deepspeed transformers "
                                          "tokenizers datasets rouge-score`")
    _, _, healthy = doctor("--env", sys.executable, "--for", "bert-squad")
    assert healthy["python.workload-packages"]["status"] == "ok"
    _, _, asked = doctor("--env", sys.executable)
    assert asked["python.workload-packages"]["status"] == "skip"
    assert asked["python.workload-packages"]["summary"] == "no --for WORKLOAD given"
