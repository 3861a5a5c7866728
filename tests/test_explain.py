"""`dsenv explain` and the failure catalogue (doctor/modes/) it reads."""

from __future__ import annotations

import json
import re

import pytest

from dsenv.doctor import catalogue
from dsenv.doctor.registry import all_checks
from tests.harness.cli import dsenv

MODES = catalogue.modes()


def test_the_catalogue_is_large_unique_and_sourced():
    assert len(MODES) >= 40
    ids = [m.id for m in MODES]
    assert len(ids) == len(set(ids))
    for mode in MODES:
        assert mode.sources and all(re.match(r"https://\S+$", s) for s in mode.sources), mode.id
        assert mode.match and mode.fix and mode.cause, mode.id
        for pattern in mode.match:
            re.compile(pattern, re.IGNORECASE)
        text = " ".join((mode.title, mode.symptom, mode.cause, mode.fix, *mode.sources))
        assert not re.search(r"seeds? ?\d{3}|FACTS\.md", text, re.I), mode.id


def test_every_check_the_catalogue_names_exists_and_undetectable_modes_say_why():
    registered = {c.id for c in all_checks()}
    for mode in MODES:
        if mode.check:
            assert mode.check in registered, f"{mode.id}: no check {mode.check}"
        else:
            assert mode.detect.startswith("cannot"), mode.id


@pytest.mark.parametrize("mode", MODES, ids=[m.id for m in MODES])
def test_each_entry_is_found_by_its_own_error_text_or_id(mode):
    assert mode in [m for m, _ in catalogue.explain(mode.id)]
    if any(re.search(p, mode.symptom, re.I | re.M) for p in mode.match):
        assert mode in [m for m, _ in catalogue.explain(mode.symptom)]


@pytest.mark.parametrize("text, expected", [
    ("RuntimeError: Ninja is required to load C++ extensions", "jit.ninja-missing"),
    ("--------------------------------------------------------------------------\n"
     "OMPI was not built with SLURM's PMI support and therefore cannot execute",
     "mpi.ompi-no-slurm-pmi"),
])
def test_explain_names_the_entry_its_check_and_sources(text, expected):
    done = dsenv("explain", text)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(expected + ":")
    mode = next(m for m in MODES if m.id == expected)
    assert mode.sources[0] in done.stdout and mode.check in done.stdout
    as_json = json.loads(dsenv("explain", text, "--json").stdout)
    assert as_json["matches"][0]["id"] == expected and as_json["matches"][0]["matched"]


def test_an_unrelated_message_matches_nothing_and_exits_1():
    for text in ("hello world", "Epoch 1/3: loss 0.42", "Saving model checkpoint to out/"):
        done = dsenv("explain", text)
        assert done.returncode == 1 and "no catalogue entry matches" in done.stdout


WATCHDOG = ("[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran "
            "for 1800572 milliseconds before timing out.")


def test_a_collective_that_timed_out_is_a_symptom_never_the_cause():
    """NCCL's watchdog says which collective stalled, not why a rank was elsewhere (settled in
    the trackers mostly as the code: ranks on different paths, rank 0 tokenizing past the
    timeout): alone, no known cause, with the symptom and how to find the cause; with a line
    that names a cause in the same log, that cause."""
    done = dsenv("explain", WATCHDOG)
    assert done.returncode == 1 and done.stdout.startswith("no known cause")
    assert "symptom     comm.collective-timeout" in done.stdout
    assert "dsenv doctor --distributed" in done.stdout
    log = ("[rank1]: RuntimeError: Ninja is required to load C++ extensions\n" + WATCHDOG)
    named = dsenv("explain", log)
    assert named.returncode == 0 and named.stdout.startswith("jit.ninja-missing:")
    matches = json.loads(dsenv("explain", log, "--json").stdout)["matches"]
    assert [m["id"] for m in matches] == ["jit.ninja-missing"]


def test_explain_reads_stdin_and_refuses_nothing_in_one_line():
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "dsenv", "explain", "-"], text=True,
                          input="MissingCUDAException: CUDA_HOME does not exist, unable to "
                                "compile CUDA op(s)\n", capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("jit.cuda-home-missing:")
    empty = dsenv("explain", "")
    assert empty.returncode == 2 and empty.stderr.startswith("dsenv explain: give the error")


def test_a_log_that_cannot_be_read_is_one_line_and_exit_2(tmp_path):
    # a folder, a mistyped file name, a file that fails to read (/proc/self/mem: EIO even for
    # root): one line saying what to give instead, never a traceback or "no known cause"
    for arg, says in ((str(tmp_path), "is a folder"),
                      (str(tmp_path / "slurm-4242.out"), "no file "),
                      ("slurm-4242.out", "no file slurm-4242.out"),
                      ("/proc/self/mem", "cannot read /proc/self/mem: ")):
        done = dsenv("explain", arg)
        assert done.returncode == 2 and done.stdout == "", (arg, done.stdout)
        assert done.stderr.startswith("dsenv explain: ") and says in done.stderr, done.stderr
        assert arg in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    # the healthy twin: the same file once it exists is read as the log
    log = tmp_path / "slurm-4242.out"
    log.write_text("ImportError: libcudart.so.12: cannot open shared object file: No such file "
                   "or directory\n")
    assert dsenv("explain", str(log)).returncode == 0
    # one word without a slash or a log's extension is still a message (a check id, a soname)
    assert dsenv("explain", "comm.socket-ifname").returncode == 0


def test_a_log_saved_as_utf16_or_with_a_bom_reads_as_the_same_log(tmp_path):
    # PowerShell's `>` writes UTF-16 with a byte-order mark; read as UTF-8 every other byte
    # was a NUL and no line read as an error
    text = "MissingCUDAException: CUDA_HOME does not exist, unable to compile CUDA op(s)\r\n"
    for encoding in ("utf-16", "utf-16-be", "utf-8-sig", "utf-8"):
        log = tmp_path / f"job-{encoding}.log"
        data = text.encode(encoding)
        log.write_bytes(b"\xfe\xff" + data if encoding == "utf-16-be" else data)
        done = dsenv("explain", str(log))
        assert done.returncode == 0 and done.stdout.startswith("jit.cuda-home-missing:"), (
            encoding, done.stdout)
        with log.open("rb") as stdin:
            piped = dsenv("explain", "-", stdin=stdin)
        assert piped.stdout.startswith("jit.cuda-home-missing:"), (encoding, piped.stdout)
    # bytes no encoding reads are replaced, the rest is still read
    log = tmp_path / "latin1.log"
    log.write_bytes(b"caf\xe9 " + text.encode())
    assert dsenv("explain", str(log)).stdout.startswith("jit.cuda-home-missing:")


def test_a_reader_that_stops_early_gets_no_traceback():
    """`dsenv explain LOG | head -2`: the pipe closes under explain's printing; it stops as
    Unix tools do on SIGPIPE (exit 141), with nothing on stderr. Without the handling the
    write raised BrokenPipeError and printed a traceback. The reader closes before explain
    writes anything, so every run meets the closed pipe."""
    import subprocess
    import sys
    text = "OSError: libmpi_cxx.so.40: cannot open shared object file: No such file or directory"
    child = subprocess.Popen([sys.executable, "-m", "dsenv", "explain", "-"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    child.stdout.close()  # the reader is gone before the answer is written
    _, err = child.communicate(text + "\n", timeout=60)
    assert child.returncode == 141, err
    assert "Traceback" not in err and not err.strip(), err


@pytest.mark.parametrize("text, not_this, this", [
    # apex's check where torch has no CUDA at all ("Cuda None": a CPU-only or ROCm torch)
    ("RuntimeError: Cuda extensions are being compiled with a version of Cuda that does not "
     "match the version used to compile Pytorch binaries.  Pytorch binaries were compiled with "
     "Cuda None.", "jit.cuda-major-mismatch", ""),
    ("RuntimeError: Cuda extensions are being compiled with a version of Cuda that does not "
     "match the version used to compile Pytorch binaries.  Pytorch binaries were compiled with "
     "Cuda 12.1.", "", "jit.cuda-major-mismatch"),
    # an op's .so in the extensions folder that an older libstdc++ cannot load: the libstdc++
    ("ImportError: /env/lib/libstdc++.so.6: version GLIBCXX_3.4.29 not found (required by "
     "/home/u/.cache/torch_extensions/py310_cu121/fused_adam/fused_adam.so)",
     "jit.extensions-dir-shared", "loader.libstdcxx-too-old"),
    ("ImportError: /home/u/.cache/torch_extensions/py310_cu121/fused_adam/fused_adam.so: "
     "undefined symbol: _ZN3c104cuda20CUDACachingAllocator9allocatorE", "",
     "jit.extensions-dir-shared"),
])
def test_the_words_around_a_build_check_decide_which_cause_it_is(text, not_this, this):
    from dsenv.doctor.explain.command import explain_text

    _, _, sure, _ = explain_text(text)
    ids = [m.id for m in sure]
    assert not_this not in ids and (not this or ids[0] == this), ids
