"""Every deadline and wait of a test item and how they relate, stated and checked here.

Built once from the settings (``settings.deadlines``) and handed to whoever waits.  From the inside
out, each layer must act before the one around it:

    gloo:  in-rank timeouts (--init-timeout, --op-timeout)  <  the step deadline
    the suite's watchdog: the step deadline (--step-timeout: no rank reported progress for that
                          long, i.e. no new phase, step, or part of a long step; never more than
                          the case limit), --case-timeout (the whole case: the last net for a case
                          that keeps progressing forever), then the stop ladder (stacks and flight
                          recorder, SIGTERM, SIGKILL, a bounded wait for the reap)
    nccl:  torch's own NCCL watchdog (init_process_group(timeout=...)) is set to fire only after
           the stop ladder has ended, so the suite takes every rank's stack and flight recorder
           first; torch would otherwise SIGABRT the ranks and the first rank to abort would look
           like the root cause
    pytest-timeout's net per item: everything the item may wait for (below) plus OUTER_NET_MARGIN

Besides its own case, a test item may wait for its process's forkserver (to say it is ready, at
the first case or after it died, and to fork the ranks), for the measurement gate (to enter it),
for a device lease (another case on the same GPU, at
most one case bound later), for the ladder's decision on earlier rungs (items on other xdist
workers, each at most a lease wait and a case bound, per rung), and across nodes for the other
nodes to arrive and to send their verdicts.  Each of those waits is bounded here, and the item's
outer net is their sum plus a margin, so pytest-timeout never fires inside a wait that is still
within its bound (it did: killing one xdist worker made the others' ladder waits outlast their
net, and pytest-timeout killed three more).  A wait that runs out decides for itself.

Hangs are decided from progress, not from the case's length: a case that keeps reporting steps
(an 8-rank 64 MiB collective on a loaded CPU reports each part it finishes) is never called hung,
and a step that stops advancing is a hang one step deadline after its last report.

On gloo the in-rank timeout raises inside the rank (a catchable "Timed out"), which keeps the
rank's own phase and traceback, so it comes first there.  On NCCL a timeout is an abort, so the
suite's watchdog comes first.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StopLadder:
    """The watchdog's steps after a deadline, in seconds."""

    dump_wait: float  # for every rank's Python stacks and flight-recorder dump
    term_wait: float  # between SIGTERM and SIGKILL
    kill_wait: float  # after SIGKILL, before a rank still there is named unkillable

    @property
    def total(self) -> float:
        return self.dump_wait + self.term_wait + self.kill_wait


# CPU ranks die within milliseconds of SIGKILL (benchmarks/overhead.py: 0.05 s after a deadline).
CPU_STOP_LADDER = StopLadder(dump_wait=0.5, term_wait=0.5, kill_wait=1.0)
# A SIGKILLed GPU process releases its device memory when the kernel closes its /dev/nvidia*
# descriptors: reported at 0.4-0.8 s for device memory on an H100 and up to 26 s with 243 GB of
# pinned host memory (sgl-project/sglang PR #32829); a CUDA/NCCL ioctl in uninterruptible sleep
# defers even SIGKILL (ai-dynamo/dynamo PR #12710).  Not yet measured by this project on a GPU
# (`python -m conformance smoke` times it): a conservative 10 s until then.  The dump wait allows
# NCCL's flight-recorder dump, which also walks the communicators.
GPU_STOP_LADDER = StopLadder(dump_wait=2.0, term_wait=0.5, kill_wait=10.0)

# torch's NCCL watchdog acts this long after the suite's stop ladder should have ended.
NCCL_WATCHDOG_MARGIN = 30.0
# pytest-timeout's thread method fires this long after a case should have ended.
OUTER_NET_MARGIN = 30.0
# torch's heartbeat monitor aborts a rank whose NCCL watchdog thread is stuck this long (its default).
TORCH_HEARTBEAT_DEFAULT = 480.0
# Beyond the holder's case bound: writing its record and releasing the lease.
LEASE_MARGIN = 10.0
# Beyond the cases a rung decision waits for: recording their outcome.
DECISION_MARGIN = 5.0
# The forkserver imports torch before it says it is ready: seconds on an idle machine, a minute
# on a loaded one; a process waits this long at its first case (and after its server died).
FORKSERVER_READY_WAIT = 120.0
# The forkserver forks a case's ranks and replies at once; this long without a reply, it is stuck.
SPAWN_WAIT = 30.0
# A case stuck where its class leader hung is confirmed after a quarter of the step deadline,
# at least 2 s and at most 10 s (a healthy pair passes a step of 4 bytes in milliseconds; NCCL's
# lazy connection set-up on the first send/recv takes about a second).
CONFIRM_FLOOR, CONFIRM_CAP = 2.0, 10.0
# A step that moves at most SMALL_STEP_BYTES per rank ends in milliseconds on any link a GPU or a CPU
# rank has (1 MiB at 1 GB/s: 1 ms); NCCL's lazy connection set-up on the first send/recv takes about a
# second.  Every rank of a case in the same such step for SMALL_STEP_WAIT seconds is stuck: 5x that
# set-up, while the machine is not saturated (watchdog.machine_saturated); else the step deadline decides.
SMALL_STEP_BYTES = 1 << 20
SMALL_STEP_WAIT = 5.0


@dataclass(frozen=True)
class Deadlines:
    init_timeout: float
    op_timeout: float
    case_timeout: float
    grace: float
    backend: str = "gloo"
    step_timeout: float = 30.0
    rendezvous_timeout: float = 60.0  # nodes waiting for each other at the start
    ladder: StopLadder | None = None  # the backend's stop ladder unless given (the smoke run times its steps)
    forkserver_ready_wait: float = FORKSERVER_READY_WAIT
    spawn_wait: float = SPAWN_WAIT

    @property
    def stop_ladder(self) -> StopLadder:
        if self.ladder is not None:
            return self.ladder
        return GPU_STOP_LADDER if self.backend == "nccl" else CPU_STOP_LADDER

    @property
    def step_deadline(self) -> float:
        """Seconds a case may go without any rank reporting progress before it is a hang."""
        return min(self.step_timeout, self.case_timeout)

    @property
    def case_bound(self) -> float:
        """A case has ended by this many seconds after its ranks started, whatever they do."""
        return self.case_timeout + self.stop_ladder.total

    @property
    def process_group_timeout(self) -> float:
        """The ``timeout`` the ranks give ``init_process_group``."""
        if self.backend == "nccl":
            return self.case_bound + NCCL_WATCHDOG_MARGIN
        return self.op_timeout

    @property
    def heartbeat_timeout(self) -> float | None:
        """TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC when torch's default would act before the suite; else None."""
        if self.backend != "nccl" or self.process_group_timeout < TORCH_HEARTBEAT_DEFAULT:
            return None
        return self.process_group_timeout + NCCL_WATCHDOG_MARGIN

    @property
    def confirm_wait(self) -> float:
        """How long a case stuck where its class leader hung waits before it is stopped (a hang like its class)."""
        step = self.step_deadline
        return min(step, max(CONFIRM_FLOOR, min(CONFIRM_CAP, step / 4)))

    @property
    def small_step_wait(self) -> float:
        """How long every rank may sit in the same small step (SMALL_STEP_BYTES) before the case is stuck."""
        return min(self.step_deadline, SMALL_STEP_WAIT)

    @property
    def turn_wait(self) -> float:
        """How long a case waits for its measurement turn (and to enter the gate) before it goes on anyway.

        Other cases' measurements take seconds; a step deadline is plenty, and it keeps the wait inside
        the case limit.  A figure timed without its turn says so (``measured_alone`` false).
        """
        return self.step_deadline

    @property
    def lease_wait(self) -> float:
        """How long a case waits for its devices: the case holding them has ended by then."""
        return self.case_bound + LEASE_MARGIN

    @property
    def rung_step(self) -> float:
        """The longest one earlier rung of a ladder decision can take: its lease wait and its case."""
        return self.lease_wait + self.case_bound + DECISION_MARGIN

    def rung_wait(self, earlier: int) -> float:
        """How long a rung decision with ``earlier`` rungs before it waits (0 on the first rung).

        Its own earlier rungs, then its class leader's rungs up to this one, each at most a rung step
        after the one before.  Rungs the relevance table rules out are not counted: nothing runs them.
        """
        return (earlier + 1) * self.rung_step if earlier > 0 else 0.0

    @property
    def node_progress_limit(self) -> float:
        """How long a node may stay in one test before the others stop waiting for it at a cross-node case."""
        return self.rendezvous_timeout + self.case_bound + self.grace + OUTER_NET_MARGIN

    @property
    def verdict_wait(self) -> float:
        """How long a node waits for the others' verdicts once its own part of a case is over."""
        return self.case_bound + self.grace + OUTER_NET_MARGIN

    @property
    def start_wait(self) -> float:
        """How long a case may wait before its ranks run: its forkserver ready, the ranks forked, the gate entered."""
        return self.forkserver_ready_wait + self.spawn_wait + self.turn_wait

    def item_waits(self, rung_index: int, across_nodes: bool) -> float:
        """Everything one test item on rung ``rung_index`` may wait for, its own case included."""
        nodes = self.node_progress_limit + self.verdict_wait if across_nodes else 0.0
        return self.rung_wait(rung_index) + self.lease_wait + self.start_wait + self.case_bound + nodes

    def outer_net(self, rung_index: int = 0, across_nodes: bool = False) -> float:
        """pytest-timeout's limit for the item: above every wait it may make."""
        return self.item_waits(rung_index, across_nodes) + OUTER_NET_MARGIN

    def in_rank_too_late(self) -> list[tuple[str, float]]:
        """The in-rank timeouts (name, seconds) that would not fire before the step deadline.

        The one rule of the layers that settings can break: every other wait is derived from the
        ones inside it with a margin.  ``settings`` names where each value came from.
        """
        timeouts = (("init_timeout", self.init_timeout), ("op_timeout", self.op_timeout))
        return [(name, value) for name, value in timeouts if value >= self.step_deadline]
