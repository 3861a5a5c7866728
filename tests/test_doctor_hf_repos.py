"""cache.hf-repos: each repository's folders a download writes, tried as the job's user (issue 23).

Built for real: a shared hub cache whose top-level folders are open to everyone (mode 1777,
as a site's shared cache often is), into which user ``nobody`` downloaded a model first with
huggingface_hub (from the test hub on 127.0.0.1), so the repository's ``.locks/<repo>/``,
``blobs/``, ``snapshots/`` and ``refs/`` folders are nobody's, mode 755. User ``daemon`` then
runs the doctor and downloads another file of the same repository: the download dies with
PermissionError on ``.locks/models--.../<etag>.lock`` while cache.hf-dirs calls the folders
writable and cache.flock says flock works; cache.hf-repos fails and names the lock folder and
its owner. The healthy twin: the same cache with the check's fix applied by the owner
(`chgrp -R` to a group daemon is in, the `chmod -R g+rwX` the fix names): daemon's download
works, the check passes. Both users act through tests/harness/mountns.py's as_user (a
forked child, setuid).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from dsenv.doctor.context import Context, Options
from dsenv.doctor.registry import CHECKS, all_checks
from dsenv.doctor.runner import run_check
from dsenv.facts.host import hfrepos
from dsenv.facts.node import Node
from dsenv.verdicts.findings import Status
from tests.harness.findings import here
from tests.harness.hubserver import HubServer
from tests.harness.mountns import ChildRaised, as_user, needs_root_and

REPO = "google-bert/bert-base-uncased"
FOLDER = "models--google-bert--bert-base-uncased"
FILES = {"config.json": b'{"model_type": "bert"}\n', "vocab.txt": b"[PAD]\n[UNK]\n"}
CHECKED = ("cache.hf-dirs", "cache.flock", "cache.hf-repos")


@pytest.fixture(scope="module")
def hub():
    with HubServer({("model", REPO): FILES}) as server:
        yield server


@pytest.fixture
def download(hub, monkeypatch, tmp_path):
    """download(cache, filename) with huggingface_hub from the test hub; warmed up as root
    first, so a child acting as another user needs no module it has not got."""
    # huggingface_hub reads its variables at import: imported here, not at collection
    from huggingface_hub import constants, hf_hub_download

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # conftest sets HF_HUB_OFFLINE=1

    def fetch(cache: Path, filename: str) -> str:
        return hf_hub_download(REPO, filename, cache_dir=str(cache), endpoint=hub.url,
                               token=False)  # no token file (root's, unreadable to others)

    fetch(tmp_path / "warm-up", "config.json")
    return fetch


@pytest.fixture
def shared():
    """A shared Hugging Face home in /tmp: HF_HOME, its hub cache and .locks mode 1777."""
    needs_root_and("nobody", "daemon")
    root = Path(tempfile.mkdtemp(prefix="dsenv-shared-hf-", dir="/tmp"))
    try:
        root.chmod(0o755)
        home = root / "hf"
        for folder in (home, home / "hub", home / "hub" / ".locks", home / "datasets"):
            folder.mkdir()
            folder.chmod(0o1777)
        yield home
    finally:
        shutil.rmtree(root, ignore_errors=True)


def doctor_as_daemon(home: Path, workload: str | None = None) -> dict:
    """The cache checks as user daemon against HF_HOME=home: {check id: Result}."""
    all_checks()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home.parent), "HF_HOME": str(home)}

    def run():
        ctx = Context(options=Options(target="login", workload=workload), env=env,
                      root=Path("/"))
        return {c: run_check(CHECKS[c], ctx) for c in CHECKED}

    run()  # as root first: every module the checks use is loaded before the fork
    return as_user("daemon", run)


def test_a_repository_another_user_downloaded_fails_where_the_download_dies(shared, download):
    hub = shared / "hub"
    as_user("nobody", lambda: download(hub, "config.json"))
    lock_dir = hub / ".locks" / FOLDER
    assert hfrepos.uid_of(lock_dir) == hfrepos.uid_of(hub / FOLDER / "blobs") != 0

    with pytest.raises(ChildRaised) as died:  # the job's download, as daemon
        as_user("daemon", lambda: download(hub, "vocab.txt"))
    assert died.value.kind == "PermissionError", died.value.trace
    assert f"{lock_dir}/" in died.value.message and ".lock" in died.value.message

    found = doctor_as_daemon(shared)
    assert found["cache.hf-dirs"].status is Status.OK, found["cache.hf-dirs"]  # the blind spot
    assert "writable" in found["cache.hf-dirs"].summary
    assert found["cache.flock"].status is Status.OK, found["cache.flock"]
    repos = found["cache.hf-repos"]
    assert repos.status is Status.FAIL, repos
    assert f"the lock folder {lock_dir} (owner uid " in repos.summary
    assert "(nobody)) cannot be written by you (uid " in repos.summary
    assert f"PermissionError on {lock_dir}/<etag>.lock" in repos.summary
    assert here(repos).startswith("use a hub cache of your own (export HF_HUB_CACHE=")
    assert str(lock_dir) in here(repos) and str(hub / FOLDER / "blobs") in here(repos)
    assert any(f"{FOLDER}: blob folder {hub / FOLDER / 'blobs'}" in e and "NOT writable" in e
               for e in repos.evidence), repos.evidence

    # the workload's assets name the same repository (bert-squad: bert-base-uncased, squad)
    named = doctor_as_daemon(shared, workload="bert-squad")["cache.hf-repos"]
    assert named.status is Status.FAIL and str(lock_dir) in named.summary, named
    assert "the assets of bert-squad" in named.evidence[0]


def test_the_fix_applied_to_the_same_cache_passes_and_the_download_works(shared, download):
    hub = shared / "hub"
    as_user("nobody", lambda: download(hub, "config.json"))
    broken = doctor_as_daemon(shared)["cache.hf-repos"]
    assert broken.status is Status.FAIL, broken
    # the fix as the cache's owner (here root, for nobody) applies it, with daemon's group
    chmod = re.search(r"`(chmod -R g\+rwX [^`]+)`", here(broken)).group(1)
    folders = shlex.split(chmod)[3:]
    assert str(hub / ".locks" / FOLDER) in folders
    subprocess.run(["chgrp", "-R", "daemon", *folders], check=True, timeout=30)
    subprocess.run(shlex.split(chmod), check=True, timeout=30)

    twin = doctor_as_daemon(shared)["cache.hf-repos"]
    assert twin.status is Status.OK, twin
    assert "of 1 repository (and those of a new one)" in twin.summary
    path = as_user("daemon", lambda: download(hub, "vocab.txt"))
    assert Path(path).read_bytes() == FILES["vocab.txt"]


def test_another_users_lock_file_alone_warns(shared, download):
    hub = shared / "hub"
    as_user("nobody", lambda: download(hub, "config.json"), umask=0o000)  # folders 777
    (lock,) = (hub / ".locks" / FOLDER).glob("*.lock")
    assert not lock.stat().st_mode & 0o002  # huggingface_hub's 0o664 (0o644 in older releases)
    found = doctor_as_daemon(shared)["cache.hf-repos"]
    assert found.status is Status.WARN, found
    assert "1 lock file(s) of another user (uid " in found.summary
    assert f"PermissionError on {lock}" in found.summary
    path = as_user("daemon", lambda: download(hub, "vocab.txt"))  # another file: its own lock
    assert Path(path).read_bytes() == FILES["vocab.txt"]


def test_an_empty_cache_is_judged_by_what_a_first_download_creates(shared, download):
    found = doctor_as_daemon(shared)["cache.hf-repos"]
    assert found.status is Status.OK and "no repository in" in found.summary, found
    as_user("daemon", lambda: download(shared / "hub", "config.json"))  # and it can


def test_lock_folders_closed_to_others_fail_before_any_repository_exists(shared, download):
    (shared / "hub" / ".locks").chmod(0o755)  # root's: a new repository's lock folder fails
    found = doctor_as_daemon(shared)["cache.hf-repos"]
    assert found.status is Status.FAIL, found
    assert f"PermissionError creating {shared / 'hub' / '.locks'}/<repo folder>/" \
        in found.summary
    with pytest.raises(ChildRaised) as died:
        as_user("daemon", lambda: download(shared / "hub", "config.json"))
    assert died.value.kind == "PermissionError", died.value.trace


def test_a_large_cache_is_tried_other_users_repositories_first(tmp_path):
    needs_root_and("nobody")
    hub = tmp_path / "hub"
    for name in ("models--a--one", "datasets--b--two", "models--c--three", "not-a-repo"):
        (hub / name).mkdir(parents=True)
    (hub / ".locks" / "models--z--only-locked").mkdir(parents=True)
    shutil.chown(hub / "models--c--three", "nobody")
    assert hfrepos.cached_repos(Node(), hub, limit=2) == (["models--c--three", "datasets--b--two"], 2)
    assert hfrepos.cached_repos(Node(), hub)[0] == ["models--c--three", "datasets--b--two",
                                            "models--a--one", "models--z--only-locked"]
