"""One rank of ``dsenv doctor --distributed``: rendezvous, torch.distributed, the all-reduce
checks and timings (:mod:`.allreduce`), under a deadline that no peer can break.

Side channel (keys under ``dsenv-doctor/<restart>/`` in the job's TCPStore: rank 0 serves it
on MASTER_PORT, or torchrun's agent does):

==============  ============================================================================
identity/<r>    rank r's record (:mod:`.record`), JSON
fingerprint/<d> the environment table whose digest is d (:mod:`.fingerprint`),
                JSON: set by the first rank that has it, read by rank 0 once per digest
step/<r>        index of the step rank r last entered (rendezvous, init, check 1 MiB, ...)
rank0           rank 0's liveness port and its deadline (epoch seconds), JSON
go              rank 0's word after the rendezvous: the random seed and the host pairs to
                time (:mod:`.pairs`), or why the run stops
==============  ============================================================================

Liveness (:mod:`.liveness`): every rank keeps one TCP connection to rank 0, so
rank 0 knows at once which rank exited (and the ranks know when rank 0 did). A rank that is
alive but stuck is found when the deadline comes: it is the one whose step is behind the
others'. Rank 0 then names it, tells the others to stop (an ``abort`` line on their
connection) and exits 1.

Nothing waits without a deadline: the watchdog thread ends the run at the deadline whatever
the main thread is blocked in (torch releases the GIL in collectives and store calls),
SIGTERM from a launcher (torchrun stops every rank when one fails) is taken by a thread that
reports first, and ``faulthandler`` kills the process a few seconds later still if Python
itself cannot run. Every ending goes through :meth:`RankRun.end`: one report, then
``os._exit``.

Fault injection for tests, never set by dsenv: ``DSENV_DISTRIBUTED_TEST_FAULT`` (see
:func:`.command.parse_fault`).
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import secrets
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping

from dsenv.doctor.distributed import fingerprint as fingerprints
from dsenv.doctor.distributed import ranks
from dsenv.doctor.distributed.allreduce import check_and_time
from dsenv.doctor.distributed.liveness import LivenessClient, LivenessServer
from dsenv.doctor.distributed.outcome import (
    AllreduceRow,
    Culprit,
    Failure,
    Outcome,
    PairPlan,
    RankRecord,
    Timing,
)
from dsenv.doctor.distributed.pairs import plan_pairs
from dsenv.doctor.distributed.record import local_record

# Ranks other than 0 stop this long after rank 0's deadline, so that rank 0 names the
# culprit first (a rank that reported first would look like one that exited).
PEER_LAG_S = 2.0
# faulthandler's hard stop after the deadline, for a process whose Python cannot run.
HARD_STOP_AFTER_S = 4.0
# After a collective raised, how long to wait for the liveness channel to say who left.
SETTLE_S = 1.0
POLL_S = 0.1


# -- the run ------------------------------------------------------------------------------------
class RunFailure(Exception):
    """The run cannot go on; ``kind`` says how it ended (aborted: rank 0 said so; store: the
    rendezvous could not be opened or reached)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class RankRun:
    """One rank's whole run; :meth:`run` never returns (every ending is :meth:`end`)."""

    def __init__(self, plan, info, env: Mapping[str, str], emit: Callable[[Outcome], int]):
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
        self.records: dict[int, RankRecord] = {}
        self.exited: dict[int, int] = {}
        self.errors: dict[int, str] = {}  # rank -> the error it left in the store
        self.rank0_done = False
        self.rows: list[AllreduceRow] = []
        self.timing = Timing()
        self.environment: dict | None = None  # rank 0: the fingerprints compared
        self.pair_plan: PairPlan | None = None  # the host pairs to time (rank 0 adds rows)
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
            said = f"{type(exc).__name__}: {_first_line(exc)}"
            if self.rank != 0:
                self._leave_word(said)
            self._settle(SETTLE_S if self.rank == 0 else 3 * SETTLE_S)
            self.end("error", said)
        self.end("ok")

    def _run(self) -> None:
        import torch  # torch: only the ranks need it, never `dsenv --help` or a plain doctor run

        if torch.cuda.is_available():  # CUDA or ROCm; RCCL answers to "nccl"
            torch.cuda.set_device(self.info.local_rank % torch.cuda.device_count())
            self.backend = "nccl"
        self.sizes = self.plan.sizes_for(self.backend)
        self.step_names = ["start", "rendezvous", "init",
                           *[f"all-reduce check {ranks.format_size(s)}" for s in self.sizes],
                           *[f"bandwidth {ranks.format_size(s)}" for s in self.sizes],
                           "gather", "host pairs", "done"]
        record = local_record(self.info, self.env, self.backend)
        record["fingerprint"], table = fingerprints.record_part(
            fingerprints.local_fingerprint(self.env, self.backend))
        self.records[self.rank] = record
        self.fault_point("start")
        started = time.monotonic()
        self._open_store()
        self.enter("rendezvous")
        key = f"{self.prefix}fingerprint/{record['fingerprint']['digest']}"
        if not self.store.check([key]):  # identical environments send their table once
            self.store.set(key, json.dumps(table))
        record["arrived_epoch"] = round(time.time(), 4)
        self.store.set(f"{self.prefix}identity/{self.rank}", json.dumps(record))
        go = self._rank0_rendezvous() if self.rank == 0 else self._peer_rendezvous()
        self.timing.rendezvous_s = time.monotonic() - started
        self.fault_point("init")
        self.enter("init")
        import torch.distributed as dist  # torch: only the ranks need it

        started = time.monotonic()
        dist.init_process_group(self.backend, store=self.store, rank=self.rank,
                                world_size=self.world, timeout=self._timedelta(5.0))
        self.timing.init_s = time.monotonic() - started
        check_and_time(self, go["seed"])
        self.step_index = self.step_names.index("done")  # not in the store: rank 0 may be gone
        if self.rank == 0:  # keep the store up until every rank is through
            self._liveness.wait_done(self.world - 1)
            self._liveness.broadcast("done")
        else:
            self._liveness.send("done")

    # -- rendezvous ----------------------------------------------------------------------------
    def _open_store(self) -> None:
        import torch.distributed as dist  # torch: only the ranks need it

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

    def _port(self) -> int:
        """The rendezvous port: the store's own (one process asks the kernel for one)."""
        return getattr(self.store, "port", None) or self.info.master_port

    def _rank0_rendezvous(self) -> dict:
        self._liveness = LivenessServer(self)
        self._liveness.start()
        self.store.set(f"{self.prefix}rank0", json.dumps(
            {"port": self._liveness.port, "deadline_epoch": time.time() + self.remaining()}))
        keys = [f"{self.prefix}identity/{r}" for r in range(self.world)]
        self.store.wait(keys, self._timedelta(1.0))  # the watchdog, naming who is missing, first
        for r in range(self.world):
            self.records[r] = json.loads(self.store.get(keys[r]))
        tables, distinct = fingerprints.fetch_tables(self.records, lambda d: json.loads(
            self.store.get(f"{self.prefix}fingerprint/{d}")))
        self.environment = fingerprints.compare(self.records, tables, distinct)
        problems = self.record_problems()
        if problems:
            go = {"ok": False, "reason": problems[0]}
        else:
            self.pair_plan = plan_pairs(self.records)
            go = {"ok": True, "seed": secrets.randbits(31), "pairs": self.pair_plan.pairs}
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
        self.pair_plan = PairPlan(pairs=go.get("pairs", []))
        return go

    def hosts(self) -> dict[int, str]:
        return {r: rec.get("host") for r, rec in self.records.items()}

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

    def _leave_word(self, said: str) -> None:
        """Why this rank stops, under ``error/<rank>`` for rank 0 to quote (gloo's "Unable to
        find address for: hsn0" names the cause on the host that has it)."""
        if self.store is None:
            return
        try:
            store = self.store.clone()
            store.set_timeout(datetime.timedelta(seconds=2))
            store.set(f"{self.prefix}error/{self.rank}", said)
        except Exception:  # the store is gone with rank 0: rank 0 is not listening either
            pass

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
            store.set_timeout(datetime.timedelta(seconds=2))
            for rank in range(self.world) if only is None else only:
                key = f"{self.prefix}step/{rank}"
                if store.check([key]):
                    steps[rank] = int(store.get(key))
                identity = f"{self.prefix}identity/{rank}"
                if rank not in self.records and store.check([identity]):
                    self.records[rank] = json.loads(store.get(identity))
                error = f"{self.prefix}error/{rank}"
                if rank in self.exited and store.check([error]):
                    self.errors[rank] = store.get(error).decode(errors="replace")
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
                self._liveness.broadcast("abort " + json.dumps(outcome.failure.message))
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

    def outcome(self, kind: str, message: str | None) -> Outcome:
        outcome = Outcome(
            rank=self.rank, launcher=self.info.launcher, backend=self.backend,
            world_size=self.world, master=f"{self.info.master_addr}:{self._port()}",
            timeout_s=self.plan.timeout_s, seconds=time.monotonic() - self.started,
            warmup=self.plan.warmup_for(self.backend), iters=self.plan.iters_for(self.backend),
            ranks=[self.records[r] for r in sorted(self.records)], allreduce=self.rows,
            timing=self.timing, environment=self.environment, pairs=self.pair_plan,
            fault_injected=self.plan.fault.describe() if self.plan.fault else None,
            from_run=True)
        if kind == "ok":
            return outcome
        at = self.step_names[self.step_index]
        steps = self._read_progress()
        steps.setdefault(self.rank, self.step_index)
        hosts = self.hosts()
        if self.info.local_size == self.world:  # one node: a rank that never came was ours
            here = self.records[self.rank]["host"] if self.rank in self.records else None
            hosts = {r: hosts.get(r) or here for r in range(self.world)}
        else:  # several nodes: Slurm's layout names the host of a rank that never reported
            hosts = {**ranks.slurm_step_hosts(self.env, self.world),
                     **{r: h for r, h in hosts.items() if h}}
        if kind == "aborted":
            culprits = []
        elif self.store is None and self.rank == 0:
            culprits = []
        elif self.store is None:  # this rank never saw the others
            culprits = [Culprit(0, None, "absent", None,
                                f"rank 0's rendezvous at {outcome.master} never answered")]
        else:
            culprits = ranks.diagnose(self.world, hosts, steps, self.exited, self.step_names)
            for culprit in culprits:
                if culprit.rank in self.errors:
                    culprit.detail += f"; it said {self.errors[culprit.rank]}"
        cause = {"timeout": f"the run did not finish within {self.plan.timeout_s:g} s",
                 "terminated": "the launcher terminated this rank (SIGTERM)",
                 "error": f"this rank saw {message}"}.get(kind)
        if kind == "aborted" or (kind == "store" and not culprits):
            text = message or "rank 0 stopped the run"
        elif culprits:
            text = "; ".join(c.detail for c in culprits) + (f" ({cause})" if cause else "")
        elif kind == "timeout":
            text = (f"every rank reached '{at}' and it did not complete within "
                    f"{self.plan.timeout_s:g} s: no rank is behind, the transport stalls")
        else:
            text = cause or message or kind
        if kind == "store" and culprits:
            text = message or text
        outcome.ranks = [self.records[r] for r in sorted(self.records)]
        outcome.failure = Failure(kind, text, at, culprits)
        return outcome



def message_of(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return message_of(lines[0].strip()) if lines else type(exc).__name__
