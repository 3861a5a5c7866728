"""Two runs at once on one target (issue 13): every folder dsenv builds stays consistent.

Real processes started together or staggered; each test says how many rounds it runs.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hubserver import HubServer, bert_squad_repos
from tests.test_fetch import SECRET, hub_env

ROUNDS = 3


def start(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dsenv", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(child: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = child.communicate(timeout=timeout)
    assert "Traceback" not in out + err, out + err
    return child.returncode, out, err


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with HubServer(bert_squad_repos(tmp_path_factory.mktemp("hub-content"))) as server:
        yield server


@pytest.mark.parametrize("stagger", [0.0, 0.3, 1.0])
def test_two_fetches_into_one_cache_both_succeed_and_verify(hub, tmp_path, stagger):
    for round_ in range(ROUNDS):
        home = tmp_path / f"hf-{round_}"
        env = hub_env(home, hub.url)
        first = start("fetch", "bert-squad", env=env)
        time.sleep(stagger)
        second = start("fetch", "bert-squad", env=env)
        results = [finish(first, 120), finish(second, 120)]
        for code, out, err in results:
            assert code == 0, out + err
            assert SECRET not in out + err
        code, out, err = finish(start("fetch", "--verify", env=hub_env(home, "http://127.0.0.1:9")))
        assert code == 0, out + err
        leftovers = [p.name for p in home.rglob(".*tmp*")]
        assert leftovers == []
