"""The probes' data, references, timing and device choices, as units, against torch on CPU.

The references are closed forms; here they are checked against the sums they replace, element by
element.  The check's host memory is measured in a fresh process (peak RSS, reset before the check).
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.discover.topology import Device, Topology, cpu_topology
from conformance.launch.case import CaseSpec, rank_devices
from conformance.plan.matrix import MISMATCHED_BARRIER_SETS, barrier_sets
from conformance.rank import check_data, probes, timing
from conformance.rank.barrier_device import barrier_device, guessed_wrong
from conftest import COLLECTIVE_TEST, read_records

torch = pytest.importorskip("torch")


def naive_pattern(rank: int, n: int) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.int64) % 251 + 1).to(torch.float32) * (rank + 1)


@pytest.mark.parametrize("start", [0, 1, 250, 251, 252, 1000])
@pytest.mark.parametrize("n", [1, 7, 251, 1000])
def test_cycle_values_are_the_pattern_from_any_start(start: int, n: int) -> None:
    expected = naive_pattern(0, start + n)[start:]
    assert torch.equal(check_data.cycle_values(start, n), expected)
    assert torch.equal(check_data.cycle_values(start, n, scale=3), expected * 3)


@pytest.mark.parametrize("world", [1, 2, 3, 8, 16])
def test_closed_form_references_equal_the_sums_they_replace(world: int) -> None:
    n = 600  # crosses the 251-cycle more than twice
    patterns = [naive_pattern(r, n * world) for r in range(world)]
    total = torch.stack(patterns).sum(0)
    assert torch.equal(check_data.reduced(world, n * world), total)
    for rank in range(world):
        share = check_data.reduced(world, n, start=rank * n)  # what reduce-scatter delivers to this rank
        assert torch.equal(share, total[rank * n : (rank + 1) * n])
        assert torch.equal(check_data.pattern(rank, n), naive_pattern(rank, n))
    assert torch.equal(check_data.gathered(world, n), torch.cat([naive_pattern(r, n) for r in range(world)]))


def test_sums_stay_exact_up_to_the_documented_world_size() -> None:
    assert check_data.rank_sum(365) * 251 < 1 << 24
    with pytest.raises(ValueError, match="366 ranks: sums of the check pattern would not be exact"):
        check_data.rank_sum(366)


MEMORY_PROBE = r"""
import json, sys, tempfile
from pathlib import Path
import torch
from conformance.rank import check_data, probes
from conformance.common.casefiles import CaseFile, RankDevice
from conformance.rank.context import RankContext

world, n, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def peak_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

def check_cost(got, reference):
    case = CaseFile("t", "x", "gloo", world, devices=(RankDevice("cpu0", 0),))
    ctx = RankContext(case, 0, Path(tempfile.mkdtemp()))
    open("/proc/self/clear_refs", "w").write("5")  # peak RSS starts again from the current RSS
    before = peak_kib()
    ctx.verify("check", got, reference)
    return (peak_kib() - before) * 1024

rank = world - 1
received = {
    "all_reduce": (check_data.reduced(world, n), lambda: check_data.reduced(world, n)),
    "broadcast": (check_data.pattern(0, n), lambda: check_data.pattern(0, n)),
    "reduce_scatter": (
        check_data.reduced(world, n, start=rank * n), lambda: check_data.reduced(world, n, start=rank * n)
    ),
    "all_gather": (check_data.gathered(world, n), lambda: check_data.gathered(world, n)),
}
largest = {"all_reduce": n, "broadcast": n, "reduce_scatter": world * n, "all_gather": world * n}
got, reference = received[name]
print(json.dumps([check_cost(got.clone(), reference), largest[name] * 4]))
"""


@pytest.mark.parametrize("name", ["all_reduce", "broadcast", "reduce_scatter", "all_gather"])
def test_host_memory_of_the_check_is_at_most_three_largest_buffers(name: str) -> None:
    """8 ranks, 16 MiB per rank, each probe's check in a fresh process: within 3x the largest buffer."""
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, "8", str(4 << 20), name],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    check_bytes, largest_bytes = json.loads(done.stdout)
    used = f"check used {check_bytes >> 20} MiB, largest buffer {largest_bytes >> 20} MiB"
    assert check_bytes <= 3 * largest_bytes, used
    assert check_bytes >= 4 << 20, f"the check's own reference ({check_bytes} bytes) went unseen: cannot fail"


def test_timed_loop_holds_only_the_operation() -> None:
    calls = []
    seconds = timing.seconds_per_iteration(lambda: calls.append(1), [torch.device("cpu")], iterations=7, warmup=3)
    assert len(calls) == 10 and seconds > 0
    assert timing.gbps(4 << 20, 0.004) == round((4 << 20) / 0.004 / 1e9, 4)


def test_bus_factors_are_nccl_tests() -> None:
    assert probes.bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert probes.bus_factor("all_gather", 8) == probes.bus_factor("reduce_scatter", 8) == 7 / 8
    assert probes.bus_factor("broadcast", 8) == 1.0


# -- which GPU the first barrier runs on ---------------------------------------------------------


def test_torch_documents_the_rule_we_model() -> None:
    """The installed torch still documents barrier's device order as barrier_device.py models it."""
    import torch.distributed as dist

    doc = " ".join(inspect.getdoc(dist.barrier).split())  # type: ignore[union-attr]
    for words in (
        "(1) the first device passed to `device_ids` arg of barrier if not None",
        "(2) the device passed to init_process_group if not None",
        "(3) the device that was first used with this process group",
        "(4) the device index indicated by the global rank mod local device count",
    ):
        assert words in doc, words


def test_barrier_device_rule_order() -> None:
    assert barrier_device(5, 8, device_ids=[2], bound=3, used=[4]).index == 2
    assert barrier_device(5, 8, bound=3, used=[4]).chosen_by == "init_process_group(device_id)"
    assert barrier_device(5, 8, used=[6, 4]) == barrier_device(0, 8, used=[4])  # the lowest used device
    guess = barrier_device(9, 8)
    assert (guess.index, guess.chosen_by) == (1, "a guess: global rank 9 % 8 devices")


def gpu_topology(count: int) -> Topology:
    uuids = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(count)]
    devices = tuple(Device(f"gpu{i}", i, "gpu", uuid=uuid) for i, uuid in enumerate(uuids))
    return Topology("gpu", devices, "test")


def own_ordinals(topology: Topology, kind: str) -> tuple[list[int], int]:
    """(each rank's CUDA ordinal, how many GPUs the ranks see) for the planned barrier set ``kind``."""
    chosen = next(s for s in barrier_sets(topology) if s.kind == kind)
    spec = CaseSpec("t", "barrier", chosen.devices, "nccl", isolate=chosen.isolate, visible=topology.devices)
    return [d.index for d in rank_devices(spec)], len(spec.seen)


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8, 16])
def test_every_planned_mismatch_set_really_mismatches(count: int) -> None:
    topology = gpu_topology(count)
    kinds = [s.kind for s in barrier_sets(topology)]
    mismatched = [k for k in kinds if k in MISMATCHED_BARRIER_SETS]
    assert mismatched, f"{count} GPUs: no barrier case where torch's guess is wrong"
    for kind in kinds:
        own, visible = own_ordinals(topology, kind)
        wrong = guessed_wrong(own, visible)
        if kind in MISMATCHED_BARRIER_SETS:
            assert wrong, f"{count} GPUs, {kind}: ranks on {own} of {visible}: torch's guess is right for all"
        else:
            assert wrong == [], f"{count} GPUs, {kind}: ranks {wrong} guessed wrong in a set meant to be right"


def test_mismatch_sets_on_an_eight_gpu_box() -> None:
    topology = gpu_topology(8)
    assert own_ordinals(topology, "last_half") == ([0, 1, 2, 3], 4)  # renumbered by CUDA_VISIBLE_DEVICES
    assert own_ordinals(topology, "last_half_all_visible") == ([4, 5, 6, 7], 8)
    assert own_ordinals(topology, "reversed") == ([7, 6, 5, 4, 3, 2, 1, 0], 8)
    assert guessed_wrong([4, 5, 6, 7], 8) == [0, 1, 2, 3]
    assert [s.kind for s in barrier_sets(cpu_topology(1))] == ["all"]


def test_ranks_are_told_their_gpus_by_uuid_in_run_order(tmp_path: Path) -> None:
    from conformance.launch.environment import rank_environments

    topology = gpu_topology(4)
    visible = tuple(reversed(topology.devices))  # the user's CUDA_VISIBLE_DEVICES order
    spec = CaseSpec("t", "pair_exchange", (visible[1], visible[3]), "nccl", visible=visible)
    env = rank_environments(spec, tmp_path).per_rank[0]
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(d.uuid or "" for d in visible)
    assert "CUDA_DEVICE_ORDER" not in env
    assert [d.index for d in rank_devices(spec)] == [1, 3]
    isolated = CaseSpec("t", "barrier", (visible[1], visible[3]), "nccl", isolate=True, visible=visible)
    assert (
        rank_environments(isolated, tmp_path).per_rank[1]["CUDA_VISIBLE_DEVICES"]
        == f"{visible[1].uuid},{visible[3].uuid}"
    )
    assert [d.index for d in rank_devices(isolated)] == [0, 1]


def test_uuid_spellings_compare_by_digits() -> None:
    from conformance.rank.context import uuid_digits

    digits = "5f1c9a2e0b7d4c3e9a1f2b3c4d5e6f70"
    assert uuid_digits("GPU-5f1c9a2e-0b7d-4c3e-9a1f-2b3c4d5e6f70") == digits
    assert uuid_digits("5F1C9A2E-0B7D-4C3E-9A1F-2B3C4D5E6F70") == digits


@pytest.mark.parametrize(("omp_num_threads", "expected"), [(None, 1), ("2", 2)])
def test_a_rank_uses_one_cpu_thread_unless_omp_num_threads_says(
    pytester: pytest.Pytester,
    run_suite: Callable[..., pytest.RunResult],
    reports_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    omp_num_threads: str | None,
    expected: int,
) -> None:
    """As torchrun: one intra-op thread per rank (idle OpenMP threads spin), unless the user set OMP_NUM_THREADS."""
    if omp_num_threads is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp_num_threads)
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe="environment"))
    run_suite("--virtual-devices=2").assert_outcomes(passed=1)
    (record,) = read_records(reports_dir)
    assert record["metrics"]["cpu_threads"] == expected


@pytest.mark.parametrize(
    ("found", "expected", "problem"),
    [
        ("5f1c9a2e-0b7d-4c3e-9a1f-2b3c4d5e6f70", "GPU-5f1c9a2e-0b7d-4c3e-9a1f-2b3c4d5e6f70", None),
        (
            "00000000-0b7d-4c3e-9a1f-2b3c4d5e6f70", "GPU-5f1c9a2e-0b7d-4c3e-9a1f-2b3c4d5e6f70",
            "cuda:1 is 00000000-0b7d-4c3e-9a1f-2b3c4d5e6f70, not GPU-5f1c9a2e-0b7d-4c3e-9a1f-2b3c4d5e6f70 "
            "(CUDA_VISIBLE_DEVICES='GPU-a,GPU-b')",
        ),
        # a UUID form the check cannot read fails loudly instead of passing unchecked
        (
            "GPU-5f1c9a2e", "GPU-5f1c9a2e-0b7d-4c3e-9a1f-2b3c4d5e6f70",
            "torch's UUID for cuda:1 is 'GPU-5f1c9a2e', not 32 hex digits: the rank cannot check that it runs on "
            "the GPU chosen",
        ),
        ("", "GPU-5f1c9a2e-0b7d-4c3e-9a1f-2b3c4d5e6f70", "torch's UUID for cuda:1 is '', not 32 hex digits: *"),
    ],
)  # fmt: skip
def test_the_rank_identity_check_compares_or_fails(found: str, expected: str, problem: str | None) -> None:
    from fnmatch import fnmatchcase

    from conformance.rank.context import identity_problem

    got = identity_problem(1, found, expected, "GPU-a,GPU-b")
    assert got == problem if problem is None or "*" not in problem else fnmatchcase(got or "", problem), got


@pytest.mark.parametrize(
    ("users", "given"),
    [
        (None, "INIT,BOOTSTRAP,ENV,P2P,SHM,NET"),
        ("COLL", "COLL,INIT,BOOTSTRAP,ENV,P2P,SHM,NET"),  # the user's COLL kept, the read-back's added
        ("init,coll", "init,coll,BOOTSTRAP,ENV,P2P,SHM,NET"),  # names compare case-insensitively
        ("ALL", "ALL"),
        ("^COLL,NET", "^COLL"),  # every subsystem but those listed: NET taken out of the exclusion
        ("^NET,P2P", "ALL"),
    ],
)
def test_the_user_s_nccl_debug_subsys_keeps_what_the_suite_reads(users: str | None, given: str) -> None:
    from conformance.launch.environment import debug_subsystems

    assert debug_subsystems(users) == given


def test_an_inherited_nccl_debug_subsys_is_added_to_not_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conformance.launch.environment import rank_environments

    topology = gpu_topology(2)
    monkeypatch.setenv("NCCL_DEBUG_SUBSYS", "COLL")
    monkeypatch.setenv("NCCL_DEBUG", "TRACE")
    spec = CaseSpec("t", "pair_exchange", topology.devices, "nccl", visible=topology.devices)
    env = rank_environments(spec, tmp_path).per_rank[0]
    assert env["NCCL_DEBUG_SUBSYS"].split(",")[:2] == ["COLL", "INIT"] and "NET" in env["NCCL_DEBUG_SUBSYS"]
    assert env["NCCL_DEBUG"] == "TRACE"
    monkeypatch.setenv("NCCL_DEBUG", "WARN")  # too quiet for the read-back: INFO
    assert rank_environments(spec, tmp_path).per_rank[0]["NCCL_DEBUG"] == "INFO"
    rung = CaseSpec("t", "pair_exchange", topology.devices, "nccl", visible=topology.devices,
                    env_set={"NCCL_DEBUG_SUBSYS": "^P2P"})  # fmt: skip
    assert rank_environments(rung, tmp_path).per_rank[0]["NCCL_DEBUG_SUBSYS"] == "ALL"


@pytest.mark.parametrize(("world", "chunk"), [(2, 1), (3, 5), (4, 64), (8, 1 << 15)])
def test_all_to_all_expects_each_chunk_from_its_rank_at_its_place(world: int, chunk: int) -> None:
    """All-to-all worked out from every rank's send buffer is ``exchanged``; a misrouted delivery is not."""
    import torch

    from conformance.rank.check_data import exchanged, pattern

    sends = [pattern(r, chunk * world).view(world, chunk) for r in range(world)]
    for rank in range(world):
        delivered = torch.cat([sends[source][rank] for source in range(world)])
        assert torch.equal(delivered, exchanged(world, chunk, rank))
        swapped_sources = torch.cat([sends[(source + 1) % world][rank] for source in range(world)])
        wrong_slot = torch.cat([sends[source][(rank + 1) % world] for source in range(world)])
        assert not torch.equal(swapped_sources, exchanged(world, chunk, rank))
        assert not torch.equal(wrong_slot, exchanged(world, chunk, rank))


def test_all_to_all_bus_bandwidth_is_nccl_tests() -> None:
    from conformance.rank.probes import bus_factor

    assert bus_factor("all_to_all", 8) == 7 / 8  # nccl-tests src/alltoall.cu: busBw = algBw * (n-1)/n
