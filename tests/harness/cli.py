"""The one dsenv runner of the tests: ``python -m dsenv ARGS`` as a user runs it.

    done = dsenv("provision", "--arch", "cpu", "--dry-run", env={"COLUMNS": "200"})
    assert done.returncode == 0, explain(done)

- :func:`dsenv` runs the CLI in a subprocess of its own session and returns a
  ``subprocess.CompletedProcess`` (``returncode``, ``stdout``, ``stderr``). Past ``timeout``
  the whole process group is killed and the test fails with the output so far; a traceback on
  stderr fails the test (``traceback_ok=True`` for the few that look for one).
- The environment: ``base`` (this process's environment when None), less every variable that
  starts with one of ``drop``, updated with ``env``. ``env`` alone overlays os.environ;
  ``base=`` gives the exact environment (``base={}`` an empty one).
- ``python``/``module``/``wrapper`` say how it starts: another interpreter, another entry
  module (``dsenv.workloads.cli``), under a wrapper (:func:`sourced`: after a shell sourced
  an activate script).
- :func:`start_dsenv` is the same command left running (tests of concurrent runs), and
  :func:`finish` waits for it;
  :func:`dsenv_in_process` calls ``dsenv.cli.main`` in this process, for tests that
  monkeypatch what the command sees.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence

import pytest

Env = Mapping[str, str]


def environment(env: Env | None = None, *, base: Env | None = None,
                drop: Iterable[str] = ()) -> dict[str, str]:
    """``base`` (os.environ when None) without the variables starting with any of ``drop``,
    updated with ``env``."""
    drop = tuple(drop)
    full = {k: v for k, v in (os.environ if base is None else base).items()
            if not (drop and k.startswith(drop))}
    full.update(env or {})
    return full


def command(*args, python: str | os.PathLike = sys.executable, module: str = "dsenv",
            wrapper: Sequence[str] = ()) -> list[str]:
    """``[*wrapper, python, -m, module, *args]``, every item a string."""
    return [*map(str, wrapper), str(python), "-m", module, *map(str, args)]


def sourced(script: str | os.PathLike) -> list[str]:
    """A ``wrapper``: a shell sources ``script`` (an activate script), then runs the command,
    as a job script does."""
    return ["sh", "-c", '. "$0" && exec "$@"', str(script)]


def run(argv: Sequence, *, env: Env | None = None, cwd=None, timeout: float = 300,
        input: str | None = None, stdin=None, preexec_fn=None) -> subprocess.CompletedProcess:
    """``argv`` in a session of its own (stdin /dev/null unless ``input`` or ``stdin``); past
    ``timeout`` its whole process group is killed and the test fails with its output."""
    argv = [str(a) for a in argv]
    if stdin is None:
        stdin = subprocess.PIPE if input is not None else subprocess.DEVNULL
    child = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, errors="replace", env=None if env is None else dict(env),
                             cwd=cwd, preexec_fn=preexec_fn, start_new_session=True)
    try:
        out, err = child.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(child)
        try:
            out, err = child.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            out, err = "", ""
        pytest.fail(f"timed out after {timeout} s (process group killed): {' '.join(argv)}\n"
                    f"stdout:\n{(out or '')[-3000:]}\nstderr:\n{(err or '')[-3000:]}")
    return subprocess.CompletedProcess(argv, child.returncode, out, err)


def dsenv(*args, env: Env | None = None, base: Env | None = None, drop: Iterable[str] = (),
          cwd=None, timeout: float = 300, python: str | os.PathLike = sys.executable,
          module: str = "dsenv", wrapper: Sequence[str] = (), input: str | None = None,
          stdin=None, preexec_fn=None, traceback_ok: bool = False) -> subprocess.CompletedProcess:
    """``python -m dsenv ARGS`` (see the module's docstring); a traceback fails the test."""
    done = run(command(*args, python=python, module=module, wrapper=wrapper),
               env=environment(env, base=base, drop=drop), cwd=cwd, timeout=timeout,
               input=input, stdin=stdin, preexec_fn=preexec_fn)
    if not traceback_ok:
        assert "Traceback" not in done.stderr, explain(done)
    return done


def start_dsenv(*args, env: Env | None = None, base: Env | None = None,
                drop: Iterable[str] = (), cwd=None, python: str | os.PathLike = sys.executable,
                module: str = "dsenv", wrapper: Sequence[str] = (),
                **popen) -> subprocess.Popen:
    """:func:`dsenv` left running, in a session of its own: the Popen (text, stdout and stderr
    piped unless ``popen`` says otherwise), for :func:`finish`."""
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True,
             "stdin": subprocess.DEVNULL, "start_new_session": True, **popen}
    return subprocess.Popen(command(*args, python=python, module=module, wrapper=wrapper),
                            env=environment(env, base=base, drop=drop), cwd=cwd, **popen)


def finish(child: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    """Wait for a :func:`start_dsenv` child: (returncode, stdout, stderr); past ``timeout``
    its process group is killed and the test fails; a traceback in its output fails it."""
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(child)
        out, err = child.communicate(timeout=5)
        pytest.fail(f"timed out after {timeout} s (process group killed): "
                    f"{' '.join(map(str, child.args))}\nstdout:\n{(out or '')[-3000:]}\n"
                    f"stderr:\n{(err or '')[-3000:]}")
    assert "Traceback" not in out + err, out + err
    return child.returncode, out, err


def dsenv_in_process(capsys: pytest.CaptureFixture, *args, cwd: str | os.PathLike | None = None,
                     ) -> subprocess.CompletedProcess:
    """``dsenv.cli.main(ARGS)`` in this process (in ``cwd`` if given), what it printed read
    from ``capsys``; pytest-timeout's limit is its timeout."""
    from dsenv.cli import main

    argv = [str(a) for a in args]
    here = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        code = main(argv)
    finally:
        os.chdir(here)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["dsenv", *argv], code, out.out, out.err)


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        child.kill()


def explain(done) -> str:
    """How a run ended, for an assertion message: its code and the tails of its output."""
    return f"rc {done.returncode}\nstdout:\n{done.stdout[-4000:]}\nstderr:\n" \
           f"{done.stderr[-4000:]}"


def one_line(done: subprocess.CompletedProcess, prefix: str) -> str:
    """Exit 2 and exactly one stderr line starting with ``prefix``; the rest of that line."""
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(prefix), lines[0]
    return lines[0].removeprefix(prefix)

