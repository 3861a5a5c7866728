"""Two provisions of the same stack side by side: the first with an empty ops cache (cold:
DeepSpeed's ops compiled), the second with the wheel the first left there (warm).

    python bench/provision_ops_cache.py [--arch cpu] [--ops auto] [--bytecode on|off]
                                        [--keep DIR]

Both run `dsenv provision --arch ARCH --ops OPS --prefix T/{first,second} --ops-cache
T/ops-cache` as a user runs it (a fresh process each, the same lock and sources, uv's own
cache warm for the lock's packages), one after the other in this run. Prints each run's wall
time and its steps (lock install, ops, import check) as provision reports them, what the
cache did (from each manifest), and the ratio second/first; goal (issue 17): <= 0.05. Then,
in the second env, loads every precompiled op of the CPU accelerator through DeepSpeed's
builders: a reused wheel must load without a JIT build.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 3 * 3600

LOAD_OPS = r"""
import json, sys, time
from deepspeed.ops.op_builder.all_ops import ALL_OPS
loaded = {}
for name in sys.argv[1:]:
    started = time.monotonic()
    try:
        module = ALL_OPS[name].load()
        loaded[name] = ["ok", getattr(module, "__file__", None)]
    except Exception as exc:  # reported per op: one op failing must not hide the others
        loaded[name] = ["failed", f"{type(exc).__name__}: {str(exc)[-160:]}"]
print("@@" + json.dumps(loaded))
"""


def provision(prefix: Path, cache: Path, args) -> dict:
    argv = [sys.executable, "-m", "dsenv", "provision", "--arch", args.arch, "--ops", args.ops,
            "--prefix", str(prefix), "--ops-cache", str(cache)]
    if args.bytecode == "off":
        argv.append("--no-bytecode")
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, "COLUMNS": "300"})
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"provision of {prefix} failed ({done.returncode}):\n{done.stdout}\n"
                         f"{done.stderr}")
    out = " ".join(done.stdout.split())
    steps = {name: float(m.group(1)) if (m := re.search(pattern, out)) else None
             for name, pattern in (("install_s", r"environment from \S+ \((\d+) s\)"),
                                   ("ops_s", r"DeepSpeed ops [^()]*\((\d+) s"),
                                   ("imports_s", r"the environment imports [^()]*\((\d+) s\)"))}
    manifest = json.loads((prefix / "dsenv-env.json").read_text())
    return {"seconds": seconds, **steps, "load": os.getloadavg()[1],  # 5-min, at the end
            "ops": manifest["ops"]["installed"],
            "cache": manifest["ops"].get("cache", {}),
            "cpu_flags": manifest["ops"].get("cpu_flags", {})}


def load_ops(python: Path, ops: list[str]) -> dict:
    done = subprocess.run([str(python), "-c", LOAD_OPS, *ops], capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    if done.returncode != 0 or "@@" not in done.stdout:
        raise SystemExit(f"cannot load ops with {python}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.split("@@", 1)[1])


def compare_loads(root: Path, ops: list[str]) -> int:
    """Each op loaded in both envs: the reused wheel must load exactly what the build did,
    from the env's own precompiled file (no JIT build)."""
    first, second = load_ops(root / "first" / "bin" / "python", ops), load_ops(
        root / "second" / "bin" / "python", ops)
    differ = 0
    for op in ops:
        (status1, what1), (status2, what2) = first[op], second[op]
        where = ("precompiled in the env" if status2 == "ok" and str(root / "second") in what2
                 else what2)
        print(f"  load {op}: first {status1}, second {status2} ({where})")
        if status1 != status2 or (status2 == "ok" and str(root / "second") not in what2):
            differ += 1
        elif status1 == "failed":
            print(f"    fails in both envs, so not the cache: {what1}")
    print(f"ops that load differently after reuse: {differ}")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cpu")
    parser.add_argument("--ops", default="auto", help="default auto: the default op set")
    parser.add_argument("--bytecode", choices=("on", "off"), default="on",
                        help="on (default, what provision does) or off (--no-bytecode)")
    parser.add_argument("--keep", metavar="DIR", help="build here and keep it (default: a "
                        "temporary folder, removed at the end)")
    args = parser.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="dsenv-bench-ops-cache-"))
    root.mkdir(parents=True, exist_ok=True)
    cache = root / "ops-cache"
    try:
        for name in ("first", "second"):
            shutil.rmtree(root / name, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        first = provision(root / "first", cache, args)
        second = provision(root / "second", cache, args)
        for name, run in (("first (cold cache)", first), ("second (warm cache)", second)):
            print(f"{name}: {run['seconds']:.1f} s  [lock install {run['install_s']} s, ops "
                  f"{run['ops_s']} s, imports {run['imports_s']} s; load average "
                  f"{run['load']:.1f} on {os.cpu_count()} CPUs]  cache: "
                  f"{run['cache'].get('result')}  ops: {', '.join(run['ops']) or 'none'}")
        ratio = second["seconds"] / first["seconds"]
        print(f"ratio second/first: {ratio:.3f} (goal <= 0.05: "
              f"{'met' if ratio <= 0.05 else 'NOT met'})")
        if first["ops_s"] and second["ops_s"] is not None:
            print(f"ops step alone: {second['ops_s']:.0f} s / {first['ops_s']:.0f} s = "
                  f"{second['ops_s'] / max(first['ops_s'], 1):.3f}")
        flags = second["cpu_flags"]
        if flags:
            print(f"cpu flags recorded: -march={flags.get('march')} ({len(flags.get('flags', []))}"
                  f" flags) for {', '.join(flags.get('ops', []))}")
        entries = [p for p in cache.iterdir() if not p.name.startswith(".")]
        for entry in entries:
            wheel = next(entry.glob("*.whl"))
            print(f"cache entry {entry.name}: {wheel.name}, {wheel.stat().st_size / 2**20:.1f} MiB")
        if args.arch == "cpu" and second["ops"]:
            return compare_loads(root, second["ops"])
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
