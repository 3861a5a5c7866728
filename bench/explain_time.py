"""How long `dsenv explain` takes on a 10,000-line job log (issue 23: under 0.5 s).

    python bench/explain_time.py [--lines 10000] [--runs 11]

The log is built from real lines (tests/fixtures/explain/: NCCL INFO lines from
NVIDIA/nccl#1814, DeepSpeed's accelerator INFO line), eight ranks interleaved behind
torchrun's ``[rankN]:`` prefixes, one real error in the middle (libcudart.so.12, from
xorbitsai/inference#1286) and srun's cascade at the end. Prints the median, min and max wall
time of the whole command (`python -m dsenv explain FILE`, interpreter start included) next
to `python -m dsenv --help` (the floor: start and argument parsing), and the in-process time
of reading and ranking alone.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "explain"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text().partition("\n")[2]


def make_log(lines: int) -> str:
    info = [x for x in fixture("nccl_gid_info_1814.log").splitlines() if "NCCL INFO" in x]
    ds = ("[2024-06-14 14:24:07,747] [INFO] [real_accelerator.py:203:get_accelerator] "
          "Setting ds_accelerator to cuda (auto detect)")
    error = fixture("libcudart12_xinference.log").strip()
    out = []
    for i in range(lines - 3):
        out.append(f"[rank{i % 8}]: " + (ds if i % 7 == 0 else info[i % len(info)]))
        if i == lines // 2:
            out.append("[rank3]: " + error)
    out += ["srun: error: gpu017: task 3: Exited with exit code 1",
            "srun: error: gpu017: task 0: Killed"]
    return "\n".join(out) + "\n"


def wall(argv: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    text = make_log(args.lines)
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(text)
    done = subprocess.run([sys.executable, "-m", "dsenv", "explain", f.name],
                          capture_output=True, text=True)
    print(done.stdout.splitlines()[0] if done.stdout else done.stderr)
    floor = wall([sys.executable, "-m", "dsenv", "--help"], args.runs)
    full = wall([sys.executable, "-m", "dsenv", "explain", f.name], args.runs)
    from dsenv.doctor.explain.command import explain_text
    inproc = []
    for _ in range(args.runs):
        start = time.perf_counter()
        explain_text(text)
        inproc.append(time.perf_counter() - start)
    Path(f.name).unlink()
    for label, times in (("dsenv --help", floor), (f"dsenv explain ({args.lines} lines)", full),
                         ("read + rank in process", inproc)):
        print(f"{label:34} median {statistics.median(times):.3f} s  "
              f"min {min(times):.3f}  max {max(times):.3f}")
    ok = statistics.median(full) < 0.5
    print(f"under 0.5 s: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
