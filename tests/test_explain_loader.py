"""The dynamic loader and linker family (doctor/explain/loader.py, libraries.toml): what the
message says, which package provides the library, and whether this node has it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dsenv.doctor.explain import loader
from dsenv.facts.node import Node
from tests.harness.cli import dsenv

FIXTURES = Path(__file__).parent / "fixtures" / "explain"


def text_of(name: str) -> str:
    return (FIXTURES / name).read_text().partition("\n")[2]


@pytest.mark.parametrize("name, kind, library, version, provider", [
    ("libcudart12_xinference.log", "missing", "libcudart.so.12", "12", "CUDA runtime"),
    ("libcudart11_tf_dreamtalk.log", "missing", "libcudart.so.11.0", "11.0", "CUDA runtime"),
    ("libcudnn9_pytorch_165812.log", "missing", "libcudnn.so.9", "9", "cuDNN"),
    ("libmpi40_sfepy_941.log", "missing", "libmpi.so.40", "40", "MPI"),
    ("libamdhip64_llamafile_547.log", "missing", "libamdhip64.so.6", "6", "ROCm"),
    ("nvml_container_cli_231.log", "missing", "libnvidia-ml.so.1", "1", "NVML"),
    ("curand_link_deepspeed_7174.log", "link", "libcurand.so", "", "CUDA toolkit"),
    ("libaio1_opensora_856.log", "missing", "libaio.so.1", "1", "libaio"),
    ("libaio1_easyaccess_98.log", "missing", "libaio.so.1", "1", "libaio"),
    ("glibcxx_cpu_adam_4257.log", "symbol-version", "libstdc++.so.6", "GLIBCXX_3.4.29",
     "libstdc++"),
])
def test_real_messages_are_read_by_structure(name, kind, library, version, provider):
    found = loader.parse(text_of(name))
    assert [(f.kind, f.library, f.version) for f in found] == [(kind, library, version)]
    assert provider in found[0].row["name"]
    assert found[0].cause and found[0].fix and found[0].sources


def test_undefined_symbols_name_the_library_by_version_or_by_symbol():
    shadow, = loader.parse("ImportError: /x/torch/lib/libtorch_cuda.so: undefined symbol: "
                           "cublasLtGetStatusString, version libcublasLt.so.11")
    assert (shadow.library, shadow.symbol, shadow.required_by) == \
        ("libcublasLt.so.11", "cublasLtGetStatusString", "/x/torch/lib/libtorch_cuda.so")
    assert shadow.row["name"] == "cuBLAS"
    nccl, = loader.parse("undefined symbol: ncclCommInitRankConfig")
    assert nccl.row["name"] == "NCCL" and "nvidia-nccl-cu12" in nccl.fix


@pytest.mark.parametrize("soname, name", [
    ("libcuda.so.1", "libcuda"), ("libnvidia-ml.so.1", "NVML"), ("libcublasLt.so.12", "cuBLAS"),
    ("libnccl.so.2", "NCCL"), ("libcudnn_ops.so.9", "cuDNN"), ("libibverbs.so.1", "libibverbs"),
    ("libmlx5-rdmav34.so", "rdma-core"), ("libaio.so.1", "libaio"), ("libmpi.so.12", "MPI"),
    ("libamdhip64.so.6", "ROCm"), ("librccl.so.1", "ROCm"), ("libc10.so", "PyTorch"),
])
def test_the_table_maps_each_library_family(soname, name):
    assert name in loader.library_row(soname)["name"]


def test_every_row_compiles_and_has_a_source():
    for row in loader.table():
        re.compile(row["match"]), re.compile(row["symbols"])
        assert row["source"].startswith("https://") and row["fix"] and row["provider"]


def test_an_unknown_library_is_still_read_and_named():
    found, = loader.parse("error while loading shared libraries: libfoo.so.3: cannot open "
                          "shared object file: No such file or directory")
    assert found.library == "libfoo.so.3" and found.row is None and "libfoo.so.3" in found.fix


# emojicode/emojicode#195: an executable wants the old ncurses terminfo library (libtinfo5).
LIBTINFO = ("./emojicodec: error while loading shared libraries: libtinfo.so.5: cannot open "
            "shared object file: No such file or directory")


def test_a_library_dsenv_does_not_know_names_no_cause_but_shows_the_reading():
    # what failed is read (the library, its soname version), not why: below the bar
    done = dsenv("explain", LIBTINFO)
    assert done.returncode == 1, done.stdout
    assert done.stdout.startswith("no known cause")
    assert "weak        loader.missing (score 2.5 < 3): parsed: library libtinfo.so.5" in done.stdout
    assert "next        Find which package ships libtinfo.so.5" in done.stdout
    assert "`dsenv explain --here` looks for the library" in done.stdout
    # the healthy twin: a library the table knows is named (xinference's libcudart.so.12)
    known = dsenv("explain", text_of("libcudart12_xinference.log"))
    assert known.returncode == 0 and not known.stdout.startswith("no known cause")


def test_here_still_looks_for_a_library_dsenv_does_not_know(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libtinfo.so.5").write_bytes(b"\x7fELF")
    env = {"LD_LIBRARY_PATH": str(lib)}
    done = dsenv("explain", "--here", "--json", LIBTINFO, env=env)
    assert done.returncode == 1
    weak = json.loads(done.stdout)["weak"][0]
    assert weak["id"] == "loader.missing"
    assert any(str(lib / "libtinfo.so.5") in line for line in weak["here"]), weak["here"]
    # where it is nowhere: said so, not skipped
    gone = dsenv("explain", "--here", "--json", LIBTINFO.replace("libtinfo.so.5",
                                                                 "libnothere.so.5"))
    assert any("libnothere.so.5 is not found here" in line
               for line in json.loads(gone.stdout)["weak"][0]["here"])


def test_here_finds_the_library_in_the_environment_and_on_ld_library_path(tmp_path):
    site = tmp_path / "env" / "lib" / "python3.11" / "site-packages"
    wheel = site / "nvidia" / "cudnn" / "lib"
    wheel.mkdir(parents=True)
    (wheel / "libcudnn.so.9").write_bytes(b"\x7fELF")
    other = tmp_path / "lib64"
    other.mkdir()
    (other / "libcudnn.so.8").write_bytes(b"\x7fELF")
    node = Node(env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(other)},
                python_prefix=tmp_path / "env")
    finding, = loader.parse("ImportError: libcudnn.so.9: cannot open shared object file")
    lines = loader.look_here(finding, node)
    assert f"LD_LIBRARY_PATH: {other / 'libcudnn.so.8'}" in lines
    assert any(line.endswith(str(wheel / "libcudnn.so.9")) for line in lines), lines
    missing, = loader.parse("ImportError: libnothere.so.7: cannot open shared object file")
    assert loader.look_here(missing, node)[-1].startswith("libnothere.so.7 is not found here")


def test_here_says_a_link_cannot_succeed_without_the_unversioned_file(tmp_path):
    cuda = tmp_path / "cuda"
    (cuda / "lib64").mkdir(parents=True)
    (cuda / "lib64" / "libcurand.so.10").write_bytes(b"\x7fELF")
    node = Node(env={"PATH": "/usr/bin:/bin", "CUDA_HOME": str(cuda)},
                python_prefix=tmp_path / "none")
    finding, = loader.parse("/usr/bin/ld: cannot find -lcurand: No such file or directory")
    lines = loader.look_here(finding, node)
    assert f"CUDA_HOME: {cuda / 'lib64' / 'libcurand.so.10'}" in lines
    assert lines[-1].startswith("no unversioned libcurand.so")
    (cuda / "lib64" / "libcurand.so").symlink_to("libcurand.so.10")
    assert not loader.look_here(finding, node)[-1].startswith("no unversioned")


def test_a_symbol_version_is_looked_for_inside_the_library(tmp_path):
    lib = tmp_path / "libstdc++.so.6"
    lib.write_bytes(b"\x7fELF....GLIBCXX_3.4.28\0GLIBCXX_3.4.29\0")
    assert loader.has_version(str(lib), "GLIBCXX_3.4.29") is True
    assert loader.has_version(str(lib), "GLIBCXX_3.4.30") is False
    assert loader.has_version(str(tmp_path / "absent.so"), "GLIBCXX_3.4.30") is None


def test_explain_here_from_the_command_line():
    done = dsenv("explain", "--here", "/usr/bin/ld: cannot find -lcurand: No such file")
    assert done.returncode == 0, done.stderr
    # the catalogue mode the finding links to comes first; the finding's --here look follows
    assert done.stdout.startswith("loader.link-cuda-lib-missing:")
    assert "\n  here    no unversioned libcurand.so" in done.stdout


def test_here_inside_apptainer_looks_at_the_bound_driver_libraries(tmp_path):
    finding, = loader.parse("load library failed: libnvidia-ml.so.1: cannot open shared "
                            "object file: no such file or directory")
    (tmp_path / ".singularity.d").mkdir()
    node = Node(env={"PATH": "/usr/bin:/bin", "APPTAINER_CONTAINER": "/x/image.sif"},
                root=tmp_path, python_prefix=tmp_path / "none")
    assert any("bound only with --nv" in line for line in loader.look_here(finding, node))
    libs = tmp_path / ".singularity.d" / "libs"
    libs.mkdir()
    (libs / "libnvidia-ml.so.1").write_bytes(b"\x7fELF")
    assert "container bind (/.singularity.d/libs): " + str(libs / "libnvidia-ml.so.1") in \
        loader.look_here(finding, node)


def test_here_in_a_container_says_nothing_of_host_binds_for_a_library_the_image_installs(
        tmp_path):
    # libaio (and libGL) come from the image's packages, never from --nv/--gpus
    finding, = loader.parse("OSError: libaio.so.1: cannot open shared object file: No such file "
                            "or directory")
    (tmp_path / ".singularity.d").mkdir()
    (tmp_path / ".dockerenv").write_text("")
    node = Node(env={"PATH": "/usr/bin:/bin", "APPTAINER_CONTAINER": "/x/image.sif"},
                root=tmp_path, python_prefix=tmp_path / "none")
    lines = loader.look_here(finding, node)
    assert not any("--nv" in line or "--gpus" in line for line in lines), lines
    # the driver's libcuda in the same container: the host bind is what to look at
    driver, = loader.parse("OSError: libcuda.so.1: cannot open shared object file")
    assert any("bound only with --nv" in line for line in loader.look_here(driver, node))


@pytest.mark.parametrize("text, mode", [
    ('[BUG]: undefined symbol: "ncclCommWindowRegister"', "comm.multiple-nccl"),
    ("ImportError: /x/torch/lib/libtorch_cuda.so: undefined symbol: cublasLtGetStatusString, "
     "version libcublasLt.so.11", "torch.ld-library-path-shadows-cuda"),
    ("ImportError: /y/mpi4py/MPI.cpython-310-x86_64-linux-gnu.so: undefined symbol: "
     "ompi_mpi_errors_return", "mpi.mpi4py-other-mpi"),
    ("/usr/bin/ld: cannot find -laio", "deepspeed.async-io-no-libaio"),
    # the same link step in LLVM lld's words (lld/ELF/DriverUtils.cpp) and Apple ld64's
    ("ld.lld: error: unable to find library -laio", "deepspeed.async-io-no-libaio"),
    ("ld: library not found for -laio", "deepspeed.async-io-no-libaio"),
])
def test_a_finding_leads_to_the_catalogue_mode_and_its_check(text, mode):
    from dsenv.doctor.explain import rank
    best = rank.confident(rank.rank(text))
    assert best[0].id == mode and best[0].mode.check
    assert any(m.id.startswith("loader.") for m in best)


def test_each_linkers_wording_names_the_library_and_no_other_words_do():
    for text in ("ld.lld: error: unable to find library -lcudart",
                 "ld: library not found for -lcudart", "/usr/bin/ld: cannot find -lcudart"):
        finding, = loader.parse(text)
        assert (finding.kind, finding.library) == ("link", "libcudart.so"), text
    assert loader.parse("error: unable to find library for target x86_64") == []


def test_every_linked_mode_exists():
    from dsenv.doctor import catalogue
    ids = {m.id for m in catalogue.modes()}
    for row in loader.table():
        for key, mode in row.get("modes", {}).items():
            kind, _, shape = key.partition(".")
            assert kind in ("missing", "undefined-symbol", "symbol-version", "link"), key
            assert shape in ("", "program", "path", "extension", "torch", "abi", "unversioned", "own",
                             "unlinked"), key
            assert mode in ids, mode


@pytest.mark.parametrize("text, shape, mode", [
    # an executable linked against the library cannot start: its folder is off the path
    ("./bin/solver: error while loading shared libraries: libcublas.so.12: cannot open "
     "shared object file: No such file or directory", "program",
     "loader.ld-library-path-missing-cuda"),
    # an extension module being imported names the CUDA release it was built for
    ("ImportError: libcufft.so.10: cannot open shared object file: No such file or directory",
     "extension", "loader.ext-built-for-other-cuda"),
    # loaded by name at run time: not installed where the loader looks
    ("OSError: libcublasLt.so.12: cannot open shared object file: No such file or directory",
     "", "loader.cuda-lib-missing"),
    # torch's CUDA (cu118) is not the major the soname wants (12): built for another CUDA
    ("torch 2.1.0+cu118\nOSError: libcudart.so.12: cannot open shared object file", "extension",
     "loader.ext-built-for-other-cuda"),
    # cuDNN: any shape but an executable's is a missing cuDNN
    ("ImportError: libcudnn.so.9: cannot open shared object file", "extension",
     "loader.cudnn-missing"),
    # torch's own import (the last frame torch/__init__.py, ctypes' own left out): the CUDA
    # libraries its pip wheels take from the nvidia-* wheels (pytorch/pytorch#88869)
    ("  File \"/venv/lib/python3.11/site-packages/torch/__init__.py\", line 229, in <module>\n"
     "    from torch._C import *  # noqa: F403\nImportError: libcupti.so.11.7: cannot open "
     "shared object file: No such file or directory", "torch", "torch.pip-cuda-wheels-not-found"),
    ("  File \"/usr/lib64/python3.7/site-packages/torch/__init__.py\", line 153, in "
     "_load_global_deps\n    ctypes.CDLL(lib_path, mode=ctypes.RTLD_GLOBAL)\n  File \"/usr/lib64/"
     "python3.7/ctypes/__init__.py\", line 359, in __init__\nOSError: libcublas.so.11: cannot "
     "open shared object file", "torch", "torch.pip-cuda-wheels-not-found"),
    # twins: a conda build of torch links its own packages (pytorch/vision#5635), and an
    # extension imported after torch is the extension's
    ("  File \"/opt/conda/conda-bld/torchvision_1647/lib/python3.7/site-packages/torch/__init__"
     ".py\", line 199, in <module>\nImportError: libcupti.so.10.2: cannot open shared object "
     "file", "extension", "loader.ext-built-for-other-cuda"),
    ("  File \"/venv/lib/python3.11/site-packages/torch/__init__.py\", line 229, in <module>\n"
     "  File \"/venv/lib/python3.11/site-packages/xformers/ops.py\", line 3, in <module>\n"
     "ImportError: libcudart.so.11.0: cannot open shared object file", "extension",
     "loader.ext-built-for-other-cuda"),
    # MPI: an extension asks for the ABI it was built with; MPI's own internals are a path
    ("ImportError: libmpi.so.40: cannot open shared object file", "extension",
     "loader.mpi-other-abi"),
    ("ImportError: libopen-pal.so.80: cannot open shared object file", "extension",
     "loader.mpi-libs-not-on-path"),
    ("orted: error while loading shared libraries: libmpi.so.12: cannot open shared object "
     "file", "program", "loader.mpi-libs-not-on-path"),
    # cuDNN names the dependency it could not load: the driver's development name, which
    # dlopen does not find where only libcuda.so.1 is cached (WSL: microsoft/WSL#8587)
    ("Could not load library libcudnn_cnn_infer.so.8. Error: libcuda.so: cannot open shared "
     "object file: No such file or directory", "unversioned",
     "loader.libcuda-unversioned-not-found"),
    # cuda-python's own dlopen wrapper names the unversioned driver library (NVIDIA/cudf#10308,
    # WSL: fixed by putting /usr/lib/wsl/lib on LD_LIBRARY_PATH)
    ("  File \"cuda/_cuda/ccuda.pyx\", line 424, in cuda._cuda.ccuda.cuPythonInit\n"
     "RuntimeError: Failed to dlopen libcuda.so", "unversioned",
     "loader.libcuda-unversioned-not-found"),
    # the versioned driver library missing is no driver at all, whoever asked for it: most
    # often a container started without the GPU runtime (pytorch/pytorch#2985; a node without
    # the driver shares the words: group driver-lib-not-found)
    ("OSError: libcuda.so.1: cannot open shared object file: No such file or directory", "",
     "container.no-gpu-runtime"),
    ("/app: error while loading shared libraries: libcuda.so.1: cannot open shared object "
     "file: No such file or directory", "program", "container.no-gpu-runtime"),
    # a loader that says to set LD_LIBRARY_PATH (Paddle's, PaddleOCR#142), in its old and new
    # wording: the folder is off the path, whichever CUDA library it is
    ("Error: Failed to find dynamic library: libcublas.so ( libcublas.so: cannot open shared "
     "object file: No such file or directory ) \n Please specify its path correctly using "
     "following ways: \n Method. set environment variable LD_LIBRARY_PATH on Linux",
     "path", "loader.ld-library-path-missing-cuda"),
    ("RuntimeError: (PreconditionNotMet) The third-party dynamic library (libcudnn.so) that "
     "Paddle depends on is not configured correctly. (error code is libcudnn.so: cannot open "
     "shared object file: No such file or directory)", "path",
     "loader.ld-library-path-missing-cuda"),
    # TensorFlow prints the variable's value, which is no hint: still a library not installed
    ("Could not load dynamic library 'libcudart.so.11.0'; dlerror: libcudart.so.11.0: cannot "
     "open shared object file: No such file or directory; LD_LIBRARY_PATH: /usr/local/nvidia/lib",
     "", "loader.cuda-lib-missing"),
    # NVRTC's own wording names its builtins library (lfranke/TRIPS#13)
    ("RuntimeError: nvrtc: error: failed to open libnvrtc-builtins.so.11.1.\n  Make sure that "
     "libnvrtc-builtins.so.11.1 is installed correctly.", "", "loader.nvrtc-builtins-missing"),
    # the compiler's own support libraries (marbl/SALSA#97)
    ("/x/libexec/gcc/x86_64-unknown-linux-gnu/4.9.1/cc1plus: error while loading shared "
     "libraries: libmpfr.so.4: cannot open shared object file: No such file or directory",
     "program", "toolkit.compiler-support-libs-missing"),
])
def test_the_shape_of_a_missing_library_names_the_cause(text, shape, mode):
    found, = loader.parse(text)
    assert (found.shape, found.mode) == (shape, mode)


@pytest.mark.parametrize("symbol, shape, mode", [
    ("_ZN2at4_ops5zeros4callEN3c108ArrayRefINS2_6SymIntEEE", "",
     "loader.ext-built-for-other-torch"),
    ("_ZNK3c1010TensorImpl4sizeEl", "", "loader.ext-built-for-other-torch"),
    ("_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
     "abi", "loader.ext-cxx11-abi-mismatch"),
    # the old ABI's Ss is what a matching build against a torch <= 2.6 asks for too: alone it
    # says another torch release (mmdetection#3991's mmcv, fixed by rebuilding against torch)
    ("_ZN3c106detail14torchCheckFailEPKcS2_jRKSs", "", "loader.ext-built-for-other-torch"),
])
def test_an_undefined_torch_symbol_names_the_extension_and_the_abi(symbol, shape, mode):
    text = (f"ImportError: /home/u/.cache/torch_extensions/py310_cu121/fused_adam/fused_adam.so: "
            f"undefined symbol: {symbol}")
    found, = loader.parse(text)
    assert (found.shape, found.mode, found.extension) == (shape, mode, "fused_adam")


@pytest.mark.parametrize("symbol", [
    "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE9_M_appendEPKcm",  # std::__cxx11
    "_ZTVNSt7__cxx1118basic_stringstreamIcSt11char_traitsIcESaIcEEE",  # its vtable
    "_ZTINSt8ios_base7failureB5cxx11E", "_ZSt28__throw_bad_array_new_lengthv",
    "__cxa_throw_bad_array_new_length", "_ZNSt15__exception_ptr13exception_ptr9_M_addrefEv",
])
def test_a_missing_symbol_of_the_standard_library_itself_is_an_older_libstdcxx(symbol):
    """libstdc++ from GCC 5 on exports both string ABIs: a std:: name missing (with __cxx11 in
    it or not) means the libstdc++ loaded is older than the compiler that built the module,
    never the ABI flag, which is for other libraries' symbols taking a std::string (above)."""
    found, = loader.parse("ImportError: /opt/conda/lib/python3.9/site-packages/mod/_ext.cpython-"
                          f"39-x86_64-linux-gnu.so: undefined symbol: {symbol}")
    assert (found.row["name"], found.mode) == ("the GCC C++ runtime (libstdc++)",
                                              "loader.libstdcxx-too-old")


@pytest.mark.parametrize("torch_line, shape", [
    ("torch 2.7.1+cu128", "abi"), ("torch==2.9.0", "abi"),  # pip wheels with the new ABI
    ("torch 2.6.0+cu124", ""), ("torch 1.4.0", ""),  # old-ABI wheels: Ss is theirs too
])
def test_an_old_abi_symbol_is_the_abi_only_beside_a_new_abi_torch(torch_line, shape):
    text = (f"{torch_line}\nImportError: /env/lib/python3.10/site-packages/flash_attn_2_cuda."
            "cpython-310-x86_64-linux-gnu.so: undefined symbol: "
            "_ZN3c106detail14torchCheckFailEPKcS2_jRKSs")
    found, = loader.parse(text)
    assert found.shape == shape
    assert found.mode == ("loader.ext-cxx11-abi-mismatch" if shape else
                          "loader.ext-built-for-other-torch")


def test_tensorflows_wording_is_the_same_shape():
    found, = loader.parse("I tensorflow/stream_executor/dso_loader.cc:105] Couldn't open CUDA "
                          "library libcudnn.so. LD_LIBRARY_PATH: ")
    assert (found.kind, found.library, found.row["name"]) == ("missing", "libcudnn.so", "cuDNN")


@pytest.mark.parametrize("text, library", [
    ("libibverbs: Warning: couldn't load driver 'librxe-rdmav25.so': librxe-rdmav25.so: "
     "cannot open shared object file: No such file or directory", "librxe-rdmav25.so"),
    ("Unable to load libnccl-net.so : libnccl-net.so: cannot open shared object file: No such "
     "file or directory", "libnccl-net.so"),
])
def test_optional_libraries_are_named_as_usually_harmless(text, library):
    from dsenv.doctor.explain import rank
    found = [m for m in rank.rank(text) if m.finding]
    assert found[0].finding.library == library and found[0].finding.benign
    assert "Usually harmless" in found[0].finding.cause and found[0].score == rank.BAR


def test_nvcc_registration_symbols_and_libpython_name_their_causes():
    # __cudaRegisterFatBinaryEnd is emitted by nvcc >= 10.1: the extension met an older cudart
    nvcc, = loader.parse("ImportError: /x/_ext/roi_crop/_roi_crop.so: undefined symbol: "
                         "__cudaRegisterFatBinaryEnd")
    assert nvcc.mode == "loader.ext-built-for-other-cuda"
    py, = loader.parse("ImportError: libpython3.10.so.1.0: cannot open shared object file")
    assert (py.library, py.mode) == ("libpython3.10.so.1.0", "loader.libpython-not-found")


def test_the_dependency_a_library_failed_to_load_is_the_missing_one():
    """cuDNN names itself and then the library it could not open (as posted at
    https://github.com/oobabooga/textgen/issues/486, WSL2): libcuda.so is the finding; a line
    that names one library throughout stays that library."""
    text = ("Could not load library libcudnn_cnn_infer.so.8. Error: libcuda.so: cannot open "
            "shared object file: No such file or directory\n"
            "Please make sure libcudnn_cnn_infer.so.8 is in your library path!")
    assert [(f.kind, f.library) for f in loader.parse(text)] == [("missing", "libcuda.so")]
    alone = ("Could not load library libcudnn_cnn_infer.so.8. Error: libcudnn_cnn_infer.so.8: "
             "cannot open shared object file: No such file or directory")
    assert [f.library for f in loader.parse(alone)] == ["libcudnn_cnn_infer.so.8"]


@pytest.mark.parametrize("text, shape, mode", [
    # torch's own library lacking torch's own symbol: another install's libraries were loaded
    ("ImportError: /env/lib/python3.6/site-packages/torch/lib/libtorch_python.so: undefined "
     "symbol: _ZTIN3c1014WarningHandlerE", "own", "loader.stale-torch-libraries-on-path"),
    ("ImportError: /env/lib/python3.5/site-packages/torch/lib/libTHC.so.1: undefined symbol: "
     "THLongStorage_inferSizeN", "own", "loader.stale-torch-libraries-on-path"),
    # the same symbol asked by an extension: the extension was built for another torch
    ("ImportError: /env/site-packages/flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so: "
     "undefined symbol: _ZN3c104cuda9SetDeviceEi", "", "loader.ext-built-for-other-torch"),
    # an unversioned cuRAND symbol asked by an op: it was never linked against libcurand
    ("ImportError: /src/deepspeed/ops/adam/cpu_adam_op.cpython-38-x86_64-linux-gnu.so: "
     "undefined symbol: curandCreateGenerator", "unlinked", "loader.ext-unlinked-cuda-lib"),
    # a versioned one was linked, and another release was loaded first
    ("OSError: /env/site-packages/torch/lib/../../nvidia/cusparse/lib/libcusparse.so.12: "
     "undefined symbol: __nvJitLinkAddData_12_1, version libnvJitLink.so.12", "",
     "torch.ld-library-path-shadows-cuda"),
    # an NVML/NCCL symbol from torch's own library is not torch's own namespace
    ("ImportError: /env/site-packages/torch/lib/libtorch_cuda.so: undefined symbol: "
     "ncclCommRegister", "", "comm.multiple-nccl"),
])
def test_who_lacks_an_undefined_symbol_decides_its_cause(text, shape, mode):
    found, = loader.parse(text)
    assert (found.shape, found.mode) == (shape, mode)



# cuDNN's "Could not load library X. Error: <path>: undefined symbol": the library (or one it
# asks for by dlsym) was found and loaded, an older copy off LD_LIBRARY_PATH answered first
# (pytorch#119989: CUDA 12.3's cuDNN 8; dorado#166: CUDA 8.0's libnvrtc asked for nvrtcGetCUBIN)
SHADOWED = [
    "Could not load library libcudnn_cnn_train.so.8. Error: /usr/local/cuda-12.3/lib64/"
    "libcudnn_cnn_train.so.8: undefined symbol: _ZN5cudnn3cnn34layerNormFwd_execute_internal_"
    "implERKNS_7backend11VariantPackEP11CUstream_stRNS0_18LayerNormFwdParamsERKNS1_20NormForward"
    "OperationEmb, version libcudnn_cnn_infer.so.8",
    "Could not load library libcudnn_cnn_infer.so.8. Error: /usr/local/Cluster-Apps/cuda/8.0/"
    "lib64/libnvrtc.so: undefined symbol: nvrtcGetCUBIN",
]


@pytest.mark.parametrize("text", SHADOWED)
def test_a_cudnn_load_failing_on_a_symbol_is_an_older_copy_not_a_missing_cudnn(text):
    from dsenv.doctor.explain import rank
    best = rank.confident(rank.rank(text))
    assert best and best[0].id == "torch.ld-library-path-shadows-cuda"


def test_a_dlsym_into_the_library_itself_is_not_an_unlinked_module():
    found, = [f for f in loader.parse(SHADOWED[1]) if f.kind == "undefined-symbol"]
    assert (found.shape, found.mode) == ("", "torch.ld-library-path-shadows-cuda")
    # a module outside the wheels that was never linked against it stays "unlinked"
    unlinked, = loader.parse("ImportError: /opt/ds/ops/cpu_adam.so: undefined symbol: "
                             "curandCreateGenerator")
    assert unlinked.shape == "unlinked"


def test_a_cudnn_that_cannot_be_opened_is_still_missing():
    from dsenv.doctor.explain import rank
    text = ("Could not load library libcudnn_cnn_infer.so.8. Error: libcudnn_cnn_infer.so.8: "
            "cannot open shared object file: No such file or directory")
    assert rank.confident(rank.rank(text))[0].id == "loader.cudnn-missing"


def test_a_symbol_not_defined_with_link_time_reference_is_an_undefined_symbol():
    # glibc's other wording of a missing versioned symbol (PaddlePaddle/PaddleSeg#3215,
    # hpcaitech/ColossalAI#4059: the comma is optional)
    for text in ("python: relocation error: /usr/local/cuda-11.1/lib64/libcublas.so: symbol "
                 "runGemmShortApi, version libcublasLt.so.11 not defined in file "
                 "libcublasLt.so.11 with link time reference",
                 "OSError: /env/site-packages/nvidia/cublas/lib/libcublas.so.11: symbol "
                 "cublasLtHSHMatmulAlgoInit version libcublasLt.so.11 not defined in file "
                 "libcublasLt.so.11 with link time reference"):
        found = loader.parse(text)
        assert [(f.kind, f.library, f.version) for f in found] == [
            ("undefined-symbol", "libcublasLt.so.11", "libcublasLt.so.11")], found
        assert "cuBLAS" in found[0].row["name"] and found[0].required_by.startswith("/")
    # a library the table does not know, in the same words: read, named by what failed only
    other = loader.parse("ls: relocation error: /lib64/libacl.so.1: symbol getxattr, version "
                         "ATTR_1.0 not defined in file libattr.so.1 with link time reference")
    assert [(f.kind, f.version) for f in other] == [("undefined-symbol", "ATTR_1.0")]
    assert other[0].row is None


def test_ctranslate2s_wording_of_a_library_it_could_not_load():
    # faster-whisper and whisperX print CTranslate2's own words (SYSTRAN/faster-whisper#47,
    # lewangdev/autotranslate#11): read as the soname that was not loaded
    found = loader.parse("RuntimeError: Library libcublas.so.11 is not found or cannot be loaded")
    assert [(f.kind, f.library, f.version) for f in found] == [
        ("missing", "libcublas.so.11", "11")]
    assert "cuBLAS" in found[0].row["name"]


@pytest.mark.parametrize("dll, soname", [
    ("cublas64_12.dll", "libcublas.so.12"), ("cudart64_110.dll", "libcudart.so.11.0"),
    ("cudnn_ops_infer64_8.dll", "libcudnn_ops_infer.so.8"), ("zlibwapi.dll", "zlibwapi.dll"),
])
def test_a_windows_cuda_dll_is_read_as_its_linux_soname(dll, soname):
    """cuDNN's, CTranslate2's and TensorFlow's Windows wordings name <lib>64_<major>.dll: the
    same library and major as the soname, so the same table row and modes answer."""
    from dsenv.doctor.explain.loader_words import linux_name
    assert linux_name(dll) == soname
    if dll.startswith("cu"):
        finding, = loader.parse(f"RuntimeError: Library {dll} is not found or cannot be loaded")
        assert (finding.kind, finding.library) == ("missing", soname)
