"""The doctor's machinery: runner, renderers, exit codes, CLI options, redaction."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from dsenv.doctor import registry
from dsenv.doctor.context import Context, Options
from dsenv.doctor.registry import Check
from dsenv.doctor.render import exit_code, render_json, render_text
from dsenv.doctor.runner import run_checks
from dsenv.facts.host.mounts import NoAnswer
from dsenv.verdicts.findings import Result, Status, fail, ok, warn
from tests.harness.cli import dsenv

SCHEMA = json.loads((Path(registry.__file__).parent / "report_schema.json").read_text())


def _ctx(tmp_path, **options):
    return Context(options=Options(target="login", **options), env={"PATH": os.environ["PATH"]},
                   root=tmp_path)


def _boom(ctx):
    raise RuntimeError("probe exploded")


def test_a_raising_check_becomes_an_error_result(tmp_path):
    results = run_checks([Check("system.boom", "Boom", _boom),
                          Check("system.fine", "Fine", lambda ctx: ok("fine"))], _ctx(tmp_path))
    assert [r.status for r in results] == [Status.ERROR, Status.OK]
    assert "RuntimeError: probe exploded" in results[0].summary
    assert "Traceback" in results[0].traceback
    assert exit_code(results) == 1


def test_a_stalled_check_is_cut_off(tmp_path):
    ctx = _ctx(tmp_path, probe_timeout=0.2)
    start = time.monotonic()
    results = run_checks([Check("system.stuck", "Stuck", lambda c: time.sleep(30))], ctx)
    assert time.monotonic() - start < 2
    assert results[0].status is Status.ERROR and "did not finish" in results[0].summary


def _unanswered(ctx):
    raise NoAnswer("the environment's packages in", "/lustre/env/lib/python3.11/site-packages")


def test_facts_on_files_that_gave_no_answer_are_not_judged(tmp_path):
    """A fact whose files gave no answer (mounts.NoAnswer, raised to every check that asks for
    it) is a warning that names the folder and says nothing was judged: not an error with a
    traceback, not a pass; its twin, a check that reads nothing there, is judged as usual."""
    results = run_checks([Check("python.x", "X", _unanswered),
                          Check("system.fine", "Fine", lambda ctx: ok("fine"))],
                         _ctx(tmp_path, probe_timeout=4))
    assert [r.status for r in results] == [Status.WARN, Status.OK]
    assert results[0].summary.startswith(
        "not judged: the environment's packages in /lustre/env/lib/python3.11/site-packages "
        "gave no answer to a stat within 4 s"), results[0].summary
    assert "lfs check servers" in results[0].fix and results[0].traceback is None


def test_a_check_that_returns_garbage_is_an_error(tmp_path):
    results = run_checks([Check("system.bad", "Bad", lambda c: "ok")], _ctx(tmp_path))
    assert results[0].status is Status.ERROR and "not a Finding" in results[0].summary


def test_checks_run_in_parallel(tmp_path):
    checks = [Check(f"system.sleep{i}", "Sleep", lambda c: (time.sleep(0.5), ok("slept"))[1])
              for i in range(6)]
    start = time.monotonic()
    results = run_checks(checks, _ctx(tmp_path))
    assert all(r.status is Status.OK for r in results)
    assert time.monotonic() - start < 1.5


def test_probe_memo_runs_once_across_threads(tmp_path):
    ctx = _ctx(tmp_path)
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.3)
        return 42

    checks = [Check(f"system.m{i}", "M", lambda c: ok(str(c.memo("k", slow)))) for i in range(5)]
    results = run_checks(checks, ctx)
    assert {r.summary for r in results} == {"42"} and len(calls) == 1


def _results():
    return [
        Result("system.a", "system", "A thing", Status.OK, "fine"),
        Result("gpu.b", "gpu", "B thing", Status.WARN, "meh", ["seen: x"], "do y"),
        Result("mpi.c", "mpi", "C thing", Status.FAIL, "broken", ["seen: z"], "run w"),
        Result("cache.d", "cache", "D thing", Status.SKIP, "no --for given"),
    ]


def test_exit_codes_and_strict():
    results = _results()
    assert exit_code(results) == 1
    assert exit_code(results[:2]) == 0
    assert exit_code(results[:2], strict=True) == 1
    assert exit_code([results[0], results[3]], strict=True) == 0


def test_text_report_groups_areas_and_lists_findings_with_fixes(tmp_path):
    text = render_text(_results(), _ctx(tmp_path), color=False)
    table, findings = text.split("\nFindings\n")
    # After the header block, one block per area in the areas' order: its name, then the
    # rows of its own results only, each with its mark, title and summary.
    blocks = [block.splitlines() for block in table.strip("\n").split("\n\n")[1:]]
    rows = {block[0]: [" ".join(row.split()) for row in block[1:]] for block in blocks}
    assert list(rows) == ["system", "gpu", "mpi", "cache"], table
    assert rows == {"system": ["✓ A thing fine"], "gpu": ["! B thing meh"],
                    "mpi": ["✗ C thing broken"], "cache": ["– D thing no --for given"]}, table
    # Every warning and failure is a finding with its evidence and its own fix, in the
    # table's order; the skipped result stays in the table only; then the counts and the
    # verdict, which also opens the report.
    assert findings.strip("\n").split("\n\n") == [
        "! gpu.b  B thing\n    meh\n    seen: x\n    fix: do y",
        "✗ mpi.c  C thing\n    broken\n    seen: z\n    fix: run w",
        "1 ok, 1 warning, 1 failure, 1 skipped\nnot ready: 1 failure, 1 warning",
    ], findings
    assert text.splitlines()[0] == "not ready: 1 failure, 1 warning"


def test_json_report_follows_the_schema(tmp_path):
    data = json.loads(render_json(_results(), _ctx(tmp_path)))
    jsonschema.validate(data, SCHEMA)
    assert data["summary"]["fail"] == 1 and data["exit_code"] == 1
    assert [r["id"] for r in data["results"]] == ["system.a", "gpu.b", "mpi.c", "cache.d"]


def test_reports_redact_secrets(tmp_path):
    ctx = Context(options=Options(target="login"), env={"HF_TOKEN": "hf_verysecret"}, root=tmp_path)
    leaky = [Result("system.x", "system", "X", Status.FAIL, "saw hf_verysecret", ["HF_TOKEN=hf_verysecret"],
                    "unset hf_verysecret")]
    assert "hf_verysecret" not in render_text(leaky, ctx, color=False)
    assert "hf_verysecret" not in render_json(leaky, ctx)


def test_finding_constructors_carry_fix():
    assert warn("s", "f", "e1").fix == "f" and fail("s", "f").status is Status.FAIL


def test_unknown_area_cannot_register():
    with pytest.raises(ValueError):
        registry.check("nosucharea.x", "X")


def test_every_check_id_is_stable_and_well_formed():
    ids = [c.id for c in registry.all_checks()]
    assert len(ids) == len(set(ids))
    pattern = SCHEMA["properties"]["results"]["items"]["properties"]["id"]["pattern"]
    import re

    assert all(re.match(pattern, i) for i in ids), ids


# -- the command line, as a user runs it --------------------------------------------------

def test_help_lists_every_subcommand_and_imports_nothing_heavy():
    code = ("import sys, runpy; sys.argv=['dsenv','--help']\n"
            "try:\n runpy.run_module('dsenv', run_name='__main__')\n"
            "except SystemExit: pass\n"
            "heavy=[m for m in ('torch','deepspeed','transformers','datasets',"
            "'dsenv.doctor.checks','dsenv.doctor.explain.command') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    for sub in ("doctor", "provision", "smoke", "run", "fetch", "launch"):
        assert sub in out.stdout
    assert "HEAVY []" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["--only", "gpu,nosuch"], "unknown area nosuch"),
    (["--skip", "gpu.nosuch"], "unknown check id gpu.nosuch"),
    (["--deepspeed-config", "/nonexistent/ds.json"], "is not a file"),
    (["--for", "no-such-workload"], "unknown workload"),
    (["--nodes", "0"], "must be 1 or more"),
    (["--gpus-per-node", "-1"], "must be 0 or more"),
    (["--gpus-per-node", "two"], "is not a whole number"),
])
def test_usage_errors_exit_2_with_one_line(args, message):
    out = dsenv("doctor", *args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert out.stdout == ""


def test_doctor_json_on_this_machine_is_valid_and_keeps_secrets(tmp_path):
    out = dsenv("doctor", "--json", env={"HF_TOKEN": "some-secret-value",
                                        "MY_API_KEY": "another-secret",
                                        "DB_PASSWORD": "pw-secret-123"})
    assert out.returncode in (0, 1), out.stderr
    for secret in ("some-secret-value", "another-secret", "pw-secret-123"):
        assert secret not in out.stdout and secret not in out.stderr
    data = json.loads(out.stdout)
    jsonschema.validate(data, SCHEMA)
    assert data["exit_code"] == out.returncode
    assert {r["area"] for r in data["results"]} >= {"system"}


def test_only_and_skip_select_checks():
    out = dsenv("doctor", "--json", "--only", "system", "--skip", "system.cpu")
    ids = [r["id"] for r in json.loads(out.stdout)["results"]]
    assert ids and all(i.startswith("system.") for i in ids) and "system.cpu" not in ids


def test_strict_turns_a_warning_into_exit_1(tmp_path):
    # A recorded root whose CPU lacks AVX2: a warning, and nothing fails.
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(
        "processor\t: 0\nmodel name\t: Old Xeon\nflags\t\t: fpu sse sse2 avx\n")
    (tmp_path / "dev" / "shm").mkdir(parents=True)
    args = ("doctor", "--json", "--only", "system", "--root", str(tmp_path))
    relaxed, strict = dsenv(*args), dsenv(*args, "--strict")
    statuses = {r["id"]: r["status"] for r in json.loads(relaxed.stdout)["results"]}
    assert statuses["system.cpu"] == "warn" and "fail" not in statuses.values()
    assert relaxed.returncode == 0 and strict.returncode == 1
    # The report says what the exit code says.
    assert json.loads(relaxed.stdout)["verdict"]["ready"] is True
    assert json.loads(strict.stdout)["exit_code"] == 0  # schema 1: --strict not applied
    assert json.loads(strict.stdout)["verdict"]["ready"] is False
    screen = dsenv(*(a for a in args if a != "--json"), "--strict")
    assert screen.returncode == 1
    first = screen.stdout.splitlines()[0]
    assert first.startswith("not ready (--strict: warnings count as failures): 0 failures")
    assert screen.stdout.rstrip().splitlines()[-1] == first


@pytest.mark.parametrize("env, device, expected", [
    ({}, None, "login"),
    ({"SLURM_JOB_ID": "77"}, None, "compute"),
    ({}, "dev/nvidia0", "compute"),
    ({}, "dev/kfd", "compute"),
    ({}, "dev/nvidiactl", "login"),  # the control node alone is no GPU
])
def test_auto_target(tmp_path, env, device, expected):
    if device:
        (tmp_path / device).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / device).write_text("")
    ctx = Context(options=Options(target="auto"), env=env, root=tmp_path)
    assert ctx.target == expected, ctx.target_reason


def test_explicit_target_wins(tmp_path):
    ctx = Context(options=Options(target="login"), env={"SLURM_JOB_ID": "1"}, root=tmp_path)
    assert ctx.target == "login"
