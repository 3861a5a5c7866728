"""The node's limits read from real texts (tests/fixtures/explain_symptoms/system.jsonl): the
catalogue's patterns for a full disk under torch's zip writer, a thread pool refused by the
process/pids/address-space limits, and shared CPU tensors running out of mappings; each with
a text of the same words from another cause that must not be read as it."""

from __future__ import annotations

import pytest

from dsenv.doctor.explain.command import explain_text
from tests.harness import symptoms

ROWS = symptoms.rows("system")


def _sure(text: str) -> list[str]:
    _, _, sure, _ = explain_text(text)
    return [m.id for m in sure]


def _named(text: str) -> list[str]:
    """The causes named, none when the answer lists a group's causes the words share (a bare
    ENOSPC: doctor/explain/alternatives.toml, no-space-unlocated)."""
    _, _, sure, _ = explain_text(text)
    return [] if sure and sure[0].shared else [m.id for m in sure]


@pytest.mark.parametrize("mode", ["system.thread-limit", "system.shm-map-count"])
def test_each_new_mode_names_its_symptoms(mode):
    rows = [r for r in ROWS if r["mode"] == mode]
    assert len({r["url"] for r in rows}) >= 2
    for r in rows:
        assert _sure(r["text"])[:1] == [mode], r["url"]


def test_torchs_zip_writer_losing_its_position_is_a_full_disk():
    for tail in ("YuanGongND/ast/issues/30", "pytorch/pytorch/issues/156955"):
        assert _sure(symptoms.text(ROWS, tail))[:1] == ["system.disk-full"]
    # torch.load of a file cut short says another thing: a download that stopped first, a
    # checkpoint whose save died on a full disk after it (sml2h3/dddd_trainer#36)
    corrupt = ("RuntimeError: PytorchStreamReader failed reading zip archive: failed finding "
               "central directory")
    assert _sure(corrupt) == ["cache.hf-truncated-download", "system.disk-full"]


def test_a_thread_pool_refused_names_the_limit_not_a_transient_error():
    openmp = "libgomp: Thread creation failed: Resource temporarily unavailable"
    assert _sure(openmp)[:1] == ["system.thread-limit"]
    localized = ("OpenBLAS blas_thread_init: pthread_create failed for thread 76 of 80: "
                 "资源暂时不可用\nOpenBLAS blas_thread_init: RLIMIT_NPROC 4096 current, 6191435 max")
    assert _sure(localized)[:1] == ["system.thread-limit"]
    # EAGAIN from a non-blocking file lock or socket is no thread limit
    for other in ("BlockingIOError: [Errno 11] Resource temporarily unavailable",
                  "OSError: [Errno 11] Resource temporarily unavailable: '/data/x.h5'"):
        assert "system.thread-limit" not in _sure(other)


def test_only_torchs_shared_memory_files_are_the_map_count():
    # a checkpoint mmapped whole (safetensors) larger than memory is another cause
    checkpoint = ("RuntimeError: unable to mmap 23802932552 bytes from file "
                  "<./flux1-dev.safetensors>: Cannot allocate memory (12)")
    assert "system.shm-map-count" not in _sure(checkpoint)
    full_shm = ("RuntimeError: unable to write to file </torch_18693_1954506235_0>: No space "
                "left on device (28)")
    assert "system.shm-map-count" not in _sure(full_shm)
    assert _sure(full_shm)[:1] == ["system.shm-too-small"]


def test_ray_object_store_larger_than_dev_shm():
    """Ray (started by vLLM, SGLang, GPUStack) refusing an object store larger than the
    container's /dev/shm is system.shm-too-small (gpustack#5014, #4339); a start that fits is not."""
    rows = [r for r in ROWS if "gpustack/gpustack/issues/" in r["url"]]
    assert len({r["url"] for r in rows}) == 2
    for r in rows:
        assert _sure(r["text"])[:1] == ["system.shm-too-small"], r["url"]
    for text in ("INFO worker.py:1673 -- Started a local Ray instance.",
                 "The configured object store size (2.00 GB) fits in /dev/shm size (64.00 GB)"):
        assert "system.shm-too-small" not in _sure(text), text


def test_thread_creation_refused_outside_blas_is_the_thread_limit():
    # Ray's gRPC and boost threads, Python's threading and bash's fork retry word the same EAGAIN
    # (vllm#6295, ray#36936, django_bgRemoverML#25, VTool-R1#9: a thread limit raised or capped)
    urls = ("vllm-project/vllm/issues/6295", "ray-project/ray/issues/36936",
            "FarjaalAhmad/django_bgRemoverML/issues/25", "VTool-R1/VTool-R1/issues/9")
    rows = [r for r in ROWS if r["url"].endswith(urls)]
    assert len(rows) == 4
    for r in rows:
        assert _sure(r["text"])[:1] == ["system.thread-limit"], r["url"]
    # healthy twins: EAGAIN on a socket or a lock, and a Ray start, are no thread limit
    for text in ("BlockingIOError: [Errno 11] Resource temporarily unavailable",
                 "OSError: [Errno 11] Resource temporarily unavailable: '/tmp/lockfile'",
                 "recv failed: Resource temporarily unavailable",
                 "INFO worker.py:1771 -- Started a local Ray instance.",
                 "INFO: started new thread for the data loader"):
        assert "system.thread-limit" not in _sure(text), text


def test_enospc_inside_a_savers_frames_is_the_output_volume():
    """ENOSPC in any wording raised in torch.save's or safetensors' own frames: the checkpoint's
    volume is full (YuanGongND/ast#30, bghira/SimpleTuner#2353)."""
    from dsenv.doctor.explain.families import system
    for tail in ("YuanGongND/ast/issues/30", "bghira/SimpleTuner/issues/2353"):
        text = symptoms.text(ROWS, tail)
        assert _sure(text)[:1] == ["system.disk-full"], tail
        got = [dict(r.parts) for r in system.read(text) if r.mode == "system.disk-full"]
        assert got and got[0]["writer"] in ("torch.save", "safetensors"), tail
    # safetensors >= 0.5's own wording alone
    assert _sure("safetensors_rust.SafetensorError: Error while serializing: I/O error: No space "
                 "left on device (os error 28)")[:1] == ["system.disk-full"]
    # healthy twins: torch.save failing for another reason, and ENOSPC with no saver in sight
    other = ('  File "/x/lib/python3.9/site-packages/torch/serialization.py", line 475, in _save\n'
             "    zip_file.write_record(name, storage.data_ptr(), num_bytes)\n"
             "TypeError: write_record(): incompatible function arguments.")
    assert "system.disk-full" not in _sure(other)
    assert not system.read("OSError: [Errno 28] No space left on device")
    assert "system.disk-full" not in _sure("safetensors_rust.SafetensorError: Error while "
                                           "serializing: I/O error: Operation not supported "
                                           "(os error 95)")


def test_pip_out_of_room_is_the_temporary_folder():
    """pip's 'Could not install packages due to an OSError: [Errno 28]' is its TMPDIR (a small
    tmpfs /tmp) filling with a wheel (pterodactyl/panel#3541, easydiffusion#1649,
    AUTOMATIC1111/stable-diffusion-webui#16334)."""
    from dsenv.doctor.explain.families import system
    rows = [r for r in ROWS if r["mode"] == "system.tmp-full"]
    assert len({r["url"] for r in rows}) >= 2
    for r in rows:
        assert _sure(r["text"])[:1] == ["system.tmp-full"], r["url"]
    got = dict(system.read(rows[0]["text"])[0].parts)
    assert (got["writer"], got["folder"]) == ("pip", "TMPDIR (default /tmp)")
    # healthy twins: pip failing on another errno, a bare ENOSPC, and a successful install
    for text in ("ERROR: Could not install packages due to an OSError: [Errno 13] Permission "
                 "denied: '/usr/lib/python3/dist-packages/x'",
                 "OSError: [Errno 28] No space left on device",
                 "Successfully installed torch-2.3.0"):
        assert "system.tmp-full" not in _named(text), text


def test_enospc_naming_a_file_in_the_temporary_folder_is_tmp_full():
    """An ENOSPC that names the file it wrote in /tmp (Python's OSError repr after tempfile's
    mkdtemp, GNU sort's spill file) is the temporary folder filling up: TMPDIR pointed elsewhere
    fixed it (YeoLab/sailor#2 with #3, fiberseq/FIRE#59)."""
    from dsenv.doctor.explain.families import system
    for tail in ("YeoLab/sailor/issues/2", "fiberseq/FIRE/issues/59"):
        text = symptoms.text(ROWS, tail)
        assert _sure(text)[:1] == ["system.tmp-full"], tail
        got = [dict(r.parts) for r in system.read(text) if r.mode == "system.tmp-full"]
        assert got and got[0]["path"].startswith("/tmp/"), tail
    # a copy's destination is the file written
    copy = ("OSError: [Errno 28] No space left on device: '/data/in/a.bin' -> "
            "'/var/tmp/job/a.bin'")
    assert dict(system.read(copy)[0].parts)["path"] == "/var/tmp/job/a.bin"
    # healthy twins: the same words naming a file elsewhere (the output volume, a cache's own
    # tmpXXXXXXXX), another errno in /tmp, and Apptainer's temp folders (the container family's)
    for text in ("OSError: [Errno 28] No space left on device: '/data/out/tmpCvhVDX'",
                 "OSError: [Errno 28] No space left on device: "
                 "'/root/.cache/huggingface/hub/tmpibqwuu_p'",
                 "sort: write failed: /scratch/u/sortSVYd6x: No space left on device",
                 "OSError: [Errno 13] Permission denied: '/tmp/tmpCvhVDX'",
                 "OSError: [Errno 28] No space left on device"):
        assert "system.tmp-full" not in _named(text), text
        assert not system.read(text), text
    apptainer = ("FATAL:   While making image from oci registry: error fetching image to cache: "
                 "while building SIF from layers: packer failed to pack: while unpacking tmpfs: "
                 "error unpacking rootfs: unpack entry: usr/lib/x: unpack to regular file: short "
                 "write: write /tmp/build-temp-123/rootfs/usr/lib/x: no space left on device")
    assert not system.read(apptainer)
    assert _sure(apptainer)[:1] == ["container.apptainer-tmpdir-full"]


def test_the_shells_killed_line_is_memory_run_out_and_a_slurm_script_says_whose_limit():
    # the shell's own report of a SIGKILL, alone or after a progress bar (Video-LLaVA#13,
    # ChatGLM-6B#193): the machine's RAM or, in a Slurm job, the job's --mem
    for tail in ("PKU-YuanGroup/Video-LLaVA/issues/13", "zai-org/ChatGLM-6B/issues/193"):
        _, _, sure, _ = explain_text(symptoms.text(ROWS, tail))
        assert [m.id for m in sure][:2] == ["system.host-oom-killed", "slurm.oom-kill"]
        assert sure[0].shared
    # bash's report from a batch script names the job's limit alone (ArjunaUsers#52)
    script = ("/var/spool/slurmd/job00191/slurm_script: line 28:  8156 Killed"
              "                  python3 main.py --prop hform")
    assert _named(script)[:1] == ["slurm.oom-kill"]
    # srun's cascade for a task, or the word inside a sentence, is not the shell's report
    for other in ("srun: error: gpu017: task 0: Killed", "Killed 3 stale processes on gpu017",
                  "Loading checkpoint shards: 100%|████| 2/2 [00:03<00:00,  1.50s/it]"):
        assert not {"system.host-oom-killed", "slurm.oom-kill"} & set(_sure(other)), other
    # a real error before it stays the root the log is explained by
    log = ("ImportError: libcudart.so.12: cannot open shared object file: No such file or "
           "directory\nKilled")
    assert "system.host-oom-killed" not in _sure(log)[:1]


def test_a_library_mapping_refused_for_memory_is_the_address_space_limit_not_noexec():
    """glibc appends why the mapping failed: ENOMEM (an RLIMIT_AS / h_vmem limit, libc itself
    unmappable) is the address-space limit; the same words for a generated .so in /tmp without
    the errno stay the noexec mount."""
    for r in (r for r in ROWS if r["mode"] == "system.address-space-limit"):
        assert _sure(r["text"])[:1] == ["system.address-space-limit"], r["url"]
    noexec = "ImportError: /tmp/torchinductor_u/ab/cuda_utils.so: failed to map segment from shared object"
    assert _sure(noexec)[:1] == ["system.tmp-noexec"]
