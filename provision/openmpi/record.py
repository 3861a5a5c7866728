"""A built Open MPI recorded in an environment made by ``dsenv provision``: the lines that load
its module go into the environment's activate script (one block, replaced on every record), into
its modulefile when it has one (``dsenv provision --modulefile``: MODULEPATH and ``depends_on``
the module) and its description into the manifest (``openmpi_module``)."""

from __future__ import annotations

import re
import shlex
from datetime import datetime, timezone
from pathlib import Path

from dsenv.jsonfiles import JsonFileError, read_json, write_json_atomically
from dsenv.provision import ProvisionError
from dsenv.provision.openmpi.easyconfig import OpenMpiBuild
from dsenv.provision.record import modulefile
from dsenv.provision.record.activation import ACTIVATE_NAME
from dsenv.provision.record.manifest import manifest_path, redact_command
from dsenv.staging import write_file_atomically

BLOCK_BEGIN = "# >>> dsenv provision openmpi >>>"
BLOCK_END = "# <<< dsenv provision openmpi <<<"
MANIFEST_KEY = "openmpi_module"


def module_block(build: OpenMpiBuild) -> str:
    """The activate script's lines that load the module (replaced on every record)."""
    module_use, module_load = build.module_lines()
    lines = [BLOCK_BEGIN,
             f"# Open MPI for Slurm + PMIx built by EasyBuild (`dsenv provision openmpi`): "
             f"{build.module_name}.",
             "# Batch shells started without a login profile have no `module`: Lmod's own "
             "init defines it."]
    init = build.modules_tool.init if build.modules_tool else None
    if init:
        quoted = shlex.quote(str(init))
        lines += ["if ! command -v module >/dev/null 2>&1 && [ -r " + quoted + " ]; then",
                  f"    . {quoted} >/dev/null",
                  "fi"]
    shown = module_load.replace("'", "")
    lines += ["if command -v module >/dev/null 2>&1; then",
              f"    {module_use}",
              f"    {module_load} || echo \"dsenv activate: \\`{shown}\\` failed\" >&2",
              "else",
              f"    echo \"dsenv activate: no module command: {build.module_name} not "
              "loaded\" >&2",
              "fi",
              BLOCK_END]
    return "\n".join(lines) + "\n"


def with_block(text: str, block: str) -> str:
    """``text`` with its dsenv openmpi block replaced by ``block`` (appended when absent)."""
    pattern = re.compile(re.escape(BLOCK_BEGIN) + r".*?" + re.escape(BLOCK_END) + r"\n?",
                         re.DOTALL)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    return text.rstrip("\n") + "\n\n" + block


def record_in_env(build: OpenMpiBuild, verdict, argv: list[str]) -> None:
    """The module lines into <env>/activate and <env>/dsenv-env.json, each written to a
    temporary file and renamed into place."""
    prefix = build.env_prefix
    activate = prefix / ACTIVATE_NAME
    try:
        manifest = read_json(manifest_path(prefix), "environment manifest")
    except JsonFileError as exc:
        raise ProvisionError(str(exc)) from None
    if not isinstance(manifest, dict):
        raise ProvisionError(f"{manifest_path(prefix)}: not a dsenv manifest (not an object)")
    manifest[MANIFEST_KEY] = {
        "module": build.module_name, "modulepath": str(build.modulepath),
        "easyconfig": str(build.easyconfig_path), "software": str(build.software_dir),
        "toolchain": build.toolchain.describe(), "pmix": build.pmix.describe(),
        "ompi_support": f"{verdict.status.value}: {verdict.summary}",
        "command": redact_command(list(argv)),
        "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    text = with_block(activate.read_text(encoding="utf-8"), module_block(build))
    modulefile = _modulefile_text(manifest, manifest[MANIFEST_KEY])
    write_json_atomically(manifest_path(prefix), manifest, indent=2)
    write_file_atomically(activate, text, mode=activate.stat().st_mode & 0o777)
    if modulefile:
        write_file_atomically(*modulefile)


def _modulefile_text(manifest: dict, record: dict) -> tuple[Path, str] | None:
    """The environment's modulefile (``dsenv provision --modulefile``) with its Open MPI
    block: MODULEPATH and ``depends_on`` the module; None when it has none."""
    path = Path((manifest.get(modulefile.MANIFEST_KEY) or {}).get("path") or "")
    if not path.name or not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    return path, modulefile.with_block(text, modulefile.openmpi_block(record))
