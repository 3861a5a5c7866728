"""Installing one lock into a fresh venv: uv (what `dsenv provision` runs) against plain pip.

    python bench/provision_vs_pip.py [--rounds 3] [--bytecode on|off] [--lock FILE]
                                     [--find-links DIR]

Both install the same hashed lock (default envs/locks/cpu.txt, all of it: torch is most of a
real provisioning's bytes and time, and leaving it out would measure the easy part only)
from the same sources (PyPI plus --find-links /opt/wheels for torch's CPU wheel, pip with
--isolated so its global config adds nothing) into a fresh, empty venv each time:

    uv:  uv pip sync --require-hashes [--compile-bytecode] LOCK
    pip: pip --python VENV/bin/python install --require-hashes --no-deps [--no-compile] -r LOCK

Bytecode is the same on both sides: ``--bytecode on`` (default; what dsenv does) has uv
compile .pyc files as pip does by default, ``off`` passes --no-compile to pip and nothing to
uv. Caches are warm: each tool installs once, untimed, before the rounds (pip's HTTP cache,
uv's cache). Only the install command is timed (venv creation is not). Rounds alternate
which tool goes first. Prints every round's times and the median ratio uv/pip; goal (issue
4): <= 0.33.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from dsenv import proc  # noqa: E402

TIMEOUT = 3600.0


def uv_bin() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv") or "uv"


def fresh_venv(folder: Path) -> Path:
    if folder.exists():
        shutil.rmtree(folder)
    result = proc.run([uv_bin(), "venv", "-q", "--no-config", "--python", sys.executable,
                       str(folder)], timeout=300)
    if not result.ok:
        raise SystemExit(f"cannot create a venv: {result.describe()}")
    return folder / "bin" / "python"


def install_uv(python: Path, lock: Path, find_links: list[str], bytecode: bool) -> float:
    argv = [uv_bin(), "pip", "sync", "--require-hashes", "--no-config", "--python", str(python),
            "-q", *[a for d in find_links for a in ("--find-links", d)], str(lock)]
    if bytecode:
        argv.insert(3, "--compile-bytecode")
    return timed(argv)


def install_pip(python: Path, lock: Path, find_links: list[str], bytecode: bool) -> float:
    argv = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check",
            "--python", str(python), "install", "--require-hashes", "--no-deps", "-q",
            *[a for d in find_links for a in ("--find-links", d)], "-r", str(lock)]
    if not bytecode:
        argv.append("--no-compile")
    return timed(argv)


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    result = proc.run(argv, timeout=TIMEOUT)
    seconds = time.perf_counter() - start
    if not result.ok:
        raise SystemExit(f"failed: {result.describe()}\n{result.stderr[-3000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bytecode", choices=("on", "off"), default="on")
    parser.add_argument("--lock", type=Path, default=ROOT / "envs" / "locks" / "cpu.txt")
    parser.add_argument("--find-links", action="append",
                        default=[d for d in ("/opt/wheels",) if Path(d).is_dir()])
    args = parser.parse_args()
    bytecode = args.bytecode == "on"
    tools = {"uv": install_uv, "pip": install_pip}
    work = Path(tempfile.mkdtemp(prefix="dsenv-bench-provision-"))
    try:
        print(f"lock {args.lock} ({sum(1 for _ in args.lock.open())} lines), bytecode "
              f"{args.bytecode}, find-links {args.find_links or 'none'}")
        for name, install in tools.items():  # warm the caches, untimed
            seconds = install(fresh_venv(work / f"warm-{name}"), args.lock, args.find_links,
                              bytecode)
            print(f"warm-up {name}: {seconds:.1f} s")
        times: dict[str, list[float]] = {name: [] for name in tools}
        for round_number in range(args.rounds):
            order = list(tools) if round_number % 2 == 0 else list(reversed(tools))
            for name in order:
                python = fresh_venv(work / f"round-{name}")
                times[name].append(tools[name](python, args.lock, args.find_links, bytecode))
            print(f"round {round_number + 1}: " + ", ".join(
                f"{name} {times[name][-1]:.1f} s" for name in order)
                + f" (uv/pip {times['uv'][-1] / times['pip'][-1]:.3f})")
        medians = {name: statistics.median(values) for name, values in times.items()}
        ratio = medians["uv"] / medians["pip"]
        print(f"median: uv {medians['uv']:.1f} s, pip {medians['pip']:.1f} s, "
              f"ratio uv/pip {ratio:.3f} (goal <= 0.33: {'met' if ratio <= 0.33 else 'MISSED'})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
