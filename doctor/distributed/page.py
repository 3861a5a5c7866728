"""What ``dsenv doctor --distributed --html FILE`` adds to the doctor's page: busbw against
message size per collective with the expected bandwidth and the point the verdict read; the
host pairs as a heat map with the slow pairs outlined; each rank's arrival at the rendezvous
and its seconds per phase; the hosts' environment differences with the odd host highlighted.

The slow pairs are :func:`.pairs.slow_pairs`'s, the verdict's bounds distributed.toml's: the
page draws the doctor's own judgement, it does not judge again.
"""

from __future__ import annotations

from dsenv.doctor.distributed.command import defaults
from dsenv.doctor.distributed.outcome import RANK_PHASES, PairRow
from dsenv.doctor.distributed.pairs import slow_pairs
from dsenv.doctor.distributed.ranks import format_size
from dsenv.htmlreport import svg
from dsenv.htmlreport.page import esc, section, table


def sections(report: dict) -> list[str]:
    """The distributed sections, in the order a reader asks: is it fast, which link, which
    rank, which host differs."""
    dist = report.get("distributed")
    if not dist:
        return []
    return [section("Bus bandwidth", _busbw(dist), name="busbw"),
            section("Host pairs", _pairs(dist), name="pairs"),
            section("Ranks", _ranks(dist), name="ranks"),
            section("Environment by host", _environment(dist), name="environment")]


def _busbw(dist: dict) -> str:
    rows = [r for r in dist.get("allreduce") or [] if r.get("busbw_gbps") is not None]
    expected = dist.get("expect_busbw_gbps")
    band, hlines, marks = None, [], []
    if expected:
        verdict = defaults()["verdict"]
        band = (expected * verdict["ok_from"], expected * 1.5,
                f"ok from {verdict['ok_from']:.0%} of the expected {expected:g} GB/s")
        hlines = [(expected, f"expected {expected:g} GB/s ({dist.get('expect_source')})"),
                  (expected * verdict["warn_from"],
                   f"fails below {verdict['warn_from']:.0%} of the expected")]
    if rows:
        last = rows[-1]
        marks.append((last["bytes"], last["busbw_gbps"],
                      f"the verdict reads {last['busbw_gbps']:.2f} GB/s at "
                      f"{format_size(last['bytes'])}"))
    chart = svg.Chart("busbw", f"all-reduce, {dist.get('world_size')} ranks "
                      f"({dist.get('backend')})", "message size", "busbw (GB/s)",
                      [svg.Series("all-reduce busbw", [(r["bytes"], r["busbw_gbps"])
                                                       for r in rows], dots=True)],
                      log2_x=True, band=band, hlines=hlines, marks=marks,
                      x_format=lambda v: format_size(int(v)))
    note = "" if expected else (f'<p class="note">{esc(dist.get("expect_source") or "")}</p>')
    cells = [(format_size(r["bytes"]), f"{r.get('time_us', 0):.1f}", f"{r['algbw_gbps']:.3f}",
              f"{r['busbw_gbps']:.3f}", r.get("wrong")) for r in rows]
    return (f'<div class="plots">{svg.line_chart(chart)}</div>{note}'
            + table(("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"), cells,
                    name="allreduce"))


def _pairs(dist: dict) -> str:
    plan = dist.get("pairs") or {}
    rows = [PairRow.from_json(r) for r in plan.get("rows") or []]
    if not rows:
        return f'<p class="note">{esc(plan.get("selection") or "host pairs not timed")}</p>'
    hosts = list(dict.fromkeys(h for r in rows for h in r.hosts))
    index = {h: i for i, h in enumerate(hosts)}
    reference, slow, common = slow_pairs(rows)
    cells = {(index[r.hosts[0]], index[r.hosts[1]]): r.busbw_gbps for r in rows}
    marked = {(index[r.hosts[0]], index[r.hosts[1]]) for r in slow}
    said = (f"{len(slow)} slow pair(s), below the threshold against the pairs' reference "
            f"{reference:.3f} GB/s" + (f"; {', '.join(common)} in every slow pair" if common
                                       else "")) if slow else "no slow pair"
    listing = table(("host pair", "ranks", "busbw (GB/s)", "slow"),
                    [(f"{r.hosts[0]} - {r.hosts[1]}", f"{r.ranks[0]}, {r.ranks[1]}",
                      f"{r.busbw_gbps:.3f}", "slow" if r in slow else "")
                     for r in sorted(rows, key=lambda r: r.busbw_gbps)], name="pairs")
    return (f'<p class="pairs-verdict" data-slow="{len(slow)}">{esc(said)} '
            f'({esc(plan.get("selection"))})</p>'
            + svg.heat_map("pairs", "busbw between host pairs (GB/s)", hosts, cells,
                           unit="GB/s", marked=marked) + listing)


def _ranks(dist: dict) -> str:
    """When each rank arrived (after the first) and its seconds per phase."""
    records = dist.get("ranks") or []
    arrived = [r["arrived_epoch"] for r in records if r.get("arrived_epoch")]
    first = min(arrived) if arrived else None
    rows = []
    for r in records:
        phases = r.get("phases") or {}
        late = (f"+{r['arrived_epoch'] - first:.3f} s" if first is not None
                and r.get("arrived_epoch") else "-")
        rows.append((r.get("rank"), r.get("host"), r.get("device"), r.get("interface"), late,
                     *(f"{phases[p]:.3f}" if p in phases else "-" for p in RANK_PHASES)))
    series = [svg.Series(name[:-2], [(r["rank"], (r.get("phases") or {}).get(name))
                                     for r in records if (r.get("phases") or {}).get(name)
                                     is not None], dots=True, line=False)
              for name in RANK_PHASES]
    if first is not None:
        series.insert(0, svg.Series("arrival after the first", [
            (r["rank"], r["arrived_epoch"] - first) for r in records if r.get("arrived_epoch")],
            dots=True, line=False))
    chart = svg.Chart("ranks", "Per rank: arrival and phases", "rank", "seconds", series,
                      x_format=lambda v: str(int(v)) if v == int(v) else "")
    return (f'<div class="plots">{svg.line_chart(chart)}</div>'
            + table(("rank", "host", "device", "interface", "arrived",
                     *(f"{p[:-2]} (s)" for p in RANK_PHASES)), rows, name="ranks"))


def _environment(dist: dict) -> str:
    env = dist.get("environment") or {}
    groups = env.get("groups") or []
    findings = env.get("findings") or []
    odd = {h for f in findings if f.get("scope") == "host" for h in f.get("odd", [])}
    letters = {g["digest"]: chr(ord("A") + i) if i < 26 else "+" for i, g in enumerate(groups)}
    host_rows = [(h, letters[g["digest"]], ", ".join(map(str, g["ranks"])),
                  "differs from the rest" if h in odd else "")
                 for g in groups for h in g["hosts"]]
    out = table(("host", "environment", "ranks", ""), host_rows, name="hosts",
                row_class=["odd" if row[0] in odd else "" for row in host_rows])
    for f in findings:
        who = ", ".join(map(str, f.get("odd", [])))
        ref = ", ".join(map(str, f.get("reference", [])))
        cells = [(esc(d["fact"]), esc(d["reference"]), f'<span>{esc(d["odd"])}</span>')
                 for d in f.get("differences", [])]
        out += (f"<h3>{esc(f.get('scope'))} {esc(who)} against {esc(ref)}"
                f"{' (fails the run)' if f.get('fail') else ''}</h3>"
                + table(("fact", f"reference ({ref})", f"odd ({who})"), cells, raw=True,
                        name="differences").replace("<td><span>", '<td class="differs"><span>'))
    if not findings:
        out += '<p class="note">every host has the same environment</p>'
    return out
