"""The recommended environment: per topology class, overall, the .env file and the command.

Units build runs by hand (records with the fields ``results.case_record`` writes); the scenario
tests run the real suites on simulated machines, as ``test_seed_scenarios`` does, and read the
finished run back the way ``python -m conformance recommend`` does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conformance.cli.main import main
from conformance.plan.matrix import BUILTIN_LADDER
from conformance.record.records import CaseRecord, RunFacts
from conformance.record.runs import Run, RunError, load_run, run_facts
from conformance.summarise.env_file import USAGE, env_file_text, write_env_file
from conformance.summarise.recommend import recommend
from conformance.summarise.recommendation import Recommendation
from conftest import REPO, copy_suites
from test_compare import SYS_P2P_HANG

RunSuite = Callable[..., pytest.RunResult]

RUN_ID = "20250101-000000-abcd"
ENV_USAGE = f"# {USAGE}"
SIMULATED = "SIMULATED run: this is for the simulated machine, not this host"
PER_CLASS = "per topology class, the first rung on which every case of the class passed:"
NOTHING = "nothing to set: the environment as it is"
UNFIT = (
    "framework copies (tensor.to between GPUs, cudaMemcpyPeer) are affected too, whatever NCCL is told; "
    "no environment makes this machine safe: fix it (IOMMU/ACS, driver, hardware) and run the suite again"
)
RUNGS = {r.name: r for r in BUILTIN_LADDER}


def record(
    case: str,
    rung: str,
    verdict: str,
    *,
    probe: str = "pair_exchange",
    kind: str = "pair",
    link: str | None = None,
    bandwidth: float | None = None,
    busbw: dict[str, float] | None = None,
    expected: str | None = None,
    env: dict[str, str | None] | None = None,
) -> dict[str, Any]:
    """A record as results.case_record writes it; ``case`` is the device-set id without the rung."""
    test = f"test_{probe}"
    devices = [part for part in case.split("-") if part.startswith(("gpu", "cpu"))]
    return {
        "schema": 1, "run_id": RUN_ID, "nodeid": f"suites/test_x.py::{test}[{case}-{rung}]", "probe": probe,
        "devices": devices, "device_ids": devices,
        "link": link if kind == "pair" else (kind if kind == "all" else None),
        "set_kind": kind, "ladder_key": f"{test}[{case}]", "backend": "nccl", "env_name": rung,
        "env": dict(RUNGS[rung].set) if env is None and rung in RUNGS else (env or {}),
        "verdict": verdict, "expected_verdict": expected, "summary": f"{verdict} on {rung}",
        "root_cause": None, "victims": [], "ranks": [], "bandwidth_gbps": bandwidth,
        "metrics": {"busbw_gbps": busbw} if busbw else {}, "p2p_status": None, "transports": {},
        "nccl_warnings": [], "nccl": None, "seconds": 0.1, "lease_wait": 0.0,
        "stop_reason": "deadline" if verdict == "hang" else None, "stop_seconds": None, "simulated": False,
        "case_dir": "", "time": 0.0,
    }  # fmt: skip


def pair(case: str, rung: str, verdict: str, **kwargs: Any) -> dict[str, Any]:
    return record(case, rung, verdict, link=case.rsplit("-", 1)[1], **kwargs)


def typed(records: list[dict[str, Any]]) -> list[CaseRecord]:
    return [CaseRecord.from_json(r) for r in records]


def make_run(folder: Path, records: list[dict[str, Any]], **facts: Any) -> Run:
    return Run(str(folder), run_facts({"run_id": RUN_ID, **facts}), typed(records), folder=folder)


def header(folder: Path, simulated: bool = False) -> list[str]:
    lines = [f"# recommended environment from conformance run {RUN_ID}"]
    return lines + ["# " + SIMULATED] * simulated + [ENV_USAGE]


def sys_records() -> list[dict[str, Any]]:
    """PIX healthy; both SYS pairs hang until p2p_level_nvl; all healthy; a control and a skip to ignore."""
    return [
        pair("gpu0-gpu1-PIX", "inherited", "pass", bandwidth=9.5),
        pair("gpu0-gpu2-SYS", "inherited", "hang"),
        pair("gpu1-gpu2-SYS", "inherited", "hang"),
        pair("gpu0-gpu2-SYS", "cumem_off", "hang"),
        pair("gpu0-gpu2-SYS", "nvls_off", "hang"),
        pair("gpu0-gpu2-SYS", "p2p_level_nvl", "pass", bandwidth=4.0),
        pair("gpu1-gpu2-SYS", "p2p_level_nvl", "pass", bandwidth=4.2),
        record("all3", "inherited", "pass", probe="all_reduce", kind="all", busbw={"1MiB": 5.0}),
        record("all3", "inherited", "error", probe="fail_one_rank", kind="all", expected="error"),
        record("gpu0", "inherited", "skip", probe="all_reduce", kind="single"),
        record("gpu1", "inherited", "fail", probe="all_reduce", kind="single", expected="fail"),
    ]


# ---------------------------------------------------------------------------------------------
# units
# ---------------------------------------------------------------------------------------------


def test_only_the_failing_class_needs_a_setting(tmp_path: Path) -> None:
    rec = recommend(make_run(tmp_path, sys_records()))
    assert not rec.unfit
    assert rec.lines() == [
        PER_CLASS,
        f"  PIX: inherited: {NOTHING}; bandwidth cost: not measured (only inherited passed)",
        "  SYS: p2p_level_nvl: export NCCL_P2P_LEVEL=NVL; bandwidth cost: not measured (only p2p_level_nvl passed)",
        f"  all: inherited: {NOTHING}; bandwidth cost: not measured (only inherited passed)",
        "classes need different settings; they do not conflict, so their union serves every class:",
        "  NCCL_P2P_LEVEL=NVL: needed by SYS",
        "  would then run on a broader setting than they need: PIX (needs inherited), all (needs inherited)",
        "  export NCCL_P2P_LEVEL=NVL",
    ]
    assert env_file_text(rec) == "\n".join(
        [
            *header(tmp_path),
            "# PIX: inherited: nothing to set",
            "# SYS: p2p_level_nvl: NCCL_P2P_LEVEL=NVL",
            "# all: inherited: nothing to set",
            "# broader setting than needed for: PIX (needs inherited), all (needs inherited)",
            "NCCL_P2P_LEVEL=NVL",
            "",
        ]
    )
    data = rec.to_json()
    assert {name: c["rung"] for name, c in data["classes"].items()} == {
        "PIX": "inherited", "SYS": "p2p_level_nvl", "all": "inherited",
    }  # fmt: skip
    assert data["env"] == {"NCCL_P2P_LEVEL": "NVL"}
    assert data["exports"] == ["export NCCL_P2P_LEVEL=NVL"]
    assert data["serves_every_class"] is False
    assert data["broader"] == [{"class": "PIX", "needs": "inherited"}, {"class": "all", "needs": "inherited"}]
    assert data["needed_by"] == {"NCCL_P2P_LEVEL=NVL": ["SYS"]}
    assert data["conflicts"] == [] and data["unfixed"] == [] and data["unfit"] is False
    assert json.loads(json.dumps(data)) == data


def test_one_setting_serves_every_class(tmp_path: Path) -> None:
    records = [
        record("gpu0", "inherited", "error", probe="all_reduce", kind="single"),
        record("gpu0", "shm_off", "pass", probe="all_reduce", kind="single"),
        record("all2", "inherited", "error", probe="all_reduce", kind="all"),
        record("all2", "shm_off", "pass", probe="all_reduce", kind="all"),
    ]
    rec = recommend(make_run(tmp_path, records))
    assert rec.lines()[-2:] == ["one setting serves every class:", "  export NCCL_SHM_DISABLE=1"]
    assert rec.serves_every_class and rec.broader == []
    assert env_file_text(rec).splitlines()[-3:] == [
        "# all: shm_off: NCCL_SHM_DISABLE=1",
        "# single: shm_off: NCCL_SHM_DISABLE=1",
        "NCCL_SHM_DISABLE=1",
    ]


def test_healthy_run_needs_nothing(tmp_path: Path) -> None:
    records = [pair("gpu0-gpu1-NV18", "inherited", "pass"), record("gpu0", "inherited", "pass", kind="single")]
    rec = recommend(make_run(tmp_path, records, simulated=True, inherited_env={"GLOO_SOCKET_IFNAME": "lo"}))
    assert rec.lines() == [
        SIMULATED,
        PER_CLASS,
        f"  NV18: inherited: {NOTHING}; bandwidth cost: not measured (only inherited passed)",
        f"  single: inherited: {NOTHING}; bandwidth cost: not measured (only inherited passed)",
        "nothing needs setting: every class passed with the environment as it is",
        "note: every rung ran on top of what the run inherited: GLOO_SOCKET_IFNAME=lo",
    ]
    assert rec.exports() == []
    assert env_file_text(rec) == "\n".join(
        [
            *header(tmp_path, simulated=True),
            "# NV18: inherited: nothing to set",
            "# single: inherited: nothing to set",
            "# note: every rung ran on top of what the run inherited: GLOO_SOCKET_IFNAME=lo",
            "# nothing needs setting: the environment as it is",
            "",
        ]
    )


def test_clean_rung_unsets_the_nccl_families(tmp_path: Path) -> None:
    records = [
        record("all4", "inherited", "hang", probe="all_reduce", kind="all"),
        record("all4", "clean", "pass", probe="all_reduce", kind="all", env={"NCCL_P2P_DISABLE": None}),
        pair("gpu0-gpu1-PIX", "inherited", "hang"),
        pair("gpu0-gpu1-PIX", "p2p_level_nvl", "pass"),
    ]
    inherited = {"NCCL_P2P_DISABLE": "0", "GLOO_SOCKET_IFNAME": "lo"}
    rec = recommend(make_run(tmp_path, records, inherited_env=inherited))
    unset = "unset every NCCL_*/TORCH_NCCL_* variable"
    assert rec.lines() == [
        PER_CLASS,
        "  PIX: p2p_level_nvl: export NCCL_P2P_LEVEL=NVL; bandwidth cost: not measured (only p2p_level_nvl passed)",
        f"  all: clean: {unset}; bandwidth cost: not measured (only clean passed)",
        "classes need different settings; they do not conflict, so their union serves every class:",
        f"  {unset}: needed by all",
        "  NCCL_P2P_LEVEL=NVL: needed by PIX",
        "  would then run on a broader setting than they need: PIX (needs p2p_level_nvl), all (needs clean)",
        f"  {unset}",
        "  export NCCL_P2P_LEVEL=NVL",
        "note: every rung ran on top of what the run inherited: GLOO_SOCKET_IFNAME=lo",
    ]
    assert env_file_text(rec) == "\n".join(
        [
            *header(tmp_path),
            "# PIX: p2p_level_nvl: NCCL_P2P_LEVEL=NVL",
            f"# all: clean: {unset}",
            "# broader setting than needed for: PIX (needs p2p_level_nvl), all (needs clean)",
            "# note: every rung ran on top of what the run inherited: GLOO_SOCKET_IFNAME=lo",
            f"# {unset} before these: a .env file cannot unset",
            "NCCL_P2P_LEVEL=NVL",
            "",
        ]
    )
    assert rec.to_json()["unset_families"] == ["NCCL_", "TORCH_NCCL_"]


def test_clean_alone_is_a_comment_in_the_env_file(tmp_path: Path) -> None:
    records = [
        record("gpu0", "inherited", "error", kind="single", probe="all_reduce"),
        record("gpu0", "clean", "pass", kind="single", probe="all_reduce", env={"NCCL_SHM_DISABLE": None}),
    ]
    rec = recommend(make_run(tmp_path, records))
    unset = "unset every NCCL_*/TORCH_NCCL_* variable"
    assert rec.lines()[-2:] == ["one setting serves every class:", f"  {unset}"]
    assert env_file_text(rec) == "\n".join(
        [*header(tmp_path), f"# single: clean: {unset}", f"# {unset} before these: a .env file cannot unset", ""]
    )


def test_conflicting_rungs_take_the_later_one_and_name_who_gets_more(tmp_path: Path) -> None:
    ladder = [
        {"name": r.name, "set": dict(r.set), "unset_families": list(r.unset_families)} for r in BUILTIN_LADDER
    ] + [
        {"name": "eth0", "set": {"NCCL_SOCKET_IFNAME": "eth0"}, "unset_families": []},
        {"name": "eth1", "set": {"NCCL_SOCKET_IFNAME": "eth1"}, "unset_families": []},
    ]
    records = [
        pair("gpu0-gpu2-NODE", "inherited", "hang"),
        pair("gpu0-gpu2-NODE", "eth0", "pass", env={"NCCL_SOCKET_IFNAME": "eth0"}),
        pair("gpu0-gpu4-SYS", "inherited", "hang"),
        pair("gpu0-gpu4-SYS", "eth0", "hang", env={"NCCL_SOCKET_IFNAME": "eth0"}),
        pair("gpu0-gpu4-SYS", "eth1", "pass", env={"NCCL_SOCKET_IFNAME": "eth1"}),
        record("gpu0", "inherited", "error", kind="single", probe="all_reduce"),
        record("gpu0", "shm_off", "pass", kind="single", probe="all_reduce"),
    ]
    rec = recommend(make_run(tmp_path, records, ladder=ladder))
    conflict = (
        "conflict: NCCL_SOCKET_IFNAME is eth0 for NODE (eth0), eth1 for SYS (eth1); "
        "using eth1 from eth1, the later rung"
    )
    assert rec.lines()[4:] == [
        "classes need conflicting settings:",
        f"  {conflict}",
        "  NCCL_SHM_DISABLE=1: needed by single",
        "  NCCL_SOCKET_IFNAME=eth1: needed by SYS",
        "  would then run on a broader setting than they need: "
        "NODE (needs eth0), SYS (needs eth1), single (needs shm_off)",
        "  export NCCL_SHM_DISABLE=1",
        "  export NCCL_SOCKET_IFNAME=eth1",
    ]
    assert rec.env == {"NCCL_SHM_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth1"}
    assert rec.to_json()["conflicts"] == [
        {
            "variable": "NCCL_SOCKET_IFNAME", "chosen": "eth1", "chosen_rung": "eth1",
            "wanted": [
                {"value": "eth0", "rung": "eth0", "class": "NODE"},
                {"value": "eth1", "rung": "eth1", "class": "SYS"},
            ],
        }
    ]  # fmt: skip
    assert f"# {conflict}" in env_file_text(rec).splitlines()
    assert env_file_text(rec).endswith("\nNCCL_SHM_DISABLE=1\nNCCL_SOCKET_IFNAME=eth1\n")


def test_no_rung_passes_points_at_the_failing_cases(tmp_path: Path) -> None:
    records = [
        record("all8", "inherited", "pass", probe="barrier", kind="all"),
        record("last_half-gpu4-gpu5", "inherited", "pass", probe="barrier", kind="last_half"),
        record("last_half-gpu4-gpu5", "inherited", "hang", probe="barrier_no_device_ids", kind="last_half"),
        record("last_half-gpu4-gpu5", "p2p_off", "crash", probe="barrier_no_device_ids", kind="last_half"),
    ]
    rec = recommend(make_run(tmp_path, records))
    assert rec.lines() == [
        PER_CLASS,
        f"  all: inherited: {NOTHING}; bandwidth cost: not measured (only inherited passed)",
        "  last_half: no rung passed (tried inherited, p2p_off): no environment fixes it; failing cases:",
        "    HANG suites/test_x.py::test_barrier_no_device_ids[last_half-gpu4-gpu5-inherited]",
        "    CRASH suites/test_x.py::test_barrier_no_device_ids[last_half-gpu4-gpu5-p2p_off]",
        "nothing needs setting: every class an environment fixes (not last_half) passed with the environment as it is",
    ]
    assert rec.unfixed == ["last_half"]
    assert rec.to_json()["classes"]["last_half"]["failing"] == [
        {"nodeid": "suites/test_x.py::test_barrier_no_device_ids[last_half-gpu4-gpu5-inherited]", "verdict": "hang"},
        {"nodeid": "suites/test_x.py::test_barrier_no_device_ids[last_half-gpu4-gpu5-p2p_off]", "verdict": "crash"},
    ]
    assert "# last_half: no environment fixes it (no rung passed; tried inherited, p2p_off)" in env_file_text(rec)
    only_broken = recommend(make_run(tmp_path, records[2:]))
    assert only_broken.lines()[-1] == "no environment fixes any class (last_half); see the failing cases above"


def test_wrong_data_on_any_rung_makes_the_machine_unfit(tmp_path: Path) -> None:
    records = [
        pair("gpu0-gpu1-PIX", "inherited", "fail"),
        pair("gpu0-gpu1-PIX", "cumem_off", "fail"),
        pair("gpu0-gpu1-PIX", "p2p_level_nvl", "pass"),
        pair("gpu0-gpu4-SYS", "inherited", "pass"),
        record("all2", "inherited", "fail", probe="all_reduce", kind="all", expected="fail"),  # negative control
    ]
    rec = recommend(make_run(tmp_path, records))
    assert rec.unfit
    assert rec.lines() == [
        f"NOT FIT FOR TRAINING: wrong data (verdict fail) in 2 cases; {UNFIT}:",
        "  FAIL suites/test_x.py::test_pair_exchange[gpu0-gpu1-PIX-inherited] (PIX, rung inherited): fail on inherited",
        "  FAIL suites/test_x.py::test_pair_exchange[gpu0-gpu1-PIX-cumem_off] (PIX, rung cumem_off): fail on cumem_off",
    ]
    assert rec.exports() == []
    assert env_file_text(rec) == "\n".join(
        [
            *header(tmp_path),
            f"# NOT FIT FOR TRAINING: wrong data (verdict fail); {UNFIT}",
            "#   FAIL suites/test_x.py::test_pair_exchange[gpu0-gpu1-PIX-inherited]",
            "#   FAIL suites/test_x.py::test_pair_exchange[gpu0-gpu1-PIX-cumem_off]",
            "",
        ]
    )
    data = rec.to_json()
    assert (data["unfit"], data["env"], data["exports"]) == (True, {}, [])
    assert [case["nodeid"].rsplit("-", 1)[1] for case in data["wrong_data"]] == ["inherited]", "cumem_off]"]


def test_bandwidth_cost_against_the_best_passing_rung(tmp_path: Path) -> None:
    busbw = "all_reduce busbw 1MiB"
    records = [
        # PIX: one pair passes only from p2p_level_nvl, the other everywhere (full matrix)
        pair("gpu0-gpu1-PIX", "inherited", "hang"),
        pair("gpu0-gpu1-PIX", "p2p_level_nvl", "pass", bandwidth=6.0),
        pair("gpu0-gpu1-PIX", "p2p_off", "pass", bandwidth=3.0),
        pair("gpu2-gpu3-PIX", "inherited", "pass", bandwidth=10.0),
        pair("gpu2-gpu3-PIX", "p2p_level_nvl", "pass", bandwidth=8.0),
        # all: inherited is slower than cumem_off at 1MiB
        record("all4", "inherited", "pass", probe="all_reduce", kind="all", busbw={"1MiB": 4.0, "64MiB": 8.0}),
        record("all4", "cumem_off", "pass", probe="all_reduce", kind="all", busbw={"1MiB": 5.0, "64MiB": 8.0}),
        # SYS: inherited is the fastest
        pair("gpu0-gpu4-SYS", "inherited", "pass", bandwidth=9.0),
        pair("gpu0-gpu4-SYS", "p2p_off", "pass", bandwidth=4.0),
        # single: no figure on its rung; NODE: figures of different probes only
        record("gpu0", "inherited", "pass", probe="all_reduce", kind="single"),
        record("gpu0", "cumem_off", "pass", probe="all_reduce", kind="single", busbw={"4B": 0.1}),
        pair("gpu0-gpu2-NODE", "inherited", "pass", bandwidth=5.0),
        pair("gpu0-gpu2-NODE", "inherited", "pass", probe="peer_copy"),
        pair("gpu0-gpu2-NODE", "cumem_off", "pass", probe="peer_copy", bandwidth=7.0),
    ]
    rec = recommend(make_run(tmp_path, records))
    costs = {c.name: c.bandwidth.text() for c in rec.classes if c.bandwidth}
    assert costs == {
        "PIX": "costs 30.0% against inherited (pair_exchange: 7.00 vs 10.00 GB/s)",
        "all": f"costs 20.0% against cumem_off ({busbw}: 4.00 vs 5.00 GB/s)",
        "SYS": "no cost: inherited is the fastest passing rung (pair_exchange: 9.00 GB/s)",
        "single": "not measured (no bandwidth figure on inherited)",
        "NODE": "not measured (no figure measured both on inherited and on another passing rung)",
    }
    assert rec.to_json()["classes"]["all"]["bandwidth"] == {
        "measured": True, "cost_percent": 20.0, "reason": None, "text": costs["all"],
        "comparisons": [
            {"figure": busbw, "gbps": 4.0, "best_gbps": 5.0, "best_rung": "cumem_off", "cost_percent": 20.0},
            {"figure": "all_reduce busbw 64MiB", "gbps": 8.0, "best_gbps": 8.0, "best_rung": "inherited",
             "cost_percent": 0.0},
        ],
    }  # fmt: skip
    assert rec.to_json()["classes"]["single"]["bandwidth"]["measured"] is False
    assert "  PIX: p2p_level_nvl: export NCCL_P2P_LEVEL=NVL; bandwidth cost: " + costs["PIX"] in rec.lines()


def test_a_case_failing_on_the_class_rung_is_a_caution(tmp_path: Path) -> None:
    records = [
        pair("gpu0-gpu4-SYS", "inherited", "hang"),
        pair("gpu0-gpu4-SYS", "p2p_off", "pass"),
        pair("gpu1-gpu5-SYS", "inherited", "pass"),
        pair("gpu1-gpu5-SYS", "p2p_off", "hang"),
    ]
    lines = recommend(make_run(tmp_path, records)).lines()
    assert lines[1:4] == [
        "  SYS: p2p_off: export NCCL_P2P_DISABLE=1; bandwidth cost: not measured (no bandwidth figure on p2p_off)",
        "    caution: on p2p_off these did not pass:",
        "      HANG suites/test_x.py::test_pair_exchange[gpu1-gpu5-SYS-p2p_off]",
    ]


def test_ladder_comes_from_the_run(tmp_path: Path) -> None:
    ladder = [
        {"name": "inherited", "set": {}, "unset_families": []},
        {"name": "ib0", "set": {"NCCL_IB_HCA": "mlx5_0"}, "unset_families": []},
    ]
    records = [
        pair("gpu0-gpu1-NV8", "inherited", "error"),
        pair("gpu0-gpu1-NV8", "ib0", "pass", env={"NCCL_IB_HCA": "mlx5_0"}),
    ]
    rec = recommend(make_run(tmp_path, records, ladder=ladder))
    assert rec.env == {"NCCL_IB_HCA": "mlx5_0"}
    # without run.json's ladder, a rung only the records name is read from their env
    rec = recommend(make_run(tmp_path, records))
    assert rec.lines()[1].startswith("  NV8: ib0: export NCCL_IB_HCA=mlx5_0;")
    for bad, message in (
        ("nope", "run.json: ladder is not a list of rungs"),
        ([{"name": "x", "set": {"A": 1}}], "run.json: ladder entry 1 is not {name, set, unset_families}: "),
        ([{"set": {}}], "run.json: ladder entry 1 is not {name, set, unset_families}: "),
        (["inherited"], "run.json: ladder entry 1 is not {name, set, unset_families}: "),
        ([{"name": "x", "unset_families": "NCCL_"}], "run.json: ladder entry 1 is not {name, set, unset_families}: "),
    ):
        with pytest.raises(RunError) as info:
            recommend(make_run(tmp_path, records, ladder=bad))
        assert str(info.value).startswith(message)


def test_an_empty_run_recommends_nothing(tmp_path: Path) -> None:
    rec = recommend(make_run(tmp_path, [record("gpu0", "inherited", "skip", kind="single")]))
    assert (rec.classes, rec.unfit) == ([], False)
    assert rec.lines() == ["nothing to recommend: no case ran that can be used (all skipped or negative controls)"]
    assert env_file_text(rec).splitlines()[-1] == "# nothing to recommend: no case ran that can be used"


def test_write_env_file(tmp_path: Path) -> None:
    run = make_run(tmp_path, sys_records())
    rec = recommend(run)
    (tmp_path / "recommended.env").write_text("old\n")
    path = write_env_file(run, rec)
    assert path == tmp_path / "recommended.env"
    assert path.read_text() == env_file_text(rec)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recommended.env"]
    with pytest.raises(RunError, match="no run folder to write recommended.env into"):
        write_env_file(Run("x.xml", RunFacts(), typed(sys_records())), rec)


# ---------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------

PREFIX = "python -m conformance recommend: "


def write_run(reports: Path, records: list[dict[str, Any]], facts: dict[str, Any] | None = None) -> Path:
    folder = reports / RUN_ID
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "run.json").write_text(json.dumps({"run_id": RUN_ID, **(facts or {})}))
    (reports / "latest").symlink_to(RUN_ID)
    return folder


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, list[str]]:
    capsys.readouterr()  # what came before (a pytester run's output) is not the command's
    status = main(["recommend", *args])
    out, err = capsys.readouterr()
    return status, out, err.splitlines()


def test_command_prints_and_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = tmp_path / "reports"
    folder = write_run(reports, sys_records())
    expected = recommend(load_run(folder))
    status, out, err = run_cli(capsys, "--reports-dir", str(reports))
    assert (status, err) == (0, [])
    env_file = folder.resolve() / "recommended.env"
    assert out.splitlines() == [
        f"recommended environment for run {RUN_ID} ({reports / 'latest'}):",
        *expected.lines(),
        f"(written to {env_file})",
    ]
    assert env_file.read_text() == env_file_text(expected)
    # a bare run id, the results file itself, reports/ in the working directory
    assert run_cli(capsys, RUN_ID, "--reports-dir", str(reports))[0] == 0
    assert run_cli(capsys, str(folder / "results.jsonl"))[0] == 0
    monkeypatch.chdir(tmp_path)
    status, out, _ = run_cli(capsys)
    assert status == 0 and out.splitlines()[0] == f"recommended environment for run {RUN_ID} (reports/latest):"


def test_command_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_run(tmp_path / "reports", sys_records())
    status, out, err = run_cli(capsys, str(folder), "--json")
    assert (status, err) == (0, [])
    data = json.loads(out)
    assert data == {**recommend(load_run(folder)).to_json(), "env_file": str(folder / "recommended.env")}
    assert data["env"] == {"NCCL_P2P_LEVEL": "NVL"}
    assert data["classes"]["SYS"]["rung"] == "p2p_level_nvl"
    assert data["classes"]["SYS"]["set"] == {"NCCL_P2P_LEVEL": "NVL"}
    assert data["run_id"] == RUN_ID


def test_command_unfit_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_run(tmp_path / "reports", [pair("gpu0-gpu1-PIX", "inherited", "fail")])
    status, out, err = run_cli(capsys, str(folder))
    assert (status, err) == (1, [])
    assert out.splitlines()[1].startswith("NOT FIT FOR TRAINING: wrong data (verdict fail) in 1 case; ")


def test_command_warns_about_unreadable_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_run(tmp_path / "reports", sys_records())
    with (folder / "results.jsonl").open("a") as out:
        out.write('{"nodeid": "cut')
    status, _, err = run_cli(capsys, str(folder))
    assert status == 0
    lines = len(sys_records())
    assert err == [f"{PREFIX}warning: {folder}/results.jsonl: line {lines + 1} is not whole JSON (cut off?); skipped"]


def test_command_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "reports"
    (tmp_path / "no-results").mkdir()
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe{}\n")
    (tmp_path / "broken.xml").write_text("<testsuites")
    cases = [
        ((str(tmp_path / "nope"),), f"{tmp_path / 'nope'}: no such run folder or file"),
        (("--reports-dir", str(reports)), f"{reports / 'latest'}: no such run folder or file"),
        ((str(tmp_path / "no-results"),), f"{tmp_path / 'no-results'}: not a run folder (no results.jsonl)"),
        ((str(tmp_path / "binary.jsonl"),), f"{tmp_path / 'binary.jsonl'}: cannot be read: "),
        ((str(tmp_path / "broken.xml"),), f"{tmp_path / 'broken.xml'}: not a readable JUnit XML file: "),
    ]
    for args, message in cases:
        status, out, err = run_cli(capsys, *args)
        assert (status, out, len(err)) == (2, "", 1), args
        assert err[0].startswith(PREFIX + message), err


@pytest.mark.parametrize(
    ("records", "facts", "message"),
    [
        ([], None, "nothing to recommend: the run recorded no case"),
        (
            [record("gpu0", "inherited", "skip", kind="single")],
            None,
            "nothing to recommend: the run has no case to go by (every case skipped or a negative control)",
        ),
        (sys_records(), {"ladder": {"inherited": {}}}, "run.json: ladder is not a list of rungs"),
    ],
)
def test_command_refuses_runs_it_cannot_use(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    records: list[dict[str, Any]],
    facts: dict[str, Any] | None,
    message: str,
) -> None:
    folder = write_run(tmp_path / "reports", records, facts)
    status, out, err = run_cli(capsys, str(folder))
    assert (status, out) == (2, "")
    prefix = f"{folder}/" if "ladder" in message else f"{folder}: "  # run.json's problems name its path
    assert err == [f"{PREFIX}{prefix}{message}"]
    assert not (folder / "recommended.env").exists()


# ---------------------------------------------------------------------------------------------
# real runs of the suites on simulated machines
# ---------------------------------------------------------------------------------------------

SCENARIOS = REPO / "scenarios"
TIMEOUTS = ("--step-timeout=3", "--op-timeout=2", "--init-timeout=2", "--grace=1")
WRONG_DATA = "send/recv 4B: 1 of 1 elements wrong; first at index 0: got 2.0, expected 1.0"


def finished(reports_dir: Path, result: pytest.RunResult, simulated: bool) -> tuple[Run, Recommendation, Path]:
    """The run read back; the session wrote the same .env file and showed the same lines."""
    run = load_run(reports_dir / "latest")
    rec = recommend(run)
    assert run.folder is not None
    assert (run.folder / "recommended.env").read_text() == env_file_text(rec)
    result.stdout.fnmatch_lines(["recommended environment:", *(line.replace("[", "[[]") for line in rec.lines())])
    assert rec.simulated is simulated
    return run, rec, run.folder


# An AMD box's cross-socket P2P hangs: NCCL uses P2P over SYS for a pair there (plan/transport.py).
AMD_SYS_HANG = SYS_P2P_HANG.replace("[scenario]\n", '[scenario]\ntopology = "topologies/pcie-2socket-8gpu.json"\n')


def on_three_gpus(folder: Path, scenario: str, cpu: str = "") -> Path:
    """A seed scenario's rules (a shipped name, or a scenario's text) on a 3-GPU cut of its 8-GPU PCIe box.

    gpu0 and gpu1 sit under one switch (PIX), gpu2 on the other socket: gpu0-gpu2 and gpu1-gpu2
    are SYS, so a class that fails has one leader and one follower.  ``cpu``: the box's CPU kind.
    """
    data = json.loads((SCENARIOS / "topologies" / "pcie-2socket-8gpu.json").read_text())
    picked = [0, 1, 4]
    devices = []
    for new, old in enumerate(picked):
        device = dict(data["devices"][old])
        device.update(index=new, name=f"gpu{new}", nvml_index=new)
        devices.append(device)
    links, p2p = {}, {}
    for i, a in enumerate(picked):
        for j, b in list(enumerate(picked))[i + 1 :]:
            links[f"gpu{i}-gpu{j}"] = data["links"][f"gpu{a}-gpu{b}"]
            p2p[f"gpu{i}-gpu{j}"] = data["p2p"][f"gpu{a}-gpu{b}"]
    assert links == {"gpu0-gpu1": "PIX", "gpu0-gpu2": "SYS", "gpu1-gpu2": "SYS"}
    data.update(devices=devices, links=links, p2p=p2p, note="simulated: 3 PCIe GPUs on two sockets", cpu=cpu)
    (folder / "pcie-3gpu.json").write_text(json.dumps(data))
    text = scenario if "\n" in scenario else (SCENARIOS / f"{scenario}.toml").read_text()
    assert 'topology = "topologies/pcie-2socket-8gpu.json"' in text
    path = folder / f"{'inline' if chr(10) in scenario else scenario}-3gpu.toml"
    path.write_text(text.replace("topologies/pcie-2socket-8gpu.json", "pcie-3gpu.json"))
    return path


@pytest.mark.usefixtures("isolated_env")
def test_sys_hang_recommends_p2p_level_nvl_for_sys_only(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = on_three_gpus(pytester.path, AMD_SYS_HANG, cpu="amd")
    suites = copy_suites(pytester, "test_pairs.py")
    result = run_suite(f"--scenario={scenario}", *TIMEOUTS, "-k", "test_pair_exchange", *suites)
    # the SYS leader hangs on inherited and on cumem_off, its follower on inherited
    outcomes = result.parseoutcomes()
    assert (outcomes["failed"], outcomes["passed"]) == (3, 3)
    run, rec, folder = finished(reports_dir, result, simulated=True)
    assert rec.lines() == [
        SIMULATED,
        PER_CLASS,
        f"  PIX: inherited: {NOTHING}; bandwidth cost: not measured (only inherited passed)",
        "  SYS: p2p_level_nvl: export NCCL_P2P_LEVEL=NVL; bandwidth cost: not measured (only p2p_level_nvl passed)",
        "classes need different settings; they do not conflict, so their union serves every class:",
        "  NCCL_P2P_LEVEL=NVL: needed by SYS",
        "  would then run on a broader setting than they need: PIX (needs inherited)",
        "  export NCCL_P2P_LEVEL=NVL",
    ]
    assert (folder / "recommended.env").read_text() == "\n".join(
        [
            f"# recommended environment from conformance run {run.run_id}",
            "# " + SIMULATED,
            ENV_USAGE,
            "# PIX: inherited: nothing to set",
            "# SYS: p2p_level_nvl: NCCL_P2P_LEVEL=NVL",
            "# broader setting than needed for: PIX (needs inherited)",
            "NCCL_P2P_LEVEL=NVL",
            "",
        ]
    )
    status, out, err = run_cli(capsys, "--reports-dir", str(reports_dir), "--json")
    assert (status, err) == (0, [])
    data = json.loads(out)
    assert {name: (c["rung"], c["set"]) for name, c in data["classes"].items()} == {
        "PIX": ("inherited", {}),
        "SYS": ("p2p_level_nvl", {"NCCL_P2P_LEVEL": "NVL"}),
    }
    assert (data["env"], data["unfit"], data["simulated"]) == ({"NCCL_P2P_LEVEL": "NVL"}, False, True)


@pytest.mark.usefixtures("isolated_env")
def test_wrong_data_scenario_is_not_fit_for_training(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = on_three_gpus(pytester.path, "wrong-data-p2p")
    suites = copy_suites(pytester, "test_pairs.py")
    result = run_suite(f"--scenario={scenario}", *TIMEOUTS, "-k", "test_pair_exchange", *suites)
    outcomes = result.parseoutcomes()  # the PIX pair fails on inherited and on cumem_off (cuMem P2P tried)
    assert (outcomes["failed"], outcomes["passed"]) == (2, 3)
    run, rec, folder = finished(reports_dir, result, simulated=True)
    assert rec.unfit
    nodeid = "suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-PIX-{}]"
    message = "rank 1 (gpu1) in verify (send/recv 4B): WrongData: " + WRONG_DATA
    assert rec.lines() == [
        SIMULATED,
        f"NOT FIT FOR TRAINING: wrong data (verdict fail) in 2 cases; {UNFIT}:",
        f"  FAIL {nodeid.format('inherited')} (PIX, rung inherited): {message}",
        f"  FAIL {nodeid.format('cumem_off')} (PIX, rung cumem_off): {message}",
    ]
    assert (folder / "recommended.env").read_text() == "\n".join(
        [
            f"# recommended environment from conformance run {run.run_id}",
            "# " + SIMULATED,
            ENV_USAGE,
            f"# NOT FIT FOR TRAINING: wrong data (verdict fail); {UNFIT}",
            f"#   FAIL {nodeid.format('inherited')}",
            f"#   FAIL {nodeid.format('cumem_off')}",
            "",
        ]
    )
    # the pairs would pass on p2p_level_nvl, yet nothing is recommended
    assert rec.to_json()["classes"]["PIX"]["rung"] == "p2p_level_nvl"
    status, out, err = run_cli(capsys, "--reports-dir", str(reports_dir))
    assert (status, err) == (1, [])
    assert "export" not in out


@pytest.mark.usefixtures("isolated_env")
def test_a_pair_over_shm_with_a_small_dev_shm_needs_shm_off(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    scenario = SCENARIOS / "container-dev-shm.toml"
    suites = copy_suites(pytester, "test_pairs.py")
    result = run_suite(f"--scenario={scenario}", *TIMEOUTS, "-k", "test_pair_exchange", *suites)
    outcomes = result.parseoutcomes()  # inherited and cumem_off fail, shm_off passes
    assert (outcomes["failed"], outcomes["passed"]) == (2, 1)
    run, rec, folder = finished(reports_dir, result, simulated=True)
    assert rec.lines() == [
        SIMULATED,
        PER_CLASS,
        "  PHB: shm_off: export NCCL_SHM_DISABLE=1; bandwidth cost: not measured (only shm_off passed)",
        "one setting serves every class:",
        "  export NCCL_SHM_DISABLE=1",
    ]
    assert (folder / "recommended.env").read_text().splitlines()[3:] == [
        "# PHB: shm_off: NCCL_SHM_DISABLE=1",
        "NCCL_SHM_DISABLE=1",
    ]


@pytest.mark.usefixtures("isolated_env")
def test_healthy_run_says_nothing_needs_setting(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    suites = copy_suites(pytester, "test_pairs.py", "test_collectives.py")
    result = run_suite("--virtual-devices=2", *suites)
    result.assert_outcomes(passed=11)
    run, rec, folder = finished(reports_dir, result, simulated=False)
    assert rec.lines() == [
        PER_CLASS,
        f"  CPU: inherited: {NOTHING}; bandwidth cost: not measured (only inherited passed)",
        f"  all: inherited: {NOTHING}; bandwidth cost: not measured (only inherited passed)",
        f"  single: inherited: {NOTHING}; bandwidth cost: not measured (only inherited passed)",
        "nothing needs setting: every class passed with the environment as it is",
    ]
    assert (folder / "recommended.env").read_text() == "\n".join(
        [
            f"# CPU ONLY: no GPU was tested ({run.facts.cpu_only})",  # first: nothing below is about a GPU
            f"# recommended environment from conformance run {run.run_id}",
            ENV_USAGE,
            "# CPU: inherited: nothing to set",
            "# all: inherited: nothing to set",
            "# single: inherited: nothing to set",
            "# nothing needs setting: the environment as it is",
            "",
        ]
    )
