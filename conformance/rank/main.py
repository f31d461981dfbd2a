"""The life of one rank, from the fork to os._exit.

start -> control (every rank checks in at the store) -> init (process group) -> probe/verify
-> teardown.  The result goes to result.json; the exit code only backs it up.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import signal
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from conformance.common import casefiles, lifetime
from conformance.common.casefiles import CaseFile, RankResult, RankStatus
from conformance.common.clock import wall
from conformance.rank import flight_recorder
from conformance.rank.context import RankContext, RankSkip, WrongData

EXIT_STEP = "result written; exit"


def die_with_parent(expected_parent: int) -> None:
    """SIGKILL this process when its parent (the forkserver, or the pytest process) dies."""
    if not lifetime.die_with_parent(expected_parent):
        os._exit(casefiles.EXIT_HARNESS)


def redirect_output(rank_path: Path) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    out = os.open(rank_path / casefiles.STDOUT, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    err = os.open(rank_path / casefiles.STDERR, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for src, dst in ((devnull, 0), (out, 1), (err, 2)):
        os.dup2(src, dst)
        os.close(src)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def apply_case_env(case: CaseFile, rank: int) -> None:
    """The environment ``launch.environment`` built for this rank, applied as it is."""
    for name in case.env_unset:
        os.environ.pop(name, None)
    os.environ.update(case.rank_env[rank])


def one_cpu_thread_unless_asked() -> None:
    """One intra-op CPU thread per rank, as torchrun sets it, unless OMP_NUM_THREADS says otherwise.

    A rank's own CPU work is small (filling and checking buffers); with torch's default of one
    OpenMP thread per core, every rank's idle OpenMP threads spin after each operation: a simulated
    8-GPU run on two cores spent a third of its CPU time in libgomp (perf), on a GPU box they would
    take cores from NCCL's proxy threads.
    """
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(1)


def store_barrier(ctx: RankContext, store: Any, name: str, timeout: float) -> None:
    store.set(f"conformance/{name}/{ctx.rank}", "1")
    store.wait([f"conformance/{name}/{r}" for r in range(ctx.world_size)], datetime.timedelta(seconds=timeout))


def control(ctx: RankContext, store: Any, timeout: float) -> None:
    """The control arm: every rank reaches the case's store before any collective."""
    ctx.phase("control", "store check-in")
    store_barrier(ctx, store, "control", timeout)


def use_own_device(ctx: RankContext) -> None:
    """Make the rank's GPU current, as every job does (it does not steer the barrier), and check it is the one meant."""
    import torch

    torch.cuda.set_device(ctx.torch_device)
    ctx.check_device_identity()


def init_group(ctx: RankContext, store: Any) -> None:
    import torch.distributed as dist

    kwargs: dict[str, Any] = {}
    if ctx.backend == "nccl":
        ctx.phase("init", "CUDA device (set_device)")  # its own line: CUDA's start timed apart from NCCL's
        use_own_device(ctx)
        if ctx.params.get("device_id_at_init", True):
            kwargs["device_id"] = ctx.torch_device  # eager NCCL init: set-up errors surface here
            ctx.bound_device = ctx.torch_device.index
    ctx.phase("init", f"init_process_group({ctx.backend})")
    dist.init_process_group(
        backend=ctx.backend,
        store=store,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=datetime.timedelta(seconds=ctx.case.process_group_timeout),
        **kwargs,
    )
    ctx.group = dist.group.WORLD
    # No rank may leave (skip, fail, finish) while a peer is still connecting to it.
    store_barrier(ctx, store, "initialized", ctx.case.init_timeout)


def case_store(ctx: RankContext, case_dir: Path) -> Any:
    """The case's own FileStore; across nodes, node 0's TCPStore under the case's prefix."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=ctx.case.init_timeout)
    meeting = ctx.case.store
    if meeting:
        ctx.phase("control", f"connect to node 0's store {meeting.host}:{meeting.port}")
        client = dist.TCPStore(meeting.host, meeting.port, wait_for_workers=False, timeout=timeout)  # type: ignore[attr-defined]
        return dist.PrefixStore(meeting.prefix, client)  # type: ignore[attr-defined]
    path = ctx.case.store_file or str(case_dir / casefiles.STORE)
    store = dist.FileStore(path, ctx.world_size)  # type: ignore[attr-defined]
    store.set_timeout(timeout)
    return store


def run_case(ctx: RankContext, case_dir: Path) -> None:
    from conformance.rank.probes import PROBES

    ctx.phase("start")
    store = ctx.store = case_store(ctx, case_dir)
    control(ctx, store, ctx.case.init_timeout)
    if ctx.case.single_process:
        if ctx.backend == "nccl":
            use_own_device(ctx)
        PROBES[ctx.probe](ctx)  # one process, no group (peer copies)
        ctx.phase("teardown", "done")
        return
    init_group(ctx, store)
    PROBES[ctx.probe](ctx)
    end_group(ctx)


ENDS_WITH_DESTROY = ("environment",)  # the probe that tests torch.distributed itself, its teardown included
ENDED = "ended"  # the store key prefix where each rank says how it ended


def end_group(ctx: RankContext) -> None:
    """The probe's end: the environment probe destroys the group; every other leaves it to the process's end.

    destroy_process_group took 0.39 s of a 1.5 s case on an H200 (docs/gpu-runs/2026-11-28-h200) and
    proves nothing a case needs; :func:`end_together` keeps a rank from leaving while a peer still
    receives from it, which the time destroy took used to hide.
    """
    import torch.distributed as dist

    if ctx.probe in ENDS_WITH_DESTROY:
        ctx.phase("teardown", "destroy_process_group")
        dist.destroy_process_group()
    else:
        ctx.phase("teardown", "every rank checked (store)")


def end_together(ctx: RankContext, failed: bool) -> bool:
    """Say at the case's store how this rank ended; one that passed waits there until every rank has said so.

    A rank that failed leaves at once (its peers need not wait for it); one that died or hangs says
    nothing, and the others leave at the store's timeout, or when the watchdog stops them.  True when
    every rank said how it ended (nothing to wait for counts as that).
    """
    if ctx.store is None or ctx.case.single_process or ctx.world_size == 1:
        return True
    try:
        ctx.store.set(f"conformance/{ENDED}/{ctx.rank}", "failed" if failed else "ok")
        if not failed:
            keys = [f"conformance/{ENDED}/{r}" for r in range(ctx.world_size)]
            ctx.store.wait(keys, datetime.timedelta(seconds=ctx.case.init_timeout))
        return True
    except Exception:  # noqa: BLE001 - the result is written: a store gone or a peer silent changes nothing
        traceback.print_exc()
        return False


def outcome(ctx: RankContext | None, exc: BaseException | None) -> tuple[int, RankResult]:
    """The rank's exit code and its result: ok, skip, fail (wrong data) or error."""
    ended = RankResult(RankStatus.OK, wall(), clock=time.monotonic())
    if ctx is not None:
        ended = replace(ended, phase=ctx.phase_name, step=ctx.step, metrics=ctx.metrics)
    if exc is None:
        return casefiles.EXIT_OK, ended
    if isinstance(exc, RankSkip):
        return casefiles.EXIT_SKIP, replace(ended, status=RankStatus.SKIP, message=str(exc))
    failed = replace(
        ended,
        status=RankStatus.FAIL if isinstance(exc, WrongData) else RankStatus.ERROR,
        error_type=type(exc).__name__,
        message=str(exc).strip() or type(exc).__name__,
        traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-6000:],
    )
    return (casefiles.EXIT_WRONG_DATA if isinstance(exc, WrongData) else casefiles.EXIT_ERROR), failed


def rank_main(case_dir: Path, rank: int, pgid: int, parent: int) -> NoReturn:
    """Entry point in the forked child; never returns."""
    os.setpgid(0, pgid or 0)
    flight_recorder.block_dump_signal()  # a dump request before the dump thread runs waits for it
    die_with_parent(parent)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    rank_path = casefiles.rank_dir(case_dir, rank)
    rank_path.mkdir(parents=True, exist_ok=True)
    redirect_output(rank_path)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    ctx: RankContext | None = None
    error: BaseException | None = None
    try:
        case = casefiles.read_case(case_dir)
        apply_case_env(case, rank)
        one_cpu_thread_unless_asked()
        flight_recorder.serve_dumps(case.backend, rank_path)
        ctx = RankContext(case, rank, rank_path)
        run_case(ctx, case_dir)
    except BaseException as exc:  # noqa: BLE001 - everything a rank raises is a result
        error = exc
        traceback.print_exc()
        if ctx is not None and not isinstance(exc, RankSkip):
            flight_recorder.dump(ctx.backend, rank_path)
    code, result = outcome(ctx, error)
    try:
        casefiles.write_result(rank_path, result)
        # what follows the stamp is the process's end (its CUDA context, its memory); not after a wait for a
        # silent peer, where it would tell the watchdog of progress no rank made
        if ctx is not None and end_together(ctx, failed=code != casefiles.EXIT_OK) and error is None:
            ctx.stamp(EXIT_STEP)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
