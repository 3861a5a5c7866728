"""README's quoted screens, made by the code: find them, run them, compare, rewrite.

A fenced ```text block in README.md that shows what a command prints is marked by an HTML
comment on the line just above its fence, naming the command that prints it::

    <!-- screen: dsenv doctor --target compute --gpus-per-node 0 --only gpu,torch -->

The block opens with the prompt as README shows it (``$ ...``, continued by lines after one
ending in ``\\``), then the output. A line ``...`` alone leaves out lines of the output (any
number, none included); everything else must be what the command prints now.

- :func:`screens` finds the marked blocks; :func:`run_screen` runs a block's command with
  bash on this machine as a new user would: in an empty home (no caches yet; shown as
  /home/user) holding ``ds_config.json`` (tests/fixtures/dsconfig/bert_squad_fp16.json),
  plain output (``NO_COLOR``, 100 columns), this interpreter's ``dsenv`` first on PATH and
  none of the variables the CI or a job sets (``DS_ACCELERATOR``, ``MASTER_*``, ``NCCL_*``,
  ``SLURM_*``, ``HF_*``, an activated environment, ...). A smoke keeps the suite's
  ``TORCH_EXTENSIONS_DIR`` (compiled ops are not on its screen; compiling them is minutes).
- :func:`compare` masks what varies from run to run and machine to machine on both sides,
  the same way, and says what differs (None when nothing does): durations, version numbers and
  other decimals (sizes, losses, metrics, samples/s), a measurement compared with its
  threshold, absolute paths, timestamps, the host name, the CPU model, process ids in
  temporary names, the shares of the node a smoke measured. Verdict lines, counts and the checks' texts are compared. Wrapping is not
  (a longer value moves the line breaks): the comparison is over words.
  A smoke whose performance verdict is INCONCLUSIVE (the node was busy: the verdict says so)
  or REPORTED for want of a reference for this machine's CPU model is compared with README's
  PASS except for that row.
- :func:`write` puts fresh output into README's blocks, keeping each prompt and each ``...``
  (the lines between two ``...`` are matched to the fresh output by their first and last
  line).

``python tests/harness/readme_screens.py`` checks every block (``--only TEXT``: those whose
command contains TEXT) and exits 1 on a difference; ``--write`` rewrites README's blocks,
and the suite's stated time and counts from the last CI run (``.ci/last-run.json``, which
``.ci/run`` writes when the test command passed).
"""

from __future__ import annotations

import argparse
import difflib
import os
import random
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DS_CONFIG = ROOT / "tests" / "fixtures" / "dsconfig" / "bert_squad_fp16.json"
REGENERATE = "python tests/harness/readme_screens.py --write"
# how the run's home (an empty temporary folder, random name) is shown in README
SHOWN_HOME = "/home/user"

MARKER = re.compile(r"^<!--\s*screen:\s*(?P<command>.+?)\s*-->\s*$")
ELIDED = "..."
# Variables a CI run, a job or an activated environment sets: not a new user's shell.
DROPPED = ("DS_", "MASTER_", "GLOO_", "NCCL_", "SLURM_", "SRUN_", "OMPI_", "PMIX_", "HF_",
           "TRANSFORMERS_", "HUGGINGFACE_", "TORCH_", "CUDA_VISIBLE", "ROCR_", "HIP_", "OMP_",
           "DSENV_", "VIRTUAL_ENV", "CONDA_", "PYTHONPATH", "PYTEST_", "COLUMNS", "LINES",
           "FORCE_COLOR", "CLICOLOR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


@dataclass(frozen=True)
class Screen:
    """One marked block: ``lines[start:end]`` of README are its contents (fences excluded)."""
    command: str
    marker_line: int  # 1-based, for messages
    start: int
    end: int
    prompt: list[str]
    output: list[str]


def screens(text: str | None = None) -> list[Screen]:
    """Every marked block of README (``text`` when given), in order."""
    lines = (README.read_text() if text is None else text).splitlines()
    found = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            raise ValueError(f"README.md:{i + 1}: a screen marker must stand just above a "
                             f"fenced block")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"README.md:{i + 1}: the block after the marker never closes")
        body = lines[i + 2:end]
        n = 0
        if body and body[0].startswith("$ "):
            n = 1
            while n < len(body) and body[n - 1].rstrip().endswith("\\"):
                n += 1
        found.append(Screen(m.group("command"), i + 1, i + 2, end, body[:n], body[n:]))
    return found


def environment(home: Path) -> dict[str, str]:
    """A new user's shell on this machine (see the module's docstring)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED)}
    env.update(HOME=str(home), NO_COLOR="1", TERM="dumb", PYTHONDONTWRITEBYTECODE="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                     os.environ.get("PATH", "")]))
    return env


def _home() -> Path:
    """A new empty folder whose path is as long as SHOWN_HOME (/tmp/uXXXX), so that the
    screen's lines break where they would for /home/user."""
    for _ in range(100):
        path = Path("/tmp/u" + "".join(random.choices(string.ascii_lowercase, k=4)))
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            continue
    return Path(tempfile.mkdtemp())


def run_screen(command: str, *, timeout: float = 300) -> tuple[int, str]:
    """``command`` run by bash as the module's docstring says: its exit status and what it
    printed (stdout and stderr as a terminal interleaves them), the home shown as
    SHOWN_HOME."""
    home = _home()
    try:
        cwd = home
        shutil.copyfile(DS_CONFIG, cwd / "ds_config.json")
        env = environment(home)
        if "dsenv smoke" in command or "dsenv run" in command:
            env["TORCH_EXTENSIONS_DIR"] = os.environ.get("TORCH_EXTENSIONS_DIR") or str(
                Path.home() / ".cache" / "dsenv-tests" / "torch_extensions")
        child = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, text=True,
                                 errors="replace", stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            out, _ = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            out, _ = child.communicate()
            out += f"\n[readme_screens: `{command}` killed after {timeout:.0f} s]"
        out = out.replace(str(home), SHOWN_HOME)
        return child.returncode, "\n".join(line.rstrip() for line in out.splitlines())
    finally:
        shutil.rmtree(home, ignore_errors=True)


# --- masking -------------------------------------------------------------------------------

BOX = re.compile(r"[│╭╮╰╯─┏┓┗┛━┃┡┩╇┳┻└┘┌┐├┤┼┬┴]+")
_NUM = r"\d+(?:\.\d+)?"
MASKS = [
    # ISO timestamps, then durations (8.1 s, 1557 s, 26 min, 0:24:00)
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?"), "<TIME>"),
    (re.compile(rf"(?<![\w.]){_NUM} ?(?:s|ms|min|h)\b"), "<DURATION>"),
    (re.compile(r"\b\d+:\d\d:\d\d\b"), "<DURATION>"),
    # absolute paths (not the // of a URL)
    (re.compile(r"(?<![\w.:/~])/[\w.@+~%-][\w.@+~%/-]*"), "<PATH>"),
    # process ids in temporary names (.cpu.tmp-14353)
    (re.compile(r"\btmp-\d+\b"), "tmp-<PID>"),
    # the CPU model (cpu:AMD EPYC, Intel(R) Xeon(R) Processor, ... Gold 6248 CPU @ 2.50GHz)
    (re.compile(r"(?:AMD (?:EPYC|Ryzen)|Intel\(R\) (?:Xeon\(R\)|Core\(TM\)))"
                r"(?: (?:[\w.-]*\d[\w.-]*|Gold|Silver|Platinum|Bronze|CPU|@|Processor)\b)*"),
     "<CPU>"),
    # JSON's host and platform
    (re.compile(r'"(host|platform)": "[^"]*"'), r'"\1": "<\1>"'),
    # the shares of the node a smoke measured (others took 75% of ..., the run 25%)
    (re.compile(r"\b(took|the run) \d+%"), r"\1 <N>%"),
    # a rate, whole or not (its 3 significant digits print 50 as "50": seen in CI)
    (re.compile(rf"(?<![\w.]){_NUM}(?= (?:GFLOP|TFLOP|samples)/s\b)"), "<N>"),
    # a measurement before its threshold (loss drop 1 >= 0.5)
    (re.compile(rf"(?<![\w.]){_NUM}(?= (?:>=|<=|<|>|->) )"), "<N>"),
    # versions and other decimals (2.13.0+cpu, 6.18.44-fc-v669, 23.5, 0.003)
    (re.compile(r"(?<![\w.])\d+(?:\.\d+)+(?:[+-][\w.+-]*\w)?"), "<N>"),
]


def words(lines: list[str]) -> str:
    """The lines as one string of words: box drawing gone, words a line break split at a
    hyphen joined again."""
    out: list[str] = []
    glue = False
    for line in lines:
        tokens = BOX.sub(" ", line).split()
        if glue and tokens and out:
            out[-1] += tokens.pop(0)
        out += tokens
        glue = bool(tokens) and len(tokens[-1]) > 1 and tokens[-1].endswith("-") \
            and tokens[-1][-2].isalnum()
    return " ".join(out)


def masked(text: str, hostname: str | None = None) -> str:
    for pattern, repl in MASKS:
        text = pattern.sub(repl, text)
    if hostname:
        text = re.sub(rf"\b{re.escape(hostname)}\b", "<HOST>", text)
    return text


PERF_ROW = re.compile(r"\bperformance (?:PASS|INCONCLUSIVE|REPORTED)\b.*?"
                      r"(?= model | report | wall time |$)")
SMOKE_TITLE = re.compile(r"(: )(?:PASS|INCONCLUSIVE)\b")


def _segments(lines: list[str]) -> list[list[str]]:
    """README's output lines cut at each ``...`` (a leading or trailing one gives an empty
    segment there)."""
    segs: list[list[str]] = [[]]
    for line in lines:
        if line.strip() == ELIDED:
            segs.append([])
        else:
            segs[-1].append(line)
    return segs


def compare(screen: Screen, fresh: str) -> str | None:
    """None when README's block says what ``fresh`` says (masked, over words, ``...`` leaving
    lines out); else why not, with a unified diff of the masked lines."""
    host = socket.gethostname()
    # The performance row depends on the machine: a busy node (INCONCLUSIVE), or a CPU model
    # the references table has no row for (REPORTED): README's row is then not comparable.
    busy = bool(re.search(r"performance\s+INCONCLUSIVE", fresh))
    unreferenced = bool(re.search(r"\bperformance REPORTED\b[^;]*; no reference for\b",
                                  words(fresh.splitlines())))

    def norm(lines: list[str]) -> str:
        text = masked(words(lines), host)
        if busy or unreferenced:
            text = SMOKE_TITLE.sub(r"\1<VERDICT>", PERF_ROW.sub("performance <MACHINE>", text))
        return text

    got = " " + norm(fresh.splitlines()) + " "
    segs = [norm(seg) for seg in _segments(screen.output)]
    pos, ok = 0, True
    for k, seg in enumerate(segs):
        if not seg:
            continue
        needle = " " + seg + " "
        at = got.find(needle, pos)
        if at < 0 or (k == 0 and at != 0) or (k == len(segs) - 1 and at + len(needle) != len(got)):
            ok = False
            break
        pos = at + len(needle) - 1
    if ok and len(segs) == 1 and not segs[0] and got.strip():
        ok = False
    if ok:
        return None
    mine = [masked(line, host) for line in screen.output]
    theirs = [masked(line, host) for line in fresh.splitlines()]
    diff = "\n".join(difflib.unified_diff(mine, theirs, "README.md (masked)",
                                          f"{screen.command} (masked)", lineterm=""))
    busy_note = ("\n(the node was busy, or its CPU has no reference: the smoke's performance "
                 "verdict is left out of the comparison)") if busy or unreferenced else ""
    return (f"README.md:{screen.marker_line}: the block quoting `{screen.command}` no longer "
            f"matches what it prints here (masked: durations, versions and decimals, paths, "
            f"host, CPU model; compared over words, `...` lines leave lines out){busy_note}\n"
            f"regenerate: {REGENERATE}\n{diff}")


# --- the suite's stated time ------------------------------------------------------------------

RECORD = ROOT / ".ci" / "last-run.json"
SUITE = re.compile(r"the whole suite takes ~(?P<minutes>\d+) min\s+on this project's 2-core "
                   r"machine \(the last CI run, `\.ci/last-run\.json`:\s+(?P<passed>\d+) passed,"
                   r"\s+(?P<skipped>\d+) skipped,\s+(?P<seconds>\d+) s of tests\)")


def stated_suite(text: str | None = None) -> dict[str, int] | None:
    """README's "the whole suite takes ~N min ... (the last CI run ...: P passed, S skipped,
    T s of tests)"; None when it says no such thing, once."""
    found = list(SUITE.finditer(README.read_text() if text is None else text))
    return {k: int(v) for k, v in found[0].groupdict().items()} if len(found) == 1 else None


def recorded_suite() -> dict[str, int] | None:
    """What README must state from .ci/last-run.json (written by .ci/run when the test
    command passed); None when no run is recorded."""
    import json
    if not RECORD.is_file():
        return None
    run = json.loads(RECORD.read_text())
    return {"minutes": round(run["seconds"] / 60), "passed": run["passed"],
            "skipped": run["skipped"], "seconds": round(run["seconds"])}


def write_suite() -> str:
    """Put the recorded run's figures into README's sentence; one line saying what it did."""
    text, want = README.read_text(), recorded_suite()
    found = list(SUITE.finditer(text))
    if want is None or len(found) != 1:
        return "suite time: no recorded run or README states none; left as it is"
    m = found[0]
    parts, last = [], m.start()
    for name in ("minutes", "passed", "skipped", "seconds"):
        parts += [text[last:m.start(name)], str(want[name])]
        last = m.end(name)
    new = text[:m.start()] + "".join(parts) + text[last:]
    if new == text:
        return "suite time: unchanged"
    README.write_text(new)
    return f"suite time: README now states the recorded run ({want})"


# --- writing --------------------------------------------------------------------------------

def _norm_line(line: str, host: str) -> str:
    return masked(words([line]), host)


def placed(screen: Screen, fresh: str) -> list[str]:
    """The block's new output lines: ``fresh`` whole, or with README's ``...`` kept, each
    kept run of lines taken from ``fresh`` between the lines matching its first and last."""
    new = fresh.splitlines()
    segs = _segments(screen.output)
    if len(segs) == 1:
        return new
    host = socket.gethostname()
    keys = [_norm_line(line, host) for line in new]
    out: list[str] = []
    pos = 0
    for k, seg in enumerate(segs):
        if k:
            out.append(ELIDED)
        if not seg:
            continue
        first, last = _norm_line(seg[0], host), _norm_line(seg[-1], host)
        try:
            i = keys.index(first, pos) if k else 0
            j = keys.index(last, i) if k < len(segs) - 1 else len(new) - 1
        except ValueError:
            raise ValueError(f"README.md:{screen.marker_line}: cannot find the lines around a "
                             f"`...` of `{screen.command}` in its output; edit the block by "
                             f"hand ({seg[0].strip()!r} .. {seg[-1].strip()!r})") from None
        out += new[i:j + 1]
        pos = j + 1
    return out


def write(only: str | None = None, force: bool = False) -> list[str]:
    """Rewrite README's marked blocks from fresh output (those that differ, masked; all with
    ``force``); what was done to each, one line."""
    text = README.read_text()
    lines = text.splitlines()
    done = []
    for screen in reversed(screens(text)):
        if only and only not in screen.command:
            continue
        _, fresh = run_screen(screen.command)
        if "[readme_screens: " in fresh:
            done.append(f"kept the block of `{screen.command}`: {fresh.splitlines()[-1]}")
            continue
        if re.search(r"performance\s+INCONCLUSIVE", fresh):
            done.append(f"kept the block of `{screen.command}`: the node was busy (performance "
                        f"INCONCLUSIVE); write it again on an idle node")
            continue
        if not force and compare(screen, fresh) is None:
            done.append(f"unchanged: `{screen.command}` (masked, it matches)")
            continue
        try:
            output = placed(screen, fresh)
        except ValueError as e:
            done.append(f"kept: {e}")
            continue
        lines[screen.start:screen.end] = (screen.prompt or [f"$ {screen.command}"]) + output
        done.append(f"rewrote the block of `{screen.command}`")
    README.write_text("\n".join(lines) + ("\n" if text.endswith("\n") else ""))
    return done[::-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite README's blocks")
    parser.add_argument("--force", action="store_true",
                        help="with --write: rewrite the blocks that match too (new timings)")
    parser.add_argument("--only", help="only the blocks whose command contains this text")
    args = parser.parse_args(argv)
    if args.write:
        for line in write(args.only, args.force):
            print(line)
        if not args.only:
            print(write_suite())
        return 0
    status = 0
    for screen in screens():
        if args.only and args.only not in screen.command:
            continue
        _, fresh = run_screen(screen.command)
        problem = compare(screen, fresh)
        print(problem or f"ok: {screen.command}")
        status |= problem is not None
    return status


if __name__ == "__main__":
    raise SystemExit(main())
