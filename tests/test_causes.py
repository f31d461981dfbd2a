"""The answer's cause lines: a failing class names what its ranks died of and the fix, once per cause."""

from __future__ import annotations

from typing import Any

from conformance.record.records import CaseRecord
from conformance.summarise.causes import BARRIER_FIX, OOM, OOM_FIX, WRONG_BARRIER_GPU, cause_lines
from conformance.verdict.stderr_causes import DESCRIPTORS_EXHAUSTED, GPU_OUT_OF_MEMORY, recognise


def failing(probe: str = "all_reduce", verdict: str = "error", **fields: Any) -> CaseRecord:
    data = {"nodeid": f"suites/test_x.py::test_{probe}[all2-inherited]", "probe": probe, "verdict": verdict}
    return CaseRecord.from_json({**data, **fields})


def rank(number: int, **fields: Any) -> dict[str, Any]:
    return {"rank": number, "device": f"gpu{number}", **fields}


def test_out_of_memory_names_its_rank_its_victims_and_the_fix() -> None:
    root = {"rank": 1, "kind": "OutOfMemoryError", "message": "CUDA out of memory", "phase": "step", "step": "3"}
    records = [
        failing(probe, root_cause=root, victims=[0, 2], ranks=[rank(0), rank(1), rank(2)])
        for probe in ("all_reduce", "barrier")
    ]
    assert cause_lines(records) == [
        f"  {OOM}: rank 1 (gpu1) in step of all_reduce, barrier: CUDA out of memory; "
        f"rank 0, 2 only waited for it (victims) -> fix: {OOM_FIX}"
    ]


def test_nccl_out_of_gpu_memory_is_out_of_memory_though_torch_says_unhandled_cuda_error() -> None:
    """The second real-GPU run: NCCL's WARN said 'Cuda failure 2 'out of memory'', torch only its error."""
    said = "NCCL error in: NCCLUtils.cpp:93, unhandled cuda error\nLast error:\nFailed to CUDA calloc async 608 bytes"
    message = f"{said}: {GPU_OUT_OF_MEMORY.text}"  # the rank's message with its logged cause, as a record has it
    root = {"rank": 0, "kind": "DistBackendError", "message": message, "phase": "init", "step": "init_process_group"}
    record = failing(root_cause=root, ranks=[rank(0, cause=GPU_OUT_OF_MEMORY.text)])
    assert cause_lines([record]) == [
        f"  {OOM}: rank 0 (gpu0) in init of all_reduce: {' '.join(said.split())}: the GPU ran out of memory -> fix: "
        f"{OOM_FIX}"
    ]


def test_a_first_barrier_on_another_ranks_gpu_names_the_ranks_and_the_code_change() -> None:
    wrong = {"barrier_device": 0, "rank_device": 1, "chosen_by": "rank % visible GPUs"}
    right = {"barrier_device": 0, "rank_device": 0, "chosen_by": "device_id"}
    record = failing("barrier", verdict="hang", ranks=[rank(0, barrier=right), rank(1, barrier=wrong)])
    assert cause_lines([record]) == [
        f"  {WRONG_BARRIER_GPU}: rank 1 in barrier: rank 1 uses GPU 1 but ran its first barrier on GPU 0 "
        f"(rank % visible GPUs) -> fix: {BARRIER_FIX}"
    ]


def test_a_logged_host_limit_names_the_root_ranks_cause_and_its_fix() -> None:
    cause = DESCRIPTORS_EXHAUSTED.text
    root = {"rank": 0, "kind": "OSError", "message": "[Errno 24] Too many open files", "phase": "init", "step": None}
    record = failing(root_cause=root, ranks=[rank(0, phase="init", cause=cause), rank(1, cause=None)])
    assert cause_lines([record]) == [
        f"  {DESCRIPTORS_EXHAUSTED.name}: rank 0 (gpu0) in init of all_reduce: OSError: [Errno 24] Too many "
        f"open files -> fix: {DESCRIPTORS_EXHAUSTED.fix}"
    ]


def test_nccls_own_warning_is_the_cause_without_a_made_up_fix_and_a_long_message_is_cut() -> None:
    tail = (
        "h:1:2 [0] enqueue.cc:1451 NCCL WARN Cuda failure 700 'an illegal memory access was encountered'\n"
        "torch.distributed.DistBackendError: NCCL error ... unhandled system error (run with NCCL_DEBUG=INFO)\n"
    )  # (shm.cc's Cuda failure 217 has a fix of ours: stderr_causes.CUMEM_HOST_FAILED)
    cause = recognise(tail)
    assert cause is not None and cause.name.startswith("Cuda failure 700")
    root = {"rank": 0, "kind": "DistBackendError", "message": "x" * 300, "phase": "init", "step": None}
    (line,) = cause_lines([failing(root_cause=root, ranks=[rank(0, phase="init", cause=cause.text)])])
    assert line.startswith(f"  {cause.name}: rank 0 (gpu0) in init of all_reduce: DistBackendError: xxx")
    assert line.endswith("xxx...")  # NCCL's own warning names no fix of ours: none is made up
    assert len(line.split(": ", 2)[2]) == 160  # "DistBackendError: xxx...", cut


def test_passing_cases_and_unknown_causes_give_no_line() -> None:
    assert cause_lines([failing(verdict="pass"), failing(ranks=[rank(0)]), failing(verdict="hang")]) == []
