"""One fix per catalogue mode: the doctor's finding for a cause and `dsenv explain` print the
same text, the mode's ``fix`` in doctor/modes/*.toml (issue 24, item 5).

- every mode with a ``check`` is named by the module that registers that check (a literal id
  in ``mode_finding(verdict, "MODE", ...)`` or ``mode="MODE"``, found by AST in
  doctor/checks/), and every mode id a check module names exists and names one of the
  checks that module registers;
- a finding that names a mode carries exactly the catalogue's fix (mode_finding builds it so;
  a Finding built by hand with ``mode=`` and its own fix is drift);
- end to end on real material: the Open MPI message through `dsenv explain`, the doctor's
  mpi.launch on this node's Debian Open MPI under srun --mpi=pmi2, and `dsenv explain --here`
  print one fix.

Each cross-check runs on the shipped tree (no drift) and on a doctored copy (drift reported).
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dsenv.doctor import catalogue
from dsenv.verdicts.findings import Finding, Status, fail, warn
from tests.harness.cli import dsenv

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ROOT / "doctor" / "checks"
HELPER = "mode_finding"


@dataclass
class Named:
    """One check module: the checks it registers, the mode ids each check's code names (its
    function and the module's functions it calls, transitively), each id with its line, and
    the lines that name a mode in a way the cross-check cannot read."""

    checks: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    dynamic: list[int] = field(default_factory=list)

    def reaching(self, mode_id: str) -> list[str]:
        """The checks whose code names ``mode_id``."""
        return [c for c, ids in self.checks.items() if any(i == mode_id for i, _ in ids)]


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def named_in(source: str) -> Named:
    """The checks a module registers (``@check("id", ...)``) and the modes their code names:
    the id argument of ``mode_finding``, ``mode=`` / ``*_mode=`` keywords and
    ``mode_id("...")`` (an id a check picks before it reports), as a literal, a conditional
    between literals or a module constant. Another name or expression is a variable holding
    an id named so elsewhere; an id built from pieces (an f-string, ``+``) cannot be read."""
    tree = ast.parse(source)
    consts = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
              for target in node.targets if isinstance(target, ast.Name)
              and _literal(node.value) is not None}
    found = Named()

    def ids(arg: ast.AST) -> list[str] | None:
        if _literal(arg) is not None:
            return [_literal(arg)]
        if isinstance(arg, ast.IfExp):
            both = (ids(arg.body), ids(arg.orelse))
            return None if None in both else both[0] + both[1]
        if isinstance(arg, ast.Name):
            return [consts[arg.id]] if arg.id in consts else []
        return None if isinstance(arg, (ast.JoinedStr, ast.BinOp)) else []

    def scan(func: ast.AST) -> tuple[list[tuple[str, int]], set[str]]:
        """(mode ids named in ``func``, the names it calls)."""
        named, calls = [], set()
        for node in ast.walk(func):
            if not isinstance(node, ast.Call):
                continue
            name = _name(node.func)
            calls.add(name)
            args = [node.args[1]] if name == HELPER and len(node.args) >= 2 else []
            args += node.args[:1] if name == "mode_id" else []
            args += [k.value for k in node.keywords
                     if k.arg and (k.arg == "mode" or k.arg.endswith("_mode"))]
            for arg in args:
                read = ids(arg)
                if read is None:
                    found.dynamic.append(node.lineno)
                else:
                    named += [(mode_id, node.lineno) for mode_id in read if mode_id]
        return named, calls

    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    scanned = {name: scan(f) for name, f in functions.items()}
    for name, func in functions.items():
        registered = [_literal(d.args[0]) for d in func.decorator_list
                      if isinstance(d, ast.Call) and _name(d.func) == "check" and d.args]
        if not registered or registered[0] is None:
            continue
        seen, todo, named = set(), [name], []
        while todo:
            current = todo.pop()
            if current in seen or current not in scanned:
                continue
            seen.add(current)
            named += scanned[current][0]
            todo += sorted(scanned[current][1])
        found.checks[registered[0]] = named
    return found


def modules(root: Path = CHECKS) -> dict[str, Named]:
    return {str(p.relative_to(root)): named_in(p.read_text()) for p in sorted(root.rglob("*.py"))}


def mode_drift(modes: Iterable[catalogue.Mode], named: Mapping[str, Named]) -> list[str]:
    """Where the catalogue's modes and the checks disagree on who reports what: a mode whose
    check never names it, an id no mode has, an id named by checks the mode does not name."""
    modes = list(modes)
    by_id = {m.id: m for m in modes}
    home = {check: path for path, n in named.items() for check in n.checks}
    found = []
    for m in modes:
        if not m.check:
            continue
        path = home.get(m.check)
        if path is None:
            found.append(f"{m.id}: check {m.check!r} is registered by no module in doctor/checks/")
        elif m.check not in named[path].reaching(m.id):
            found.append(f"{m.id}: its check {m.check} ({path}) never names it: its finding "
                         f"for this cause does not carry the catalogue's fix")
    for path, n in named.items():
        found += [f"{path}:{line}: names a mode by a non-literal (the cross-check cannot read it)"
                  for line in n.dynamic]
        for mode_id, line in sorted({x for ids in n.checks.values() for x in ids}):
            m = by_id.get(mode_id)
            if m is None:
                found.append(f"{path}:{line}: names mode {mode_id!r}, not in doctor/modes/")
            elif m.check not in n.reaching(mode_id):
                found.append(f"{path}:{line}: names mode {mode_id!r}, whose check is "
                             f"{m.check or 'none'!r}, not a check that reaches this line "
                             f"({', '.join(n.reaching(mode_id))})")
    return found


def finding_drift(findings: Iterable[Finding], modes: Iterable[catalogue.Mode]) -> list[str]:
    """Findings that name a mode and carry another fix than the catalogue's."""
    fixes = {m.id: m.fix for m in modes}
    found = []
    for f in findings:
        if not f.mode:
            continue
        if f.mode not in fixes:
            found.append(f"{f.summary!r} names mode {f.mode!r}, not in doctor/modes/")
        elif f.fix != fixes[f.mode]:
            found.append(f"{f.summary!r} names {f.mode} but its fix is {f.fix!r}, not the "
                         f"catalogue's {fixes[f.mode]!r}")
    return found


# -- the shipped tree ---------------------------------------------------------------------------


def test_every_mode_with_a_check_is_named_by_that_check():
    assert mode_drift(catalogue.modes(), modules()) == []


def test_the_cross_check_sees_every_registered_check():
    """The AST finds the same checks the registry holds (it reads what the doctor runs)."""
    from dsenv.doctor import registry

    found = sorted(c for n in modules().values() for c in n.checks)
    assert found == sorted(c.id for c in registry.all_checks())


def test_mode_finding_carries_the_catalogue_fix_and_the_specifics_as_here_lines():
    m = next(m for m in catalogue.modes() if m.check)
    found = catalogue.mode_finding(fail, m.id, "summary", "seen: x", here="run `this`")
    assert (found.status, found.mode, found.fix) == (Status.FAIL, m.id, m.fix)
    assert found.evidence == ("seen: x", "here: run `this`")
    assert finding_drift([found], catalogue.modes()) == []
    with pytest.raises(KeyError):
        catalogue.mode_finding(warn, "no.such-mode", "summary")


# -- doctored copies: each cross-check reports the drift -----------------------------------------


def test_doctored_check_module_is_caught(tmp_path):
    copy = tmp_path / "checks"
    shutil.copytree(CHECKS, copy)
    mpi = copy / "job" / "mpi.py"
    source = mpi.read_text()
    assert '"mpi.ompi-no-slurm-pmi"' in source
    mpi.write_text(source.replace('"mpi.ompi-no-slurm-pmi"', '"mpi.no-such-mode"')
                   .replace('"mpi.run-as-root"', '"mpi.mpi4py-other-mpi"'))
    drift = "\n".join(mode_drift(catalogue.modes(), modules(copy)))
    assert "mpi.ompi-no-slurm-pmi: its check mpi.launch (job/mpi.py) never names it" in drift
    assert "names mode 'mpi.no-such-mode', not in doctor/modes/" in drift
    assert "mpi.run-as-root: its check mpi.launch" in drift
    # mpi.mpi4py-other-mpi's check (mpi.mpi4py) is in mpi.py too: named twice is not drift
    mpi.write_text(source.replace('mode_finding(warn, "mpi.run-as-root"',
                                  'mode_finding(warn, "mpi." + "run-as-root"'))
    drift = mode_drift(catalogue.modes(), modules(copy))
    assert any("non-literal" in d for d in drift)
    assert any(d.startswith("mpi.run-as-root: its check mpi.launch") for d in drift)


def test_doctored_catalogue_is_caught():
    shipped = list(catalogue.modes())
    moved = [m if m.id != "mpi.ompi-no-slurm-pmi" else
             catalogue.Mode(**{**m.__dict__, "check": "mpi.ompi-support"}) for m in shipped]
    drift = mode_drift(moved, modules())
    assert any(d.startswith("mpi.ompi-no-slurm-pmi: its check mpi.ompi-support") for d in drift)
    assert any("names mode 'mpi.ompi-no-slurm-pmi', whose check is 'mpi.ompi-support', not a "
               "check that reaches this line (mpi.launch, mpi.launch-probe)" in d for d in drift)
    unknown = [m if m.id != "mpi.run-as-root" else
               catalogue.Mode(**{**m.__dict__, "check": "mpi.no-such-check"}) for m in shipped]
    assert any("registered by no module" in d for d in mode_drift(unknown, modules()))


def test_doctored_finding_is_caught():
    own = Finding(Status.FAIL, "OMPI crash", (), "`srun --mpi=pmix`", mode="mpi.ompi-no-slurm-pmi")
    assert "not the catalogue's" in "".join(finding_drift([own], catalogue.modes()))
    stray = Finding(Status.WARN, "x", (), "y", mode="mpi.no-such-mode")
    assert "not in doctor/modes/" in "".join(finding_drift([stray], catalogue.modes()))


# -- the whole doctor on this machine -------------------------------------------------------------


def test_every_finding_that_names_a_mode_here_carries_its_fix(tmp_path):
    """`dsenv doctor --json` on this machine: each result naming a mode has the mode's fix."""
    import json

    out = dsenv("doctor", "--json", timeout=600)
    report = json.loads(out.stdout)
    results = [Finding(Status(r["status"]), r["summary"], tuple(r["evidence"]), r["fix"],
                       mode=r.get("mode", "")) for r in report["results"]]
    assert finding_drift(results, catalogue.modes()) == []
    assert all(r.get("mode", "") == "" or r["status"] in ("fail", "warn")
               for r in report["results"])  # a mode is named where a check reports its cause


# -- end to end: the Open MPI message -------------------------------------------------------------

HAVE_OMPI = shutil.which("ompi_info") is not None and shutil.which("mpirun") is not None
OMPI_TEXT = ("The application appears to have been direct launched using \"srun\",\n"
             "but OMPI was not built with SLURM's PMI support and therefore cannot\n"
             "execute. There are several options for building PMI support under\n"
             "SLURM, depending upon the SLURM version you are using:\n"
             "*** An error occurred in MPI_Init\n"
             "*** on a NULL communicator\n")


@pytest.mark.skipif(not HAVE_OMPI, reason="needs this machine's Open MPI (ompi_info, mpirun)")
def test_ompi_message_explain_doctor_and_here_print_one_fix(tmp_path):
    """The Debian Open MPI 4.1 here has a pmix component (ext3x); under srun --mpi=pmi2 (as
    tests/test_doctor_mpi.py builds the crash) the doctor predicts the crash. explain, the
    doctor and explain --here print the catalogue's one fix; the doctor adds this node's
    command as a "here:" line."""
    import json

    fix = catalogue.fix_for("mpi.ompi-no-slurm-pmi")
    log = tmp_path / "slurm-42.out"
    log.write_text(OMPI_TEXT)
    explained = json.loads(dsenv("explain", "--json", str(log)).stdout)
    first = explained["matches"][0]
    assert first["id"] == "mpi.ompi-no-slurm-pmi" and first["fix"] == fix
    assert first["check"] == "mpi.launch"

    env = {"SLURM_MPI_TYPE": "pmi2"}
    doctor = json.loads(dsenv("doctor", "--json", "--launcher", "srun", "--only", "mpi",
                              env=env).stdout)
    launch = next(r for r in doctor["results"] if r["id"] == "mpi.launch")
    assert launch["status"] in ("fail", "warn") and "OMPI was not built" in launch["summary"]
    assert launch["mode"] == "mpi.ompi-no-slurm-pmi" and launch["fix"] == fix
    assert "here: `srun --mpi=pmix`" in "\n".join(launch["evidence"])

    here = " ".join(dsenv("explain", "--here", str(log), env=env).stdout.split())
    assert "on this node mpi.launch finds:" in here and "OMPI was not built" in here
    assert f"fix here: {fix}" in here  # the same text explain and the doctor print
    assert "here: `srun --mpi=pmix`" in here
