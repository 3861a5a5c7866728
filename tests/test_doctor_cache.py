"""cache area: real cache folders in temp dirs, loopback-only reachability, workload assets."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from dsenv.doctor.checks.software import cache as cache_checks
from dsenv.facts.host import hfcache
from dsenv.verdicts.findings import Status
from dsenv.workloads.fetch.assets import CacheLayout, assets_for
from tests.harness.findings import here

CLOSED = "http://127.0.0.1:9"  # discard port: nothing listens, the connect is refused


def real_library_dirs(env: dict) -> dict:
    """What huggingface_hub and datasets themselves resolve for ``env`` (a subprocess)."""
    code = ("import json, huggingface_hub.constants as h, datasets.config as d;"
            "print(json.dumps({'home': h.HF_HOME, 'hub': h.HF_HUB_CACHE,"
            " 'datasets': str(d.HF_DATASETS_CACHE)}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("extra", [
    {},
    {"XDG_CACHE_HOME": "{tmp}/xdg"},
    {"HF_HOME": "{tmp}/hf", "HUGGINGFACE_HUB_CACHE": "{tmp}/legacy-hub"},
    {"HF_HOME": "~/hf", "HF_HUB_CACHE": "$SCRATCH/hub", "HUGGINGFACE_HUB_CACHE": "{tmp}/x",
     "HF_DATASETS_CACHE": "{tmp}/ds", "SCRATCH": "{tmp}/scratch"},
])
def test_resolution_matches_the_libraries(tmp_path, extra):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
           **{k: v.format(tmp=tmp_path) for k, v in extra.items()}}
    dirs = hfcache.resolve_dirs(env)
    real = real_library_dirs(env)
    assert (str(dirs.hf_home), str(dirs.hub), str(dirs.datasets)) == \
        (real["home"], real["hub"], real["datasets"])


def test_hf_dirs_writable_ok(tmp_path, make_ctx, run_one):
    env = {"HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    (tmp_path / "hf" / "hub").mkdir(parents=True)
    result = run_one("cache.hf-dirs", make_ctx(env=env))
    assert result.status == Status.OK, result
    assert any(str(tmp_path / "hf" / "hub") in e and "writable" in e for e in result.evidence)
    assert any("missing (created on first use" in e for e in result.evidence)  # datasets/
    assert not list((tmp_path / "hf").glob(".dsenv-write-test-*"))  # the probe cleaned up


def test_hf_dirs_unwritable_fails(tmp_path, make_ctx, run_one):
    # /proc refuses new files even for root: a real write failure
    env = {"HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_CACHE": "/proc/dsenv-test/hub"}
    result = run_one("cache.hf-dirs", make_ctx(env=env))
    assert result.status == Status.FAIL
    assert "/proc/dsenv-test/hub" in result.summary
    assert here(result).startswith("export HF_HUB_CACHE=")
    assert result.mode == "cache.hf-home-not-writable"


def test_a_home_that_cannot_be_written_names_every_default_cache(make_ctx, run_one):
    # HOME=/ for an arbitrary uid in a pod; /proc refuses new files even for root
    result = run_one("cache.hf-dirs", make_ctx(env={"HOME": "/proc"}))
    assert result.status == Status.FAIL and result.mode == "cache.xdg-cache-not-writable"
    assert "HOME=/proc cannot be written" in result.summary


def test_hf_dirs_below_a_file_fails(tmp_path, make_ctx, run_one):
    (tmp_path / "a-file").write_text("")
    env = {"HOME": str(tmp_path), "HF_HOME": str(tmp_path / "a-file" / "hf")}
    result = run_one("cache.hf-dirs", make_ctx(env=env))
    assert result.status == Status.FAIL and here(result).startswith("export HF_HOME=")


def test_hf_dirs_low_space_warns(tmp_path, make_ctx, run_one, monkeypatch):
    # real free space of the temp filesystem, measured against a threshold it cannot meet
    monkeypatch.setattr(cache_checks, "MIN_FREE_BYTES", 1 << 60)
    result = run_one("cache.hf-dirs", make_ctx(env={"HOME": str(tmp_path)}))
    assert result.status == Status.WARN and "GiB free" in result.summary


def test_legacy_transformers_cache_warns(tmp_path, make_ctx, run_one):
    env = {"HOME": str(tmp_path), "TRANSFORMERS_CACHE": str(tmp_path / "old")}
    result = run_one("cache.hf-dirs", make_ctx(env=env))
    assert result.status == Status.WARN  # transformers 5.x is installed here
    assert result.fix == f"export HF_HUB_CACHE={tmp_path / 'old'}"


def test_offline_compute_unreachable_fails(make_ctx, run_one):
    ctx = make_ctx(env={"HF_ENDPOINT": CLOSED}, target="compute")
    result = run_one("cache.offline", ctx)
    assert result.status == Status.FAIL
    assert here(result) == "export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1"
    assert any("127.0.0.1:9" in e for e in result.evidence)
    assert result.seconds < 2.5


def test_offline_compute_reachable_ok(make_ctx, run_one):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        ctx = make_ctx(env={"HF_ENDPOINT": f"http://127.0.0.1:{port}"}, target="compute")
        result = run_one("cache.offline", ctx)
    assert result.status == Status.OK and "reachable" in result.summary


def test_offline_set_ok_and_partial_warns(make_ctx, run_one):
    full = {"HF_ENDPOINT": CLOSED, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    assert run_one("cache.offline", make_ctx(env=full, target="compute")).status == Status.OK
    # the older pair TRANSFORMERS_OFFLINE + HF_DATASETS_OFFLINE is offline for every library too
    seeds = {"HF_ENDPOINT": CLOSED, "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    assert run_one("cache.offline", make_ctx(env=seeds, target="compute")).status == Status.OK
    partial = {"HF_ENDPOINT": CLOSED, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "0"}
    result = run_one("cache.offline", make_ctx(env=partial, target="compute"))
    assert result.status == Status.WARN and "datasets" in result.summary


def test_offline_login_info(make_ctx, run_one):
    result = run_one("cache.offline", make_ctx(env={"HF_ENDPOINT": CLOSED}))
    assert result.status == Status.INFO


def fill_offline_cache(layout, workload):
    """Place a workload's assets the way `dsenv fetch` does: model snapshots in the hub
    cache, data sets written by datasets' save_to_disk."""
    import datasets

    for asset in assets_for(workload):
        if asset.kind == "dataset":
            splits = {name: datasets.Dataset.from_dict({"text": ["a", "b"]})
                      for name in asset.splits}
            datasets.DatasetDict(splits).save_to_disk(str(asset.saved_dir(layout)))
            continue
        repo = layout.hub / asset.cache_folder
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / asset.revision).write_text("0123abcd")
        snapshot = repo / "snapshots" / "0123abcd"
        snapshot.mkdir(parents=True)
        for name in asset.files:
            (snapshot / name).write_text("x")


def test_assets_skip_without_workload(make_ctx, run_one):
    assert run_one("cache.assets", make_ctx()).status == Status.SKIP


def test_assets_missing_fails_then_present_ok(tmp_path, make_ctx, run_one):
    env = {"HOME": str(tmp_path), "HF_HUB_CACHE": str(tmp_path / "hub")}
    result = run_one("cache.assets", make_ctx(env=env, workload="bert-squad"))
    assert result.status == Status.FAIL and "dsenv fetch bert-squad" in here(result)
    assert any("google-bert/bert-base-uncased" in e for e in result.evidence)

    fill_offline_cache(CacheLayout.from_env(env), "bert-squad")
    result = run_one("cache.assets", make_ctx(env=env, workload="bert-squad"))
    assert result.status == Status.OK, result
