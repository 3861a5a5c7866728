"""The environment `dsenv smoke` and `dsenv run` exercise: the job's, not dsenv's.

Chosen as the doctor chooses it (dsenv/facts/python/target_env.py): ``--env PREFIX|PYTHON``,
else the activated environment, else the python3 first on PATH, else dsenv's own interpreter.
When that is not the interpreter dsenv runs in, dsenv replaces itself (exec: under a launcher
the rank keeps its PID, signals and variables) with the environment's interpreter running
``-m dsenv.workloads.cli`` and the same arguments; dsenv's own code comes from an overlay
folder put first on PYTHONPATH.

Why an overlay rather than installing dsenv into each environment: the environment stays
exactly its lock (hashes, `pip check`, the doctor's drift check), one dsenv drives every
environment, and nothing is added to an environment by hand or behind its owner's back. The
overlay holds ``dsenv`` (links to this installation's folders) and only the pure-Python
libraries dsenv itself imports that the environment lacks; it never shadows the
environment's own packages (torch, DeepSpeed, transformers and their dependencies).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import dsenv
from dsenv.facts.node import Node
from dsenv.facts.python import target_env
from dsenv.staging import staged_dir
from dsenv.verdicts import job_env
from dsenv.workloads import registry
from dsenv.workloads.errors import WorkloadError

CHOSEN = "DSENV_WORKLOAD_ENV"  # set for the re-executed workload: the environment, as JSON
OVERLAY_ROOT = "DSENV_OVERLAY_DIR"  # where overlays are kept (default ~/.cache/dsenv/overlay)
# Mapped folders of the dsenv package (setup.py package_dir): linked by name in the overlay.
MAPPED = ("envs", "doctor", "provision", "workloads")
# Pure-Python libraries dsenv's own modules import on a workload's path; linked into the
# overlay only when the environment lacks them (psutil, a compiled one, comes with DeepSpeed).
OWN_LIBRARIES = ("packaging", "rich", "markdown_it", "mdurl", "pygments", "tomli")
START = "dsenv_workload.py"  # the overlay's entry: `python -m dsenv.workloads.cli` from there
START_SCRIPT = (
    '"""Runs dsenv.workloads.cli as `python -m` would, with this folder first on sys.path."""\n'
    "import runpy\n"
    'runpy.run_module("dsenv.workloads.cli", run_name="__main__", alter_sys=True)\n')
_current: dict | None = None


def current() -> dict:
    """The environment this workload runs in, for its report and its first line."""
    global _current
    if _current is None:
        given = os.environ.get(CHOSEN)
        _current = json.loads(given) if given else _describe(
            target_env.environment(Node(environment=None)), own=True)
        _current["running"] = sys.executable  # the interpreter that actually runs it
    return _current


def _describe(env, own: bool) -> dict:
    return {"prefix": str(env.prefix) if not own else sys.prefix,
            "python": env.python if not own else sys.executable,
            "version": env.version if not own else sys.version.split()[0],
            "why": env.why if not own else "dsenv's own interpreter: " + env.why,
            "chosen_by": env.chosen_by}


def line(info: dict) -> str:
    return f"environment {info['prefix']} (Python {info['version']}) — {info['why']}"


def choose(option: str | None) -> tuple[Node, object]:
    node = Node(environment=option)
    return node, target_env.environment(node)


def prepare(args, argv: list[str]) -> None:
    """Before a workload starts: run it in the job's environment. Returns in the process
    that runs the workload (the environment is dsenv's own, or this is the re-executed one);
    otherwise replaces this process and does not return. WorkloadError (one line) when the
    environment cannot run it."""
    global _current
    if os.environ.get(CHOSEN):
        return
    node, env = choose(getattr(args, "environment", None))
    if env.python is None and getattr(args, "environment", None):
        raise WorkloadError(f"no Python interpreter in {env.prefix} ({env.why}): pass --env "
                            "the environment's prefix or its bin/python")
    own = env.own or env.python is None
    wanted = tuple(dict.fromkeys(i for n in _workloads(args) for i in registry.entry(n).imports))
    missing = job_env.missing_imports(node, wanted)
    if missing:  # the same verdict as `dsenv doctor --for WORKLOAD` (python.workload-packages)
        fix = ('pip install "dsenv[train]" for the training stack in dsenv\'s own '
               'environment, or ' if own else "")
        raise WorkloadError(
            f"{', '.join(missing)} not installed in {env.prefix}, the environment chosen "
            f"({env.why}): {fix}build one with `dsenv provision` and activate it, or pass "
            "--env PREFIX of an environment that has them")
    if own:
        _current = _describe(env, own=True)
        _say(line(_current))
        return
    if env.version and tuple(int(x) for x in env.version.split(".")[:2]) < (3, 10):
        raise WorkloadError(f"{env.prefix} has Python {env.version}; dsenv's workloads need "
                            "Python 3.10 or newer: pass --env another environment")
    info = _describe(env, own=False)
    _say(line(info))
    overlay = build_overlay(node)
    # PYTHONSAFEPATH (3.11+): no current folder first on the path of the workload's own
    # children (a checkout's dsenv/ folder there would shadow the overlay's package)
    variables = {**os.environ, CHOSEN: json.dumps(info), "PYTHONSAFEPATH": "1",
                 "PYTHONPATH": os.pathsep.join(
                     [str(overlay), *filter(None, [os.environ.get("PYTHONPATH")])])}
    sys.stdout.flush()
    sys.stderr.flush()
    # a script in the overlay, not `-m`: its folder, not the current one, leads sys.path
    start = str(overlay / START)
    os.execve(env.python, [env.python, start, *argv], variables)


def _workloads(args) -> list[str]:
    if args.workload == registry.SMOKE_ALL:
        return list(registry.smoke_names())
    return [args.workload]


def _say(text: str) -> None:
    """Printed once per job: by the first rank (or the only process)."""
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        if os.environ.get(name, "0") != "0":
            return
    print(text, flush=True)


# -- the overlay -------------------------------------------------------------------------

def _folder(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin) if spec.origin else None


def _links(node: Node) -> dict[str, Path]:
    """{name in the overlay: what it links to}: dsenv/..., then the libraries it lacks."""
    links: dict[str, Path] = {}
    core = Path(dsenv.__file__).parent
    for entry in sorted(core.iterdir()):
        if entry.name != "__pycache__":
            links[f"dsenv/{entry.name}"] = entry
    for name in MAPPED:
        links[f"dsenv/{name}"] = _folder(f"dsenv.{name}")
    path = target_env.search_path(node)
    for name in OWN_LIBRARIES:
        if name == "tomli" and sys.version_info >= (3, 11):
            continue
        if any(Path(d, name).is_dir() or Path(d, f"{name}.py").is_file() for d in path):
            continue  # the environment has its own
        found = _folder(name)
        if found is not None:
            links[found.name if found.suffix == ".py" else name] = found
    return links


def build_overlay(node: Node) -> Path:
    """The overlay folder for this dsenv and this environment: built once in staging and
    renamed into place (a half-built overlay is never used)."""
    links = _links(node)
    key = hashlib.sha256(json.dumps([dsenv.__version__, sys.version, START_SCRIPT, *(
        f"{k}={v}" for k, v in sorted(links.items()))]).encode()).hexdigest()[:16]
    root = Path(os.environ.get(OVERLAY_ROOT) or Path.home() / ".cache" / "dsenv" / "overlay")
    final = root / key
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    try:
        with staged_dir(final) as stage:
            if final.is_dir():  # another rank built it while this one waited for the lock
                raise _Built
            for name, target in links.items():
                (stage / name).parent.mkdir(parents=True, exist_ok=True)
                (stage / name).symlink_to(target)
            (stage / START).write_text(START_SCRIPT)
    except _Built:
        pass
    return final


class _Built(Exception):
    """The overlay is already in place: leave it, discard the staging folder."""
