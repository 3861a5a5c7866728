"""Which GPU architectures a shared object carries device code for, read from its fatbinary.

nvcc embeds the device code of a host object in the ELF section ``.nv_fatbin``: one or more
fatbinary containers (magic ``0xBA55ED50``), each a list of entries: SASS as a CUDA ELF for
one real architecture (``sm_80``), or PTX for one virtual architecture (``compute_90``),
which the driver JIT-compiles for newer GPUs. ``cuobjdump --list-elf`` / ``--list-ptx`` list
the same entries; reading the headers here needs no toolkit (a login node, the doctor), no
subprocess, and takes milliseconds even for torch's libtorch_cuda.so (entry headers only).

Layout (fatbinary.h of the CUDA toolkit, ``fatBinaryHeader``; entry headers as cuobjdump
reads them): container header ``<IHHQ`` magic, version, header size, payload size; entry
header ``<HHIQ II HH I ...`` kind (1 PTX, 2 ELF), version, header size, padded payload size,
compressed size, unknown, minor, major, arch (``80`` for sm_80). A GPU runs a kernel image
when an ELF of its own major and a lower or equal minor is present (sm_86 runs sm_80), or
PTX of a lower or equal architecture (JIT at load time).

Used by ``dsenv provision`` (each built op must hold exactly the requested archs) and by
the doctor (a visible GPU missing from an op: "no kernel image is available for execution
on the device" before the job starts).
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
SECTION = ".nv_fatbin"
KIND_PTX, KIND_ELF = 1, 2
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHI")


class FatbinError(ValueError):
    """Not an ELF shared object, or a fatbinary section that cannot be read."""


@dataclass(frozen=True)
class DeviceCode:
    """What one shared object holds: real archs with SASS and virtual archs with PTX,
    both as compute capabilities ("8.0", "9.0")."""

    path: str
    elf: tuple[str, ...] = ()
    ptx: tuple[str, ...] = ()
    entries: int = 0  # fatbinary entries read (one arch may appear in several containers)
    notes: tuple[str, ...] = field(default=())
    # ELF entries per real arch, (("8.0", 444), ...): a library built for an arch holds
    # hundreds; a handful of special kernels (sm_89, sm_103 in torch 2.11's) are not a build
    elf_counts: tuple[tuple[str, int], ...] = field(default=(), compare=False)

    @property
    def sm(self) -> list[str]:
        """``["sm_80", "sm_90"]``: the real architectures, cuobjdump's spelling."""
        return [sm(a) for a in self.elf]

    def runs_on(self, arch: str) -> str | None:
        """How a GPU of compute capability ``arch`` runs this code: "sm_80" (SASS of the same
        major, lower or equal minor), "compute_90 (PTX JIT)", or None (no kernel image)."""
        want = _capability(arch)
        same_major = [a for a in self.elf if _capability(a)[0] == want[0]
                      and _capability(a) <= want]
        if same_major:
            return sm(max(same_major, key=_capability))
        below = [a for a in self.ptx if _capability(a) <= want]
        if below:
            return f"compute_{_digits(max(below, key=_capability))} (PTX JIT)"
        return None

    def describe(self) -> str:
        text = ", ".join(self.sm) or "no SASS"
        if self.ptx:
            text += " + PTX " + ", ".join(f"compute_{_digits(a)}" for a in self.ptx)
        return text

    def to_json(self) -> dict:
        return {"elf": list(self.elf), "ptx": list(self.ptx)}

    def built_for(self, min_share: float = 0.25) -> list[str]:
        """The arch list the library was built for, as torch.cuda.get_arch_list() spells it
        (``["sm_80", "sm_90", "compute_90"]``): real archs holding at least ``min_share`` of
        the entries of the best-covered one (all of them when counts are unknown), then PTX.
        Recorded on torch 2.11.0+cu130's libtorch_cuda.so: ~444 entries each for its list's
        six archs, 59 for sm_103, 1 for sm_89 and sm_121, which its list does not name."""
        counts = dict(self.elf_counts)
        most = max(counts.values(), default=0)
        real = [a for a in self.elf if not counts or counts.get(a, 0) >= min_share * most]
        return [sm(a) for a in real] + [f"compute_{_digits(a)}" for a in self.ptx]


def sm(arch: str) -> str:
    """"8.0" -> "sm_80"."""
    return f"sm_{_digits(arch)}"


def _digits(arch: str) -> str:
    major, minor = _capability(arch)
    return f"{major}{minor}"


def _capability(arch: str) -> tuple[int, int]:
    text = str(arch).strip().lower().removeprefix("sm_").removeprefix("compute_")
    if "." in text:
        major, minor = text.split(".", 1)
        return int(major), int(minor.rstrip("af") or 0)
    text = text.rstrip("af")  # sm_90a, sm_100f: arch-specific variants of 9.0, 10.0
    return int(text[:-1]), int(text[-1])


def arch_of(number: int) -> str:
    """The entry header's arch number (80, 90, 100, 120) -> "8.0", "10.0"."""
    return f"{number // 10}.{number % 10}"


def _section(data, path: str) -> tuple[int, int] | None:
    """(offset, size) of ``.nv_fatbin`` in a 64-bit little-endian ELF, None when absent."""
    if data[:4] != b"\x7fELF":
        raise FatbinError(f"{path} is not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise FatbinError(f"{path} is not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shnum == 0 or shoff + shnum * shentsize > len(data):
        raise FatbinError(f"{path}: no ELF section headers (stripped or truncated)")

    def header(index: int) -> tuple[int, int, int]:
        base = shoff + index * shentsize
        name, = struct.unpack_from("<I", data, base)
        offset, size = struct.unpack_from("<QQ", data, base + 0x18)
        return name, offset, size

    _, names_at, names_size = header(shstrndx)
    wanted = SECTION.encode() + b"\0"
    for index in range(shnum):
        name, offset, size = header(index)
        if data[names_at + name:names_at + name + len(wanted)] == wanted:
            return offset, size
    return None


def read_device_code(path: str | os.PathLike) -> DeviceCode:
    """The archs a shared object (or executable) holds device code for. FatbinError when it
    cannot be read; a DeviceCode with no archs when it has no ``.nv_fatbin`` (a CPU op)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < 64:
                raise FatbinError(f"{path} is not an ELF file ({size} bytes)")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _read(data, path)
    except OSError as exc:
        raise FatbinError(f"cannot read {path}: {exc.strerror or exc}") from None


def _read(data, path: str) -> DeviceCode:
    found = _section(data, path)
    if found is None:
        return DeviceCode(path, notes=(f"no {SECTION} section",))
    start, size = found
    end = start + size
    elf: dict[str, int] = {}
    ptx: set[str] = set()
    entries = 0
    at = start
    while at + _CONTAINER.size <= end:
        magic, _version, header_size, payload = _CONTAINER.unpack_from(data, at)
        if magic != FATBIN_MAGIC:
            at += 8  # containers are 8-byte aligned; padding between them
            continue
        entry = at + header_size
        stop = min(entry + payload, end)
        while entry + _ENTRY.size <= stop:
            kind, _v, entry_header, entry_size, _c, _u, _minor, _major, arch = \
                _ENTRY.unpack_from(data, entry)
            if entry_header < _ENTRY.size:
                raise FatbinError(f"{path}: fatbinary entry at {entry:#x} has a "
                                  f"{entry_header}-byte header")
            if kind == KIND_ELF:
                elf[arch_of(arch)] = elf.get(arch_of(arch), 0) + 1
            elif kind == KIND_PTX:
                ptx.add(arch_of(arch))
            entries += 1
            entry += entry_header + entry_size
        at = max(stop, at + 8)
    order = _capability
    real = tuple(sorted(elf, key=order))
    return DeviceCode(path, real, tuple(sorted(ptx, key=order)), entries,
                      elf_counts=tuple((a, elf[a]) for a in real))


def compare(code: DeviceCode, requested: list[str] | tuple[str, ...]) -> tuple[list[str],
                                                                             list[str]]:
    """(missing, unexpected) real archs of ``code`` against the requested ones."""
    wanted = {_capability(a) for a in requested}
    have = {_capability(a) for a in code.elf}
    missing = [arch_of(m * 10 + n) for m, n in sorted(wanted - have)]
    extra = [arch_of(m * 10 + n) for m, n in sorted(have - wanted)]
    return missing, extra


def parse_cuobjdump(text: str, path: str = "") -> DeviceCode:
    """``cuobjdump --list-elf --list-ptx`` output -> DeviceCode ("ELF file 1: x.1.sm_80.cubin",
    "PTX file 1: x.1.sm_90.ptx"), to compare with :func:`read_device_code`."""
    elf: set[str] = set()
    ptx: set[str] = set()
    entries = 0
    for line in text.splitlines():
        match = _LISTED.match(line.strip())
        if match:
            entries += 1
            arch = arch_of(int(match.group(2)))
            (elf if match.group(1) == "ELF" else ptx).add(arch)
    return DeviceCode(path, tuple(sorted(elf, key=_capability)),
                      tuple(sorted(ptx, key=_capability)), entries)


_LISTED = re.compile(r"^(ELF|PTX) file\s+\d+:\s*\S*?\.sm_(\d+)[af]?\.(?:cubin|ptx)$")


def op_libraries(package_dir: str | os.PathLike,
                 modules: dict[str, str] | None = None) -> dict[str, Path]:
    """{op name: shared object} of the ops precompiled into an installed deepspeed package
    (``deepspeed/ops/adam/fused_adam_op.cpython-311-x86_64-linux-gnu.so`` -> fused_adam):
    DeepSpeed's setup.py names most extensions ``<op NAME>_op`` under deepspeed/ops.
    ``modules`` ({op: its builder's absolute_name()}) finds the others, such as the
    inference v2 ops (``deepspeed.inference.v2.ragged_ops``)."""
    found = {}
    package = Path(package_dir)
    for library in sorted((package / "ops").rglob("*.so")):
        stem = library.name.split(".", 1)[0]
        if stem.endswith("_op"):
            found[stem[:-3]] = library
    for op, module in (modules or {}).items():
        head, _, name = module.rpartition(".")
        if op in found or not name or head.split(".")[0] != package.name:
            continue
        folder = package.parent.joinpath(*head.split("."))
        match = sorted(folder.glob(f"{name}.*.so")) if folder.is_dir() else []
        if match:
            found[op] = match[0]
    return found


def unable(code_by_op: dict[str, dict], arch: str) -> list[str]:
    """The ops (from a manifest's per-op ``{"elf": [...], "ptx": [...]}`` records) that hold
    no kernel image a GPU of ``arch`` can run."""
    missing = []
    for op, record in sorted(code_by_op.items()):
        code = DeviceCode(op, tuple(record.get("elf") or ()), tuple(record.get("ptx") or ()))
        if not code.elf and not code.ptx:
            continue  # a CPU op
        if code.runs_on(arch) is None:
            missing.append(op)
    return missing
