"""One rank of ``dsenv doctor --distributed``: rendezvous, torch.distributed, exact all-reduce
checks and nccl-tests timings, under a deadline that no peer can break.

Side channel (keys under ``dsenv-doctor/<restart>/`` in the job's TCPStore: rank 0 serves it
on MASTER_PORT, or torchrun's agent does):

==============  ============================================================================
identity/<r>    rank r's record (host, ranks, device and its UUID, NUMA, interface), JSON
step/<r>        index of the step rank r last entered (rendezvous, init, check 1 MiB, ...)
rank0           rank 0's liveness port and its deadline (epoch seconds), JSON
go              rank 0's word after the rendezvous: the random seed, or why the run stops
==============  ============================================================================

Liveness: every rank keeps one TCP connection to rank 0. The kernel closes it the moment a
process ends, however it ends, so rank 0 knows at once which rank exited (and the ranks know
when rank 0 did). A rank that is alive but stuck is found when the deadline comes: it is the
one whose step is behind the others'. Rank 0 then names it, tells the others to stop (an
``abort`` line on their connection) and exits 1.

Nothing waits without a deadline: the watchdog thread ends the run at the deadline whatever
the main thread is blocked in (torch releases the GIL in collectives and store calls),
SIGTERM from a launcher (torchrun stops every rank when one fails) is taken by a thread that
reports first, and ``faulthandler`` kills the process a few seconds later still if Python
itself cannot run. Every ending goes through :meth:`RankRun.end`: one report, then
``os._exit``.

Fault injection for tests, never set by dsenv: ``DSENV_DISTRIBUTED_TEST_FAULT`` (see
:func:`parse_fault`).
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import secrets
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import ranks

FAULT_VARIABLE = "DSENV_DISTRIBUTED_TEST_FAULT"
FAULT_STAGES = ("start", "init", "check", "bandwidth")
# Ranks other than 0 stop this long after rank 0's deadline, so that rank 0 names the
# culprit first (a rank that reported first would look like one that exited).
PEER_LAG_S = 2.0
# faulthandler's hard stop after the deadline, for a process whose Python cannot run.
HARD_STOP_AFTER_S = 4.0
# After a collective raised, how long to wait for the liveness channel to say who left.
SETTLE_S = 1.0
POLL_S = 0.1
VISIBILITY_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Fault:
    """A fault the test suite injects into one rank: ``action`` before ``stage``."""

    action: str  # "exit" (os._exit(code)) or "hang" (the main thread sleeps forever)
    rank: int
    stage: str  # start (before the rendezvous), init, check (first all-reduce), bandwidth
    code: int = 1

    def describe(self) -> str:
        what = f"exits with code {self.code}" if self.action == "exit" else "sleeps forever"
        return f"{FAULT_VARIABLE}: rank {self.rank} {what} before '{self.stage}'"


_FAULT = re.compile(r"(exit|hang)(?:=(\d+))?:(\d+)(?:@([a-z]+))?")


def parse_fault(value: str | None) -> Fault | None:
    """``DSENV_DISTRIBUTED_TEST_FAULT=ACTION[=CODE]:RANK[@STAGE]``, a test-only hook.

    ``exit=3:1@check``: rank 1 exits with code 3 before its first all-reduce;
    ``hang:1@init``: rank 1's main thread sleeps forever before init_process_group.
    ACTION is exit or hang, CODE defaults to 1, STAGE to check. Anything else is a
    ValueError: a mistyped value never passes silently, and no other variable triggers it.
    """
    if value is None or not value.strip():
        return None
    match = _FAULT.fullmatch(value.strip())
    if not match or (match.group(4) or "check") not in FAULT_STAGES:
        raise ValueError(f"{FAULT_VARIABLE}={value!r}: write ACTION[=CODE]:RANK[@STAGE] with "
                         f"ACTION exit|hang and STAGE {'|'.join(FAULT_STAGES)} (a test hook)")
    action, code, rank, stage = match.groups()
    return Fault(action, int(rank), stage or "check", int(code or 1))


# -- this rank's record ------------------------------------------------------------------------
def socket_interface(master_addr: str, env: Mapping[str, str], backend: str
                     ) -> tuple[str, str | None]:
    """(interface, local address) this rank's sockets use towards ``master_addr``: the one
    NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME names, else the one the routing table picks."""
    import psutil

    variable = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
    addresses = {name: [a.address for a in entries if a.family in (socket.AF_INET,
                                                                    socket.AF_INET6)]
                 for name, entries in psutil.net_if_addrs().items()}
    chosen = env.get(variable, "").strip()
    if chosen:
        first = chosen.split(",")[0].lstrip("^=")
        found = addresses.get(first) or [None]
        return f"{chosen} ({variable})", found[0]
    try:
        family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((master_addr, 9))  # UDP connect sends nothing: it only routes
            local = probe.getsockname()[0]
    except OSError:
        return "?", None
    name = next((n for n, addrs in addresses.items() if local in addrs), "?")
    return name, local


def local_record(info, env: Mapping[str, str], backend: str) -> dict:
    """What this rank reports about itself (see doctor/probes/ranks.py)."""
    visible = next((f"{v}={env[v]}" for v in VISIBILITY_VARIABLES if v in env), "")
    record = {"rank": info.rank, "local_rank": info.local_rank, "world_size": info.world_size,
              "local_size": info.local_size, "launcher": info.launcher,
              "host": socket.gethostname(), "pid": os.getpid(), "visible": visible,
              "device": "cpu", "device_name": None, "device_uuid": None,
              "device_bus_id": None, "device_numa": None}
    if backend == "nccl":
        import torch

        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        bus = None
        if getattr(props, "pci_bus_id", None) is not None:
            bus = (f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:"
                   f"{getattr(props, 'pci_device_id', 0):02x}.0")
        record.update(device=f"cuda:{index}", device_name=props.name,
                      device_uuid=str(uuid) if uuid is not None else None, device_bus_id=bus)
        if bus:
            try:
                record["device_numa"] = int(Path(f"/sys/bus/pci/devices/{bus}/numa_node")
                                            .read_text())
            except (OSError, ValueError):
                pass
    try:
        record["numa"] = ranks.numa_nodes_of(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        record["numa"] = []
    record["interface"], record["address"] = socket_interface(info.master_addr or "127.0.0.1",
                                                              env, backend)
    return record


# -- the run ------------------------------------------------------------------------------------
class RunFailure(Exception):
    """The run cannot go on; ``kind`` says how it ended (aborted: rank 0 said so; store: the
    rendezvous could not be opened or reached)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class RankRun:
    """One rank's whole run; :meth:`run` never returns (every ending is :meth:`end`)."""

    def __init__(self, plan, info, env: Mapping[str, str], emit: Callable[[dict], int]):
        self.plan, self.info, self.env, self.emit = plan, info, env, emit
        self.rank, self.world = info.rank, info.world_size
        self.started = time.monotonic()
        self.deadline = self.started + plan.timeout_s
        if plan.deadline_epoch:
            self.deadline = min(self.deadline, self._from_epoch(plan.deadline_epoch))
        if self.rank != 0:
            self.deadline += PEER_LAG_S
        self.backend = "gloo"
        self.sizes: list[int] = []
        self.step_names: list[str] = ["start", "rendezvous"]
        self.step_index = 0
        self.prefix = f"dsenv-doctor/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        self.store = None
        self.records: dict[int, dict] = {}
        self.exited: dict[int, int] = {}
        self.rank0_done = False
        self.rows: list[dict] = []
        self.timing = {}
        self.fault = plan.fault if plan.fault and plan.fault.rank == self.rank else None
        self._end_lock = threading.Lock()
        self._ending: str | None = None
        self._finished = threading.Event()
        self._liveness = None

    # -- time ----------------------------------------------------------------------------
    @staticmethod
    def _from_epoch(epoch: float) -> float:
        return time.monotonic() + (epoch - time.time())

    def remaining(self) -> float:
        return max(0.1, self.deadline - time.monotonic())

    def _arm_hard_stop(self) -> None:
        faulthandler.dump_traceback_later(self.remaining() + HARD_STOP_AFTER_S, exit=True)

    def _timedelta(self, extra: float = 0.0):
        import datetime

        return datetime.timedelta(seconds=self.remaining() + extra)

    # -- steps -----------------------------------------------------------------------------
    def enter(self, name: str) -> None:
        self.step_index = self.step_names.index(name)
        if self.store is not None:
            self.store.set(f"{self.prefix}step/{self.rank}", str(self.step_index))

    def fault_point(self, stage: str) -> None:
        if self.fault is None or self.fault.stage != stage:
            return
        print(f"dsenv doctor --distributed: {self.fault.describe()}", file=sys.stderr,
              flush=True)
        if self.fault.action == "exit":
            os._exit(self.fault.code)
        while True:  # hang: only this thread stops; the rank's other threads keep answering
            time.sleep(3600)

    # -- the run -----------------------------------------------------------------------------
    def run(self):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # before any thread starts
        threading.Thread(target=self._take_sigterm, daemon=True, name="sigterm").start()
        threading.Thread(target=self._watchdog, daemon=True, name="watchdog").start()
        self._arm_hard_stop()
        try:
            self._run()
        except RunFailure as exc:
            self.end(exc.kind, str(exc))
        except Exception as exc:  # a collective or the store failed: find out who left
            self._settle(SETTLE_S if self.rank == 0 else 3 * SETTLE_S)
            self.end("error", f"{type(exc).__name__}: {_first_line(exc)}")
        self.end("ok")

    def _run(self) -> None:
        import torch

        if torch.cuda.is_available():  # CUDA or ROCm; RCCL answers to "nccl"
            torch.cuda.set_device(self.info.local_rank % torch.cuda.device_count())
            self.backend = "nccl"
        self.sizes = self.plan.sizes_for(self.backend)
        self.step_names = ["start", "rendezvous", "init",
                           *[f"all-reduce check {ranks.format_size(s)}" for s in self.sizes],
                           *[f"bandwidth {ranks.format_size(s)}" for s in self.sizes],
                           "gather", "done"]
        record = local_record(self.info, self.env, self.backend)
        self.records[self.rank] = record
        self.fault_point("start")
        started = time.monotonic()
        self._open_store()
        self.enter("rendezvous")
        self.store.set(f"{self.prefix}identity/{self.rank}", json.dumps(record))
        go = self._rank0_rendezvous() if self.rank == 0 else self._peer_rendezvous()
        self.timing["rendezvous_s"] = time.monotonic() - started
        self.fault_point("init")
        self.enter("init")
        import torch.distributed as dist

        started = time.monotonic()
        dist.init_process_group(self.backend, store=self.store, rank=self.rank,
                                world_size=self.world, timeout=self._timedelta(5.0))
        self.timing["init_s"] = time.monotonic() - started
        self._collectives(go["seed"])
        self.step_index = self.step_names.index("done")  # not in the store: rank 0 may be gone
        if self.rank == 0:  # keep the store up until every rank is through
            self._liveness.wait_done(self.world - 1)
            self._liveness.broadcast("done")
        else:
            self._liveness.send("done")

    # -- rendezvous ----------------------------------------------------------------------------
    def _open_store(self) -> None:
        import torch.distributed as dist

        agent = self.env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        serve = self.rank == 0 and not agent
        addr, port = self.info.master_addr, self.info.master_port
        try:  # a peer gives up just before its deadline, with the clearer message
            self.store = dist.TCPStore(addr, port, self.world, serve, self._timedelta(-0.5),
                                       wait_for_workers=False)
        except Exception as exc:
            if serve:
                raise RunFailure("store", f"rank 0 cannot serve the rendezvous on port "
                                 f"{port}: {_first_line(exc)} (is another job using "
                                 f"MASTER_PORT={port}?)") from None
            raise RunFailure("store", f"rank 0's rendezvous at {addr}:{port} never answered: "
                             "rank 0 did not start, or MASTER_ADDR/MASTER_PORT differ "
                             "between ranks") from None

    def _rank0_rendezvous(self) -> dict:
        self._liveness = LivenessServer(self)
        self._liveness.start()
        self.store.set(f"{self.prefix}rank0", json.dumps(
            {"port": self._liveness.port, "deadline_epoch": time.time() + self.remaining()}))
        keys = [f"{self.prefix}identity/{r}" for r in range(self.world)]
        self.store.wait(keys, self._timedelta(1.0))  # the watchdog, naming who is missing, first
        for r in range(self.world):
            self.records[r] = json.loads(self.store.get(keys[r]))
        problems = self.record_problems()
        if problems:
            go = {"ok": False, "reason": problems[0]}
        else:
            go = {"ok": True, "seed": secrets.randbits(31)}
        self.store.set(f"{self.prefix}go", json.dumps(go))
        if not go["ok"]:
            raise RunFailure("aborted", "; ".join(problems))
        return go

    def record_problems(self) -> list[str]:
        problems = []
        worlds = {r: rec.get("world_size") for r, rec in self.records.items()}
        odd = [r for r, w in worlds.items() if w != self.world]
        if odd:
            problems.append("ranks disagree on the world size: " + ", ".join(
                f"{ranks.rank_name(r, self.hosts())} says {worlds[r]}" for r in odd)
                + f", rank 0 says {self.world}")
        for device, shared in ranks.shared_devices(self.records.values()):
            problems.append(f"ranks {', '.join(map(str, shared))} share one GPU ({device}): "
                            "each rank needs its own")
        return problems

    def _peer_rendezvous(self) -> dict:
        rank0 = json.loads(self.store.get(f"{self.prefix}rank0"))
        self.deadline = self._from_epoch(rank0["deadline_epoch"]) + PEER_LAG_S
        self._arm_hard_stop()
        self._liveness = LivenessClient(self, self.info.master_addr, rank0["port"])
        self._liveness.start()
        self.store.wait([f"{self.prefix}go"], self._timedelta(1.0))
        go = json.loads(self.store.get(f"{self.prefix}go"))
        if not go["ok"]:
            raise RunFailure("aborted", "rank 0 stopped the run: " + go["reason"])
        return go

    def hosts(self) -> dict[int, str]:
        return {r: rec.get("host") for r, rec in self.records.items()}

    # -- the collectives -------------------------------------------------------------------------
    def _collectives(self, seed: int) -> None:
        import torch
        import torch.distributed as dist

        device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" \
            else torch.device("cpu")

        def sync():
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        n = self.world
        bound = ranks.exact_value_bound(n)
        generator = torch.Generator(device=device)
        buffers = []
        for i, size in enumerate(self.sizes):
            if i == 0:
                self.fault_point("check")
            self.enter(f"all-reduce check {ranks.format_size(size)}")
            count = max(1, size // 4)
            generator.manual_seed(seed + i)  # the same A and B on every rank
            a = torch.randint(-bound, bound + 1, (count,), generator=generator, device=device,
                              dtype=torch.int32).to(torch.float32)
            b = torch.randint(1, bound + 1, (count,), generator=generator, device=device,
                              dtype=torch.int32).to(torch.float32)
            b *= torch.randint(0, 2, (count,), generator=generator, device=device,
                               dtype=torch.int32).to(torch.float32) * 2 - 1
            x = a + ranks.rank_coefficient(self.rank) * b  # differs per rank, never all 0
            dist.all_reduce(x)
            sync()
            expected = n * a + ranks.coefficient_sum(n) * b
            wrong = x != expected
            count_wrong = int(wrong.sum())
            row = {"bytes": count * 4, "count": count, "type": "float", "redop": "sum",
                   "wrong": count_wrong}
            if count_wrong:
                at = int(wrong.nonzero()[0])
                row["first_wrong"] = {"index": at, "got": float(x[at]),
                                      "expected": float(expected[at])}
            self.rows.append(row)
            del a, b, expected, wrong
            buffers.append(x)
        times = []
        for i, size in enumerate(self.sizes):
            if i == 0:
                self.fault_point("bandwidth")
            self.enter(f"bandwidth {ranks.format_size(size)}")
            times.append(timed_allreduce(buffers[i], self.plan.warmup_for(self.backend),
                                         self.plan.iters_for(self.backend)))
        self.enter("gather")
        # nccl-tests reports the time averaged over the ranks (its -a 1 default)
        gathered = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(gathered)
        for row, total in zip(self.rows, gathered.tolist(), strict=True):
            seconds = total / n
            algbw = ranks.algorithm_bandwidth(row["bytes"], seconds)
            row.update(time_us=seconds * 1e6, algbw_gbps=algbw,
                       busbw_gbps=ranks.bus_bandwidth(algbw, n))

    # -- endings -------------------------------------------------------------------------------
    def _watchdog(self) -> None:
        while not self._finished.wait(POLL_S):
            if time.monotonic() >= self.deadline:
                self.end("timeout")

    def _take_sigterm(self) -> None:
        signal.sigwait({signal.SIGTERM})
        if self._ending == "ok":  # the report is written: stop now, as SIGTERM asks
            os._exit(128 + signal.SIGTERM)
        self._settle()
        self.end("terminated")

    def _settle(self, seconds: float = SETTLE_S) -> None:
        """Give the liveness channel a moment to learn who left (a collective raises as soon
        as a peer's connection drops, about when rank 0 hears of it and tells the others)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.exited and self._ending is None:
            time.sleep(0.02)

    def peer_exited(self, rank: int) -> None:
        """Rank 0's liveness thread: ``rank``'s connection closed before it said done."""
        self.exited[rank] = self._read_step(rank)
        self.end("exited")

    def rank0_lost(self) -> None:
        self.exited[0] = self._read_step(0)
        self.end("rank0-exited")

    def _read_step(self, rank: int) -> int | None:
        steps = self._read_progress(only=[rank])
        return steps.get(rank)

    def _read_progress(self, only=None) -> dict[int, int]:
        """Each rank's last step from the store, on a connection of our own (the main thread
        may be blocked in a call on the shared one)."""
        if self.store is None:
            return {}
        steps = {}
        try:
            store = self.store.clone()
            import datetime

            store.set_timeout(datetime.timedelta(seconds=2))
            for rank in range(self.world) if only is None else only:
                key = f"{self.prefix}step/{rank}"
                if store.check([key]):
                    steps[rank] = int(store.get(key))
                identity = f"{self.prefix}identity/{rank}"
                if rank not in self.records and store.check([identity]):
                    self.records[rank] = json.loads(store.get(identity))
        except Exception:  # the store is gone with rank 0: report what is known
            pass
        return steps

    def end(self, kind: str, message: str | None = None):
        """Report once, then exit the process. Other callers wait for that exit."""
        with self._end_lock:
            waiting = self._ending is not None
            if not waiting:
                self._ending = kind
        while waiting:  # the first caller reports and exits the process
            time.sleep(3600)
        self._finished.set()
        code = 1
        try:
            outcome = self.outcome(kind, message)
            if kind != "ok" and self.rank == 0 and self._liveness is not None:
                self._liveness.broadcast("abort " + json.dumps(
                    outcome["failure"]["message"]))
            faulthandler.cancel_dump_traceback_later()
            if kind == "ok":
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            code = self.emit(outcome)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def outcome(self, kind: str, message: str | None) -> dict:
        outcome = {
            "rank": self.rank, "launcher": self.info.launcher, "backend": self.backend,
            "world_size": self.world, "master": f"{self.info.master_addr}:{self.info.master_port}",
            "timeout_s": self.plan.timeout_s, "seconds": time.monotonic() - self.started,
            "warmup": self.plan.warmup_for(self.backend),
            "iters": self.plan.iters_for(self.backend),
            "ranks": [self.records[r] for r in sorted(self.records)],
            "allreduce": self.rows, "timing": self.timing, "failure": None,
            "fault_injected": self.plan.fault.describe() if self.plan.fault else None,
        }
        if kind == "ok":
            return outcome
        at = self.step_names[self.step_index]
        steps = self._read_progress()
        steps.setdefault(self.rank, self.step_index)
        hosts = self.hosts()
        if self.info.local_size == self.world:  # one node: a rank that never came was ours
            here = self.records[self.rank]["host"] if self.rank in self.records else None
            hosts = {r: hosts.get(r) or here for r in range(self.world)}
        if kind == "aborted":
            culprits = []
        elif self.store is None and self.rank == 0:
            culprits = []
        elif self.store is None:  # this rank never saw the others
            culprits = [{"rank": 0, "host": None, "state": "absent", "step": None,
                         "detail": f"rank 0's rendezvous at {outcome['master']} never "
                                   "answered"}]
        else:
            culprits = ranks.diagnose(self.world, hosts, steps, self.exited, self.step_names)
        cause = {"timeout": f"the run did not finish within {self.plan.timeout_s:g} s",
                 "terminated": "the launcher terminated this rank (SIGTERM)",
                 "error": f"this rank saw {message}"}.get(kind)
        if kind == "aborted" or (kind == "store" and not culprits):
            text = message or "rank 0 stopped the run"
        elif culprits:
            text = "; ".join(c["detail"] for c in culprits) + (f" ({cause})" if cause else "")
        elif kind == "timeout":
            text = (f"every rank reached '{at}' and it did not complete within "
                    f"{self.plan.timeout_s:g} s: no rank is behind, the transport stalls")
        else:
            text = cause or message or kind
        if kind == "store" and culprits:
            text = message or text
        outcome["ranks"] = [self.records[r] for r in sorted(self.records)]
        outcome["failure"] = {"kind": kind, "message": text, "step": at,
                              "culprits": culprits}
        return outcome


def timed_allreduce(x, warmup: int, iters: int) -> float:
    """Seconds per in-place all-reduce of ``x`` as nccl-tests times it: ``warmup`` untimed
    ones, a barrier, then ``iters`` back to back, timed to the completion of the last."""
    import torch
    import torch.distributed as dist

    on_gpu = x.device.type == "cuda"

    def sync():
        if on_gpu:
            torch.cuda.synchronize(x.device)

    for _ in range(warmup):
        dist.all_reduce(x)
    sync()
    if on_gpu:
        dist.barrier(device_ids=[x.device.index])
    else:
        dist.barrier()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    sync()
    return (time.perf_counter() - start) / iters


def message_of(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return message_of(lines[0].strip()) if lines else type(exc).__name__


# -- liveness ----------------------------------------------------------------------------------
class LivenessServer(threading.Thread):
    """Rank 0's end: one connection per rank; a close without 'done' is a rank that left."""

    def __init__(self, run: RankRun):
        super().__init__(daemon=True, name="liveness")
        self.run_ = run
        if socket.has_dualstack_ipv6():
            self.sock = socket.create_server(("", 0), family=socket.AF_INET6,
                                             dualstack_ipv6=True)
        else:
            self.sock = socket.create_server(("", 0))
        self.port = self.sock.getsockname()[1]
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.sock, selectors.EVENT_READ)
        self.peers: dict[socket.socket, dict] = {}
        self.gone_done = 0  # ranks that said done and closed their connection
        self.lock = threading.Lock()

    def run(self) -> None:
        while True:
            for key, _ in self.selector.select(timeout=0.5):
                if key.fileobj is self.sock:
                    conn, _ = self.sock.accept()
                    conn.setblocking(False)
                    with self.lock:
                        self.peers[conn] = {"rank": None, "buffer": b"", "done": False}
                    self.selector.register(conn, selectors.EVENT_READ)
                    continue
                self._read(key.fileobj)

    def _read(self, conn: socket.socket) -> None:
        peer = self.peers[conn]
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(conn)
            with self.lock:
                self.peers.pop(conn, None)
                self.gone_done += peer["done"]
            conn.close()
            if peer["rank"] is not None and not peer["done"]:
                self.run_.peer_exited(peer["rank"])
            return
        peer["buffer"] += data
        while b"\n" in peer["buffer"]:
            line, peer["buffer"] = peer["buffer"].split(b"\n", 1)
            word, _, rest = line.decode(errors="replace").partition(" ")
            if word == "rank" and rest.strip().isdigit():
                peer["rank"] = int(rest)
            elif word == "done":
                peer["done"] = True

    def wait_done(self, peers: int) -> None:
        """Until ``peers`` ranks said done (the watchdog ends a wait that never ends)."""
        while True:
            with self.lock:
                done = sum(p["done"] for p in self.peers.values()) + self.gone_done
            if done >= peers:
                return
            time.sleep(0.005)

    def broadcast(self, line: str) -> None:
        with self.lock:
            peers = list(self.peers)
        for conn in peers:
            try:
                conn.send((line + "\n").encode())
            except OSError:
                pass


class LivenessClient(threading.Thread):
    """A peer's end: an 'abort' line from rank 0 stops this rank; so does rank 0's exit."""

    def __init__(self, run: RankRun, host: str, port: int):
        super().__init__(daemon=True, name="liveness")
        self.run_ = run
        self.sock = socket.create_connection((host, port), timeout=run.remaining())
        self.sock.settimeout(None)
        self.send(f"rank {run.rank}")

    def send(self, line: str) -> None:
        try:
            self.sock.sendall((line + "\n").encode())
        except OSError:
            pass

    def run(self) -> None:
        buffer = b""
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                if not self.run_.rank0_done:
                    self.run_.rank0_lost()
                return
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                word, _, rest = line.decode(errors="replace").partition(" ")
                if word == "done":
                    self.run_.rank0_done = True
                elif word == "abort":
                    self.run_.end("aborted", "rank 0 stopped the run: " + json.loads(rest))
