"""`dsenv explain TEXT|FILE|-`: the cause of an error message or of a whole job log.

A log is read line by line (logread.py): the root error is the first failure that is not
the cascade that follows it; each failure line, from the root on, is scored against the
catalogue and the family parsers with all its evidence (rank.py), and the first line whose
best cause clears the confidence bar is explained. Below the bar it says "no known cause"
and shows what it extracted. A catalogue id or check id prints that entry."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import textwrap

from dsenv.doctor import catalogue
from dsenv.doctor.explain import alternatives, here, logread, rank
from dsenv.errors import UsageError

MAX_LINES_TRIED = 40  # distinct failure lines scored, from the root on
HINT_WINDOW = 8  # lines either side of the root read for a cause when no failure line names one


# One word that names a path (a slash, or a log's extension): a file was meant, not a message.
_PATH_LIKE = re.compile(r"^\S*/\S*$|^\S+\.(?:log|out|err|txt)$")


def _decode(data: bytes) -> str:
    """UTF-8, or UTF-16 where the file starts with its byte-order mark (PowerShell's `>`
    writes a log copied through Windows that way); bytes neither can read are replaced."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    return data.decode("utf-8-sig", errors="replace")


def read_input(arg: str | None) -> str:
    if arg == "-":
        return _decode(sys.stdin.buffer.read())
    if not arg or "\n" in arg or len(arg) >= 4096:
        return arg or ""
    if os.path.isdir(arg):
        raise UsageError(f"{arg} is a folder: give one of its log files (Slurm's --output or "
                         "--error file, a rank's stderr), or `-` to read the log from stdin")
    if os.path.isfile(arg):
        try:
            with open(arg, "rb") as f:
                return _decode(f.read())
        except OSError as e:
            raise UsageError(f"cannot read {arg}: {e.strerror}; give a log you can read (or "
                             "pipe it: `sudo cat LOG | dsenv explain -`)") from None
    if _PATH_LIKE.match(arg):
        raise UsageError(f"no file {arg}: give an existing log file, the error message in "
                         "quotes, or `-` to read it from stdin")
    return arg


def explain_text(text: str):
    """(reading, the line explained or None, its confident matches, the best weak ones).

    The first line with a confident cause is the one explained, unless that cause is one the
    process goes on after (``goes_on``: NCCL's fallback from a missing libibverbs to sockets,
    a plugin notice): then a later line naming a cause the job dies of is explained instead,
    with the fallback after it. In a log, a benign notice is never the cause: when it is all
    that matched, nothing is confident and the notices come back as the weak ones."""
    reading, line, sure, weak = _explain(text)
    symptoms = [m for m in sure if _symptom_only(m)]
    if symptoms:  # what failed, never why (a line near the root brought it): listed, not named
        sure = [m for m in sure if m not in symptoms]
        weak = symptoms + [m for m in weak if m not in symptoms] if not sure else weak
        line = line if sure else None
    if sure and all(_benign(m) for m in sure) and _is_log(text):
        # a notice of healthy runs too (NCCL's "Could not find: libnccl-net.so", the deepspeed
        # runner's "Unable to find hostfile") is what a log holds, not why it failed: shown
        # as a notice, never named as the cause
        return reading, line, [], sure
    return reading, line, sure, weak


def _benign(m: rank.Match) -> bool:
    return m.mode is not None and m.mode.benign


def _symptom_only(m: rank.Match) -> bool:
    return m.mode is not None and m.mode.symptom_only


def _is_log(text: str) -> bool:
    """More than one line: a log or an excerpt, not the one notice a user asks about."""
    return sum(1 for x in text.splitlines() if x.strip()) > 1


def _past_notices(reading, notices: list, line):
    """The reading with its root moved off a benign notice (DeepSpeed's leaked df line, NCCL's
    plugin notice): the first failure-looking line is not the root error when its only cause
    is one healthy runs print too; the explained line, or the next failure, is."""
    if reading.root is None or reading.root not in notices:
        return reading
    if line is None or line in notices:
        later = [c for c in reading.candidates if c not in notices]
        line = later[0] if later else reading.root
    return dataclasses.replace(reading, root=line)


def _explain(text: str):
    reading, line, sure, weak, notices = _explain_lines(text)
    return _past_notices(reading, notices, line), line, sure, weak


def _explain_lines(text: str):
    reading = logread.find_root(text)
    weak: list[rank.Match] = []
    notices: list = []  # lines whose only confident causes are benign notices
    survived = None  # (line, matches) of the first confident line whose cause it goes on after
    unsure = None  # (line, matches): the first line whose words only an unranked group reads
    for line in reading.candidates[:MAX_LINES_TRIED]:
        around = "" if reading.single else reading.context(line)
        chained = "" if reading.single else reading.chained(line)
        message = reading.message(line)
        matches = rank.rank(message, around, chained)
        sure = alternatives.narrow(rank.confident(matches), matches, message,
                                   f"{around}\n{chained}")
        if sure and all(_symptom_only(m) for m in sure):
            sure = []  # what failed, not why: shown among the weak ones, the search goes on
        if sure and all(_benign(m) for m in sure):
            notices.append(line)
        if sure and not _goes_on(sure[0]):
            if survived is not None:
                return reading, line, sure + [m for m in survived[1] if m.id not in
                                              {s.id for s in sure}], [], notices
            return reading, line, sure, [], notices
        if sure and survived is None:
            survived = (line, sure)
        if line is reading.root and not sure:
            weak = matches[:3]
        if not sure and unsure is None:
            grouped = alternatives.unranked(message, f"{around}\n{chained}")
            unsure = (line, grouped) if grouped else None
    if survived is not None:
        return reading, survived[0], survived[1], [], notices
    hint = _hint_near_root(reading)
    if hint is not None:
        return reading, hint[0], hint[1], [], notices
    if unsure is not None:  # words several causes share, and no line that names one
        return reading, unsure[0], unsure[1], [], notices
    return reading, None, [], weak, notices


def _hint_near_root(reading):
    """(line, confident matches) of a line near the root error that no failure keyword marks
    but that names the cause itself (UCX's "Please set max locked memory (ulimit -l) to
    'unlimited'" above its "Failed to create UCP worker"), when no failure line did: only the
    root's neighbourhood, so a long log costs a few more readings, not one per line."""
    root = reading.root
    if root is None or reading.single:
        return None
    lo, hi = max(0, root.number - 1 - HINT_WINDOW), min(len(reading.lines),
                                                         root.number + HINT_WINDOW)
    for index in range(lo, hi):
        line = reading.lines[index]
        if line.kind not in ("other", "warning") or not line.text.strip():
            continue
        message, around = _with_last(reading.lines, index), reading.context(line)
        matches = rank.rank(message, around)
        sure = alternatives.narrow(rank.confident(matches), matches, message, around)
        if sure and not _goes_on(sure[0]):
            return line, sure
    return None


def _with_last(lines, index: int) -> str:
    """A hint line and the log's last line: a line that names a cause by being the last the
    log printed (torch's "Using ... as PyTorch extensions root..." before a stale lock's
    endless wait) names it only when the log ends there (repeated by other ranks), not when
    the build's own error follows."""
    hint = lines[index].text
    for line in reversed(lines[index + 1:]):
        if line.text.strip():
            return hint if line.text.strip() == hint.strip() else f"{hint}\n{line.text}"
    return hint


def _goes_on(match: rank.Match) -> bool:
    return bool(match.mode is not None and match.mode.goes_on)


def run_explain(args) -> int:
    text = read_input(args.text)
    if not text.strip():
        raise UsageError("give the error message to explain, e.g. `dsenv explain \"Ninja is "
                         "required to load C++ extensions\"`, a log file, or `-` to read it "
                         "from stdin")
    wanted = text.strip()
    exact = [m for m in catalogue.modes() if wanted in (m.id, m.check, *m.merged)]
    if exact:
        return _print([rank.Match(rank.BAR, mode=m) for m in exact], None, None, args)
    if args.here:  # the environment probe runs while the text is read
        args.here_context = here.context(args.environment, args.probe_timeout)
    reading, line, sure, weak = explain_text(text)
    if sure:
        return _print(sure, reading, line, args)
    notices = [m for m in weak if _benign(m)]
    others = [m for m in weak if not _benign(m)]
    if reading.single and not others and (notices or _is_log(text)):
        return _print_no_failure(notices, args)
    return _print_unknown(reading, others, args, notices)


def _notices_json(notices) -> list[dict]:
    return [{"id": m.id, "title": title(m), "matched": m.matched} for m in notices]


def _print_no_failure(notices, args) -> int:
    if args.json:
        print(json.dumps({"schema": "dsenv.explain/1", "root": None, "read": None,
                          "matches": [], "extracted": [], "weak": [],
                          "notices": _notices_json(notices)}, indent=2))
        return 1
    print("no failure found: no line of this text reads as an error (an exception, an error "
          "or fatal message, a failed step)")
    for m in notices:
        print(f"  notice      {m.id}: {title(m)}")
    print("if the job failed, its error is not in this text: give the log of the rank or "
          "step that failed (Slurm's --output/--error files, each rank's stderr)")
    return 1


def _line_json(line):
    return None if line is None else {"line": line.number, "text": line.text}


def _print(matches, reading, line, args) -> int:
    root = reading.root if reading and not reading.single else None
    read = line if reading and not reading.single else None
    found = _look_here(matches, args) if args.here else {}
    group = alternatives.group(matches[0].shared) if matches[0].shared else None
    if args.json:
        shared = {} if group is None else {"shared": {
            "id": group.id, "what": group.what, "modes": [m.id for m in matches if m.shared],
            "which": group.which, "sources": list(group.sources)}}
        print(json.dumps({
            "schema": "dsenv.explain/1", "root": _line_json(root), "read": _line_json(read),
            **shared, "matches": [_match_json(m, found.get(id(m))) for m in matches]},
            indent=2))
        return 0
    members = [m for m in matches if m.shared]
    if group is not None:
        print(render_group(group, members, read, root, found if args.here else None))
        read = root = None  # said once, above the members
    for index, match in enumerate(matches):
        if index or group is not None:
            print()
        label = f"[{index + 1} of {len(members)}] " if match.shared else ""
        print(label + render(match, read, root, found.get(id(match))))
    return 0


def render_group(group, members, read=None, root=None, found=None) -> str:
    """The head of an answer whose line several causes share: what the words establish, the
    line read, what tells the causes apart, and (with --here) which this node shows."""
    lines = [f"{len(members)} known causes share these words ({group.id}): {group.what}; the "
             "text alone cannot tell which"]
    lines += read_lines(read, root)
    lines.append(para("causes", ", ".join(m.id for m in members)))
    lines.append(para("which", group.which))
    if found is not None:
        lines.append(para("here", here.which_here(members, found)))
    lines += [para("seen" if i == 0 else "", src) for i, src in enumerate(group.sources)]
    return "\n".join(lines)


def read_lines(read, root) -> list[str]:
    """The line explained and, when it is not the root error, the root."""
    if read is None:
        return []
    lines = [para("read", f"line {read.number}: {read.text.strip()[:300]}")]
    if root is not None and root is not read:
        lines.append(para("root", f"line {root.number} (no known cause): "
                                  f"{root.text.strip()[:300]}"))
    return lines


def para(label: str, text: str) -> str:
    """One labelled paragraph of an answer, wrapped at 96 columns (never inside a word: mode
    ids, paths and URLs stay whole, to be searched for and copied)."""
    return textwrap.fill(text, width=96, initial_indent=f"  {label:<8}",
                         subsequent_indent=" " * 10, break_on_hyphens=False,
                         break_long_words=False)


def _look_here(matches, args) -> dict[int, list[str]]:
    """{id(match): what this node shows}; each doctor check runs once."""
    ctx = getattr(args, "here_context", None) or here.context(args.environment, args.probe_timeout)
    results: dict = {}
    return {id(m): here.look(m, ctx, results) for m in matches}


def _match_json(m: rank.Match, here_lines: list[str] | None) -> dict:
    out = {"id": m.id, "title": title(m), "cause": cause(m), "fix": fix(m), "score": m.score,
           "matched": m.matched, "evidence": m.why, "parsed": m.parsed, "sources": list(sources(m))}
    if m.usual:
        out["also"] = _also(m)
    if m.mode:
        out.update(check=m.mode.check, detect=m.mode.detect, fixable=m.mode.fixable)
    else:
        f = m.finding
        out.update(check="", library=f.library, version=f.version, symbol=f.symbol,
                   required_by=f.required_by, kind=f.kind,
                   provider=f.row["provider"] if f.row else "")
    if here_lines is not None:
        out["here"] = here_lines
    return out


def _print_unknown(reading, weak, args, notices=()) -> int:
    failures = [x for x in reading.candidates if x.kind == "failure"][:6]
    # A library dsenv's table does not know is read but names no cause; --here still says
    # whether this node and environment have it.
    libraries = [m for m in weak if m.finding is not None]
    found = _look_here(libraries, args) if args.here else {}
    if args.json:
        print(json.dumps({"schema": "dsenv.explain/1", "root": _line_json(
            None if reading.single else reading.root), "read": None, "matches": [],
            "extracted": [_line_json(x) for x in failures if not reading.single],
            "weak": [{"id": m.id, "score": m.score, "evidence": m.why}
                     | ({"here": found[id(m)]} if id(m) in found else {}) for m in weak]}
            | ({"notices": _notices_json(notices)} if notices else {}), indent=2))
        return 1
    print("no known cause: no catalogue entry matches this text with enough evidence")
    if not reading.single and reading.root is not None:
        print(f"  root error  line {reading.root.number}: {reading.root.text.strip()[:300]}")
        for x in failures:
            if x is not reading.root:
                print(f"  also        line {x.number}: {x.text.strip()[:300]}")
    for m in weak:
        if _symptom_only(m):  # confident, but of the symptom alone
            print(f"  symptom     {m.id}: {title(m)}")
            print(f"  next        {fix(m)}")
            continue
        print(f"  weak        {m.id} (score {m.score:g} < {rank.BAR:g}): {'; '.join(m.why)}")
        if m.finding is not None:
            print(f"  next        {m.finding.fix}")
        for line in found.get(id(m), ()):
            print(f"  here        {line}")
    for m in notices:
        print(f"  notice      {m.id}: {title(m)}")
    if libraries and not args.here:
        print("  `dsenv explain --here` looks for the library on this node and in the environment")
    print("`dsenv doctor` checks the node and the environment, and `dsenv doctor --list` "
          "shows what the catalogue covers")
    return 1


def title(m: rank.Match) -> str:
    return m.mode.title if m.mode else m.finding.title


def cause(m: rank.Match) -> str:
    return m.mode.cause if m.mode else m.finding.cause


def fix(m: rank.Match) -> str:
    return m.mode.fix if m.mode else m.finding.fix


def sources(m: rank.Match) -> tuple[str, ...]:
    return m.mode.sources if m.mode else m.finding.sources


def render(match: rank.Match, read=None, root=None, here: list[str] | None = None) -> str:
    lines = [f"{match.id}: {title(match)}"]
    lines += read_lines(read, root)
    if match.finding:
        lines.append(para("parsed", match.finding.describe()))
    for i, parts in enumerate(match.parsed):
        lines.append(para("parsed" if i == 0 else "", parts))
    lines += [para("cause", cause(match)), para("fix", fix(match))]
    mode = match.mode
    if mode:
        check = (f"`dsenv doctor` runs {mode.check} before the job" if mode.check
                 else f"cannot be detected before the job: "
                      f"{mode.detect.removeprefix('cannot: ')}")
        lines.append(para("check", check))
        if mode.fixable:
            lines.append(para("--fix", "`dsenv doctor --fix` can apply this fix"))
        if mode.check and here is None:
            lines.append(para("", "`dsenv explain --here` runs it on this node now"))
    elif here is None:
        lines.append(para("check", "`dsenv explain --here` looks for the library on this "
                                   "node and in the environment"))
    for i, item in enumerate(here or ()):
        lines.append(para("here" if i == 0 else "", item))
    if match.usual:
        lines.append(para("also", _also(match)))
    lines += [para("source" if i == 0 else "", src) for i, src in enumerate(sources(match))]
    return "\n".join(lines)


def _also(match: rank.Match) -> str:
    """What else the words of the usual cause's group were, and how to tell (alternatives.py)."""
    group = alternatives.group(match.usual)
    others = ", ".join(m for m in group.modes if m != match.id)
    # a usual group lists the usual cause's threads first: the last is another member's
    return f"{others} had these words too ({group.id}; {group.sources[-1]}): {group.which}"
