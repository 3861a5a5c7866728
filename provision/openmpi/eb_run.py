"""Running eb on an :class:`~dsenv.provision.openmpi.easyconfig.OpenMpiBuild`: the easyconfig written
beside its log, eb's output into the log, and on failure no software folder or module file of
this build left behind."""

from __future__ import annotations

import os
import shlex
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

from dsenv import proc
from dsenv.provision import ProvisionError
from dsenv.provision.openmpi.easyconfig import MODULES_SUBDIR, OpenMpiBuild
from dsenv.provision.openmpi.options import table
from dsenv.provision.shown import LOG_MARK
from dsenv.redact import Redactor
from dsenv.staging import write_file_atomically


def _eb_error(log: Path) -> str:
    """The last line of eb's output that says what failed."""
    try:
        with open(log, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 65536))
            tail = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for pattern in ("ERROR:", "FAILED:", "Error:"):
        hits = [line.strip() for line in tail if pattern in line]
        if hits:
            return Redactor(os.environ).scrub(hits[-1])[:400]
    return ""


def _scaffolding(build: OpenMpiBuild) -> list[Path]:
    """The folders eb creates on the way to this build's software folder and module file,
    deepest first (installpath/software/OpenMPI, installpath/software/.locks, modules/all...)."""
    folders = {build.installpath / "software" / ".locks"}
    # eb also links the module under modules/<moduleclass>/ (modules/mpi/OpenMPI/...)
    by_class = build.installpath / MODULES_SUBDIR[0] / table()["moduleclass"] / build.module_name
    for path in (build.software_dir, build.module_files()[0], by_class):
        folders.update(p for p in path.parents if build.installpath in (p, *p.parents))
    return sorted(folders, key=lambda p: len(p.parts), reverse=True)


def run_eb(build: OpenMpiBuild, argv: list[str]) -> float:
    """Write the easyconfig, run eb into the log; on failure remove this build's leftovers
    and raise ProvisionError naming the log. Returns eb's wall time in seconds."""
    new_folders = [p for p in _scaffolding(build) if not p.exists()]
    leftovers = [p for p in (build.software_dir, *build.module_files())
                 if not (p.exists() or p.is_symlink())]
    work = build.easyconfig_path.parent
    work.mkdir(parents=True, exist_ok=True)
    write_file_atomically(build.easyconfig_path, build.easyconfig())
    # eb's console output wraps at 80 columns when it is not a terminal: wide enough that
    # its error lines stay whole in the log
    env = {**os.environ, "COLUMNS": "250", **build.eb_env()}
    command = list(build.eb_run().argv)
    build.log_path.write_text(
        f"# dsenv provision openmpi {' '.join(shlex.quote(a) for a in argv[3:])}\n"
        f"# {datetime.now(timezone.utc).isoformat(timespec='seconds')}\n"
        f"{LOG_MARK}{build.eb_run().render()}\n", encoding="utf-8")  # as the dry run shows it
    started = time.monotonic()
    result = proc.run(command, timeout=build.timeout_min * 60, env=env,
                      cwd=str(work), output=build.log_path)
    seconds = time.monotonic() - started
    if result.ok:
        return seconds
    for path in leftovers:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    for folder in new_folders:  # deepest first; the installpath keeps the dsenv/ folder
        try:
            folder.rmdir()
        except OSError:
            pass
    if result.timed_out:
        how = f"did not finish within {build.timeout_min:g} min (stopped; --timeout MIN)"
    elif result.not_found:
        how = f"could not be started ({result.stderr.strip() or 'not found'})"
    else:
        how = f"exited {result.returncode}"
    detail = _eb_error(build.log_path)
    raise ProvisionError(f"eb {how}" + (f": {detail.rstrip('.')}" if detail else "")
                         + f"; full output in {build.log_path}")


def installed_module(build: OpenMpiBuild) -> Path | None:
    return next((p for p in build.module_files() if p.is_file()), None)
