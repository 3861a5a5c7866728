"""Which cause a failure line names, by all its evidence.

Each catalogue mode and each family parser's finding gets a score for one failure line:

- the message: a catalogue pattern found in the line weighs 3, a generic one (evidence.toml:
  "No space left on device", "Bus error", "NCCL_IB_GID_INDEX" ...) 1; a family parser that
  reads the line's structure (loader.py) weighs 4 when the library is in its table (just the
  bar when the table says failing to load it is usually harmless) and 2.5, under the bar, when
  it is not: a library dsenv does not know is what failed, not why (the reading is shown
  with "no known cause", and --here still looks for the library);
  a family parser (families/) that reads the line's parts and names a mode weighs 4.5;
- the component that printed the line (NCCL, torch.distributed, Slurm, the dynamic loader...):
  +1 when the mode belongs to that component's areas; -2 when it does not and the component
  is one whose lines say who failed (NCCL, the loader, Slurm, MPI, the Hub client; a mention
  of DeepSpeed or torch.distributed says little about where the fault is);
- the surrounding lines: +0.5 a pattern, at most +1, and only when the message itself has
  evidence (a pattern seen only in the context never names a cause); a mode's `also`
  evidence there +1.5 once, when a pattern of the mode is in the message;
- evidence.toml's per-mode evidence for and against (NCCL's /dev/shm is not a home quota).

A cause is named when its score reaches BAR (3): at least one specific pattern in the
message, or a generic one that the component and the context agree with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache

from dsenv.data import load_table
from dsenv.doctor import catalogue
from dsenv.doctor.explain import families, loader
from dsenv.doctor.explain.loader_words import LINK

BAR = 3.0
SPECIFIC, GENERIC, STRUCTURE = 3.0, 1.0, 3.5
UNKNOWN_LIBRARY = 2.5
FLAGS = re.IGNORECASE | re.MULTILINE

# Who printed a line, and the catalogue areas that component's failures belong to.
COMPONENTS = (
    ("nccl", re.compile(r"NCCL (?:WARN|INFO)|RCCL|\bnccl[A-Z]\w*|NCCL error|/dev/shm/nccl"),
     {"comm", "system", "container", "gpu", "launch", "rocm"}),
    ("loader", re.compile(r"cannot open shared object|error while loading shared libraries"
                          r"|undefined symbol|version [`'][\w.]+' not found|" + LINK.pattern
                          + r"|collect2|\bld: ", re.I),
     {"toolkit", "torch", "comm", "deepspeed", "gpu", "container", "mpi", "system", "loader",
      "rocm", "env"}),
    ("slurm", re.compile(r"^(?:srun|slurmstepd|sbatch|salloc): ", re.M),
     {"job", "mpi", "launch", "system", "container", "slurm", "gpu"}),
    ("mpi", re.compile(r"mpirun|mpiexec|prterun|\bPRTE\b|\bORTE\b|\bOMPI\b|PMIx|\bMPI_\w+"),
     {"mpi", "launch", "slurm"}),
    ("torch.distributed", re.compile(r"torch\.distributed|c10d|DistNetworkError|ProcessGroup"
                                     r"|TCPStore|rendezvous|MASTER_ADDR|MASTER_PORT"),
     {"launch", "comm"}),
    ("huggingface", re.compile(r"huggingface|hf_hub|HF_HUB|datasets/|transformers/"),
     {"cache", "job", "hf", "env", "system"}),
    ("deepspeed", re.compile(r"deepspeed|op_builder|ds_accelerator|DS_BUILD", re.I),
     {"deepspeed", "toolkit", "job", "launch", "torch", "gpu", "cache", "env"}),
)


STRICT = {"nccl", "loader", "slurm", "mpi", "huggingface"}


# A launcher reporting how a rank died ("mpirun noticed that process rank 1 ... exited on
# signal 4 (Illegal instruction)") speaks for the process, not for itself.
_RANK_DIED = re.compile(r"noticed that process rank \d+ .{0,80}exited on signal \d+")


def component(text: str) -> tuple[str, set[str]] | None:
    if _RANK_DIED.search(text):
        return None
    for name, pattern, areas in COMPONENTS:
        if pattern.search(text):
            return name, areas
    return None


@cache
def _generic() -> frozenset[str]:
    return frozenset(load_table("dsenv.doctor.explain", "evidence.toml")["generic"])


@dataclass
class Match:
    """A cause named for one line: a catalogue mode or a family parser's finding."""

    score: float
    mode: catalogue.Mode | None = None
    finding: loader.Finding | None = None
    matched: list[str] = field(default_factory=list)  # message patterns
    context: list[str] = field(default_factory=list)  # patterns seen only around it
    why: list[str] = field(default_factory=list)  # the evidence, in words
    parsed: list[str] = field(default_factory=list)  # what a family parser extracted
    shared: str = ""  # the group of causes whose words the line shares (alternatives.py)
    usual: str = ""  # the group whose usual cause this is (alternatives.py): others shown

    @property
    def id(self) -> str:
        return self.mode.id if self.mode else self.finding.id


@cache
def _pattern(p: str) -> re.Pattern:
    """Compiled once: the catalogue has more patterns than re's own cache keeps (512)."""
    return re.compile(p, FLAGS)


# Compiling every catalogue pattern costs more than reading a 10,000-line log, so a pattern
# is compiled only when the text holds its needle: the longest literal run every match of it
# contains (tests/test_explain_speed.py checks the needles against every symptom and message).
_ESCAPED_LITERAL = frozenset(".^$*+?{}[]()|\\/-'\"`:,=<>!@#%&~ ")


@cache
def needle(p: str) -> str:
    """The longest literal run (3+ characters, lowercased) that every match of ``p`` contains,
    '' when there is none (a top-level alternation, only classes)."""
    runs: list[str] = []
    run: list[str] = []
    depth, i, n, top_alt = 0, 0, len(p), False

    def cut() -> None:
        if run:
            runs.append("".join(run))
            run.clear()

    while i < n:
        c = p[i]
        if c == "\\" and i + 1 < n:
            i += 2
            if p[i - 1] not in _ESCAPED_LITERAL:  # \s \d \w \b ...: a class or an assertion
                cut()
                continue
            c = p[i - 1]
        elif c == "[":  # a character class: skip to its end
            j = i + 1 + (p[i + 1:i + 2] == "^")
            j += p[j:j + 1] == "]"
            while j < n and p[j] != "]":
                j += 2 if p[j] == "\\" else 1
            i = j + 1
            cut()
            continue
        elif c in "()|.^$":
            depth += (c == "(") - (c == ")")
            top_alt = top_alt or (c == "|" and depth == 0)
            i += 1
            cut()
            continue
        elif c in "*+?{":  # a quantifier: ? * {0 make the literal before it optional
            if c in "?*" or p.startswith("{0", i):
                if run:
                    run.pop()
            i = (p.find("}", i) + 1 or i + 1) if c == "{" else i + 1
            cut()
            continue
        else:
            i += 1
        if depth == 0:
            run.append(c)
        else:
            cut()
    cut()
    best = "" if top_alt else max(runs, key=len, default="")
    return best.lower() if len(best) >= 3 else ""


def _search(p: str, text: str, low: str) -> bool:
    found = needle(p)
    return (not found or found in low) and _pattern(p).search(text) is not None


def score_modes(message: str, around: str, chained: str = "") -> list[Match]:
    """``chained``: the exceptions chained onto this failure (logread.Reading.chained), read
    only as evidence against a mode: they say what was being done, not what failed."""
    beyond = f"{around}\n{chained}" if chained else around
    generic = _generic()
    who = component(message)
    low, around_low = message.lower(), around.lower()
    found = []
    for mode in catalogue.modes():
        hits = [p for p in mode.match if _search(p, message, low)]
        also = [p for p in mode.also if _search(p, message, low)]
        if not hits and not also:
            continue
        score = sum(GENERIC if p in generic else SPECIFIC for p in hits) + SPECIFIC * len(also)
        why = [f"message: {p!r}" + (" (generic)" if p in generic else "") for p in hits + also]
        against = evidence_against(mode, message, beyond)
        if against:
            score -= SPECIFIC * len(against)
            why.append(f"against: {against[0]!r}")
        if who:
            if mode.area in who[1]:
                score += 1
                why.append(f"printed by {who[0]}")
            elif who[0] in STRICT:
                score -= 2
                why.append(f"printed by {who[0]}, not {mode.area}")
        ctx = [p for p in mode.match if p not in hits and _search(p, around, around_low)]
        if ctx:
            score += min(1.0, 0.5 * len(ctx))
            why.append(f"context: {ctx[0]!r}")
        # a mode's own supporting evidence printed a few lines away (the WSL platform line
        # above "No HIP GPUs are available") counts half, and only for a mode the line names
        near = [p for p in mode.also if p not in also and _search(p, around, around_low)]
        if near and hits:
            score += SPECIFIC / 2
            why.append(f"context: {near[0]!r} (supporting)")
        found.append(Match(score, mode=mode, matched=hits + also, context=ctx, why=why))
    return found


def evidence_against(mode: catalogue.Mode, message: str, around: str = "") -> list[str]:
    """The mode's evidence that the symptom came from elsewhere, in the message or else in
    the lines around it (shm_open's "Permission denied" two lines above NCCL's "Error while
    creating shared memory segment"; "no socket interface found" before "Failed to
    initialize any NET plugin")."""
    here = [p for p in mode.against if _search(p, message, message.lower())]
    return here or [f"{p} (around)" for p in mode.against
                    if around and _search(p, around, around.lower())]


def rank(message: str, around: str = "", chained: str = "") -> list[Match]:
    """Every cause with evidence in ``message``, best first (confident ones score >= BAR)."""
    matches = score_modes(message, around, chained)
    beyond = f"{around}\n{chained}" if chained else around
    by_id = {m.id: m for m in matches}
    for finding in loader.parse(message, around):
        weight = BAR if finding.benign else STRUCTURE + 0.5 if finding.row else UNKNOWN_LIBRARY
        matches.append(Match(weight, finding=finding,
                             matched=[finding.text], why=[f"parsed: {finding.describe()}"]))
        linked = finding.mode  # libraries.toml: the row's link for this kind (and shape)
        mode = catalogue.mode(linked) if linked else None
        if mode is None:
            continue
        why = f"parsed: {finding.describe()} (libraries.toml: {finding.kind} -> {mode.id})"
        # The mode's evidence against holds for the link too (a missing libcusparse that
        # bitsandbytes' loader reports is bitsandbytes' mode, not the CUDA runtime's).
        # A link the message's shape chose (who asked for the library: a program, torch's own
        # import) says more than the words alone, which the plain kind's mode also matches.
        shaped = 0.5 if f"{finding.kind}.{finding.shape}" in (finding.row or {}).get("modes", {}) else 0
        linked_score = (STRUCTURE + 1 + shaped
                        - SPECIFIC * len(evidence_against(mode, message, beyond)))
        if mode.id in by_id:
            by_id[mode.id].score = max(by_id[mode.id].score, linked_score)
            by_id[mode.id].why.append(why)
        else:
            by_id[mode.id] = Match(linked_score, mode=mode, matched=[finding.text], why=[why])
            matches.append(by_id[mode.id])
    for found in families.read(message, around):
        mode = catalogue.mode(found.mode)
        if mode is None:
            continue
        why = f"parsed ({found.family}): {found.describe()}"
        if mode.id not in by_id:
            by_id[mode.id] = Match(0, mode=mode, matched=[found.text])
            matches.append(by_id[mode.id])
        match = by_id[mode.id]
        against = evidence_against(mode, message, beyond)
        match.score = max(match.score, STRUCTURE + 1 - SPECIFIC * len(against))
        match.why.append(why)
        match.parsed.append(found.describe())
    return sorted(matches, key=lambda m: -m.score)


def confident(matches: list[Match]) -> list[Match]:
    return [m for m in matches if m.score >= BAR]
