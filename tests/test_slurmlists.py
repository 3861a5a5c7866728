"""Slurm's hostlists and task counts, read in one place (dsenv/facts/launch/slurmlists.py):
held to python-hostlist 2.3.0's answers (recorded below: `hostlist.expand_hostlist(TEXT,
allow_duplicates=True)` and `hostlist.parse_slurm_tasks_per_node(TEXT)`, the library the
LUMI guide installs), and a malformed list is one line naming what is wrong."""

from __future__ import annotations

import pytest

from dsenv.facts.launch import joblayout
from dsenv.facts.launch.slurmlists import (
    MAX_HOSTS,
    SlurmListError,
    expand_hostlist,
    first_count,
    first_host,
    tasks_per_node,
)
from dsenv.workloads.launch import env as rank_env

# python-hostlist 2.3.0's expansion of each
RECORDED = [
    ("nid[0007-0009,0012],gpu1", ["nid0007", "nid0008", "nid0009", "nid0012", "gpu1"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("node5", ["node5"]),
    ("a1,b2", ["a1", "b2"]),
    ("b,a,b", ["b", "a", "b"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("n[008-10]", ["n008", "n009", "n010"]),
    ("n[1-010]", ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"]),
    ("n[00-03]", ["n00", "n01", "n02", "n03"]),
    ("x[1,3-4]y", ["x1y", "x3y", "x4y"]),
    ("h[1-2],h[1-2]", ["h1", "h2", "h1", "h2"]),
    ("a-b[1-2]", ["a-b1", "a-b2"]),
    ("n[9-10]-[1-2]", ["n9-1", "n9-2", "n10-1", "n10-2"]),
    ("gpu[12-13]", ["gpu12", "gpu13"]),
    ("n[0010-0012]", ["n0010", "n0011", "n0012"]),
    ("n[10-0012]", ["n10", "n11", "n12"]),
    ("cn[1-2]-ib,login1", ["cn1-ib", "cn2-ib", "login1"]),
]
# python-hostlist 2.3.0 refuses each (BadHostlist): unbalanced brackets, start > stop, bad
# range, nested brackets
MALFORMED = [
    ("a[1-", "'[' without its ']'"),
    ("a]", "']' without its '['"),
    ("a[3-1]", "range 3-1 runs backwards"),
    ("a[x-y]", "'x-y' is not a number or a range N-M"),
    ("a[[1]]", "a bracket inside a bracket"),
    ("a[]", "'an empty range' is not a number"),
    ("a[1,,2]", "'an empty range' is not a number"),
    ("a[ 1-2 ]", "' 1-2 ' is not a number"),
]


@pytest.mark.parametrize(("text", "hosts"), RECORDED)
def test_hostlists_expand_as_python_hostlist_does(text, hosts):
    assert expand_hostlist(text) == hosts
    assert first_host(text) == hosts[0]


@pytest.mark.parametrize(("text", "why"), MALFORMED)
def test_a_malformed_hostlist_is_one_line_naming_it(text, why):
    with pytest.raises(SlurmListError) as raised:
        expand_hostlist(text)
    assert str(raised.value).startswith(f"hostlist {text!r}: ") and why in str(raised.value)


def test_empty_and_huge_hostlists():
    assert expand_hostlist("") == [] and expand_hostlist(None) == [] and first_host("") is None
    with pytest.raises(SlurmListError, match=f"more than {MAX_HOSTS} hosts"):
        expand_hostlist(f"n[0-{MAX_HOSTS}]")
    with pytest.raises(SlurmListError, match=f"more than {MAX_HOSTS} hosts"):
        expand_hostlist(f"r[0-{MAX_HOSTS // 2}]-n[1-3]")


def test_task_counts_as_python_hostlist_reads_them():
    # python-hostlist 2.3.0: parse_slurm_tasks_per_node
    assert tasks_per_node("4(x2)") == [4, 4]
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("1(x2),3(x1)") == [1, 1, 3]
    assert tasks_per_node("8") == [8]
    assert tasks_per_node("") == []  # unset (python-hostlist refuses "")
    with pytest.raises(SlurmListError, match=r"task counts 'x': 'x' is not N or N\(xM\)"):
        tasks_per_node("x")
    assert first_count("4(x2)") == 4 and first_count("8") == 8 and first_count(" 2 ") == 2
    assert first_count("") is None and first_count("auto") is None and first_count(None) is None


def test_every_reader_uses_the_one_parser():
    """The job layout (doctor), the allocation's hosts, and rank discovery read the same
    answers: no other copy of the parser."""
    assert joblayout.expand_hostlist is expand_hostlist
    assert rank_env.first_host is first_host
    layout_env = {"SLURM_NTASKS_PER_NODE": "", "SLURM_TASKS_PER_NODE": "4(x2)"}
    node = joblayout.Node(env=layout_env, wanted_target="login")
    assert joblayout.ranks_per_node(node).value == 4
    ranks = rank_env.discover({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8",
                               "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
                               "SLURM_STEP_NODELIST": "nid[0007-0008]", "SLURM_JOB_ID": "1"})
    assert ranks.local_size == 4 and ranks.master_addr == "nid0007"


def test_rank_discovery_refuses_a_malformed_nodelist():
    with pytest.raises(rank_env.WorkloadError, match=r"SLURM_STEP_NODELIST='nid\[0007-': "):
        rank_env.discover({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8",
                           "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
                           "SLURM_STEP_NODELIST": "nid[0007-", "SLURM_JOB_ID": "1"})
