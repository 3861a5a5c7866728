"""`dsenv run bert-squad`: evaluating a saved model (seed 001's test script), and the full
run's offline behaviour. The model evaluated is one a real smoke run trained and saved."""

from __future__ import annotations

import json
import sys
import time

import pytest

from dsenv import proc
from tests.harness.browser import look_at, offline_browser
from tests.harness.workload_runs import MODULE, RUN, bad_input, explain, one_line, run_dsenv

PLANT = "<script>document.title = 'run by the data set'</script>"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, extensions_dir):
    """One healthy smoke run: its saved model and its synthetic dev file."""
    import os

    from dsenv.net import free_port
    from tests.harness.workload_runs import LAUNCHER_PREFIXES, LAUNCHER_VARS

    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo",
               TORCH_EXTENSIONS_DIR=str(extensions_dir), DS_ACCELERATOR="cpu",
               HF_HUB_OFFLINE="1")
    tmp = tmp_path_factory.mktemp("trained")
    no_references = tmp / "references.toml"  # a busy machine must not fail the fixture
    no_references.write_text("# empty\n")
    result, doc = run_dsenv(tmp, env, "--examples", "0", "--references", str(no_references),
                            timeout=300)
    assert result.returncode == 0, explain(result)
    return tmp / "out"


@pytest.mark.slow
def test_evaluate_saved_model_on_chosen_dev_samples(tmp_path, run_env, trained):
    from dsenv.workloads import squad

    data = trained / "assets" / "data"
    result = bad_input(tmp_path, run_env, "--model-dir", str(trained / "model"), "--data-dir",
                       str(data), "--start-sample", "5", "--num-test-samples", "8",
                       command=RUN)
    assert result.returncode == 0, explain(result)
    doc = json.loads((tmp_path / "out" / "evaluate.json").read_text())
    dev = squad.read_squad(data / "dev-v1.1.json")
    chosen = dev[5:13]
    assert doc["mode"] == "evaluate" and doc["num_test_samples"] == 8
    assert list(doc["predictions"]) == [ex.id for ex in chosen]
    assert doc["metrics"] == pytest.approx(squad.squad_scores(chosen, doc["predictions"]))
    assert doc["metrics"]["exact_match"] >= 60  # the trained model answers them
    assert doc["windowing"] == {"max_length": 64, "doc_stride": 16, "max_query_length": 24}
    text = " ".join(result.stdout.split())
    assert all(ex.question in text for ex in chosen)  # each sample shown with its answer
    assert "8 dev questions 5..12" in text


@pytest.mark.slow
def test_evaluate_rejects_what_is_not_a_model(tmp_path, run_env, trained):
    data = str(trained / "assets" / "data")
    line = one_line(bad_input(tmp_path, run_env, "--model-dir", str(trained / "assets"),
                              "--data-dir", data, command=RUN))
    assert line == (f"dsenv run bert-squad: --model-dir {trained / 'assets'}: not a saved "
                    "model (no config.json); pass the `model` folder a run wrote "
                    "(OUTPUT_DIR/model)")
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_text((trained / "model" / "config.json").read_text())
    line = one_line(bad_input(tmp_path, run_env, "--model-dir", str(weightless), "--data-dir",
                              data, command=RUN))
    assert line.startswith(f"dsenv run bert-squad: --model-dir {weightless}: cannot load it")
    line = one_line(bad_input(tmp_path, run_env, "--model-dir", str(trained / "model"),
                              "--data-dir", data, "--start-sample", "400", command=RUN))
    assert line == "dsenv run bert-squad: --start-sample 400: the dev set has 400 questions " \
                   "(0..399)"


def test_full_run_without_fetched_assets_names_fetch_at_once(tmp_path, run_env):
    run_env.update(HF_HOME=str(tmp_path / "empty-cache"), HF_HUB_OFFLINE="0",
                   HF_ENDPOINT="http://127.0.0.1:9")  # offline is forced by the run itself
    run_env.pop("HF_HUB_CACHE", None)
    run_env.pop("HF_DATASETS_CACHE", None)
    started = time.monotonic()
    line = one_line(bad_input(tmp_path, run_env, command=RUN))
    assert time.monotonic() - started < 30
    assert line.startswith("dsenv run bert-squad: model google-bert/bert-base-uncased@main "
                           "(no snapshot in ")
    assert "`dsenv fetch bert-squad`" in line and "--from DIR" in line
    assert not (tmp_path / "empty-cache").exists()  # nothing half-made, no download tried


# ----------------------------------------------------------------------------- full run
@pytest.mark.slow
def test_full_run_end_to_end_from_what_fetch_placed(tmp_path, run_env):
    """A small fake "full" data set and model served by a Hub on 127.0.0.1, placed by a real
    `dsenv fetch`, then `dsenv run bert-squad` reads them offline: the server sees no
    request during the run although HF_ENDPOINT points at it and offline mode is unset."""

    from tests.harness.hubserver import HubServer, bert_squad_repos

    home = tmp_path / "hf"
    run_env.update(HF_HOME=str(home), HF_HUB_OFFLINE="0")
    for name in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_DATASETS_OFFLINE",
                 "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME"):
        run_env.pop(name, None)
    with HubServer(bert_squad_repos(tmp_path / "served", train_rows=160, validation_rows=24,
                                    plant=PLANT)) as hub:
        run_env["HF_ENDPOINT"] = hub.url
        fetched = proc.run([sys.executable, "-m", "dsenv", "fetch", "bert-squad"],
                           timeout=120, env=run_env)
        assert fetched.returncode == 0, explain(fetched)
        hub.reset()
        result, doc = run_dsenv(
            tmp_path, run_env, "--max-length", "96", "--doc-stride", "32", "--epochs", "3",
            "--micro-batch", "8", "--lr", "1e-3", "--examples", "2",
            command=[sys.executable, "-m", MODULE, "run", "bert-squad"], timeout=300)
        assert hub.requests == []  # offline: nothing asked of the Hub
    assert doc is not None, explain(result)
    assert result.returncode == (0 if doc["status"] == "PASS" else 1), explain(result)
    assert doc["mode"] == "run" and doc["run"]["world_size"] == 1
    assert "rajpurkar/squad in" in doc["data"]["train"]
    assert (doc["data"]["train_examples"], doc["data"]["dev_examples"]) == (160, 24)
    assert doc["model"].endswith("snapshots/" + hub.commit("model", "google-bert/bert-base-"
                                                                    "uncased"))
    settings = doc["settings"]
    assert (settings["max_length"], settings["doc_stride"], settings["epochs"]) == (96, 32, 3)
    assert doc["training"]["steps"] == 3 * (doc["data"]["train_features"] // 8)
    assert doc["ds_config"]["scheduler"]["params"]["total_num_steps"] == doc["training"]["steps"]
    assert doc["training"]["loss_last"] < doc["training"]["loss_first"]
    assert set(doc["metrics"]) == {"exact_match", "f1"}
    assert [v["name"] for v in doc["verdicts"]] == ["sanity", "performance"]
    assert (tmp_path / "out" / "model" / "dsenv-features.json").is_file()
    assert f"dsenv run bert-squad: {doc['status']}" in result.stdout

    # its HTML page, beside report.json, in a browser with no network: the loss of every
    # step, the verdicts as the JSON has them, and the data set's markup shown as text
    page = tmp_path / "out" / "report.html"
    with offline_browser(tmp_path / "browser") as browser:
        seen = look_at(browser, page, screenshot="run-bert-squad")
    assert seen.requests == [page.as_uri()] and seen.scripts == 0
    assert seen.title == "dsenv run bert-squad" and seen.verdict == doc["status"]
    assert seen.details == {v["name"]: v["detail"] for v in doc["verdicts"]}
    assert seen.series["loss/train loss"] == doc["training"]["steps"]
    assert seen.series["throughput/each step"] == doc["training"]["steps"]
    assert doc["examples"]["rows"] and all(PLANT in r["context"]
                                           for r in doc["examples"]["rows"])
    assert len(seen.examples) == 2 and all(PLANT in text for text in seen.examples)
