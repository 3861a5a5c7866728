#!/bin/bash
# Exploratory device run: install from carried wheels (.whl/), then where DeepSpeed's engine
# spends its step (bench/gpu_engine_split.py) and one doctor vs ds_report timing.
set -u
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/ext TORCH_CUDA_ARCH_LIST=9.0
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s)
{
nvidia-smi -L; python3 -c 'import torch;print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade $(ls .whl/*.whl) 2>&1 | tail -2
DS_BUILD_OPS=0 timeout 180 python3 -m pip install -q --no-index --no-deps --no-build-isolation .whl/deepspeed-0.19.8.tar.gz 2>&1 | tail -2
timeout 120 python3 -m pip install -q --no-index --no-deps --no-build-isolation . 2>&1 | tail -2
echo "install done $(( $(date +%s) - t0 )) s"
timeout 240 python3 bench/gpu_engine_split.py --out "$O/split.json" 2>&1 | grep -E "^SPLIT|Error|error" | cut -c1-600
echo "split done $(( $(date +%s) - t0 )) s"
for i in 1 2; do
  s=$(date +%s%N); timeout 60 dsenv doctor --json > "$O/doctor$i.json" 2>/dev/null; d=$(( ($(date +%s%N)-s)/1000000 ))
  s=$(date +%s%N); timeout 60 ds_report >/dev/null 2>&1; r=$(( ($(date +%s%N)-s)/1000000 ))
  echo "doctor_ms $d ds_report_ms $r"
done
timeout 30 python3 -X importtime -c 'import dsenv.cli' 2> "$O/importtime.txt" >/dev/null
echo "all done $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$O/explore-log.txt"
