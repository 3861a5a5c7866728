"""The per-target lock (dsenv/targetlock.py) and staged folders under it, with real
processes: a holder in another process, killed with SIGKILL, waited for, refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dsenv import targetlock
from dsenv.staging import staged_dir

HOLDER = textwrap.dedent("""
    import sys, time
    from dsenv import targetlock
    from dsenv.staging import staged_dir
    target, seconds, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    with targetlock.hold(target, "dsenv test-holder"):
        if mode == "stage":
            with staged_dir(target) as tmp:
                (tmp / "made-by").write_text("holder")
                print("ready", tmp, flush=True)
                time.sleep(seconds)
        else:
            print("ready", flush=True)
            time.sleep(seconds)
""")


def start_holder(target: Path, seconds: float, mode: str = "plain") -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(target), str(seconds), mode],
                             stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    assert line.startswith("ready"), line
    child.ready_line = line
    return child


def stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.kill()
    child.wait(timeout=10)


SLOW_WRITER = textwrap.dedent("""
    import sys, time
    from dsenv import targetlock
    lock = targetlock.TargetLock(sys.argv[1], "dsenv slow-writer")
    write = lock._write_owner
    def late():  # the window between taking the lock and saying who holds it, made long
        print("locked", flush=True)
        time.sleep(float(sys.argv[2]))
        write()
    lock._write_owner = late
    lock.acquire(wait=0)
    time.sleep(30)
""")


def test_a_run_that_finds_the_lock_before_its_owner_is_written_still_names_the_owner(tmp_path):
    """The holder has the lock and has not written who it is yet: the second run asks again
    (a grace of OWNER_GRACE_SECONDS) and names the holder, in the refusal and in the waiting
    line; without the grace it said "another dsenv run" (the fourth CI run's
    test_two_dsenv_lock_runs_writing_one_lock_file_take_turns)."""
    target = tmp_path / "env"
    for attempt, wait in enumerate((0, 5)):
        child = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(target), "0.6"],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "locked"
            waited = []
            with pytest.raises(targetlock.TargetBusy) as error:
                targetlock.TargetLock(target, "dsenv provision").acquire(
                    wait=wait, on_wait=waited.append)
            assert f"pid {child.pid}" in str(error.value), (attempt, str(error.value))
            if wait:
                assert waited and waited[0] is not None and waited[0].pid == child.pid
        finally:
            stop(child)


def test_a_second_run_refuses_at_once_naming_the_holder(tmp_path):
    target = tmp_path / "env"
    child = start_holder(target, 30)
    try:
        assert targetlock.is_held(target)
        started = time.monotonic()
        with pytest.raises(targetlock.TargetBusy) as error:
            targetlock.TargetLock(target, "dsenv provision").acquire(wait=0)
        assert time.monotonic() - started < 2
        message = str(error.value)
        assert f"pid {child.pid}" in message and "dsenv test-holder" in message
        assert "--no-wait" in message and "\n" not in message
        assert error.value.exit_code == 75
    finally:
        stop(child)


def test_a_waiting_run_says_whom_it_waits_for_and_gets_the_lock_when_the_holder_ends(tmp_path):
    target = tmp_path / "env"
    child = start_holder(target, 1.5)
    told = []
    try:
        lock = targetlock.TargetLock(target, "dsenv provision")
        started = time.monotonic()
        lock.acquire(wait=30, on_wait=told.append)
        waited = time.monotonic() - started
        assert lock.held and 0.5 < waited < 10
        assert len(told) == 1 and told[0].pid == child.pid
        assert targetlock.read_owner(target).pid == os.getpid()
        lock.release()
        assert not targetlock.is_held(target)
    finally:
        stop(child)


def test_a_wait_limit_ends_with_one_line_after_the_limit(tmp_path):
    target = tmp_path / "env"
    child = start_holder(target, 30)
    try:
        started = time.monotonic()
        with pytest.raises(targetlock.TargetBusy, match="after waiting 1 s"):
            targetlock.TargetLock(target, "dsenv provision").acquire(wait=1)
        assert 0.9 < time.monotonic() - started < 5
    finally:
        stop(child)


def test_sigkill_of_the_holder_frees_the_lock_at_once(tmp_path):
    target = tmp_path / "env"
    child = start_holder(target, 60)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    started = time.monotonic()
    with targetlock.hold(target, "dsenv provision", wait=0):
        assert time.monotonic() - started < 1


def test_staging_refuses_while_a_live_run_builds_and_never_touches_its_folder(tmp_path):
    target = tmp_path / "env"
    child = start_holder(target, 30, mode="stage")
    live_tmp = Path(child.ready_line.split()[1])
    try:
        with pytest.raises(targetlock.TargetBusy), staged_dir(target, wait=0):
            pass
        assert (live_tmp / "made-by").read_text() == "holder"
        assert not target.exists()
    finally:
        stop(child)


def test_staging_clears_what_a_killed_run_left_and_builds(tmp_path):
    target = tmp_path / "env"
    child = start_holder(target, 60, mode="stage")
    dead_tmp = Path(child.ready_line.split()[1])
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    assert dead_tmp.exists()
    with staged_dir(target) as tmp:
        (tmp / "made-by").write_text("second")
    assert not dead_tmp.exists()
    assert (target / "made-by").read_text() == "second"
    assert not targetlock.is_held(target)


def test_a_holder_staging_inside_its_own_lock_is_not_refused(tmp_path):
    target = tmp_path / "env"
    with targetlock.hold(target, "dsenv provision", wait=0):
        with staged_dir(target) as tmp:
            (tmp / "x").write_text("1")
        assert targetlock.held_here(target)
    assert (target / "x").read_text() == "1"
    assert not targetlock.held_here(target)
