"""The node's storage read by structure: a write that ran out of room (ENOSPC), read with what was
being written when it failed.

ENOSPC has one errno and many wordings: Python's ``[Errno 28] No space left on device``, Rust's
``No space left on device (os error 28)`` and ``IoError(Os { code: 28, kind: StorageFull ...``,
C's bare ``No space left on device``. The words alone name no folder (a model cache, /dev/shm,
a JIT build, the output volume, the temporary folder each fill up), so the reading takes the
cause from what the text says was writing:
- a saver's own frame just above the error (torch.save's serialization.py ``save``/``_save``,
  safetensors' ``save_file``/``serialize_file``): the checkpoint's volume is full
  (system.disk-full; YuanGongND/ast#30, bghira/SimpleTuner#2353);
- pip staging a download in its temporary folder (``Could not install packages due to an
  OSError: [Errno 28]``): the temporary folder, a small tmpfs on the node or in the container,
  is full (system.tmp-full; pterodactyl/panel#3541, easydiffusion#1649). (pip's build-isolation
  failure printed after a bare ENOSPC, INSaFLU/docker#54, is another failure line: not read.)
- an ENOSPC that names the file it wrote, and the file is in the temporary folder (/tmp/...,
  /var/tmp/...): Python's ``[Errno 28] No space left on device: '/tmp/tmpCvhVDX'`` (tempfile's
  mkdtemp; for a copy or rename the destination after ``->``), a C tool's ``sort: write failed:
  /tmp/sortSVYd6x: No space left on device``: the temporary folder is full (system.tmp-full;
  YeoLab/sailor#2 with #3, fiberseq/FIRE#59: TMPDIR pointed elsewhere). Only /tmp and /var/tmp:
  tempfile's tmpXXXXXXXX names are made in other folders too (older huggingface_hub stages a
  download as <cache>/hub/tmpXXXXXXXX: the cache's volume), and Apptainer's own temp folders
  (bundle-temp-*, rootfs-*/archive-*) are the container family's.
A bare ENOSPC with none of these stays unread.
"""

from __future__ import annotations

import re

from dsenv.doctor.explain.families import Reading, reading

FAMILY = "system"
IC = re.IGNORECASE

ENOSPC = re.compile(r"\[Errno 28\][^\n]*|No space left on device \(os error 28\)"
                    r"|IoError\(Os \{ code: 28\b[^\n]*", IC)
# A traceback frame of a saver: torch.save (zip writer or the legacy writer) and safetensors.
SAVER_FRAME = re.compile(r"(?P<file>torch[/\\]serialization\.py|safetensors[/\\]torch\.py)\"?, "
                         r"line \d+, in (?P<func>save|_save|save_file|_with_file_like)\b")
# pip's own sentence for an install that died on ENOSPC (pip >= 20.2 says OSError, older
# releases EnvironmentError).
PIP_INSTALL = re.compile(r"Could not install packages due to an? (?:OSError|EnvironmentError): "
                         r"\[Errno 28\]", IC)
# The file an ENOSPC names: Python's OSError repr (src -> dst for a copy or rename), or a path on
# the line of a C tool's "<path>: No space left on device" (sort, cp, dd, tar).
PY_NAMED = re.compile(r"\[Errno 28\] No space left on device: '(?P<path>[^'\n]+)'"
                      r"(?: -> '(?P<dst>[^'\n]+)')?", IC)
C_NAMED = re.compile(r"(?<![\w.~/-])(?P<path>/(?:var/)?tmp/[^\s:'\"`\u2019]+)[^\n]{0,40}?"
                     r": No space left on device", IC)
TEMP_FOLDER = re.compile(r"/(?:var/)?tmp(?:/|$)")
APPTAINER_TEMP = re.compile(r"(?:bundle|build|oci)-temp-|/rootfs-\d+|/archive-\d+")


def _saver(message: str, error: re.Match) -> Reading | None:
    """ENOSPC raised inside torch.save or safetensors' save_file: the frames just above it."""
    frames = list(SAVER_FRAME.finditer(message, 0, error.start()))
    if not frames or error.start() - frames[-1].end() > 400:
        return None
    last = frames[-1]
    return reading(FAMILY, "system.disk-full", error.group(0).strip(),
                   writer="torch.save" if "serialization" in last["file"] else "safetensors",
                   frame=f"{last['file']} in {last['func']}")


def _pip(message: str) -> Reading | None:
    """pip died on ENOSPC: it stages downloads, unpacked wheels and sdist builds in TMPDIR."""
    if found := PIP_INSTALL.search(message):
        return reading(FAMILY, "system.tmp-full", found.group(0), writer="pip",
                       folder="TMPDIR (default /tmp)")
    return None


def _temp_path(message: str) -> Reading | None:
    """ENOSPC naming a file it wrote in /tmp or /var/tmp: the temporary folder is full."""
    for m in PY_NAMED.finditer(message):
        path = m["dst"] or m["path"]
        if TEMP_FOLDER.match(path) and not APPTAINER_TEMP.search(path):
            return reading(FAMILY, "system.tmp-full", m.group(0), path=path,
                           folder="TMPDIR (default /tmp)")
    for m in C_NAMED.finditer(message):
        if not APPTAINER_TEMP.search(m["path"]):
            return reading(FAMILY, "system.tmp-full", m.group(0), path=m["path"],
                           folder="TMPDIR (default /tmp)")
    return None


def read(message: str) -> list[Reading]:
    if not message or not re.search(r"Errno 28|os error 28|code: 28|No space left", message, IC):
        return []
    found: list[Reading] = []
    for error in ENOSPC.finditer(message):
        if saved := _saver(message, error):
            found.append(saved)
            break
    if pip := _pip(message):
        found.append(pip)
    elif not found and (temp := _temp_path(message)):
        found.append(temp)
    return found
