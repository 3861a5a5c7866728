"""The Open MPI / PMIx / mpi4py / Slurm family parser (doctor/explain/families/mpi.py) on the
real texts of tests/fixtures/explain_symptoms/mpi.jsonl: each is read into its parts and the
mode its thread established; texts of other families and empty text give no reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsenv.doctor.explain.command import explain_text
from dsenv.doctor.explain.families import mpi, programs
from tests.harness import symptoms

SYMPTOMS = Path(__file__).parent / "fixtures" / "explain_symptoms"
ROWS = symptoms.rows("mpi")
# Symptoms the catalogue's patterns name but whose text has no structure to read (MPICH's bare
# "Attempting to use an MPI routine before initializing MPICH"; lines of slurmd's log file,
# which carry no program prefix: the family reads them when the daemon's name leads them).
UNSTRUCTURED = {"https://github.com/Crompulence/cpl-library/issues/6",
                # slurmctld's log and munge's own client (munged key mismatch)
                "https://github.com/clustervision/trinity/issues/477",
                "https://github.com/dun/munge/issues/116",
                # slurmd's own log lines ("[time] error: plugin_load_from_file"): no program prefix
                "https://github.com/NVIDIA/pyxis/issues/35",
                "https://github.com/NVIDIA/deepops/issues/1195",
                "https://github.com/NVIDIA/deepops/issues/1102",
                # munge's own client and a workflow tool's log of squeue's words: no Slurm program
                "https://github.com/dun/munge/issues/109",
                "https://github.com/DataBiosphere/toil/issues/4853",
                # slurmd's dlopen line of a SPANK plugin missing on the node: no program prefix
                "https://github.com/nebius/soperator/issues/2360"}
# Notices of healthy runs (benign modes): the catalogue's patterns name them, no parser reads them.
NOTICES = {"mpi.pmix-no-compression-benign", "mpi.ucx-unused-env-benign"}
# Slurm's client commands or the MPI launcher missing from PATH: the programs family reads them
# (programs.toml).
BY_PROGRAMS = {"slurm.client-commands-missing", "mpi.mpirun-not-on-path"}


def first_cause(text: str) -> str:
    _, _, sure, _ = explain_text(text)
    return sure[0].id if sure else ""


def row(url_tail: str) -> dict:
    return next(r for r in ROWS if r["url"].endswith(url_tail))


def parts(text: str) -> list[tuple[str, dict[str, str]]]:
    return [(r.mode, dict(r.parts)) for r in mpi.read(text)]


@pytest.mark.parametrize("symptom", [r for r in ROWS if r["url"] not in UNSTRUCTURED
                                     and r["mode"] not in NOTICES | BY_PROGRAMS],
                         ids=lambda r: f"{r['mode']}@{r['url'][19:]}")
def test_each_symptom_reads_as_its_mode(symptom):
    readings = mpi.read(symptom["text"])
    assert readings and readings[0].mode == symptom["mode"], [r.mode for r in readings]
    assert readings[0].family == "mpi" and readings[0].text


def test_slurm_reason_is_split_from_what_failed():
    (mode, got), *_ = parts(row("aws/aws-parallelcluster/issues/282")["text"])
    assert mode == "slurm.request-exceeds-node"
    assert got["program"] == "sbatch" and got["failed"] == "Batch job submission failed"
    assert got["reason"] == "Requested node configuration is not available"
    (mode, got), *_ = parts(row("deephyper/deephyper/issues/53")["text"])
    assert (mode, got["program"], got["failed"]) == ("slurm.gres-invalid", "srun",
                                                     "Unable to create step")
    assert got["reason"] == "Invalid generic resource (gres) specification"


def test_step_retry_reason_in_parentheses():
    mode, got = parts(row("llnl/smith/issues/688")["text"])[0]
    assert mode == "slurm.step-resources-unavailable"
    assert (got["failed"], got["reason"]) == ("step creation", "Requested nodes are busy")


def test_slurmstepd_cancellation_names_job_node_and_reason():
    mode, got = parts(row("Nextomics/NextDenovo/issues/114")["text"])[0]
    assert mode == "slurm.time-limit"
    assert (got["job"], got["node"], got["reason"]) == ("867816", "c0700a-s1", "TIME LIMIT")


def test_named_resources():
    assert parts(row("fgci-org/ansible-role-cuda/issues/3")["text"])[0][1]["resource"] \
        == "/dev//nvidia0"
    assert parts(row("nebius/soperator/issues/854")["text"])[0][1]["resource"] == "worker-1"
    assert parts(row("ArjunaCluster/ArjunaUsers/issues/52")["text"])[0][1]["resource"] \
        == "191.batch"
    node_fault = parts(row("ArjunaCluster/ArjunaUsers/issues/20")["text"])[0][1]
    assert node_fault["resource"].endswith("/slurm_script")
    plugin = parts(row("pyiron/executorlib/pull/761")["text"])[0][1]
    assert plugin["plugin"] == "pmix_v5" and plugin["program"] == "srun"


def test_open_mpi_boxes_read_across_wrapped_lines():
    mode, got = parts(row("hugary1995/raccoon/issues/230")["text"])[0]
    assert (mode, got["n"], got["app"]) == ("mpi.not-enough-slots", "16", "../../raccoon-opt")
    mode, got = parts(row("kubeflow/mpi-operator/issues/152")["text"])[0]
    assert mode == "mpi.orted-lost" and got["node"].endswith("-worker-19")
    assert parts(row("open-mpi/ompi/issues/7188")["text"])[0][1]["device"] == "mlx5_0"
    assert parts(row("nelson-lang/nelson/issues/1133")["text"])[0][1]["launcher"] == "prterun"


def test_mpi4py_symbol():
    mode, got = parts(row("uqfoundation/pyina/issues/63")["text"])[0]
    assert (mode, got["symbol"]) == ("mpi.mpi4py-other-mpi", "MPI_UNWEIGHTED")


def test_orted_missing_on_the_remote_host_is_a_path_problem():
    text = ("bash: orted: command not found\n-----\n"
            "ORTE was unable to reliably start one or more daemons.")
    assert [m for m, _ in parts(text)] == ["launch.remote-paths-missing"]


def test_what_it_does_not_read():
    assert mpi.read("") == [] and mpi.read("   \n") == []
    # another family's message (NCCL), a pmi2 plugin srun lacks (no mode), an execve of the
    # user's own program (not slurmd's spool), and vader with another errno
    assert mpi.read("misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<43547> "
                    "failed : Software caused connection abort") == []
    assert mpi.read("srun: error: Couldn't find the specified plugin name for mpi/pmi2") == []
    assert mpi.read("slurmstepd: error: execve(): mkdir: No such file or directory") == []
    assert mpi.read("[host:1] Read -1, expected 4067, errno = 14") == []
    others = [json.loads(line) for path in SYMPTOMS.glob("*.jsonl") if path.stem != "mpi"
              for line in path.read_text().splitlines() if line.strip()]
    # (Open MPI's own lines in another table's symptom may be read, as that row's mode.)
    assert not [r["url"] for r in others
                if any(x.mode != r["mode"] for x in mpi.read(r["text"]))]


def test_in_a_job_log_the_refusal_is_read_and_the_fallback_box_is_not():
    """Open MPI's refusal boxes carry no "error" word, and its btl:no-nics box says "unable to"
    about a fallback: in a log, the refusal is the failure read, the fallback only a warning."""
    from dsenv.doctor.explain.command import explain_text

    launcher = ("[2024-01-01 00:00:00,000] [INFO] [runner.py:555:main] cmd = mpirun -n 2 "
                "python train.py\n")
    exit_line = ("\n[2024-01-01 00:00:01,000] [ERROR] [launch.py:321:sigkill_handler] "
                 "['mpirun'] exits with return code = 1")
    for url, mode in (("QuantumPackage/qp2/issues/217", "mpi.run-as-root"),
                      ("mpitutorial/mpitutorial/issues/77", "mpi.not-enough-slots")):
        _, line, sure, _ = explain_text(launcher + row(url)["text"] + exit_line)
        assert sure and sure[0].id == mode and line is not None, url
    log = row("3dem/relion/issues/179")["text"] + "\n" + row("uqfoundation/pyina/issues/63")["text"]
    _, line, sure, _ = explain_text(log)
    assert sure[0].id == "mpi.mpi4py-other-mpi" and "undefined symbol" in line.text


def test_new_slurm_reasons_are_read_whatever_the_client():
    # sbatch's and srun's records, and the Slurm API's own "slurm_load_*" lines (squeue, sinfo)
    (mode, got), = parts("srun: error: Unable to confirm allocation for job 60564: Unable to "
                         "contact slurm controller (connect failure)")
    assert mode == "slurm.controller-unreachable" and got["program"] == "srun"
    (mode, got), = parts(row("ai4d-iasc/trixie/issues/93")["text"])
    assert (mode, got["program"]) == ("slurm.controller-unreachable", "slurm_load_partitions")
    assert [m for m, _ in parts(row("marbl/canu/issues/2350")["text"])] == [
        "slurm.mem-options-exclusive"]
    assert [m for m, _ in parts(row("ROCm/rocm-systems/issues/9834")["text"])] == [
        "slurm.invalid-qos"]


def test_binding_overload_box_parts():
    (mode, got), = parts(row("openai/baselines/issues/325")["text"])
    assert mode == "mpi.bind-overload"
    assert (got["bind to"], got["processes"], got["cpus"]) == ("CORE", "2", "1")


def test_ofi_provider_call_and_reason():
    (mode, got), = parts(row("firemodels/fds/issues/7868")["text"])
    assert (mode, got["call"], got["why"]) == ("mpi.ofi-provider-unavailable", "addrinfo",
                                               "No data available")
    (mode, got), = parts(row("intel/MLSL/issues/25")["text"])
    assert (mode, got["fabric"]) == ("mpi.ofi-provider-unavailable", "ofi")


def test_daemons_not_started_box_defers_to_the_failure_before_it():
    # alone (or after an ssh failure the launch family does not name) it is the daemon mode;
    # after a host-key refusal the ssh line is the cause (launch.ssh-host-key)
    assert [m for m, _ in parts(row("kubeflow/mpi-operator/issues/43")["text"])] == \
        ["mpi.orted-lost"]
    assert parts("Host key verification failed.\n"
                 "ORTE was unable to reliably start one or more daemons.") == []


def test_a_launcher_refusing_the_other_mpis_option_names_which_mpi_answered():
    # Hydra (MPICH, Intel MPI) given Open MPI's options, Open MPI 4 and 5 given Hydra's, MPT
    # given Open MPI's: whichever wording, the launcher, the option and whose option it is
    cases = {"zhijian-liu/torchpack/issues/36": ("Hydra (MPICH or Intel MPI)",
                                                 "allow-run-as-root", "Open MPI"),
             "Cosmoglobe/Commander/issues/144": ("Open MPI", "-env", "MPICH or Intel MPI"),
             "suny-downstate-medical-center/netpyne/issues/835": ("Open MPI", "--hosts",
                                                                  "MPICH or Intel MPI"),
             "GEOS-ESM/GEOSldas/issues/18": ("HPE/SGI MPT", "-map-by", "Open MPI"),
             "Julia-Tempering/Pigeons.jl/issues/141": ("Hydra (MPICH or Intel MPI)",
                                                       "merge-stderr-to-stdout", "Open MPI")}
    for tail, want in cases.items():
        (mode, got), = parts(row(tail)["text"])
        assert mode == "mpi.launcher-other-mpi", tail
        assert (got["launcher"], got["option"], got["option of"]) == want, tail
    assert [m for m, _ in parts("mpiexec_mpt error: -map-by option not supported.")] == [
        "mpi.launcher-other-mpi"]


def test_an_option_no_other_mpi_owns_is_not_the_other_mpis_launcher():
    # MPICH's singleton init handing Hydra its own pmi_args (an MPICH bug), Open MPI refusing
    # its own -np (a flaky run), Open MPI 5 taking the application's -e for its own
    assert parts("[mpiexec@trantor] match_arg (./utils/args/args.c:122): unrecognized "
                 "argument pmi_args") == []
    assert parts('/path/ompi-v3.1.x/bin/mpirun: Error: unknown option "-np"') == []
    assert parts("An unrecognized option was included on the mpirun command line:\n\n"
                 "  Option: -e\n\nPlease use the \"mpirun --help\" command") == []


def test_a_memory_request_no_node_holds_is_the_request_exceeding_the_node():
    # sbatch's first line alone (a workflow tool often shows only it) reads the same as the
    # "Requested node configuration is not available" after it
    (mode, got), = parts("sbatch: error: Memory specification can not be satisfied")
    assert (mode, got["program"]) == ("slurm.request-exceeds-node", "sbatch")
    assert got["reason"] == "Memory specification can not be satisfied"
    readings = parts(row("SckyzO/slurm_exporter/issues/168")["text"])
    assert {m for m, _ in readings} == {"slurm.request-exceeds-node"}


def test_the_executable_box_names_a_known_program_and_nothing_else():
    box = ("--------------------------------------------------------------------------\n"
           "mpirun was unable to find the specified executable file, and therefore\n"
           "did not launch the job.  This error was first reported for process\n"
           "rank 0; it may have occurred for other processes as well.\n\n"
           "Node:       {node}\nExecutable: {exe}\n"
           "--------------------------------------------------------------------------")
    (mode, got), = parts(box.format(node="gpu-07", exe="torchrun"))
    assert mode == "env.scripts-not-on-path"
    assert (got["program"], got["node"]) == ("torchrun", "gpu-07")
    (mode, got), = parts(box.format(node="gpu-07", exe="/opt/ompi/bin/orted"))
    assert mode == "launch.remote-paths-missing" and got["program"] == "/opt/ompi/bin/orted"
    # an application binary off PATH on one workstation (q-e#32, MPI.jl#237): no cause here
    assert parts(box.format(node="731-sc", exe="pw.x")) == []
    _, _, sure, _ = explain_text(box.format(node="dsigler-31368s", exe="julia"))
    assert sure == []


def test_psec_munge_component_box_is_the_other_pmix_build():
    # the box PMIx prints when the ranks' PMIx cannot open the munge credential plugin that
    # Slurm's PMIx server uses (open-mpi/ompi#12571: an enroot container; EESSI's module)
    for tail in ("open-mpi/ompi/issues/12571", "EESSI/compatibility-layer/issues/216"):
        text = row(tail)["text"]
        assert parts(text)[0] == ("mpi.pmix-psec-munge", {"program": "Open MPI"})
        _, _, sure, _ = explain_text(text)
        assert sure and sure[0].id == "mpi.pmix-psec-munge", [m.id for m in sure]
    # healthy twin: the same box for another framework's component is not this cause
    other = row("open-mpi/ompi/issues/12571")["text"].replace("psec", "gds").replace(
        "Component: munge", "Component: ds21")
    assert all(r.mode != "mpi.pmix-psec-munge" for r in mpi.read(other))
    _, _, sure, _ = explain_text(other)
    assert all(m.id != "mpi.pmix-psec-munge" for m in sure)
    # a munge daemon that is not running (the plugin loaded, the credential failed) is not it
    daemon = ("[n1:00085] psec: munge init\n[n1:00085] psec: munge failed to create credential: "
              "Socket communication error\nThe PMIx server's listener thread failed to start.")
    assert all(r.mode != "mpi.pmix-psec-munge" for r in mpi.read(daemon))


PMIX_BOX = """--------------------------------------------------------------------------
PMIx was unable to find a usable compression library
on the system. We will therefore be unable to compress
large data streams. This may result in longer-than-normal
startup times and larger memory footprints. We will
continue, but strongly recommend installing zlib or
a comparable compression library for better user experience.

You can suppress this warning by adding "pcompress_base_silence_warning=1"
to your PMIx MCA default parameter file, or by adding
"PMIX_MCA_pcompress_base_silence_warning=1" to your environment.
--------------------------------------------------------------------------"""
UCX_LINE = ("[1634725581.119872] [node1:1234:0]         parser.c:1907 UCX  WARN  unused env "
            "variable: UCX_MEMTYPE_CACHE (set UCX_WARN_UNUSED_ENV_VARS=n to suppress this warning)")


@pytest.mark.parametrize("mode", sorted(NOTICES))
def test_a_notice_alone_is_explained_as_the_notice(mode):
    from dsenv.doctor.explain.command import _benign
    for r in [r for r in ROWS if r["mode"] == mode]:
        _, _, sure, _ = explain_text(r["text"])
        assert sure and sure[0].id == mode and _benign(sure[0]), r["url"]
    # the whole box or line as pasted: shown as the notice, never as a log's cause
    _, _, sure, weak = explain_text(PMIX_BOX if "pmix" in mode else UCX_LINE + "\n" + UCX_LINE)
    assert sure == [] and mode in [m.id for m in weak]


@pytest.mark.parametrize("notice", [PMIX_BOX, UCX_LINE])
def test_a_notice_in_a_log_yields_to_the_real_error(notice):
    for tail, mode in (("QuantumPackage/qp2/issues/217", "mpi.run-as-root"),
                       ("mpitutorial/mpitutorial/issues/77", "mpi.not-enough-slots")):
        _, line, sure, _ = explain_text(notice + "\n" + row(tail)["text"])
        assert sure and sure[0].id == mode, [m.id for m in sure]
        # (the notice it went on after may follow the cause, never lead it)
        _, line, sure, _ = explain_text(row(tail)["text"] + "\n" + notice)
        assert sure and sure[0].id == mode, [m.id for m in sure]


def test_the_compression_notice_is_not_the_decompression_failure():
    # two nodes of which one cannot decompress PMIx's launch message is a failure, not this notice
    text = ("A compressed message was received by the Open MPI run time system\n(PMIx) that "
            "could not be decompressed.  This means that Open MPI has\ncompression support "
            "enabled on one node and not enabled on another.")
    _, _, sure, weak = explain_text(text)
    assert "mpi.pmix-no-compression-benign" not in [m.id for m in sure + weak]


def test_gres_affinity_read_when_the_daemon_leads_the_line():
    """deepops#1195's line as journald or syslog shows it, slurmd's name first: the reason and
    the affinity list it rejected are read; its log file's line (no name) is left to the
    catalogue's pattern, and a slurmd line about something else is not this cause."""
    line = ("slurmd[2211]: error: _node_config_validate: gres/gpu: invalid GRES core "
            "specification (48-63,176-191) on node node01")
    (mode, got), *_ = parts(line)
    assert (mode, got["program"], got["resource"]) == ("slurm.gres-conf-affinity", "slurmd",
                                                       "48-63,176-191")
    (mode, got), *_ = parts("slurmd: error: Invalid GRES data for gpu, CPUs=48-63,176-191")
    assert (mode, got["resource"]) == ("slurm.gres-conf-affinity", "CPUs=48-63,176-191")
    assert parts(row("NVIDIA/deepops/issues/1102")["text"]) == []
    assert parts("slurmd: error: Node configuration differs from hardware: CPUs=64:128(hw)") == []


def test_a_build_without_mpi_names_what_it_missed():
    got = parts(row("Yale-LILY/SummerTime/issues/72")["text"])
    assert ("mpi.build-without-mpi", {"program": "a build against MPI (mpi4py's setup)",
                                      "missing": "mpi.h"}) in got
    assert first_cause(row("Yale-LILY/SummerTime/issues/72")["text"]) == "mpi.build-without-mpi"


def test_an_mpicc_that_wraps_nvc_is_not_a_missing_mpi():
    # the same configure failure printed by an mpicc wrapping NVIDIA's nvc, whose GCC-flag
    # errors come first (saforem2/ezpz#9; the mpi4py maintainer's diagnosis of that build:
    # mpi4py/mpi4py#572): an MPI is there, its compiler refuses the interpreter's flags
    text = ("nvc-Error-Unknown switch: -fno-strict-overflow\nfailure.\nremoving: _configtest.c "
            "_configtest.o\nerror: Cannot compile MPI programs. Check your configuration!!!\n"
            "[end of output]\n\nnote: This error originates from a subprocess, and is likely not "
            "a problem with pip.\nERROR: Failed building wheel for mpi4py")
    assert "mpi.build-without-mpi" not in [m for m, _ in parts(text)]
    assert first_cause(text) != "mpi.build-without-mpi"


def test_mpichs_own_host_name_and_cuda_ipc_refusals_read_their_parts():
    """MPICH's TCP netmod that cannot resolve this machine's name names it (MPAS-Dev/compass#263);
    CUDA-aware Open MPI's CUDA IPC refusal names the call and CUDA's return value
    (JuliaGPU/CUDA.jl#1053); another host's name failing in Hydra's proxy launch is not this
    machine's own."""
    got = {r.mode: dict(r.parts) for r in mpi.read(
        next(r["text"] for r in ROWS if r["url"].endswith("MPAS-Dev/compass/issues/263")))}
    assert got["mpi.own-hostname-unresolvable"]["host"] == "pn2034311.lanl.gov"
    got = {r.mode: dict(r.parts) for r in mpi.read(
        next(r["text"] for r in ROWS if r["url"].endswith("JuliaGPU/CUDA.jl/issues/1053")))}
    assert (got["mpi.smcuda-cuda-ipc-unusable"]["call"],
            got["mpi.smcuda-cuda-ipc-unusable"]["code"]) == ("cuIpcGetMemHandle", "1")
    assert "mpi.own-hostname-unresolvable" not in [r.mode for r in mpi.read(
        "[proxy:0:1@node2] HYDU_sock_connect: unable to get host address for node1 (1)")]


@pytest.mark.parametrize("symptom", [r for r in ROWS if r["mode"] in BY_PROGRAMS],
                         ids=lambda r: f"{r['mode']}@{r['url'][19:]}")
def test_slurm_clients_missing_are_named(symptom):
    assert first_cause(symptom["text"]) == symptom["mode"]


def test_slurm_clients_missing_in_the_shells_words_are_read_by_the_programs_family():
    # subprocess's "[Errno 2] ... 'scontrol'" and bash's "sinfo: command not found": the
    # program table names the mode (a quoted or bare "No such file ..." is the catalogue's)
    for tail in ("submitit/issues/1601", "trinity/issues/390"):
        readings = programs.read(row(tail)["text"])
        assert readings and readings[0].mode == "slurm.client-commands-missing", tail


def test_a_spank_plugin_missing_from_the_host_is_not_a_plugin_built_for_another_slurm():
    # dlopen names the plugin's own path as the file it cannot open (soperator#2058), then
    # Slurm's generic "Dlopen of plugin file failed": the first reading is the missing file
    text = row("soperator/pull/2058")["text"] + "\nsrun: error: spank: spanknccldebug.so: " \
        "Dlopen of plugin file failed"
    got = [r.mode for r in mpi.read(text)]
    assert got[0] == "slurm.spank-plugin-file-missing", got
    assert first_cause(text) == "slurm.spank-plugin-file-missing"
    # the same words with an undefined spank symbol: built for another Slurm
    other = ("srun: error: plugin_load_from_file: dlopen(/usr/lib64/slurm/spank_pyxis.so): "
             "/usr/lib64/slurm/spank_pyxis.so: undefined symbol: slurm_spank_log\n"
             "srun: error: spank: /usr/lib64/slurm/spank_pyxis.so: Dlopen of plugin file failed")
    assert first_cause(other) == "slurm.spank-plugin-built-for-other-slurm"

