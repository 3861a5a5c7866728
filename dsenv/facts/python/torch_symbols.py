"""The C++ symbols torch exports and the ones compiled extensions ask of it, read from the files.

torch has no stable C++ ABI: an extension module (flash-attn's wheel, mmcv's ops, a JIT
build in torch_extensions) links the c10/at/torch symbols of the torch it was compiled
against, and on import the dynamic loader looks each up in this torch's libraries; one that
is gone stops the import with "undefined symbol: _ZN3c10...". Two causes give that text:
another torch release (the symbol was renamed or removed), or the other C++ string ABI
(_GLIBCXX_USE_CXX11_ABI): std::string mangles as ``NSt7__cxx1112basic_string...`` (tag
``B5cxx11``) in the new ABI and ``Ss`` in the old one; torch's pip wheels used the old ABI up
to 2.6 (2.6's CUDA 12.6 builds already the new one) and the new one from 2.7
(pytorch/pytorch#143962), conda and NGC builds the new one.

Everything is read from the ELF dynamic symbol tables (.dynsym, .dynstr, DT_NEEDED), without
importing torch or the extension: a module whose import would fail is never loaded.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.node import Node

SHT_DYNAMIC, SHT_DYNSYM = 6, 11
DT_NEEDED = 1
# torch's own namespaces (c10, at, torch, caffe2) in a mangled name, nested or not
TORCH_SYMBOL = re.compile(r"^_Z(?:TI|TV|TS)?N?[KVRO]*(?:3c10|2at|5torch|6caffe2)")
NEW_ABI = re.compile(r"__cxx11|B5cxx11")  # std::__cxx11::basic_string, the abi_tag
# the old std::string (the builtin abbreviation Ss) as a parameter or a nested name's part
OLD_ABI = re.compile(r"(?:RK|E|N|P|K)Ss")
TORCH_NEEDS = re.compile(r"^lib(?:c10|torch)(?:_\w+)?\.so")  # an extension of torch links these
# compiled modules whose DT_NEEDED is read per environment: a bound on a huge site-packages
# (a vendor image's venv holds ~800 shared objects: jax, cupy, scipy...; each read is one
# ELF header, well under a millisecond)
MAX_EXTENSIONS = 2000


class ElfError(ValueError):
    pass


@dataclass(frozen=True)
class DynamicSymbols:
    needed: tuple[str, ...]  # DT_NEEDED sonames
    defined: frozenset[str]
    undefined: frozenset[str]


def _sections(f, path) -> list[tuple]:
    """The section headers of the open 64-bit little-endian ELF file ``f``."""
    head = f.read(64)
    if head[:4] != b"\x7fELF" or len(head) < 64:
        raise ElfError(f"{path} is not an ELF file")
    if head[4] != 2 or head[5] != 1:
        raise ElfError(f"{path} is not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
    if not shoff or not shnum or shentsize < 64:
        raise ElfError(f"{path}: no section headers")
    f.seek(shoff)
    table = f.read(shnum * shentsize)
    return [struct.unpack_from("<IIQQQQII", table, i * shentsize) for i in range(shnum)
            if (i + 1) * shentsize <= len(table)]


def _read(f, section: tuple) -> bytes:
    _, _, _, _, offset, size, _, _ = section
    f.seek(offset)
    return f.read(size)


def read_dynamic(path: str | os.PathLike, symbols: bool = True) -> DynamicSymbols:
    """The dynamic symbols of a 64-bit little-endian ELF shared object: reads the headers
    and the two tables only (an extension module can be hundreds of MB); with ``symbols``
    False, DT_NEEDED only."""
    with open(path, "rb") as f:
        sections = _sections(f, path)
        needed, defined, undefined = [], set(), set()
        for index, (_, kind, _, _, _, _, link, _) in enumerate(sections):
            if kind not in (SHT_DYNAMIC, SHT_DYNSYM) or link >= len(sections) or (
                    kind == SHT_DYNSYM and not symbols):
                continue
            strings, body = _read(f, sections[link]), _read(f, sections[index])
            if kind == SHT_DYNAMIC:
                for tag, value in struct.iter_unpack("<qQ", body[:len(body) // 16 * 16]):
                    if tag == DT_NEEDED:
                        needed.append(_string(strings, value))
                continue
            for name_at, _info8, _other, shndx, _value, _size8 in struct.iter_unpack(
                    "<IBBHQQ", body[:len(body) // 24 * 24]):
                if name_at:
                    (defined if shndx else undefined).add(_string(strings, name_at))
    return DynamicSymbols(tuple(needed), frozenset(defined), frozenset(undefined))


def dynamic_names(path: str | os.PathLike) -> bytes:
    """The dynamic symbol table's string table, NUL-separated names as in the file (a library
    of torch's names there only symbols torch defines, or takes from another of its own)."""
    with open(path, "rb") as f:
        sections = _sections(f, path)
        for _, kind, _, _, _, _, link, _ in sections:
            if kind == SHT_DYNSYM and link < len(sections):
                return b"\0" + _read(f, sections[link]) + b"\0"
    return b""


def _string(strings: bytes, at: int) -> str:
    end = strings.find(b"\0", at)
    return strings[at:end if end >= 0 else len(strings)].decode("ascii", "replace")


def abi_of(symbol: str) -> str:
    """'new', 'old' or '' (the symbol carries no std::string)."""
    if NEW_ABI.search(symbol):
        return "new"
    return "old" if OLD_ABI.search(symbol) else ""


@dataclass(frozen=True)
class TorchExports:
    lib_dir: Path
    names: bytes  # the dynamic string tables of torch's libraries, each name NUL-delimited
    libraries: int  # how many were read
    abi: str  # 'new' / 'old': the string ABI torch's own c10 symbols use; '' unknown
    unread: tuple[str, ...] = ()  # libraries that could not be read, with why

    def defines(self, symbol: str) -> bool:
        """Whether torch's libraries hold ``symbol``: a name in their tables is one torch
        defines (what one of its libraries takes from another is defined there); a search of
        the tables as bytes, where a set of 80,000 decoded names costs ten times as much."""
        return self.names.find(b"\0" + symbol.encode() + b"\0") >= 0


# a c10 symbol taking a std::string, in either form, in the tables as bytes
C10_NEW_ABI = re.compile(rb"\0_ZN3c10[^\0]*(?:__cxx11|B5cxx11)")
C10_OLD_ABI = re.compile(rb"\0_ZN3c10[^\0]*(?:RK|E|N|P|K)Ss")


def torch_exports(node: Node, lib_dir: Path, prefix_lib: Path | None = None) -> TorchExports:
    """The names torch's libraries hold: those in torch/lib, and (conda's pytorch keeps
    libtorch*.so and libc10*.so in the environment's lib folder) those in ``prefix_lib``;
    memoized per folder."""
    def read() -> TorchExports:
        tables, unread = [], []
        paths = sorted(Path(lib_dir).glob("lib*.so*"))
        if prefix_lib is not None:
            paths += sorted(p for p in Path(prefix_lib).glob("lib*.so*")
                            if TORCH_NEEDS.match(p.name))
        for path in paths:
            try:
                tables.append(dynamic_names(path))
            except (OSError, ElfError, struct.error) as exc:
                unread.append(f"{path.name}: {exc}")
        names = b"".join(tables)
        abi = "new" if C10_NEW_ABI.search(names) else "old" if C10_OLD_ABI.search(names) else ""
        return TorchExports(Path(lib_dir), names, len(tables), abi, tuple(unread))

    return node.memo(f"{__name__}.torch_exports:{lib_dir}:{prefix_lib}", read)


@dataclass(frozen=True)
class Extension:
    path: Path
    missing: tuple[str, ...]  # torch symbols it asks for that torch does not define
    abi: str  # the string ABI its torch symbols ask for ('' none carries a string)


def _is_shared_object(name: str) -> bool:
    return name.endswith(".so") or ".so." in name


def _recorded(site: Path, skip: tuple[str, ...]) -> dict[Path, str] | None:
    """The shared objects the installed distributions' RECORD files list, each with its
    distribution's name (reading ~200 small files, where walking site-packages stats every
    file: seconds on a network file system); None when no distribution has a RECORD."""
    found, records = {}, 0
    try:
        entries = list(os.scandir(site))
    except OSError:
        return None
    for entry in entries:
        if not entry.name.endswith(".dist-info"):
            continue
        try:
            text = Path(entry.path, "RECORD").read_text(errors="replace")
        except OSError:
            continue
        records += 1
        if ".so" not in text:  # most distributions are pure Python
            continue
        distribution = entry.name[:-len(".dist-info")].split("-")[0]
        for line in text.splitlines():
            name = line.rsplit(",", 2)[0]
            parts = name.split("/")
            if _is_shared_object(parts[-1]) and ".." not in parts and parts[0] not in skip:
                found[site / name] = distribution
    return found if records else None


def _walked(folder: Path, skip: tuple[str, ...] = ()) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder):
        if root == str(folder):
            dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".dist-info")]
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found += [Path(root) / name for name in files if _is_shared_object(name)]
    return found


@dataclass(frozen=True)
class ExtensionScan:
    files: list[Path]  # compiled modules that link torch's libraries
    owners: dict[Path, str]  # module -> the distribution whose RECORD lists it
    left_out: int  # files not read past MAX_EXTENSIONS


def torch_extensions(site: Path, jit_root: Path | None, skip: tuple[str, ...] = ()
                     ) -> ExtensionScan:
    """Compiled modules that link torch's libraries (DT_NEEDED libc10.so or libtorch*.so):
    those the distributions in ``site`` installed (the folder walked where none has a
    RECORD), skipping top-level folders named in ``skip``, and the JIT builds under
    ``jit_root``."""
    owners = _recorded(site, skip)
    # the JIT builds first: few, and the likeliest to be stale (a torch upgrade leaves them
    # in place); the bound must never leave them out behind a large site-packages
    candidates = _walked(jit_root) if jit_root is not None and jit_root.is_dir() else []
    candidates += list(owners) if owners is not None else _walked(site, skip)
    found = []
    for path in candidates[:MAX_EXTENSIONS]:
        try:
            needed = read_dynamic(path, symbols=False).needed
        except (OSError, ElfError, struct.error):
            continue
        if any(TORCH_NEEDS.match(n) for n in needed):
            found.append(path)
    return ExtensionScan(found, owners or {}, max(0, len(candidates) - MAX_EXTENSIONS))


def judge_extension(path: Path, torch: TorchExports) -> Extension:
    """The torch symbols ``path`` asks for that neither torch nor a library of its own package
    (a DT_NEEDED found beside it or in a lib/ folder there: libtorchaudio.so for torchaudio's
    _torchaudio.so) defines."""
    module = read_dynamic(path)
    asked = [s for s in module.undefined if TORCH_SYMBOL.match(s) and not torch.defines(s)]
    if asked:
        own: set[str] = set()
        for name in module.needed:
            for folder in (path.parent, path.parent / "lib", path.parent.parent / "lib"):
                if not TORCH_NEEDS.match(name) and (folder / name).is_file():
                    try:
                        own |= read_dynamic(folder / name).defined
                    except (OSError, ElfError, struct.error):
                        pass
                    break
        asked = [s for s in asked if s not in own]
    shapes = {abi_of(s) for s in module.undefined if TORCH_SYMBOL.match(s)} - {""}
    abi = shapes.pop() if len(shapes) == 1 else ""
    return Extension(path, tuple(sorted(asked)), abi)
