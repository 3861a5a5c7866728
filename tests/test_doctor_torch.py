"""torch area: the build read from torch/version.py, the one subprocess probe, arch coverage."""

from __future__ import annotations

import json
import sys
import time

import pytest

from dsenv.facts.gpu.inventory import Gpu, visible_gpus
from dsenv.facts.python import torch_info as tp
from dsenv.facts.python.torch_info import TorchBuild, TorchRuntime
from dsenv.verdicts.findings import Status
from tests.harness.cli import explain, run
from tests.harness.findings import here
from tests.harness.recorded import fixture_text

VISIBLE = visible_gpus.memo_key
BUILD = "dsenv.facts.python.torch_info.torch_build"
RUNTIME = "dsenv.facts.python.torch_info.torch_runtime"


def a100(driver="550.54.14"):
    return Gpu("nvidia", 0, "NVIDIA A100-SXM4-80GB", "8.0", 81920, driver)


def v100(driver="580.65.06"):
    return Gpu("nvidia", 0, "Tesla V100-SXM2-32GB", "7.0", 32768, driver)


@pytest.fixture
def seeded(make_ctx):
    """A context whose GPUs, torch build and torch probe result are given by the test."""

    def build(gpus=(), torch=None, runtime=None, target="compute"):
        ctx = make_ctx(env={"PATH": "/usr/bin:/bin"}, target=target)
        ctx.memo(VISIBLE, lambda: list(gpus))
        if torch is not None:
            ctx.memo(BUILD, lambda: torch)
        if runtime is not None:
            ctx.memo(RUNTIME, lambda: runtime)
        return ctx

    return build


CU124 = TorchBuild("2.4.1+cu124", cuda="12.4", location="/site/torch")
CU126 = TorchBuild("2.11.0+cu126", cuda="12.6", location="/site/torch")
CU128 = TorchBuild("2.11.0+cu128", cuda="12.8", location="/site/torch")
CPU = TorchBuild("2.13.0+cpu", location="/site/torch")


def recorded(name):
    return tp.parse_probe_output(fixture_text(f"gpu/{name}"))


# -- torch/version.py, read not imported -----------------------------------------------------
def fake_torch(site, version_py):
    """A site dir holding a torch package with only ``version_py`` as its version.py."""
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('never imported')\n")
    (site / "torch" / "version.py").write_text(version_py)
    return site


def test_version_py_of_a_cuda_wheel(tmp_path):
    site = fake_torch(tmp_path / "site", fixture_text("gpu/torch_version_cu121.py.txt"))
    build = tp.read_torch_build([str(site)])
    assert build == TorchBuild("2.2.1+cu121", cuda="12.1", hip=None, location=str(site / "torch"))
    assert build.kind == "cuda" and build.gpu_build
    assert build.version_file == site / "torch" / "version.py"


def test_version_py_of_a_rocm_wheel_and_no_torch(tmp_path):
    site = fake_torch(tmp_path / "site", "__version__ = '2.5.1+rocm6.2'\ncuda = None\n"
                      "hip: 'Optional[str]' = '6.2.41133-dd7f95766'\n")
    build = tp.read_torch_build([str(site)])
    assert build.kind == "hip" and build.gpu_build and build.hip == "6.2.41133-dd7f95766"
    missing = tp.read_torch_build([str(tmp_path / "empty")])
    assert missing == TorchBuild(None) and missing.kind == "none" and not missing.gpu_build


def test_torch_build_probe_reads_the_contexts_prefix(tmp_path, make_ctx):
    prefix = tmp_path / "env"
    pydir = f"python{sys.version_info.major}.{sys.version_info.minor}"
    fake_torch(prefix / "lib" / pydir / "site-packages",
               fixture_text("gpu/torch_version_cu121.py.txt"))
    ctx = make_ctx()
    ctx.python_prefix = prefix
    assert tp.torch_build(ctx).describe() == "torch 2.2.1+cu121 (CUDA 12.1 build)"


READ_TORCH = """\
import json, os, sys
from dsenv.facts.node import Node
from dsenv.facts.python import torch_info
before = sorted(m for m in sys.modules if m.partition(".")[0] == "torch")
node = Node(env={"PATH": os.environ["PATH"], "HOME": sys.argv[1]}, root=sys.argv[2],
            wanted_target="login")
build = torch_info.torch_build(node)
after = sorted(m for m in sys.modules if m.partition(".")[0] == "torch")
print(json.dumps({"version": build.version, "kind": build.kind, "location": build.location,
                  "before": before, "after": after}))
"""


def test_the_installed_torch_is_read_without_importing_it(tmp_path):
    """In an interpreter of its own: this one may have imported torch in another test, and
    then could not tell."""
    done = run([sys.executable, "-c", READ_TORCH, tmp_path / "home", tmp_path / "root"],
               timeout=120)
    assert done.returncode == 0, explain(done)
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["version"].startswith("2.") and seen["kind"] == "cpu", seen
    assert seen["location"] and seen["location"].endswith("torch"), seen
    assert seen["before"] == [] and seen["after"] == [], seen  # torch was never imported


# -- the probe's output ----------------------------------------------------------------------
def test_parse_recorded_cpu_probe():
    runtime = recorded("torch_probe_cpu.txt")
    assert runtime.ran and not runtime.available and runtime.device_count == 0
    assert "not compiled with CUDA" in runtime.init_error


def test_parse_probe_gpu_outputs():
    ok_run = recorded("torch_probe_cu126_a100.txt")
    assert ok_run.available and [d.usable for d in ok_run.devices] == [True, True]
    bad = recorded("torch_probe_cu128_v100.txt")
    assert bad.devices[0].arch == "7.0" and not bad.devices[0].usable
    with pytest.raises(ValueError):
        tp.parse_probe_output("Segmentation fault\n")


def test_real_probe_script_on_this_machines_torch(make_ctx):
    """The script itself runs against the installed (CPU) torch: one import, ~2-3 s."""
    ctx = make_ctx()
    result = ctx.run([sys.executable, "-c", tp.PROBE_SCRIPT], timeout=60)
    runtime = tp.parse_probe_output(result.stdout)
    assert result.ok and runtime.ran and runtime.device_count == 0 and not runtime.available


def test_no_gpu_means_no_subprocess(make_ctx):
    start = time.monotonic()
    runtime = tp.torch_runtime(make_ctx(env={"PATH": "/usr/bin:/bin"}))
    assert not runtime.ran and time.monotonic() - start < 0.5


# -- the coverage rule ---------------------------------------------------------------------
@pytest.mark.parametrize("arch_list,device,entry", [
    (["sm_80"], "8.6", "sm_80"),  # same major, higher minor: the cubin runs
    (["sm_86"], "8.0", None),  # lower minor: it does not
    (["sm_80"], "9.0", None),  # other major: cubins never cross
    (["sm_70", "compute_70"], "8.6", "compute_70"),  # PTX JIT-compiles for anything newer
    (["compute_90"], "8.0", None),
    (["sm_90a"], "9.0", "sm_90a"),
    (["sm_90a"], "9.1", None),  # arch-specific cubins run on exactly that arch
    (["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], "7.0", None),
    (["gfx908", "gfx90a", "gfx942"], "gfx90a", "gfx90a"),
    (["gfx908", "gfx942"], "gfx90a", None),  # ROCm: names must match
])
def test_covering_entry(arch_list, device, entry):
    assert tp.covering_entry(arch_list, device) == entry


# -- checks ---------------------------------------------------------------------------------
def test_build_cpu_torch_without_gpu_is_ok(make_ctx, run_one):
    # PATH's python3 is Debian's, without torch: the environment under test is named
    result = run_one("torch.build", make_ctx(env={"PATH": "/usr/bin:/bin"},
                                             environment=sys.executable))
    assert result.status is Status.OK and "CPU" in result.summary


def test_build_cpu_torch_on_a_gpu_node_names_the_wheel_index(seeded, run_one):
    result = run_one("torch.build", seeded([Gpu("nvidia", 0, "NVIDIA A100-SXM4-80GB", "8.0",
                                                 driver="535.54.03")], CPU))
    assert result.status is Status.FAIL
    # 535 runs CUDA 12.1 fully; cu124 would need 550.
    assert here(result).endswith("--index-url https://download.pytorch.org/whl/cu121")


def test_wheel_index_skips_cuda_13_for_a_v100(seeded, run_one):
    result = run_one("torch.build", seeded([v100()], CPU))
    assert here(result).endswith("/whl/cu128")


def test_build_not_installed(seeded, run_one):
    missing = TorchBuild(None)
    assert run_one("torch.build", seeded([a100()], missing)).status is Status.FAIL
    # the job's first import fails: not ready on a login node either (issue 24)
    login = run_one("torch.build", seeded([], missing, target="login"))
    assert login.status is Status.FAIL and "the environment judged" in login.summary
    assert "dsenv doctor --env PREFIX" in login.fix


def test_build_cuda_torch_on_amd_gpus_fails(seeded, run_one):
    mi = Gpu("amd", 0, "AMD Instinct MI250X/MI250", "gfx90a")
    result = run_one("torch.build", seeded([mi], CU124))
    assert result.status is Status.FAIL and "rocm" in result.fix


def test_arch_list_covers(seeded, run_one):
    ctx = seeded([a100()], CU126, recorded("torch_probe_cu126_a100.txt"))
    assert run_one("torch.arch-list", ctx).status is Status.OK


def test_arch_list_misses_the_v100(seeded, run_one):
    ctx = seeded([v100()], CU128, recorded("torch_probe_cu128_v100.txt"))
    result = run_one("torch.arch-list", ctx)
    assert result.status is Status.FAIL and "7.0" in result.summary
    assert "whl/cu12" in here(result) and "sm_75" in result.evidence[0]


def test_arch_list_skips_without_gpu_or_gpu_torch(seeded, run_one):
    assert run_one("torch.arch-list", seeded([], CU124)).status is Status.SKIP
    assert run_one("torch.arch-list", seeded([a100()], CPU)).status is Status.SKIP


@pytest.mark.parametrize("driver,status", [
    ("470.103.01", Status.FAIL),  # below CUDA 12's minor-version-compatibility floor
    ("535.54.03", Status.WARN),  # CUDA 12.4 runs only through minor-version compatibility
    ("550.54.14", Status.OK),
])
def test_driver_against_torch_cuda(seeded, run_one, driver, status):
    result = run_one("torch.driver", seeded([a100(driver)], CU124))
    assert result.status is status
    if status is not Status.OK:
        assert "--index-url" in here(result)


def test_usable(seeded, run_one):
    good = run_one("torch.usable", seeded([a100(), a100()], CU126,
                                          recorded("torch_probe_cu126_a100.txt")))
    assert good.status is Status.OK and "2 GPU(s)" in good.summary
    bad = run_one("torch.usable", seeded([v100()], CU128, recorded("torch_probe_cu128_v100.txt")))
    assert bad.status is Status.FAIL and "no kernel image" in bad.evidence[0]


def test_usable_reports_hangs_and_unavailable_cuda(seeded, run_one):
    hung = TorchRuntime(False, "`python -c ...` did not answer within 20.0 s (killed)", hung=True)
    result = run_one("torch.usable", seeded([a100()], CU124, hung))
    assert result.status is Status.FAIL and "did not finish" in result.summary
    off = TorchRuntime(True, available=False, init_error="RuntimeError: CUDA driver "
                       "initialization failed, you might not have a CUDA gpu.")
    result = run_one("torch.usable", seeded([a100()], CU124, off))
    assert result.status is Status.FAIL and "initialization failed" in result.evidence[0]


def test_usable_skips_without_gpu(make_ctx, run_one):
    assert run_one("torch.usable", make_ctx(env={"PATH": "/usr/bin:/bin"})).status is Status.SKIP
