"""Secrets never reach a report: values of *TOKEN*, *KEY*, *PASSWORD*, *SECRET* variables.

Every renderer passes its final text through :class:`Redactor`, so a check that quotes an
environment variable, a command line or a config file cannot leak a credential.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

SECRET_WORDS = ("TOKEN", "KEY", "PASSWORD", "PASSWD", "SECRET", "CREDENTIAL")
SECRET_NAME = re.compile("|".join(SECRET_WORDS), re.IGNORECASE)
MASK = "***"
# Shorter values ("1", "no") would mask ordinary words everywhere in the report.
MIN_SECRET_LENGTH = 4


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


class Redactor:
    def __init__(self, env: Mapping[str, str]):
        values = {v for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LENGTH}
        # Longest first, so a secret that contains another is masked whole.
        self._values = sorted(values, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for value in self._values:
            text = text.replace(value, MASK)
        return text

    def scrub_obj(self, obj):
        """Every string inside a JSON-like structure, scrubbed (before encoding escapes it)."""
        if isinstance(obj, str):
            return self.scrub(obj)
        if isinstance(obj, dict):
            return {self.scrub(str(k)): self.scrub_obj(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.scrub_obj(v) for v in obj]
        return obj


def show_variable(name: str, value: str) -> str:
    """``NAME=value`` for evidence, with the value masked when the name looks secret."""
    return f"{name}={MASK if is_secret_name(name) else value}"
