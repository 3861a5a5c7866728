import time

from dsenv import proc


def test_run_returns_output_and_code():
    result = proc.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=5)
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.ok and "exited 3: err" in result.describe()


def test_missing_command_is_reported_not_raised():
    result = proc.run(["dsenv-no-such-command"], timeout=5)
    assert result.not_found and result.returncode is None
    assert "not found" in result.describe()


def test_hung_command_and_its_children_are_killed_within_timeout():
    start = time.monotonic()
    # The shell's child keeps the pipes open: only killing the group lets us return.
    result = proc.run(["sh", "-c", "sleep 30 & sleep 30; wait"], timeout=0.5)
    elapsed = time.monotonic() - start
    assert result.timed_out and result.returncode is None
    assert elapsed < 3, elapsed
    assert "did not answer within" in result.describe()


def test_which_uses_the_given_path(tmp_path):
    exe = tmp_path / "mytool"
    exe.write_text("#!/bin/sh\necho hi\n")
    exe.chmod(0o755)
    assert proc.which("mytool", {"PATH": str(tmp_path)}) == str(exe)
    assert proc.which("mytool", {"PATH": "/nonexistent"}) is None
    assert proc.run(["mytool"], timeout=5, env={"PATH": str(tmp_path)}).stdout == "hi\n"


def test_output_file_receives_stdout_and_stderr_as_the_command_runs(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("earlier\n")
    result = proc.run(["sh", "-c", "echo out; echo err >&2; exit 2"], timeout=5, output=log)
    assert result.returncode == 2 and (result.stdout, result.stderr) == ("", "")
    assert log.read_text() == "earlier\nout\nerr\n"  # appended, in order
    hung = proc.run(["sh", "-c", "echo started; sleep 30"], timeout=0.5, output=log)
    assert hung.timed_out and log.read_text().endswith("started\n")
