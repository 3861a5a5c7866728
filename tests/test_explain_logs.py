"""`dsenv explain` on whole logs: the root error, not the cascade; evidence, not one word.

The fixtures (tests/fixtures/explain/*.log) are texts users posted in public trackers, each
file's first line its source."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsenv.doctor.explain import alternatives, logread, rank
from dsenv.doctor.explain.command import explain_text
from tests.harness import symptoms
from tests.harness.cli import dsenv

FIXTURES = Path(__file__).parent / "fixtures" / "explain"


def fixture(name: str) -> tuple[str, str]:
    """(source URL, the text users posted)."""
    url, _, text = (FIXTURES / name).read_text().partition("\n")
    return url, text


def test_every_fixture_names_its_public_source():
    files = sorted(FIXTURES.glob("*.log"))
    assert len(files) >= 12
    for path in files:
        url = path.read_text().partition("\n")[0]
        assert url.startswith("https://github.com/") and " " not in url, path.name


# (fixture, the cause its thread established; None: must stay below the bar)
CASES = [
    ("libcudart12_xinference.log", "loader.ext-built-for-other-cuda"),
    ("libcudart11_tf_dreamtalk.log", "loader.cuda-lib-missing"),
    ("libcudnn9_pytorch_165812.log", "loader.cudnn-missing"),
    ("libmpi40_sfepy_941.log", "loader.mpi-other-abi"),
    ("libamdhip64_llamafile_547.log", "loader.rocm-libs-not-on-path"),
    ("nvml_container_cli_231.log", "container.host-driver-missing"),
    ("nvml_docker_textgen_3562.log", "container.host-driver-missing"),
    ("curand_link_deepspeed_7174.log", "loader.link-cuda-lib-missing"),
    ("libaio1_opensora_856.log", "deepspeed.async-io-no-libaio"),
    ("libaio1_easyaccess_98.log", "deepspeed.async-io-no-libaio"),
    ("glibcxx_cpu_adam_4257.log", "loader.libstdcxx-too-old"),
    ("async_io_libaio_1126.log", "deepspeed.async-io-no-libaio"),
    ("nccl_shm_nospace_ci_infra_490.log", "system.shm-too-small"),
    ("nccl_shm_fallocate_290.log", "system.shm-too-small"),
    ("nccl_gid_info_1814.log", None),  # only INFO lines: a GID echo names no failure
    # torch's "sm_61 is not compatible" warning printed below the error in the paste: the gpu
    # family reads it from the lines around the "no kernel image" line (a GTX 1080 Ti under a
    # cu128 wheel that starts at sm_70: too old for that build, not a build to widen)
    ("torch_sm61_warning_above_whisper_653.log", "gpu.too-old-for-torch"),
]


@pytest.mark.parametrize("name, expected", CASES, ids=[c[0] for c in CASES])
def test_real_messages_get_the_cause_their_thread_found(name, expected):
    _, text = fixture(name)
    _, _, sure, _ = explain_text(text)
    if expected is None:
        assert sure == []
    else:
        assert sure and sure[0].id == expected, [(m.id, m.score, m.why) for m in sure]


def test_nccl_shared_memory_is_not_a_home_quota():
    """Was cache.home-quota (the single-line matcher read 'No space left on device')."""
    for name in ("nccl_shm_nospace_ci_infra_490.log", "nccl_shm_fallocate_290.log"):
        _, text = fixture(name)
        _, _, sure, _ = explain_text(text)
        assert "cache.home-quota" not in [m.id for m in sure]


def test_a_gid_index_in_the_context_is_not_a_roce_problem():
    """NCCL's INFO echo of NCCL_IB_GID_INDEX sits a few lines above the real error."""
    _, noise = fixture("nccl_gid_info_1814.log")
    _, shm = fixture("nccl_shm_nospace_ci_infra_490.log")
    reading, line, sure, _ = explain_text(noise + shm)
    assert [m.id for m in sure] == ["system.shm-too-small"]
    assert "NCCL WARN Error: failed to extend /dev/shm" in line.text
    assert line.number == noise.count("\n") + 1


def test_the_root_comes_before_torchruns_summary_and_is_the_line_read():
    _, text = fixture("curand_link_deepspeed_7174.log")
    reading = logread.find_root(text)
    assert reading.root.number == 1 and "cannot find -lcurand" in reading.root.text
    assert {x.kind for x in reading.lines if "exitcode" in x.text} == {"cascade"}
    done = dsenv("explain", str(FIXTURES / "curand_link_deepspeed_7174.log"))
    assert done.returncode == 0 and done.stdout.startswith("loader.link-cuda-lib-missing:")
    # the fixture's first line is its URL: the error is line 2 of the file
    assert "read    line 2: /usr/bin/ld: cannot find -lcurand" in done.stdout


SLURM_JOB = """\
+ srun python train.py --deepspeed ds_config.json
0: [2024-06-14 14:24:07,747] [INFO] [real_accelerator.py:203:get_accelerator] Setting ds_accelerator to cuda (auto detect)
1: [2024-06-14 14:24:07,751] [INFO] [real_accelerator.py:203:get_accelerator] Setting ds_accelerator to cuda (auto detect)
1: Traceback (most recent call last):
1:   File "/home/u/train.py", line 3, in <module>
1:     import torch
1:   File "/home/u/venv/lib64/python3.11/site-packages/torch/__init__.py", line 427, in <module>
1:     from torch._C import *  # noqa: F403
1: ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory
0: [rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5
srun: error: gpu017: task 1: Exited with exit code 1
srun: error: gpu017: task 0: Killed
slurmstepd: error: *** STEP 123456.0 ON gpu017 CANCELLED AT 2024-06-14T14:25:01 ***
"""


def test_srun_labels_are_read_and_the_cascade_is_skipped():
    reading, line, sure, _ = explain_text(SLURM_JOB)
    assert line is reading.root and line.number == 9
    assert line.text.startswith("ImportError: libcudnn.so.9")
    # torch's own import asked for it (torch/__init__.py's frame): its pip wheels' nvidia libraries
    assert sure[0].id == "torch.pip-cuda-wheels-not-found"
    assert sure[1].finding.library == "libcudnn.so.9" and sure[1].finding.shape == "torch"
    kinds = {x.number: x.kind for x in reading.lines}
    assert kinds[10] == kinds[11] == kinds[12] == kinds[13] == "cascade"
    assert kinds[6] == "other"  # a frame inside the traceback is not a failure


def test_a_lone_generic_word_says_no_known_cause_and_shows_what_it_read():
    done = dsenv("explain", "RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED")
    assert done.returncode == 1, done.stdout
    assert done.stdout.startswith("no known cause")
    assert "line 1: RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED" in done.stdout
    assert "job.bf16-unsupported-gpu (score 1" in done.stdout
    as_json = json.loads(dsenv("explain", "CUBLAS_STATUS_NOT_SUPPORTED", "--json").stdout)
    assert as_json["matches"] == [] and as_json["weak"][0]["id"] == "job.bf16-unsupported-gpu"


def test_a_bare_bus_error_lists_the_causes_it_names_none():
    """SIGBUS alone (threads settled /dev/shm too small and a full disk under a mapped file,
    alternatives.toml bus-error-unlocated): both listed, none named, and what tells them
    apart; /dev/shm in the line names it alone (the twin)."""
    done = dsenv("explain", "Fatal Python error: Bus error")
    assert done.returncode == 0, done.stdout
    assert done.stdout.startswith("2 known causes share these words (bus-error-unlocated)")
    assert "df -h /dev/shm" in done.stdout
    _, _, sure, _ = explain_text("Bus error (core dumped)\ndf: /dev/shm 64M 64M 0 100%")
    assert [m.id for m in sure][:1] == ["system.shm-too-small"] and not sure[0].shared


def test_a_bare_no_space_lists_the_causes_it_names_none():
    """A bare ENOSPC still names no one cause: it is the group of the causes threads settled
    for it (tests/test_explain_no_space.py), each listed, none named alone."""
    done = dsenv("explain", "OSError: [Errno 28] No space left on device")
    assert done.returncode == 0, done.stdout
    assert done.stdout.startswith("4 known causes share these words (no-space-unlocated)")
    assert "the text alone cannot tell which" in done.stdout


def test_a_specific_message_still_wins_alone():
    assert rank.confident(rank.rank("OSError: [Errno 122] Disk quota exceeded"))[0].id == \
        "cache.home-quota"


def make_log(lines: int = 10_000) -> str:
    """A job log of real INFO lines from 8 ranks, one real error, then the cascade."""
    _, nccl = fixture("nccl_gid_info_1814.log")
    info = [x for x in nccl.splitlines() if "NCCL INFO" in x]
    ds = "[2024-06-14 14:24:07,747] [INFO] [real_accelerator.py:203:get_accelerator] " \
         "Setting ds_accelerator to cuda (auto detect)"
    _, error = fixture("libcudart12_xinference.log")
    out = []
    for i in range(lines - 3):
        out.append(f"[rank{i % 8}]: " + (ds if i % 7 == 0 else info[i % len(info)]))
        if i == lines // 2:
            out.append("[rank3]: " + error.strip())
    out += ["srun: error: gpu017: task 3: Exited with exit code 1",
            "srun: error: gpu017: task 0: Killed"]
    return "\n".join(out) + "\n"


def test_a_10000_line_log_is_read_well_under_half_a_second():
    text = make_log()
    start = time.perf_counter()
    reading, line, sure, _ = explain_text(text)
    took = time.perf_counter() - start
    assert sure[0].id == "loader.ext-built-for-other-cuda" and "libcudart.so.12" in line.text
    assert took < 1.0, took  # 0.5 s for the whole command: bench/explain_time.py


def test_a_log_without_an_error_line_is_read_as_fast_and_its_end_still_counts():
    # a job that was killed without a word: 10,000 INFO lines and the shell's "Killed"
    quiet = "".join(line + "\n" for line in make_log().splitlines()
                    if "libcudart" not in line and not line.startswith("srun"))
    reading, line, sure, _ = explain_text(quiet + "Killed\n")
    assert line.text == "Killed" and sure[0].id == "system.host-oom-killed"
    # without it no line reads as a failure: the text is one message, each line once
    start = time.perf_counter()
    reading, _, sure, _ = explain_text(quiet)
    took = time.perf_counter() - start
    assert reading.single and not sure
    assert took < 1.0, took  # it was 5 s when all 10,000 lines were read as one message


def test_a_line_of_megabytes_keeps_its_head_and_tail_and_costs_no_more():
    # a printed tensor, a token list or a JSON dump on one line: every rule scans a line from
    # each position, and a 50,000-character line took minutes
    blob = "x" * 5_000_000
    for text in (f"ImportError: libcudart.so.12: cannot open shared object file: No such "
                 f"file or directory {blob}",
                 f"{blob} ImportError: libcudart.so.12: cannot open shared object file: No "
                 f"such file or directory"):
        start = time.perf_counter()
        reading, line, sure, _ = explain_text(text)
        took = time.perf_counter() - start
        assert sure and sure[0].id in alternatives.group("cuda-runtime-soname-missing").modes
        assert took < 1.0 and len(line.text) < 1000 and "characters ...]" in line.text, took
    # the middle of such a line is not read
    reading, _, sure, _ = explain_text(blob + " ImportError: libcudart.so.12: cannot open "
                                       "shared object file " + blob)
    assert not sure


def test_stdin_and_files_read_the_same():
    text = make_log(200)
    done = subprocess.run([sys.executable, "-m", "dsenv", "explain", "-"], text=True,
                          input=text, capture_output=True, timeout=60)
    # two causes share a missing libcudart.so.12 (doctor/explain/alternatives.toml)
    n = len(alternatives.group("cuda-runtime-soname-missing").modes)
    assert done.returncode == 0 and done.stdout.startswith(
        f"{n} known causes share these words (cuda-runtime-soname-missing)")
    assert f"[1 of {n}] loader.ext-built-for-other-cuda:" in done.stdout
    assert "read    line 102: ImportError: [address=0.0.0.0:44627" in done.stdout


@pytest.mark.parametrize("text", [
    "RuntimeError: Error building extension 'cpu_adam'",  # any build failure says this
    "NCCL INFO Using network Socket",  # a fabric without RDMA prints it too
])
def test_a_generic_symptom_alone_stays_below_the_bar(text):
    """These named a cause before issue 23 (jit.extensions-dir-shared,
    comm.slingshot-no-ofi-plugin) on one generic phrase."""
    assert rank.confident(rank.rank(text)) == []


def test_an_illegal_instruction_is_the_cpu_not_one_package():
    """A bare SIGILL named DeepSpeed's CPU ops before issue 23; numpy, bitsandbytes or any
    binary built for AVX-512 print the same. It is the CPU lacking what a binary was built
    for (system.cpu-lacks-isa, which took in deepspeed.cpu-ops-sigill): every settled thread
    of the symptoms says so, the ops' and the wheels' alike."""
    sure = rank.confident(rank.rank("Illegal instruction (core dumped)"))
    assert [m.id for m in sure] == ["system.cpu-lacks-isa"]


def test_evidence_names_real_modes_and_every_rule_has_a_source():
    from dsenv.data import load_table
    from dsenv.doctor import catalogue
    ids = {m.id: m for m in catalogue.modes()}
    table = load_table("dsenv.doctor.explain", "evidence.toml")
    patterns = {p for m in ids.values() for p in m.match}
    assert set(table["generic"]) <= patterns  # verbatim catalogue patterns
    assert "mode" not in table  # per-mode evidence lives in the mode's row (doctor/modes/)
    sigill = "DeepSpeedCPUAdam step: Illegal instruction (core dumped)"
    assert rank.confident(rank.rank(sigill))[0].id == "system.cpu-lacks-isa"


TORCHRUN = """\
[rank1]: Traceback (most recent call last):
[rank0]: [2024-06-14 14:24:07,747] [INFO] [real_accelerator.py:203:get_accelerator] Setting ds_accelerator to cuda (auto detect)
[rank1]:   File "/home/u/train.py", line 9, in <module>
[rank1]:     raise ValueError("failed to parse")
[rank1]:     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[rank1]: RuntimeError: Ninja is required to load C++ extensions
W0614 14:25:00.123000 140 torch/distributed/elastic/multiprocessing/api.py:890] Sending process 41 closing signal SIGTERM
E0614 14:25:01.456000 140 torch/distributed/elastic/multiprocessing/api.py:862] failed (exitcode: 1) local_rank: 1 (pid: 42) of binary: /usr/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
pdsh@node1: node2: ssh exited with exit code 1
"""


def test_torchruns_summary_and_an_interrupted_traceback_are_not_the_root():
    reading, line, sure, _ = explain_text(TORCHRUN)
    assert line.number == 6 and sure[0].id == "jit.ninja-missing"
    kinds = {x.number: x.kind for x in reading.lines}
    assert kinds[4] == "other"  # a source line in the traceback, after another rank's line
    assert [kinds[n] for n in (7, 8, 9, 11, 13)] == ["cascade"] * 5


@pytest.mark.parametrize("raw, text", [
    ("[rank1]: 0: [2024-06-14 14:24:07,747] worker-1: libcudart.so.12: cannot open",
     "libcudart.so.12: cannot open"),
    ("[1,3]<stderr>: RuntimeError: x", "RuntimeError: x"),
    ("[trainer0|0]:ncclInternalError: Internal check failed.",
     "ncclInternalError: Internal check failed."),
    ("\x1b[31mERROR\x1b[0m: bad", "ERROR: bad"),
    ("libnvidia-ml.so.1: cannot open shared object file", "libnvidia-ml.so.1: cannot open "
                                                          "shared object file"),
    # an exception of a module whose name holds a digit is no pdsh host (awsome-distributed-ai
    # #378, as posted under srun --label)
    ("3: urllib3.exceptions.ReadTimeoutError: HTTPSConnectionPool(host='huggingface.co', "
     "port=443): Read timed out. (read timeout=10)",
     "urllib3.exceptions.ReadTimeoutError: HTTPSConnectionPool(host='huggingface.co', "
     "port=443): Read timed out. (read timeout=10)"),
    # docker compose's service prefix (drivendataorg/concept-to-clinic#152), v1 and v2 forms
    ("prediction_1  | RuntimeError: Click will abort further execution",
     "RuntimeError: Click will abort further execution"),
    ("web-1  | OSError: libcudart.so.12: cannot open", "OSError: libcudart.so.12: cannot open"),
    # docker build's plain progress output (scikit-learn-contrib/hdbscan#457)
    ("#6 0.864 ValueError: numpy.ndarray size changed", "ValueError: numpy.ndarray size changed"),
    ("#12 5 a note", "#12 5 a note"),  # only "#step seconds " with a decimal point is one
    # pytest's failure lines (rapidsai/cucim#775)
    ("E   ModuleNotFoundError: No module named 'distutils'",
     "ModuleNotFoundError: No module named 'distutils'"),
    # enroot's helpers name themselves: no pdsh host (NVIDIA/enroot#79)
    ("enroot-aufs2ovlfs: failed to set capabilities: Operation not permitted",
     "enroot-aufs2ovlfs: failed to set capabilities: Operation not permitted"),
])
def test_launcher_prefixes_are_cleaned_and_library_names_kept(raw, text):
    assert logread.clean(raw) == text


def test_a_fallback_warning_is_not_the_root_when_a_later_line_names_what_killed_the_job():
    """NCCL cannot open libibverbs and goes on over sockets (comm.ibverbs-unloadable is
    ``goes_on``; NCCL's maintainer: "the first one is to be ignored unless you want to use
    Infiniband/RoCE", nccl-tests#14); the job dies of what a later line names. The fallback's
    lines are horovod#789's as posted, the fatal one is nccl#331's (a catalogue symptom); the
    fallback alone is still named (the twin)."""
    from tests.harness import symptoms

    fallback = ("e53b7da88fea:2493:2753 [0] misc/ibvwrap.cu:63 NCCL WARN Failed to open "
                "libibverbs.so[.1]\n"
                "e53b7da88fea:2493:2753 [0] NCCL INFO Using internal Network Socket\n"
                "e53b7da88fea:2493:2753 [0] NCCL INFO NET : Using interface lo:127.0.0.1<0>\n"
                "e53b7da88fea:2493:2753 [0] NCCL INFO NET : Using interface eth0:3.10.11.7<0>\n"
                "e53b7da88fea:2493:2753 [0] NCCL INFO NET/Socket : 2 interfaces found\n"
                "NCCL version 2.3.5+cuda9.0\n")
    fatal = symptoms.text(symptoms.rows("comm"), "NVIDIA/nccl/issues/331")
    _, line, sure, _ = explain_text(fallback + fatal)
    ids = [m.id for m in sure]
    assert ids[0] in ("comm.no-bootstrap-interface", "container.network-isolation"), ids
    assert "comm.ibverbs-unloadable" in ids[1:] and line.text in fatal
    _, line, sure, _ = explain_text(fallback)
    assert sure[0].id == "comm.ibverbs-unloadable" and "libibverbs" in line.text


# Open MPI's help block for a completion queue it could not create, as an HPC site's users
# pasted it (the troubleshooting pages of github.com/jonescompneurolab/hnn's installer: "Error:
# Cannot allocate memory. Check the CQE attribute", fixed there with `ulimit -l unlimited`);
# and the line a
# program prints when the queue was made, its healthy twin.
OMPI_CQ = """Starting simulation. . .
--------------------------------------------------------------------------
Failed to create a completion queue (CQ):

Hostname: node423
Requested CQE: 16384
Error:    Cannot allocate memory

Check the CQE attribute
--------------------------------------------------------------------------
"""


def test_open_mpi_completion_queue_failure_is_the_locked_memory_limit():
    reading, line, sure, _ = explain_text(OMPI_CQ)
    assert sure and sure[0].mode.id == "comm.memlock-low"
    assert "Failed to create a completion queue" in line.text
    _, _, sure, _ = explain_text("Completion queue (CQ) is created at 0x55d0 with 16384 "
                                 "elements")
    assert not sure


# pip's "[output]" of a failed extension build indents the whole subprocess output, traceback
# included, and the paste starts mid-traceback (https://github.com/facebookresearch/pytorch3d/
# issues/1786, as posted).
PIP_INDENTED = """        File "C:\\sd\\Real3DPortrait\\venv\\lib\\site-packages\\torch\\utils\\cpp_extension.py", line 499, in build_extensions
          _check_cuda_version(compiler_name, compiler_version)
        File "C:\\sd\\Real3DPortrait\\venv\\lib\\site-packages\\torch\\utils\\cpp_extension.py", line 387, in _check_cuda_version
          raise RuntimeError(CUDA_MISMATCH_MESSAGE.format(cuda_str_version, torch.version.cuda))
      RuntimeError:
      The detected CUDA version (12.0) mismatches the version that was used to compile
      PyTorch (11.7). Please make sure to use the same CUDA versions.

      [end of output]

  note: This error originates from a subprocess, and is likely not a problem with pip.
  ERROR: Failed building wheel for pytorch3d
  Running setup.py clean for pytorch3d
Failed to build pytorch3d
ERROR: Could not build wheels for pytorch3d, which is required to install pyproject.toml-based projects
"""


def test_an_indented_traceback_without_its_header_reads_its_exception():
    """The exception is at the indentation the frames imply (two columns less), not at 0:
    before, every indented line counted as inside the traceback and pip's 'Failed to build'
    was read instead."""
    reading, line, sure, _ = explain_text(PIP_INDENTED)
    assert line.text.strip() == "RuntimeError:"
    assert sure and sure[0].id == "jit.cuda-major-mismatch"


def test_a_log_pasted_as_a_quote_reads_as_the_log():
    """GitHub and e-mail replies quote pasted logs with '> ': the same root and cause."""
    plain = explain_text(OMPI_CQ)
    quoted = explain_text("".join(f"> {line}\n" if line else ">\n"
                                  for line in OMPI_CQ.splitlines()))
    assert quoted[1].text == plain[1].text and quoted[2][0].id == plain[2][0].id
    # srun's own line behind a quote is still srun's (its component needs the line start)
    _, line, sure, _ = explain_text(">   srun: error: Unable to create step for job 7: More\n"
                                    ">   processors requested than permitted.\n")
    assert line.text.startswith("srun: error:") and sure[0].id == "slurm.request-exceeds-node"


def test_a_caught_signal_is_read_with_its_backtrace():
    """UCX prints `Caught signal 7 (Bus error ...)` and then the frames; NCCL's frames in
    them make the bus error NCCL's shared memory (a page /dev/shm cannot back). Texts as
    posted at https://github.com/msr-fiddle/pipedream/issues/76 (a container's 64 MB
    /dev/shm); the same signal with no NCCL frame names no one cause (SIGBUS's group)."""
    log = next(r["text"] for r in symptoms.rows("system")
               if r["url"].endswith("msr-fiddle/pipedream/issues/76"))
    reading, line, sure, _ = explain_text("noise before\n" + log)
    assert line.text.endswith("Caught signal 7 (Bus error: nonexistent physical address)")
    assert "ncclGroupEnd()" in reading.message(line)
    assert sure and sure[0].id == "system.shm-too-small"
    no_nccl = "\n".join(x for x in log.splitlines() if "nccl" not in x.lower())
    listed = explain_text(no_nccl)[2]
    assert len(listed) > 1 and all(m.shared == "bus-error-unlocated" for m in listed)


def test_a_hint_near_the_root_names_the_cause_no_failure_line_names():
    # UCX prints its advice ("Please set max locked memory (ulimit -l) ...") on a line no
    # failure word marks, above "failed: Cannot allocate memory" and "Failed to create UCP
    # worker", which alone name no cause
    _, text = fixture("memlock_hint_above_ucx_mlperf_664.log")
    reading, line, sure, _ = explain_text(text)
    assert sure and sure[0].id == "comm.memlock-low"
    assert "Please set max locked memory" in line.text and line.kind == "other"
    # the same log without the hint: nothing near the root names a cause
    without = "\n".join(x for x in text.splitlines() if "max locked memory" not in x)
    assert explain_text(without)[2] == []
    # a hint far above the root is another part of the log, not this error's
    far = text.replace("[...]", "\n".join(f"step {i} ok" for i in range(12)), 1)
    assert explain_text(far)[2] == []


@pytest.mark.parametrize("text, named", [
    # aws-samples/aws-do-eks#69's error: every rank advertises loopback
    ("RuntimeError: Gloo connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/"
     "tcp/pair.cc:152]\n  timed out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]"
     ":29501\n  (rank=8, size=16, local=[127.0.0.1])", True),
    # the same failure towards a routable peer is a firewall, a dead peer, ...: not this cause
    ("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/"
     "pair.cc:152] timed out connecting: SO_ERROR: Connection refused, remote=[10.0.0.2]:40000",
     False),
    # sglang#3226's bare form names no address
    ("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/"
     "pair.cc:144] no error", False),
])
def test_a_gloo_mesh_towards_loopback_is_the_host_name(text, named):
    sure = explain_text(text)[2]
    assert (bool(sure) and sure[0].id == "comm.gloo-hostname-loopback") == named
    assert named or not sure


# Open MPI's refusal to bind more ranks than cpus is a help box without an "error" word
# (https://github.com/open-mpi/ompi/issues/626, as posted: a NUMA warning box above it); the
# launcher's line after it (composed here, mpirun's own wording) only says a rank is gone.
OMPI_BIND_626 = """WARNING: a request was made to bind a process. While the system
supports binding the process itself, at least one node does NOT
support binding memory to the process location.

  Node:  as-HP-Pro-2000-Microtower-PC

This usually is due to not having the required NUMA support installed
on the node. In some Linux distributions, the required support is
contained in the libnumactl and libnumactl-devel packages.
This is a warning only; your job will continue, though performance may be degraded.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
A request was made to bind to that would result in binding more
processes than cpus on a resource:

   Bind to:     NONE
   Node:        as-HP-Pro-2000-Microtower-PC
   #processes:  2
   #cpus:       1

You can override this protection by adding the "overload-allowed"
option to your binding directive.
"""


def test_open_mpis_refusal_to_bind_is_the_root_before_the_launchers_summary():
    text = OMPI_BIND_626 + ("--------------------------------------------------------------"
                            "------------\nmpirun noticed that process rank 0 with PID 0 on "
                            "node n1 exited on signal 9 (Killed).\n")
    _, line, sure, _ = explain_text(text)
    assert sure and sure[0].id == "mpi.bind-overload"
    assert line.text.startswith("A request was made to bind to that would result in binding")


def test_a_refusal_to_bind_in_another_wording_is_a_failure_not_a_clean_log():
    # PRRTE's wording under srun --label (https://github.com/open-mpi/ompi/issues/12463)
    text = ("19: A request was made to bind to that would result in binding more\n"
            "19: processes than cpus available in your allocation:\n19:\n"
            "19:    Application:     ./testGhosts\n19:    #processes:      1\n"
            "19:    Binding policy:  CORE\n")
    reading, _, _, _ = explain_text(text)
    assert not reading.single and reading.root.number == 1


# A mode's supporting evidence a few lines away counts (Azure/azhpc-images#327, as posted:
# the INFO line naming NCCL_GRAPH_FILE sits three lines above the WARN that fails).
AZURE_WARN = "::16674:17023 [0] graph/search.cc:703 NCCL WARN XML Import Channel : dev 1 not found."
AZURE_ABOVE = ("::16674:17023 [0] NCCL INFO NCCL_TOPO_FILE set by environment to "
               "/opt/microsoft/ncv4/topo.xml\n::16674:17023 [0] NCCL INFO NCCL_GRAPH_FILE set "
               "by environment to /opt/microsoft/ncv4/graph.xml")


def test_a_modes_supporting_evidence_in_the_lines_around_adds_to_its_score():
    def score(around):
        return next(m for m in rank.score_modes(AZURE_WARN, around)
                    if m.id == "comm.topology-file-for-another-machine")
    near, alone = score(AZURE_ABOVE), score("::16674:17023 [0] NCCL INFO Setting affinity")
    assert near.score == alone.score + rank.SPECIFIC / 2
    assert any("(supporting)" in w for w in near.why) and not any("(supporting)" in w
                                                                    for w in alone.why)
    # only for a mode the line itself names: the context alone names nothing
    assert not [m for m in rank.score_modes("NCCL WARN something else", AZURE_ABOVE)
                if m.id == "comm.topology-file-for-another-machine"]


def test_the_extensions_root_line_names_a_stale_lock_only_where_the_log_ends():
    """torch's "Using ... as PyTorch extensions root..." as the last thing a log printed is the
    wait on a stale lock (OpenRLHF#208); the same lines followed by the build's own failure
    (recorded here: torch 2.13's JIT build with a compiler that does not exist, a name no table
    knows) are not, and explain says it knows no cause rather than naming the lock."""
    hang = symptoms.text(symptoms.rows("build"), "OpenRLHF/OpenRLHF/issues/208")
    assert explain_text("Building extension module fused_adam...\n" + hang)[2][0].id \
        == "jit.stale-extension-lock"
    failed = (hang + "\n"
              "FAILED: [code=127] main.o\n"
              "/bin/sh: 1: /nonexistent/bin/frobc++: not found\n"
              "ninja: build stopped: subcommand failed.\n"
              "subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit "
              "status 127.\n"
              "RuntimeError: Error building extension 'dsenv_probe'\n")
    _, _, sure, _ = explain_text(failed)
    assert "jit.stale-extension-lock" not in [m.id for m in sure]


def test_hydras_mpiexec_lines_are_printed_by_mpi():
    """MPICH's and Intel MPI's Hydra launcher (mpiexec) speaks for MPI, as Open MPI's mpirun
    does (torchpack#36's "[mpiexec@host] main (ui/mpich/mpiexec.c:148): error parsing
    parameters"); a line no MPI launcher printed is not MPI's."""
    assert rank.component("[mpiexec@node1] main (ui/mpich/mpiexec.c:148): error parsing "
                          "parameters")[0] == "mpi"
    assert rank.component("mpiexec: Error: unknown option \"-env\"")[0] == "mpi"
    assert rank.component("RuntimeError: CUDA error: out of memory") is None


def test_the_frame_above_an_exception_survives_python_311_carets():
    """Python 3.11+ underlines the failing expression ("    ^^^^^^"); the message read for an
    exception still holds the frame it was raised in (which package made the call), the caret
    line skipped (cpython#108541, verbatim), as without carets (DeepSpeed#5677's 3.11 frame
    with them removed reads the same)."""
    text = symptoms.text(symptoms.rows("python"), "cpython/issues/108541")
    reading = logread.find_root(text)
    message = reading.message(reading.root)
    assert message.startswith('File "D:\\Python\\Docs\\euler\\Lib\\site-packages\\pkg_resources'
                              '\\__init__.py", line 2191'), message
    assert "^" not in message and message.endswith("Did you mean: 'zipimporter'?")
    with_carets = symptoms.text(symptoms.rows("build"), "DeepSpeed/issues/5677")
    without = "\n".join(x for x in with_carets.splitlines() if x.strip().strip("^~"))
    assert with_carets != without
    read = [logread.find_root(t) for t in (with_carets, without)]
    assert read[0].message(read[0].root) == read[1].message(read[1].root)
    assert "site-packages/deepspeed/ops/adam/cpu_adam.py" in read[0].message(read[0].root)


def test_rocrs_gpu_page_fault_is_a_failure_line():
    """ROCr's "Memory access fault by GPU node-N" (the process aborts after it) is read as the
    failure: no mode names its cause from the line alone, so it is "no known cause", never "no
    failure found"; a log line above it that merely mentions memory is not the root."""
    text = ("[2025-11-30 10:00:01] loading model\nMemory access fault by GPU node-1 (Agent handle: "
            "0x5570f8146df0) on address 0x7ff96a9ac000. Reason: Page not present or supervisor "
            "privilege.\n")
    reading, line, sure, _ = explain_text(text)
    assert reading.root is not None and reading.root.text.startswith("Memory access fault by GPU")
    assert not sure
    done = dsenv("explain", text)
    assert done.stdout.startswith("no known cause"), done.stdout
