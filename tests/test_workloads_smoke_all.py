"""`dsenv smoke all`: the four bundled smokes in turn, one table, exit 0 only when all pass.

These are also the single-process smokes of t5-xsum, gpt2-wikitext and bert-mrpc: healthy
with their default settings (each must pass its sanity verdict, as it does for a user), and
broken with learning rate 0 (each must fail it)."""

from __future__ import annotations

import json
import re
import sys

import pytest

from dsenv import proc

from .workload_runs import explain

WORKLOADS = ["bert-squad", "t5-xsum", "gpt2-wikitext", "bert-mrpc"]
MAIN_METRIC = {"bert-squad": ("exact_match", 60.0), "t5-xsum": ("rouge1", 70.0),
               "gpt2-wikitext": ("perplexity", None), "bert-mrpc": ("accuracy", 80.0)}


@pytest.mark.slow
def test_smoke_all_runs_the_four_and_prints_one_table(tmp_path, run_env, no_references):
    out = tmp_path / "all"
    result = proc.run([sys.executable, "-m", "dsenv", "smoke", "all", "--output-dir", str(out),
                       "--references", no_references, "--examples", "1", "--report",
                       str(tmp_path / "all.json")], timeout=900, env=run_env, cwd=str(tmp_path))
    assert not result.timed_out and result.returncode == 0, explain(result)
    summary = json.loads((tmp_path / "all.json").read_text())
    assert [row["workload"] for row in summary["workloads"]] == WORKLOADS
    stdout = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", result.stdout)
    table = stdout[stdout.index("dsenv smoke all: 4 workloads in"):]
    for row in summary["workloads"]:
        name = row["workload"]
        doc = json.loads((out / name / "report.json").read_text())
        assert doc["workload"] == name and doc["mode"] == "smoke"
        assert (row["status"], doc["status"], row["sanity"]) == ("PASS", "PASS", "PASS"), name
        assert row["performance"] == "REPORTED"  # the empty reference table
        assert doc["run"]["world_size"] == 1 and doc["run"]["launcher"] == "none"
        metric, floor = MAIN_METRIC[name]
        value = doc["metrics"][metric]
        if floor is None:
            assert value <= 20.0, (name, doc["metrics"])
        else:
            assert value >= floor, (name, doc["metrics"])
        assert f"{metric} {value:.1f}" in row["metrics"]
        assert re.search(rf"│ {re.escape(name)}\s+│ PASS\s+│ PASS\s+│ REPORTED", table), name
        assert (out / name / "model" / "config.json").is_file()
    logs = {name: (out / name / "smoke.log").read_text() for name in WORKLOADS}
    assert "generated summaries" in logs["t5-xsum"] and "classified pairs" in logs["bert-mrpc"]
    assert "continuations" in logs["gpt2-wikitext"]
    assert all(f"dsenv smoke {name}: PASS" in log for name, log in logs.items())


@pytest.mark.slow
def test_smoke_all_fails_when_the_runs_cannot_learn(tmp_path, run_env, no_references):
    """Learning rate 0 everywhere, all else as the passing run above but the step count (with
    lr 0 the weights never move, so 40 steps learn exactly as much as 500): every smoke fails
    its sanity verdict, and so does all."""
    result = proc.run([sys.executable, "-m", "dsenv", "smoke", "all", "--lr", "0",
                       "--steps", "40", "--examples", "0", "--references", no_references,
                       "--output-dir", str(tmp_path / "all"), "--report",
                       str(tmp_path / "all.json")], timeout=600, env=run_env, cwd=str(tmp_path))
    assert not result.timed_out and result.returncode == 1, explain(result)
    rows = json.loads((tmp_path / "all.json").read_text())["workloads"]
    assert [(r["workload"], r["status"], r["sanity"]) for r in rows] == \
        [(name, "FAIL", "FAIL") for name in WORKLOADS]
    docs = {name: json.loads((tmp_path / "all" / name / "report.json").read_text())
            for name in WORKLOADS}
    for name, doc in docs.items():
        assert doc["batch"]["lr"] == 0.0 and abs(doc["training"]["loss_drop"]) < 0.05, name
        assert "FAIL" in result.stdout and doc["verdicts"][0]["status"] == "FAIL"
    # what a model that learnt nothing scores: nothing, the vocabulary size, chance
    assert docs["bert-squad"]["metrics"]["exact_match"] < 30
    assert docs["t5-xsum"]["metrics"]["rouge1"] < 10
    assert docs["gpt2-wikitext"]["metrics"]["perplexity"] > 100
    assert 35 < docs["bert-mrpc"]["metrics"]["accuracy"] < 65
