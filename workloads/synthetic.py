"""Synthetic XSum, wikitext and GLUE MRPC data sets in the real ones' layouts (no torch).

The smokes of t5-xsum, gpt2-wikitext and bert-mrpc train on these instead of downloads.
Rows have exactly the real data sets' columns and features (XSum: document, summary, id;
wikitext: text; MRPC: sentence1, sentence2, label as a ClassLabel, idx), are saved with
``datasets``' ``save_to_disk`` and read back with ``load_from_disk``: the code path the full
runs take with what ``dsenv fetch`` prepared. The vocabulary is data (synthetic_text.toml,
with synthetic_squad.toml's people and facts); why each task is learnable is said there.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from dsenv.data import load_table
from dsenv.staging import staged_dir
from dsenv.workloads import squad

_TABLE = load_table("dsenv.workloads", "synthetic_text.toml")
XSUM: dict = _TABLE["xsum"]
WIKITEXT: dict = _TABLE["wikitext"]
MRPC: dict = _TABLE["mrpc"]


def _sentence(template: str, name: str, value: str) -> str:
    text = template.format(name=name, value=value)
    return text[0].upper() + text[1:]


def _fact(rng: random.Random, relation: str, name: str, template: int | None = None,
          value: str | None = None) -> tuple[str, str]:
    """(sentence, value): one of the relation's wordings of a fact about ``name``."""
    spec = squad.RELATIONS[relation]
    value = rng.choice(spec["values"]) if value is None else value
    wording = spec["fact"][rng.randrange(len(spec["fact"])) if template is None else template]
    return _sentence(wording, name, value), value


def wikitext_style(sentence: str) -> str:
    """Punctuation spaced the way wikitext's raw files have it: "a-b, c." -> "a @-@ b , c ."."""
    sentence = re.sub(r"(?<=\w)-(?=\w)", " @-@ ", sentence)
    return re.sub(r"\s*([,.;:!?()])", r" \1", sentence).strip()


# ----------------------------------------------------------------------------- XSum
def xsum_rows(count: int, seed: int) -> list[dict]:
    """{document, summary, id}: the summary says the document's most newsworthy fact (its
    relation first in ``summary_order``) in that relation's one summary wording."""
    rng = random.Random(seed)
    order = XSUM["summary_order"]
    rows = []
    for index in range(count):
        name = rng.choice(squad.NAMES).capitalize()
        relations = rng.sample(order, XSUM["facts_per_document"])
        facts = {relation: _fact(rng, relation, name) for relation in relations}
        sentences = [sentence for sentence, _ in facts.values()]
        for filler in rng.sample(squad.FILLERS, XSUM["fillers_per_document"]):
            sentences.insert(rng.randrange(len(sentences) + 1), filler)
        headline = min(relations, key=order.index)
        summary = _sentence(XSUM["summary"][headline], name, facts[headline][1])
        rows.append({"document": "\n".join(sentences), "summary": summary,
                     "id": str(30_000_000 + seed % 1000 * 10_000 + index)})
    return rows


# ----------------------------------------------------------------------------- wikitext
def wikitext_rows(articles: int, seed: int) -> list[dict]:
    """{text}: wikitext's lines, one row each: "" between blocks, " = Title = \\n" headings,
    " = = Section = = \\n" sub-headings and paragraph lines ending in " \\n"."""
    rng = random.Random(seed)
    lines: list[str] = []

    def paragraph(name: str, relations: list[str]) -> None:
        sentences = [wikitext_style(_fact(rng, relation, name)[0]) for relation in relations]
        lines.extend(["", " " + " ".join(sentences) + " \n", ""])

    for _ in range(articles):
        first = rng.choice(squad.NAMES).capitalize()
        title = f"{first} {rng.choice(WIKITEXT['surnames']).capitalize()}"
        relations = rng.sample(sorted(squad.RELATIONS), WIKITEXT["lead_facts"] + WIKITEXT[
            "section_facts"] * WIKITEXT["sections_per_article"])
        lines.extend(["", f" = {title} = \n"])
        paragraph(title, relations[:WIKITEXT["lead_facts"]])
        sections = rng.sample(WIKITEXT["sections"], WIKITEXT["sections_per_article"])
        for number, section in enumerate(sorted(sections, key=WIKITEXT["sections"].index)):
            lines.append(f" = = {section} = = \n")
            start = WIKITEXT["lead_facts"] + number * WIKITEXT["section_facts"]
            paragraph(first, relations[start:start + WIKITEXT["section_facts"]])
    return [{"text": line} for line in lines]


# ----------------------------------------------------------------------------- MRPC
def mrpc_rows(count: int, seed: int, labelled: bool = True) -> list[dict]:
    """{sentence1, sentence2, label, idx}: a fact, then a sentence in the relation's other
    wording; label 1 (equivalent) when it says the same fact, 0 when it differs as
    ``negative_changes`` says (another fact, value or person). GLUE's test split hides its
    labels (-1): ``labelled=False`` does the same."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        relation = rng.choice(sorted(squad.RELATIONS))
        name = rng.choice(squad.NAMES)
        first, value = _fact(rng, relation, name.capitalize(), template=0)
        equivalent = rng.random() < MRPC["positive_fraction"]
        second_relation = relation
        if not equivalent:
            change = rng.choice(MRPC["negative_changes"])
            if change == "value":
                value = rng.choice([v for v in squad.RELATIONS[relation]["values"] if v != value])
            elif change == "name":
                name = rng.choice([n for n in squad.NAMES if n != name])
            else:  # another fact about the same person
                second_relation = rng.choice([r for r in sorted(squad.RELATIONS) if r != relation])
                value = None
        second, _ = _fact(rng, second_relation, name.capitalize(), template=1, value=value)
        if rng.random() < 0.5:
            first, second = second, first
        rows.append({"sentence1": wikitext_style(first), "sentence2": wikitext_style(second),
                     "label": int(equivalent) if labelled else -1, "idx": index})
    return rows


# ----------------------------------------------------------------------------- saving
def features(layout: str):
    """The ``datasets.Features`` of the real data set (as their parquet files declare)."""
    from datasets import ClassLabel, Features, Value  # datasets: only once a smoke starts

    if layout == "xsum":
        return Features({"document": Value("string"), "summary": Value("string"),
                         "id": Value("string")})
    if layout == "wikitext":
        return Features({"text": Value("string")})
    if layout == "mrpc":
        return Features({"sentence1": Value("string"), "sentence2": Value("string"),
                         "label": ClassLabel(names=MRPC["label_names"]),
                         "idx": Value("int32")})
    raise ValueError(f"no layout {layout!r}")


def save_task(target: Path, layout: str, train: int, dev: int, seed: int) -> Path:
    """A synthetic task in ``layout`` saved into ``target``: ``train`` training rows,
    ``dev`` validation and ``dev`` test rows (MRPC's test split unlabelled, as GLUE's is),
    each split drawn with its own seed."""
    rows = {"xsum": xsum_rows, "wikitext": wikitext_rows, "mrpc": mrpc_rows}[layout]
    test = {"labelled": False} if layout == "mrpc" else {}
    return save_splits(target, layout, {"train": rows(train, seed),
                                        "validation": rows(dev, seed + 7919),
                                        "test": rows(dev, seed + 15838, **test)})


def save_splits(target: Path, layout: str, splits: dict[str, list[dict]]) -> Path:
    """A DatasetDict of ``splits`` saved with save_to_disk into ``target`` (staged)."""
    import datasets  # datasets: only once a smoke starts

    datasets.disable_progress_bars()
    found = features(layout)
    dataset = datasets.DatasetDict({name: datasets.Dataset.from_list(rows, features=found)
                                    for name, rows in splits.items()})
    with staged_dir(Path(target)) as tmp:
        dataset.save_to_disk(str(tmp))
    return Path(target)
