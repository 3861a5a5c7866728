"""Open MPI, PRRTE, PMIx, mpi4py and Slurm's own messages, read by their structure.

Slurm prints ``<program>: error: <what failed>: <reason>`` (``sbatch: error: Batch job submission
failed: Requested node configuration is not available``, ``srun: error: Unable to create step for
job 42: Memory required by task is not available``) and ``slurmstepd`` its ``*** JOB 42 ON node
CANCELLED AT <time> DUE TO <REASON> ***`` lines: the reason says who is at fault, whatever the
job id, node or wording around it. Open MPI and PRRTE print boxed help texts (``-----`` blocks)
wrapped at any column: they are read with the whitespace collapsed. mpi4py fails at import with
the symbol its extension wanted from the MPI library it was built against.
"""

from __future__ import annotations

import re
from functools import cache

from dsenv.data import load_table
from dsenv.doctor.explain.families import Reading, reading

FAMILY = "mpi"

# A Slurm client or daemon record (slurmd[pid] too): the program, the level, the text up to the
# next record (a log line may hold several once its continuation lines are joined).
_PROGRAMS = "srun|sbatch|salloc|slurmstepd|slurmd|sinfo|squeue"
_SLURM = re.compile(rf"\b(?P<program>{_PROGRAMS})(?:\.bin|-[\w.-]+)?(?:\[\d+\])?: +"
                    r"(?:(?P=program): +)?(?:(?P<level>error|fatal): +)?(?P<text>.+?)"
                    rf"(?=\s+\S*\b(?:{_PROGRAMS})(?:\.bin|-[\w.-]+)?(?:\[\d+\])?: |\n|$)", re.I)
# What Slurm says failed, before the reason: ``<what>: <reason>``.
_WHAT = re.compile(r"(?P<what>Batch job submission failed|Unable to allocate resources"
                   r"|Job submit/allocate failed"
                   r"|Unable to create step for job \S+?(?=:)"
                   r"|Job \d+ step creation (?:temporarily|still) disabled, retrying)"
                   r"(?:: *(?P<reason>.+)| *\((?P<why>[^)]+)\))", re.I)
# ``scontrol show node/job``: ``Reason=<why the node is drained>``.
_SCONTROL = re.compile(r"\bReason=(?P<text>.+)")
# The Slurm API's own errors as squeue/sinfo/scontrol print them: ``slurm_load_jobs error: ...``.
_API = re.compile(r"\b(?P<program>slurm_\w+)(?: error)?: (?P<text>.+)")
# slurmstepd's end of a job or step: who, where, when, why.
_CANCELLED = re.compile(r"\*\*\* (?P<kind>JOB|STEP) (?P<job>\S+) ON (?P<node>\S+) CANCELLED AT "
                        r"(?P<at>\S+)(?: DUE TO (?P<reason>[A-Z_ ]+?))? \*\*\*")

# Slurm's reasons and the mode each names. Matched in the reason when one was split off, else
# in the line's text. Order matters only where two could match; the first wins.
_REASONS = (
    # Slurm counts the memory slurm.conf declares (RealMemory, default 1 MB): "0 GB memory
    # under Slurm control" is a cluster that never declared it, whatever the job asked for.
    (r"\b0 GB memory under Slurm control", "slurm.node-memory-not-configured"),
    # No node of the partition can hold what one node was asked for (or -w contradicts -N/-n):
    # a request the cluster can never satisfy, refused at once.
    (r"Requested node configuration is not available|CPU count per node can not be satisfied"
     r"|Memory specification can ?not be satisfied"
     r"|Node count specification invalid|More\s+processors\s+requested\s+than\s+permitted",
     "slurm.request-exceeds-node"),
    # --gpus/--gpus-per-* need select/cons_tres; the cluster's SelectType refuses the syntax.
    (r"Requested GRES option unsupported by configured SelectType", "slurm.gres-syntax-unsupported"),
    # The GRES name/type/format is not one the partition's nodes define.
    (r"Invalid generic resource \(gres\) specification|Gres format wrong", "slurm.gres-invalid"),
    # slurmd refuses the step's credential as older than its lifetime: the controller's clock
    # and the node's disagree (Slurm's FAQ, "clock"); "Invalid job credential" is other causes
    (r"Job credential expired", "slurm.clock-skew-credential"),
    # Inside an allocation: earlier steps hold what this step asks for (it waits, or is refused).
    (r"Requested nodes are busy|Memory required by task is not available"
     r"|step creation (?:temporarily|still) disabled", "slurm.step-resources-unavailable"),
    # The controller's association check: this user may not charge that account/partition.
    (r"Invalid account or account/partition combination", "slurm.invalid-account"),
    (r"invalid partition (?:name )?specified", "slurm.invalid-partition"),
    (r"Invalid qos specification", "slurm.invalid-qos"),
    # a step's CPU binding outside what the step holds: an srun nested in another step's
    # inherited SLURM_CPU_BIND mask, or per-task binding on a partial CPU set
    (r"CPU binding outside of job step allocation|Unable to satisfy cpu bind request",
     "slurm.srun-cpu-bind-outside-step"),
    # a SPANK plugin plugstack.conf names is not on this host: dlopen cannot open the plugin's
    # own path (another library named there is the plugin's dependency, the loader's reading)
    (r"dlopen\((?P<p>[^()\s]*?\.so)\): (?P=p): cannot open shared object file",
     "slurm.spank-plugin-file-missing"),
    # a SPANK plugin (pyxis, x11) compiled against another Slurm's spank.h/libslurm
    (r"undefined symbol: slurm_spank_\w+|Incompatible Slurm plugin \S+ version"
     r"|spank: \S+\.so: Dlopen of plugin file failed", "slurm.spank-plugin-built-for-other-slurm"),
    # the site's Prolog/PrologSlurmctld failed: the job never ran, the node is drained
    (r"(?:Job|job) prolog failed\b|Prolog failure on node|PrologSlurmctld failed|prolog failed "
     r"status=\d+:\d+|Prolog hung on node", "slurm.prolog-failed-node-drained"),
    # slurmctld could not save the job's script into its StateSaveLocation (its disk)
    (r"I/O error writing script/environment to file", "slurm.controller-state-save-write-failed"),
    # the site's job_submit filter: its own message, then Slurm's generic SLURM_ERROR text
    (r"^Unspecified error$|is not valid for this job|job setup is not valid",
     "slurm.site-submit-filter-rejected"),
    # munged on two hosts with different keys: each refuses the other's credentials
    (r"Munge decode failed: Invalid credential|authentication error: Invalid (?:authentication )?"
     r"credential", "slurm.munge-key-mismatch"),
    # the client cannot read slurm.conf at all (not on this host, or not readable by users)
    (r"s_p_parse_file: unable to (?:status|read) file", "slurm.config-unreadable"),
    # --constraint names a node feature no node of this cluster defines (slurm.conf Features)
    (r"Invalid feature specification", "slurm.invalid-constraint"),
    # slurmctld itself does not answer: every client command fails the same way.
    (r"Unable to contact slurm controller", "slurm.controller-unreachable"),
    # ... or answers a request to it (a submission, an allocation) too slowly: a controller
    # swamped by bursts of submissions and polls (a task launch timing out names a node instead)
    (r"^Socket timed out on send/recv operation", "slurm.controller-busy"),
    # The client cannot sign its request: no munged socket at the standard path on this host
    (r"Failed to access \"/(?:var/)?run/munge/munge\.socket\.\d+\": No such file|If munged is up, "
     r"restart with --num-threads", "slurm.munged-not-running"),
    # Two memory requests (options, or SLURM_MEM_PER_* a step inherits from its job).
    (r"(?:SLURM_MEM_PER_\w+|--mem\b).*mutually exclusive", "slurm.mem-options-exclusive"),
    # A limit of the QOS/association (the line before names it: QOSMaxSubmitJobPerUserLimit).
    (r"violates accounting/QOS policy|^QOS\w+$", "slurm.qos-limit"),
    # --time above the partition's MaxTime, or missing where required.
    (r"time limit is invalid|Time limit specification required", "slurm.time-limit-invalid"),
    # The step's memory cgroup killed a process: host RAM over --mem.
    # (older Slurm: "Step N exceeded memory limit (used > limit), being killed"; not the bare
    # "Exceeded ... memory limit at some point", which page cache alone can trigger)
    (r"oom[-_]kill event|Out Of Memory\b|OOM Killed|exceeded memory limit \(\d+ > \d+\)"
     r"|Exceeded job memory limit(?! at some point)", "slurm.oom-kill"),
    # slurmstepd's "CANCELLED ... DUE TO TIME LIMIT": the job ran past its --time.
    (r"\bTIME LIMIT\b", "slurm.time-limit"),
    # The controller lost the node (or cancelled the job for it): not the job's environment.
    (r"\bNODE[ _]FAIL|Node failure on", "slurm.node-fault"),
    # slurmd cannot find the GPUs its gres.conf/slurm.conf lists.
    (r"gres\.conf file|gres/gpu count reported lower than configured",
     "slurm.gres-conf-missing-device"),
    # slurmd rejects the GPUs' CPU affinity gres.conf gives (thread ids where cores are due).
    (r"invalid GRES core specification|Invalid GRES data for \w+, (?:CPUs|Cores)=",
     "slurm.gres-conf-affinity"),
)
_RESOURCE = (  # the resource a Slurm line names, for the parts
    re.compile(r"gres\.conf file (?P<r>/\S+?)(?::|\s|$)"),
    re.compile(r"Node failure on (?P<r>\S+)"),
    re.compile(r"invalid partition specified: (?P<r>\S+)"),
    re.compile(r"oom[-_]kill events?(?:\(s\))? in (?:StepId=|step )(?P<r>[\w.]+)"),
    re.compile(r"(?P<r>gres/gpu) count"),
    re.compile(r"invalid GRES core specification \((?P<r>[^)]+)\)"),
    re.compile(r"Invalid GRES data for \w+, (?P<r>(?:CPUs|Cores)=\S+)"),
)
# ``srun: error: Couldn't find the specified plugin name for mpi/pmix``, ``Invalid MPI type
# 'pmix'``, ``mpi/pmix_v5: init: ... can not load PMIx library``: the --mpi plugin srun lacks.
_PLUGIN_FAILED = re.compile(r"plugin name for mpi/|mpi plugin for mpi/|Invalid MPI type"
                            r"|Cannot create context for mpi/|can not load PMIx library", re.I)
_PLUGIN = re.compile(r"mpi/(?P<a>\w+)|MPI type '?(?P<b>\w+)|--mpi=(?P<c>\w+)", re.I)
# execve() of the batch script slurmd itself copied into its spool: if it is gone, the node is.
_EXECVE = re.compile(r"execve\(\): (?P<path>\S+): (?P<why>No such file or directory)")

# Open MPI / PRRTE help texts (whitespace collapsed) and the mode each names.
_OWN_HOST = re.compile(r"gethostbyname failed, (\S+) \(errno \d+\)|gethostbyname error on (\S+): "
                       r"Unknown host|HYDU_getfullhostname \([^)]*\): getaddrinfo error \(hostname: "
                       r"([^,\s)]+)|Unable to get host entry for (\S+)")
_OMPI = (
    # mpi4py (and MPI+OpenMP codes) ask for MPI_THREAD_MULTIPLE; a UCX built without
    # --enable-mt cannot give it, and the UCX PML steps aside (ompi's pml_ucx.c prints this
    # for that reason only)
    (re.compile(r"UCP worker does not support MPI_THREAD_MULTIPLE"), "mpi.ucx-no-thread-multiple"),
    # CUDA-aware Open MPI's smcuda BTL: CUDA IPC refuses the buffer (memory from a pool or
    # virtual-memory allocator, or another context)
    (re.compile(r"The call to (?P<call>cuIpcGetMemHandle) failed\.(?: This means the GPU "
                r"RDMA protocol cannot be used\.)?(?: cuIpc\w+ return value: (?P<code>\d+))?"),
     "mpi.smcuda-cuda-ipc-unusable"),
    # The receiving side: a rank cannot open its peer's handle because it does not see the
    # peer's GPU (Slurm's per-task GPU binding; Cray MPICH's GTL says so in its own words)
    (re.compile(r"The call to (?P<call>cuIpcOpenMemHandle) failed\.|\(GTL DEBUG: \d+\) (?P<gtl>"
                r"cuIpcOpenMemHandle): invalid argument, CUDA_ERROR_INVALID_VALUE|Failed to register "
                r"remote memory, rc=-?\d+"), "slurm.gpu-bind-isolates-cuda-ipc"),
    # More ranks than slots (cores, hostfile slots=, the allocation's tasks).
    (re.compile(r"There are not enough slots available in the system to satisfy the (?P<n>\d+) "
                r"slots that were requested by the application:? (?P<app>\S+)?"),
     "mpi.not-enough-slots"),
    # The remote daemon was never there: orted/prted not on PATH (or its libraries missing) on
    # the other node, i.e. the MPI's paths differ between the hosts.
    (re.compile(r"(?P<daemon>orted|prted): (?:command not found|error while loading shared "
                r"libraries)"), "launch.remote-paths-missing"),
    # A daemon that started but never called back, or whose connection dropped.
    (re.compile(r"(?:ORTE|PRTE) has lost communication with a remote daemon"
                r"(?:.*?Remote daemon ?: \S+ on node (?P<node>\S+))?"
                r"|An? (?:ORTE|PRTE) daemon has unexpectedly failed after launch"), "mpi.orted-lost"),
    # No daemon called back at all (ssh refused, orted not found, the rsh agent failed).
    (re.compile(r"(?P<starter>ORTE|PRTE) was unable to (?:reliably )?start one or more daemons"),
     "mpi.orted-lost"),
    # The TCP BTL (rank-to-rank traffic, once the daemons are up) connecting to an address the
    # peer advertised that this node cannot reach: a bridge every host has (docker0, virbr0) or
    # a subnet they do not share. "Connection refused" is left out: a peer that died says it too.
    (re.compile(r"btl_tcp_endpoint\.c:\d+:mca_btl_tcp_endpoint_\w+\] connect\(\) to "
                r"(?P<address>\S+) failed: (?P<error>No route to host|Connection timed out"
                r"|Operation now in progress) \((?P<errno>11[035])\)"
                r"|Open MPI failed to TCP connect to a peer MPI process"
                r"(?:.*?Local host: (?P<host>\S+))?(?:.*?Message: connect\(\) to (?P<peer>\S+) failed)?"
                r"(?:.*?Error: (?P<why>[A-Za-z ]+?) \((?P<code>\d+)\))?"),
     "mpi.btl-tcp-unroutable-interface"),
    # hwloc binding protection: more ranks to bind than cpus on the node (or its cpuset).
    (re.compile(r"binding more processes than cpus on a resource:?(?: Bind to: (?P<bind_to>\S+))?"
                r"(?: Node: (?P<node>\S+))?(?: #processes: (?P<processes>\d+))?"
                r"(?: #cpus: (?P<cpus>\d+))?"), "mpi.bind-overload"),
    # Ranks direct-launched by srun with no PMI/PMIx the Open MPI build understands.
    (re.compile(r"OMPI was not built with SLURM'?s PMI"), "mpi.ompi-no-slurm-pmi"),
    # Open MPI 5 found PMI-1/2 but no PMIx: every rank becomes its own world of one.
    (re.compile(r"No PMIx server was reachable, but a PMI1/2 was detected"
                r"(?:.*?(?P<n>\d+) singletons will be started)?"), "mpi.srun-singletons"),
    (re.compile(r"(?P<launcher>mpirun|mpiexec|prterun|orterun) has detected an attempt to run as "
                r"root"), "mpi.run-as-root"),
    # PMIx's component help text: the ranks' PMIx cannot open psec/munge, the credential
    # plugin Slurm's PMIx server uses (another PMIx build on the application's side).
    (re.compile(r"(?:Framework: psec )?Component: munge\b"), "mpi.pmix-psec-munge"),
    # PMIx's own error log names the source file: the ds12 store's process-shared locks.
    (re.compile(r"PMIX ERROR: (?P<error>[\w-]+) in file (?P<file>\S*gds_ds12_lock\w*\.c)"),
     "mpi.pmix-gds-ds12"),
    # openib probing a port it leaves to UCX: a warning, not the failure.
    (re.compile(r"There was an error initializing an OpenFabrics device\.?"
                r"(?: Local host: \S+ Local device: (?P<device>\S+))?"
                # the same fallback for a BTL with no usable interface here (help-mpi-btl-base
                # btl:no-nics): "Another transport will be used instead"
                r"|was unable to find any relevant network interfaces"
                r"(?::? Module: (?P<module>[\w ]+?) *\()?"),
     "mpi.openib-warning"),
    # vader's single copy (process_vm_readv) refused with EPERM (errno 1): a container's seccomp.
    (re.compile(r"Read -1, expected (?P<n>\d+), errno = 1\b"), "mpi.vader-cma-container"),
    # ... and through UCX (pml ucx): its CMA copy refused (EPERM), or its posix transport's open
    # of a peer's /proc/<pid>/fd refused (EACCES); "Bad address" or ENOENT are other causes
    (re.compile(r"process_vm_readv\(pid=\d+ [^)]*\) returned -1: Operation not permitted"
                r"|process_vm_readv delivered \d+ instead of (?P<n>\d+), error message Operation not "
                r"permitted|UCX\s+ERROR\s+(?:open\(file_name=/proc/\d+/fd/\d+ flags=0x0\) failed|"
                r"Error returned from open in attach)[.:] Permission denied"),
     "mpi.vader-cma-container"),
    # The ssh/rsh launcher component found neither program: an image without an ssh client.
    (re.compile(r"could not be found:? plm_rsh_agent: (?P<agent>.+?)(?= Please|$)"
                r"|FORCE-TERMINATE AT Not found:-13 - error plm_rsh_component\.c"), "mpi.no-rsh-agent"),
    # Open MPI's show_help could not open its own help text (or a wrapper its data file) under a
    # build prefix conda never rewrote: the package is unrelocated, whatever topic it wanted.
    (re.compile(r"(?:supposed to get help about: (?P<topic>\S+) But I couldn't open the help "
                r"file:|Cannot open configuration file) (?P<path>/opt/anaconda1anaconda2anaconda3/"
                r"[^\s:]+|[^\s:]*?_placehold_placehold[^\s:]*)"), "mpi.unrelocated-install-prefix"),
    # A wrapper compiler whose data file names no compiler: configure found none for that
    # language (mpifort/mpif90 without gfortran), so those bindings were never built.
    (re.compile(r"No underlying compiler was specified in the wrapper compiler data file"
                r"(?: \(e\.g\., (?P<file>[\w+.-]+)\))?"), "mpi.ompi-built-without-fortran"),
    # Two releases of Open MPI/PRRTE in one job: the daemons' wire formats differ.
    (re.compile(r"(?P<runtime>PRTE|Open MPI) detected a mismatch in versions between two "
                r"processes(?:.*?Local (?:PRTE|Open MPI) version: (?P<local>\S+) Peer "
                r"(?:PRTE|Open MPI) version: (?P<peer>\S+))?"
                r"|Data unpack would read past end of buffer"), "mpi.version-mismatch-across-nodes"),
    # mpirun passes its daemons options of its own release: a daemon refusing one is another
    # release's (open-mpi/ompi#6324: the remote non-interactive PATH found another orted).
    (re.compile(r"(?P<daemon>orted|prted): Error: unknown option \"(?P<option>-{1,2}[\w-]+)\""),
     "mpi.version-mismatch-across-nodes"),
)
# What the launcher printed before "ORTE was unable to reliably start one or more daemons" when
# it knows why no daemon started: that line names the cause (launch.toml's ssh and path modes).
_DAEMON_WHY = re.compile(r"(?:orted|prted): (?:command not found|error while loading shared"
                         r" libraries)|Host key verification failed|Permission denied"
                         r"|Could not resolve hostname|ssh: connect to host"
                         # ssh itself could not run: another libcrypto than its own
                         r"|OpenSSL version mismatch\. Built against|ssh: symbol lookup error", re.I)
# MPICH/Intel MPI's ch4:ofi: libfabric offered no provider that opens here (ENODATA), or Intel
# MPI's startup found its OFI fabric unusable with no fallback allowed.
_OFI = re.compile(r"OFI (?P<call>addrinfo|fi_getinfo)\(\) fail(?:ed|ure)(?: \([^)]*:(?P<why>[^:)]+)\))?"
                  r"|MPI startup\(\): (?P<fabric>\w+) fabric is not available and fallback fabric "
                  r"is not enabled"
                  # libfabric's psm3 provider chosen on a host without its NIC (MPICH, Intel MPI,
                  # Open MPI's ofi MTL all stop at the endpoint; Open MPI's fi_domain failure is Slingshot's VNI)
                  r"|PSM3 can't open nic unit: (?P<unit>\d+) \(err=(?P<err>\d+)\)"
                  r"|OFI endpoint open failed \(ofi_init\.c:\d+:create_vni_context"
                  r"|Open MPI failed an OFI Libfabric library call \((?P<ofi_call>fi_endpoint)\)")
# Every rank printing that it is rank 0 of a world of 1 (the same words before "0 of 1" on
# several lines): the launcher's PMI was not the one the MPI library speaks, so each rank
# initialised as a singleton. One such line alone is an ordinary single-process run.
_SINGLETON = re.compile(r"^\W*(?:\d+: *)?(?P<lead>[A-Za-z][\w ]*?)\s0 of 1\b", re.M)
# A build against MPI (mpi4py's setup, an MPI extension) that finds no MPI to compile with: the
# header is missing (no MPI development files, no MPI module loaded), or mpi4py's configure
# test could not compile. An mpicc that wraps NVIDIA's nvc fails the same test for another
# cause (mpi4py/mpi4py#572: nvc refuses the interpreter's GCC flags): not read.
_NO_MPI_BUILD = re.compile(r"fatal error: (?P<header>mpi\.h): No such file or directory"
                           r"|error: (?P<configure>Cannot compile MPI programs)")
_NVC = re.compile(r"nvc-Error")
# mpi4py's extension asking its MPI library for a symbol that library does not have.
_MPI4PY = re.compile(r"mpi4py/MPI\.\S*?\.so: undefined symbol: (?P<symbol>\w+)")

# A launcher refusing an option that is the other MPI's own (mpi.launcher-other-mpi): the
# mpirun/mpiexec on PATH is not the MPI the command was written for. Hydra (MPICH, Intel MPI):
# "[mpiexec@host] match_arg (utils/args/args.c:163): unrecognized argument mca"; Open MPI 4:
# 'mpiexec: Error: unknown option "-env"'; Open MPI 5 (PRRTE): "An unrecognized option was
# included on the mpiexec command line: Option: --hosts"; HPE/SGI MPT: "MPT ERROR: invalid
# option: -map-by", "mpiexec_mpt error: -map-by option not supported".
_REFUSED = (
    ("Hydra (MPICH or Intel MPI)", "Open MPI",
     re.compile(r"match_arg \([^)]*\): unrecognized argument (?P<opt>[\w-]+)")),
    ("Open MPI", "MPICH or Intel MPI",
     re.compile(r"\b(?:mpirun|mpiexec|orterun): Error: unknown option \"(?P<opt>-{1,2}[\w-]+)\"")),
    ("Open MPI", "MPICH or Intel MPI",
     re.compile(r"An unrecognized option was included on the (?:mpirun|mpiexec|prterun) command "
                r"line:? Option: (?P<opt>-{1,2}[\w-]+)")),
    ("HPE/SGI MPT", "Open MPI",
     re.compile(r"MPT ERROR: invalid option: (?P<opt>-{1,2}[\w-]+)"
                r"|mpiexec_mpt error: (?P<opt2>-{1,2}[\w-]+) option not supported")),
)
# Options only one family's launcher has (a typo or an option both share is not this cause).
_OPTIONS = {
    "Open MPI": {"allow-run-as-root", "mca", "gmca", "am", "oversubscribe", "x", "npernode",
                 "npersocket", "pernode", "merge-stderr-to-stdout", "tag-output",
                 "timestamp-output", "report-bindings", "display-map", "display-allocation",
                 "bynode", "byslot", "bysocket", "bind-to-core", "map-by", "rank-by", "prefix",
                 "output-filename", "use-hwthread-cpus", "cpus-per-proc", "cpus-per-rank"},
    "MPICH or Intel MPI": {"env", "genv", "genvall", "genvlist", "genvnone", "envall",
                           "envlist", "envnone", "f", "hosts", "ppn", "perhost", "rr", "iface",
                           "launcher", "launcher-exec", "bootstrap", "bootstrap-exec",
                           "configfile", "machine", "prepend-rank", "print-rank-map"},
}
# Open MPI's box when the program it was asked to start is on no PATH it searched: which
# program it was says which cause (programs.toml: torchrun, deepspeed, orted ...); any other
# name (an application binary, a misparsed option) is the text's own news, and nothing here
# says whether the node that looked was another host.
_NO_EXECUTABLE = re.compile(r"(?:mpirun|mpiexec|prterun) was unable to find the specified "
                            r"executable file.*?Node: (?P<node>\S+) Executable: (?P<exe>\S+)")


def _records(message: str):
    """(program, text, the whole record) of each Slurm record; Slurm's own phrases quoted
    without the program's prefix (a wrapper's "sbatch output: ..."), read the same way."""
    records = [(m["program"].lower(), m["text"].strip(), m.group(0)) for m in _SLURM.finditer(message)]
    if not records:
        records = [("scontrol", m["text"].strip(), m.group(0)) for m in _SCONTROL.finditer(message)]
    if not records:
        records = [(m["program"], m["text"].strip(), m.group(0)) for m in _API.finditer(message)]
    if not records and (m := _WHAT.search(message)):
        records = [("slurm", m.group(0).strip(), m.group(0))]
    return records


def _slurm(message: str) -> list[Reading]:
    found = []
    for program, text, whole in _records(message):
        parts = {"program": program}
        reason = text
        if what := _WHAT.search(text):
            reason = re.split(r"[`\"]", what["reason"] or what["why"])[0].strip()
            failed = what["what"]
            parts["failed"] = ("step creation" if "step creation" in failed
                               else re.sub(r" for job.*", "", failed))
        elif (end := _CANCELLED.search(text)) and end["reason"]:
            reason = end["reason"]
            parts.update(job=end["job"], node=end["node"])
        parts["reason"] = reason[:120]
        for pattern in _RESOURCE:
            if m := pattern.search(text):
                parts["resource"] = m["r"]
                break
        mode = next((mode for rule, mode in _REASONS if re.search(rule, reason, re.I)), None)
        if mode is None and (m := _EXECVE.search(text)) and m["path"].endswith("slurm_script"):
            mode, parts["resource"], parts["reason"] = "slurm.node-fault", m["path"], m["why"]
        if mode is None and _PLUGIN_FAILED.search(text) and (m := _PLUGIN.search(text)):
            plugin = m["a"] or m["b"] or m["c"]
            # Only pmix has a mode: srun lacking pmi2 is rare (Slurm builds it by default).
            if plugin.lower().startswith("pmix"):
                mode, parts["plugin"] = "mpi.srun-pmix-plugin-missing", plugin
        if mode:
            found.append(reading(FAMILY, mode, whole[:200], **parts))
    return found


# munge's own words in slurmd's or slurmctld's log for the same refusal, with both clocks
_MUNGE_EXPIRED = re.compile(r"Munge decode failed: Expired credential(?:[\s\S]{0,80}?ENCODED: "
                            r"(?P<encoded>[^\n]+?)\s*\n[^\n]*?DECODED: (?P<decoded>[^\n]+))?")


def read(message: str) -> list[Reading]:
    if not message.strip():
        return []
    found = _slurm(message)
    if (m := _MUNGE_EXPIRED.search(message)) and not any(
            r.mode == "slurm.clock-skew-credential" for r in found):
        parts = {k: v.strip() for k, v in m.groupdict().items() if v}
        found.append(reading(FAMILY, "slurm.clock-skew-credential", m.group(0).split("\n")[0],
                             program="munge", **parts))
    flat = " ".join(message.split())
    for pattern, mode in _OMPI:
        if m := pattern.search(flat):
            if m.groupdict().get("starter") and _DAEMON_WHY.search(flat):
                continue  # the box only follows the ssh or PATH failure read elsewhere
            parts = {k: v for k, v in m.groupdict().items() if v}
            found.append(reading(FAMILY, mode, m.group(0)[:200], program="Open MPI", **parts))
    if m := _OFI.search(message):
        parts = {k: v for k, v in m.groupdict().items() if v}
        found.append(reading(FAMILY, "mpi.ofi-provider-unavailable", m.group(0)[:200],
                             program="Open MPI" if "Open MPI" in m.group(0) else
                             "libfabric (MPICH, Intel MPI, Open MPI)" if "PSM3" in m.group(0)
                             else "MPICH/Intel MPI", **parts))
    if m := _OWN_HOST.search(flat):  # MPICH's TCP netmod and Hydra look up this host's name
        found.append(reading(FAMILY, "mpi.own-hostname-unresolvable", m.group(0)[:200],
                             program="MPICH (Hydra)", host=next(h for h in m.groups() if h)))
    leads = [m["lead"].lower() for m in _SINGLETON.finditer(message)]
    if leads and max(leads.count(lead) for lead in leads) >= 2 \
            and not any(r.mode == "mpi.srun-singletons" for r in found):
        found.append(reading(FAMILY, "mpi.srun-singletons", f"{leads[0]} 0 of 1",
                             program="MPI", ranks_alone=str(len(leads))))
    if m := _MPI4PY.search(message):
        found.append(reading(FAMILY, "mpi.mpi4py-other-mpi", m.group(0), program="mpi4py",
                             symbol=m["symbol"]))
    if (m := _NO_MPI_BUILD.search(message)) and not _NVC.search(message):
        found.append(reading(FAMILY, "mpi.build-without-mpi", m.group(0), program="a build "
                             "against MPI (mpi4py's setup)", missing=m["header"] or "a working "
                             "mpicc (its configure test could not compile)"))
    found += _launcher(flat)
    return found


def _launcher(flat: str) -> list[Reading]:
    found = []
    for launcher, other, pattern in _REFUSED:
        m = pattern.search(flat)
        option = m and (m["opt"] or m.groupdict().get("opt2") or "")
        if option and option.lstrip("-") in _OPTIONS[other]:
            found.append(reading(FAMILY, "mpi.launcher-other-mpi", m.group(0)[:200],
                                 launcher=launcher, option=option, option_of=other))
            break
    if (m := _NO_EXECUTABLE.search(flat)) and (row := _programs().get(m["exe"].rpartition("/")[2])):
        found.append(reading(FAMILY, row["mode"], m.group(0)[:200], program=m["exe"],
                             node=m["node"], it_is=row["why"]))
    return found


@cache
def _programs() -> dict[str, dict]:
    """{executable name: its row of ../programs.toml} (the programs family's table)."""
    rows = load_table("dsenv.doctor.explain", "programs.toml")["program"]
    return {name: row for row in rows for name in row["names"]}
