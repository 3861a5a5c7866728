"""Words several causes share: when the text cannot tell which, say so and list them.

Some error texts were settled as different causes in different threads: "We couldn't connect
to 'https://huggingface.co'" on a compute node without internet, behind a site proxy, and
during an outage of the Hub. Naming the likeliest one would be wrong as often as not, so when
the best cause of a line belongs to such a group (alternatives.toml), the line holds the
group's shared words, and no member's telling evidence is in the line or around it, the answer
is the group: every member, the ranked best first, each with its cause, fix and check, and what
tells them apart. Telling evidence (a ProxyError) names its member alone; a text whose parts a
family parser compares (torch's list of the capabilities it was built for) keeps its ranked
cause.

A group with a ``usual`` member is words that threads settled mostly as that cause: the answer
names it alone, as a ranked cause, and shows the other members with what tells them apart; a
member's telling evidence still names that member alone.

A group marked ``unranked`` has words that no single cause ranks above the bar (a bare "No space
left on device" says a file system is full, not which): when no line of the text names a cause,
those words alone make the answer the group (:func:`unranked`).

Each group's members have verbatim texts with the shared words from threads that settled each
cause (tests/fixtures/explain_shared/, checked against this table by tests/test_explain_shared.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from dsenv.data import load_table
from dsenv.doctor import catalogue
from dsenv.doctor.explain import rank
from dsenv.doctor.explain.families import build, build_compile, cuda_errors, rocm

FLAGS = re.IGNORECASE | re.MULTILINE
# Words a family parser already knows, named in the table by "@name" rather than copied: every
# wording of one error, kept in one place.
FAMILY_WORDS = {"@rocm.no-code-object": rocm.NO_CODE_OBJECT.pattern,
                "@build.cuda-release": build_compile.CUDA_RELEASE_SEEN.pattern,
                "@build.cuda-home-unset": build.CUDA_HOME_UNSET.pattern,
                "@cuda.own-kernel-error": cuda_errors.OWN_KERNEL_ERROR.pattern}
ALSO = "@also"  # a tell that is the member's own `also` evidence in the catalogue


@dataclass(frozen=True)
class Group:
    id: str
    what: str  # what the shared words do establish
    words: tuple[str, ...]  # the shared words (regexes)
    modes: tuple[str, ...]  # the member causes, in the order they are listed
    tells: dict  # member id -> regexes that single it out
    decided: tuple[str, ...]  # regexes of texts whose parts the parsers read: the best stands
    which: str  # how to find out which it is
    sources: tuple[str, ...]  # threads that settled each member for these words
    cuda_errors: tuple[str, ...] = ()  # CUDA error kinds whose every form counts as the words
    unranked: bool = False  # the words alone make the group when nothing else was named
    usual: str = ""  # the member these words mostly are: named alone unless a tell says another

    def says(self, text: str) -> bool:
        return any(re.search(p, text, FLAGS) for p in self.words) or \
            bool(self.cuda_errors and cuda_errors.error_kind(text) in self.cuda_errors)

    def told(self, text: str) -> list[tuple[str, str]]:
        """(member, pattern) for each member whose telling evidence ``text`` holds."""
        return [(member, p) for member in self.modes for p in self.tells.get(member, ())
                if re.search(p, text, FLAGS)]


@cache
def groups() -> tuple[Group, ...]:
    rows = load_table("dsenv.doctor.explain", "alternatives.toml")["group"]
    return tuple(Group(r["id"], r["what"], tuple(FAMILY_WORDS.get(w, w) for w in r["words"]),
                       tuple(r["modes"]),
                       {k: tuple(p for x in v for p in (
                           catalogue.mode(k).also if x == ALSO else (FAMILY_WORDS.get(x, x),)))
                        for k, v in r.get("tells", {}).items()},
                       tuple(FAMILY_WORDS.get(d, d) for d in r.get("decided", ())), r["which"], tuple(r["sources"]),
                       tuple(r.get("cuda_errors", ())), bool(r.get("unranked", False)),
                       r.get("usual", ""))
                 for r in rows)


def group(group_id: str) -> Group | None:
    return next((g for g in groups() if g.id == group_id), None)


def narrow(sure: list[rank.Match], ranked: list[rank.Match], message: str,
           around: str = "") -> list[rank.Match]:
    """``sure`` (a line's confident matches, best first) as the answer: unchanged, one member
    a telling pattern singles out, or the best's group (each member's match carries
    ``shared``, the group id)."""
    if not sure or sure[0].mode is None:
        return sure
    best = sure[0]
    for g in groups():
        if g.unranked or best.id not in g.modes or not g.says(message):
            continue  # an unranked group's words never outweigh a cause ranked on them
        if any(re.search(p, text, FLAGS) for p in g.decided for text in (message, around)):
            return sure  # torch's supported-capabilities line: the gpu family compared them
        told = g.told(message) or g.told(around)
        if told:
            member, pattern = told[0]
            if any(m == best.id for m, _ in told):
                return sure
            chosen = _match(member, ranked, best.score)
            chosen.why.append(f"tells it apart from {best.id}: {pattern!r}")
            return [chosen] + [m for m in sure if m.id != member]
        if g.usual:
            # the words' usual cause stands (its group's other members are shown with it);
            # a best that is another member was ranked on its own evidence and stands too
            best.usual = g.id if best.id == g.usual else ""
            return sure
        # a member the line holds evidence against (its `against` in the catalogue) is not
        # one of the causes these words could be here
        others = [m for m in g.modes if m != best.id
                  and not rank.evidence_against(catalogue.mode(m), message, around)]
        if not others:
            return sure
        members = [best] + [_match(m, ranked, best.score) for m in others]
        for m in members:
            m.shared = g.id
            if m is not best:
                m.why.append(f"shares these words with {best.id} ({g.id})")
        return members + [m for m in sure if m.id not in g.modes]
    return sure


def unranked(message: str, around: str = "") -> list[rank.Match]:
    """The answer of an ``unranked`` group whose words ``message`` holds (a line no cause ranked
    above the bar): the member its telling evidence singles out, else every member in the
    table's order; [] when no such group's words are there, or a text the parsers read decides."""
    for g in groups():
        if not g.unranked or not g.says(message):
            continue
        if any(re.search(p, text, FLAGS) for p in g.decided for text in (message, around)):
            continue
        words = next(hit.group(0) for p in g.words for hit in [re.search(p, message, FLAGS)]
                     if hit) if not g.cuda_errors else message.strip()
        told = g.told(message) or g.told(around)
        if told:
            member, pattern = told[0]
            chosen = _match(member, [], rank.BAR)
            chosen.matched.append(words)
            chosen.why.append(f"the words of {g.id}, told apart by {pattern!r}")
            return [chosen]
        members = [_match(m, [], rank.BAR) for m in g.modes
                   if not rank.evidence_against(catalogue.mode(m), message, around)]
        for m in members:
            m.shared = g.id
            m.matched.append(words)
            m.why.append(f"the words of {g.id}, which no one cause ranks above the others")
        return members if len(members) > 1 else []
    return []


def _match(mode_id: str, ranked: list[rank.Match], score: float) -> rank.Match:
    """The ranked match of ``mode_id``, else a new one at ``score``: the shared words are its
    evidence as much as the best's."""
    for m in ranked:
        if m.id == mode_id:
            m.score = max(m.score, score)
            return m
    mode = catalogue.mode(mode_id)
    return rank.Match(score, mode=mode, matched=[], why=[])
