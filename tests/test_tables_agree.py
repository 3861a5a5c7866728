"""Every fact has one home, and every table that names it agrees with that home: the next
drift fails here. Each cross-check is a function over parsed tables that lists the drift
it finds; each runs once on the shipped tables (no drift) and once on a doctored copy (the
drift reported), so none of them can pass by not looking.

- workload names: workloads/workloads.toml (registry.py) against the `dsenv smoke|run`
  choices, `smoke all`, fetch and the doctor's --for, `dsenv launch`, references.toml,
  assets.toml, and each module's NAME, perf keys and contract (workloads/contract.py);
- launchers: envs/launchers.toml against the --launcher choices of `dsenv doctor` and
  `dsenv launch`, the launch lines, the site profiles;
- fix kinds: doctor/fix/actions.py's KINDS against the fixers, the report schema's
  action.kind enum and doctor/modes/*.toml's `fixable`;
- JIT times: envs/training_stack.toml's [[deepspeed.jit_build]] is the only table or module
  that gives an op a time, once per op, and every op a run or the doctor names has one.
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib
import json
import re
import sys
import types
from collections.abc import Iterable, Mapping
from pathlib import Path

from dsenv.cli import build_parser
from dsenv.data import load_table, tomllib
from dsenv.doctor import catalogue
from dsenv.doctor.fix import actions, fixers
from dsenv.envs import launchers, training_stack
from dsenv.envs.sites import load_site
from dsenv.workloads import cli, contract, registry
from dsenv.workloads.fetch import assets
from dsenv.workloads.training import dsconfig

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("dsenv", "envs", "doctor", "provision", "workloads")
SCHEMA = json.loads((ROOT / "doctor" / "report_schema.json").read_text())


def _choices(parser: argparse.ArgumentParser, command: str, dest: str) -> tuple:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices[command]._actions if a.dest == dest)
    return tuple(action.choices or ())


def _diff(what: str, got: Iterable[str], home: Iterable[str], home_name: str) -> list[str]:
    got, home = list(got), list(home)
    found = [f"{what} names {name!r}, not in {home_name}" for name in got if name not in home]
    found += [f"{what} lacks {name!r} of {home_name}" for name in home if name not in got]
    if not found and got != home:
        found.append(f"{what} lists {got}, in another order than {home_name} {home}")
    return found


# -- workload names ---------------------------------------------------------------------------
def workload_drift(workloads: Mapping, references: Mapping, asset_table: Mapping,
                   choices: Mapping[str, Iterable[str]],
                   modules: Mapping[str, types.ModuleType]) -> list[str]:
    """The drift between the registry (a parsed workloads.toml) and everything else that
    names a workload: ``choices`` (what each command offers, by command), references.toml
    and assets.toml (parsed), and the modules (name -> module)."""
    entries = registry.read(workloads)
    found = []
    wanted = {"smoke": [n for n, e in entries.items() if e.smoke],
              "run": [n for n, e in entries.items() if e.full],
              "fetch": [n for n, e in entries.items() if e.assets]}
    for command, offered in choices.items():
        found += _diff(command, offered, wanted[command.split()[0]], "workloads.toml")
    keys = {key: name for name, e in entries.items() for key in e.references.values()}
    found += [f"references.toml [{key}] belongs to no workload in workloads.toml"
              for key in references if key not in keys]
    for name, e in entries.items():
        found += [f"{name}: references mode {mode!r} is not smoke or full"
                  for mode in e.references if mode not in registry.MODES]
        found += [f"{name}: asset {a!r} is not declared in assets.toml"
                  for a in e.assets if a not in asset_table["asset"]]
        module = modules.get(name)
        if module is None:
            found.append(f"{name}: module {e.module} is not loaded")
            continue
        if getattr(module, "NAME", None) != name:
            found.append(f"{e.module}.NAME is {getattr(module, 'NAME', None)!r}, not {name!r}")
        found += [f"{e.module}: {problem}" for problem in contract.problems(module)]
        for mode, settings in (("smoke", "SMOKE"), ("full", "FULL")):
            key = getattr(getattr(module, settings, None), "perf_key", None)
            if key != e.references.get(mode, ""):
                found.append(f"{e.module}.{settings}.perf_key is {key!r}, workloads.toml "
                             f"says {e.references.get(mode, '')!r}")
    used = {a for e in entries.values() for a in e.assets}
    found += [f"assets.toml [asset.{a}] is used by no workload"
              for a in asset_table["asset"] if a not in used]
    return found


def shipped_choices() -> dict[str, tuple]:
    parser = build_parser()
    smoke = _choices(parser, "smoke", "workload")
    return {"smoke": tuple(n for n in smoke if n != cli.SMOKE_ALL),
            "smoke all": tuple(cli.SMOKE_WORKLOADS),
            "run": _choices(parser, "run", "workload"),
            "fetch": assets.WORKLOAD_NAMES,  # also the doctor's --for (doctor/command.py)
            "smoke launch": registry.smoke_names(),
            "run launch": registry.full_names()}


def shipped_modules() -> dict[str, types.ModuleType]:
    return {name: registry.load_module(name) for name in registry.names()}


def test_workload_names_have_one_home():
    tables = (load_table("dsenv.workloads", "workloads.toml"),
              load_table("dsenv.workloads", "references.toml"),
              load_table("dsenv.workloads", "assets.toml"))
    assert workload_drift(*tables, shipped_choices(), shipped_modules()) == []
    assert cli.SMOKE_ALL in _choices(build_parser(), "smoke", "workload")


def test_workload_drift_is_reported():
    workloads, references, asset_table = (
        copy.deepcopy(load_table("dsenv.workloads", name))
        for name in ("workloads.toml", "references.toml", "assets.toml"))
    modules = shipped_modules()
    workloads["workload"]["llama-tiny"] = {"module": "dsenv.workloads.llama", "smoke": "x",
                                           "assets": ["llama-7b"]}
    workloads["workload"]["bert-mrpc"]["references"]["smoke"] = "bert-mrpc-tiny"
    references["vit-smoke"] = [{"device": "cpu:*", "samples_per_s": 1, "tolerance": 0.5}]
    asset_table["asset"]["orphan"] = {"kind": "model", "repo": "a/b", "revision": "main"}
    broken = types.ModuleType("broken")
    broken.NAME = "t5"
    modules = {**modules, "t5-xsum": broken}
    drift = workload_drift(workloads, references, asset_table, shipped_choices(), modules)
    for expected in ("smoke lacks 'llama-tiny' of workloads.toml",
                     "smoke all lacks 'llama-tiny'", "smoke launch lacks 'llama-tiny'",
                     "fetch lacks 'llama-tiny'",
                     "llama-tiny: asset 'llama-7b' is not declared in assets.toml",
                     "llama-tiny: module dsenv.workloads.llama is not loaded",
                     "references.toml [vit-smoke] belongs to no workload",
                     "references.toml [bert-mrpc-smoke] belongs to no workload",
                     "dsenv.workloads.bert_mrpc.SMOKE.perf_key is 'bert-mrpc-smoke', "
                     "workloads.toml says 'bert-mrpc-tiny'",
                     "assets.toml [asset.orphan] is used by no workload",
                     "dsenv.workloads.t5_xsum.NAME is 't5', not 't5-xsum'",
                     "dsenv.workloads.t5_xsum: no write_synthetic",
                     "dsenv.workloads.t5_xsum: neither COLUMNS and SPLITS"):
        assert any(line.startswith(expected) for line in drift), (expected, drift)
    # a command that offers a name the registry does not have, or another order
    choices = {**shipped_choices(), "run": ("t5-xsum", "bert-squad", "gpt2-wikitext",
                                            "bert-mrpc", "vit")}
    drift = workload_drift(load_table("dsenv.workloads", "workloads.toml"),
                           load_table("dsenv.workloads", "references.toml"),
                           load_table("dsenv.workloads", "assets.toml"), choices,
                           shipped_modules())
    assert drift == ["run names 'vit', not in workloads.toml"]
    choices["run"] = choices["run"][:-1]
    drift = workload_drift(load_table("dsenv.workloads", "workloads.toml"),
                           load_table("dsenv.workloads", "references.toml"),
                           load_table("dsenv.workloads", "assets.toml"), choices,
                           shipped_modules())
    assert len(drift) == 1 and "in another order than workloads.toml" in drift[0]


def test_the_contract_catches_a_hook_with_other_parameters():
    module = types.ModuleType("doctored")
    shipped = registry.load_module("bert-mrpc")
    for name in contract.members(contract.Workload):
        setattr(module, name, getattr(shipped, name))
    module.COLUMNS, module.SPLITS = shipped.COLUMNS, shipped.SPLITS
    assert contract.problems(module) == [] and isinstance(module, contract.Workload)
    module.samples = lambda data: (0, "", "")
    module.prepare = lambda data, init_model, s, args: data  # without preparing
    module.PACKAGES = lambda: {}
    module.run = lambda args, how="smoke": 0  # the command line passes mode=
    assert contract.problems(module) == [
        "samples(data) cannot be called as samples(data: 'Any', s: 'Settings') -> "
        "'tuple[int, str, str]': too many positional arguments",
        "run(args, how='smoke') cannot be called as run(args: 'Any', mode: 'str' = 'smoke') "
        "-> 'int': got an unexpected keyword argument 'mode'",
        "Prepares half kept: has prepare, not preparing",
        "PACKAGES is a function, not a constant"]


def test_smoke_all_runs_the_registry_smokes_in_order(monkeypatch, tmp_path):
    handed = []
    monkeypatch.setattr(cli, "run_all", lambda args, names: handed.extend(names) or 0)
    args = argparse.Namespace(workload=cli.SMOKE_ALL, command="smoke", workload_mode="smoke",
                              output_dir=str(tmp_path / "{workload}-{mode}"),
                              probe_timeout=cli.DEFAULT_PROBE_TIMEOUT)
    assert cli.run_workload_command(args) == 0
    assert handed == list(registry.smoke_names()) == list(cli.SMOKE_WORKLOADS)


def test_lr_scalings_have_one_home():
    assert _choices(build_parser(), "smoke", "lr_scaling") == dsconfig.LR_SCALINGS
    assert cli.LR_SCALINGS is dsconfig.LR_SCALINGS


# -- launchers --------------------------------------------------------------------------------
def launcher_drift(table: Mapping, choices: Mapping[str, Iterable[str]],
                   sites: Mapping[str, str]) -> list[str]:
    """The drift between envs/launchers.toml (parsed) and what offers or names a launcher:
    ``choices`` by command, ``sites``: profile -> its launcher ("" for none)."""
    home = list(table["launcher"])
    found = []
    for command, offered in choices.items():
        found += _diff(command, offered, home, "envs/launchers.toml")
    found += [f"site {site}: launcher {name!r} is not in envs/launchers.toml"
              for site, name in sites.items() if name and name not in home]
    found += [f"[launcher.{name}] tasks_per_node {spec.get('tasks_per_node')!r} is not "
              "'ranks' or 'one'" for name, spec in table["launcher"].items()
              if spec.get("tasks_per_node") not in ("ranks", "one")]
    return found


def shipped_launcher_choices() -> dict[str, tuple]:
    parser = build_parser()
    return {"envs/launchers.py LAUNCHERS": launchers.LAUNCHERS,
            "dsenv doctor --launcher": _choices(parser, "doctor", "launcher"),
            "dsenv launch --launcher": _choices(parser, "launch", "launcher")}


def shipped_sites() -> dict[str, str]:
    names = [p.stem for p in (ROOT / "envs" / "sites").glob("*.toml")]
    return {name: load_site(name).launcher or "" for name in names}


def test_launchers_have_one_home():
    table = launchers.launch_table()
    assert launcher_drift(table, shipped_launcher_choices(), shipped_sites()) == []
    ranks = [n for n, s in table["launcher"].items() if s["tasks_per_node"] == "ranks"]
    assert launchers.TASK_PER_RANK == tuple(ranks) == ("srun", "mpirun")
    assert not (ROOT / "workloads" / "launchers.toml").exists()


def test_launcher_drift_is_reported():
    table = copy.deepcopy(launchers.launch_table())
    table["launcher"]["flux"] = {"title": "flux run", "tasks_per_node": "some", "words": []}
    sites = {**shipped_sites(), "mars": "pbsdsh"}
    drift = launcher_drift(table, shipped_launcher_choices(), sites)
    assert drift == [
        "envs/launchers.py LAUNCHERS lacks 'flux' of envs/launchers.toml",
        "dsenv doctor --launcher lacks 'flux' of envs/launchers.toml",
        "dsenv launch --launcher lacks 'flux' of envs/launchers.toml",
        "site mars: launcher 'pbsdsh' is not in envs/launchers.toml",
        "[launcher.flux] tasks_per_node 'some' is not 'ranks' or 'one'"]


# -- fix kinds --------------------------------------------------------------------------------
def schema_kinds(schema: Mapping) -> list[str]:
    action = schema["properties"]["results"]["items"]["properties"]["action"]
    return list(action["properties"]["kind"]["enum"])


def fix_kind_drift(kinds: Iterable[str], fixer_kinds: Iterable[str], schema: Mapping,
                   fixable: Mapping[str, str]) -> list[str]:
    """The drift between the fix kinds (doctor/fix/actions.py's KINDS, their home) and the
    fixers, the report schema (parsed) and the catalogue (mode id -> its ``fixable``)."""
    kinds = list(kinds)
    found = _diff("FIXERS", sorted(fixer_kinds), sorted(kinds), "KINDS")
    found += _diff("report_schema.json action.kind", sorted(schema_kinds(schema)),
                   sorted(kinds), "KINDS")
    found += [f"catalogue.toml {mode}: fixable {kind!r} is not one of KINDS"
              for mode, kind in fixable.items() if kind and kind not in kinds]
    return found


def shipped_fixable() -> dict[str, str]:
    return {mode.id: mode.fixable for mode in catalogue.modes()}


def test_fix_kinds_have_one_home():
    assert fix_kind_drift(actions.KINDS, fixers.FIXERS, SCHEMA, shipped_fixable()) == []


def test_fix_kind_drift_is_reported():
    schema = copy.deepcopy(SCHEMA)
    action = schema["properties"]["results"]["items"]["properties"]["action"]
    action["properties"]["kind"]["enum"].remove("create-cache-dir")
    fixer_kinds = [k for k in fixers.FIXERS if k != "remove-stale-lock"] + ["reboot"]
    fixable = {**shipped_fixable(), "jit.stale-extension-lock": "remove-stale-locks"}
    drift = fix_kind_drift(actions.KINDS, fixer_kinds, schema, fixable)
    assert drift == [
        "FIXERS names 'reboot', not in KINDS",
        "FIXERS lacks 'remove-stale-lock' of KINDS",
        "report_schema.json action.kind lacks 'create-cache-dir' of KINDS",
        "catalogue.toml jit.stale-extension-lock: fixable 'remove-stale-locks' is not one "
        "of KINDS"]


# -- JIT times --------------------------------------------------------------------------------
def timed_rows(tree: object, where: str) -> list[tuple[str, str, object]]:
    """(where, op, seconds) of every table row anywhere in ``tree`` that gives an op a time."""
    if isinstance(tree, dict):
        found = [(where, str(tree["op"]), tree["seconds"])] \
            if "op" in tree and "seconds" in tree else []
        for key, value in tree.items():
            found += timed_rows(value, f"{where}.{key}")
        return found
    if isinstance(tree, list):
        return [row for index, item in enumerate(tree)
                for row in timed_rows(item, f"{where}[{index}]")]
    return []


HOME = "envs/training_stack.toml.deepspeed.jit_build"


def jit_drift(tables: Mapping[str, dict], sources: Mapping[str, str],
              named_ops: Iterable[str]) -> list[str]:
    """The drift of the JIT times: ``tables`` (path -> parsed TOML) may give an op a time only
    in [[deepspeed.jit_build]], once per op; ``sources`` (path -> Python text) give none; every
    op in ``named_ops`` (what a run or the doctor names) has its time there."""
    rows = [row for path, table in tables.items() for row in timed_rows(table, path)]
    found = [f"{where} gives {op} {seconds} s: only {HOME} may" for where, op, seconds in rows
             if not where.startswith(HOME + "[")]
    home = [op for where, op, _ in rows if where.startswith(HOME + "[")]
    found += [f"{HOME} gives {op} {home.count(op)} times" for op in sorted(set(home))
              if home.count(op) > 1]
    ops = sorted(set(named_ops) | set(home))
    names = "|".join(map(re.escape, ops))
    pattern = re.compile(rf"""["']({names})["']\s*:\s*\d""")
    for path, text in sources.items():
        found += [f"{path}: {m.group(1)} has a time of its own ({m.group(0)!r})"
                  for m in pattern.finditer(text)]
    found += [f"{op} is named by a run or the doctor and has no time in {HOME}"
              for op in sorted(set(named_ops)) if op not in home]
    return found


def shipped_tables() -> dict[str, dict]:
    found = {}
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.toml")):
            found[path.relative_to(ROOT).as_posix()] = load_table_file(path)
    return found


def load_table_file(path: Path) -> dict:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def shipped_sources() -> dict[str, str]:
    return {path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
            for folder in PRODUCT for path in sorted((ROOT / folder).rglob("*.py"))}


def shipped_named_ops() -> set[str]:
    """The ops a run JIT-builds for some preset (on CPU and GPU) and the doctor's first-run
    ops for each accelerator."""
    named = set()
    for preset in dsconfig.preset_names():
        for on_gpu in (False, True):
            config = dsconfig.merge(dsconfig.presets()[preset]["config"], {})
            config.setdefault("optimizer", {"type": "AdamW", "params": {}})
            named |= set(dsconfig.required_ops(config, on_gpu))
    for accelerator in ("cpu", "cuda"):
        named |= {op for op, _ in training_stack.first_run_ops(accelerator)}
    return named


def test_every_jit_time_has_one_home():
    named = shipped_named_ops()
    assert {"deepspeed_shm_comm", "fused_adam", "cpu_adam"} <= named
    assert jit_drift(shipped_tables(), shipped_sources(), named) == []
    assert training_stack.jit_seconds("deepspeed_shm_comm") == 90
    assert training_stack.first_run_ops("cuda") == [("fused_adam", None)]  # not measured
    engine = importlib.import_module("dsenv.workloads.training.engine")
    assert not hasattr(engine, "OP_BUILD_SECONDS")


def test_jit_drift_is_reported():
    tables = copy.deepcopy(shipped_tables())
    stack = tables["envs/training_stack.toml"]["deepspeed"]
    stack["jit_build"].append({"op": "fused_adam", "accelerator": "cuda", "seconds": 240,
                               "source": "x"})
    stack["first_run_ops"][0]["seconds"] = 60
    sources = {**shipped_sources(),
               "workloads/training/engine.py": 'OP_BUILD_SECONDS = {"deepspeed_shm_comm": 60}\n'}
    drift = jit_drift(tables, sources, shipped_named_ops() | {"fused_lamb"})
    assert drift == [
        "envs/training_stack.toml.deepspeed.first_run_ops[0] gives deepspeed_shm_comm 60 s: "
        f"only {HOME} may",
        f"{HOME} gives fused_adam 2 times",
        "workloads/training/engine.py: deepspeed_shm_comm has a time of its own "
        "('\"deepspeed_shm_comm\": 6')",
        f"fused_lamb is named by a run or the doctor and has no time in {HOME}"]


# -- what each workload imports ---------------------------------------------------------------
# Imported by the workload's modules but not asked of the job's environment: mpi4py only for
# the MPI launchers (mpi.mpi4py checks it), rich and tomli are dsenv's own (tomli only on
# Python < 3.11), numpy comes with torch.
NOT_ASKED = {"mpi4py", "rich", "tomli", "numpy"}
DISTRIBUTION = {"rouge_score": "rouge-score"}


def third_party_imports(module: Path, seen: set | None = None) -> set[str]:
    """The top-level third-party modules ``module`` and the dsenv.workloads modules it
    imports (transitively) import."""
    seen = set() if seen is None else seen
    if module in seen:
        return set()
    seen.add(module)
    found: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
        for name in names:
            if name.startswith("dsenv.workloads."):
                parts = name.split(".")[2:]
                for path in (ROOT / "workloads").joinpath(*parts).with_suffix(".py"), \
                        (ROOT / "workloads").joinpath(*parts, "__init__.py"):
                    if path.is_file():
                        found |= third_party_imports(path, seen)
            elif not name.startswith(("dsenv", "__future__")):
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names:
                    found.add(DISTRIBUTION.get(top, top))
    return found


def imports_drift(entries: Mapping[str, registry.Entry]) -> list[str]:
    found = []
    for name, entry in entries.items():
        module = ROOT / "workloads" / (entry.module.rsplit(".", 1)[1] + ".py")
        used = third_party_imports(module) - NOT_ASKED
        found += _diff(f"workloads.toml {name} imports", sorted(entry.imports), sorted(used),
                       f"what {module.name} imports")
    return found


def test_workload_imports_have_one_home():
    assert imports_drift(registry.entries()) == []


def test_workload_imports_drift_is_reported():
    table = load_table("dsenv.workloads", "workloads.toml")
    doctored = copy.deepcopy(table)
    doctored["workload"]["t5-xsum"]["imports"].remove("rouge-score")
    assert imports_drift(registry.read(doctored)) == [
        "workloads.toml t5-xsum imports lacks 'rouge-score' of what t5_xsum.py imports"]



def mig_wording_drift(evidence: str, match: Iterable[str], against: Iterable[str]) -> list[str]:
    """The catalogue patterns that do not carry the MIG evidence exactly as the family reads it."""
    return [*(f"match {p!r}" for p in match if f"(?:{evidence})" not in p),
            *([] if evidence in against else ["against of gpu.visible-devices-remapped"])]


def test_the_mig_evidence_has_one_wording():
    """The MIG evidence (a MIG profile, MIG instances, CUDA_VISIBLE_DEVICES=MIG-..., nvidia-smi's
    'MIG M.' column at Enabled) is written three times: families/gpu.py's MIG reading, the
    catalogue match of gpu.mig-one-instance-per-process and the `against` of
    gpu.visible-devices-remapped. The catalogue holds patterns as text, so a test keeps them one."""
    from dsenv.doctor.explain.families import gpu

    mig = catalogue.mode("gpu.mig-one-instance-per-process")
    against = catalogue.mode("gpu.visible-devices-remapped").against
    assert mig_wording_drift(gpu.MIG.pattern, mig.match, against) == []
    # a doctored family wording ("GB" for "gb") is reported in every place it no longer agrees
    doctored = gpu.MIG.pattern.replace("gb", "GB")
    assert len(mig_wording_drift(doctored, mig.match, against)) == len(mig.match) + 1
