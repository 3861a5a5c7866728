"""The NCCL settings a job will run with: its environment, then NCCL's configuration files.

What NCCL does (NVIDIA/nccl src/misc/param.cc at commit 081eafaf; earlier releases had the
same functions in src/include/param.h, calling setenv(name, value, 0) themselves):

- ``initEnvFunc`` (lines 66-81) reads ${NCCL_CONF_FILE} when it is set and not empty
  (NCCL >= 2.23), otherwise ``<home>/.nccl.conf``, ``home`` being the passwd entry's
  (``userHomeDir``, lines 30-37: getpwuid(getuid())->pw_dir); then ``/etc/nccl.conf``.
- ``setEnvFile`` (lines 39-64) skips a line whose first character is ``#`` and a line
  without ``=``; the name is everything before the first ``=`` and the value everything
  after it, less the newline, neither stripped ("NCCL_X = 1" sets ``NCCL_X ``, a variable
  NCCL never reads); each pair goes through ``ncclOsSetEnv``, which is ``setenv(name, value,
  0)`` (src/os/linux.cc): a variable already set is never overwritten.

So the environment wins, even set empty (NCCL then takes its default and no file can set
it); then the first line naming it in the user's file; then the first in /etc/nccl.conf.

dsenv takes the home folder from the job's ``HOME`` (the same folder for the job's user; tests
point it at a tree), and /etc through the Node's root. Every check that judges an NCCL
variable asks :func:`nccl_setting`, never ``ctx.env`` (tests/test_doctor_nccl_conf.py scans
doctor/checks for it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from dsenv.facts.host import mounts
from dsenv.facts.node import Node, probe
from dsenv.redact import show_variable

ENVIRONMENT = "environment"


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    source: str  # "environment" or the file it came from

    @property
    def from_file(self) -> bool:
        return self.source != ENVIRONMENT

    def origin(self) -> str:
        """'' from the environment, ' (from /etc/nccl.conf)' from a file."""
        return f" (from {self.source})" if self.from_file else ""

    def shown(self) -> str:
        """'NCCL_SOCKET_IFNAME=ib9 (from /etc/nccl.conf)', secrets masked."""
        return show_variable(self.name, self.value) + self.origin()

    def where(self) -> str:
        """An evidence line naming where the value comes from."""
        if not self.from_file:
            return f"{self.name} is set in the environment (it wins over NCCL's files)"
        return (f"{self.name} is set by a line of {self.source}: NCCL reads it there, as the "
                "environment does not set it")

    def undo(self) -> str:
        """How to take it away: unset it, or delete the file's line (an export overrides it)."""
        if not self.from_file:
            return f"unset {self.name}"
        return (f"delete the {self.name} line from {self.source} (or export {self.name} in "
                "the job: the environment wins over the file)")


def parse_conf(text: str) -> dict[str, str]:
    """The pairs NCCL's setEnvFile sets, first line wins: name before the first '=', value
    after it, neither stripped; lines starting with '#' and lines without '=' skipped."""
    values: dict[str, str] = {}
    for line in text.split("\n"):
        if line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        if name:  # setenv refuses an empty name
            values.setdefault(name, value)
    return values


def conf_files(node: Node) -> list[Path]:
    """NCCL's files in the order it reads them: the user's first, then /etc/nccl.conf."""
    files = []
    user = node.env.get("NCCL_CONF_FILE", "")
    if user:
        files.append(Path(user))
    elif node.env.get("HOME"):
        files.append(Path(node.env["HOME"]) / ".nccl.conf")
    files.append(node.path("/etc/nccl.conf"))
    return files


def unanswered(node: Node) -> list[Path]:
    """NCCL's files on a file system that gave no answer: not read here, and NCCL reads them
    in every rank at init (a hung file server hangs the job there)."""
    return [path for path in conf_files(node) if not mounts.files_answer(node, path)]


def looked_in(node: Node) -> str:
    """Where a setting was looked for, for a check that found none."""
    hung = set(unanswered(node))
    return "looked in the environment, " + ", ".join(
        f"{path} (no answer: not read)" if path in hung else str(path) for path in conf_files(node))


@probe
def nccl_settings(node: Node) -> dict[str, Setting]:
    """Every NCCL_* setting the job would see, each with where it comes from (read-only)."""
    found = {name: Setting(name, value, ENVIRONMENT)
             for name, value in node.env.items() if name.startswith("NCCL_")}
    for path in conf_files(node):
        if not mounts.files_answer(node, path):
            continue  # a hung file server: its lines are not read (never blocks the checks)
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for name, value in parse_conf(text).items():
            if name.startswith("NCCL_") and name not in found:
                found[name] = Setting(name, value, str(path))
    return found


def nccl_setting(node: Node, name: str) -> Setting | None:
    """The value NCCL will use for ``name`` (stripped) and where it comes from; None when
    nothing sets it, or it is set empty (NCCL's default then; an empty variable in the
    environment still hides the files' lines)."""
    setting = nccl_settings(node).get(name)
    if setting is None or not setting.value.strip():
        return None
    return replace(setting, value=setting.value.strip())
