"""Who can read each TORCH_CUDA_ARCH_LIST entry in the environment under test: torch's
extension builder and DeepSpeed's op builders (nvcc is the toolkit table's, :mod:`.toolkit`).

Asked, not guessed: :mod:`.arch_parsers` runs in the environment's own interpreter (it
imports torch and DeepSpeed: seconds) and the answer is kept on disk (:mod:`..cmdcache`)
until that interpreter, DeepSpeed's builder.py or torch's cpp_extension.py changes. It is
asked only when DeepSpeed is installed there and an entry is not a plain number (``8.0``,
``9.0+PTX``: the form DeepSpeed's compute_capability_args documents). Where it cannot be
asked, DeepSpeed's parser comes from envs/deepspeed_arch_lists.toml for its release.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from dsenv import proc
from dsenv.envs.arch_lists import deepspeed_parser
from dsenv.facts.cmdcache import cached_run
from dsenv.facts.node import Node, probe
from dsenv.facts.python import deepspeed_info, target_env
from dsenv.facts.toolchain import arch_parsers

PLAIN = re.compile(r"\d+\.\d+(\+PTX)?")
SCRIPT = Path(arch_parsers.__file__).read_text(encoding="utf-8")


@dataclass(frozen=True)
class ArchReaders:
    """What the readers other than nvcc make of the list."""

    how: str  # "asked" | "data" | "not asked"
    note: str  # how it was found out, or why not (evidence)
    deepspeed: str | None = None  # its version, when installed
    torch: str | None = None  # its version, when asked
    torch_rejects: dict[str, str] = field(default_factory=dict)  # entry -> torch's error
    deepspeed_rejects: dict[str, str] = field(default_factory=dict)  # entry -> its error
    where: str = ""  # the DeepSpeed line that raised (asked) or the data's source
    translated: str | None = None  # what dsenv smoke/run hand DeepSpeed instead


def plain_spelling(entries: list[str]) -> str:
    """9.0a -> 9.0, 12.0f+PTX -> 12.0+PTX (the data path's guess; asked, torch's own)."""
    return ";".join(dict.fromkeys(re.sub(r"^(\d+\.\d+)[a-z]+", r"\1", e) for e in entries))


def from_answer(answer: dict, python: str) -> ArchReaders:
    said = answer["entries"]
    ds = answer.get("deepspeed")
    return ArchReaders(
        "asked", f"asked torch {answer['torch']}" + (f" and DeepSpeed {ds}" if ds else "") +
        f" in {python}", ds, answer["torch"],
        {e: s["torch"] for e, s in said.items() if s.get("torch")},
        {e: s["deepspeed"] for e, s in said.items() if s.get("deepspeed")},
        answer.get("deepspeed_where") or "", answer.get("translated"))


def from_data(version: str, entries: list[str], why: str) -> ArchReaders:
    row = deepspeed_parser(version)
    if row is None:
        return ArchReaders("not asked", f"DeepSpeed {version} not asked ({why}) and dsenv "
                           "records no parser for this release", version)
    rejects = row.rejects(entries)
    reads = "" if row.reads else "; its JIT builds do not read the list"
    return ArchReaders(
        "data", f"DeepSpeed {version} not asked ({why}); its parser as recorded for this "
        f"release (envs/deepspeed_arch_lists.toml: {row.source}){reads}", version,
        deepspeed_rejects={e: f"not read by int() (accepted: {row.accepts})" for e in rejects},
        where=row.source, translated=plain_spelling(entries) if rejects else None)


def _watched(ds, torch_location: str | None, python: str) -> list[str]:
    files = [python, str(ds.folder / "ops" / "op_builder" / "builder.py")]
    if torch_location:
        files.append(str(Path(torch_location) / "utils" / "cpp_extension.py"))
    return files


@probe
def readers(node: Node) -> ArchReaders | None:
    """The answer for this node's TORCH_CUDA_ARCH_LIST; None when it is not set."""
    value = node.env.get(arch_parsers.VARIABLE, "")
    entries = arch_parsers.entries(value)
    if not entries:
        return None
    ds, torch = deepspeed_info.installs(node)
    env = target_env.environment(node)
    if ds is None:
        return ArchReaders("not asked", f"no DeepSpeed in {env.prefix}: its op builders are "
                           "not asked, nvcc alone is judged")
    if all(PLAIN.fullmatch(e) for e in entries):
        return ArchReaders("not asked", "every entry a plain number, the form DeepSpeed's "
                           "compute_capability_args documents", ds.version)
    python = env.python
    if python is None or not env.probed:
        return from_data(ds.version, entries, env.problem or "no interpreter to ask")
    result, _ = cached_run(node, [python, "-c", SCRIPT, value],
                           watch=_watched(ds, torch.location, python),
                           timeout=2 * node.probe_timeout)  # torch and DeepSpeed imports
    answer = proc.marked_json(result.stdout, arch_parsers.MARK) if result.ok else None
    if not isinstance(answer, dict) or "error" in answer or "entries" not in answer:
        why = answer["error"] if isinstance(answer, dict) and "error" in answer \
            else result.describe()
        return from_data(ds.version, entries, why)
    if answer.get("deepspeed_unaskable"):  # its JIT path wants a GPU: torch's answer, and data
        data = from_data(ds.version, entries, "its op builders raised "
                         f"{answer['deepspeed_unaskable']} on the list "
                         f"{arch_parsers.CONTROL} here")
        return ArchReaders(data.how, data.note, ds.version, answer["torch"],
                           from_answer(answer, python).torch_rejects, data.deepspeed_rejects,
                           data.where, data.translated)
    return from_answer(answer, python)
