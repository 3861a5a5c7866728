"""CUDA op builds: which nvcc (node or NVIDIA's wheels), the env's NVIDIA headers, the
Volta stack from PyPI, and the device code of each built op (real nvcc where this machine
has one; the real `dsenv provision` CUDA builds are opt-in: DSENV_CUDA_BUILD=1)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dsenv.envs.stacks import get_stack
from dsenv.facts.toolchain import fatbin
from dsenv.provision import ProvisionError
from dsenv.provision.ops import cuda as cuda_toolkit
from dsenv.provision.record.activation import sh_lines
from dsenv.provision.targets import choose_stack, resolve_arch
from tests.harness.cli import dsenv
from tests.harness.nvcc import REAL_NVCC, compile_so, needs_nvcc


# -- which nvcc -------------------------------------------------------------------------------
def test_node_nvcc_that_fits_is_used():
    choice = cuda_toolkit.toolkit_choice(get_stack("cuda13.0"), resolve_arch("8.0;9.0"),
                                         "13.0.88")
    assert (choice.kind, choice.cuda) == ("node", "13.0.88")


@pytest.mark.parametrize("node,why", [
    (None, "no nvcc on this node"),
    ("12.4.131", "is CUDA 12, torch 2.13.0 is built with CUDA 13.0"),
])
def test_toolkit_from_wheels_when_the_node_cannot(node, why):
    choice = cuda_toolkit.toolkit_choice(get_stack("cuda13.0"), resolve_arch("9.0"), node)
    assert choice.kind == "wheels" and why in choice.reason
    assert choice.wheels.requirements == ("cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==13.0.3.0",)
    assert "from NVIDIA's wheels" in choice.note()
    refused = cuda_toolkit.toolkit_choice(get_stack("cuda13.0"), resolve_arch("9.0"), node,
                                          allow_wheels=False)
    assert refused.kind == "refused" and "--no-toolkit-wheels" in refused.reason


def test_no_cuda12_nvcc_on_pypi_keeps_the_refusal():
    choice = cuda_toolkit.toolkit_choice(get_stack("cuda12.8"), resolve_arch("7.0"), "13.0.88")
    assert choice.kind == "refused"
    assert "ptxas and libnvvm only" in choice.reason
    assert "module load cuda/12.8" in cuda_toolkit.refusal_fix(choice)


def test_an_arch_the_stacks_toolkit_cannot_build_is_refused():
    # CUDA 13 builds no sm_70 whatever the wheels: the toolkit row decides
    choice = cuda_toolkit.toolkit_choice(get_stack("cuda13.0"), resolve_arch("7.5;8.0"), None)
    assert choice.kind == "wheels"
    stack = get_stack("cuda13.0")
    bad = cuda_toolkit.node_problem("13.0.88", stack, resolve_arch("7.0"))
    assert "cannot build sm_70" in bad


# -- the Volta stack from PyPI ----------------------------------------------------------------
def test_volta_prefers_cuda126_where_its_index_answers():
    assert choose_stack(resolve_arch("7.0")).name == "cuda12.6"
    notes: list[str] = []
    reached = choose_stack(resolve_arch("V100"), index_unreachable=lambda url: None, notes=notes)
    assert reached.name == "cuda12.6" and notes == []


def test_volta_falls_back_to_pypi_when_the_cu126_index_does_not_answer():
    asked = []

    def unreachable(url):
        asked.append(url)
        return "Name or service not known"

    notes: list[str] = []
    stack = choose_stack(resolve_arch("7.0"), index_unreachable=unreachable, notes=notes)
    assert stack.name == "cuda12.8" and stack.torch_version == "2.10.0"
    assert stack.index_url == "https://pypi.org/simple" and stack.serves("7.0")
    assert asked == ["https://download.pytorch.org/whl/cu126"]
    assert "instead of cuda12.6" in notes[0] and "does not answer" in notes[0]
    assert stack.lock_path.is_file()
    assert "torch==2.10.0" in stack.lock_path.read_text()


def test_fallback_is_never_first_for_newer_gpus():
    asked = []
    stack = choose_stack(resolve_arch("8.0"), index_unreachable=lambda u: asked.append(u) or "x")
    assert stack.name == "cuda13.0" and asked == []  # cuda13.0 has no fallback: not asked


def test_choose_stack_with_toolkit_wheels():
    a100 = resolve_arch("A100")
    assert choose_stack(a100, "13.0.88", toolkit_wheels=True).name == "cuda13.0"
    assert choose_stack(a100, None, toolkit_wheels=True).name == "cuda13.0"  # no nvcc: wheels
    assert choose_stack(a100, "12.4.131", toolkit_wheels=True).name == "cuda12.6"  # node first
    with pytest.raises(ProvisionError, match="ptxas and libnvvm only"):
        choose_stack(resolve_arch("7.0"), "13.0.88", toolkit_wheels=True,
                     index_unreachable=lambda u: "down")


# -- the env's NVIDIA headers and libraries ---------------------------------------------------
def fake_env(tmp_path, layout: dict[str, list[str]]) -> Path:
    site = tmp_path / "env" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    for folder, files in layout.items():
        (site / folder).mkdir(parents=True, exist_ok=True)
        for name in files:
            (site / folder / name).write_text("")
    (tmp_path / "env" / "bin").mkdir(parents=True, exist_ok=True)
    return tmp_path / "env" / "bin" / "python"


def test_build_variables_append_the_wheels_include_folders(tmp_path):
    python = fake_env(tmp_path, {"nvidia/cu13/include": ["cusparse.h"],
                                 "nvidia/cu13/lib": ["libcusparse.so.12"],
                                 "nvidia/nccl/include": ["nccl.h"]})
    site = python.parent.parent / "lib" / "python3.11" / "site-packages"
    found = cuda_toolkit.build_variables(python, {"CPATH": "/opt/own/include"}, "/opt/cuda")
    assert found["CPATH"].split(os.pathsep) == [
        "/opt/own/include", str(site / "nvidia/cu13/include"), str(site / "nvidia/nccl/include")]
    # the linker gets libcusparse.so for -lcusparse: a relative link to the versioned file
    links = python.parent.parent / "lib" / "dsenv-cuda-links"
    assert found["LIBRARY_PATH"] == str(links)
    assert (links / "libcusparse.so").resolve() == site / "nvidia/cu13/lib/libcusparse.so.12"
    assert not os.path.isabs(os.readlink(links / "libcusparse.so"))
    assert found["CUDA_HOME"] == "/opt/cuda"


def test_build_variables_cu12_layout_and_nothing_to_add(tmp_path, monkeypatch):
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "libcuda.so").write_text("")
    monkeypatch.setattr(cuda_toolkit, "DRIVER_FOLDERS", (str(driver),))  # a node with one
    python = fake_env(tmp_path, {"nvidia/cusparse/include": ["cusparse.h"],
                                 "nvidia/cublas/include": ["cublas_v2.h"]})
    found = cuda_toolkit.build_variables(python, {})
    assert [Path(p).parent.name for p in found["CPATH"].split(os.pathsep)] == ["cublas",
                                                                            "cusparse"]
    bare = fake_env(tmp_path / "bare", {})
    assert cuda_toolkit.build_variables(bare, {}) == {}


def test_wheel_toolkit_root_gets_lib64_and_libcudart(tmp_path):
    home = tmp_path / "cu13"
    (home / "lib").mkdir(parents=True)
    (home / "lib" / "libcudart.so.13").write_text("")
    cuda_toolkit.link_toolkit_root(home)
    assert (home / "lib64").resolve() == (home / "lib").resolve()
    assert os.readlink(home / "lib" / "libcudart.so") == "libcudart.so.13"
    cuda_toolkit.link_toolkit_root(home)  # twice: nothing changes, nothing fails


@needs_nvcc
def test_nvcc_home_sees_through_a_wrapper_script(tmp_path):
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nexec {REAL_NVCC[-1]} \"$@\"\n")
    wrapper.chmod(0o755)
    home = cuda_toolkit.nvcc_home(wrapper)
    assert home.resolve() == Path(REAL_NVCC[-1]).resolve().parent.parent != wrapper.parent.parent


# -- proof by artefacts -----------------------------------------------------------------------
@needs_nvcc
def test_built_ops_must_hold_exactly_the_requested_archs(tmp_path):
    package = tmp_path / "deepspeed"
    (package / "ops" / "adam").mkdir(parents=True)
    (package / "ops" / "lamb").mkdir(parents=True)
    so80 = compile_so(tmp_path, "a", "arch=compute_80,code=sm_80")
    both = compile_so(tmp_path, "b", "arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90")
    (package / "ops" / "adam" / "fused_adam_op.cpython-311-x86_64-linux-gnu.so").write_bytes(
        both.read_bytes())
    (package / "ops" / "lamb" / "fused_lamb_op.cpython-311-x86_64-linux-gnu.so").write_bytes(
        so80.read_bytes())
    ops = ["fused_adam", "fused_lamb"]
    good = cuda_toolkit.check_op_archs(package, ops, ["8.0", "9.0"], ops,
                                       expected={"fused_lamb": ["8.0"]})
    assert good.problems == []
    assert good.to_json()["fused_adam"] == {"elf": ["8.0", "9.0"], "ptx": []}
    assert good.describe() == ["fused_adam: sm_80, sm_90", "fused_lamb: sm_80"]
    bad = cuda_toolkit.check_op_archs(package, ops, ["8.0", "9.0"], ops)
    assert bad.problems == ["fused_lamb lacks sm_90 (holds sm_80)"]
    extra = cuda_toolkit.check_op_archs(package, ["fused_adam"], ["9.0"], ["fused_adam"])
    assert extra.problems == ["fused_adam holds unexpected sm_80 (holds sm_80, sm_90)"]
    gone = cuda_toolkit.check_op_archs(package, ["transformer"], ["9.0"], ["transformer"])
    assert "transformer: no shared object" in gone.problems[0]


@needs_nvcc
def test_ops_outside_deepspeed_ops_and_host_code_ops_are_judged_as_deepspeed_says(tmp_path):
    """The real --arch 9.0 build of every op stopped in verification: the inference v2 ops'
    objects are not under deepspeed/ops (setup.py places them by the builder's
    absolute_name()), and async_io, gds and dc are CUDA-builder ops of host code
    with no kernels at all. Both facts come from the installed DeepSpeed's builders."""
    from dsenv.provision.ops.builders import inspect_ops

    report = inspect_ops(resolve_arch("9.0"))
    host_code = ["async_io", "gds", "dc"]
    assert all(report.ops[op].gpu and report.ops[op].device_sources == 0 for op in host_code)
    assert report.ops["fused_adam"].device_sources > 0
    v2 = {op: report.ops[op].module for op in ("ragged_ops", "inference_core_ops")}
    assert all(m.startswith("deepspeed.inference.v2") for m in v2.values()), v2
    python = fake_env(tmp_path, {})
    site = python.parent.parent / "lib/python3.11/site-packages"
    sm90 = compile_so(tmp_path, "k90", "arch=compute_90,code=sm_90").read_bytes()
    (tmp_path / "host.c").write_text("int host_only(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "host.so"),
                    str(tmp_path / "host.c")], check=True, timeout=120)
    host = (tmp_path / "host.so").read_bytes()
    for module in v2.values():  # where setup.py puts them (.../kernelsinference_core_ops)
        *folders, name = module.split(".")
        site.joinpath(*folders).mkdir(parents=True, exist_ok=True)
        site.joinpath(*folders, f"{name}.cpython-311-x86_64-linux-gnu.so").write_bytes(sm90)
    for op in host_code:
        *folders, name = report.ops[op].module.split(".")
        site.joinpath(*folders).mkdir(parents=True, exist_ok=True)
        site.joinpath(*folders, f"{name}.cpython-311-x86_64-linux-gnu.so").write_bytes(host)
    build = cuda_toolkit.CudaBuild(cuda_toolkit.ToolkitChoice("node", "13.0.88"), {})
    ops = [*v2, *host_code]
    build.verify(python, ops, resolve_arch("9.0"), report)
    assert build.archs.problems == [] and set(build.archs.code) == set(ops)
    assert all(build.archs.code[op].elf == ("9.0",) for op in v2)
    assert all(not build.archs.code[op].elf and not build.archs.code[op].ptx
               for op in host_code)
    # the unhealthy twin: a v2 op built for another arch is still caught where it lives
    module = v2["ragged_ops"].split(".")
    site.joinpath(*module[:-1], f"{module[-1]}.cpython-311-x86_64-linux-gnu.so").write_bytes(
        compile_so(tmp_path, "k80", "arch=compute_80,code=sm_80").read_bytes())
    with pytest.raises(ProvisionError, match="ragged_ops lacks sm_90"):
        build.verify(python, ops, resolve_arch("9.0"), report)


# -- the command line -------------------------------------------------------------------------
def test_dry_run_without_node_nvcc_plans_the_toolkit_wheels(tmp_path):
    env = {"CUDA_HOME": str(tmp_path / "no-toolkit")}
    done = dsenv("provision", "--arch", "9.0", "--ops", "fused_adam", "--dry-run", "--prefix",
                 tmp_path / "env", env=env)
    assert done.returncode == 0, done.stderr
    assert "CUDA 13.0's nvcc from NVIDIA's wheels" in done.stdout
    assert "no nvcc on this node" in done.stdout
    # --no-toolkit-wheels: the real run refuses in one line before it writes anything; the
    # dry run's plan is that refusal, and it exits as the real run does
    planned = dsenv("provision", "--arch", "9.0", "--ops", "fused_adam", "--dry-run",
                    "--no-toolkit-wheels", "--prefix", tmp_path / "env", env=env)
    assert planned.returncode == 2, planned.stderr
    stop = next(line for line in planned.stdout.splitlines() if "STOPS THE REAL RUN" in line)
    assert "--no-toolkit-wheels" in stop
    refused = dsenv("provision", "--arch", "9.0", "--ops", "fused_adam",
                    "--no-toolkit-wheels", "--prefix", tmp_path / "env", env=env)
    assert refused.returncode != 0
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--no-toolkit-wheels" in lines[0], refused.stderr
    assert planned.stderr == refused.stderr and stop.endswith(lines[0][len("dsenv provision: "):])
    assert not (tmp_path / "env").exists()


# -- real builds (opt-in: several GB of CUDA wheels, minutes of nvcc on 2 cores) ---------------
real_build = pytest.mark.skipif(os.environ.get("DSENV_CUDA_BUILD") != "1" or not REAL_NVCC,
                                reason="real CUDA op builds are opt-in: DSENV_CUDA_BUILD=1")


@real_build
@pytest.mark.slow
@pytest.mark.timeout(5400)
@pytest.mark.parametrize("arch", ["8.0", "9.0", "8.0;9.0"])
def test_real_cuda_build_holds_the_requested_archs(tmp_path, arch):
    prefix = tmp_path / "env"
    done = subprocess.run(
        ["nice", "-n", "10", "python", "-m", "dsenv", "provision", "--arch", arch, "--ops",
         "fused_adam,fused_lamb,transformer", "--ops-cache", "none", "--prefix", str(prefix)],
        capture_output=True, text=True, timeout=5400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    manifest = json.loads((prefix / "dsenv-env.json").read_text())
    wanted = arch.split(";")
    for op in ("fused_adam", "fused_lamb", "transformer"):
        assert manifest["ops"]["archs"][op]["elf"] == wanted, manifest["ops"]["archs"]
    library = fatbin.op_libraries(next(prefix.glob("lib/python3*/site-packages/deepspeed")))
    assert fatbin.read_device_code(library["fused_adam"]).elf == tuple(wanted)
    assert manifest["ops"]["toolkit"]["source"] in ("node", "wheels")


CUDA12_HOME = os.environ.get("DSENV_CUDA12_HOME", "")


@pytest.mark.skipif(os.environ.get("DSENV_CUDA_BUILD") != "1" or not CUDA12_HOME,
                    reason="the real Volta build is opt-in: DSENV_CUDA_BUILD=1 and "
                           "DSENV_CUDA12_HOME=<a CUDA 12 toolkit root> (CUDA 13 cannot build "
                           "sm_70, and PyPI has no CUDA 12 nvcc)")
@pytest.mark.slow
@pytest.mark.timeout(5400)
def test_real_volta_build_with_a_cuda12_toolkit(tmp_path):
    """`--arch 7.0`: the cuda12.8 stack (torch 2.10.0 from PyPI) with the node's CUDA 12
    toolkit (CUDA_HOME, as a `module load cuda/12.x` sets it): every op holds sm_70 only."""
    prefix = tmp_path / "env"
    done = subprocess.run(
        ["nice", "-n", "10", "python", "-m", "dsenv", "provision", "--arch", "7.0", "--ops",
         "fused_adam,fused_lamb,transformer", "--ops-cache", "none", "--prefix", str(prefix)],
        capture_output=True, text=True, timeout=5400, env={**os.environ,
                                                             "CUDA_HOME": CUDA12_HOME})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    manifest = json.loads((prefix / "dsenv-env.json").read_text())
    assert manifest["stack"] == "cuda12.8", manifest["stack"]
    for op in ("fused_adam", "fused_lamb", "transformer"):
        assert manifest["ops"]["archs"][op]["elf"] == ["7.0"], manifest["ops"]["archs"]
    assert manifest["ops"]["toolkit"]["source"] == "node"


# -- the doctor and an env-local toolkit ------------------------------------------------------
def test_doctor_finds_the_toolkit_installed_into_the_env(tmp_path, make_ctx):
    from dsenv.doctor.checks.software import toolkit as checks
    from dsenv.facts.python import target_env
    from dsenv.facts.python.torch_info import TorchBuild
    from dsenv.facts.toolchain import toolkit as tk
    from dsenv.verdicts.findings import Status
    from tests.harness.recorded import fixture_text

    python = fake_env(tmp_path, {"nvidia/cu13/bin": [], "nvidia/cu13/lib": []})
    home = python.parent.parent / "lib/python3.11/site-packages/nvidia/cu13"
    recorded = tmp_path / "nvcc.out"
    recorded.write_text(fixture_text("gpu/nvcc_13.0.txt"))
    (home / "bin" / "nvcc").write_text(f"#!/bin/sh\n/bin/cat '{recorded}'\n")
    (home / "bin" / "nvcc").chmod(0o755)

    def ctx_for(**env):
        ctx = make_ctx(env={"PATH": "/nonexistent", **env}, target="compute")
        ctx.memo(target_env.environment.memo_key, lambda: target_env.PythonEnv(
            None, python.parent.parent, "option", f"--env {python.parent.parent}"))
        ctx.memo("dsenv.facts.python.torch_info.torch_build",
                 lambda: TorchBuild("2.13.0", cuda="13.0", location="/site/torch"))
        return ctx

    ctx = ctx_for()
    tool = tk.nvcc(ctx)
    assert (tool.path, tool.version, tool.home) == (str(home / "bin/nvcc"), "13.0.88", str(home))
    assert "environment's own CUDA toolkit" in tool.how
    result = checks.nvcc(ctx)
    assert result.status is Status.OK and "13.0.88" in result.summary
    # a CUDA_HOME the user set wins over the env's toolkit (and a broken one still fails)
    broken = ctx_for(CUDA_HOME=str(tmp_path / "nowhere"))
    assert tk.nvcc(broken).path is None
    assert checks.cuda_home(broken).status is Status.FAIL


def test_volta_stack_rows_agree_with_the_wheel_it_installs():
    """The cuda12.8 row's archs are what torch 2.10.0's PyPI wheel was read to carry."""
    from tests.harness.recorded import fixture_text

    text = fixture_text("cuda-build/torch-2.10.0-pypi-archs.txt")
    flags = text.splitlines()[0].split("12.8 ", 1)[1].split()
    stack = get_stack("cuda12.8")
    assert [fatbin.sm(a) for a in stack.archs] == flags
    assert "sm_70" in flags and stack.fallback_for == "cuda12.6"
    assert "456 sm_70" in text  # SASS for Volta in libtorch_cuda.so


def test_cuda_build_names_the_final_prefix(tmp_path):
    python = fake_env(tmp_path, {"nvidia/cu13/include": ["cusparse.h"]})
    node = cuda_toolkit.ToolkitChoice("node", "13.0.88", home="/usr/local/cuda-13.0")
    build = cuda_toolkit.prepare_cuda_build(node, python, sources=None, log=tmp_path / "log",
                                            base={"PATH": "/usr/bin"})
    assert build.env["CUDA_HOME"] == "/usr/local/cuda-13.0"
    assert build.env["CPATH"].endswith("nvidia/cu13/include")
    assert build.settings(tmp_path, tmp_path) == ()  # the node's toolkit: nothing to export
    staging, final = tmp_path / "env", Path("/apps/envs/cu13")
    wheels = cuda_toolkit.CudaBuild(
        cuda_toolkit.ToolkitChoice("wheels", "13.0", "no nvcc on this node",
                                   cuda_toolkit.toolkit_wheels("13.0")),
        {}, str(staging / "lib/python3.11/site-packages/nvidia/cu13"))
    text = "\n".join(sh_lines(list(wheels.settings(staging, final))))
    assert "export CUDA_HOME=/apps/envs/cu13/lib/python3.11/site-packages/nvidia/cu13" in text
    assert str(staging) not in text
    record = wheels.manifest(staging, final)
    assert record["toolkit"]["source"] == "wheels"
    assert record["toolkit"]["home"].startswith("/apps/envs/cu13/")
    none = cuda_toolkit.prepare_cuda_build(None, python, sources=None, log=tmp_path / "log")
    assert none.choice.kind == "none" and none.manifest(staging, final) == {}


def test_offline_without_cached_wheels_is_one_clear_refusal(tmp_path, monkeypatch):
    """--no-index and nothing in uv's cache or --find-links: a ProvisionError that says so
    (real uv, a real venv, an empty cache: no network)."""
    from dsenv.provision.uvcmd import Sources, run_uv

    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "empty-cache"))
    assert run_uv(["venv", str(tmp_path / "env"), "-q"], timeout=120).ok
    (tmp_path / "wheels").mkdir()
    sources = Sources.of(find_links=[tmp_path / "wheels"], no_index=True)
    with pytest.raises(ProvisionError) as error:
        cuda_toolkit.install_toolkit_wheels(tmp_path / "env" / "bin" / "python",
                                            cuda_toolkit.toolkit_wheels("13.0"),
                                            sources=sources, log=tmp_path / "log")
    text = str(error.value)
    assert "offline: the wheels are not in uv's cache or --find-links" in text
    assert "cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==13.0.3.0" in text and "\n" not in text


def test_driver_stub_for_minus_lcuda(tmp_path, monkeypatch):
    """async_io/gds link -lcuda: the toolkit's stub when it has one, else a made one with the
    driver's soname (no driver on a login node)."""
    home = tmp_path / "cuda"
    (home / "lib64" / "stubs").mkdir(parents=True)
    (home / "lib64" / "stubs" / "libcuda.so").write_text("")
    assert cuda_toolkit.driver_stub(home, tmp_path / "links", {}) == home / "lib64" / "stubs"
    monkeypatch.setattr(cuda_toolkit, "DRIVER_FOLDERS", ())
    made = cuda_toolkit.driver_stub(tmp_path / "trimmed", tmp_path / "links", {})
    if made is None:
        pytest.skip("no C compiler here")
    dynamic = subprocess.run(["readelf", "-d", str(made / "libcuda.so")], capture_output=True,
                             text=True, timeout=60).stdout
    assert "Library soname: [libcuda.so.1]" in dynamic
    monkeypatch.setattr(cuda_toolkit, "DRIVER_FOLDERS", (str(tmp_path / "links"),))
    assert cuda_toolkit.driver_stub(None, tmp_path / "other", {}) is None  # the node has one
