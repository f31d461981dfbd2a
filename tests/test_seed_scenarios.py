"""Each seed scenario in scenarios/ produces what its header says, through the real suites.

Every test copies the suite files it needs into the pytester folder (so node ids read
``suites/test_pairs.py::...`` as in a real run), runs them with the scenario file as it is in the
repository (its simulated machine comes with it) and checks results.jsonl, ladder.jsonl and the
terminal output.  ``run_tag`` proves that no rank or forkserver outlives a run.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conformance.harness.junit import FAILED_VERDICT_WORDS
from conformance.rank.scenario import load_scenario
from conformance.verdict.stderr_causes import SHM_FULL
from conftest import REPO, copy_suites, read_records

RunSuite = Callable[..., pytest.RunResult]

SCENARIOS = (REPO / "scenarios").resolve()  # a link in the checkout; runs name the file itself
TIMEOUTS = ("--step-timeout=3", "--op-timeout=2", "--init-timeout=2", "--grace=1")
SAME_ENV = "same environment as rung inherited here"


pytestmark = [pytest.mark.usefixtures("isolated_env"), pytest.mark.slow]


def scenario_args(name: str) -> tuple[Path, tuple[str, ...]]:
    path = SCENARIOS / f"{name}.toml"
    return path, (f"--scenario={path}",)


def assert_simulated(result: pytest.RunResult, scenario: Path, records: list[dict[str, Any]]) -> None:
    title = load_scenario(scenario, "test").name
    result.stdout.fnmatch_lines([f"conformance: SIMULATED run, scenario {title!r} ({scenario})"])
    result.stdout.fnmatch_lines(["*= conformance summary (SIMULATED) =*"])
    assert records, "no case was recorded"
    assert {r["simulated"] for r in records} == {True}
    assert {r["backend"] for r in records} == {"gloo"}


def by_case(records: list[dict[str, Any]]) -> dict[str, list[tuple[str, str]]]:
    """Ladder key -> [(rung, verdict)] in the order the cases ran (host checks are on no ladder)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for r in records:
        if r["ladder_key"] is None:
            continue
        found.setdefault(r["ladder_key"], []).append((r["env_name"], r["verdict"]))
    return found


def ladder_decisions(reports_dir: Path) -> dict[tuple[str, str], tuple[str, str]]:
    path = reports_dir / "latest" / "ladder.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len({(d["key"], d["rung"]) for d in lines}) == len(lines), "a rung was decided twice"
    return {(d["key"], d["rung"]): (d["outcome"], d["reason"]) for d in lines}


def skip_reasons(result: pytest.RunResult) -> Counter[str]:
    """Reason -> number of skipped tests, from the ``-rs`` short summary."""
    counts: Counter[str] = Counter()
    for line in result.outlines:
        match = re.match(r"SKIPPED \[(\d+)\] [^ ]+?(?::\d+)?: (.*)$", line)
        if match:
            counts[match.group(2)] += int(match.group(1))
    return counts


def failed_nodeids(result: pytest.RunResult) -> list[str]:
    """The failed tests of pytest's short summary: a failed case under its verdict (HANG ...), any other as FAILED."""
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if "short test summary info" in line) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("="))
    words = tuple(f"{word} " for word in (*FAILED_VERDICT_WORDS, "FAILED"))
    return sorted(line.split(" ")[1] for line in lines[start:end] if line.startswith(words))


def deadlines_paid(records: list[dict[str, Any]]) -> int:
    return sum(r["stop_reason"] == "stalled" for r in records)


def pairs_of_class(topology: str, link: str) -> list[str]:
    """``gpuA-gpuB`` for every pair of this link class in a scenario topology, in plan order."""
    data = json.loads((SCENARIOS / "topologies" / topology).read_text())
    names = [d["name"] for d in sorted(data["devices"], key=lambda d: d["index"])]
    return [f"{a}-{b}" for a, b in itertools.combinations(names, 2) if data["links"][f"{a}-{b}"] == link]


def links_except(link: str) -> list[tuple[str, str]]:
    """(pair, link class) of the 8-GPU PCIe box's pairs of every other class."""
    data = json.loads((SCENARIOS / "topologies" / "pcie-2socket-8gpu.json").read_text())
    assert len(data["links"]) == 28
    return [(pair, other) for pair, other in data["links"].items() if other != link]


# ---------------------------------------------------------------------------------------------


SHM_MESSAGE = (
    "NCCL Error 2: unhandled system error (run with NCCL_DEBUG=INFO for details); Last error: "
    "Error while creating shared memory segment /dev/shm/nccl-Xv1e0G (size 9637888)"
)


def test_container_dev_shm(pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path) -> None:
    """Two GPUs over SHM error at init until shm_off; the world of one has no SHM connection and passes."""
    scenario, args = scenario_args("container-dev-shm")
    suites = copy_suites(pytester, "test_collectives.py", "test_pairs.py")
    result = run_suite(*args, *TIMEOUTS, "-rs", "-k", "world_of_one or pair_exchange", *suites)
    records = read_records(reports_dir)
    assert_simulated(result, scenario, records)
    result.stdout.fnmatch_lines(["conformance: run *, backend gloo, 2 devices: gpu0, gpu1 (NVIDIA GeForce RTX 4090)"])
    # the PHB pair uses SHM (P2P stops at PXB): nvls_off, cumem_host_off (CUDA driver 12.0), p2p_level_nvl and
    # p2p_off cannot change it; cumem_off is tried and fails alike; shm_off passes
    assert by_case(records) == {
        "test_world_of_one[gpu0]": [("inherited", "pass")],
        "test_world_of_one[gpu1]": [("inherited", "pass")],
        "test_pair_exchange[gpu0-gpu1-PHB]": [("inherited", "error"), ("cumem_off", "error"), ("shm_off", "pass")],
    }
    for r in records:
        if r["verdict"] == "error":
            assert r["root_cause"] == {
                "rank": 0, "kind": "SimulatedError", "message": f"{SHM_MESSAGE}: {SHM_FULL.text}",
                "phase": "init", "step": "init_process_group(gloo)",
            }  # fmt: skip
            assert r["predicted"] == {"PHB": "SHM"}
    assert [r["env"] for r in records if r["probe"] == "pair_exchange" and r["verdict"] == "pass"] == [
        {"NCCL_SHM_DISABLE": "1"}
    ]
    decisions = ladder_decisions(reports_dir)
    key = "test_pair_exchange[gpu0-gpu1-PHB]"
    for name in ("nvls_off", "cumem_host_off", "p2p_level_nvl", "p2p_off"):
        assert decisions[(key, name)][1].startswith(f"rung {name} cannot change a case"), decisions[(key, name)]
    assert decisions[("test_world_of_one[gpu0]", "shm_off")] == (
        "skipped",
        "adaptive matrix: rung inherited already passed",
    )
    result.stdout.fnmatch_lines(
        [
            "[[]simulated[]] error: rank 0 (gpu0) in init (init_process_group(gloo)): SimulatedError: NCCL Error 2: *",
            "PHB: first passing rung shm_off: export NCCL_SHM_DISABLE=1",
            "deadlines paid: 0 (step deadline 3s)",
        ]
    )


def test_noncontiguous_barrier(pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path) -> None:
    """Seed b: the barrier hangs exactly where torch's rule puts it on another GPU; device_ids pass everywhere."""
    scenario, args = scenario_args("noncontiguous-barrier")
    suites = copy_suites(pytester, "test_collectives.py")
    result = run_suite(*args, *TIMEOUTS, "--matrix=inherited", "-k", "test_barrier_first", *suites)
    records = read_records(reports_dir)
    assert_simulated(result, scenario, records)
    verdicts = {(r["set_kind"], r["probe"]): r["verdict"] for r in records}
    kinds = ("all", "last_half", "every_other", "reversed", "last_half_all_visible")
    mismatched = {"reversed", "last_half_all_visible"}
    assert verdicts == {
        **{(kind, "barrier"): "pass" for kind in kinds},
        **{(kind, "barrier_no_device_ids"): "hang" if kind in mismatched else "pass" for kind in kinds},
    }
    assert len(records) == 10
    devices = {r["set_kind"]: r["devices"] for r in records}
    assert devices == {
        "all": [f"gpu{i}" for i in range(8)],
        "last_half": ["gpu4", "gpu5", "gpu6", "gpu7"],
        "every_other": ["gpu1", "gpu3", "gpu5", "gpu7"],
        "reversed": [f"gpu{i}" for i in range(7, -1, -1)],
        "last_half_all_visible": ["gpu4", "gpu5", "gpu6", "gpu7"],
    }
    for r in records:
        assert r["env_name"] == "inherited"
        barrier = [x["barrier"] for x in r["ranks"]]  # each rank: its GPU and the one the barrier ran on
        wrong = [b["rank_device"] != b["barrier_device"] for b in barrier]
        if r["probe"] == "barrier":
            assert not any(wrong) and {b["chosen_by"] for b in barrier} == {"barrier(device_ids)"}
        elif r["set_kind"] in mismatched:
            assert all(wrong) and barrier[0]["chosen_by"] == "a guess: global rank 0 % 8 devices", barrier
        else:
            assert not any(wrong), barrier  # isolated subsets: CUDA_VISIBLE_DEVICES makes the guess right
        if r["verdict"] == "hang":
            ranks = ",".join(str(i) for i in range(len(r["ranks"])))
            assert r["root_cause"] == {
                "rank": None, "kind": "hang", "phase": None, "step": None,
                "message": f"ranks {ranks} all stuck in probe (barrier without device_ids)",
            }  # fmt: skip
            assert r["stop_reason"] == "stalled"
    reversed_ids = [(x["rank_device"], x["barrier_device"]) for x in devices_of(records, "reversed")]
    assert reversed_ids == [(7 - i, i) for i in range(8)]
    assert deadlines_paid(records) == 2
    prefix = "suites/test_collectives.py::test_barrier_first"
    assert failed_nodeids(result) == [
        f"{prefix}[last_half_all_visible-gpu4-gpu5-gpu6-gpu7-inherited-barrier_no_device_ids]",
        f"{prefix}[reversed-gpu7-gpu6-gpu5-gpu4-gpu3-gpu2-gpu1-gpu0-inherited-barrier_no_device_ids]",
    ]
    result.assert_outcomes(failed=2, passed=8)
    result.stdout.fnmatch_lines(["deadlines paid: 2 (step deadline 3s)"])
    # no environment variable fixes a device guess: the recommendation says so, for those sets
    result.stdout.fnmatch_lines(
        [
            "recommended environment:",
            "  last_half_all_visible: no rung passed (tried inherited): no environment fixes it; failing cases:",
            "  reversed: no rung passed (tried inherited): no environment fixes it; failing cases:",
        ],
        consecutive=False,
    )


def devices_of(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The per-rank barrier facts of the barrier_no_device_ids case on set ``kind``."""
    (record,) = [r for r in records if r["set_kind"] == kind and r["probe"] == "barrier_no_device_ids"]
    return [x["barrier"] for x in record["ranks"]]


# The whole 8-GPU PCIe box: every PIX and PXB pair (P2P by NCCL's default level) hangs until NCCL_P2P_LEVEL=NVL
# 5 s leaves the 8-rank collectives room on a loaded 2-core machine; the deadlines still fit in 3 min.
SYS_STEP_DEADLINE = 5.0
SYS_TIMEOUTS = (f"--step-timeout={SYS_STEP_DEADLINE:g}", "--op-timeout=4", "--init-timeout=4")
SYS_WALL_LIMIT = 180.0
SWITCH_BOX = "pcie-switch-8gpu.json"


def test_driver_p2p_hang_whole_suite(pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path) -> None:
    scenario, args = scenario_args("driver-p2p-hang")
    suites = copy_suites(
        pytester, "test_environment.py", "test_collectives.py", "test_pairs.py", "test_failure_handling.py",
        "test_machine_health.py",
    )  # fmt: skip
    begun = time.monotonic()
    result = run_suite(*args, *SYS_TIMEOUTS, *suites, timeout=SYS_WALL_LIMIT + 60)
    wall = time.monotonic() - begun
    assert wall < SYS_WALL_LIMIT, f"the run took {wall:.0f}s"
    records = read_records(reports_dir)
    assert_simulated(result, scenario, records)

    hung = {link: pairs_of_class(SWITCH_BOX, link) for link in ("PIX", "PXB")}
    assert [len(hung["PIX"]), len(hung["PXB"]), len(pairs_of_class(SWITCH_BOX, "SYS"))] == [4, 8, 16]
    assert [pairs[0] for pairs in hung.values()] == ["gpu0-gpu1", "gpu0-gpu2"]
    cases = by_case(records)
    exchanges = {k: v for k, v in cases.items() if k.startswith("test_pair_exchange[")}
    expected = {
        f"test_pair_exchange[{pair}-SYS]": [("inherited", "pass")] for pair in pairs_of_class(SWITCH_BOX, "SYS")
    }
    for link, pairs in hung.items():
        # the leader tries cuMem off (cuMem P2P could be what broke); nvls_off, cumem_host_off (no NVLink, no
        # SHM) and the rungs after the one that passed are not tried
        expected[f"test_pair_exchange[{pairs[0]}-{link}]"] = [
            ("inherited", "hang"),
            ("cumem_off", "hang"),
            ("p2p_level_nvl", "pass"),
        ]
        for pair in pairs[1:]:
            expected[f"test_pair_exchange[{pair}-{link}]"] = [("inherited", "hang"), ("p2p_level_nvl", "pass")]
    assert exchanges == expected

    # the host checks are recorded too, on no rung (this host suits a gloo run; GPU-only ones skip, and the
    # simulated box is healthy: its PCIe links, memory and modes pass, it has no NVLink, fabric or IOMMU facts)
    host = [r for r in records if r["set_kind"] == "host"]
    assert sorted(r["probe"] for r in host if r["verdict"] == "pass") == [
        "host:dev_shm", "host:gpu_clocks", "host:gpu_inventory", "host:gpu_memory", "host:gpu_modes",
        "host:gpu_processes", "host:hostname",
        "host:open_files", "host:pcie_link", "host:xid_log",
    ]  # fmt: skip
    assert {r["env_name"] for r in host} == {None} and {r["verdict"] for r in host} <= {"pass", "skip"}
    # everything else ran once, on inherited, and passed (the negative control errs as it expects)
    others = [r for r in records if r["probe"] != "pair_exchange" and r["set_kind"] != "host"]
    assert {r["env_name"] for r in others} == {"inherited"}
    assert sorted((r["probe"], r["verdict"]) for r in others if r["verdict"] != "pass") == [("fail_one_rank", "error")]
    assert [r["expected_verdict"] for r in others if r["verdict"] != "pass"] == ["error"]
    assert Counter(r["probe"] for r in others) == {
        "peer_copy": 28, "all_reduce": 9, "barrier": 5, "barrier_no_device_ids": 5, "broadcast": 1,
        "all_gather": 1, "reduce_scatter": 1, "all_to_all": 1, "environment": 1, "fail_one_rank": 1,
    }  # fmt: skip
    # the record says which transport NCCL would pick: P2P for the pairs that hung, SHM across the sockets
    predicted = {(r["link"], r["env_name"]): r["predicted"] for r in records if r["probe"] == "pair_exchange"}
    assert predicted[("PIX", "inherited")] == {"PIX": "P2P"} and predicted[("PXB", "inherited")] == {"PXB": "P2P"}
    assert predicted[("SYS", "inherited")] == {"SYS": "SHM"} and predicted[("PIX", "p2p_level_nvl")] == {"PIX": "SHM"}

    hangs = [r for r in records if r["verdict"] == "hang"]
    assert {(r["link"], r["probe"]) for r in hangs} == {("PIX", "pair_exchange"), ("PXB", "pair_exchange")}
    for link, pairs in hung.items():
        # A class leader pays the deadline, with the pairs of its round side by side (one wait); every pair
        # started after the leader hung is confirmed where it hung.
        (first,) = [r for r in hangs if r["ladder_key"] == f"test_pair_exchange[{pairs[0]}-{link}]"
                    and r["env_name"] == "inherited"]  # fmt: skip
        for r in (r for r in hangs if r["link"] == link and r["env_name"] == "inherited"):
            # A record says when the pair's ranks started, not when its rung was decided: a pair of the
            # leader's round, decided beside it, may start its ranks up to a step deadline later (under
            # load). Only a pair started before the leader ended, or one deadline after it, has a known way
            # to stop.
            started = r["time"] - r["seconds"]
            if started < first["time"]:
                assert r["stop_reason"] == "stalled", r["nodeid"]
            elif started > first["time"] + SYS_STEP_DEADLINE:
                assert r["stop_reason"] == "confirm", r["nodeid"]
            assert r["summary"] == "ranks 0,1 all stuck in probe (send/recv 4B)"
    paid = deadlines_paid(records)  # each leader's round stalls together (4 pairs), then its cumem_off
    assert len(hangs) == 4 + 8 + 2 and 4 <= paid <= 10
    fixed = "passes with NCCL_P2P_LEVEL=NVL -> export NCCL_P2P_LEVEL=NVL"
    result.stdout.fnmatch_lines(  # the details, then pytest's count line, then the answer last
        [
            "*= conformance summary (SIMULATED) =*",
            "*= conformance: the answer (SIMULATED) =*",
            f"PIX pairs: HANG on inherited (pair_exchange 4/4); {fixed}",
            f"PXB pairs: HANG on inherited (pair_exchange 8/8); {fixed}",
            "passed as they are: SYS pairs, all sets, *, single sets",
            "for every class together: export NCCL_P2P_LEVEL=NVL",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "PIX, PXB: first passing rung p2p_level_nvl: export NCCL_P2P_LEVEL=NVL",
            f"deadlines paid: {paid} (step deadline 5s); {14 - paid} hang(s) confirmed sooner: * stuck where*",
            "recommended environment:",
            "*PIX: p2p_level_nvl: export NCCL_P2P_LEVEL=NVL*",
        ]
    )
    env_file = (reports_dir / "latest" / "recommended.env").read_text()
    assert "NCCL_P2P_LEVEL=NVL" in env_file and "NCCL_P2P_DISABLE" not in env_file
    prefix = "suites/test_pairs.py::test_pair_exchange"
    inherited = [f"{prefix}[{pair}-{link}-inherited]" for link, pairs in hung.items() for pair in pairs]
    leaders = [f"{prefix}[{pairs[0]}-{link}-cumem_off]" for link, pairs in hung.items()]
    assert failed_nodeids(result) == sorted(inherited + leaders)
    assert result.parseoutcomes()["failed"] == 14


# ---------------------------------------------------------------------------------------------

WRONG_DATA = "send/recv 4B: 1 of 1 elements wrong; first at index 0: got 2.0, expected 1.0"


def test_wrong_data_p2p(pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path) -> None:
    """PIX pairs deliver wrong data over P2P: fail on inherited, pass on p2p_level_nvl."""
    scenario, args = scenario_args("wrong-data-p2p")
    suites = copy_suites(pytester, "test_pairs.py")
    result = run_suite(*args, *TIMEOUTS, "-k", "test_pair_exchange", *suites)
    records = read_records(reports_dir)
    assert_simulated(result, scenario, records)
    pix = pairs_of_class("pcie-2socket-8gpu.json", "PIX")
    assert pix == ["gpu0-gpu1", "gpu2-gpu3", "gpu4-gpu5", "gpu6-gpu7"]
    leader, followers = pix[0], pix[1:]
    expected = {f"test_pair_exchange[{pair}-{link}]": [("inherited", "pass")] for pair, link in links_except("PIX")}
    # nvls_off and cumem_host_off cannot change a case over PIX (no NVLink, no SHM): not tried; the leader
    # tries cumem_off (cuMem P2P could be what broke)
    expected[f"test_pair_exchange[{leader}-PIX]"] = [
        ("inherited", "fail"),
        ("cumem_off", "fail"),
        ("p2p_level_nvl", "pass"),
    ]
    for pair in followers:
        expected[f"test_pair_exchange[{pair}-PIX]"] = [("inherited", "fail"), ("p2p_level_nvl", "pass")]
    assert by_case(records) == expected
    fails = [r for r in records if r["verdict"] == "fail"]
    assert len(fails) == 5
    for r in fails:
        assert r["link"] == "PIX"
        assert r["root_cause"] == {
            "rank": 1, "kind": "WrongData", "message": WRONG_DATA, "phase": "verify", "step": "send/recv 4B",
        }  # fmt: skip
        assert r["victims"] == [0]
        assert r["stop_reason"] != "stalled"
    assert [r["env"] for r in records if r["link"] == "PIX" and r["verdict"] == "pass"] == [
        {"NCCL_P2P_LEVEL": "NVL"}
    ] * 4
    assert deadlines_paid(records) == 0
    decisions = ladder_decisions(reports_dir)
    for pair in followers:
        key = f"test_pair_exchange[{pair}-PIX]"
        assert decisions[(key, "clean")] == ("skipped", SAME_ENV)
        for futile in ("nvls_off", "cumem_host_off"):
            assert decisions[(key, futile)][1].startswith(f"rung {futile} cannot change a case over PIX")
        assert decisions[(key, "cumem_off")][1].startswith("no rung up to cumem_off passed for link class PIX")
        assert decisions[(key, "p2p_level_nvl")] == ("pass", "")
    result.stdout.fnmatch_lines(
        [
            "*= conformance: the answer (SIMULATED) =*",
            "PIX pairs: FAIL on inherited (pair_exchange 4/4); passes with NCCL_P2P_LEVEL=NVL,"
            " but wrong data makes the machine NOT FIT: no export",
            "passed as they are: NODE pairs, SYS pairs",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            f"FAIL  suites/test_pairs.py::test_pair_exchange[[]gpu0-gpu1-PIX-inherited[]]: "
            f"rank 1 (gpu1) in verify (send/recv 4B): WrongData: {WRONG_DATA}",
            "PIX: first passing rung p2p_level_nvl: export NCCL_P2P_LEVEL=NVL",
            "deadlines paid: 0 (step deadline 3s)",
        ]
    )
    assert result.parseoutcomes()["failed"] == 5
    assert result.parseoutcomes()["passed"] == 28


# ---------------------------------------------------------------------------------------------

OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 23.99 GiB of which "
    "1.02 GiB is free (simulated checkpoint gather)"
)


def test_oom_at_checkpoint(pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path) -> None:
    """Rank 0 runs out of memory while rank 1 waits: error, rank 0 the root cause, rank 1 its victim."""
    scenario, args = scenario_args("oom-at-checkpoint")
    suites = copy_suites(pytester, "test_collectives.py")
    result = run_suite(*args, *TIMEOUTS, "--matrix=inherited", *suites)
    records = read_records(reports_dir)
    assert_simulated(result, scenario, records)
    verdicts = sorted((r["nodeid"].split("::")[1], r["verdict"]) for r in records)
    assert verdicts == [
        ("test_all_gather[all2-inherited]", "error"),
        ("test_all_reduce[all2-inherited]", "error"),
        ("test_all_to_all[all2-inherited]", "pass"),
        ("test_barrier_first[all2-inherited-barrier]", "pass"),
        ("test_barrier_first[all2-inherited-barrier_no_device_ids]", "pass"),
        ("test_barrier_first[reversed-gpu1-gpu0-inherited-barrier]", "pass"),
        ("test_barrier_first[reversed-gpu1-gpu0-inherited-barrier_no_device_ids]", "pass"),
        ("test_broadcast[all2-inherited]", "pass"),
        ("test_reduce_scatter[all2-inherited]", "pass"),
        ("test_world_of_one[gpu0-inherited]", "pass"),
        ("test_world_of_one[gpu1-inherited]", "pass"),
    ]
    for r in records:
        if r["verdict"] != "error":
            continue
        assert r["root_cause"] == {
            "rank": 0, "kind": "OutOfMemoryError", "message": OOM_MESSAGE,
            "phase": "probe", "step": f"{r['probe']} 4B",
        }  # fmt: skip
        assert r["victims"] == [1]
        rank0, rank1 = r["ranks"]
        assert (rank0["exit"], rank0["status"], rank0["phase"]) == (1, "error", "probe")
        # rank 1 waited in the collective: gloo tells it the peer went away, or the grace period ends it
        assert (rank1["exit"], rank1["status"]) in ((1, "error"), ("SIGTERM", "stopped"))
        assert r["stop_reason"] != "stalled"
        assert r["seconds"] < 3.0
    assert deadlines_paid(records) == 0
    result.assert_outcomes(failed=2, passed=9)
    result.stdout.fnmatch_lines(["[[]simulated[]] error: rank 0 (gpu0) in probe (all_*): OutOfMemoryError: CUDA out *"])
    result.stdout.fnmatch_lines(
        [
            "recommended environment:",
            "  all: no rung passed (tried inherited): no environment fixes it; failing cases:",
        ],
        consecutive=False,
    )


def test_hang_ignores_sigterm(pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path) -> None:
    """Rank 1 hangs in all_reduce ignoring SIGTERM: hang, rank 1 the root cause, killed, nothing left."""
    scenario, args = scenario_args("hang-ignores-sigterm")
    suites = copy_suites(pytester, "test_collectives.py")
    result = run_suite(*args, *TIMEOUTS, "--matrix=inherited", *suites)
    records = read_records(reports_dir)
    assert_simulated(result, scenario, records)
    assert [r["nodeid"] for r in records if r["verdict"] != "pass"] == [
        "suites/test_collectives.py::test_all_reduce[all4-inherited]"
    ]
    assert len(records) == 15
    (hang,) = [r for r in records if r["verdict"] == "hang"]
    assert hang["root_cause"] == {
        "rank": 1, "kind": "stopped", "message": "stopped by the watchdog (stalled) in its current phase",
        "phase": "probe", "step": "all_reduce 4B",
    }  # fmt: skip
    assert hang["victims"] == [0, 2, 3]
    assert hang["stop_reason"] == "stalled"
    assert [(x["rank"], x["exit"], x["status"], x["stopped_by"]) for x in hang["ranks"]] == [
        (0, 1, "error", None),
        (1, "SIGKILL", "stopped", "stalled"),
        (2, 1, "error", None),
        (3, 1, "error", None),
    ]
    # SIGTERM ignored: SIGKILL follows 0.5 s later
    assert 0.5 <= hang["stop_seconds"] < 2.0
    assert deadlines_paid(records) == 1
    result.assert_outcomes(failed=1, passed=14)
    result.stdout.fnmatch_lines(
        [
            "HANG  suites/test_collectives.py::test_all_reduce[[]all4-inherited[]]: "
            "rank 1 (cpu1) in probe (all_reduce 4B): made no progress and was stopped (stalled); it issued 0 "
            "operation(s) where rank 0,2,3 issued 1: they wait in one it never joined (flight recorder)",
            "deadlines paid: 1 (step deadline 3s)",
        ]
    )
