"""The Python-packages family (doctor/explain/families/python.py, doctor/modes/python.toml)
on real texts, with the rows of the loader, gpu and build tables that came with it (xFormers'
build, read by the GPU family; transformers' dependency checks, read by the build family):
each symptom is read into its parts and named; the look-alikes of
tests/fixtures/explain_lookalikes/python.jsonl (same words, another cause in their threads) are
not read as the mode they resemble; empty and unrelated text give no reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsenv.doctor.explain.command import explain_text
from dsenv.doctor.explain.families import build, gpu, python
from tests.harness import symptoms

ROWS = symptoms.rows("python")
LOOKALIKES = [json.loads(line) for line in (
    Path(__file__).parent / "fixtures" / "explain_lookalikes" / "python.jsonl").read_text()
    .splitlines() if line.strip()]


def first_cause(text: str) -> str:
    _, _, sure, _ = explain_text(text)
    return sure[0].id if sure else ""


def text_of(table: str, url_end: str) -> str:
    return symptoms.text(symptoms.rows(table), url_end)


def test_every_mode_of_the_table_has_its_symptoms_named():
    assert {r["mode"] for r in ROWS} == {
        "env.compiled-extension-missing", "env.torch-older-than-checkpoint-format",
        "env.torch-pin-not-built-for-interpreter",
        "env.package-older-than-pydantic-2", "env.pydantic-older-than-package",
        "env.conda-cuda-virtual-package-missing", "env.pip-into-externally-managed-python",
        "env.pip-cannot-uninstall-os-package", "toolkit.cmake4-old-policy-minimum", "deepspeed.ops-built-for-other-torch", "hf.bnb-quantization-without-cuda", "env.wheel-tags-not-this-interpreter", "env.module-command-uninitialised", "env.rust-extension-no-wheel", "env.tokenizers-sdist-new-rustc", "env.numpy2-abi", "torch.weights-only-default", "env.torchvision-other-torch",
        "env.protobuf-too-new", "env.package-missing", "env.build-without-torch",
        "loader.bitsandbytes-cuda-binary", "hf.git-lfs-pointer-files", "env.scripts-not-on-path",
        "env.numpy-name-removed", "env.setuptools-too-old-for-python",
        "env.torch-local-version-needs-pytorch-index", "env.python-outside-requires-python",
        "env.pkg-resources-unavailable", "env.numpy-older-than-build",
        "env.numpy-built-for-another-python", "env.protobuf-too-old",
        "env.urllib3-needs-openssl-111", "env.python-built-without-stdlib-ext",
        "env.package-version-mismatch", "env.mmcv-without-ops", "env.apex-without-cuda-ext",
        "env.conda-activate-noninteractive", "env.no-python-command",
        "env.jinja2-older-than-markupsafe", "env.setuptools-too-new-for-distutils-version",
        "env.package-imports-distutils-on-py312", "env.package-older-than-python310-collections-abc",
        "env.typing-extensions-too-old", "env.pyopenssl-older-than-cryptography",
        "env.package-older-than-urllib3-2", "env.user-file-shadows-package",
        "hf.transformers-too-old-for-model", "cache.weights-file-is-html-page",
        "hf.local-model-path-not-found", "env.locale-ascii-for-click", "env.pynvml-legacy-package",
        "hf.wandb-unreachable", "cache.numba-cache-not-writable",
        "env.triton-missing-for-inductor", "env.pyarrow-mixed-install",
        "env.te-torch-extension-missing", "hf.not-a-safetensors-file",
        "hf.remote-code-older-than-transformers", "hf.lfs-quota-exceeded",
        "env.pip-download-hash-mismatch", "env.notebook-kernel-stale-package",
        "env.datasets-too-old-for-python", "env.duplicate-package-variants",
        "env.torchaudio-api-removed", "env.ffmpeg-binary-missing",
        "env.windows-long-paths-disabled", "env.ext-built-without-cuda",
        "env.windows-ansi-codepage-default-encoding", "env.module-unknown",
        "env.flash-attn-csrc-ext-missing", "env.module-prerequisite-not-loaded",
        "env.wheel-package-missing", "env.triton-no-wheel-for-platform",
        "env.requirements-frozen-conda-build-paths", "env.pip-site-packages-not-writable",
        "env.ffmpeg-shared-libs-missing", "hf.hf-hub-rust-relative-redirect"}
    missed = {r["url"]: first_cause(r["text"]) for r in ROWS
              if first_cause(r["text"]) != r["mode"]}
    assert not missed, missed


@pytest.mark.parametrize("row", LOOKALIKES, ids=lambda r: f"not-{r['not_mode']}@{r['url'][19:]}")
def test_lookalikes_are_not_read_as_the_mode_they_resemble(row):
    assert first_cause(row["text"]) != row["not_mode"]
    assert row["not_mode"] not in [r.mode for r in python.read(row["text"])]


def test_xformers_build_says_which_of_three_causes():
    # another torch release
    got = symptoms.parts(gpu, text_of("loader", "lllyasviel/Fooocus/pull/2517"),
                         "loader.ext-built-for-other-torch")
    assert got == {"extension": "xFormers", "built for": "torch 2.0.1+cu118",
                   "installed": "torch 2.1.0+cu121"}
    # the same release for another CUDA
    got = symptoms.parts(gpu, text_of("loader", "Comfy-Org/ComfyUI-Manager/issues/251"),
                         "loader.ext-built-for-other-cuda")
    assert got["built for"] == "torch 2.1.2+cu118" and got["installed"] == "torch 2.1.2+cu121"
    # a CPU-only torch: the CUDA build is what is missing
    assert symptoms.parts(gpu, text_of("gpu", "open-mmlab/PIA/issues/30"),
                          "torch.cpu-only-build")["installed"] == "torch 2.1.2+cpu"
    for url, mode in (("lllyasviel/Fooocus/pull/2517", "loader.ext-built-for-other-torch"),
                      ("TheLastBen/fast-stable-diffusion/issues/2788",
                       "loader.ext-built-for-other-torch"),
                      ("yufu-wang/PromptHMR/issues/4", "loader.ext-built-for-other-cuda")):
        assert first_cause(text_of("loader", url)) == mode


def test_dependency_checks_name_the_requirement_and_what_was_found():
    got = symptoms.parts(build, text_of("build", "jasonppy/VoiceCraft/pull/135"),
                         "env.package-version-mismatch")
    assert got == {"requires": "huggingface-hub>=0.23.0,<1.0", "found": "huggingface-hub 0.22.2"}
    got = symptoms.parts(build, text_of("build", "huggingface/transformers/issues/29174"),
                         "env.package-version-mismatch")
    assert got == {"requires": "accelerate>=0.20.1", "found": ""}  # the check names no version
    # bitsandbytes' availability hint names no version: its thread's cause was no visible GPU
    assert build.read("ImportError: Using `bitsandbytes` 8-bit quantization requires "
                      "Accelerate: `pip install accelerate` and the latest version of "
                      "bitsandbytes") == []


def test_missing_packages_of_the_stack_but_not_the_codes_own_modules():
    got = symptoms.parts(python, text_of("python", "SymbioticLab/FedScale/issues/12"),
                         "env.package-missing")
    assert got == {"package": "SentencePiece"}
    assert symptoms.parts(python, text_of("python", "pytorch/pytorch/issues/92132"),
                          "env.package-missing") == {"package": "datasets"}
    assert [r.mode for r in python.read("ModuleNotFoundError: No module named 'flash_attn'")] \
        == ["env.package-missing"]
    # the user's own module, a submodule of the training code, DeepSpeed's MPI discovery
    for text in ("ModuleNotFoundError: No module named 'utils'",
                 "ModuleNotFoundError: No module named 'models.llama'",
                 "ModuleNotFoundError: No module named 'mpi4py'"):
        assert python.read(text) == [], text


def test_torch_missing_inside_an_isolated_build_but_not_bare():
    emu3 = text_of("python", "baaivision/Emu3/issues/5")
    assert symptoms.parts(python, emu3, "env.build-without-torch")["package"] == "torch"
    # uv's hint stands on its own line after the error: read as the line near the root
    assert first_cause(text_of("python", "whyNLP/LCKV/issues/17")) == "env.build-without-torch"
    # torch missing with nothing around it names nothing (meituan-longcat/LongCat-Video#135's
    # whole text: its thread's cause was the isolated build, which the text does not show)
    assert first_cause("ModuleNotFoundError: No module named 'torch'") == ""


def test_bitsandbytes_names_the_library_it_could_not_load():
    text = text_of("python", "bitsandbytes-foundation/bitsandbytes/issues/1452")
    assert symptoms.parts(python, text, "loader.bitsandbytes-cuda-binary") == {
        "library": "libcusparse.so.11"}
    # the loader's own reading of the same line stays, below bitsandbytes' mode
    _, _, sure, _ = explain_text(text)
    assert sure[0].id == "loader.bitsandbytes-cuda-binary"
    assert "loader.missing" in [m.id for m in sure]
    text = text_of("python", "bitsandbytes-foundation/bitsandbytes/issues/551")
    assert symptoms.parts(python, text, "loader.bitsandbytes-cuda-binary") == {
        "library": "libbitsandbytes_cuda122.so"}
    # 0.43-0.45's warning names the binary torch's CUDA asked for (a release without cu128)
    text = text_of("python", "lllyasviel/stable-diffusion-webui-forge/pull/2712")
    assert symptoms.parts(python, text, "loader.bitsandbytes-cuda-binary") == {
        "library": "libbitsandbytes_cuda128.dll"}


def test_torchaudio_symbols_are_torchaudio_not_any_extension():
    text = text_of("python", "pytorch/audio/issues/3335")
    _, _, sure, _ = explain_text(text)
    assert sure[0].id == "env.torchvision-other-torch"
    # the same c10/torch symbol in another extension stays that extension's: a symbol with
    # the new ABI's string tag (B5cxx11), so either of the two extension causes
    # (pytorch/xla#5608 settled this very symbol as the ABI)
    other = text.replace("torchaudio/lib/libtorchaudio.so", "flash_attn_2_cuda.so")
    _, _, sure, _ = explain_text(other)
    assert [m.id for m in sure[:2]] == ["loader.ext-cxx11-abi-mismatch",
                                        "loader.ext-built-for-other-torch"]
    assert sure[0].shared == "torch-symbol-string-abi"


def test_nothing_to_read():
    for text in ("", "Traceback (most recent call last):", "RuntimeError: shape mismatch"):
        assert python.read(text) == []


def test_a_numpy_name_removed_says_which_release_removed_it():
    assert symptoms.parts(python, text_of("python", "noisereduce/issues/102"),
                          "env.numpy-name-removed") == {"name": "np.float (removed in NumPy 1.24)"}
    assert symptoms.parts(python, text_of("python", "AutoRAG/issues/519"),
                          "env.numpy-name-removed") == {"name": "np.float_ (removed in NumPy 2.0)"}
    # the first line alone, as users often paste it
    assert [r.mode for r in python.read("AttributeError: module 'numpy' has no attribute 'bool'")] \
        == ["env.numpy-name-removed"]
    # a name NumPy never had (the code's typo), or its own module shadowed, is not it
    for text in ("AttributeError: module 'numpy' has no attribute 'arrray'",
                 "AttributeError: partially initialized module 'numpy' has no attribute "
                 "'ndarray' (most likely due to a circular import)"):
        assert python.read(text) == [], text


def test_tools_older_than_python():
    got = symptoms.parts(python, text_of("python", "cpython/issues/108541"),
                         "env.setuptools-too-old-for-python")
    assert got == {"removed": "pkgutil.ImpImporter (Python 3.12)", "importer": "pkg_resources"}
    assert first_cause(text_of("python", "pip/issues/12358")) == "env.setuptools-too-old-for-python"
    # another attribute of pkgutil (the code's own misuse) is not it
    assert python.read("AttributeError: module 'pkgutil' has no attribute 'iter_modulez'") == []


def test_transformers_asking_for_accelerate_before_device_map():
    for url in ("Comfy-Org/ComfyUI/issues/6685", "ComfyUI-HunyuanVideoWrapper/issues/398",
                "QwenLM/Qwen3/issues/173"):
        assert symptoms.parts(python, text_of("python", url), "env.package-missing") \
            == {"package": "accelerate"}, url
        assert first_cause(text_of("python", url)) == "env.package-missing", url
    # healthy twin: bitsandbytes' hint with the same words had another cause in its thread
    assert python.read("ImportError: Using `bitsandbytes` 8-bit quantization requires "
                       "Accelerate: `pip install accelerate` and the latest version of "
                       "bitsandbytes") == []


def _modes(text: str) -> dict[str, dict[str, str]]:
    return {r.mode: dict(r.parts) for r in python.read(text)}


# Verbatim from https://github.com/triton-lang/triton/issues/5471 (bitsandbytes before 0.45.1
# imports triton.ops, which triton 3.2 removed) and https://github.com/huggingface/peft/issues/
# 2116 (peft 0.13 imports huggingface_hub.errors, which hub 0.19.4 does not have yet).
TRITON_OPS = """File ~/.local/lib/python3.13/site-packages/bitsandbytes/__init__.py:15
      6 from . import research, utils
---> 15 from .nn import modules
ModuleNotFoundError: No module named 'triton.ops'"""
HUB_ERRORS = """File /dccstor/geofm-finetuning/francescmartiescofet/masters-thesis/.pixi/envs/default/lib/python3.12/site-packages/peft/utils/loftq_utils.py:26
     [24] import torch
     [25] from huggingface_hub import snapshot_download
     [26] from huggingface_hub.errors import HFValidationError
     [27] from huggingface_hub.utils import LocalEntryNotFoundError
     [28] from safetensors import SafetensorError, safe_open

ModuleNotFoundError: No module named 'huggingface_hub.errors'"""


def test_a_submodule_of_an_installed_package_is_two_releases_apart_not_missing():
    got = _modes(TRITON_OPS)
    assert got == {"env.package-version-mismatch": {
        "package": "triton", "module": "triton.ops", "importer": "bitsandbytes"}}
    assert first_cause(TRITON_OPS) == "env.package-version-mismatch"
    got = _modes(HUB_ERRORS)
    assert got == {"hf.hub-version-api-removed": {
        "package": "huggingface_hub", "module": "huggingface_hub.errors", "importer": "peft"}}
    assert first_cause(HUB_ERRORS) == "hf.hub-version-api-removed"
    # the line alone, as mlx-examples#994 and bitsandbytes#328 posted it
    assert first_cause("ModuleNotFoundError: No module named 'huggingface_hub.utils._errors'") \
        == "hf.hub-version-api-removed"
    assert first_cause("ModuleNotFoundError: No module named 'triton.ops.matmul_perf_model'") \
        == "env.package-version-mismatch"
    # healthy twins: the package itself absent is still missing; a namespace (google.protobuf:
    # protobuf missing), pip's unrelated "apex", a Megatron source tree, DeepSpeed's ops built
    # on first use, and a module of the user's own code are not a version mismatch
    assert set(_modes("ModuleNotFoundError: No module named 'triton'")) == {"env.package-missing"}
    for text in ("No module named 'google.protobuf'", "No module named 'apex.amp'",
                 "No module named 'megatron.core'", "No module named 'deepspeed.ops.adam'",
                 "No module named 'mymodels.llama'"):
        assert "env.package-version-mismatch" not in _modes(text), text


# Verbatim from https://github.com/dstackai/dstack/pull/1851: trl's SFTTrainer (a release
# newer than the installed transformers) passes processing_class to its base, Trainer.
TRL_OVER_OLD_TRANSFORMERS = """[rank0]: Traceback (most recent call last):
[rank0]:   File "/workflow/trl/examples/scripts/sft.py", line 95, in <module>
[rank0]:     trainer = SFTTrainer(
[rank0]:   File "/opt/conda/envs/workflow/lib/python3.10/site-packages/huggingface_hub/utils/_deprecation.py", line 101, in inner_f
[rank0]:     return f(*args, **kwargs)
[rank0]:   File "/opt/conda/envs/workflow/lib/python3.10/site-packages/transformers/utils/deprecation.py", line 165, in wrapped_func
[rank0]:     return func(*args, **kwargs)
[rank0]:   File "/opt/conda/envs/workflow/lib/python3.10/site-packages/trl/trainer/sft_trainer.py", line 409, in __init__
[rank0]:     super().__init__(
[rank0]: TypeError: Trainer.__init__() got an unexpected keyword argument 'processing_class'"""


def test_a_keyword_one_package_passes_another_that_refuses_it():
    got = _modes(TRL_OVER_OLD_TRANSFORMERS)["env.package-version-mismatch"]
    assert got == {"caller": "trl", "api": "Trainer.__init__", "keyword": "processing_class"}
    assert first_cause(TRL_OVER_OLD_TRANSFORMERS) == "env.package-version-mismatch"
    # the keyword written in the package's own call (transformers calling accelerate)
    text = ('  File "/x/lib/python3.10/site-packages/transformers/trainer.py", line 1990, in '
            '_wrap_model\n    if self.accelerator.unwrap_model(model, keep_torch_compile=False) '
            'is not model:\nTypeError: Accelerator.unwrap_model() got an unexpected keyword '
            "argument 'keep_torch_compile'")
    assert _modes(text)["env.package-version-mismatch"]["caller"] == "transformers"
    # healthy twins: the user's own code passing the keyword (bollossom/GAC#3), and a package
    # frame that only forwards the caller's **kwargs (the user's argument), are the code's
    own = """Traceback (most recent call last):
  File "main.py", line 151, in <module>
    parallel_model =  msresnet18(num_classes=100,T=6)
  File "/home/GAC-main/CODE/CIFAR/models/MS_ResNet.py", line 164, in _resnet
    model = ResNet(block, layers, **kwargs)
TypeError: __init__() got an unexpected keyword argument 'T'"""
    forwarded = ('  File "/x/site-packages/transformers/modeling_utils.py", line 3832, in '
                 'from_pretrained\n    model = cls(config, *model_args, **model_kwargs)\n'
                 "TypeError: LlamaForCausalLM.__init__() got an unexpected keyword argument "
                 "'use_flash_attn'")
    for text in (own, forwarded):
        assert "env.package-version-mismatch" not in _modes(text), text
        assert first_cause(text) == "", text


# Verbatim from https://github.com/wenquanlu/HandRefiner/issues/34 (torchvision 0.16+ imports
# torch._custom_ops, which the older torch installed lacks; a matching pair fixed it) and
# https://github.com/huggingface/transformers/issues/30908 (accelerate imports a module of
# torch 2.3 under torch 2.1.2; fixed by huggingface/accelerate#2794).
TORCHVISION_OVER_OLD_TORCH = r"""Traceback (most recent call last):
  File "Z:\testf\HandRefiner\handrefiner.py", line 24, in <module>
    from torchvision import transforms
  File "Z:\software\python\lib\site-packages\torchvision\__init__.py", line 6, in <module>
    from torchvision import _meta_registrations, datasets, io, models, ops, transforms, utils
  File "Z:\software\python\lib\site-packages\torchvision\_meta_registrations.py", line 4, in <module>
    import torch._custom_ops
ModuleNotFoundError: No module named 'torch._custom_ops'"""


def test_a_torch_submodule_a_stack_package_imports_is_a_version_mismatch():
    got = _modes(TORCHVISION_OVER_OLD_TORCH)
    assert got == {"env.package-version-mismatch": {
        "package": "torch", "module": "torch._custom_ops", "importer": "torchvision"}}
    assert first_cause(TORCHVISION_OVER_OLD_TORCH) == "env.package-version-mismatch"
    line = "ModuleNotFoundError: No module named 'torch.distributed.checkpoint.format_utils'"
    assert _modes(line)["env.package-version-mismatch"]["module"] \
        == "torch.distributed.checkpoint.format_utils"
    assert first_cause(line) == "env.package-version-mismatch"
    # healthy twins: torch itself absent, its compiled core (a source tree or a broken install,
    # IDM-VTON#126; a build without distributed, accelerate#1787), a core package every torch
    # has, a class imported as a module (pytorch#60353), a file named torch.py shadowing the
    # package, and the user's own module named like torch are not a version mismatch
    for text in ("ModuleNotFoundError: No module named 'torch'",
                 "ModuleNotFoundError: No module named 'torch._C'",
                 "ModuleNotFoundError: No module named 'torch._C._distributed_c10d'; 'torch._C' "
                 "is not a package",
                 "ModuleNotFoundError: No module named 'torch.nn'",
                 "ModuleNotFoundError: No module named 'torch.nn.Module'",
                 "ModuleNotFoundError: No module named 'torch.fx'; 'torch' is not a package",
                 "ModuleNotFoundError: No module named 'mytorch.fx'"):
        assert "env.package-version-mismatch" not in _modes(text), text
        assert first_cause(text) != "env.package-version-mismatch", text


PIP_INDEX = "env.torch-local-version-needs-pytorch-index"


def _pin(requirement: str, versions: str) -> str:
    return (f"ERROR: Could not find a version that satisfies the requirement {requirement} "
            f"(from versions: {versions})\nERROR: No matching distribution found for "
            f"{requirement}")


def test_a_labelled_torch_build_pip_found_only_unlabelled_needs_pytorchs_index():
    # the Tsinghua mirror as the only index (liucongg/ChatGLM-Finetuning#17)
    got = symptoms.parts(python, text_of("python", "liucongg/ChatGLM-Finetuning/issues/17"),
                         PIP_INDEX)
    assert got == {"package": "torch", "release": "1.13.1", "label": "cu116",
                   "build for": "CUDA 11.6", "index": "https://download.pytorch.org/whl/cu116"}
    # torch_stable.html passed as --extra-index-url, through pipenv's requirements file
    # (pytorch/pytorch#86630)
    got = symptoms.parts(python, text_of("python", "pytorch/pytorch/issues/86630"), PIP_INDEX)
    assert got["release"] == "1.10.1" and got["index"] == "https://download.pytorch.org/whl/cu111"
    # the other labels, and the family's other packages
    for requirement, versions, label, names in (
            ("torchvision==0.16.0+cu121", "0.15.2, 0.16.0, 0.16.1", "cu121", "CUDA 12.1"),
            ("torch==2.2.1+rocm5.7", "2.1.2, 2.2.0, 2.2.1", "rocm5.7", "ROCm 5.7"),
            ("torchaudio==2.1.0+cpu", "2.0.2, 2.1.0", "cpu", "CPU only"),
            ("torch==1.7.1+cu92", "1.7.0, 1.7.1", "cu92", "CUDA 9.2")):
        text = _pin(requirement, versions)
        got = symptoms.parts(python, text, PIP_INDEX)
        assert (got["label"], got["build for"]) == (label, names), text
        assert got["index"] == "https://download.pytorch.org/whl/" + label
        assert first_cause(text) == PIP_INDEX, text


def test_a_torch_pin_pip_cannot_find_for_other_reasons_stays_quiet():
    quiet = (
        # healthy twins: a pin without a local label, and a package outside torch's family
        _pin("torch==1.13.1", "2.0.0, 2.0.1, 2.1.0"),
        "ERROR: Could not find a version that satisfies the requirement deepspeed==0.14.0 "
        "(from versions: none)\nERROR: No matching distribution found for deepspeed==0.14.0",
        _pin("somepkg==1.2.0+cu118", "1.1.0, 1.2.0"),
        # nothing for this interpreter (lunar#95: a Python newer than torch 1.10's wheels)
        _pin("torch==1.10.0+cu113", "none"),
        # the release is not listed: no wheel of it for this Python (Deep-Live-Cam#473)
        _pin("torchvision==0.15.2+cu118", "0.17.0, 0.17.1, 0.17.2, 0.18.0"),
        # labelled builds listed: PyTorch's index was read; the label is not built for that
        # release there (pytorch/pytorch#54172: 1.8.0's cu102 wheels carry no label)
        _pin("torch==1.8.0+cu102", "1.7.1, 1.7.1+cu101, 1.8.0, 1.8.0+cpu, 1.8.0+cu101"),
        # macOS: PyPI lists the release, no index has a CUDA build of it (OneTrainer#169)
        _pin("torch==2.1.2+cu118", "2.1.0, 2.1.1, 2.1.2, 2.2.0") + "\n\nPython 3.10.13\nApple M2")
    for text in quiet:
        assert first_cause(text) != PIP_INDEX, text
    for text in quiet[:-1]:
        assert PIP_INDEX not in [r.mode for r in python.read(text)], text


OUTSIDE = "env.python-outside-requires-python"


def test_a_release_pip_skipped_for_its_requires_python_names_the_range():
    got = symptoms.parts(python, text_of("python", "openai/openai-quickstart-python/issues/12"),
                         OUTSIDE)
    assert got == {"package": "numpy", "release": "1.21.3", "requires python": ">=3.7,<3.11",
                   "interpreter": "", "python is": ""}
    # a floor (>=X) whose release is skipped; the range has a lower bound only: Python is older
    got = symptoms.parts(python, text_of("python", "HarleyCoops/Dakota1890/pull/111"), OUTSIDE)
    assert got == {"package": "numpy", "release": "2.5.1", "requires python": ">=3.12",
                   "interpreter": "", "python is": "older"}
    # the interpreter, where the text shows it, says which side of the range it is on
    text = ("Using cached lxml-6.0.2-cp310-cp310-macosx_10_9_universal2.whl.metadata (3.6 kB)\n"
            "ERROR: Ignored the following versions that require a different python version: "
            "2.3.2 Requires-Python >=3.11; 2.3.3 Requires-Python >=3.11\n"
            "ERROR: Could not find a version that satisfies the requirement numpy==2.3.3 (from "
            "versions: 2.2.3, 2.2.4)\nERROR: No matching distribution found for numpy==2.3.3")
    got = symptoms.parts(python, text, OUTSIDE)
    assert got["interpreter"] == "3.10" and got["python is"] == "older"
    assert first_cause(text) == OUTSIDE


def test_an_ignored_line_of_other_releases_stays_off_the_requires_python_mode():
    # healthy twins: the skipped releases are another package's (torch on PyPy: no wheel,
    # pytorch/pytorch#97865), the pinned release was found (its label is the matter), or there
    # is no requirement pip failed on (a requirements file's pkg_resources==0.0.0)
    pypy = ("ERROR: Ignored the following versions that require a different python version: "
            "1.9.5 Requires-Python >=2.7, !=3.0.*, !=3.1.*, !=3.2.*, !=3.3.*, <3.7\n"
            "ERROR: Could not find a version that satisfies the requirement torch==2.0.0 (from "
            "versions: none)\nERROR: No matching distribution found for torch==2.0.0")
    found = ("ERROR: Ignored the following versions that require a different python version: "
             "1.21.2 Requires-Python >=3.7,<3.11; 1.21.3 Requires-Python >=3.7,<3.11\n"
             "ERROR: Could not find a version that satisfies the requirement numpy==1.21.3 (from "
             "versions: 1.21.1, 1.21.3, 1.22.0)\n")
    alone = ("ERROR: Ignored the following versions that require a different python version: "
             "1.21.2 Requires-Python >=3.7,<3.11; 1.21.3 Requires-Python >=3.7,<3.11")
    for text in (pypy, found, alone):
        assert OUTSIDE not in [r.mode for r in python.read(text)]
        assert first_cause(text) != OUTSIDE
    # without pip's ignored line, a release it cannot find says nothing of the Python
    quiet = ("ERROR: Could not find a version that satisfies the requirement numpy==1.23.1 (from "
             "versions: 1.21.3, 1.21.4)\nERROR: No matching distribution found for numpy==1.23.1")
    assert python.read(quiet) == [] and first_cause(quiet) == ""


def test_an_older_numpy_than_the_build_says_both_c_apis():
    found = [r for r in python.read(text_of("python", "pytorch/pytorch/issues/2564"))
             if r.mode == "env.numpy-older-than-build"]
    assert found and dict(found[0].parts) == {"built for": "NumPy C API 0xb",
                                              "installed": "NumPy C API 0xa"}
    # the same words without the 0x prefix (tensorflow's older wording, trailbehind/DeepOSM#2)
    found = python.read("RuntimeError: module compiled against API version a but this version "
                        "of numpy is 9")
    assert [dict(r.parts) for r in found if r.mode == "env.numpy-older-than-build"] == [
        {"built for": "NumPy C API 0xa", "installed": "NumPy C API 0x9"}]


def test_numpys_import_error_alone_names_no_direction():
    # "numpy.core.multiarray failed to import" follows an older NumPy or NumPy 2 under a 1.x
    # build (and, rarely, no NumPy at all: pytorch/pytorch#1755): alone it is the group that
    # lists both directions, never one of them; NumPy's own line above it names the direction
    from tests.harness.explaining import answer

    line = "ImportError: numpy.core.multiarray failed to import"
    assert answer(line) == ("numpy-c-api-unloadable",
                            ["env.numpy2-abi", "env.numpy-older-than-build"])
    assert first_cause("A module that was compiled using NumPy 1.x cannot be run in\nNumPy 2.0.0 "
                       "as it may crash.\n" + line) == "env.numpy2-abi"


def test_pkg_resources_parts_name_the_importing_file():
    found = [r for r in python.read(*_message_and_around("deepspeedai/DeepSpeed/issues/5649"))
             if r.mode == "env.pkg-resources-unavailable"]
    assert found
    parts = dict(found[0].parts)
    assert parts["importer"].endswith("torch/utils/cpp_extension.py (torch's extension builder: "
                                      "torch 2.1 or older)")
    assert parts["setuptools"].startswith("70.0-70.3")
    # the module gone (setuptools >= 82, or none): tensorboard's own import names the importer
    found = [r for r in python.read(*_message_and_around("Nerogar/OneTrainer/issues/1304"))
             if r.mode == "env.pkg-resources-unavailable"]
    assert found and dict(found[0].parts) == {
        "importer": "/home/redacted/onetrainer-old/OneTrainer/venv/lib/python3.12/site-packages/"
                    "tensorboard/default.py",
        "setuptools": "82 or later, or none (no pkg_resources)"}
    # another package's module that is not there is not this (nor a package of the stack)
    assert first_cause("ModuleNotFoundError: No module named 'pkg_resources_extra'") == ""


def _message_and_around(url_end: str) -> tuple[str, str]:
    lines = text_of("python", url_end).splitlines()
    return lines[-1], "\n".join(lines[:-1])


def test_numpys_c_api_warning_is_the_cause_only_of_a_numpy_failure():
    warning = ("UserWarning: Failed to initialize NumPy: module compiled against API version 0x10 "
               "but this version of numpy is 0xd (Triggered internally at tensor_numpy.cpp:77.)")
    numpy_failure = python.read("RuntimeError: Numpy is not available", warning)
    assert "env.numpy-older-than-build" in [r.mode for r in numpy_failure]
    other = python.read("RuntimeError: NCCL error: unhandled system error", warning)
    assert "env.numpy-older-than-build" not in [r.mode for r in other]


def test_openmmlabs_mmcv_range_check_names_both_sides():
    """mmdet's, mmpose's and the other OpenMMLab packages' import-time check prints the mmcv
    installed and the range the release takes (open-mmlab/mmdetection#4058); bitsandbytes >= 0.46
    says which binary it was configured for (bitsandbytes#1688)."""
    got = symptoms.parts(python, text_of("build", "open-mmlab/mmdetection/issues/4058"),
                         "env.package-version-mismatch")
    assert got == {"requires": "mmcv>=1.1.5, <=1.3", "found": "mmcv 1.1.4"}
    got = symptoms.parts(python, text_of("python", "bitsandbytes/issues/1688"),
                         "loader.bitsandbytes-cuda-binary")
    assert got == {"library": "libbitsandbytes_cuda129.so"}
    assert not python.read("MMCV==2.1.0 is installed")


@pytest.mark.parametrize("text, missing, extra", [
    ("AttributeError: module 'torch' has no attribute 'float8_e4m3fn'", "torch.float8_e4m3fn",
     {"needs": "torch >= 2.1"}),
    ("AttributeError: module 'torch.nn' has no attribute 'RMSNorm'", "torch.nn.RMSNorm",
     {"needs": "torch >= 2.4"}),
    ("  File \"/root/.cache/huggingface/modules/transformers_modules/phi3/modeling_phi3.py\", "
     "line 1197\nAttributeError: 'DynamicCache' object has no attribute 'get_max_length'",
     "DynamicCache.get_max_length", {"caller": "the model's remote code"}),
    ("AttributeError: 'AdamW' object has no attribute 'train'", "AdamW.train()",
     {"needs": "accelerate >= 0.34 (transformers >= 4.45 calls it)"}),
    ("module transformers has no attribute Qwen2AudioForConditionalGeneration",
     "transformers.Qwen2AudioForConditionalGeneration", {}),
    ("TypeError: LoraConfig.__init__() got an unexpected keyword argument 'use_dora'",
     "LoraConfig(use_dora=...)", {}),
])
def test_a_name_another_release_of_the_stack_lacks_is_read_with_the_release(text, missing,
                                                                             extra):
    """Names one package of the stack asks of another's release (hf25 threads: torch names by
    the release that added them, transformers' Cache API, accelerate's optimizer.train(),
    transformers classes, PEFT config keys): the name, and the release where one is known."""
    got = symptoms.parts(python, text, "env.package-version-mismatch")
    assert got["missing"] == missing and all(got[k] == v for k, v in extra.items()), got


@pytest.mark.parametrize("text", [
    # a circular import or a file named torch.py shadowing the package: not a release
    "AttributeError: partially initialized module 'torch' has no attribute 'compiler' (most "
    "likely due to a circular import)",
    # a name no torch release added (a typo or the user's own)
    "AttributeError: module 'torch' has no attribute 'cuda_available'",
    "AttributeError: 'MyCache' object has no attribute 'lookup'",
])
def test_names_no_release_explains_are_not_read(text):
    assert "env.package-version-mismatch" not in [r.mode for r in python.read(text)]


def test_a_torch_pin_pip_offers_no_wheel_for_says_which_side_the_interpreter_is():
    """pip's list holds only torch releases built for this interpreter: all above the pin
    (memgraph/mage#489: torch==1.12.0, from 1.13.0) is an interpreter newer than the pin; the
    pin's own release in the list (a local version label) or a list spanning it is not this."""
    got = symptoms.parts(python, text_of("python", "memgraph/mage/issues/489"),
                         "env.torch-pin-not-built-for-interpreter")
    assert (got["pin"], got["offered"], got["python is"]) == (
        "1.12.0", "1.13.0 to 2.3.1", "newer than torch 1.12.0 has wheels for")
    older = ("ERROR: Could not find a version that satisfies the requirement torch==2.6.0 (from "
             "versions: 1.13.1, 2.0.0, 2.0.1)")
    assert symptoms.parts(python, older, "env.torch-pin-not-built-for-interpreter")[
        "python is"] == "older than torch 2.6.0 has wheels for"
    for other in ("ERROR: Could not find a version that satisfies the requirement torch==2.1.0+cu121"
                  " (from versions: 2.0.1, 2.1.0, 2.1.1)",
                  "ERROR: Could not find a version that satisfies the requirement torch==2.1.5 "
                  "(from versions: 2.0.1, 2.2.0)"):
        assert "env.torch-pin-not-built-for-interpreter" not in [
            r.mode for r in python.read(other)]


def test_pydantics_two_directions_are_read_apart():
    """pydantic 2 under a package of the v1 era (DeepSpeed's config_utils.py at
    deepspeedai/DeepSpeed#3950) and pydantic 1 under a package of the v2 API
    (datalab-to/marker#73) are the two directions; pydantic's own validation error is neither."""
    got = symptoms.parts(python, text_of("python", "deepspeedai/DeepSpeed/pull/3950"),
                         "env.package-older-than-pydantic-2")
    assert (got["v1 api"], got["caller"]) == ("field_info", "deepspeed")
    got = symptoms.parts(python, text_of("python", "datalab-to/marker/issues/73"),
                         "env.pydantic-older-than-package")
    assert got["v2 name"] == "field_validator"
    assert not [r for r in python.read("pydantic_core._pydantic_core.ValidationError: 1 validation "
                                       "error for DeepSpeedZeroConfig\nstage\n  Input should be "
                                       "a valid integer") if "pydantic" in r.mode]


@pytest.mark.parametrize("url_end,missing,together", [
    ("s3fs/issues/463", "fsspec.asyn.maybe_sync", "fsspec and s3fs"),
    ("filesystem_spec/issues/597", "fsspec.asyn.maybe_sync", "fsspec and s3fs"),  # Python 3.6
    ("s3fs/issues/338", "fsspec.asyn", "fsspec and s3fs"),
    ("dill/issues/489", "dill._dill.stack", "dill and datasets"),
    ("aiobotocore/issues/905", "AioClientCreator._register_lazy_block_unknown_fips_pseudo_regions",
     "aiobotocore, botocore"),
    ("s3fs/issues/512", "aiobotocore.AioSession", "aiobotocore, botocore"),
])
def test_storage_packages_out_of_step_say_what_is_missing(url_end, missing, together):
    # released in lockstep: a name the installed fsspec/dill/aiobotocore lacks, and the pair
    text = symptoms.text(symptoms.rows("build"), url_end)
    got = symptoms.parts(python, text, "env.package-version-mismatch")
    assert got["missing"] == missing and got["releases that go together"].startswith(together)


def test_a_project_importing_its_own_fsspec_like_name_is_not_a_storage_mismatch():
    assert not [r for r in python.read("ImportError: cannot import name 'maybe_sync' from "
                                       "'myproject.asyn'") if "fsspec" in r.describe()]
