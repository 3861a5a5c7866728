"""Every rank's environment, compared: one host (or rank) whose packages, variables,
/dev/shm, cache or interfaces differ from the others is named with the differing values.

Each rank computes its fingerprint (dsenv/facts/host/fingerprint.py, plus the lock hash of its
dsenv environment and, on GPUs, the NCCL torch runs) and puts only a 16-hex-digit digest of it
in its record; the whole table goes under ``fingerprint/<digest>`` in the job's store, sent by
the first rank that finds the key absent. Rank 0 groups the records by digest and fetches one
full table per distinct digest (at most ``max_distinct``, distributed.toml): with 1,000
identical hosts it receives 1,000 digests and one table, a few KiB. Facts listed as ``per_rank`` (the GPU visibility variables, one GPU per rank) stay out
of the digest and travel in the record; hosts are compared on the set of values of their ranks.

Grouping (:func:`compare`): ranks of one host are grouped first, and a rank that differs from
its host's other ranks is named by rank; then hosts are grouped by their majority table, and
the hosts outside the largest group (ties: the group with rank 0's host) are named, with
each differing fact as (the others' value, their value).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

from dsenv.doctor.distributed.command import AREA, defaults
from dsenv.doctor.distributed.outcome import RankRecord
from dsenv.facts.host.fingerprint import environment_fingerprint
from dsenv.provision import ProvisionError
from dsenv.provision.record.manifest import read_manifest
from dsenv.verdicts.findings import Result, Status

TITLE = "Same environment on every rank"
UNSET = "(not set)"  # a fact one side has and the other lacks
MAX_FINDINGS = 8  # findings listed in the report; the JSON keeps the count
MAX_DIFFERENCES = 12  # differing facts listed per finding


def settings() -> dict:
    return defaults()["fingerprint"]


# -- on every rank -------------------------------------------------------------------------------
def local_fingerprint(env: Mapping[str, str], backend: str) -> dict[str, str]:
    facts = environment_fingerprint(env)
    try:
        manifest = read_manifest(Path(sys.prefix))
    except ProvisionError as exc:
        facts["lock"] = f"manifest unreadable: {str(exc)[:80]}"
    else:
        if manifest is not None:
            facts["lock"] = f"{manifest.lock.get('file')} sha256 " \
                            f"{str(manifest.lock.get('sha256', '?'))[:16]}"
    if backend == "nccl":
        import torch  # torch: already imported by a rank on a GPU; the NCCL it really loads

        facts["nccl runtime"] = ".".join(str(p) for p in torch.cuda.nccl.version())
    return facts


def split(facts: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(facts every rank of a host should share, facts of this rank only)."""
    own = set(settings()["per_rank"])
    return ({k: v for k, v in facts.items() if k not in own},
            {k: v for k, v in facts.items() if k in own})


def digest(shared: Mapping[str, str]) -> str:
    text = json.dumps(dict(sorted(shared.items())), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def record_part(facts: Mapping[str, str]) -> tuple[dict, dict[str, str]]:
    """({"digest", "per_rank"} for the rank's record, the table for the store)."""
    shared, own = split(facts)
    return {"digest": digest(shared), "per_rank": own}, shared


# -- on rank 0 ------------------------------------------------------------------------------------
def fetch_tables(records: Mapping[int, RankRecord], get: Callable[[str], dict]
                 ) -> tuple[dict[str, dict], int]:
    """One full table per distinct digest (``get(digest)``), the most common first, at most
    max_distinct: ({digest: table}, number of distinct digests)."""
    counts = Counter(r["fingerprint"]["digest"] for r in records.values()
                     if r.get("fingerprint"))
    tables = {value: get(value) for value, _ in counts.most_common(settings()["max_distinct"])}
    return tables, len(counts)


def _majority(groups: dict, prefer) -> object:
    """The key of the largest group; a tie goes to the group holding ``prefer``."""
    best = max(len(members) for members in groups.values())
    tied = [key for key, members in groups.items() if len(members) == best]
    return next((key for key in tied if prefer in groups[key]), tied[0])


def _differences(reference: Mapping[str, str] | None, odd: Mapping[str, str] | None
                 ) -> list[dict]:
    if reference is None or odd is None:
        return [{"fact": "fingerprint", "reference": "?",
                 "odd": "not fetched (too many distinct fingerprints)"}]
    return [{"fact": key, "reference": reference.get(key, UNSET), "odd": odd.get(key, UNSET)}
            for key in sorted(set(reference) | set(odd))
            if reference.get(key, UNSET) != odd.get(key, UNSET)]


def _with_per_rank(table: dict | None, per_rank: Mapping[str, str]) -> dict | None:
    return None if table is None else {**table, **per_rank}


def compare(records: Mapping[int, RankRecord], tables: Mapping[str, dict],
            distinct: int | None = None) -> dict:
    """Group the ranks' fingerprints; findings name odd ranks (within a host) and odd hosts."""
    fail_on = set(settings()["fail_on"])
    by_host: dict[str, list[int]] = {}
    for rank in sorted(records):
        if records[rank].get("fingerprint"):
            by_host.setdefault(str(records[rank].get("host")), []).append(rank)
    findings = []
    host_keys: dict[str, tuple] = {}
    host_tables: dict[str, dict | None] = {}
    for host, members in by_host.items():
        groups: dict[str, list[int]] = {}
        for rank in members:
            groups.setdefault(records[rank]["fingerprint"]["digest"], []).append(rank)
        main = _majority(groups, members[0])
        for value, odd_ranks in groups.items():
            if value == main:
                continue
            diffs = _differences(tables.get(main), tables.get(value))
            findings.append({"scope": "rank", "odd": odd_ranks, "reference": groups[main],
                             "host": host, "differences": diffs,
                             "fail": any(d["fact"] in fail_on for d in diffs)})
        per_rank: dict[str, set[str]] = {}
        for rank in groups[main]:
            for key, val in records[rank]["fingerprint"].get("per_rank", {}).items():
                per_rank.setdefault(key, set()).add(val)
        aggregated = {key: " | ".join(sorted(vals)) for key, vals in per_rank.items()}
        host_keys[host] = (main, tuple(sorted(aggregated.items())))
        host_tables[host] = _with_per_rank(tables.get(main), aggregated)
    host_groups: dict[tuple, list[str]] = {}
    for host, key in host_keys.items():
        host_groups.setdefault(key, []).append(host)
    rank0_host = str(records[min(records)].get("host")) if records else None
    groups_out = [{"digest": key[0], "hosts": hosts,
                   "ranks": [r for h in hosts for r in by_host[h]]}
                  for key, hosts in sorted(host_groups.items(), key=lambda kv: -len(kv[1]))]
    if len(host_groups) > 1:
        main = _majority(host_groups, rank0_host)
        reference = host_groups[main]
        for key, odd_hosts in host_groups.items():
            if key == main:
                continue
            diffs = _differences(host_tables[reference[0]], host_tables[odd_hosts[0]])
            findings.append({"scope": "host", "odd": odd_hosts, "reference": reference,
                             "differences": diffs,
                             "fail": any(d["fact"] in fail_on for d in diffs)})
    return {"by": "host" if len(by_host) > 1 else "rank", "groups": groups_out,
            "hosts": len(by_host), "ranks": sum(len(m) for m in by_host.values()),
            "distinct": distinct if distinct is not None else len(tables),
            "findings": findings,
            "reference": host_tables.get(groups_out[0]["hosts"][0]) if groups_out else None}


# -- the report --------------------------------------------------------------------------------
def _names(items: list, scope: str, host: str | None = None) -> str:
    if scope == "rank":
        label = "rank" if len(items) == 1 else "ranks"
        return f"{label} {', '.join(map(str, items))}" + (f" on {host}" if host else "")
    return ", ".join(items)


def _quoted(value: str) -> str:
    return "not set" if value == UNSET else f"'{value}'"


def describe(finding: dict) -> str:
    """"h2 differs from h1, h3: transformers is '4.57.0' (h1, h3: '4.56.1'); ..." """
    odd = _names(finding["odd"], finding["scope"], finding.get("host"))
    ref = _names(finding["reference"], finding["scope"], finding.get("host"))
    ref_short = _names(finding["reference"], finding["scope"])
    parts = [f"{d['fact']} is {_quoted(d['odd'])} ({ref_short}: {_quoted(d['reference'])})"
             for d in finding["differences"][:MAX_DIFFERENCES]]
    more = len(finding["differences"]) - MAX_DIFFERENCES
    if more > 0:
        parts.append(f"{more} more")
    return f"{odd} differ{'s' if len(finding['odd']) == 1 else ''} from {ref}: " + \
        "; ".join(parts)


FIXES = (  # (fact prefix, fix), the first that matches each differing fact
    ("NCCL_SOCKET_IFNAME here", "name an interface every host has in NCCL_SOCKET_IFNAME "
     "(NCCL syntax: a prefix such as `hsn`, `=hsn0` for exactly one, `^lo,docker` to exclude)"),
    ("GLOO_SOCKET_IFNAME here", "name an interface every host has in GLOO_SOCKET_IFNAME "
     "(exact names, comma-separated), or leave it unset"),
    ("$", "export the same value in the job script before the launcher starts the ranks (the "
     "deepspeed launcher forwards only what .deepspeed_env lists; mpirun needs -x NAME)"),
    ("/dev/shm", "give every host the same /dev/shm (containers: --shm-size, or bind the "
     "host's /dev/shm)"),
    ("memlock", "ask the admins for the same `memlock unlimited` on every node"),
    ("hf assets", "copy the offline cache to every host, or put HF_HOME on a shared file "
     "system (`dsenv fetch` on a login node)"),
    ("gpu", "ask for one GPU model and driver in the job (a Slurm constraint or partition)"),
    ("", "run every rank from one environment: one prefix on a shared file system, or "
     "`dsenv provision` from one lock on every host"),
)


def fix_for(findings: list[dict]) -> str:
    """One fix per kind of differing fact, the most specific (FIXES' order) first."""
    chosen = {next(i for i, (prefix, _) in enumerate(FIXES) if diff["fact"].startswith(prefix))
              for finding in findings for diff in finding["differences"]}
    return "; ".join(FIXES[i][1] for i in sorted(chosen))


def result(environment: dict | None, reached: bool = True) -> Result:
    """The distributed.environment result from rank 0's comparison."""
    def make(status, summary, evidence=(), fix=None):
        return Result(f"{AREA}.environment", AREA, TITLE, status, summary, list(evidence), fix)

    if not environment or not environment.get("groups"):
        why = "ranks did not reach the rendezvous" if not reached else "no fingerprints"
        return make(Status.SKIP, f"not compared: {why}")
    findings = environment["findings"]
    where = (f"{environment['ranks']} ranks on {environment['hosts']} host"
             f"{'' if environment['hosts'] == 1 else 's'}")
    reference = environment.get("reference") or {}
    shown = [f"{k}: {reference[k]}" for k in ("torch", "deepspeed", "transformers", "nccl",
                                             "prefix", "lock") if k in reference]
    if not findings:
        return make(Status.OK, f"{where}: one environment fingerprint", shown)
    status = Status.FAIL if any(f["fail"] for f in findings) else Status.WARN
    ordered = [f for f in findings if f["scope"] == "host"] + \
        [f for f in findings if f["scope"] == "rank"]
    described = [describe(f) for f in ordered[:MAX_FINDINGS]]
    if len(ordered) > MAX_FINDINGS:
        described.append(f"{len(ordered) - MAX_FINDINGS} more groups differ (see --json)")
    return make(status, f"{where}: {described[0]}", described[1:] + shown, fix_for(ordered))
