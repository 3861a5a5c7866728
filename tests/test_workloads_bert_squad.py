"""`dsenv smoke bert-squad` for real: DeepSpeed engines on CPU (gloo), 1 and 2 ranks.

Every run is a subprocess with a timeout that kills its whole process group. Distributed
runs talk over loopback only (MASTER_ADDR=127.0.0.1, GLOO_SOCKET_IFNAME=lo, a free port).
DeepSpeed's JIT ops compile into ONE directory for the whole session: $TORCH_EXTENSIONS_DIR
when set, else ~/.cache/dsenv-tests/torch_extensions (cache it in CI: ~3 min cold).

Matrix: single process with fp32 and zero2; two ranks under each launcher with one preset
each (fp32, zero2, zero3, zero3-offload) run across two hosts (tests/test_multihost_launch.py);
here two ranks only where a ds_config written for one rank is rejected.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.workload_runs import bad_input, explain, launched, one_line, run_dsenv


def rescore(out: Path, settings: dict) -> dict:
    """The saved model, loaded back by plain transformers, scored on the dev file: must match
    what the run reported (catches a ZeRO-3 save of partitioned, empty parameters)."""
    import torch
    from transformers import AutoTokenizer, BertForQuestionAnswering

    from dsenv.workloads import squad

    model = BertForQuestionAnswering.from_pretrained(out / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    dev = squad.read_squad(out / "assets" / "data" / "dev-v1.1.json")
    features = squad.eval_features(dev, tokenizer, settings["max_length"],
                                   settings["doc_stride"], settings["max_query_length"])
    with torch.no_grad():
        logits = model(**{k: torch.tensor(features[k]) for k in
                          ("input_ids", "token_type_ids", "attention_mask")})
    answers = squad.best_answers(dev, features, logits.start_logits.float().numpy(),
                                 logits.end_logits.float().numpy())
    return squad.squad_scores(dev, {k: v[0] for k, v in answers.items()})


# ----------------------------------------------------------------------------- 1 process
@pytest.mark.slow
# Three healthy runs, three seeds, each must pass: the sanity bar holds three times out of
# three, under both single-process presets (zero3 and zero3-offload run with two ranks across
# hosts, tests/test_multihost_launch.py).
@pytest.mark.parametrize("preset, seed", [("fp32", 11), ("zero2", 12), ("fp32", 13)])
def test_single_process_presets_pass_for_three_seeds(tmp_path, run_env, no_references, preset,
                                                     seed):
    result, doc = run_dsenv(tmp_path, run_env, "--preset", preset, "--seed", str(seed),
                            "--references", no_references, "--examples", "0", timeout=240)
    assert result.returncode == 0, f"seed {seed}: " + explain(result)
    assert doc["status"] == "PASS" and doc["batch"]["preset"] == preset
    assert doc["run"]["launcher"] == "none" and doc["run"]["world_size"] == 1
    assert doc["batch"]["train_batch_size"] == 16 == doc["ds_config"]["train_batch_size"]
    assert doc["ds_config"]["zero_optimization"]["stage"] == {"fp32": 0, "zero2": 2}.get(
        preset, 3)
    sanity, perf = doc["verdicts"]
    assert (sanity["name"], sanity["status"]) == ("sanity", "PASS")
    assert (perf["name"], perf["status"]) == ("performance", "REPORTED")
    assert doc["metrics"]["exact_match"] >= 60 and doc["training"]["loss_drop"] >= 0.5
    assert doc["training"]["samples_per_s"] > 0
    assert len(doc["training"]["loss_curve"]) == doc["training"]["steps"]
    assert "dsenv smoke bert-squad: PASS" in result.stdout
    assert rescore(tmp_path / "out", doc["settings"]) == pytest.approx(doc["metrics"])


@pytest.mark.slow
def test_model_is_saved_atomically_over_leftovers_and_loads_back(tmp_path, run_env):
    out = tmp_path / "out"
    (out / "model").mkdir(parents=True)
    (out / "model" / "stale.bin").write_text("from an earlier run")
    (out / ".model.tmp-999").mkdir()  # an interrupted earlier save
    (out / ".model.tmp-999" / "half.safetensors").write_text("half-written")
    refs = tmp_path / "refs.toml"  # a reference every CPU meets: the PASS path end to end
    refs.write_text('[[bert-squad-smoke]]\ndevice = "cpu:*"\nsamples_per_s = 1\n'
                    'tolerance = 0.5\nsource = "test"\n')
    result, doc = run_dsenv(tmp_path, run_env, "--references", str(refs), "--report",
                        str(tmp_path / "elsewhere" / "run.json"), timeout=240)
    assert result.returncode == 0, explain(result)
    assert not (out / "report.json").exists()
    doc = json.loads((tmp_path / "elsewhere" / "run.json").read_text())
    assert doc["verdicts"][1]["status"] == "PASS" and "cpu:*" in doc["verdicts"][1]["detail"]
    assert sorted(p.name for p in out.iterdir()) == ["assets", "model"]
    files = {p.name for p in (out / "model").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files
    assert "stale.bin" not in files

    from transformers import AutoTokenizer, BertForQuestionAnswering

    model = BertForQuestionAnswering.from_pretrained(out / "model")
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    assert model.config.hidden_size == doc["settings"]["hidden_size"]
    assert tokenizer.is_fast
    for key in ("versions", "run", "batch", "ds_config", "training", "metrics", "verdicts"):
        assert key in doc
    assert doc["versions"]["deepspeed"] and doc["run"]["backend"] == "gloo"


# ----------------------------------------------------------------------------- broken twins
@pytest.mark.slow
@pytest.mark.parametrize("broken", [["--lr", "0"], ["--shuffle-labels"]],
                         ids=["lr0", "shuffled-labels"])
def test_broken_runs_fail_the_sanity_verdict(tmp_path, run_env, no_references, broken):
    result, doc = run_dsenv(tmp_path, run_env, *broken, "--references", no_references,
                        timeout=240)
    assert result.returncode == 1, explain(result)
    assert doc["status"] == "FAIL" and doc["verdicts"][0]["status"] == "FAIL"
    assert doc["metrics"]["exact_match"] < 30
    assert "dsenv smoke bert-squad: FAIL" in result.stdout


# ----------------------------------------------------------------------------- 2 ranks
# Two ranks under each launcher, one preset each (fp32, zero2, zero3, zero3-offload), run
# across two namespaced hosts: tests/test_multihost_launch.py.


# ----------------------------------------------------------------------------- bad input
def test_missing_data_file_isone_line(tmp_path, run_env):
    line = one_line(bad_input(tmp_path, run_env, "--data-dir", str(tmp_path / "nope")))
    assert line == (f"dsenv smoke bert-squad: SQuAD file {tmp_path / 'nope'}/train-v1.1.json: "
                    "no such file")


def test_malformed_squad_json_isone_line(tmp_path, run_env):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train-v1.1.json").write_text('{"data": [{"paragraphs": [{"qas": []}]}]}')
    (data / "dev-v1.1.json").write_text("{}")
    line = one_line(bad_input(tmp_path, run_env, "--data-dir", str(data)))
    assert "train-v1.1.json: data[0].paragraphs[0]: no 'context' string" in line


def test_unknown_preset_isone_line(tmp_path, run_env):
    line = one_line(bad_input(tmp_path, run_env, "--preset", "zero4"))
    assert line.startswith("dsenv smoke bert-squad: unknown preset 'zero4'; choose one of fp32")


def test_ds_config_written_for_one_rank_is_rejected_under_two(tmp_path, run_env):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_batch_size": 16,
                                  "train_micro_batch_size_per_gpu": 16}))
    run_env["OMP_NUM_THREADS"] = "1"
    result = bad_input(tmp_path, run_env, "--deepspeed-config", str(config),
                  command=launched("torchrun", run_env, "bert-squad"))
    assert result.returncode != 0
    assert result.stderr.count("dsenv smoke bert-squad: ds_config train_batch_size 16 "
                               "contradicts this run: micro-batch 16 x grad-accum 1 x world "
                               "size 2 = 32; drop train_batch_size (dsenv derives it)") >= 1
    # torchrun may stop the second rank before it prints when the first exits first; each rank
    # that prints says one line (torchrun adds its own traceback for failed children)
    assert "WorkloadError" not in result.stderr and "/workloads/" not in result.stderr
