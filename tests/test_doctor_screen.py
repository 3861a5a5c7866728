"""The screen people read: one verdict line first and last, skipped checks folded into one
line per area (every row with --verbose, every check in --json), plain text when piped or
with NO_COLOR (checked on a real pseudo-terminal), secrets masked even where lines wrap."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from dsenv.doctor.context import Context, Options
from dsenv.doctor.render import render_text, use_color
from dsenv.doctor.verdict import Folded, fold_skipped, short_reason, verdict_line
from dsenv.facts.python.torch_info import NOT_INSTALLED
from dsenv.verdicts.findings import Result, Status
from tests.harness import pyenvs
from tests.harness.cli import dsenv, explain

ESC = "\x1b["
MARKUP = ("[bold", "[/", "[red", "[green", "[dim")


def R(check_id, status, summary="", title=None):
    area = check_id.split(".")[0]
    return Result(check_id, area, title or check_id.split(".")[1].title(), status, summary)


def _ctx(tmp_path, target="login", verbose=False, env=None):
    return Context(options=Options(target=target, verbose=verbose), env=env or {}, root=tmp_path)


# -- the verdict ----------------------------------------------------------------------------
@pytest.mark.parametrize("statuses, target, strict, line", [
    ([Status.OK, Status.WARN, Status.WARN], "login", False,
     "ready to submit: 0 failures, 2 warnings"),
    ([Status.OK, Status.WARN], "compute", False, "ready to run: 0 failures, 1 warning"),
    ([Status.FAIL, Status.FAIL, Status.WARN], "login", False, "not ready: 2 failures, 1 warning"),
    ([Status.ERROR, Status.OK], "compute", False, "not ready: 0 failures, 1 error, 0 warnings"),
    ([Status.OK, Status.WARN], "login", True,
     "not ready (--strict: warnings count as failures): 0 failures, 1 warning"),
    ([Status.OK, Status.SKIP], "login", True,
     "ready to submit (--strict: warnings count as failures): 0 failures, 0 warnings"),
])
def test_verdict_line(statuses, target, strict, line):
    results = [R(f"system.c{i}", s) for i, s in enumerate(statuses)]
    assert verdict_line(results, target, strict) == line


def test_verdict_is_the_first_and_the_last_line(tmp_path):
    results = [R("system.a", Status.OK, "fine"), R("mpi.b", Status.FAIL, "broken")]
    lines = render_text(results, _ctx(tmp_path), color=False).rstrip().splitlines()
    assert lines[0] == lines[-1] == "not ready: 1 failure, 0 warnings"
    assert lines[1].startswith("dsenv doctor ") and "target login" in lines[1]


# -- folding skipped checks -----------------------------------------------------------------
@pytest.mark.parametrize("summary, reason", [
    ("torch 2.13.0+cpu (CPU-only build): see torch.build", "torch 2.13.0+cpu (CPU-only build)"),
    ("NCCL_IB_HCA is not set (NCCL uses every active HCA)", "NCCL_IB_HCA is not set"),
    ("no RDMA devices under /sys/class/infiniband", "no RDMA devices"),
    ("no NVIDIA driver: nvidia-smi is not on PATH", "no NVIDIA driver"),
    ("not provisioned by dsenv (no dsenv-env.json in /opt/env)", "not provisioned by dsenv"),
    ("not asked (`dsenv doctor --probe` launches 2 real ranks to confirm mpi.launch)",
     "`dsenv doctor --probe` launches 2 real ranks to confirm mpi.launch"),
    ("no RoCE ports", "no RoCE ports"),
])
def test_short_reason(summary, reason):
    assert short_reason(summary) == reason


def test_skips_of_an_area_fold_into_one_line():
    gpu = [R("gpu.nvidia-smi", Status.SKIP, "no NVIDIA driver: nvidia-smi is not on PATH"),
           R("gpu.rocm", Status.SKIP, "no ROCm: no amd-smi, rocminfo or rocm-smi on PATH"),
           R("gpu.devices", Status.INFO, "no GPU visible (normal on a login node)"),
           R("gpu.visible-devices", Status.SKIP, "no GPU: nothing to check *_VISIBLE_DEVICES")]
    rows, folded = fold_skipped(gpu)
    assert folded == 3 and rows[0].id == "gpu.devices"
    (line,) = rows[1:]
    assert isinstance(line, Folded)
    assert line.line() == "gpu: 3 checks do not apply here: no NVIDIA driver; no ROCm; no GPU"


def test_unset_variables_merge_and_options_not_given_are_not_asked_for():
    comm = [R("comm.ifname", Status.SKIP, "NCCL_SOCKET_IFNAME is not set (NCCL prefers ib*)"),
            R("comm.hca", Status.SKIP, "NCCL_IB_HCA is not set (NCCL uses every active HCA)"),
            R("comm.ib", Status.SKIP, "no RDMA devices under /sys/class/infiniband")]
    rows, _ = fold_skipped(comm)
    assert rows[0].reasons == "NCCL_SOCKET_IFNAME, NCCL_IB_HCA not set; no RDMA devices"
    job = [R(f"job.c{i}", Status.SKIP, "no --deepspeed-config FILE given") for i in range(3)]
    job.append(R("job.world", Status.SKIP, "world size unknown: give --nodes N --gpus-per-node G"))
    job.append(R("job.fp16", Status.SKIP, "no GPU visible to judge fp16/bf16 support"))
    rows, folded = fold_skipped(job)
    assert folded == 4  # the lone "does not apply" keeps its own row
    assert rows[0].id == "job.fp16" and rows[1].title == "4 checks not asked for"
    assert rows[1].reasons == "no --deepspeed-config FILE given; world size unknown"


def test_a_lone_skip_keeps_its_row():
    rows, folded = fold_skipped([R("cache.assets", Status.SKIP, "no --for WORKLOAD given"),
                                 R("cache.hf", Status.OK, "writable")])
    assert folded == 0 and [r.id for r in rows] == ["cache.hf", "cache.assets"]


def _many(tmp_path, verbose):
    results = [R("gpu.devices", Status.INFO, "no GPU visible", "GPUs visible to this job"),
               R("gpu.nvidia-smi", Status.SKIP, "no NVIDIA driver: nvidia-smi is not on PATH",
                 "NVIDIA driver tool (nvidia-smi)"),
               R("gpu.rocm", Status.SKIP, "no ROCm: no amd-smi on PATH", "AMD GPU tools")]
    return render_text(results, _ctx(tmp_path, verbose=verbose), color=False)


def test_verbose_shows_every_row_and_folds_nothing(tmp_path):
    folded, verbose = _many(tmp_path, False), _many(tmp_path, True)
    assert "2 checks do not apply here  no NVIDIA driver; no ROCm" in folded
    assert "NVIDIA driver tool" not in folded
    assert "2 skipped (folded into 1 line; --verbose lists each)" in folded
    assert "do not apply" not in verbose
    assert "NVIDIA driver tool (nvidia-smi)" in verbose and "AMD GPU tools" in verbose


# -- plain or coloured ----------------------------------------------------------------------
class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("stream, env, expected", [
    (_Tty(), {"TERM": "xterm"}, True),
    (_Tty(), {"TERM": "xterm", "NO_COLOR": "1"}, False),
    (_Tty(), {"TERM": "xterm", "NO_COLOR": ""}, True),  # no-color.org: set and not empty
    (_Tty(), {"TERM": "dumb"}, False),
    (io.StringIO(), {"TERM": "xterm"}, False),
])
def test_use_color(stream, env, expected):
    assert use_color(stream, env) is expected


def test_coloured_and_plain_render_the_same_text(tmp_path):
    results = [R("system.a", Status.OK, "fine [bold]literal[/] brackets"),
               R("mpi.b", Status.WARN, "meh")]
    plain = render_text(results, _ctx(tmp_path), color=False)
    painted = render_text(results, _ctx(tmp_path), color=True)
    assert ESC not in plain and ESC in painted
    assert "[bold]literal[/]" in plain  # a summary's brackets are text, never markup
    assert re.sub(r"\x1b\[[0-9;]*m", "", painted) == plain


def test_a_secret_is_masked_even_where_the_line_wraps(tmp_path):
    secret = "correct horse battery staple"
    env = {"DB_PASSWORD": secret}
    summary = "x " * 40 + f"the password {secret} leaked " + "y " * 40
    text = render_text([R("system.a", Status.FAIL, summary)], _ctx(tmp_path, env=env),
                       color=False)
    flat = " ".join(text.split())
    assert "horse battery" not in flat and "battery staple" not in flat and "***" in text


# -- the real command: a pipe, a pseudo-terminal, NO_COLOR -----------------------------------
def _env(**extra):
    # No GPU tool on PATH: the gpu area is the same on any machine.
    env = dict(os.environ, PATH=str(Path(sys.executable).parent), TERM="xterm", **extra)
    env.pop("NO_COLOR", None)
    env.update(extra)
    return env


DOCTOR = [sys.executable, "-m", "dsenv", "doctor", "--only", "system,gpu", "--target", "login"]


def _on_a_pty(argv, env) -> tuple[int, str]:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env,
                            close_fds=True)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed its side
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(timeout=60), b"".join(chunks).decode()


def test_a_pipe_gets_plain_text():
    out = subprocess.run(DOCTOR, capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode in (0, 1), out.stderr
    assert ESC not in out.stdout and not any(m in out.stdout for m in MARKUP)
    lines = out.stdout.rstrip().splitlines()
    assert lines[0] == lines[-1] and lines[0].startswith(("ready to submit", "not ready"))


def test_a_terminal_gets_colour_and_NO_COLOR_turns_it_off():
    rc, painted = _on_a_pty(DOCTOR, _env())
    assert rc in (0, 1) and ESC in painted, painted[:500]
    rc, plain = _on_a_pty(DOCTOR, _env(NO_COLOR="1"))
    assert rc in (0, 1) and "gpu" in plain
    assert ESC not in plain and not any(m in plain for m in MARKUP), plain[:500]
    assert plain.replace("\r\n", "\n").rstrip().splitlines()[0].startswith(
        ("ready to submit", "not ready"))


def test_folded_line_without_verbose_every_row_with_it_every_check_in_json():
    argv = [sys.executable, "-m", "dsenv", "doctor", "--only", "gpu", "--target", "login"]
    folded = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=60)
    verbose = subprocess.run([*argv, "--verbose"], capture_output=True, text=True, env=_env(),
                             timeout=60)
    report = subprocess.run([*argv, "--json"], capture_output=True, text=True, env=_env(),
                            timeout=60)
    assert "7 checks do not apply here no NVIDIA driver; no NVIDIA kernel module loaded; no " \
        "ROCm; no GPU; no NVIDIA GPU to compare" in " ".join(folded.stdout.split())  # wrapped
    assert "NVIDIA driver tool (nvidia-smi)" not in folded.stdout
    for title in ("NVIDIA driver tool (nvidia-smi)", "AMD GPU tools", "GPUs visible to this job",
                  "CUDA/ROCR/HIP_VISIBLE_DEVICES", "GPU compute mode", "MIG instances",
                  "GPUs new enough for FlashAttention-2 and Triton",
                  "the libcuda programs load matches the NVIDIA kernel module"):
        assert title in verbose.stdout
    assert "do not apply here" not in verbose.stdout
    results = json.loads(report.stdout)["results"]
    assert {r["id"]: r["status"] for r in results} == {
        "gpu.nvidia-smi": "skip", "gpu.rocm": "skip", "gpu.devices": "info",
        "gpu.visible-devices": "skip", "gpu.compute-mode": "skip", "gpu.mig": "skip",
        "gpu.kernel-floors": "skip", "gpu.libcuda": "skip"}
    assert folded.returncode == verbose.returncode == report.returncode == 0


# -- counts that add up, one wording per reason (issue 24, item 7) ------------------------------
_FOOTER = re.compile(r"(?P<skipped>\d+) skipped \((?:(?P<shown>\d+) shown, (?P<folded>\d+) )?"
                     r"folded into (?P<lines>\d+) lines?; --verbose lists each\)$")
_SKIP_ROW = re.compile(r"^\u2013  (?P<title>.*?)\s{2,}")
_FOLD_TITLE = re.compile(r"^(?P<n>\d+) checks? (do not apply here|does not apply here|not asked "
                         r"for)$")


def _screen_counts(stdout: str) -> tuple[dict, int, int, int]:
    """(the footer's numbers, the skipped checks the rows show alone, the folded rows, the
    checks those rows fold), read from a real screen."""
    lines = stdout.rstrip().splitlines()
    footer = _FOOTER.search(lines[-2])
    assert footer, lines[-2]
    alone = folded_rows = folded_checks = 0
    for line in lines:
        row = _SKIP_ROW.match(line)
        if not row:
            continue
        fold = _FOLD_TITLE.match(row["title"])
        if fold:
            folded_rows += 1
            folded_checks += int(fold["n"])
        else:
            alone += 1
    return footer.groupdict(), alone, folded_rows, folded_checks


def test_the_counts_line_says_how_many_skips_are_shown_and_how_many_folded(tmp_path):
    """Was "45 skipped (--verbose lists the 43 folded above)": where are the other 2? Now the
    shown and the folded add up to the skipped, each as the screen has them."""
    done = dsenv("doctor", "--target", "login", env={"HOME": str(tmp_path)}, timeout=120)
    assert done.returncode in (0, 1), explain(done)
    footer, alone, rows, checks = _screen_counts(done.stdout)
    assert rows and alone, done.stdout  # this screen has both kinds of skipped rows
    assert int(footer["shown"]) == alone and int(footer["folded"]) == checks, done.stdout
    assert int(footer["lines"]) == rows
    assert alone + checks == int(footer["skipped"])


def test_a_screen_where_every_skip_is_folded_says_only_that(tmp_path):
    results = [R("gpu.nvidia-smi", Status.SKIP, "no NVIDIA driver"),
               R("gpu.rocm", Status.SKIP, "no ROCm"), R("job.config", Status.SKIP,
                                                        "no --deepspeed-config FILE given"),
               R("job.batch", Status.SKIP, "no --deepspeed-config FILE given")]
    last = render_text(results, _ctx(tmp_path), color=False).rstrip().splitlines()[-2]
    assert last == "4 skipped (folded into 2 lines; --verbose lists each)"


def test_one_reason_has_one_wording_in_an_environment_without_torch(tmp_path):
    """In a venv without torch the toolkit area read "torch is not installed in the environment;
    torch is not installed; torch not installed": one reason, three wordings, three reasons on
    the folded line. Every check now gives torch_info.NOT_INSTALLED."""
    venv = pyenvs.make_venv(tmp_path / "bare")
    env = pyenvs.doctor_env(HOME=str(tmp_path))
    screen = dsenv("doctor", "--env", venv, "--target", "login", base=env, timeout=120)
    report = dsenv("doctor", "--env", venv, "--target", "login", "--json", base=env,
                   timeout=120)
    results = json.loads(report.stdout)["results"]
    torchless = [r for r in results if r["status"] == "skip"
                 and re.search(r"\btorch (is )?not installed", r["summary"])]
    assert len(torchless) >= 5, [r["id"] for r in results if r["status"] == "skip"]
    assert {short_reason(r["summary"]) for r in torchless} == {NOT_INSTALLED}, torchless
    folded = [line for line in screen.stdout.splitlines() if "torch" in line and "not inst" in line]
    assert folded and "torch not installed" not in screen.stdout, screen.stdout
    assert "torch is not installed in the environment" not in screen.stdout
    for line in folded:
        assert line.count(NOT_INSTALLED) <= 1, line
