"""`dsenv smoke all`: the four bundled smokes in turn, one table, exit 0 only when all pass.

Broken here with learning rate 0 (each must fail its sanity verdict); healthy, with their
default settings, inside an environment provisioned from the CPU lock
(tests/provision/test_smokes_in_env.py), as a user runs them."""

from __future__ import annotations

import json
import sys

import pytest

from dsenv import proc
from tests.harness.workload_runs import SMOKE_ALL, explain


@pytest.mark.slow
def test_smoke_all_fails_when_the_runs_cannot_learn(tmp_path, run_env, no_references):
    """Learning rate 0 everywhere, all else as the passing run above but the step count (with
    lr 0 the weights never move, so 40 steps learn exactly as much as 500): every smoke fails
    its sanity verdict, and so does all."""
    result = proc.run([sys.executable, "-m", "dsenv", "smoke", "all", "--lr", "0",
                       "--steps", "40", "--examples", "0", "--references", no_references,
                       "--output-dir", str(tmp_path / "all"), "--report",
                       str(tmp_path / "all.json")], timeout=600, cwd=str(tmp_path),
                      env={k: v for k, v in run_env.items() if k != "MASTER_PORT"})  # as a user
    assert not result.timed_out and result.returncode == 1, explain(result)
    rows = json.loads((tmp_path / "all.json").read_text())["workloads"]
    assert [(r["workload"], r["status"], r["sanity"]) for r in rows] == \
        [(name, "FAIL", "FAIL") for name in SMOKE_ALL]
    docs = {name: json.loads((tmp_path / "all" / name / "report.json").read_text())
            for name in SMOKE_ALL}
    for name, doc in docs.items():
        assert doc["batch"]["lr"] == 0.0 and abs(doc["training"]["loss_drop"]) < 0.05, name
        assert "FAIL" in result.stdout and doc["verdicts"][0]["status"] == "FAIL"
    # what a model that learnt nothing scores: nothing, the vocabulary size, chance
    assert docs["bert-squad"]["metrics"]["exact_match"] < 30
    assert docs["t5-xsum"]["metrics"]["rouge1"] < 10
    assert docs["gpt2-wikitext"]["metrics"]["perplexity"] > 100
    assert 35 < docs["bert-mrpc"]["metrics"]["accuracy"] < 65
