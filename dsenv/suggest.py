"""`did you mean ...?` for a mistyped command, workload or value: close matches only, never
the whole list (argparse before Python 3.14 has no suggestions)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable


def _norm(text: str) -> str:
    return text.strip().lower().replace("_", "-")


def close_matches(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The choices ``word`` most likely meant: the same spelled with '-' for '_' or in
    another case, then those it starts (7 -> 7.0, 7.5), then difflib's close ones."""
    choices = list(dict.fromkeys(str(c) for c in choices))
    wanted = _norm(word)
    if not wanted:
        return []
    same = [c for c in choices if _norm(c) == wanted]
    starts = [c for c in choices if _norm(c).startswith(wanted) and c not in same]
    by_norm = {_norm(c): c for c in choices}
    close = [by_norm[m] for m in difflib.get_close_matches(wanted, list(by_norm), n, 0.6)]
    return list(dict.fromkeys(same + starts + close))[:n]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' did you mean "doctor"?' or ''."""
    found = close_matches(word, choices)
    if not found:
        return ""
    return " did you mean " + " or ".join(f"{c!r}" for c in found) + "?"


_CHOICE = re.compile(r"argument (?P<arg>[^:]+): invalid choice: '(?P<word>[^']*)' "
                     r"\(choose from (?P<choices>.*)\)$")


class Parser(argparse.ArgumentParser):
    """argparse with usage errors in at most two lines: what is wrong (with a close match
    when a choice was mistyped) and where the usage is. Exit 2."""

    def error(self, message: str):
        found = _CHOICE.match(message)
        if found:
            choices = re.findall(r"'([^']*)'", found["choices"])
            what = found["arg"] if found["arg"] not in ("COMMAND", "workload") else (
                "command" if found["arg"] == "COMMAND" else "workload")
            message = (f"unknown {what} {found['word']!r};"
                       + (did_you_mean(found["word"], choices)
                          or " choose from " + ", ".join(choices)))
        sys.stderr.write(f"{self.prog}: {message}\n`{self.prog} --help` shows the usage\n")
        sys.exit(2)
