"""`dsenv lock`: hashed requirement locks per stack, compiled by ``uv pip compile``.

Inputs are ``envs/requirements/<stack>.in`` (direct requirements, pinned); outputs are
``envs/locks/<stack>.txt``: every package of the environment with its exact version and the
sha256 of every file that may be installed for it, so ``uv pip sync --require-hashes``
installs exactly what was locked or fails.

Choices (and why):

* One lock per stack and platform, not ``--universal``: a stack is one torch build (CPU,
  CUDA 13.0, ROCm ...) for Linux x86_64 (``--python-platform x86_64-manylinux_2_28``, the
  glibc floor of torch's wheels), and a universal resolution would have to satisfy every
  platform, which fails for builds that exist for Linux only (``torch==2.13.0+cpu`` from a
  local wheel folder) and buys nothing on a cluster.
* ``--generate-hashes --no-header``: uv's own header holds the output path and the command
  line as typed; dsenv writes its own fixed header instead (the ``dsenv lock`` command that
  regenerates the file and the package sources), so the same inputs give the same bytes.
  Annotations (``# via``) name the input by its file name only (uv runs in its folder).
* An existing lock is passed to uv as the output file, so its pins are preferred: running
  ``dsenv lock`` again changes nothing unless an input changed (``upgrade=True`` re-resolves
  everything to the newest versions).
* ``--no-config`` and no ``UV_INDEX_URL``/``UV_FIND_LINKS``/... from the environment: the
  lock depends only on what its header records.
* The file is written atomically (temporary file beside it, then rename).

A stack whose index is unreachable from here (e.g. cuda12.6 from
``https://download.pytorch.org/whl/cu126``) cannot be locked here: :func:`compile_lock`
fails with one line saying so, and ``dsenv lock --stack NAME`` must run on a machine that
reaches that index. ``dsenv provision`` does that itself for a stack with no committed lock
(:func:`lock_on_site`, on the site's login node, which reaches the index), and keeps the
lock in the environment.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from dsenv.provision import ProvisionError
from dsenv.provision.shown import Command, temporary_names
from dsenv.provision.uvcmd import (
    Sources,
    index_of,
    run_logged,
    unreachable_index,
    uv_command,
    uv_env,
    uv_error,
    uv_version,
)
from dsenv.staging import write_file_atomically

HERE = Path(__file__).resolve().parent
# Source tree and installed package alike: dsenv/provision -> dsenv/envs.
ENVS_DIR = HERE.parent / "envs"
REQUIREMENTS_DIR = ENVS_DIR / "requirements"
LOCKS_DIR = ENVS_DIR / "locks"

LINUX_X86_64 = "x86_64-manylinux_2_28"
DEFAULT_COMPILE_TIMEOUT = 900.0
LOCK_SCRATCH = "dsenv-lock-"  # the temporary folder of compile_lock


def requirements_path(stack: str) -> Path:
    """``envs/requirements/<stack>.in``."""
    return REQUIREMENTS_DIR / f"{stack}.in"


def lock_path(stack: str) -> Path:
    """``envs/locks/<stack>.txt``."""
    return LOCKS_DIR / f"{stack}.txt"


# ----------------------------------------------------------------------------- compile
def compile_lock(
    requirements: Sequence[str] | str | os.PathLike,
    out: str | os.PathLike,
    *,
    python_version: str = "3.11",
    python_platform: str | None = None,
    sources: Sources | None = None,
    constraints: Iterable[str | os.PathLike] = (),
    regenerate: str | None = None,
    upgrade: bool = False,
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_COMPILE_TIMEOUT,
    log: str | os.PathLike | None = None,
) -> Path:
    """Resolve ``requirements`` with ``uv pip compile --generate-hashes`` into the lock ``out``.

    ``requirements``: a ``.in`` file, or requirement strings (written to ``<out stem>.in`` in
    a temporary folder). ``python_platform``: uv's target platform, e.g.
    ``"x86_64-manylinux_2_28"`` (:data:`LINUX_X86_64`); None resolves for this machine.
    ``sources``: where packages come from (uv ignores pip's configuration, so pass them
    explicitly); the default is PyPI.
    ``constraints``: constraint files (``-c``). ``regenerate``: the command that rebuilds
    this lock (``dsenv lock --stack cpu``), recorded in the header. ``log``: a build log the
    uv command is appended to (``$ cd DIR && uv pip compile ...``).

    Returns ``out``. Raises :class:`ProvisionError` (one line) when an index cannot be
    reached, nothing satisfies the requirements, or uv fails.
    """
    out = Path(out).resolve()
    sources = sources or Sources()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=LOCK_SCRATCH) as scratch:
        if isinstance(requirements, (str, os.PathLike)):
            infile = Path(requirements).resolve()
            if not infile.is_file():
                raise ProvisionError(f"dsenv lock: requirements file {infile} does not exist: "
                                     f"create it (one requirement a line) or pass another")
        else:
            infile = Path(scratch) / f"{out.stem}.in"
            infile.write_text("".join(f"{line}\n" for line in requirements))
        # uv reads an existing output file as preferences: an unchanged input keeps its pins.
        draft = compiled_file(Path(scratch))
        if out.exists() and not upgrade:
            shutil.copyfile(out, draft)
        command = compile_command(infile, Path(scratch), python_version, sources,
                                  python_platform=python_platform, upgrade=upgrade,
                                  constraints=constraints)
        result = run_logged(command, timeout=timeout, env=uv_env(env, strip_sources=True),
                            log=log, names=temporary_names(scratch, LOCK_SCRATCH))
        what = f"dsenv lock {out.name}"
        if not result.ok:
            raise ProvisionError(_compile_error(result, what, sources, regenerate))
        body = draft.read_text()
    header = lock_header(infile.name, python_version, python_platform, sources,
                         constraints=[Path(c).name for c in constraints],
                         regenerate=regenerate)
    write_file_atomically(out, header + body)
    return out


def compiled_file(scratch: Path) -> Path:
    """Where ``uv pip compile`` writes the lock's body, in the compile's temporary folder."""
    return scratch / "lock.txt"


def compile_command(infile: Path, scratch: Path, python_version: str, sources: Sources, *,
                    python_platform: str | None = None, upgrade: bool = False,
                    constraints: Iterable[str | os.PathLike] = ()) -> Command:
    """The ``uv pip compile`` that :func:`compile_lock` runs in the requirements' folder
    (and the plan shows, with ``scratch`` as ``shown.temporary(LOCK_SCRATCH)``)."""
    infile = Path(infile).resolve()
    args = ["pip", "compile", infile.name, "-o", str(compiled_file(scratch)),
            "--generate-hashes", "--no-header", "--no-config", "--quiet", "--color", "never",
            "--python-version", python_version, *sources.args()]
    if python_platform:
        args += ["--python-platform", python_platform]
    if upgrade:
        args.append("--upgrade")
    for constraint in constraints:
        args += ["-c", os.path.relpath(Path(constraint).resolve(), infile.parent)]
    return uv_command(args, cwd=infile.parent)


def lock_on_site(stack: str, requirements: Path, out: Path, *, sources: Sources,
                 python_version: str, kept_as: str | None = None,
                 log: str | os.PathLike | None = None,
                 timeout: float = DEFAULT_COMPILE_TIMEOUT) -> Path:
    """``dsenv provision`` for a stack with no committed lock: its requirements resolved here
    into ``out`` with hashes, for this machine's platform and the environment's Python. The
    header's regenerate line is the ``dsenv lock`` command that makes the same file
    (``kept_as``: the file name it ends up with, when ``out`` is a draft)."""
    command = ["dsenv lock --stack", stack, "--out", kept_as or out.name]
    command += [f"--find-links {link}" for link in sources.find_links]
    if sources.index_url:
        command.append(f"--index-url {sources.index_url}")
    return compile_lock(requirements, out, python_version=python_version, sources=sources,
                        regenerate=" ".join(command), timeout=timeout, log=log)


def _compile_error(result, what: str, sources: Sources, regenerate: str | None) -> str:
    network = unreachable_index(result.stderr)
    if network:
        url, cause = network
        where = regenerate or "`dsenv lock --stack NAME`"
        if not where.startswith("`"):
            where = f"`{where}`"
        return (f"{what}: cannot reach the package index {index_of(url, sources)} ({cause}): "
                f"run {where} on a machine that reaches it (proxy: HTTPS_PROXY), or give a "
                "reachable mirror")
    return uv_error(result, what)


def lock_header(input_name: str, python_version: str, python_platform: str | None,
                sources: Sources, *, constraints: Sequence[str] = (),
                regenerate: str | None = None) -> str:
    """The fixed comment dsenv puts on top of a lock (no dates: same inputs, same bytes)."""
    lines = [
        f"# Locked by dsenv ({uv_version()} pip compile --generate-hashes); install with "
        "hashes required.",
        f"# Regenerate: {regenerate or 'dsenv lock'}",
        f"# Input: {input_name}; Python {python_version}; platform "
        f"{python_platform or 'of the machine that locked it'}",
        f"# Sources: {sources.describe()}",
    ]
    if constraints:
        lines.append(f"# Constraints: {', '.join(constraints)}")
    return "".join(f"{line}\n" for line in lines)


# ----------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class LockedRequirement:
    """One package of a lock: ``name`` normalized (PEP 503), the exact ``version``, the
    requirement as written (``torch==2.13.0+cpu``, with any marker) and its hashes."""

    name: str
    version: str
    requirement: str
    hashes: tuple[str, ...]

    def line(self) -> str:
        """The requirement with its hashes on one line, for a requirements file."""
        return " ".join([self.requirement, *(f"--hash={h}" for h in self.hashes)])


_HASH_OPTION = re.compile(r"--hash[=\s]+(\S+)")


def read_lock(text: str, source: str = "lock") -> list[LockedRequirement]:
    """Every pinned requirement of a lock's text (continuation lines joined, comments and
    options such as ``--index-url`` skipped). Raises ProvisionError for a line that is not an
    exact ``name==version`` pin, naming ``source`` and the line number."""
    entries: list[LockedRequirement] = []
    logical: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        if pending.strip():
            logical.append((start, pending.strip()))
        pending = ""
    if pending.strip():
        logical.append((start, pending.strip()))
    for number, line in logical:
        if line.startswith("-"):
            continue  # --index-url, --find-links, -c ...: sources, not packages
        hashes = tuple(_HASH_OPTION.findall(line))
        spec = _HASH_OPTION.sub("", line).strip()
        try:
            req = Requirement(spec)
        except InvalidRequirement as exc:
            raise ProvisionError(f"{source} line {number}: not a requirement ({exc}): "
                                 "regenerate the lock with `dsenv lock`") from None
        pins = [s for s in req.specifier if s.operator in ("==", "===")]
        if len(pins) != 1 or len(req.specifier) != 1 or "*" in pins[0].version:
            raise ProvisionError(f"{source} line {number}: {spec!r} is not pinned to one "
                                 "version: a lock pins every package (`dsenv lock`)")
        entries.append(LockedRequirement(canonicalize_name(req.name), pins[0].version, spec,
                                         hashes))
    return entries


def parse_lock(text: str) -> dict[str, str]:
    """``{normalized name: version}`` of every package in a lock's text."""
    return {entry.name: entry.version for entry in read_lock(text)}


def lock_sha256(path: str | os.PathLike) -> str:
    """The sha256 of the lock file's bytes (what a manifest records)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def locked_requirement(lock: str | os.PathLike, name: str) -> LockedRequirement:
    """The entry for package ``name`` in the lock file ``lock`` (e.g. deepspeed, whose line
    with hashes the ops build reinstalls)."""
    path = Path(lock)
    wanted = canonicalize_name(name)
    for entry in read_lock(path.read_text(), str(path)):
        if entry.name == wanted:
            return entry
    raise ProvisionError(f"{path}: no {name} in this lock: add it to the stack's requirements "
                         "and run `dsenv lock` again")
