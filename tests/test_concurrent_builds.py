"""Two runs at once on one target (issue 13): every folder dsenv builds stays consistent.

Real processes started together or staggered; each test says how many rounds it runs.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness.cli import finish, start_dsenv
from tests.harness.hubserver import SECRET, HubServer, bert_squad_repos, hub_env

ROUNDS = 3


def start(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    """``python -m dsenv ARGS`` left running, with exactly ``env`` (this process's if None)."""
    return start_dsenv(*args, base=env, cwd=cwd)


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


def test_two_launches_writing_one_script_leave_a_whole_one(tmp_path):
    """`dsenv launch --out` writes through a temporary file and a rename: two at once leave
    one complete script (the last rename wins whole), never half of each."""
    out = tmp_path / "jobs" / "bert-squad.sbatch"
    for round_ in range(ROUNDS):
        children = [start("launch", "bert-squad", "--nodes", "2", "--gpus-per-node", "4",
                          "--launcher", launcher, "--out", str(out), cwd=tmp_path)
                    for launcher in ("srun", "torchrun")]
        results = [finish(child, 120) for child in children]
        assert [code for code, _, _ in results] == [0, 0], results
        text = out.read_text()
        assert text.startswith("#!") and text.count("#SBATCH --nodes=2") == 1, round_
        syntax = subprocess.run(["bash", "-n", str(out)], capture_output=True, text=True,
                                timeout=30)
        assert syntax.returncode == 0, syntax.stderr
        assert sorted(p.name for p in out.parent.iterdir()) == ["bert-squad.sbatch"]


@pytest.mark.slow
def test_a_second_smoke_into_a_busy_output_folder_refuses_in_one_line(tmp_path, run_env,
                                                                      no_references):
    out = tmp_path / "runs" / "mrpc"
    command = ["smoke", "bert-mrpc", "--output-dir", str(out),
               "--references", no_references]
    first = start(*command, env=run_env)
    lock = out.with_name(".mrpc.lock")
    deadline = time.monotonic() + 120
    while not lock.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.1)
    assert lock.exists(), "the first smoke never claimed its output folder"
    began = time.monotonic()
    code, out2, err = finish(start(*command, env={**run_env, "MASTER_PORT": "0"}), 120)
    assert code == 75, out2 + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        f"dsenv smoke bert-mrpc: {out} is in use by dsenv smoke bert-mrpc (pid {first.pid} on "), err
    assert lines[0].endswith("wait for it to finish, or pass another --output-dir")
    assert time.monotonic() - began < 90
    code, out1, err1 = finish(first, 300)
    assert code == 0, out1 + err1
    assert json.loads((out / "report.json").read_text())["status"] == "PASS"
    assert not lock.exists()
