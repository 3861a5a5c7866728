"""gpt2-wikitext (seed 003): the synthetic wikitext, texts grouped into blocks, and real
runs through the transformers Trainer with TrainingArguments(deepspeed=...): two ranks
under torchrun and mpirun (ZeRO-3), the full run from what `dsenv fetch` saved with
save_to_disk. The single-process smokes, healthy and with learning rate 0, run in
tests/test_workloads_smoke_all.py."""

from __future__ import annotations

import math
import re
import sys

import pytest

from dsenv import proc
from dsenv.workloads import gpt2_wikitext, runner, synthetic, tiny
from tests.harness.workload_runs import explain, full_run, launched, run_dsenv


# ----------------------------------------------------------------------------- data
def test_synthetic_wikitext_has_the_layout_of_wikitext_raw(tmp_path):
    rows = synthetic.wikitext_rows(20, seed=3)
    lines = [row["text"] for row in rows]
    assert all(set(row) == {"text"} for row in rows)
    titles = [line for line in lines if re.fullmatch(r" = [^=]+ = \n", line)]
    sections = [line for line in lines if re.fullmatch(r" = = [^=]+ = = \n", line)]
    paragraphs = [line for line in lines if line and not line.startswith(" =")]
    assert len(titles) == 20 and len(sections) == 20 * synthetic.WIKITEXT["sections_per_article"]
    assert lines.count("") >= len(titles) + len(sections)  # blank lines around blocks
    assert all(p.startswith(" ") and p.endswith(" . \n") for p in paragraphs)
    assert synthetic.wikitext_style("a well-known place, said he.") == \
        "a well @-@ known place , said he ."
    saved = runner.load_saved(synthetic.save_splits(tmp_path / "wiki", "wikitext", {
        "train": rows, "validation": rows[:30]}), ("text",), ("train", "validation"))
    assert saved["train"]["text"][:3] == lines[:3]


def test_lines_are_concatenated_and_cut_into_blocks():
    import datasets

    tokenizer = tiny.train_byte_bpe([r["text"] for r in synthetic.wikitext_rows(30, 1)], 400)
    split = datasets.Dataset.from_dict({"text": [r["text"] for r in
                                                 synthetic.wikitext_rows(5, 2)]})
    blocks = gpt2_wikitext.lm_blocks(split, tokenizer, 32)
    every = [t for line in split["text"] for t in tokenizer(line)["input_ids"]]
    assert len(blocks) == len(every) // 32 > 5
    assert [t for block in blocks["input_ids"] for t in block] == every[:len(blocks) * 32]
    assert blocks["labels"] == blocks["input_ids"]  # the model shifts them
    assert tokenizer.decode(every) == "".join(split["text"])  # byte-level: lossless


# ----------------------------------------------------------------------------- runs
def reevaluate(out, block_size: int) -> float:
    """Perplexity of the saved model, loaded back by plain transformers, on the validation
    blocks: must be what the Trainer reported (a ZeRO-3 save of empty partitions is not)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    dev = runner.load_saved(out / "assets" / "data", ("text",), ("validation",))["validation"]
    ids = torch.tensor(gpt2_wikitext.lm_blocks(dev, tokenizer, block_size)["input_ids"])
    with torch.no_grad():
        losses = [model(input_ids=ids[i:i + 16], labels=ids[i:i + 16]).loss.item()
                  for i in range(0, len(ids), 16)]
    return math.exp(sum(losses) / len(losses))


@pytest.mark.slow
@pytest.mark.parametrize("launcher, preset", [("torchrun", "zero2"), ("mpirun", "zero3")])
def test_two_ranks_through_the_trainer(tmp_path, run_env, no_references, launcher, preset):
    run_env["OMP_NUM_THREADS"] = "1"  # two ranks on two cores
    result, doc = run_dsenv(tmp_path, run_env, "--preset", preset, "--steps", "150",
                            "--references", no_references,
                            command=launched(launcher, run_env, "gpt2-wikitext"), timeout=400)
    assert result.returncode == 0, explain(result)
    assert (doc["run"]["launcher"], doc["run"]["world_size"]) == (launcher, 2)
    assert doc["batch"]["train_batch_size"] == 32 == doc["ds_config"]["train_batch_size"]
    assert doc["ds_config"]["zero_optimization"]["stage"] == int(preset[-1])
    assert doc["trainer"]["engine"] == "DeepSpeedEngine"  # the Trainer's DeepSpeed engine
    assert len(doc["training"]["loss_curve"]) == 150 == doc["training"]["steps"]
    assert doc["status"] == "PASS" and doc["metrics"]["perplexity"] <= 20
    stdout = " ".join(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", result.stdout).split())
    assert stdout.count("dsenv smoke gpt2-wikitext: PASS") == 1  # rank 0 only
    assert "Traceback" not in result.stdout + result.stderr
    assert reevaluate(tmp_path / "out", 64) == pytest.approx(doc["metrics"]["perplexity"],
                                                             rel=0.02)


@pytest.mark.slow
def test_full_run_loads_what_fetch_saved_with_save_to_disk(tmp_path, run_env):
    """Tiny stand-ins served by a Hub on 127.0.0.1 under the real names, placed by a real
    `dsenv fetch` (wikitext-2-raw-v1 prepared with save_to_disk); then `dsenv run
    gpt2-wikitext` reads them offline: the server sees no request."""
    from tests.harness.hubserver import HubServer, gpt2_wikitext_repos

    run_env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="0")
    for name in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_DATASETS_OFFLINE",
                 "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME"):
        run_env.pop(name, None)
    with HubServer(gpt2_wikitext_repos(tmp_path / "served")) as hub:
        run_env["HF_ENDPOINT"] = hub.url
        fetched = proc.run([sys.executable, "-m", "dsenv", "fetch", "gpt2-wikitext"],
                           timeout=120, env=run_env)
        assert fetched.returncode == 0, explain(fetched)
        hub.reset()
        result, doc = run_dsenv(tmp_path, run_env, "--max-length", "64", "--epochs", "2",
                                "--micro-batch", "4", "--lr", "1e-3",
                                command=full_run("gpt2-wikitext"), timeout=300)
        assert hub.requests == []
    assert doc is not None, explain(result)
    assert result.returncode == (0 if doc["status"] == "PASS" else 1), explain(result)
    assert doc["data"]["source"].startswith("Salesforce/wikitext in ")
    assert doc["data"]["block_size"] == 64 and doc["data"]["train_blocks"] > 8
    assert doc["training"]["steps"] == 2 * (doc["data"]["train_blocks"] // 4)
    assert doc["ds_config"]["scheduler"]["params"]["total_num_steps"] == doc["training"]["steps"]
    assert doc["model"].endswith("snapshots/" + hub.commit("model", "distilbert/distilgpt2"))
    assert doc["trainer"]["engine"] == "DeepSpeedEngine"
    assert doc["training"]["loss_last"] < doc["training"]["loss_first"]
    assert doc["metrics"]["perplexity"] == pytest.approx(math.exp(doc["metrics"]["eval_loss"]))
