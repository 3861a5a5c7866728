#!/bin/bash
# Where `dsenv doctor`'s wall time goes on a GPU node (one call, ~1 min): install the carried
# wheels and dsenv, then three warm runs of `dsenv doctor --json`, each check's seconds from
# the report (the ten slowest, median of the three), the cost of `nvidia-smi -L` (gpu.mig) and
# of the compiled-module scan of the image's site-packages (torch.extension-symbols).
#   bash bench/gpu_doctor_time.sh      # on the device machine, wheels in .whl/
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/gdt-out}; mkdir -p "$O"; PY=$(command -v python3)
$PY -m pip install -q --no-index --no-deps --no-compile --upgrade .whl/*.whl > /tmp/pip.log 2>&1
$PY -m pip install -q --no-index --no-deps --no-build-isolation . >> /tmp/pip.log 2>&1 || { tail -5 /tmp/pip.log; exit 1; }
echo "node: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
export TORCH_EXTENSIONS_DIR=/tmp/ext-empty
dsenv doctor --json > "$O/doctor-cold.json" 2>/dev/null
for i in 1 2 3; do
  s=$(date +%s.%N); dsenv doctor --json > "$O/doctor-$i.json" 2>/dev/null
  echo "doctor run $i: $(awk -v a=$s -v b=$(date +%s.%N) 'BEGIN{printf "%.2f", b-a}') s wall"
done
$PY - "$O" <<'PY'
import json, statistics, sys
runs = [json.load(open(f"{sys.argv[1]}/doctor-{i}.json")) for i in (1, 2, 3)]
secs = {}
for r in runs:
    for c in r["results"]:
        secs.setdefault(c["id"], []).append(c.get("seconds") or 0.0)
print("report timing:", [r.get("timing") for r in runs][0])
print("slowest checks (median s of 3):")
for cid, v in sorted(secs.items(), key=lambda kv: -statistics.median(kv[1]))[:12]:
    print(f"  {statistics.median(v):6.3f}  {cid}")
print(f"sum of the medians: {sum(statistics.median(v) for v in secs.values()):.2f} s over {len(secs)} checks")
PY
for i in 1 2 3; do s=$(date +%s.%N); nvidia-smi -L > /dev/null; echo "nvidia-smi -L: $(awk -v a=$s -v b=$(date +%s.%N) 'BEGIN{printf "%.3f", b-a}') s"; done
$PY - <<'PY'
import time, torch
from pathlib import Path
from dsenv.facts.python import torch_symbols as ts
site = Path(torch.__file__).parent.parent
for _ in range(2):
    t = time.perf_counter()
    scan = ts.torch_extensions(site, None, skip=("torch", "nvidia", "triton", "functorch", "torchgen"))
    print(f"compiled-module scan of {site}: {len(scan.files)} link torch, {scan.left_out} left out, "
          f"{time.perf_counter() - t:.3f} s")
PY
