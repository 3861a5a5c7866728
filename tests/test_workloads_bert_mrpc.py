"""bert-mrpc (seed 004): the synthetic MRPC pairs, accuracy/F1, and real runs: two ranks
under mpirun WITHOUT gradient sync (each rank its own model, the best kept) and under
torchrun with it (one model; sqrt learning-rate scaling); the full run from what `dsenv
fetch` placed. The single-process smokes, healthy and with learning rate 0, run in
tests/test_workloads_smoke_all.py."""

from __future__ import annotations

import math
import re
import sys

import pytest

from dsenv import proc
from dsenv.workloads import bert_mrpc, runner, squad, synthetic
from tests.harness.workload_runs import explain, full_run, launched, run_dsenv


# ----------------------------------------------------------------------------- data, metric
def fact_of(sentence: str) -> tuple[str, str, str] | None:
    """(relation, person, value) a synthetic sentence states (MRPC's spaced punctuation)."""
    for relation, spec in squad.RELATIONS.items():
        for template in spec["fact"]:
            pattern = re.escape(synthetic.wikitext_style(synthetic._sentence(
                template, "NAME", "VALUE"))).replace("NAME", "(\\w+)").replace("VALUE", "(.+)")
            if match := re.fullmatch(pattern, sentence):
                return relation, match.group(1).lower(), match.group(2)
    return None


def test_synthetic_mrpc_pairs_are_paraphrases_exactly_when_labelled_so(tmp_path):
    rows = synthetic.mrpc_rows(400, seed=9)
    assert [r["idx"] for r in rows] == list(range(400))
    positives = sum(r["label"] for r in rows)
    assert 150 < positives < 250  # balanced: chance is 50 %
    for row in rows:
        first, second = fact_of(row["sentence1"]), fact_of(row["sentence2"])
        assert first and second, row
        assert row["sentence1"] != row["sentence2"]  # two wordings, never a copy
        assert (first == second) == (row["label"] == 1), row
    hidden = synthetic.mrpc_rows(10, seed=9, labelled=False)
    assert {r["label"] for r in hidden} == {-1}  # GLUE's test split
    saved = runner.load_saved(synthetic.save_splits(tmp_path / "mrpc", "mrpc", {
        "train": rows, "validation": rows[:50]}), bert_mrpc.COLUMNS, bert_mrpc.SPLITS)
    assert saved["train"].features["label"].names == ["not_equivalent", "equivalent"]
    assert saved["train"].features["idx"].dtype == "int32"


def test_accuracy_and_f1_of_the_equivalent_class():
    assert bert_mrpc.scores([1, 1, 0, 0], [1, 1, 0, 0]) == {"accuracy": 100.0, "f1": 100.0}
    scores = bert_mrpc.scores([1, 1, 1, 0], [1, 0, 1, 1])  # tp 2, fn 1, fp 1
    assert scores["accuracy"] == 50.0 and scores["f1"] == pytest.approx(100 * 4 / 6)
    assert bert_mrpc.scores([1, 0], [0, 0]) == {"accuracy": 50.0, "f1": 0.0}


# ----------------------------------------------------------------------------- runs
def saved_model_digest(out) -> str:
    from transformers import BertForSequenceClassification

    from dsenv.workloads.training import engine

    return engine.weights_digest(BertForSequenceClassification.from_pretrained(out / "model"))


@pytest.mark.slow
def test_two_ranks_without_gradient_sync_train_two_models_and_keep_the_best(
        tmp_path, run_env, no_references):
    run_env["OMP_NUM_THREADS"] = "1"
    result, doc = run_dsenv(tmp_path, run_env, "--no-sync-gradients", "--steps", "250",
                            "--references", no_references, "--examples", "2",
                            command=launched("mpirun", run_env, "bert-mrpc"), timeout=400)
    assert result.returncode == 0, explain(result)
    assert (doc["run"]["launcher"], doc["run"]["world_size"]) == ("mpirun", 2)
    assert doc["gradient_sync"] is False and doc["ds_config"]["gradient_clipping"] == 0.0
    ranks = doc["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["weights_sha256"] != ranks[1]["weights_sha256"]  # two models
    best = max(ranks, key=lambda r: (r["accuracy"], r["f1"], -r["rank"]))
    assert doc["best_rank"] == best["rank"]
    assert doc["metrics"] == {"accuracy": best["accuracy"], "f1": best["f1"]}
    assert saved_model_digest(tmp_path / "out") == best["weights_sha256"]  # the best, saved
    assert doc["status"] == "PASS" and doc["metrics"]["accuracy"] >= 80
    stdout = " ".join(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", result.stdout).split())
    assert f"rank {best['rank']}: accuracy {best['accuracy']:.1f}" in stdout and "kept" in stdout


@pytest.mark.slow
def test_two_ranks_with_gradient_sync_keep_one_model(tmp_path, run_env, no_references):
    run_env["OMP_NUM_THREADS"] = "1"
    result, doc = run_dsenv(tmp_path, run_env, "--lr-scaling", "sqrt", "--steps", "250",
                            "--references", no_references, "--examples", "0",
                            command=launched("torchrun", run_env, "bert-mrpc"), timeout=400)
    assert result.returncode == 0, explain(result)
    assert (doc["run"]["launcher"], doc["run"]["world_size"]) == ("torchrun", 2)
    assert doc["gradient_sync"] is True and doc["ds_config"]["gradient_clipping"] == 1.0
    assert doc["batch"]["lr"] == pytest.approx(bert_mrpc.SMOKE.lr * math.sqrt(2))  # seed 004
    ranks = doc["ranks"]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]  # one model, bit for bit
    assert saved_model_digest(tmp_path / "out") == ranks[0]["weights_sha256"]
    assert doc["status"] == "PASS" and doc["metrics"]["accuracy"] >= 80


@pytest.mark.slow
def test_full_run_reads_bert_and_glue_mrpc_from_what_fetch_placed(tmp_path, run_env):
    """A tiny BERT and MRPC-layout parquet files served by a Hub on 127.0.0.1 under the real
    names, placed by a real `dsenv fetch`; then `dsenv run bert-mrpc` offline: no request."""
    from tests.harness.hubserver import HubServer, bert_mrpc_repos

    run_env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="0")
    for name in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_DATASETS_OFFLINE",
                 "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME"):
        run_env.pop(name, None)
    with HubServer(bert_mrpc_repos(tmp_path / "served")) as hub:
        run_env["HF_ENDPOINT"] = hub.url
        fetched = proc.run([sys.executable, "-m", "dsenv", "fetch", "bert-mrpc"], timeout=120,
                           env=run_env)
        assert fetched.returncode == 0, explain(fetched)
        hub.reset()
        result, doc = run_dsenv(tmp_path, run_env, "--micro-batch", "8", "--epochs", "1",
                                "--max-length", "64", command=full_run("bert-mrpc"),
                                timeout=300)
        assert hub.requests == []
    assert doc is not None, explain(result)
    assert result.returncode == (0 if doc["status"] == "PASS" else 1), explain(result)
    assert doc["data"]["source"].startswith("nyu-mll/glue in ")
    assert (doc["data"]["train_pairs"], doc["data"]["validation_pairs"]) == (64, 24)
    assert doc["training"]["steps"] == 64 // 8 and doc["settings"]["max_length"] == 64
    assert doc["model"].endswith("snapshots/" + hub.commit("model",
                                                           "google-bert/bert-base-uncased"))
    assert set(doc["metrics"]) == {"accuracy", "f1"} and doc["gradient_sync"] is True
    import json

    config = json.loads((tmp_path / "out" / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "not_equivalent", "1": "equivalent"}
