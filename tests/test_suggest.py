"""Typos get a suggestion in at most two lines, exit 2 (issue 24): a mistyped command,
workload, choice or --arch value names its close matches, never the whole list, and
without a close match says what is accepted."""

from __future__ import annotations

import pytest

from dsenv.suggest import close_matches
from tests.harness.cli import dsenv


@pytest.mark.parametrize("args, line", [
    (["docter"], "dsenv: unknown command 'docter'; did you mean 'doctor'?"),
    (["smoke", "bert_squad"], "dsenv smoke: unknown workload 'bert_squad'; did you mean "
                              "'bert-squad'?"),
    (["run", "gpt2wikitext"], "dsenv run: unknown workload 'gpt2wikitext'; did you mean "
                              "'gpt2-wikitext'?"),
    (["doctor", "--target", "logn"], "dsenv doctor: unknown --target 'logn'; did you mean "
                                     "'login'?"),
    (["provision", "--arch", "7", "--dry-run"], "dsenv provision: --arch 7: '7' is neither a "
     "GPU architecture nor a GPU name dsenv knows; did you mean '7.0' or '7.2' or '7.5'?"),
    (["provision", "--arch", "A10O", "--dry-run"], "dsenv provision: --arch A10O: 'A10O' is "
     "neither a GPU architecture nor a GPU name dsenv knows; did you mean 'A10' or 'A100'?"),
])
def test_a_typo_gets_its_close_matches_in_two_lines(args, line):
    done = dsenv(*args)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[0] == line and len(lines) <= 2, done.stderr
    assert "usage:" not in done.stderr


def test_no_close_match_says_what_is_accepted_not_every_name():
    done = dsenv("provision", "--arch", "sm_99", "--dry-run")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "accepted: compute capabilities (7.0, sm_80)" in done.stderr
    assert len(done.stderr) < 300 and "GH200" not in done.stderr  # not the whole table
    done = dsenv("zzz")
    assert done.stderr.splitlines()[0].startswith("dsenv: unknown command 'zzz'; choose from "
                                                  "doctor, smoke")


def test_close_matches():
    assert close_matches("bert_squad", ["bert-squad", "t5-xsum"]) == ["bert-squad"]
    assert close_matches("7", ["6.0", "7.0", "7.5", "8.0"]) == ["7.0", "7.5"]
    assert close_matches("qqq", ["doctor", "smoke"]) == []
    assert close_matches("", ["doctor"]) == []
