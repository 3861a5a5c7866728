"""A local conda channel for tests: tiny packages built here, indexed by rattler, served on
127.0.0.1, plus a micromamba-compatible command (tests/harness/condashim.py) so the real
conda-lock can lock against it. Nothing here reaches a conda channel on the internet.

    channel = tmp_path / "channel"
    build_package(channel, "hello", "1.0", files={"share/hello.txt": "hi\\n"})
    index_channel(channel)
    with serve(channel) as url:            # http://127.0.0.1:PORT
        ...
    bindir = write_micromamba_shim(tmp_path / "bin")
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
import tarfile
import threading
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dsenv.proc import run

HERE = Path(__file__).resolve().parent
SHIM = HERE / "condashim.py"
PLACEHOLDER = "/opt/anaconda1anaconda2anaconda3"
# A fixed mtime keeps the archives (and so their hashes) the same from run to run.
MTIME = 1_700_000_000


def _tar_bytes(members: Sequence[tuple[str, bytes | None, str | None]], mode: str) -> bytes:
    """A tar archive of (name, data, symlink target) members, compressed per ``mode``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, data, link in sorted(members, key=lambda m: m[0]):
            info = tarfile.TarInfo(name)
            info.mtime = MTIME
            if link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = link
                tar.addfile(info)
            else:
                info.size = len(data)
                info.mode = 0o755 if name.startswith("bin/") else 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zstd_tar(members: Sequence[tuple[str, bytes | None, str | None]]) -> bytes:
    import zstandard  # a conda-lock requirement, so it is here whenever conda-lock is

    return zstandard.ZstdCompressor(level=3).compress(_tar_bytes(members, "w"))


def build_package(
    channel: Path,
    name: str,
    version: str,
    *,
    build_number: int = 0,
    depends: Sequence[str] = (),
    files: Mapping[str, str | bytes] | None = None,
    prefix_files: Mapping[str, str] | None = None,
    symlinks: Mapping[str, str] | None = None,
    subdir: str = "noarch",
    noarch: str = "generic",
    entry_points: Sequence[str] = (),
    fmt: str = "tar.bz2",
) -> Path:
    """Write ``NAME-VERSION-BUILD.{tar.bz2,conda}`` into ``channel/subdir`` and return it.

    ``files`` are copied as they are; ``prefix_files`` are text files whose
    ``/opt/anaconda1anaconda2anaconda3`` the installer replaces with the environment's prefix;
    ``symlinks`` map a path to its link target. ``noarch="python"`` packages keep their
    modules under ``site-packages/`` and may declare ``entry_points`` ("cmd = module:func"),
    which the installer turns into scripts in ``bin/``.
    """
    files, prefix_files, symlinks = dict(files or {}), dict(prefix_files or {}), dict(symlinks or {})
    build = f"{'h0' if subdir == 'noarch' else 'h1'}_{build_number}"
    index = {
        "name": name, "version": version, "build": build, "build_number": build_number,
        "depends": list(depends), "license": "MIT", "subdir": subdir, "timestamp": MTIME * 1000,
    }
    if subdir == "noarch":
        index["noarch"] = noarch
    else:
        index.update(arch=subdir.split("-")[-1].replace("64", "x86_64"), platform="linux")
    payload: list[tuple[str, bytes | None, str | None]] = []
    paths = []
    for path, content in {**files, **prefix_files}.items():
        data = content.encode() if isinstance(content, str) else content
        payload.append((path, data, None))
        entry = {"_path": path, "path_type": "hardlink",
                 "sha256": hashlib.sha256(data).hexdigest(), "size_in_bytes": len(data)}
        if path in prefix_files:
            entry.update(file_mode="text", prefix_placeholder=PLACEHOLDER)
        paths.append(entry)
    for path, target in symlinks.items():
        payload.append((path, None, target))
        paths.append({"_path": path, "path_type": "softlink",
                      "sha256": hashlib.sha256(target.encode()).hexdigest(), "size_in_bytes": 0})
    paths.sort(key=lambda e: e["_path"])
    has_prefix = "".join(f"{PLACEHOLDER} text {p}\n" for p in sorted(prefix_files))
    info = [
        ("info/index.json", json.dumps(index, indent=2, sort_keys=True).encode(), None),
        ("info/paths.json", json.dumps({"paths": paths, "paths_version": 1}, indent=2).encode(),
         None),
        ("info/files", "".join(f"{e['_path']}\n" for e in paths).encode(), None),
    ]
    if has_prefix:
        info.append(("info/has_prefix", has_prefix.encode(), None))
    if noarch == "python":
        link = {"noarch": {"type": "python", "entry_points": list(entry_points)},
                "package_metadata_version": 1}
        info.append(("info/link.json", json.dumps(link, indent=2).encode(), None))
    stem = f"{name}-{version}-{build}"
    out_dir = Path(channel) / subdir
    out_dir.mkdir(parents=True, exist_ok=True)
    for other in ("noarch", "linux-64"):  # a channel needs noarch even when it is empty
        (Path(channel) / other).mkdir(exist_ok=True)
    if fmt == "tar.bz2":
        out = out_dir / f"{stem}.tar.bz2"
        out.write_bytes(_tar_bytes(info + payload, "w:bz2"))
    elif fmt == "conda":
        out = out_dir / f"{stem}.conda"
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
            def add(arcname: str, data: bytes) -> None:
                zinfo = zipfile.ZipInfo(arcname, date_time=(2023, 11, 14, 22, 13, 20))
                zf.writestr(zinfo, data)
            add("metadata.json", json.dumps({"conda_pkg_format_version": 2}).encode())
            add(f"pkg-{stem}.tar.zst", _zstd_tar(payload))
            add(f"info-{stem}.tar.zst", _zstd_tar(info))
        out.write_bytes(buf.getvalue())
    else:
        raise ValueError(f"unknown package format {fmt!r}")
    return out


def build_python_package(channel: Path, version: str | None = None) -> Path:
    """A ``python`` package (linux-64) that makes the prefix a working venv of this
    interpreter: ``bin/python`` links to the real one and ``pyvenv.cfg`` names its home, so
    ``PREFIX/bin/python`` runs with ``sys.prefix == PREFIX`` and pip packages land in the
    prefix. conda-lock needs a ``python`` conda package before it solves a pip section."""
    base = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    version = version or "{}.{}.{}".format(*sys.version_info[:3])
    cfg = (f"home = {base.parent}\ninclude-system-site-packages = false\n"
           f"version = {version}\n")
    return build_package(channel, "python", version, subdir="linux-64",
                         files={"pyvenv.cfg": cfg},
                         symlinks={"bin/python": str(base),
                                   f"bin/python{sys.version_info[0]}.{sys.version_info[1]}":
                                   "python"})


_INDEX = """
import asyncio, os, sys, traceback
try:
    from rattler.index import index_fs
    asyncio.run(index_fs(sys.argv[1], write_zst=False, write_shards=False, force=True))
    code = 0
except BaseException:
    traceback.print_exc()
    code = 1
sys.stdout.flush(); sys.stderr.flush()
os._exit(code)
"""


def index_channel(channel: Path, timeout: float = 60) -> None:
    """Write repodata.json for every subdir with rattler (in a subprocess: rattler's
    interpreter sometimes crashes at exit)."""
    result = run([sys.executable, "-c", _INDEX, str(channel)], timeout=timeout)
    if not result.ok:
        raise RuntimeError(f"indexing {channel} failed: {result.describe()}\n{result.stderr}")


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` over HTTP on 127.0.0.1 (a free port); yields the base URL."""
    handler = partial(_QuietHandler, directory=str(directory))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def write_micromamba_shim(bindir: Path) -> Path:
    """Put an executable ``micromamba`` (tests/harness/condashim.py under this interpreter) in
    ``bindir`` and return ``bindir``."""
    bindir = Path(bindir)
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / "micromamba"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SHIM}" "$@"\n')
    exe.chmod(0o755)
    return bindir


def simple_index(root: Path, wheels: Sequence[Path]) -> Path:
    """A PEP 503 simple index under ``root/simple`` for ``wheels`` (each link carries its
    sha256, as PyPI's do); returns ``root``."""
    by_project: dict[str, list[Path]] = {}
    for wheel in wheels:
        project = wheel.name.split("-")[0].lower().replace("_", "-")
        by_project.setdefault(project, []).append(wheel)
    simple = Path(root) / "simple"
    for project, project_wheels in by_project.items():
        folder = simple / project
        folder.mkdir(parents=True, exist_ok=True)
        links = []
        for wheel in project_wheels:
            target = Path(root) / "files" / wheel.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(wheel.read_bytes())
            digest = hashlib.sha256(target.read_bytes()).hexdigest()
            links.append(f'<a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a>')
        (folder / "index.html").write_text(
            "<!DOCTYPE html><html><body>\n" + "<br/>\n".join(links) + "\n</body></html>\n")
    (simple / "index.html").write_text(
        "<!DOCTYPE html><html><body>\n"
        + "".join(f'<a href="{p}/">{p}</a>\n' for p in sorted(by_project))
        + "</body></html>\n")
    return Path(root)


def build_wheel(out_dir: Path, name: str, version: str, module_text: str,
                requires: Sequence[str] = (), scripts: Mapping[str, str] | None = None) -> Path:
    """A pure-Python wheel ``NAME-VERSION-py3-none-any.whl`` with one module (and console
    scripts ``{"cmd": "module:func"}``), built by hand: no build backend, no network."""
    dist = name.replace("-", "_")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{dist}-{version}-py3-none-any.whl"
    distinfo = f"{dist}-{version}.dist-info"
    metadata = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                + "".join(f"Requires-Dist: {r}\n" for r in requires))
    members = {
        f"{dist}.py": module_text.encode(),
        f"{distinfo}/METADATA": metadata.encode(),
        f"{distinfo}/WHEEL": b"Wheel-Version: 1.0\nGenerator: dsenv-tests\n"
                             b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if scripts:
        members[f"{distinfo}/entry_points.txt"] = (
            "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
        ).encode()
    record_lines = []
    for arcname, data in members.items():
        import base64
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{arcname},sha256={digest},{len(data)}")
    record_lines.append(f"{distinfo}/RECORD,,")
    members[f"{distinfo}/RECORD"] = ("\n".join(record_lines) + "\n").encode()
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in members.items():
            zf.writestr(zipfile.ZipInfo(arcname, date_time=(2023, 11, 14, 22, 13, 20)), data)
    return wheel
