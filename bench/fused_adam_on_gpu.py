"""Run a built DeepSpeed fused_adam_op on the GPU: one Adam step against torch's own Adam.

    python bench/fused_adam_on_gpu.py .../deepspeed/ops/adam/fused_adam_op.cpython-3xx-....so

Loads the extension by path (no deepspeed import, so no DeepSpeed dependencies are needed on
the GPU machine) and prints one JSON line: the device, its compute capability, and either the
largest difference from torch.optim.Adam or the CUDA error ("no kernel image is available for
execution on the device" when the op holds no SASS for this GPU). Issue 17 ran it on an H100
for an sm_90 and an sm_80 build (tests/fixtures/cuda-build/h100-fused_adam-run.jsonl).
"""

import importlib.machinery
import importlib.util
import json
import sys

import torch

path = sys.argv[1]
loader = importlib.machinery.ExtensionFileLoader("fused_adam_op", path)
spec = importlib.util.spec_from_file_location("fused_adam_op", path, loader=loader)
mod = importlib.util.module_from_spec(spec)
loader.exec_module(mod)
torch.manual_seed(0)
p = torch.randn(1 << 20, device="cuda")
g = torch.randn_like(p)
m = torch.zeros_like(p)
v = torch.zeros_like(p)
ref = p.clone().requires_grad_(True)
ref.grad = g.clone()
opt = torch.optim.Adam([ref], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
out = {"so": path, "device": torch.cuda.get_device_name(),
       "capability": list(torch.cuda.get_device_capability())}
try:
    noop = torch.zeros(1, dtype=torch.int, device="cuda")
    # chunk size, overflow flag, [grads, params, exp_avg, exp_avg_sq], lr, beta1, beta2,
    # eps, step, mode (1: AdamW, the same as Adam without weight decay), bias correction, wd
    mod.multi_tensor_adam(2048 * 32, noop, [[g], [p], [m], [v]], 1e-3, 0.9, 0.999, 1e-8, 1, 1,
                          1, 0.0)
    torch.cuda.synchronize()
    opt.step()
    out["max_abs_diff_vs_torch_adam"] = float((p - ref.detach()).abs().max())
    out["ok"] = out["max_abs_diff_vs_torch_adam"] < 1e-6
except Exception as exc:  # the CUDA error is the finding: report it, do not crash
    out["ok"] = False
    out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
print(json.dumps(out))
