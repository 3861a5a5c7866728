"""README's quoted outputs are what the code prints here, and its lists are the code's.

Each block README marks with ``<!-- screen: COMMAND -->`` (the doctor screens, the JSON
report's head, a provision dry run, the bert-squad smoke's report) is run again on this
machine as a new user would (tests/harness/readme_screens.py) and compared with README's
block, both masked the same way (durations, versions and decimals, paths, host, CPU model);
a difference fails with a diff and the one command that rewrites README. Beside them: the
doctor's areas README lists are doctor/registry.py's AREAS, the committed locks it names are
the files in envs/locks/, and its suite time and counts are the last CI run's
(.ci/last-run.json, written by .ci/run).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsenv.doctor.registry import AREAS
from tests.harness import readme_screens as rs

ROOT = Path(__file__).resolve().parents[1]
TEXT = rs.README.read_text()
SCREENS = rs.screens(TEXT)

# Blocks that quote a command's output and are not run here, each with the reason.
NOT_RUN = {
    "$ dsenv doctor --distributed": "a composite: a healthy sweep, then a rank that hangs "
                                    "(tests/test_doctor_distributed*.py run both)",
    "$ dsenv provision --arch cpu --ops cpu_adam --prefix": "a real build (~3 min); its "
                                                            "--dry-run is quoted and run",
}


def _shown_command(screen: rs.Screen) -> str:
    """The prompt as README shows it, as one command (continuations joined, comment off)."""
    joined = " ".join(line.rstrip().rstrip("\\") for line in screen.prompt)
    return " ".join(re.sub(r"\s#\s.*$", "", joined.removeprefix("$ ")).split())


def test_every_quoted_doctor_smoke_and_dry_run_screen_is_marked():
    marked = {s.start for s in SCREENS}
    lines = TEXT.splitlines()
    unmarked = []
    for i, line in enumerate(lines):
        if line.startswith("```") and i + 1 < len(lines):
            first = lines[i + 1]
            quoted = re.match(r"\$ (dsenv doctor|dsenv smoke bert-squad|dsenv provision .*"
                              r"--dry-run)", first)
            if quoted and i + 1 not in marked \
                    and not any(first.startswith(p) for p in NOT_RUN):
                unmarked.append(f"README.md:{i + 2}: {first}")
    assert not unmarked, ("quoted screens without a `<!-- screen: COMMAND -->` line above "
                          "their fence:\n" + "\n".join(unmarked))
    assert len(SCREENS) >= 6


def test_at_most_one_smoke_is_run():
    assert sum("dsenv smoke" in s.command for s in SCREENS) <= 1


@pytest.mark.parametrize("screen", SCREENS, ids=lambda s: s.command[:60])
def test_the_prompt_readme_shows_is_the_command_run(screen):
    assert _shown_command(screen) == " ".join(screen.command.split()), (
        f"README.md:{screen.marker_line}: the marker runs `{screen.command}`, the block shows "
        f"`{_shown_command(screen)}`")


# a smoke trains (15-60 s here): marked slow, as the suite's other DeepSpeed engines
RUN = [pytest.param(s, marks=[pytest.mark.slow] if "dsenv smoke" in s.command else [])
       for s in SCREENS]


@pytest.mark.parametrize("screen", RUN, ids=lambda s: s.command[:60])
def test_readme_quotes_what_the_command_prints_here(screen):
    code, fresh = rs.run_screen(screen.command, timeout=240)
    assert "Traceback (most recent call last)" not in fresh, fresh[-3000:]
    problem = rs.compare(screen, fresh)
    assert problem is None, problem


# --- the comparison itself, on made-up screens -------------------------------------------

DOCTOR = """\
ready to submit: 0 failures, 2 warnings
dsenv doctor 0.1.0 — target login (no Slurm allocation and no GPU device nodes)

system
✓  Operating system     Debian GNU/Linux 12 (bookworm), kernel 6.18.44-fc-v657,
                        x86_64, glibc 2.36
✓  CPU and SIMD flags   Intel(R) Xeon(R) Processor, 2 logical CPUs, AVX-512
✓  Memory               23.5 GiB total, 23.1 GiB available
!  DeepSpeed ops        JIT cache /root/.cache/torch_extensions (~90 s)

16 ok, 10 info, 2 warnings, 20 skipped
ready to submit: 0 failures, 2 warnings"""


def _screen(block: str) -> rs.Screen:
    text = f"<!-- screen: dsenv doctor -->\n```text\n$ dsenv doctor\n{block}\n```\n"
    (screen,) = rs.screens(text)
    return screen


def test_what_varies_is_masked_and_wrapping_is_not_compared():
    fresh = (DOCTOR.replace("6.18.44-fc-v657,\n                        x86_64",
                            "6.18.44-fc-v669, x86_64")
             .replace("Intel(R) Xeon(R) Processor", "AMD EPYC")
             .replace("23.1 GiB", "9.8 GiB").replace("/root/.cache", "/home/u/.cache")
             .replace("~90 s", "~120 s"))
    assert rs.compare(_screen(DOCTOR), fresh) is None


@pytest.mark.parametrize("old, new", [
    ("ready to submit: 0 failures, 2 warnings\ndsenv", "not ready: 1 failure, 2 warnings\ndsenv"),
    ("16 ok, 10 info, 2 warnings, 20 skipped", "22 ok, 10 info, 2 warnings, 35 skipped"),
    ("2 logical CPUs", "4 logical CPUs"),
    ("!  DeepSpeed ops", "✓  DeepSpeed ops"),
])
def test_a_changed_verdict_count_or_text_fails_with_a_diff(old, new):
    problem = rs.compare(_screen(DOCTOR), DOCTOR.replace(old, new))
    assert problem is not None and rs.REGENERATE in problem
    assert "--- README.md (masked)" in problem
    added = [line for line in problem.splitlines() if line.startswith("+")]
    assert any(rs.masked(new.split("\n")[0]) in line for line in added), problem


def test_elided_lines_match_any_run_of_lines_in_order():
    lines = DOCTOR.splitlines()
    elided = "\n".join([lines[0], "...", *lines[4:6], "...", lines[-1]])
    assert rs.compare(_screen(elided), DOCTOR) is None
    swapped = "\n".join([lines[0], "...", lines[-2], "...", *lines[4:6], "...", lines[-1]])
    assert rs.compare(_screen(swapped), DOCTOR) is not None
    # without a leading `...`, the block starts where the output starts
    assert rs.compare(_screen("\n".join(lines[1:])), DOCTOR) is not None


def test_write_keeps_the_prompt_and_the_elisions():
    lines = DOCTOR.splitlines()
    screen = _screen("\n".join([lines[0], "...", lines[4], lines[5], "...", lines[-1]]))
    fresh = DOCTOR.replace("kernel 6.18.44-fc-v657", "kernel 6.19.1")
    placed = rs.placed(screen, fresh)
    assert placed == [lines[0], "...", fresh.splitlines()[4], lines[5], "...", lines[-1]]


def test_a_busy_smoke_is_compared_without_its_performance_row():
    readme = ("╭─ dsenv smoke bert-squad: PASS ─╮\n│ performance    PASS 995.7 samples/s >= 225.0"
              " │\n│ model          /tmp/m/model │\n╰─╯")
    busy = ("╭─ dsenv smoke bert-squad: INCONCLUSIVE ─╮\n│ performance    INCONCLUSIVE 19.2 "
            "samples/s; the node was busy │\n│ model          /tmp/x/model │\n╰─╯")
    screen = _screen(readme)
    assert rs.compare(screen, busy) is None
    assert rs.compare(screen, busy.replace("bert-squad: INCONCLUSIVE", "bert-squad: FAIL")
                      .replace("performance    INCONCLUSIVE", "performance    FAIL")) is not None


def test_a_cpu_without_a_reference_is_compared_without_its_performance_row():
    """CI ran on another CPU model than README's: no reference row, so the verdict is
    REPORTED (fresh-clone CI of 2026-11-28). Any other difference still counts."""
    readme = ("╭─ dsenv smoke bert-squad: PASS ─╮\n│ performance    PASS 995.7 samples/s >= 225.0"
              " │\n│ model          /tmp/m/model │\n╰─╯")
    other_cpu = ("╭─ dsenv smoke bert-squad: PASS ─╮\n│ performance    REPORTED 812.4 samples/s "
                 "(812.4 per device); no reference for │\n│                'cpu:Intel(R) Xeon(R) "
                 "Processor' (world size 1, preset fp32): │\n│                reported only │\n"
                 "│ model          /tmp/x/model │\n╰─╯")
    screen = _screen(readme)
    assert rs.compare(screen, other_cpu) is None
    # wrapped elsewhere, as the next CI's CPU model name wrapped it
    rewrapped = other_cpu.replace("no reference for │\n│                'cpu:",
                                  "no reference │\n│                for 'cpu:")
    assert rewrapped != other_cpu and rs.compare(screen, rewrapped) is None
    assert rs.compare(screen, other_cpu.replace("bert-squad: PASS", "bert-squad: FAIL")) \
        is not None
    reported = other_cpu.replace("; no reference for", "; reported at the user's request")
    assert rs.compare(screen, reported) is not None


def test_a_rate_that_happens_to_be_whole_still_matches():
    """CI printed `= 50 GFLOP/s` where README had `= 7.55 GFLOP/s` (3 significant digits);
    a rate's unit is what is compared, and another unit is not."""
    screen = _screen("│ efficiency     (32 MFLOP/sample x 235.6/s = 7.55 GFLOP/s per device) │")
    assert rs.compare(screen, "│ efficiency     (32 MFLOP/sample x 1562.5/s = 50 GFLOP/s per "
                              "device) │") is None
    assert rs.compare(screen, "│ efficiency     (32 MFLOP/sample x 1562.5/s = 50 TB/s per "
                              "device) │") is not None


# --- README's lists are the code's ---------------------------------------------------------

def test_readme_lists_the_doctors_areas_in_the_registrys_order():
    m = re.search(r"Checks are grouped by area — ([^.]+)\.", TEXT)
    assert m, "README lost its sentence 'Checks are grouped by area — ...'"
    listed = [item.split()[0] for item in " ".join(m.group(1).split()).split(", ")]
    assert tuple(listed) == AREAS
    table = TEXT.split("### What it judges", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert tuple(rows) == AREAS


def test_readme_names_the_committed_locks():
    m = re.search(r"The ([\w., ]+?) locks are committed", " ".join(TEXT.split()))
    assert m, "README lost its sentence 'The ... locks are committed'"
    named = set(re.split(r",\s*|\s+and\s+", m.group(1)))
    committed = {p.stem for p in (ROOT / "envs" / "locks").glob("*.txt")}
    assert named == committed


def test_readme_states_the_last_ci_runs_time_and_counts():
    stated = rs.stated_suite(TEXT)
    assert stated, ("README must say once 'the whole suite takes ~N min on this project's "
                    "2-core machine (the last CI run, `.ci/last-run.json`: P passed, S skipped, "
                    "T s of tests)'")
    recorded = rs.recorded_suite()
    if recorded is None:
        pytest.skip(f"no CI run recorded on this machine ({rs.RECORD} is written by .ci/run)")
    assert stated == recorded, (f"README states {stated}, the last CI run recorded {recorded}; "
                                f"regenerate: {rs.REGENERATE}")


def _ci_record():
    import importlib.util
    spec = importlib.util.spec_from_file_location("ci_record", ROOT / ".ci" / "record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ci_run_records_the_test_commands_counts_and_seconds_when_it_passed(tmp_path,
                                                                            monkeypatch):
    record = _ci_record()
    monkeypatch.setattr(record, "RECORD", tmp_path / "last-run.json")
    log = tmp_path / "log"
    log.write_text("....s\nSKIPPED [1] x.py:1: opt-in\n1380 passed, 4 skipped, 2 warnings in "
                   "459.31s (0:07:39)\n....s\n177 passed, 1 skipped in 1100.00s (0:18:20)\n")
    assert record.main([str(log), "1601", "1"]) == 0
    assert not record.RECORD.exists()  # a failed run is not the suite's time
    assert record.main([str(log), "1601", "0"]) == 0
    import json
    got = json.loads(record.RECORD.read_text())
    assert (got["passed"], got["skipped"], got["seconds"], got["wall_seconds"]) == \
        (1557, 5, 1559.3, 1601)
    assert got["command"] == record.COMMAND
    # README's test command is the one .ci/run runs, phase by phase, and the one recorded
    assert f"```bash\n{record.COMMAND}\n```" in TEXT
    run = (ROOT / ".ci" / "run").read_text()
    assert all(f"{phase} | tee" in run for phase in record.PHASES)
    assert ".ci/record.py" in (ROOT / ".ci" / "run").read_text()
