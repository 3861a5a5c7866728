"""SQuAD v1.1: the JSON reader, a synthetic generator in the same layout, features, metric.

* :func:`read_squad` reads train-v1.1.json / dev-v1.1.json (the real files or the synthetic
  ones: the same code path), with one clear error for a missing or malformed file.
* :func:`synthetic_squad` writes a small, learnable data set in exactly SQuAD v1.1's layout.
* :func:`train_features` / :func:`eval_features` turn examples into model inputs: answer
  character offsets -> start/end token positions, long contexts split into windows of
  ``max_length`` tokens overlapping by ``doc_stride`` (the BERT SQuAD recipe).
* :func:`best_answers` turns start/end logits back into answer text.
* :func:`squad_scores` is the official SQuAD v1.1 exact-match/F1 (evaluate-v1.1.py),
  implemented here because the ``evaluate`` library fetches its metric scripts at run time.

No torch here; numpy only inside the functions that need it.
"""

from __future__ import annotations

import collections
import random
import re
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dsenv.data import load_table
from dsenv.jsonfiles import JsonFileError, read_json
from dsenv.workloads.errors import WorkloadError


# ----------------------------------------------------------------------------- examples
@dataclass(frozen=True)
class Answer:
    text: str
    start: int  # character offset in the context


@dataclass(frozen=True)
class Example:
    id: str
    title: str
    context: str
    question: str
    answers: tuple[Answer, ...]


def read_squad(path: str | Path) -> list[Example]:
    """Examples of a SQuAD v1.1 JSON file; :class:`WorkloadError` naming what is wrong."""
    path = Path(path)
    try:
        doc = read_json(path, "SQuAD file")
    except JsonFileError as exc:
        raise WorkloadError(str(exc)) from None

    def bad(where: str, what: str) -> WorkloadError:
        return WorkloadError(f"SQuAD file {path}: {where}: {what} (expected SQuAD v1.1 layout: "
                             "data[].paragraphs[].qas[].answers[])")

    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        return_type = type(doc).__name__
        raise bad("top level", f"no 'data' list (got {return_type}"
                  + (f" with keys {sorted(doc)[:5]}" if isinstance(doc, dict) else "") + ")")
    examples: list[Example] = []
    for a, article in enumerate(doc["data"]):
        where = f"data[{a}]"
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise bad(where, "no 'paragraphs' list")
        title = str(article.get("title", ""))
        for p, para in enumerate(article["paragraphs"]):
            where = f"data[{a}].paragraphs[{p}]"
            if not isinstance(para, dict) or not isinstance(para.get("context"), str):
                raise bad(where, "no 'context' string")
            if not isinstance(para.get("qas"), list):
                raise bad(where, "no 'qas' list")
            context = para["context"]
            for q, qa in enumerate(para["qas"]):
                where = f"data[{a}].paragraphs[{p}].qas[{q}]"
                if not isinstance(qa, dict):
                    raise bad(where, "not an object")
                for key, kind in (("id", str), ("question", str), ("answers", list)):
                    if not isinstance(qa.get(key), kind):
                        raise bad(where, f"no '{key}' {'list' if kind is list else 'string'}")
                answers = []
                for n, ans in enumerate(qa["answers"]):
                    if (not isinstance(ans, dict) or not isinstance(ans.get("text"), str)
                            or not isinstance(ans.get("answer_start"), int)):
                        raise bad(f"{where}.answers[{n}]", "needs 'text' and integer "
                                  "'answer_start'")
                    if not 0 <= ans["answer_start"] <= len(context):
                        raise bad(f"{where}.answers[{n}]", f"answer_start "
                                  f"{ans['answer_start']} is outside the context")
                    answers.append(Answer(ans["text"], ans["answer_start"]))
                if not answers:
                    raise bad(where, "no answers (SQuAD v2 unanswerable questions are not "
                              "supported)")
                examples.append(Example(qa["id"], title, context, qa["question"],
                                        tuple(answers)))
    if not examples:
        raise WorkloadError(f"SQuAD file {path}: no questions in it")
    return examples


def examples_from_rows(rows: Iterable[dict], source: str) -> list[Example]:
    """Examples of a SQuAD data set in the Hub's column layout (rajpurkar/squad: id, title,
    context, question, answers {text: [...], answer_start: [...]}), as ``datasets`` gives
    rows; :class:`WorkloadError` naming the row when one does not fit."""
    examples = []
    for n, row in enumerate(rows):
        answers = row.get("answers") if isinstance(row, dict) else None
        fields_ok = isinstance(answers, dict) and all(
            isinstance(row.get(key), str) for key in ("id", "context", "question"))
        texts = answers.get("text") if fields_ok else None
        starts = answers.get("answer_start") if fields_ok else None
        if (not fields_ok or not isinstance(texts, list) or not isinstance(starts, list)
                or len(texts) != len(starts) or not texts):
            raise WorkloadError(f"{source}: row {n} is not a SQuAD v1.1 question (needs id, "
                                "context, question and answers {text: [...], answer_start: "
                                "[...]} with at least one answer)")
        context = row["context"]
        for start in starts:
            if not isinstance(start, int) or not 0 <= start <= len(context):
                raise WorkloadError(f"{source}: row {n} ({row['id']}): answer_start {start!r} "
                                    "is outside the context")
        examples.append(Example(row["id"], str(row.get("title") or ""), context,
                                row["question"], tuple(Answer(str(text), start) for text, start
                                                       in zip(texts, starts, strict=True))))
    if not examples:
        raise WorkloadError(f"{source}: no questions in it")
    return examples


# ----------------------------------------------------------------------------- synthetic
# The vocabulary and templates are data (synthetic_squad.toml); why the task is learnable
# is explained there. A stack that does not learn (lr 0, shuffled labels) stays near
# chance (~1/facts per paragraph).
_SYNTHETIC = load_table("dsenv.workloads", "synthetic_squad.toml")
NAMES: tuple[str, ...] = tuple(_SYNTHETIC["names"])
RELATIONS: dict[str, dict[str, list[str]]] = _SYNTHETIC["relations"]
FILLERS: tuple[str, ...] = tuple(_SYNTHETIC["fillers"])
FACTS_PER_PARAGRAPH: int = _SYNTHETIC["facts_per_paragraph"]


def synthetic_squad(paragraphs: int, seed: int, title_prefix: str = "synthetic") -> dict:
    """A SQuAD v1.1 document of ``paragraphs`` paragraphs, one question per fact."""
    rng = random.Random(seed)
    articles = []
    qid = 0
    for p in range(paragraphs):
        name = rng.choice(NAMES)
        shown = name.capitalize()
        relations = rng.sample(sorted(RELATIONS), FACTS_PER_PARAGRAPH)
        facts = []
        for relation in relations:
            spec = RELATIONS[relation]
            value = rng.choice(spec["values"])
            template = rng.choice(spec["fact"])
            facts.append((relation, value, template))
        sentences: list[tuple[str | None, str, str]] = [(r, v, t) for r, v, t in facts]
        sentences.insert(rng.randrange(len(sentences) + 1), (None, "", rng.choice(FILLERS)))
        context = ""
        qas = []
        for relation, value, template in sentences:
            if context:
                context += " "
            if relation is None:
                context += template
                continue
            before, after = template.split("{value}")
            before = before.replace("{name}", shown)
            if not context:
                before = before[0].upper() + before[1:]
            start = len(context) + len(before)
            context += before + value + after.replace("{name}", shown)
            question = rng.choice(RELATIONS[relation]["question"]).format(name=shown)
            qas.append({"answers": [{"answer_start": start, "text": value}],
                        "question": question, "id": f"{seed:08x}{qid:016x}"})
            qid += 1
        rng.shuffle(qas)
        articles.append({"title": f"{title_prefix}_{p}_{shown}",
                         "paragraphs": [{"context": context, "qas": qas}]})
    return {"data": articles, "version": "1.1"}


# ----------------------------------------------------------------------------- features
def _clip_questions(questions: Sequence[str], tokenizer, max_query_length: int) -> list[str]:
    """Cut questions longer than ``max_query_length`` tokens (BERT's recipe uses 64)."""
    enc = tokenizer(list(questions), add_special_tokens=False, return_offsets_mapping=True)
    clipped = []
    for question, offsets in zip(questions, enc["offset_mapping"], strict=True):
        question = question.lstrip()
        if len(offsets) > max_query_length:
            question = question[: offsets[max_query_length - 1][1]]
        clipped.append(question)
    return clipped


def _encode(examples: Sequence[Example], tokenizer, max_length: int, doc_stride: int,
            max_query_length: int):
    if doc_stride >= max_length - max_query_length - 3:
        raise WorkloadError(f"doc stride {doc_stride} must be smaller than max length "
                            f"{max_length} - max query length {max_query_length} - 3")
    questions = _clip_questions([e.question for e in examples], tokenizer, max_query_length)
    return tokenizer(questions, [e.context for e in examples], truncation="only_second",
                     max_length=max_length, stride=doc_stride, return_overflowing_tokens=True,
                     return_offsets_mapping=True, padding="max_length")


def train_features(examples: Sequence[Example], tokenizer, max_length: int = 384,
                   doc_stride: int = 128, max_query_length: int = 64) -> dict[str, list]:
    """input_ids, token_type_ids, attention_mask, start_positions, end_positions.

    Windows that do not contain the whole answer point at [CLS] (index 0), as in BERT.
    """
    enc = _encode(examples, tokenizer, max_length, doc_stride, max_query_length)
    starts, ends = [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        example = examples[enc["overflow_to_sample_mapping"][i]]
        answer = example.answers[0]
        start_char, end_char = answer.start, answer.start + len(answer.text)
        seq = enc.sequence_ids(i)
        first = seq.index(1)
        last = len(seq) - 1 - seq[::-1].index(1)
        if offsets[first][0] > start_char or offsets[last][1] < end_char:
            starts.append(0)
            ends.append(0)
            continue
        s = first
        while s <= last and offsets[s][0] <= start_char:
            s += 1
        e = last
        while e >= first and offsets[e][1] >= end_char:
            e -= 1
        starts.append(s - 1)
        ends.append(e + 1)
    out = {key: enc[key] for key in ("input_ids", "token_type_ids", "attention_mask")}
    out["start_positions"], out["end_positions"] = starts, ends
    return out


def eval_features(examples: Sequence[Example], tokenizer, max_length: int = 384,
                  doc_stride: int = 128, max_query_length: int = 64) -> dict[str, list]:
    """Model inputs plus ``example_index`` and context-only ``offset_mapping`` per window."""
    enc = _encode(examples, tokenizer, max_length, doc_stride, max_query_length)
    offsets = []
    for i, window in enumerate(enc["offset_mapping"]):
        seq = enc.sequence_ids(i)
        offsets.append([o if seq[k] == 1 else None for k, o in enumerate(window)])
    out = {key: enc[key] for key in ("input_ids", "token_type_ids", "attention_mask")}
    out["example_index"] = list(enc["overflow_to_sample_mapping"])
    out["offset_mapping"] = offsets
    return out


def best_answers(examples: Sequence[Example], features: dict, start_logits, end_logits,
                 n_best: int = 20, max_answer_length: int = 30) -> dict[str, tuple[str, int]]:
    """{example id: (answer text, start char)} from the windows' logits (best span wins)."""
    import numpy as np  # numpy: only once a run evaluates

    start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
    best: dict[int, tuple[float, str, int]] = {}
    for f, ex_index in enumerate(features["example_index"]):
        offsets = features["offset_mapping"][f]
        context = examples[ex_index].context
        s_log, e_log = start_logits[f], end_logits[f]
        for s in np.argsort(s_log)[::-1][:n_best]:
            if offsets[s] is None:
                continue
            for e in np.argsort(e_log)[::-1][:n_best]:
                if offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                    continue
                score = float(s_log[s] + e_log[e])
                if ex_index not in best or score > best[ex_index][0]:
                    begin = offsets[s][0]
                    best[ex_index] = (score, context[begin:offsets[e][1]], begin)
    return {ex.id: (best[i][1], best[i][2]) if i in best else ("", -1)
            for i, ex in enumerate(examples)}


# ----------------------------------------------------------------------------- metric
# The official SQuAD v1.1 evaluation (evaluate-v1.1.py), same normalisation and maxima.
def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation, the articles a/an/the, and extra whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match_score(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_score(prediction: str, ground_truth: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    truth_tokens = normalize_answer(ground_truth).split()
    common = collections.Counter(pred_tokens) & collections.Counter(truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def metric_max_over_ground_truths(metric_fn, prediction: str, ground_truths: Iterable[str]):
    return max(metric_fn(prediction, truth) for truth in ground_truths)


def squad_scores(examples: Sequence[Example], predictions: dict[str, str]) -> dict[str, float]:
    """{"exact_match": %, "f1": %} over ``examples``, as evaluate-v1.1.py prints them.

    A question with no prediction counts as wrong (the official script says so too).
    """
    exact = f1 = 0.0
    for ex in examples:
        truths = [a.text for a in ex.answers]
        if ex.id not in predictions:
            continue
        prediction = predictions[ex.id]
        exact += metric_max_over_ground_truths(exact_match_score, prediction, truths)
        f1 += metric_max_over_ground_truths(f1_score, prediction, truths)
    total = max(len(examples), 1)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


# ----------------------------------------------------------------------------- display
def highlight(context: str, start: int, length: int, style: str = "bold black on yellow"):
    """The paragraph as rich Text with ``context[start:start+length]`` highlighted."""
    from rich.text import Text  # rich: only once a run shows answers

    text = Text(context)
    if start >= 0 and length > 0:
        text.stylize(style, start, start + length)
    return text


def example_rows(examples: Sequence[Example], predictions: dict[str, tuple[str, int]],
                 count: int = 3) -> list[dict]:
    """``count`` QA examples spread over the set: the paragraph, the question, the predicted
    answer and where it starts in the paragraph, the expected answer (printed, and in the
    report for its HTML page)."""
    step = max(1, len(examples) // max(count, 1))
    rows = []
    for ex in list(examples[::step])[:count] if count > 0 else []:
        answer, start = predictions.get(ex.id, ("", -1))
        truth = ex.answers[0].text
        rows.append({"title": ex.title, "context": ex.context, "question": ex.question,
                     "answer": answer, "start": start, "expected": truth,
                     "correct": bool(exact_match_score(answer, truth))})
    return rows


def print_examples(console, rows: list[dict]) -> None:
    """QA examples (:func:`example_rows`) with the predicted answer highlighted in its
    paragraph."""
    from rich.panel import Panel  # rich: only once a run shows answers

    for row in rows:
        answer, ok = row["answer"], row["correct"]
        body = highlight(row["context"], row["start"], len(answer))
        body.append(f"\n\nQ: {row['question']}\nA: ", style="bold")
        body.append(answer or "(no answer)", style="green" if ok else "red")
        if not ok:
            body.append(f"   (expected: {row['expected']})", style="dim")
        console.print(Panel(body, title=row["title"], title_align="left", expand=False))
