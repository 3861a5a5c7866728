"""`dsenv doctor --distributed` across hosts, as far as one machine shows it: every rank's
environment fingerprint compared (odd ranks and odd hosts named with the differing values),
the host pairs timed, the interface column, and a missing rank named with its host.

Hosts here are UTS namespaces (`unshare --uts`, each with its own hostname) on loopback; the
namespaced cluster with real links (tests/netns.py) carries the cross-host cases."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsenv import proc
from dsenv.doctor.distributed import fingerprint as fingerprints
from dsenv.doctor.distributed import pairs as pairs
from dsenv.doctor.distributed import ranks
from dsenv.doctor.distributed.outcome import PairPlan, PairRow
from dsenv.facts.host import fingerprint as probe
from dsenv.verdicts.findings import Status
from tests.harness.cli import explain
from tests.harness.doctor_cli import report_of, statuses

DOCTOR = [sys.executable, "-m", "dsenv", "doctor", "--distributed", "--sizes", "4K",
          "--iters", "1", "--warmup", "0", "--only", "distributed", "--json"]
BASE = {"torch": "2.13.0+cpu (CPU-only build)", "deepspeed": "0.19.8",
        "transformers": "5.23.0", "prefix": "/env", "$OMP_NUM_THREADS": "1"}


# ----------------------------------------------------------------------------- grouping
def _records(layout: dict[int, tuple[str, dict]]) -> tuple[dict, dict]:
    """{rank: (host, facts)} -> (records, tables) as rank 0 holds them."""
    records, tables = {}, {}
    for rank, (host, facts) in layout.items():
        part, shared = fingerprints.record_part(facts)
        records[rank] = {"rank": rank, "host": host, "fingerprint": part}
        tables[part["digest"]] = shared
    return records, tables


def test_identical_hosts_give_no_finding_and_one_group():
    records, tables = _records({r: (f"h{r // 2}", dict(BASE)) for r in range(6)})
    compared = fingerprints.compare(records, tables)
    assert compared["findings"] == [] and compared["by"] == "host"
    assert compared["groups"] == [{"digest": records[0]["fingerprint"]["digest"],
                                   "hosts": ["h0", "h1", "h2"], "ranks": [0, 1, 2, 3, 4, 5]}]
    result = fingerprints.result(compared)
    assert result.status is Status.OK and result.summary == \
        "6 ranks on 3 hosts: one environment fingerprint"


def test_the_odd_host_is_named_with_both_values():
    layout = {r: (f"h{r // 2}", dict(BASE)) for r in range(6)}
    for rank in (4, 5):  # both ranks of h2
        layout[rank] = ("h2", dict(BASE, transformers="5.22.0", **{"$HF_HOME": "/scratch/hf"}))
    compared = fingerprints.compare(*_records(layout))
    [finding] = compared["findings"]
    assert (finding["scope"], finding["odd"], finding["reference"]) == \
        ("host", ["h2"], ["h0", "h1"])
    assert finding["differences"] == [
        {"fact": "$HF_HOME", "reference": "(not set)", "odd": "/scratch/hf"},
        {"fact": "transformers", "reference": "5.23.0", "odd": "5.22.0"}]
    result = fingerprints.result(compared)
    assert result.status is Status.WARN  # transformers and a variable: not in fail_on
    assert result.summary == ("6 ranks on 3 hosts: h2 differs from h0, h1: $HF_HOME is "
                              "'/scratch/hf' (h0, h1: not set); transformers is '5.22.0' "
                              "(h0, h1: '5.23.0')")
    assert "export the same value" in result.fix and "one environment" in result.fix
    # another torch on one host fails: the job cannot work
    layout[5] = layout[4] = ("h2", dict(BASE, torch="2.12.0+cpu (CPU-only build)"))
    assert fingerprints.result(fingerprints.compare(*_records(layout))).status is Status.FAIL


def test_two_hosts_that_differ_name_the_one_without_rank_0():
    layout = {0: ("a", dict(BASE)), 1: ("b", dict(BASE, **{"/dev/shm": "64 MiB"}))}
    [finding] = fingerprints.compare(*_records(layout))["findings"]
    assert finding["odd"] == ["b"] and finding["reference"] == ["a"]
    assert "give every host the same /dev/shm" in fingerprints.fix_for([finding])


def test_ranks_of_one_host_are_named_by_rank():
    layout = {r: ("node1", dict(BASE)) for r in range(3)}
    layout[2] = ("node1", dict(BASE, **{"$OMP_NUM_THREADS": "4"}))
    compared = fingerprints.compare(*_records(layout))
    assert compared["by"] == "rank"
    [finding] = compared["findings"]
    assert (finding["scope"], finding["odd"], finding["reference"], finding["host"]) == \
        ("rank", [2], [0, 1], "node1")
    assert fingerprints.describe(finding) == ("rank 2 on node1 differs from ranks 0, 1 on "
                                              "node1: $OMP_NUM_THREADS is '4' (ranks 0, 1: '1')")


def test_per_rank_gpu_visibility_is_compared_per_host():
    # srun --gpus-per-task: each rank its own CUDA_VISIBLE_DEVICES, which is no difference
    layout = {r: (f"h{r // 2}", dict(BASE, **{"$CUDA_VISIBLE_DEVICES": str(r % 2)}))
              for r in range(4)}
    assert fingerprints.compare(*_records(layout))["findings"] == []
    layout[3] = ("h1", dict(BASE, **{"$CUDA_VISIBLE_DEVICES": "0"}))  # h1: both ranks on GPU 0
    [finding] = fingerprints.compare(*_records(layout))["findings"]
    assert finding["odd"] == ["h1"] and finding["differences"] == [
        {"fact": "$CUDA_VISIBLE_DEVICES", "reference": "0 | 1", "odd": "0"}]


def test_rank_0_fetches_one_table_per_distinct_digest():
    layout = {r: (f"h{r}", dict(BASE)) for r in range(50)}
    layout[7] = ("h7", dict(BASE, deepspeed="0.19.7"))
    records, tables = _records(layout)
    asked = []

    def get(digest):
        asked.append(digest)
        return tables[digest]

    fetched, distinct = fingerprints.fetch_tables(records, get)
    assert asked == [records[0]["fingerprint"]["digest"], records[7]["fingerprint"]["digest"]]
    assert (distinct, len(fetched)) == (2, 2)
    # beyond max_distinct, the rest are named without their values
    layout = {r: (f"h{r}", dict(BASE, prefix=f"/env{r % 20}")) for r in range(40)}
    records, tables = _records(layout)
    fetched, distinct = fingerprints.fetch_tables(records, tables.__getitem__)
    assert distinct == 20 and len(fetched) == fingerprints.settings()["max_distinct"]
    compared = fingerprints.compare(records, fetched, distinct)
    assert compared["distinct"] == 20
    assert any(f["differences"][0]["odd"].startswith("not fetched") for f in compared["findings"])


def test_fingerprint_is_bounded_cheap_and_masks_secrets(tmp_path):
    env = {f"HF_VAR_{i:03d}": "x" * 1000 for i in range(200)}
    env.update(HF_TOKEN="hf_abcdefgh12345678", NCCL_SOCKET_IFNAME="^lo",
               GLOO_SOCKET_IFNAME="lo,nosuch0", HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    (tmp_path / "hub" / "models--bert").mkdir(parents=True)
    facts = probe.environment_fingerprint(env)
    text = json.dumps(facts)
    assert len(text) < 16_000 and "hf_abcdefgh" not in text
    assert facts["$HF_TOKEN"] == "***"
    assert facts["$..."] == f"{len(env) - probe.MAX_VARIABLES} more variables not compared"
    assert facts["hf assets"] == f"offline, hub cache {tmp_path / 'hub'}: 1 entries"
    assert facts["GLOO_SOCKET_IFNAME here"] == "nosuch0 missing here"
    assert "lo" not in facts["NCCL_SOCKET_IFNAME here"].split(" (")[0].split(", ")
    for name in ("dsenv", "torch", "deepspeed", "transformers", "python", "prefix", "/dev/shm",
                 "memlock"):
        assert facts[name] and facts[name] != "not installed", name
    code = ("import sys, os; from dsenv.doctor.distributed import fingerprint as f\n"
            "f.local_fingerprint(os.environ, 'gloo')\n"
            "print([m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize("variable, value, names, selected, missing", [
    ("NCCL_SOCKET_IFNAME", "hsn", ["hsn0", "hsn1", "lo"], ["hsn0", "hsn1"], []),
    ("NCCL_SOCKET_IFNAME", "=hsn", ["hsn0", "lo"], [], ["hsn"]),
    ("NCCL_SOCKET_IFNAME", "^lo,docker", ["docker0", "eth0", "lo"], ["eth0"], []),
    ("GLOO_SOCKET_IFNAME", "hsn0,nmn0", ["hsn0", "lo"], ["hsn0"], ["nmn0"]),
])
def test_interface_variables_follow_each_librarys_syntax(variable, value, names, selected,
                                                         missing):
    assert probe.selected_interfaces(variable, value, names) == (selected, missing)
    states = dict.fromkeys(names, True)
    verdict = probe.interface_verdict(variable, value, states)
    assert (verdict.endswith("missing here") or verdict.startswith("matches no")) == \
        (not selected or (variable.startswith("GLOO") and bool(missing)))


# ----------------------------------------------------------------------------- pairs
def test_pairs_every_pair_up_to_the_limit_then_ring_neighbours_in_three_rounds():
    assert pairs.plan_pairs({0: {"host": "a"}, 1: {"host": "a"}}).pairs == []
    four = pairs.plan_pairs({r: {"host": f"h{r // 2}"} for r in range(8)})
    assert four.pairs == [[0, 2, 0], [0, 4, 1], [0, 6, 2], [2, 4, 3], [2, 6, 4], [4, 6, 5]]
    limit = pairs.settings()["all_pairs_up_to"]
    assert len(pairs.plan_pairs({r: {"host": f"n{r}"} for r in range(limit)}).pairs) == \
        limit * (limit - 1) // 2
    for hosts in (1000, limit + 1):
        plan = pairs.plan_pairs({r: {"host": f"n{r}"} for r in range(hosts)})
        assert len(plan.pairs) == hosts and "ring neighbours" in plan.selection
        assert {p[2] for p in plan.pairs} <= {0, 1, 2}
        for round_ in (0, 1, 2):  # the pairs of one round share no host: they run together
            members = [r for p in plan.pairs if p[2] == round_ for r in p[:2]]
            assert len(members) == len(set(members))
        seen = [r for p in plan.pairs for r in p[:2]]
        assert all(seen.count(r) == 2 for r in range(hosts))  # each host: both neighbours


def _rows(busbw: dict[tuple[str, str], float]) -> list[PairRow]:
    return [PairRow(hosts=list(k), ranks=[0, 1], bytes=1 << 20, time_us=1.0, busbw_gbps=v)
            for k, v in busbw.items()]


def test_a_slow_host_is_named_and_a_healthy_fabric_is_not():
    healthy = _rows({("h1", "h2"): 10.0, ("h1", "h3"): 9.5, ("h1", "h4"): 10.2,
                     ("h2", "h3"): 9.8, ("h2", "h4"): 10.1, ("h3", "h4"): 9.9})
    assert pairs.slow_pairs(healthy)[1:] == ([], [])
    ok = pairs.result(PairPlan("every pair", [[0, 1, 0]] * 6, rows=healthy))
    assert ok.status is Status.OK and ok.summary.startswith("6 pairs, busbw 9.50 (h1 - h3)")
    slow = _rows({("h1", "h2"): 10.0, ("h1", "h3"): 1.0, ("h2", "h3"): 1.1})  # h3 is slow
    reference, named, common = pairs.slow_pairs(slow)
    assert reference == 10.0 and [r.hosts for r in named] == [["h1", "h3"], ["h2", "h3"]]
    assert common == ["h3"]
    warn = pairs.result(PairPlan("every pair", [[0, 1, 0]] * 3, rows=slow))
    assert warn.status is Status.WARN
    assert "h3 is in every slow pair: its link is the slow one" in warn.summary
    assert "check the fabric link of h3" in warn.fix
    alone = pairs.result(PairPlan("all ranks on one host: no host pairs", []))
    assert alone.status is Status.SKIP and "one host" in alone.summary


def test_a_rank_that_never_reported_is_named_with_its_slurm_host():
    env = {"SLURM_STEP_NODELIST": "h[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    layout = ranks.slurm_step_hosts(env, 4)
    assert layout == {0: "h1", 1: "h1", 2: "h2", 3: "h2"}
    assert ranks.slurm_step_hosts(dict(env, SLURM_DISTRIBUTION="cyclic"), 4) == {
        0: "h1", 1: "h2", 2: "h1", 3: "h2"}
    assert ranks.slurm_step_hosts(dict(env, SLURM_DISTRIBUTION="arbitrary"), 4) == {}
    assert ranks.slurm_step_hosts(env, 5) == {}  # does not add up: say nothing wrong
    [culprit] = ranks.diagnose(4, {**layout, 0: "h1"}, {0: 1, 1: 1, 2: 1}, {}, ["start",
                                                                                "rendezvous"])
    assert culprit.detail == "rank 3 (h2) did not arrive: it never reached the rendezvous"


# ----------------------------------------------------------------------------- real ranks
def _mpmd(run_env, tmp_path, per_rank: list[tuple[str | None, dict]], extra=()):
    """mpirun with one app context per rank: (hostname or None, extra variables)."""
    mpirun = proc.which("mpirun", run_env)
    if mpirun is None:
        pytest.skip("mpirun not installed")
    env = dict(run_env, OMP_NUM_THREADS="1")
    argv = [mpirun, "--allow-run-as-root", "--oversubscribe",
            *[a for v in ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "PATH",
                          "HF_HUB_OFFLINE") for a in ("-x", v)]]
    for i, (host, variables) in enumerate(per_rank):
        command = ["env", *[f"{k}={v}" for k, v in dict({"OMP_NUM_THREADS": "1"},
                                                         **variables).items()],
                   *DOCTOR, *extra]
        if host is not None:
            command = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host,
                       *command]
        argv += [*([":"] if i else []), "-np", "1", *command]
    return proc.run(argv, timeout=120, env=env, cwd=str(tmp_path))


def _fake_dist(folder: Path, name: str, version: str) -> str:
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return str(folder)


def test_ranks_with_other_variables_or_versions_are_named(tmp_path, run_env):
    other = _fake_dist(tmp_path / "other", "transformers", "4.0.0")
    ran = _mpmd(run_env, tmp_path, [
        (None, {}),
        (None, {"HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "3",
                "PYTHONPATH": other}),
        (None, {})])
    report = report_of(ran.stdout)
    assert ran.returncode == 0, explain(ran)  # a warning: the run itself worked
    env = report["distributed"]["environment"]
    [finding] = env["findings"]
    assert (finding["scope"], finding["odd"], finding["reference"]) == ("rank", [1], [0, 2])
    diffs = {d["fact"]: (d["reference"], d["odd"]) for d in finding["differences"]}
    assert diffs["$OMP_NUM_THREADS"] == ("1", "3")
    assert diffs["$HF_HOME"] == ("(not set)", str(tmp_path / "hf"))
    assert diffs["transformers"][1] == "4.0.0" and diffs["transformers"][0] != "4.0.0"
    assert statuses(report)["distributed.environment"] == "warn"
    assert statuses(report)["distributed.links"] == "skip"  # one host: no pairs


def test_an_interface_missing_on_one_rank_fails(tmp_path, run_env):
    ran = _mpmd(run_env, tmp_path, [(None, {"NCCL_SOCKET_IFNAME": "lo"}),
                                    (None, {"NCCL_SOCKET_IFNAME": "hsn"})])
    report = report_of(ran.stdout)
    assert ran.returncode == 1, explain(ran)
    [finding] = report["distributed"]["environment"]["findings"]
    assert finding["odd"] == [1]
    assert {"fact": "NCCL_SOCKET_IFNAME here", "reference": "lo (up)",
            "odd": "matches no interface here"} in finding["differences"]
    result = next(r for r in report["results"] if r["id"] == "distributed.environment")
    assert result["status"] == "fail" and "name an interface every host has" in result["fix"]


def test_hosts_are_grouped_by_hostname_and_every_pair_is_timed(tmp_path, run_env):
    _uts_or_skip()
    ran = _mpmd(run_env, tmp_path, [("h1", {}), ("h2", {}), ("h3", {"OMP_NUM_THREADS": "2"})])
    assert ran.returncode == 0, explain(ran)
    report = report_of(ran.stdout)
    dist = report["distributed"]
    assert [r["host"] for r in dist["ranks"]] == ["h1", "h2", "h3"]
    assert all(r["interface"] == "lo (GLOO_SOCKET_IFNAME=lo)" for r in dist["ranks"])
    [finding] = dist["environment"]["findings"]
    assert (finding["scope"], finding["odd"], finding["reference"]) == \
        ("host", ["h3"], ["h1", "h2"])
    assert finding["differences"] == [{"fact": "$OMP_NUM_THREADS", "reference": "1",
                                       "odd": "2"}]
    rows = dist["pairs"]["rows"]
    assert [r["hosts"] for r in rows] == [["h1", "h2"], ["h1", "h3"], ["h2", "h3"]]
    assert [r["ranks"] for r in rows] == [[0, 1], [0, 2], [1, 2]]
    assert all(r["busbw_gbps"] > 0 and r["bytes"] == 1 << 20 for r in rows)
    assert statuses(report)["distributed.links"] in ("ok", "warn")  # loopback on 2 busy cores


def _uts_or_skip():
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "--uts", "true"], capture_output=True, timeout=10).returncode != 0:
        pytest.skip("cannot make a UTS namespace here (needs root)")


@pytest.mark.slow  # the failing rank waits for rank 0's word before it leaves (~5 s)
def test_a_host_without_the_interface_is_named_with_what_it_said(tmp_path, run_env):
    _uts_or_skip()
    start = time.monotonic()
    ran = _mpmd(run_env, tmp_path, [("h1", {}), ("h2", {"GLOO_SOCKET_IFNAME": "hsn0"})],
                extra=["--timeout", "30"])
    assert time.monotonic() - start < 30  # named when it left, not at the deadline
    assert ran.returncode != 0, explain(ran)
    report = report_of(ran.stdout)
    [culprit] = report["distributed"]["failure"]["culprits"]
    assert (culprit["rank"], culprit["host"], culprit["state"]) == (1, "h2", "exited")
    assert "Unable to find address for: hsn0" in culprit["detail"]
    [finding] = report["distributed"]["environment"]["findings"]
    assert finding["odd"] == ["h2"] and {"fact": "GLOO_SOCKET_IFNAME here",
                                         "reference": "lo (up)",
                                         "odd": "hsn0 missing here"} in finding["differences"]
    assert statuses(report)["distributed.environment"] == "fail"
    assert "rank 1 on h2: " in ran.stderr  # the rank's own line names its host too


def test_gpu_model_and_driver_come_from_proc_without_cuda(tmp_path):
    # the layout and format of an H100 node (driver 580), recorded
    for index, bus in enumerate(("0000:18:00.0", "0000:2a:00.0")):
        folder = tmp_path / "proc/driver/nvidia/gpus" / bus
        folder.mkdir(parents=True)
        (folder / "information").write_text(
            "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 41\n"
            f"GPU UUID: \t GPU-803c7008-e64e-4954-052a-c94446579af{index}\nBus Type: \t PCIe\n")
    (tmp_path / "sys/module/nvidia").mkdir(parents=True)
    (tmp_path / "sys/module/nvidia/version").write_text("580.159.04\n")
    assert probe.gpu_facts(tmp_path) == {"gpu": "2 x NVIDIA H100 80GB HBM3",
                                         "gpu driver": "580.159.04"}
    assert probe.gpu_facts(tmp_path / "none") == {}  # no driver: nothing to compare
