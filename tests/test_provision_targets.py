"""provision.targets: --arch forms, names, auto through the doctor's GPU probes (recorded
vendor-tool outputs behind fake binaries), and the stack chosen for each target and nvcc."""

from __future__ import annotations

import pytest

from dsenv.envs import archs
from dsenv.envs.stacks import get_stack, load_stacks
from dsenv.envs.targets import Target, known_archs
from dsenv.errors import DsenvError
from dsenv.facts.toolchain import toolkit
from dsenv.provision.targets import choose_stack, detect_gpus, node_nvcc_version, resolve_arch
from tests.harness.recorded import fixture_text


@pytest.mark.parametrize("spec, vendor, archs_", [
    ("7.0", "nvidia", ("7.0",)),
    ("sm_80", "nvidia", ("8.0",)),
    ("80", "nvidia", ("8.0",)),
    ("sm_100", "nvidia", ("10.0",)),
    ("8.0;9.0", "nvidia", ("8.0", "9.0")),
    ("8.0,9.0", "nvidia", ("8.0", "9.0")),
    ("9.0, 8.0", "nvidia", ("8.0", "9.0")),  # sorted
    ("7.0 8.0", "nvidia", ("7.0", "8.0")),  # TORCH_CUDA_ARCH_LIST style
    ("10.0;9.0", "nvidia", ("9.0", "10.0")),  # numeric order, not text order
    ("8.0;8.0;sm_80", "nvidia", ("8.0",)),  # duplicates collapse
    ("8.6+PTX", "nvidia", ("8.6",)),
    ("gfx90a", "amd", ("gfx90a",)),
    ("gfx908", "amd", ("gfx908",)),
    ("gfx942", "amd", ("gfx942",)),
    ("gfx942;gfx90a", "amd", ("gfx90a", "gfx942")),
    ("gfx90a:xnack-", "amd", ("gfx90a",)),
    ("cpu", "cpu", ()),
    ("CPU", "cpu", ()),
])
def test_accepted_arch_forms(spec, vendor, archs_):
    target = resolve_arch(spec)
    assert (target.vendor, target.archs) == (vendor, archs_)


@pytest.mark.parametrize("name, vendor, arch", [
    ("K80", "nvidia", "3.7"), ("P100", "nvidia", "6.0"), ("V100", "nvidia", "7.0"),
    ("A100", "nvidia", "8.0"), ("H100", "nvidia", "9.0"), ("MI100", "amd", "gfx908"),
    ("MI250X", "amd", "gfx90a"), ("MI300X", "amd", "gfx942"),
    ("v100", "nvidia", "7.0"), ("mi250x", "amd", "gfx90a"), ("Tesla V100", "nvidia", "7.0"),
    ("tesla k80", "nvidia", "3.7"),
])
def test_every_gpu_name_of_the_issue_resolves_case_insensitively(name, vendor, arch):
    target = resolve_arch(name)
    assert (target.vendor, target.archs) == (vendor, (arch,))
    assert target.gpu_names and target.gpu_names[0].lower() == name.lower()


def test_names_and_archs_mix_within_a_vendor():
    target = resolve_arch("V100, A100;9.0")
    assert target.archs == ("7.0", "8.0", "9.0") and target.gpu_names == ("V100", "A100")


def test_arch_env_uses_the_separators_torch_and_deepspeed_split_on():
    assert resolve_arch("8.0,7.0").arch_env() == {"TORCH_CUDA_ARCH_LIST": "7.0;8.0"}
    assert resolve_arch("gfx942,gfx90a").arch_env() == {"PYTORCH_ROCM_ARCH": "gfx90a;gfx942"}
    assert resolve_arch("cpu").arch_env() == {}


def test_bf16_only_when_every_arch_has_it():
    assert resolve_arch("A100;H100").bf16
    assert not resolve_arch("7.0;8.0").bf16  # one V100 is enough to lose bf16
    assert resolve_arch("MI250X").bf16 and not resolve_arch("MI100").bf16
    assert resolve_arch("cpu").bf16  # torch's CPU kernels have bf16


def test_target_json_round_trip():
    target = resolve_arch("A100,H100")
    assert Target.from_json(target.to_json()) == target


@pytest.mark.parametrize("spec, said", [
    ("9.9", "did you mean '9.0' or '8.9'?"),
    ("gfx123", "did you mean 'gfx1201' or 'gfx1200' or 'gfx1103'?"),
    ("A1000", "did you mean 'A100' or 'A10' or 'V100'?"),
    ("8.0;bogus", "accepted: compute capabilities (7.0, sm_80), AMD gfx targets (gfx90a), GPU "
                  "names (A100, H100, MI250X), 'auto' or 'cpu'"),
    ("sm_99", "accepted: compute capabilities"), ("foo", "accepted: compute capabilities")])
def test_unknown_arch_names_close_matches_or_the_forms_not_every_name(spec, said):
    with pytest.raises(DsenvError) as error:
        resolve_arch(spec)
    text = str(error.value)
    assert "neither a GPU architecture nor a GPU name" in text and text.endswith(
        said if said.endswith("?") else "(see `dsenv provision --help`)")
    assert said in text and "GH200" not in text and len(text) < 300


def test_empty_spec_and_cpu_combined_are_errors():
    with pytest.raises(DsenvError, match="empty"):
        resolve_arch("  ")
    with pytest.raises(DsenvError, match="pass it alone"):
        resolve_arch("cpu,8.0")


def test_nvidia_and_amd_in_one_spec_is_an_error():
    with pytest.raises(DsenvError, match="mixes NVIDIA and AMD") as error:
        resolve_arch("A100;MI250X")
    assert "one environment per GPU partition" in str(error.value)


# -- auto: the doctor's GPU probes behind recorded tool outputs ------------------------
@pytest.fixture
def tools_env(fake_bin, tmp_path):
    """``tools_env({"nvidia-smi": fixture, ...}, **extra_env)`` -> an environment whose PATH
    has only those fake vendor tools (each prints its recorded output)."""

    def make(tools, **extra):
        folder = None
        for name, fixture in tools.items():
            out = tmp_path / f"{name}.out"
            out.write_text(fixture_text(fixture))
            folder = fake_bin(name, f"cat '{out}'\n")
        path = f"{folder}:/usr/bin:/bin" if folder else "/usr/bin:/bin"
        return {"PATH": path, "HOME": str(tmp_path), **extra}

    return make


def test_auto_on_a_node_with_a_titan_v_and_an_ada_card(tools_env):
    env = tools_env({"nvidia-smi": "gpu/nvidia_smi_titanv_ada.csv"})
    target = resolve_arch("auto", detect=lambda: detect_gpus(env))
    assert (target.vendor, target.archs) == ("nvidia", ("7.0", "8.9"))
    assert target.gpu_names == ("NVIDIA TITAN V", "NVIDIA RTX 5880 Ada Generation")
    assert "auto: NVIDIA TITAN V (sm_70)" in target.source


def test_auto_follows_cuda_visible_devices(tools_env):
    env = tools_env({"nvidia-smi": "gpu/nvidia_smi_titanv_ada.csv"}, CUDA_VISIBLE_DEVICES="1")
    assert resolve_arch("auto", detect=lambda: detect_gpus(env)).archs == ("8.9",)


def test_auto_on_an_old_driver_takes_the_arch_from_the_name(tools_env):
    env = tools_env({"nvidia-smi": "gpu/nvidia_smi_a100_470.csv"})
    assert resolve_arch("auto", detect=lambda: detect_gpus(env)).archs == ("8.0",)


def test_auto_on_an_mi250x_node(tools_env):
    env = tools_env({"rocminfo": "gpu/rocminfo_mi250x.txt"})
    target = resolve_arch("auto", detect=lambda: detect_gpus(env))
    assert (target.vendor, target.archs, target.bf16) == ("amd", ("gfx90a",), True)


def test_auto_with_nvidia_and_amd_gpus_is_an_error(tools_env):
    env = tools_env({"nvidia-smi": "gpu/nvidia_smi_a100_470.csv",
                     "rocminfo": "gpu/rocminfo_mi250x.txt"})
    with pytest.raises(DsenvError, match="mixes NVIDIA and AMD"):
        resolve_arch("auto", detect=lambda: detect_gpus(env))


def test_auto_without_a_gpu_says_to_pass_arch(tools_env, monkeypatch):
    env = tools_env({})
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DsenvError) as error:
        resolve_arch("auto")  # the default detector: the doctor's probes on this "node"
    text = str(error.value)
    assert "no GPU visible on this node" in text and "nvidia-smi: absent" in text
    assert "`--arch 8.0`" in text and "GPU name" in text and "--arch cpu" in text


def test_auto_with_a_gpu_of_unknown_arch():
    class Odd:
        vendor, arch, name = "nvidia", "", "NVIDIA Mystery"

    with pytest.raises(DsenvError, match="NVIDIA Mystery.*pass --arch"):
        resolve_arch("auto", detect=lambda: [Odd()])


# -- stacks ------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, stack", [
    ("cpu", "cpu"),
    ("5.0", "cuda12.6"), ("P100", "cuda12.6"), ("6.1", "cuda12.6"), ("V100", "cuda12.6"),
    ("7.5", "cuda13.0"), ("A100", "cuda13.0"), ("8.6", "cuda13.0"), ("8.9", "cuda13.0"),
    ("H100", "cuda13.0"), ("10.0", "cuda13.0"), ("12.0", "cuda13.0"),
    ("12.1", "cuda13.0"),  # runs the 12.0 PTX
    ("7.0;8.0", "cuda12.6"),  # the V100 decides
    ("MI100", "rocm7.2"), ("MI250X", "rocm7.2"), ("MI300X", "rocm7.2"),
])
def test_newest_stack_that_serves_every_arch(spec, stack):
    assert choose_stack(resolve_arch(spec)).name == stack


def test_no_stack_for_kepler():
    with pytest.raises(DsenvError) as error:
        choose_stack(resolve_arch("K80"))
    text = str(error.value)
    assert "no torch 2.13.0 stack ships kernels for sm_37 (Kepler)" in text
    assert "cuda12.6: sm_50" in text and "--arch cpu" in text


def test_no_stack_for_mi50():
    with pytest.raises(DsenvError, match="gfx906"):
        choose_stack(resolve_arch("MI50"))


def test_cuda13_nvcc_refuses_volta_with_the_fix():
    with pytest.raises(DsenvError) as error:
        choose_stack(resolve_arch("7.0"), toolkit_version="13.0.88")
    assert str(error.value) == (
        "CUDA 13.0's nvcc cannot build sm_70 (Volta; CUDA 13 dropped sm_50–sm_72): load a "
        "CUDA 12.x module (e.g. `module load cuda/12.6`, or CUDA_HOME=<its root>) or pass "
        "--ops none")


def test_cuda12_nvcc_picks_the_cuda12_stack_for_ampere():
    assert choose_stack(resolve_arch("A100"), toolkit_version="12.4.131").name == "cuda12.6"
    assert choose_stack(resolve_arch("A100"), toolkit_version="13.0.88").name == "cuda13.0"


def test_cuda11_nvcc_matches_no_torch_213_build():
    with pytest.raises(DsenvError) as error:
        choose_stack(resolve_arch("A100"), toolkit_version="11.8.89")
    text = str(error.value)
    assert "CUDA 11" in text and "assert_no_cuda_mismatch" in text
    assert "module load cuda/13.0" in text and "--ops none" in text


def test_cuda12_nvcc_cannot_build_blackwell():
    with pytest.raises(DsenvError, match=r"CUDA 12.6's nvcc cannot build sm_100 "
                                             r"\(Blackwell; its newest arch is sm_90\)"):
        choose_stack(resolve_arch("B200"), toolkit_version="12.6.85")


def test_requested_stack_that_cannot_serve_the_target():
    with pytest.raises(DsenvError) as error:
        choose_stack(resolve_arch("V100"), requested="cuda13.0")
    text = str(error.value)
    assert "--stack cuda13.0 cannot serve nvidia sm_70 (Volta)" in text
    assert "sm_70 (Volta) is not among them" in text and "stacks that can: cuda12.6" in text
    with pytest.raises(DsenvError, match="built for amd"):
        choose_stack(resolve_arch("A100"), requested="rocm7.2")
    with pytest.raises(DsenvError, match="unknown stack; known stacks: cpu, cuda12.6, cuda12.8"):
        choose_stack(resolve_arch("A100"), requested="cuda12.4")
    with pytest.raises(DsenvError, match="CUDA 13.0's nvcc cannot build sm_70"):
        choose_stack(resolve_arch("V100"), toolkit_version="13.0.88", requested="cuda12.6")


def test_experimental_stack_only_on_request():
    assert choose_stack(resolve_arch("H100")).name == "cuda13.0"
    assert choose_stack(resolve_arch("H100"), requested="cuda13.2").name == "cuda13.2"


def test_stack_table_is_consistent():
    stacks = load_stacks()
    for stack in stacks.values():
        assert stack.torch_requirement == f"torch=={stack.torch}{stack.local}"
        assert stack.lock.endswith(".txt") and stack.index_url.startswith("https://")
        for arch in stack.archs + stack.ptx:
            assert arch in known_archs("nvidia" if stack.vendor == "nvidia" else "amd")
        if stack.vendor == "nvidia":
            row = toolkit.toolkit_row(stack.toolkit)
            assert row is not None  # nvcc of the stack's CUDA builds what torch ships
            assert all(toolkit.can_build(row, a) for a in stack.archs)
    assert stacks["cpu"].available_find_links() == [
        p for p in stacks["cpu"].find_links if __import__("os").path.isdir(p)]


def test_every_gpu_model_arch_is_known():
    for model in archs.MODELS:
        assert model.arch in known_archs(model.vendor)


def test_node_nvcc_version_through_the_doctor_probe(fake_bin, tmp_path):
    out = tmp_path / "nvcc.out"
    out.write_text(fixture_text("gpu/nvcc_13.0.txt"))
    folder = fake_bin("nvcc", f"cat '{out}'\n")
    assert node_nvcc_version({"PATH": f"{folder}:/usr/bin:/bin"}) == "13.0.88"
    assert node_nvcc_version({"PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path / "none")}) is None


def test_stack_lookup():
    assert get_stack("cuda12.6").torch_version == "2.13.0+cu126"
    assert get_stack("cpu").lock_path.name == "cpu.txt"
