"""The official SQuAD v1.1 exact-match/F1, against hand-checked cases.

Each expected value below was worked out by hand from evaluate-v1.1.py's rules:
lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace; F1 on the
bag of remaining tokens; the maximum over the ground truths; percentages over all questions.
"""

import pytest

from dsenv.workloads.squad import (
    Answer,
    Example,
    exact_match_score,
    f1_score,
    metric_max_over_ground_truths,
    normalize_answer,
    squad_scores,
)


@pytest.mark.parametrize("text, expected", [
    ("The Eiffel Tower", "eiffel tower"),
    ("  an   apple, a pear; THE end. ", "apple pear end"),
    ("Denver Broncos!", "denver broncos"),
    ("theatre", "theatre"),  # 'the' inside a word stays
    ("a", ""),
    ("U.S.A.", "usa"),
    ("rock-n-roll", "rocknroll"),  # punctuation is deleted, not replaced by a space
    ("1,000", "1000"),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize("prediction, truth, em, f1", [
    ("Denver Broncos", "Denver Broncos", True, 1.0),
    ("the Denver Broncos.", "Denver Broncos", True, 1.0),
    ("Broncos", "Denver Broncos", False, 2 * (1.0 * 0.5) / 1.5),  # P 1, R 1/2 -> 2/3
    ("Denver Broncos team", "Denver Broncos", False, 0.8),  # P 2/3, R 1 -> 0.8
    ("Carolina Panthers", "Denver Broncos", False, 0.0),
    ("", "Denver Broncos", False, 0.0),
    ("the", "a", True, 0.0),  # both normalise to "": exact, but no tokens to share
    ("new new york", "new york", False, 0.8),  # counts clip: 2 shared of P 3, R 2
])
def test_exact_match_and_f1(prediction, truth, em, f1):
    assert exact_match_score(prediction, truth) is em
    assert f1_score(prediction, truth) == pytest.approx(f1)


def test_max_over_ground_truths():
    truths = ["Denver Broncos", "Broncos", "the Broncos of Denver"]
    assert metric_max_over_ground_truths(exact_match_score, "broncos", truths) is True
    # prediction -> "denver broncos fans of" (4 tokens). vs "Denver Broncos": P 2/4, R 1
    # -> 2/3; vs "Broncos": P 1/4, R 1 -> 0.4; vs "broncos of denver": P 3/4, R 1 -> 6/7
    assert metric_max_over_ground_truths(f1_score, "Denver the Broncos fans of", truths) == \
        pytest.approx(6 / 7)


def _ex(qid, *answers):
    return Example(qid, "t", "ctx", "q?", tuple(Answer(a, 0) for a in answers))


def test_squad_scores_are_percentages_over_all_questions():
    examples = [_ex("1", "Denver Broncos", "Broncos"), _ex("2", "Santa Clara"),
                _ex("3", "gold"), _ex("4", "Levi's Stadium")]
    predictions = {"1": "the Broncos", "2": "Santa Clara, California", "3": "silver"}
    # 1: EM 1, F1 1; 2: EM 0, F1 P 2/3 R 1 -> 0.8; 3: 0, 0; 4: unanswered counts as 0
    scores = squad_scores(examples, predictions)
    assert scores["exact_match"] == pytest.approx(25.0)
    assert scores["f1"] == pytest.approx(45.0)
