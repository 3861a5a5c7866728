"""A job log read as lines: each line cleaned of the prefixes launchers add (torchrun's
``[rank3]:``, srun's ``--label``, mpirun's ``--tag-output``, pdsh's host, timestamps),
classified (a failure, a warning, the cascade that follows a failure, or noise), and the
root error found: the first failure that is not part of the cascade.

The cascade: once one rank fails, the others and the launchers print their own errors
(torchrun's ChildFailedError summary, ``Sending process N closing signal SIGTERM``,
mpirun's ``exited on signal``, srun's ``error: node: task 3: Exited with exit code 1``,
NCCL's ``remote process exited``). Those lines come after the real error and name none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PREFIXES = (
    r"\x1b\[[0-9;]*m",
    # a log pasted as a Markdown or e-mail quote ("> "), or from the Python prompt (">>> ")
    r">+[ \t]*(?=\S)",
    r"\[?\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?:?\s*",
    r"\[[A-Za-z]*\d+(?:\|\d+)?\]: ?",  # torchrun's [rank3]:, [default0]:
    r"\[\d+,\d+\]<(?:stdout|stderr)>: ?",  # mpirun --tag-output
    r"\d{1,5}: ",  # srun --label
    r"[\w.-]+[-_]\d+\s+\| ",  # docker compose's service prefix: "web_1  | ", "web-1  | "
    r"#\d+ \d+\.\d+ ",  # docker build's plain progress: "#6 0.864 ValueError: ..."
    r"E {3,}(?=[A-Za-z_])",  # pytest's failure lines: "E   ModuleNotFoundError: ..."
    r"`+(?=[A-Za-z_])",  # a line pasted inside Markdown's inline code: "`AttributeError: ..."
    # pdsh/deepspeed launcher: "worker-1: ..." (a host with a digit; not a library name,
    # not an exception of a module with a digit: "urllib3.exceptions.ReadTimeoutError: ",
    # not enroot's helpers, which name themselves: "enroot-aufs2ovlfs: failed to ...")
    r"(?!enroot-)(?![\w.+-]*(?:\.so\b|(?:Error|Exception|Warning|Interrupt|Exit)\b))"
    r"[A-Za-z][\w-]*\d[\w.-]*: (?=\S)",
)
_PREFIX = re.compile("^(?:" + "|".join(f"(?:{p})" for p in _PREFIXES) + ")+")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# A line that reports a failure (after the prefixes are gone).
_FAILURE = re.compile(
    r"^\s*(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b(?::|$)"  # Python
    r"|NCCL WARN|\bnccl(?:System|Remote|Internal|InvalidUsage|InvalidArgument|Unhandled\w*)"
    r"(?:Error)?\b|\bRCCL WARN"
    r"|\berror\b|\bfatal\b|\bfailed\b|\bfailure\b|\bcannot\b|\bcan't\b|\bcouldn't\b|\bcould not\b|\bunable to\b"
    r"|\bnot found\b|undefined (?:symbol|reference)|No such file or directory"
    r"|Segmentation fault|Bus error|Illegal instruction|core dumped|\bAborted\b|\bKilled\b"
    r"|Permission denied|No space left|Disk quota|out of memory|\bsignal \d+"
    # glog's FATAL level (TensorFlow's "F tensorflow/...cc:35] ...", "F0117 08:21:49 ...]"):
    # the process aborts right after it
    r"|^F(?:\d{4} [\d:.]+(?: +\d+)?)? [\w./-]+\.(?:cc|cpp|h):\d+\] "
    # torch's warning that its build has no kernels for this GPU: the cause of the
    # 'no kernel image' error that follows it
    r"|no longer supports this GPU|is not compatible with the current PyTorch installation"
    # OpenSSH's refusal to run on another libcrypto than its own: the launcher's ssh dies
    # there, before mpirun's or pdsh's own complaint
    r"|^OpenSSL version mismatch\. Built against"
    # maturin's build of a Rust extension with no cargo: its box carries no "error" word
    r"|Cargo, the Rust package manager, is not installed"
    # Intel MPI's DAPL fabric refusing the locked-memory limit (a warning it then dies of)
    r"|RLIMIT_MEMLOCK too small"
    # Ollama's warning that its ROCm libraries have no code for the GPU's gfx (it then runs
    # on the CPU)
    r"|amdgpu (?:\[\d+\] gfx\w+ )?is not supported (?:by |\(supported types:\[gfx)"
    # a vGPU guest without its license: nvidia-smi -q prints it as a state, not an error
    r"|License Status\s*:\s*Unlicensed(?! \(Unrestricted\))"
    # Open MPI/PRRTE's refusals to start ranks: their help boxes carry no "error" word
    r"|not enough slots available in the system|has detected an attempt to run as root"
    r"|would result in binding more\b"
    # apt's error lines ("E: Conflicting values set for option Signed-By ...")
    r"|^E: (?=[A-Z])"
    # pkg_resources' refusal of an installed release (Jupyter prints it without its module)
    r"|^\s*(?:pkg_resources\.)?(?:Contextual)?VersionConflict\b"
    # transformers'/diffusers' refusal of a model id, pasted without its "OSError: " prefix
    r"|is not a local folder and is not a valid model identifier"
    # ROCr's GPU page fault: the process aborts right after it (no "error" word on the line)
    r"|^Memory access fault by GPU node-\d+",
    re.IGNORECASE)
# Lines that only say that something else failed.
_CASCADE = re.compile(
    r"ChildFailedError|Root Cause \(first observed failure\)|exited on signal"
    r"|task(?:s)? [\d,-]+: (?:Exited|Killed|Terminated)|\bSignal 15\b|SIGTERM|SIGKILL"
    r"|closing signal|failed \(exitcode: -?\d+\)|exitcode\s*: -?\d+|remote process exited"
    r"|ncclRemoteError|Connection closed by remote peer|Connection reset by peer"
    r"|noticed that process rank|Primary job +terminated normally"
    r"|one or more processes exited with non-zero status|exits? with return code"
    r"|CalledProcessError|Killing subprocess|\bCANCELLED AT\b|Terminating process"
    r"|process \d+ exited with|elastic\.multiprocessing\.api:failed|aborting job"
    r"|NCCL communicator was aborted|Process group watchdog thread terminated"
    r"|^\S+ FAILED\s*$|ssh exited with exit code (?!255\b)\d+",
    re.IGNORECASE)
# libdrm's "amdgpu.ids: No such file or directory" and MIOpen's "Performance may degrade" are
# printed before any ROCm error: never one.
_NOISE = re.compile(r"\bNCCL INFO\b|\bRCCL INFO\b|\[INFO\]|\bINFO[:\] ]|\bDEBUG\b"
                    # c10's C++ backtrace under an error: its header and frames name functions
                    # (c10::Error::Error), never the failure
                    r"|^\s*Exception raised from \w+ at \S+ \(most recent call first\):"
                    r"|^\s*frame #\d+: "
                    r"|^\S*amdgpu\.ids: No such file or directory\s*$"
                    r"|\[SQLiteBase\] (?:Unable to read|Missing) system database file")
# (Open MPI's "... was unable to find any relevant network interfaces ... Another transport
# will be used instead" is a fallback, not the job's failure.)
_WARNING = re.compile(r"\[WARN(?:ING)?\]|\bWARNING\b|\w+Warning:|\bwarn(?:ing)?:"
                      r"|unable to find any relevant network interfaces"
                      # c10's and glog's warning level ("[W1127 07:58:15.765 socket.cpp:207]",
                      # "[W socket.cpp:436]", "W0117 08:21:49.123 12345 file.cc:35]"): torch's
                      # c10d warns "The hostname of the client socket cannot be retrieved"
                      # before the store's real timeout
                      r"|^\s*\[?W(?:\d{4} [\d:.]+(?: +\d+)?)? [\w./-]+\.(?:cc|cpp|h|hpp|c):\d+\]",
                      re.IGNORECASE)
_TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\):")
# Python's markers between the exceptions of one chain
_CHAINED = re.compile(r"^\s*(?:The above exception was the direct cause of the following "
                      r"exception|During handling of the above exception, another exception "
                      r"occurred):")
CHAIN_SPAN = 200  # lines after a failure searched for the exceptions chained onto it
_FRAME_FILE = re.compile(r'^\s+File "')
_EXCEPTION = re.compile(r"^\s*(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b:")
_CARETS = re.compile(r"^\s*[\^~]+\s*$")  # Python 3.11+ marks the failing expression
CARETS = 2  # caret lines skipped at most above an exception
_WHERE = re.compile(r'", line \d+, in ')
# A line that starts a record of its own: NCCL's host:pid:tid [dev], a log level, a timestamp.
_NEW_RECORD = re.compile(r"^\S+:\d+:\d+ \[\d+\]|^\s*\[?(?:INFO|WARNING|ERROR|DEBUG)\b"
                         r"|^[IWEF]\d{4} |^\[?\d{4}-\d\d-\d\d")
CONTINUATION = 3  # lines after a failure read as part of its message
SINGLE_MAX = 300  # distinct lines of a text without a failure line read as its message
BACKTRACE = 30  # frames of a caught signal's backtrace read as part of its message
_SIGNAL = re.compile(r"\bCaught signal \d+ \(")
_DETAIL = re.compile(r"^\s{2,}[\w .-]+:\s")  # a help text's indented "key: value" line
_CARET = re.compile(r"^\s*[\^~]+\s*$")  # Python 3.11's markers under a frame's source


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, as an editor shows it
    raw: str
    text: str  # without the prefixes
    kind: str  # failure, cascade, warning, noise, other


# A line longer than this (a printed tensor or token list, a JSON dump, a base64 blob) keeps
# its head and its tail, where a program puts what failed and why: the rules' regexes try a
# match from every position of a line, so a 50,000-character line took minutes.
LONG_LINE, HEAD, TAIL = 1000, 600, 300


def clean(raw: str) -> str:
    if len(raw) > LONG_LINE:
        raw = f"{raw[:HEAD]} [... {len(raw) - HEAD - TAIL} characters ...] {raw[-TAIL:]}"
    text = _PREFIX.sub("", raw.rstrip("\r\n"), count=1)
    return _ANSI.sub("", text) if "\x1b" in text else text


def classify(text: str) -> str:
    if not text.strip():
        return "other"
    if _NOISE.search(text):
        return "noise"
    if _CASCADE.search(text):
        return "cascade"
    if _FAILURE.search(text):
        return "warning" if _WARNING.search(text) and "NCCL WARN" not in text else "failure"
    return "warning" if _WARNING.search(text) else "other"


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


def read(text: str) -> list[Line]:
    """Every line, classified. Inside a Python traceback (a "Traceback" header and the lines
    indented deeper than it: frames and source) nothing is a failure; the first line back at
    the header's indentation is the exception, and is classified like any other line."""
    lines: list[Line] = []
    header: int | None = None  # the indentation of the open traceback's header
    for number, raw in enumerate(text.splitlines(), 1):
        cleaned = clean(raw)
        if _TRACEBACK.match(cleaned):
            header = _indent(cleaned)
            lines.append(Line(number, raw, cleaned, "other"))
            continue
        if _FRAME_FILE.match(cleaned) and header is None:
            # The header is not in the text (another rank's line interrupted the traceback,
            # or the paste starts mid-traceback): frames sit two columns deeper than it,
            # also inside output a tool indented (pip's "[output]" of a failed build).
            header = max(0, _indent(cleaned) - 2)
        if header is not None and cleaned.strip():
            if _indent(cleaned) > header or _CARET.match(cleaned):
                lines.append(Line(number, raw, cleaned, "other"))
                continue
            header = None
        lines.append(Line(number, raw, cleaned, classify(cleaned)))
    return lines


@dataclass(frozen=True)
class Reading:
    lines: list[Line]
    candidates: list[Line]  # distinct failures in order, then cascade lines, then warnings
    root: Line | None  # the first failure not in the cascade (or the first cascade line)
    single: bool  # the input names no failure line: read as one message

    def message(self, line: Line) -> str:
        """The failure as its program reported it: the line, the traceback frame right above
        an exception (where it was raised), and the lines that continue it (a wrapped
        message, NCCL's "Last error:" and the text after it), joined and unwrapped."""
        if self.single:
            return line.text
        index = line.number - 1
        before: list[str] = []
        if _EXCEPTION.match(line.text):
            # the frame and its source line; Python 3.11's caret lines under the source line
            # ("    ^^^^^^") are skipped, not counted, or they would push the frame out
            for prev in reversed(self.lines[max(0, index - 2 - CARETS):index]):
                if _CARETS.match(prev.text):
                    continue
                if prev.kind != "other" or not (prev.text[:1].isspace() or _WHERE.search(
                        prev.text)) or len(before) == 2:
                    break
                before.insert(0, prev.text.strip())
        after: list[str] = []
        if _SIGNAL.search(line.text):  # UCX's "Caught signal 7 (...)" and the backtrace it prints
            return " ".join([line.text.strip(), *self._backtrace(index)])
        following = self.lines[index + 1:index + 2 + CONTINUATION]
        for at, nxt in enumerate(following[:CONTINUATION + 1]):
            if not nxt.text.strip():
                # A help text's detail block (Open MPI, PRRTE: "  plm_rsh_agent: ssh : rsh",
                # "  Local host: n1") follows its sentence after one blank line, indented.
                after_blank = following[at + 1] if at + 1 < len(following) else None
                if after_blank is not None and _DETAIL.match(after_blank.text) \
                        and (after or line.text.rstrip().endswith(":")):
                    continue
                break
            if nxt.kind in ("noise", "cascade") or _TRACEBACK.match(nxt.text) \
                    or _EXCEPTION.match(nxt.text) or _NEW_RECORD.match(nxt.text):
                break
            after.append(nxt.text.strip())
            if len(after) >= CONTINUATION:
                break
        return " ".join([*before, line.text.strip(), *after])

    def _backtrace(self, index: int) -> list[str]:
        """The frames of the backtrace block that follows a caught signal (UCX prints it
        between ==== lines), at most BACKTRACE lines: where the process was when it died."""
        frames: list[str] = []
        for nxt in self.lines[index + 1:index + 2 + BACKTRACE]:
            text = nxt.text.strip()
            if not frames and not text.startswith("==== backtrace"):
                break
            if frames and text.startswith("===="):
                break
            frames.append(text)
        return frames

    def context(self, line: Line, width: int = 8) -> str:
        lo, hi = max(0, line.number - 1 - width), min(len(self.lines), line.number + width)
        return "\n".join(x.text for x in self.lines[lo:hi] if x.number != line.number)

    def chained(self, line: Line) -> str:
        """The exceptions Python chained onto the failure ``line`` belongs to ("The above
        exception was the direct cause of the following exception:"), however far below: the
        outer one says what was being done (torchrun's RendezvousConnectionError over the
        store's socket timeout). Within CHAIN_SPAN lines of the first exception after it."""
        found: list[str] = []
        linked = False  # the last exception seen is joined to the next by a chain marker
        first = bool(_EXCEPTION.match(line.text))  # the chain's first exception has been seen
        for nxt in self.lines[line.number:line.number + CHAIN_SPAN]:
            if _CHAINED.match(nxt.text):
                linked = True
            elif _EXCEPTION.match(nxt.text):
                if first and not linked:
                    break  # another failure, not this one's chain
                if linked:
                    found.append(nxt.text)
                first, linked = True, False
        return "\n".join(found)


def _distinct(lines: list[Line]) -> list[Line]:
    """Each message once (eight ranks print the same error), first occurrence kept."""
    seen: set[str] = set()
    out = []
    for line in lines:
        key = re.sub(r"\d+", "N", line.text.strip())
        if key not in seen:
            seen.add(key)
            out.append(line)
    return out


def find_root(text: str) -> Reading:
    lines = read(text)
    failures = _distinct([x for x in lines if x.kind == "failure"])
    cascade = _distinct([x for x in lines if x.kind == "cascade"])
    warnings = _distinct([x for x in lines if x.kind == "warning"])
    if not failures and not cascade:
        # No line reads as a failure: the text is read as one message, each line once (ranks
        # repeat theirs word for word); of a long log with many, its end, where the job stopped.
        last: dict[str, Line] = {}
        for x in lines:  # each line once, where it last appears
            last.pop(x.text, None)
            last[x.text] = x
        said = list(last.values())[-SINGLE_MAX:]
        whole = Line(1, text, "\n".join(x.text for x in said), "failure")
        return Reading(lines, [whole] if text.strip() else [], whole if text.strip() else None,
                       True)
    root = (failures or cascade)[0]
    return Reading(lines, failures + cascade + warnings, root, False)
