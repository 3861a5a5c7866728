"""`dsenv provision` for a stack with no committed lock: its requirements are locked on the
site against the stack's index, the lock is kept in the environment and named by its
manifest, and `--lock` rebuilds the same environment from it. An index that does not answer
is one line with the fix, and nothing is written.

The index is a PEP 503 simple index served on 127.0.0.1 by this test, of the tiny wheels of
tests/provision/conftest.py; the stack is a test row (no torch): a few seconds in all.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dsenv.envs import stacks as stacks_table
from dsenv.envs.stacks import Stack
from dsenv.provision import plan as plan_module
from dsenv.provision import targets as provision_targets
from dsenv.provision.locks import lock_sha256, read_lock
from dsenv.provision.shown import logged_commands, not_carried_out, planned_commands
from tests.harness.cli import dsenv_in_process
from tests.harness.tinywheels import wheel_hash

CLOSED = "http://127.0.0.1:9/simple"  # the discard port: nothing listens there


class SimpleIndex:
    """A PEP 503 simple index of the wheels in a folder, on 127.0.0.1 (port 0): /simple/,
    /simple/<project>/ with sha256 fragments, /files/<wheel>. Records every request."""

    def __init__(self, wheels: Path):
        self.wheels = {p.name: p for p in wheels.glob("*.whl")}
        self.requests: list[tuple[str, str]] = []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

            def _answer(self, body: bool):
                index.requests.append((self.command, self.path))
                status, kind, content = index.page(self.path)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                if body:
                    self.wfile.write(content)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/simple"

    def projects(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for name in sorted(self.wheels):
            found.setdefault(name.split("-")[0].replace("_", "-").lower(), []).append(name)
        return found

    def sha256(self, wheel: str) -> str:
        return hashlib.sha256(self.wheels[wheel].read_bytes()).hexdigest()

    def page(self, path: str) -> tuple[int, str, bytes]:
        parts = [p for p in path.split("?")[0].split("/") if p]
        html = "text/html"
        if parts == ["simple"]:
            links = "".join(f'<a href="/simple/{p}/">{p}</a>\n' for p in self.projects())
            return 200, html, f"<html><body>\n{links}</body></html>\n".encode()
        if len(parts) == 2 and parts[0] == "simple" and parts[1] in self.projects():
            links = "".join(f'<a href="/files/{w}#sha256={self.sha256(w)}">{w}</a>\n'
                            for w in self.projects()[parts[1]])
            return 200, html, f"<html><body>\n{links}</body></html>\n".encode()
        if len(parts) == 2 and parts[0] == "files" and parts[1] in self.wheels:
            return 200, "application/octet-stream", self.wheels[parts[1]].read_bytes()
        return 404, "text/plain", b"not found\n"

    def __enter__(self) -> SimpleIndex:
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def tiny_stack(tmp_path, monkeypatch):
    """``tiny_stack(index_url)``: a CPU stack "tiny" served from ``index_url``, with no
    committed lock and the requirement dsenv-tiny-b==1.0 (which pulls dsenv-tiny-a)."""
    requirements = tmp_path / "requirements"
    requirements.mkdir()
    (requirements / "tiny.in").write_text("# stack tiny\ndsenv-tiny-b==1.0\n")
    monkeypatch.setattr(plan_module, "requirements_path",
                        lambda name: requirements / f"{name}.in")
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps at the terminal width
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")

    def make(index_url: str) -> Stack:
        stack = Stack("tiny", "cpu", "stable", "1.0", "", index_url, (), "tiny-no-such.txt", "",
                      ())
        assert not stack.lock_path.exists()
        table = {**stacks_table.load_stacks(), "tiny": stack}
        monkeypatch.setattr(stacks_table, "load_stacks", lambda: table)
        monkeypatch.setattr(provision_targets, "load_stacks", lambda: table)
        return stack

    return make


def provision(capsys, *args) -> tuple[int, str, str]:
    done = dsenv_in_process(capsys, "provision", "--arch", "cpu", "--stack", "tiny", "--ops",
                            "none", "--no-bytecode", *args)
    return done.returncode, done.stdout, done.stderr


def test_a_stack_without_a_lock_is_locked_on_site_and_rebuilt_from_it(
        tmp_path, tiny_wheels, tiny_stack, capsys):  # noqa: F811
    with SimpleIndex(tiny_wheels) as index:
        tiny_stack(index.url)
        first = tmp_path / "envs" / "first"
        code, out, err = provision(capsys, "--index-url", index.url, "--prefix", first)
        assert code == 0, out + err
        assert f"locked tiny.in on site against {index.url}" in out
        lock = first / "dsenv-lock.txt"
        text = lock.read_text()
        entries = {e.name: e for e in read_lock(text)}
        assert {n: e.version for n, e in entries.items()} == {"dsenv-tiny-a": "1.0",
                                                              "dsenv-tiny-b": "1.0"}
        for name, entry in entries.items():  # the hashes are those of the served wheels
            assert entry.hashes == (wheel_hash(tiny_wheels, name),)
        assert f"# Sources: index {index.url}" in text
        assert "# Regenerate: dsenv lock --stack tiny --out dsenv-lock.txt" in text
        manifest = json.loads((first / "dsenv-env.json").read_text())
        assert manifest["lock"]["path"] == str(lock)
        assert manifest["lock"]["sha256"] == lock_sha256(lock)
        assert manifest["lock"]["locked_on_site"]["requirements"] == "tiny.in"
        assert manifest["packages"] == {"dsenv-tiny-a": "1.0", "dsenv-tiny-b": "1.0"}
        assert ("HEAD", "/simple/") in index.requests  # asked whether it answers, first
        assert sorted(p.name for p in first.parent.iterdir()) == ["first"]  # no draft left

        # the same environment again, from the lock the first one keeps
        second = tmp_path / "envs" / "second"
        code, out, err = provision(capsys, "--lock", lock, "--index-url", index.url,
                                   "--prefix", second)
        assert code == 0, out + err
        assert "locked tiny.in on site" not in out
    again = json.loads((second / "dsenv-env.json").read_text())
    assert again["lock"]["path"] == str(lock) and "locked_on_site" not in again["lock"]
    assert again["lock"]["sha256"] == manifest["lock"]["sha256"]
    assert again["packages"] == manifest["packages"]
    assert not (second / "dsenv-lock.txt").exists()
    ran = subprocess.run([str(second / "bin" / "dsenv-tiny-a")], capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout.split() == ["tiny-a", "ok", str(second)]


def test_an_index_that_does_not_answer_is_one_line_with_the_fix(tmp_path, tiny_stack, capsys):
    tiny_stack(CLOSED)
    prefix = tmp_path / "envs" / "env"
    code, out, err = provision(capsys, "--index-url", CLOSED, "--prefix", prefix)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert re.fullmatch(
        r"dsenv provision: no lock is committed for stack tiny and its package index "
        r"http://127.0.0.1:9/simple cannot be reached from here \(Connection refused\) to lock "
        r"on site: run `dsenv lock --stack tiny --out FILE` where it is reachable and pass "
        r"--lock FILE, or give --index-url MIRROR",
        lines[0]), lines[0]
    assert not prefix.parent.exists()  # nothing written, not even the folder above


def test_the_dry_run_shows_the_site_lock_as_a_step_even_when_it_would_stop(
        tmp_path, tiny_stack, capsys):
    tiny_stack(CLOSED)
    prefix = tmp_path / "envs" / "env"
    code, out, err = provision(capsys, "--index-url", CLOSED, "--prefix", prefix, "--dry-run")
    # the real run stops while it plans: the dry run's plan is that one step, and it exits
    # as the real run does, with the same line
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    steps = out[out.index("steps: none: the real run stops while it plans:"):]
    assert "- lock on site against http://127.0.0.1:9/simple: STOPS THE REAL RUN HERE: no " \
           "lock is committed for stack tiny" in steps
    assert "uv pip compile" not in steps and "create the venv" not in steps
    assert f"{prefix}/dsenv-lock.txt" in out
    assert not prefix.parent.exists()
    real, _, real_err = provision(capsys, "--index-url", CLOSED, "--prefix", prefix)
    assert real == 2 and real_err == err
    assert steps.splitlines()[1].endswith(err.strip().removeprefix("dsenv provision: "))


def test_when_only_torchs_index_is_silent_the_fix_is_a_wheel_folder(
        tmp_path, tiny_wheels, tiny_stack, capsys):  # noqa: F811 (the fixture imported above)
    tiny_stack(CLOSED)  # the stack's own (torch's) index does not answer; PyPI's place does
    prefix = tmp_path / "envs" / "env"
    with SimpleIndex(tiny_wheels) as index:
        code, _out, err = provision(capsys, "--index-url", index.url, "--prefix", prefix)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"its package index {CLOSED} cannot be reached from here" in err
    assert err.strip().endswith("or give --find-links DIR with its torch wheel")
    assert not prefix.parent.exists()


def test_the_site_locking_run_logs_the_commands_its_dry_run_printed(
        tmp_path, tiny_wheels, tiny_stack, capsys):
    """The plan shown is the plan that runs (issue 21), with a lock made on site: the lock
    step's `uv pip compile`, then the venv and the sync of the lock the environment keeps
    (the run syncs its draft beside the prefix, logged where the plan names it)."""
    with SimpleIndex(tiny_wheels) as index:
        tiny_stack(index.url)
        prefix = tmp_path / "envs" / "env"
        code, out, err = provision(capsys, "--index-url", index.url, "--prefix", prefix,
                                   "--dry-run")
        assert code == 0, err
        planned = planned_commands(out)
        code, out, err = provision(capsys, "--index-url", index.url, "--prefix", prefix)
        assert code == 0, out + err
    assert [command.split(" && ")[-1].split()[:3] for command in planned] == [
        ["uv", "pip", "compile"], ["uv", "venv", str(prefix)], ["uv", "pip", "sync"]]
    assert planned[2].endswith(f" {prefix}/dsenv-lock.txt")
    logged = logged_commands((prefix / "dsenv-build.log").read_text())
    assert not_carried_out(planned, logged) == [] and logged == planned, (planned, logged)
