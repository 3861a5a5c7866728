"""t5-xsum (seed 002): parameter counts against the seed's table, the synthetic XSum data,
ROUGE, and real runs: two ranks under mpirun (ZeRO-3 + CPU offload, seed 002's preset) and
torchrun, the full run from what `dsenv fetch` placed. The single-process smokes, healthy
and with learning rate 0, run in tests/test_workloads_smoke_all.py."""

from __future__ import annotations

import re
import sys

import pytest

from dsenv import proc
from dsenv.workloads import synthetic, t5_xsum
from tests.harness.workload_runs import explain, full_run, launched, run_dsenv

# seed 002's table, as the seed prints it
SEED_002 = {"t5-small": 60_506_624, "t5-large": 737_668_096, "t5-3b": 2_851_598_336}


def meta_t5(**config):
    """A T5ForConditionalGeneration on the meta device: shapes, no weights, no download."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    with torch.device("meta"):
        return T5ForConditionalGeneration(T5Config(**config))


# ----------------------------------------------------------------------------- parameters
def test_seed_002_table_is_what_the_configurations_build():
    assert {name: entry["parameters"] for name, entry in t5_xsum.VARIANTS.items()} == SEED_002
    for name, entry in t5_xsum.VARIANTS.items():
        model = meta_t5(**entry["config"])
        assert next(model.parameters()).is_meta
        assert model.num_parameters() == SEED_002[name], name
        check = t5_xsum.parameter_check(model)
        assert check == {"count": SEED_002[name], "variant": name, "expected": SEED_002[name],
                         "matches": True}


def test_a_model_outside_the_table_is_reported_without_a_variant():
    small = dict(t5_xsum.VARIANTS["t5-small"]["config"])
    check = t5_xsum.parameter_check(meta_t5(**{**small, "d_ff": 1024}))
    assert check["variant"] is None and check["count"] < SEED_002["t5-small"]


# ----------------------------------------------------------------------------- data, metric
def facts_in(document: str, name: str) -> dict[str, str]:
    """{relation: value} of the fact sentences about ``name`` in a document."""
    from dsenv.workloads import squad

    found = {}
    for relation, spec in squad.RELATIONS.items():
        for template in spec["fact"]:
            pattern = re.escape(synthetic._sentence(template, name, "VALUE")).replace(
                "VALUE", "(.+)")
            for line in document.split("\n"):
                if match := re.fullmatch(pattern, line):
                    found[relation] = match.group(1)
    return found


def test_synthetic_xsum_has_the_layout_and_a_learnable_summary(tmp_path):
    from dsenv.workloads import runner

    rows = synthetic.xsum_rows(200, seed=5)
    assert rows == synthetic.xsum_rows(200, seed=5)  # deterministic
    order = synthetic.XSUM["summary_order"]
    for row in rows:
        assert set(row) == {"document", "summary", "id"} and row["id"].isdigit()
        name = row["summary"].split()[0]
        facts = facts_in(row["document"], name)
        assert len(facts) == synthetic.XSUM["facts_per_document"], row
        headline = min(facts, key=order.index)  # the most newsworthy fact, said one way
        assert row["summary"] == synthetic._sentence(synthetic.XSUM["summary"][headline],
                                                     name, facts[headline])
    assert len({min(facts_in(r["document"], r["summary"].split()[0]), key=order.index)
                for r in rows}) >= 5  # the summaries are about many kinds of fact
    saved = runner.load_saved(synthetic.save_splits(tmp_path / "xsum", "xsum", {
        "train": rows[:150], "validation": rows[150:]}), t5_xsum.COLUMNS, t5_xsum.SPLITS)
    assert saved["train"].features == synthetic.features("xsum")
    assert saved["validation"][0] == rows[150]


def test_rouge_is_rouge_score_f1_in_percent():
    assert t5_xsum.rouge(["Zoe lives in oslo."], ["Zoe lives in oslo."]) == \
        {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0}
    assert t5_xsum.rouge(["Zoe lives in oslo."], [""]) == \
        {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    partial = t5_xsum.rouge(["Zoe lives in oslo."], ["Zoe lives in lima."])
    assert partial["rouge1"] == pytest.approx(75.0) and partial["rouge2"] == pytest.approx(
        100 * 2 / 3)


# ----------------------------------------------------------------------------- runs
def rescore(out) -> dict:
    """The saved model, loaded back by plain transformers, summarising the validation
    documents: must score what the run reported (a ZeRO-3 save of empty partitions would
    not)."""
    import torch
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    from dsenv.workloads import runner

    model = T5ForConditionalGeneration.from_pretrained(out / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    dev = runner.load_saved(out / "assets" / "data", t5_xsum.COLUMNS,
                            t5_xsum.SPLITS)["validation"]
    enc = t5_xsum.encode(dev, tokenizer, t5_xsum.SMOKE)
    with torch.no_grad():
        out_ids = model.generate(input_ids=torch.tensor(enc["input_ids"]),
                                 attention_mask=torch.tensor(enc["attention_mask"]),
                                 max_new_tokens=t5_xsum.SMOKE.max_target_length,
                                 do_sample=False)
    predictions = [t.strip() for t in tokenizer.batch_decode(out_ids, skip_special_tokens=True)]
    return t5_xsum.rouge(list(dev["summary"]), predictions)


@pytest.mark.slow
@pytest.mark.parametrize("launcher, preset, steps", [("mpirun", "zero3-offload", "250"),
                                                     ("torchrun", "fp32", "300")])
def test_two_ranks(tmp_path, run_env, no_references, launcher, preset, steps):
    run_env["OMP_NUM_THREADS"] = "1"  # two ranks on two cores
    result, doc = run_dsenv(tmp_path, run_env, "--preset", preset, "--steps", steps,
                            "--references", no_references,
                            command=launched(launcher, run_env, "t5-xsum"), timeout=400)
    assert result.returncode == 0, explain(result)
    assert (doc["run"]["launcher"], doc["run"]["world_size"]) == (launcher, 2)
    assert doc["batch"]["train_batch_size"] == 32 == doc["ds_config"]["train_batch_size"]
    assert doc["ds_config"]["zero_optimization"]["stage"] == (3 if "zero3" in preset else 0)
    assert doc["status"] == "PASS" and doc["metrics"]["rouge1"] >= 70
    stdout = " ".join(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", result.stdout).split())
    assert stdout.count("dsenv smoke t5-xsum: PASS") == 1  # rank 0 only
    assert "generated summaries" in stdout
    assert rescore(tmp_path / "out") == pytest.approx(doc["metrics"], abs=0.5)


@pytest.mark.slow
def test_full_run_reads_t5_small_and_xsum_from_what_fetch_placed(tmp_path, run_env):
    """Tiny stand-ins served by a Hub on 127.0.0.1 under the real names (XSum at its
    refs/convert/parquet revision), placed by a real `dsenv fetch`; then `dsenv run t5-xsum`
    offline: the server sees no request although HF_ENDPOINT points at it."""
    from tests.harness.hubserver import XSUM_REVISION, HubServer, t5_xsum_repos

    run_env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="0")
    for name in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_DATASETS_OFFLINE",
                 "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME"):
        run_env.pop(name, None)
    with HubServer(t5_xsum_repos(tmp_path / "served"), branches=("main", XSUM_REVISION)) as hub:
        run_env["HF_ENDPOINT"] = hub.url
        fetched = proc.run([sys.executable, "-m", "dsenv", "fetch", "t5-xsum"], timeout=120,
                           env=run_env)
        assert fetched.returncode == 0, explain(fetched)
        hub.reset()
        result, doc = run_dsenv(tmp_path, run_env, "--micro-batch", "8", "--max-steps", "4",
                                "--max-eval-samples", "6", "--lr", "1e-3",
                                command=full_run("t5-xsum"), timeout=300)
        assert hub.requests == []
    assert doc is not None, explain(result)
    assert result.returncode == (0 if doc["status"] == "PASS" else 1), explain(result)
    assert doc["mode"] == "run" and doc["data"]["source"].startswith("EdinburghNLP/xsum in ")
    assert (doc["data"]["train_documents"], doc["data"]["validation_documents"]) == (48, 6)
    assert doc["model"].endswith("snapshots/" + hub.commit("model", "google-t5/t5-small"))
    assert doc["settings"]["max_source_length"] == 128 and doc["training"]["steps"] == 4
    assert doc["parameters"]["count"] > 0 and doc["parameters"]["variant"] is None
    assert set(doc["metrics"]) == {"rouge1", "rouge2", "rougeL"}
    assert [v["name"] for v in doc["verdicts"]] == ["sanity", "performance"]
    assert f"dsenv run t5-xsum: {doc['status']}" in result.stdout
