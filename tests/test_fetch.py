"""dsenv fetch against a fake Hugging Face Hub on 127.0.0.1 (tests/harness/hubserver.py).

Every fetch runs as ``python -m dsenv fetch ...`` in a subprocess: huggingface_hub reads
HF_ENDPOINT / HF_HUB_OFFLINE at import, and conftest sets HF_HUB_OFFLINE=1 and a closed
HF_ENDPOINT for the test process itself. Every environment carries HF_TOKEN=secret-value,
and no output may show it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsenv.workloads.fetch.assets import CacheLayout, assets_for
from tests.harness import cli
from tests.harness.hubserver import (
    BERT_REPO,
    SECRET,
    SQUAD_REPO,
    HubServer,
    bert_squad_repos,
    hub_env,
)

CLOSED = "http://127.0.0.1:9"
MODEL_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "vocab.txt"]
SQUAD_FILES = ["plain_text/train-00000-of-00001.parquet",
               "plain_text/validation-00000-of-00001.parquet"]


def dsenv(*args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m dsenv ARGS`` with exactly ``env``; no output may show the token or a
    traceback."""
    done = cli.dsenv(*args, base=env, timeout=timeout)
    both = done.stdout + done.stderr
    assert SECRET not in both
    assert "Traceback" not in both, both
    return done


def one_error_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("dsenv fetch: ")
    return lines[0]


def copy_tree(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest


def flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0xFF
    path.write_bytes(bytes(data))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    return bert_squad_repos(tmp_path_factory.mktemp("hub-content"))


@pytest.fixture(scope="module")
def hub(repos):
    with HubServer(repos) as server:
        yield server


@pytest.fixture(scope="module")
def fetched(hub, tmp_path_factory):
    """One real fetch of bert-squad into a fresh HF_HOME: (home, result, requests)."""
    home = tmp_path_factory.mktemp("fetched") / "hf"
    hub.reset()
    start = time.monotonic()
    done = dsenv("fetch", "bert-squad", env=hub_env(home, hub.url))
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - start < 60
    return home, done, list(hub.requests), list(hub.authorization)


@pytest.fixture(scope="module")
def bundle(hub, tmp_path_factory):
    """``dsenv fetch bert-squad --cache-dir BUNDLE`` (the HF_HOME of the run stays empty)."""
    root = tmp_path_factory.mktemp("bundle")
    done = dsenv("fetch", "bert-squad", "--cache-dir", str(root / "bundle"),
                 env=hub_env(root / "unused-home", hub.url))
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (root / "unused-home" / "hub").exists()
    return root / "bundle"


def manifest_of(home: Path) -> dict:
    return json.loads(CacheLayout.under(home).manifest_path("bert-squad").read_text())


# ----------------------------------------------------------------------------- fetch
def test_fetch_places_snapshots_data_set_and_manifest(fetched, hub, repos):
    home, done, requests, authorization = fetched
    layout = CacheLayout.under(home)
    model_commit = hub.commit("model", BERT_REPO)
    squad_commit = hub.commit("dataset", SQUAD_REPO)

    # hub cache, huggingface_hub's own layout: refs/main -> snapshot of symlinks into blobs
    model_dir = layout.hub / "models--google-bert--bert-base-uncased"
    assert (model_dir / "refs" / "main").read_text() == model_commit
    snapshot = model_dir / "snapshots" / model_commit
    assert sorted(p.name for p in snapshot.iterdir()) == MODEL_FILES  # README.md not asked
    for name in MODEL_FILES:
        assert (snapshot / name).is_symlink()
        assert (snapshot / name).read_bytes() == repos[("model", BERT_REPO)][name]
    squad_snapshot = layout.hub / "datasets--rajpurkar--squad" / "snapshots" / squad_commit
    for name in SQUAD_FILES:
        assert (squad_snapshot / name).read_bytes() == repos[("dataset", SQUAD_REPO)][name]

    # the prepared data set
    import datasets

    saved = datasets.load_from_disk(str(layout.saved / "rajpurkar--squad"))
    assert {split: saved[split].num_rows for split in saved} == {"train": 40, "validation": 12}
    assert saved["train"].column_names == ["id", "title", "context", "question", "answers"]
    row = saved["validation"][0]
    start = row["answers"]["answer_start"][0]
    assert row["context"][start:].startswith(row["answers"]["text"][0])
    assert not list(layout.saved.glob(".*"))  # no staging or scratch folder left

    # the manifest: every hub file with the served bytes' size and sha256
    manifest = manifest_of(home)
    assert manifest["schema"] == "dsenv.fetch/1" and manifest["workload"] == "bert-squad"
    assert manifest["endpoint"] == hub.url and manifest["dsenv"]
    entries = {(e["repo"], e["area"]): e for e in manifest["assets"]}
    assert set(entries) == {(BERT_REPO, "hub"), (SQUAD_REPO, "hub"), (SQUAD_REPO, "saved")}
    model = entries[(BERT_REPO, "hub")]
    assert (model["kind"], model["revision"], model["commit"], model["root"]) == \
        ("model", "main", model_commit, "models--google-bert--bert-base-uncased")
    served = repos[("model", BERT_REPO)]
    assert model["files"] == [
        {"path": f"models--google-bert--bert-base-uncased/snapshots/{model_commit}/{name}",
         "size": len(served[name]), "sha256": sha256(served[name])} for name in MODEL_FILES]
    data = entries[(SQUAD_REPO, "hub")]
    assert [f["sha256"] for f in data["files"]] == \
        [sha256(repos[("dataset", SQUAD_REPO)][name]) for name in SQUAD_FILES]
    prepared = entries[(SQUAD_REPO, "saved")]
    assert prepared["root"] == "rajpurkar--squad" and prepared["commit"] == squad_commit
    assert prepared["splits"] == {"train": 40, "validation": 12}
    on_disk = sorted(p.relative_to(layout.saved).as_posix()
                     for p in (layout.saved / "rajpurkar--squad").rglob("*") if p.is_file())
    assert [f["path"] for f in prepared["files"]] == on_disk
    for item in prepared["files"]:
        assert sha256((layout.saved / item["path"]).read_bytes()) == item["sha256"]

    # what went over the wire: the 7 files once each; the token only as a header; nothing
    # but the Hub endpoints snapshot_download uses (datasets asked nothing)
    allowed = ("/api/agent-harnesses", "/api/models/google-bert/bert-base-uncased/",
               "/api/datasets/rajpurkar/squad/", "/google-bert/bert-base-uncased/resolve/",
               "/datasets/rajpurkar/squad/resolve/")
    assert all(path.startswith(allowed) for _, path in requests), requests
    downloads = sorted(p for m, p in requests if m == "GET" and "/resolve/" in p)
    assert len(downloads) == 7 and len(set(downloads)) == 7
    assert authorization and all(a == f"Bearer {SECRET}" for a in authorization)
    assert SECRET not in json.dumps(manifest)
    assert f"manifest {layout.manifest_path('bert-squad')}" in done.stdout
    assert f"{BERT_REPO}@main -> {model_commit[:12]}: 5 files" in done.stdout


def test_doctor_cache_assets_fails_before_and_passes_after(fetched, tmp_path):
    home = fetched[0]

    def assets_status(hf_home: Path) -> tuple[str, str]:
        done = dsenv("doctor", "--for", "bert-squad", "--only", "cache", "--json",
                     env=hub_env(hf_home, CLOSED))
        result = next(r for r in json.loads(done.stdout)["results"] if r["id"] == "cache.assets")
        return result["status"], result["summary"]

    status, summary = assets_status(tmp_path / "empty-home")
    assert status == "fail" and "missing" in summary
    status, summary = assets_status(home)
    assert status == "ok", summary


def test_libraries_load_the_cache_offline(fetched):
    """transformers finds the model by repo id with HF_HUB_OFFLINE=1; the full-run loaders
    (workloads/fetch/assets.py) find the snapshot and the prepared data set."""
    code = f"""
import torch
from transformers import AutoTokenizer, BertForQuestionAnswering
from dsenv.workloads.fetch import assets
tokenizer = AutoTokenizer.from_pretrained({BERT_REPO!r})
model = BertForQuestionAnswering.from_pretrained({BERT_REPO!r})
data = assets.load_dataset("bert-squad")
row = data["validation"][0]
batch = tokenizer(row["question"], row["context"], return_tensors="pt")
with torch.no_grad():
    out = model(**batch)
print(type(tokenizer).__name__, model.config.hidden_size, out.start_logits.shape[1],
      assets.model_path("bert-squad").name, data["train"].num_rows)
"""
    env = hub_env(fetched[0], CLOSED, HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    words = done.stdout.split()
    assert words[1] == "32" and int(words[2]) > 5
    assert words[3] == manifest_of(fetched[0])["assets"][0]["commit"] and words[4] == "40"


def test_refetch_is_idempotent(fetched, hub, tmp_path):
    home = copy_tree(fetched[0], tmp_path / "hf")
    before = manifest_of(home)
    hub.reset()
    done = dsenv("fetch", "bert-squad", env=hub_env(home, hub.url))
    assert done.returncode == 0, done.stderr
    assert hub.downloads() == []
    assert [m for m, _ in hub.requests] == ["GET", "GET"]  # one repo_info per repository
    assert "all cached" in done.stdout and "already prepared" in done.stdout
    after = manifest_of(home)
    assert after["assets"] == before["assets"]
    assert dsenv("fetch", "--verify", env=hub_env(home, CLOSED)).returncode == 0


def test_bundle_imported_without_network(bundle, hub, tmp_path):
    home = tmp_path / "offline-node"
    hub.reset()
    env = hub_env(home, CLOSED, HF_HUB_OFFLINE="1")  # no hub at all, offline mode on
    done = dsenv("fetch", "all", "--from", str(bundle), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert hub.requests == []
    layout = CacheLayout.under(home)
    assert f"manifest {layout.manifest_path('bert-squad')}" in done.stdout
    for asset in assets_for("bert-squad"):
        assert asset.missing_in(layout) == []
    snapshot = assets_for("bert-squad")[0].snapshot(layout)
    assert (snapshot / "model.safetensors").is_symlink()  # symlinks into blobs preserved
    manifest = manifest_of(home)
    assert manifest["imported_from"] == str(bundle.resolve())
    verified = dsenv("fetch", "--verify", "bert-squad", env=env)
    assert verified.returncode == 0, verified.stdout
    assert "all match" in verified.stdout
    assert dsenv("fetch", "--verify", "--cache-dir", str(bundle), env=env).returncode == 0


def test_verify_names_a_changed_file_and_fetch_repairs_it(fetched, hub, tmp_path):
    home = copy_tree(fetched[0], tmp_path / "hf")
    layout = CacheLayout.under(home)
    weights = assets_for("bert-squad")[0].snapshot(layout) / "model.safetensors"
    flip_byte(weights.resolve())
    arrow = next((layout.saved / "rajpurkar--squad" / "train").glob("*.arrow"))
    arrow.unlink()

    done = dsenv("fetch", "--verify", env=hub_env(home, CLOSED))
    assert done.returncode == 1
    assert f"{weights}: changed (sha256" in done.stdout
    assert f"{arrow}: missing" in done.stdout
    assert "2 of 14 files missing or changed" in done.stdout

    hub.reset()
    again = dsenv("fetch", "bert-squad", env=hub_env(home, hub.url))
    assert again.returncode == 0, again.stderr
    assert hub.downloads() == [p for m, p in hub.requests
                               if m == "GET" and p.endswith("/model.safetensors")]
    assert "1 damaged and fetched again" in again.stdout and "prepared in" in again.stdout
    assert dsenv("fetch", "--verify", "bert-squad", env=hub_env(home, CLOSED)).returncode == 0


def test_from_refuses_a_damaged_bundle(bundle, tmp_path):
    copy = copy_tree(bundle, tmp_path / "bundle")
    damaged = next((copy / "datasets" / "dsenv" / "rajpurkar--squad" / "validation")
                   .glob("*.arrow"))
    flip_byte(damaged)
    home = tmp_path / "hf"
    done = dsenv("fetch", "bert-squad", "--from", str(copy), env=hub_env(home, CLOSED))
    assert done.returncode == 2
    line = one_error_line(done)
    assert str(damaged) in line and "damaged" in line
    assert not home.exists()  # nothing imported


def test_from_without_a_bundle_says_how_to_make_one(tmp_path):
    (tmp_path / "empty").mkdir()
    done = dsenv("fetch", "bert-squad", "--from", str(tmp_path / "empty"),
                 env=hub_env(tmp_path / "hf", CLOSED))
    assert done.returncode == 2
    assert "dsenv fetch bert-squad --cache-dir DIR" in one_error_line(done)


# ----------------------------------------------------------------------------- failures
def test_unreachable_endpoint_fails_fast_in_one_line(tmp_path):
    start = time.monotonic()
    done = dsenv("fetch", "bert-squad", env=hub_env(tmp_path / "hf", CLOSED), timeout=60)
    assert time.monotonic() - start < 20
    assert done.returncode == 2
    line = one_error_line(done)
    assert "cannot reach the Hub at http://127.0.0.1:9" in line and "--from DIR" in line


def test_silent_endpoint_times_out(tmp_path):
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        done = dsenv("fetch", "bert-squad", timeout=60,
                     env=hub_env(tmp_path / "hf", endpoint, HF_HUB_ETAG_TIMEOUT="2"))
        assert time.monotonic() - start < 20
    assert done.returncode == 2
    assert "HF_HUB_ETAG_TIMEOUT=2 s" in one_error_line(done)


def test_requests_without_a_timeout_get_one(tmp_path):
    """huggingface_hub passes timeout=None for repo_info and the tree listing: fetch's
    session bounds them (HF_HUB_DOWNLOAD_TIMEOUT as the read limit)."""
    code = """
import os, time
from dsenv.workloads.fetch import hub as fetch_hub
fetch_hub.open_hub()
import huggingface_hub
start = time.monotonic()
try:
    huggingface_hub.get_session().get(os.environ["HF_ENDPOINT"] + "/api/x", timeout=None)
except Exception as exc:
    print(type(exc).__name__, time.monotonic() - start)
"""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        env = hub_env(tmp_path / "hf", f"http://127.0.0.1:{silent.getsockname()[1]}",
                      HF_HUB_DOWNLOAD_TIMEOUT="1", HF_HUB_DISABLE_TELEMETRY="1")
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60)
    name, seconds = done.stdout.split()
    assert name == "ReadTimeout" and float(seconds) < 5, done.stderr


def _served(repos, drop_model=False, drop_file=None):
    served = {key: dict(files) for key, files in repos.items()}
    if drop_model:
        del served[("model", BERT_REPO)]
    if drop_file:
        del served[("model", BERT_REPO)][drop_file]
    return served


@pytest.mark.parametrize("case", ["repo-404", "revision-404", "no-file-for-pattern"])
def test_hub_refusals_in_one_line(case, repos, tmp_path):
    served = _served(repos, drop_model=case == "repo-404",
                     drop_file="model.safetensors" if case == "no-file-for-pattern" else None)
    with HubServer(served, branches=() if case == "revision-404" else ("main",)) as server:
        done = dsenv("fetch", "bert-squad", env=hub_env(tmp_path / "hf", server.url))
        downloads = server.downloads()
    assert done.returncode == 2
    line = one_error_line(done)
    assert BERT_REPO in line
    expected = {"repo-404": "repository not found", "revision-404": "revision 'main' not found",
                "no-file-for-pattern": "no file matches 'model.safetensors'"}[case]
    assert expected in line
    assert downloads == []


def test_offline_mode_refused(hub, tmp_path):
    hub.reset()
    done = dsenv("fetch", "bert-squad", env=hub_env(tmp_path / "hf", hub.url, HF_HUB_OFFLINE="1"))
    assert done.returncode == 2
    line = one_error_line(done)
    assert "HF_HUB_OFFLINE=1 is set" in line and "unset it" in line
    assert hub.requests == []


def test_unknown_workload(tmp_path):
    done = dsenv("fetch", "bert-squd", env=hub_env(tmp_path / "hf", CLOSED))
    assert done.returncode == 2
    line = one_error_line(done)
    assert "'bert-squd'" in line and "bert-squad, t5-xsum, gpt2-wikitext, bert-mrpc" in line


@pytest.mark.parametrize("text, says", [
    ('{"schema": "dsenv.fetch/1", "workload": ', "not valid JSON"),
    ('{"schema": "dsenv.fetch/1", "workload": "bert-squad", "created": "x", "assets": '
     '[{"kind": "model"}]}', "has no 'repo' string"),
])
def test_verify_rejects_a_broken_manifest(tmp_path, text, says):
    path = CacheLayout.under(tmp_path / "hf").manifest_path("bert-squad")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    done = dsenv("fetch", "--verify", env=hub_env(tmp_path / "hf", CLOSED))
    assert done.returncode == 2
    line = one_error_line(done)
    assert str(path) in line and says in line


def test_cli_stays_light():
    code = ("import sys; from dsenv.cli import build_parser; build_parser(); "
            "print([m for m in sys.modules if m.split('.')[0] in ('huggingface_hub', 'datasets', "
            "'torch', 'transformers', 'pyarrow', 'httpx2')])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "[]", done.stderr
    helped = subprocess.run([sys.executable, "-m", "dsenv", "fetch", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "--from DIR" in helped.stdout
