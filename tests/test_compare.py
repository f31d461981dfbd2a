"""Baseline comparison: ``python -m conformance compare BASELINE CURRENT`` and ``compare()``.

One pair of real runs on a simulated 3-GPU PCIe box (gpu0-gpu1 PIX, both other pairs SYS) is
compared in every input form: the healthy baseline and a run whose SYS pairs hang while P2P is
on.  Everything else works on hand-made records: bandwidth drops, transport changes, fixes, new
and missing cases, matching by device identity, different machines and each kind of bad input.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conformance.cli.main import main
from conformance.record.records import CaseRecord, RunFacts
from conformance.record.runs import Run, load_run
from conformance.summarise.compare import CompareError, case_key, compare, match_id
from conformance.summarise.comparison import Comparison

RunSuite = Callable[..., pytest.RunResult]

UUIDS = [f"GPU-aaaa000{i}-0000-0000-0000-00000000000{i}" for i in range(3)]
LINKS = {"gpu0-gpu1": "PIX", "gpu0-gpu2": "SYS", "gpu1-gpu2": "SYS"}
DRIVER, CUDA = "550.54.15", "12.4"
TINY_TEST = """
def test_pair(conformance_case, device_pair):
    conformance_case("pair_exchange", device_pair, sizes=[4])
"""
SYS_P2P_HANG = """
[scenario]
name = "SYS pairs hang while P2P is on"

[[rule]]
effect = "hang"
phase = "probe"
probes = ["pair_exchange"]
links = ["SYS"]
p2p = true
"""
TIMEOUTS = ("--step-timeout=3", "--op-timeout=2", "--init-timeout=2", "--grace=1")
CASE = "test_tiny.py::test_pair[{}]"


def machine(uuids: list[str] = UUIDS) -> dict[str, Any]:
    """The simulated box, in the format ``python -m conformance topology --json`` writes."""
    devices = [
        {
            "index": i, "kind": "gpu", "memory_mib": 24564, "mig": False, "model": "NVIDIA L4", "name": f"gpu{i}",
            "numa_node": 0 if i < 2 else 1, "nvml_index": i, "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0",
            "uuid": uuid,
        }
        for i, uuid in enumerate(uuids)
    ]  # fmt: skip
    return {
        "cuda_driver": CUDA, "driver": DRIVER, "kind": "gpu", "source": "file", "note": "3 PCIe GPUs", "cpu": "amd",
        "devices": devices, "links": LINKS, "p2p": {},
    }  # fmt: skip


def write_tiny_suite(pytester: pytest.Pytester) -> tuple[str, str]:
    """The tiny test file, the topology and the scenario: (topology option, scenario option)."""
    pytester.makepyfile(test_tiny=TINY_TEST)
    (pytester.path / "box.json").write_text(json.dumps(machine()))
    (pytester.path / "sys-p2p-hang.toml").write_text(SYS_P2P_HANG)
    return f"--topology-file={pytester.path / 'box.json'}", f"--scenario={pytester.path / 'sys-p2p-hang.toml'}"


pytestmark = pytest.mark.usefixtures("isolated_env")


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def cli_json(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, dict[str, Any]]:
    status, out, err = cli(capsys, "compare", "--json", *args)
    assert err == ""
    return status, json.loads(out)


def cases(entries: list[dict[str, Any]], *fields: str) -> list[tuple[Any, ...]]:
    return [(e["case"], *(e[f] for f in fields)) for e in entries]


# --------------------------------------------------------------------------------------------
# real runs
# --------------------------------------------------------------------------------------------

HANGING = ["gpu0-gpu2-SYS-inherited", "gpu1-gpu2-SYS-inherited"]
FALLBACKS = [  # the class leader tries cumem_off (it hangs too); nvls_off, cumem_host_off: no NVLink, no SHM
    ("gpu0-gpu2-SYS-cumem_off", "hang"),
    ("gpu0-gpu2-SYS-p2p_level_nvl", "pass"),
    ("gpu1-gpu2-SYS-p2p_level_nvl", "pass"),
]


@pytest.mark.slow
def test_real_runs_in_every_input_form(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topology, scenario = write_tiny_suite(pytester)
    run_suite(topology, "--junitxml=baseline.xml", "test_tiny.py")
    baseline = (reports_dir / "latest").resolve()
    run_suite(topology, scenario, *TIMEOUTS, "--junitxml=current.xml", "test_tiny.py")
    current = (reports_dir / "latest").resolve()
    capsys.readouterr()  # what pytester echoed
    assert baseline != current
    verdicts = [(r.nodeid, r.verdict) for r in load_run(current).records]
    assert sorted(verdicts) == sorted(
        [(CASE.format("gpu0-gpu1-PIX-inherited"), "pass")]
        + [(CASE.format(c), "hang") for c in HANGING]
        + [(CASE.format(c), v) for c, v in FALLBACKS]
    )
    assert [r.verdict for r in load_run(baseline).records] == ["pass"] * 3

    forms = {
        "run folder": (baseline, current),
        "results.jsonl": (baseline / "results.jsonl", current / "results.jsonl"),
        "JUnit XML": (pytester.path / "baseline.xml", pytester.path / "current.xml"),
        "mixed": (pytester.path / "baseline.xml", current / "results.jsonl"),
    }
    for form, (old, new) in forms.items():
        status, report = cli_json(capsys, old, new)
        assert status == 1, form
        assert cases(report["regressions"], "kind", "baseline", "current", "summary", "link", "device_ids") == [
            (CASE.format(HANGING[0]), "verdict", "pass", "hang", "ranks 0,1 all stuck in probe (send/recv 4B)",
             "SYS", [UUIDS[0], UUIDS[2]]),
            (CASE.format(HANGING[1]), "verdict", "pass", "hang", "ranks 0,1 all stuck in probe (send/recv 4B)",
             "SYS", [UUIDS[1], UUIDS[2]]),
        ], form  # fmt: skip
        assert cases(report["new"], "verdict") == [(CASE.format(c), v) for c, v in FALLBACKS], form
        assert (report["fixes"], report["missing"], report["transport_changes"]) == ([], [], []), form
        # the PIX pair passes on both sides; a simulated run's bandwidth is gloo on CPU, not compared
        assert report["counts"]["matched"] == 3 and report["counts"]["bandwidth_not_compared"] == 1, form
        assert (report["baseline"]["run_id"], report["current"]["run_id"]) == (baseline.name, current.name)

    for form, (old, new) in forms.items():  # each side against itself
        for side in (old, new):
            status, report = cli_json(capsys, side, side)
            assert status == 0, form
            assert report["regressions"] == [] and report["new"] == [] and report["missing"] == []

    # the other way round: the hangs are fixed, the fallback rungs are missing (not regressions)
    status, report = cli_json(capsys, current, baseline)
    assert status == 0
    assert cases(report["fixes"], "baseline", "current") == [(CASE.format(c), "hang", "pass") for c in HANGING]
    assert cases(report["missing"], "verdict") == [(CASE.format(c), v) for c, v in FALLBACKS]

    status, out, err = cli(capsys, "compare", baseline, current)
    assert (status, err) == (1, "")
    lines = out.splitlines()
    assert lines[
        0
    ] == f"baseline: {baseline} (run {baseline.name}, host {os.uname().nodename}, 3 cases, SIMULATED): " + (
        f"driver {DRIVER}, cuda {CUDA}, nccl -, torch {load_run(baseline).facts.torch}"
    )
    first = lines.index("REGRESSIONS (2):")
    assert lines[first + 2].split() == [
        "verdict",
        CASE.format(HANGING[0]),
        "pass",
        "hang",
        *"ranks 0,1 all stuck in probe (send/recv 4B)".split(),
    ]
    assert lines[first + 4] == ""
    assert lines[first + 5] == f"NEW CASES (only in the current run) ({len(FALLBACKS)}):"
    assert lines[-1] == (
        "REGRESSED: 2 regression(s) (2 verdict, 0 bandwidth below 0.8x), 0 fix(es), 0 other verdict change(s), "
        f"0 transport change(s), {len(FALLBACKS)} new, 0 missing; 3 case(s) matched"
    )


# --------------------------------------------------------------------------------------------
# hand-made records
# --------------------------------------------------------------------------------------------

HOST = "gpu-box-1"


def typed(records: list[dict[str, Any]]) -> list[CaseRecord]:
    return [CaseRecord.from_json(r) for r in records]


def record(pair: str = "gpu0-gpu1", rung: str = "inherited", verdict: str = "pass", **fields: Any) -> dict[str, Any]:
    """A pair_exchange record as the suite writes it; ``fields`` override."""
    names = pair.split("-")
    link = LINKS[pair] if pair in LINKS else "PIX"
    made = {
        "schema": 1, "run_id": "run-1", "nodeid": f"suites/test_pairs.py::test_pair_exchange[{pair}-{link}-{rung}]",
        "probe": "pair_exchange", "devices": names, "device_ids": [UUIDS[int(n[3:])] for n in names],
        "link": link, "set_kind": "pair", "ladder_key": f"test_pair_exchange[{pair}-{link}]", "backend": "nccl",
        "env_name": rung, "verdict": verdict, "expected_verdict": None, "summary": "", "bandwidth_gbps": 20.0,
        "metrics": {"bandwidth_gbps": 20.0}, "transports": {"P2P_IPC/read": 4}, "simulated": False,
    }  # fmt: skip
    made.update(fields)
    return made


def run(*records: dict[str, Any], host: str | None = HOST, uuids: list[str] = UUIDS, source: str = "run") -> Run:
    facts = {"host": host, "run_id": source, "topology": machine(uuids), "torch": "2.5.1", "nccl": "2.21.5"}
    return Run(source, RunFacts.from_json(facts if host else {}), typed(list(records)))


def test_bandwidth_drops_below_the_tolerance_are_regressions() -> None:
    busbw = {"4B": 0.002, "1MiB": 10.0, "64MiB": 100.0}
    old = run(record(bandwidth_gbps=20.0, metrics={"busbw_gbps": busbw}))
    lower = {"4B": 0.002, "1MiB": 7.9, "64MiB": 80.0}  # 0.79x is below 0.8, 0.8x is not
    new = run(record(bandwidth_gbps=10.0, metrics={"busbw_gbps": lower}))
    comparison = compare(old, new)
    assert [(r["kind"], r["metric"], r["baseline"], r["current"], r["ratio"]) for r in comparison.regressions] == [
        ("bandwidth", "bandwidth_gbps", 20.0, 10.0, 0.5),
        ("bandwidth", "busbw_gbps 1MiB", 10.0, 7.9, 0.79),
    ]
    assert comparison.regressions[0]["case"] == "suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-PIX-inherited]"
    assert comparison.exit_status == 1
    assert compare(old, new, tolerance=0.5).regressions == []
    assert compare(old, new, tolerance=0.5).exit_status == 0
    table = comparison.lines()
    start = table.index("REGRESSIONS (2):")
    assert [line.split() for line in table[start + 2 : start + 4]] == [
        ["bandwidth", "suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-PIX-inherited]", "20", "GB/s", "10", "GB/s",
         "bandwidth_gbps:", "0.5x"],
        ["bandwidth", "suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-PIX-inherited]", "10", "GB/s", "7.9", "GB/s",
         "busbw_gbps", "1MiB:", "0.79x"],
    ]  # fmt: skip
    assert table[-1].startswith("REGRESSED: 2 regression(s) (0 verdict, 2 bandwidth below 0.8x)")


def test_bandwidth_compared_only_where_both_sides_pass_and_measured() -> None:
    old = run(record(), record("gpu0-gpu2", bandwidth_gbps=None), record("gpu1-gpu2", simulated=True))
    new = run(
        record(bandwidth_gbps=1.0, verdict="hang"),  # a verdict regression, not also a bandwidth one
        record("gpu0-gpu2", bandwidth_gbps=1.0),  # nothing measured before
        record("gpu1-gpu2", bandwidth_gbps=1.0, simulated=True),  # simulated: gloo on CPU
    )
    comparison = compare(old, new)
    assert [(r["kind"], r["case"]) for r in comparison.regressions] == [
        ("verdict", "suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-PIX-inherited]")
    ]
    assert comparison.bandwidth_not_compared == 1


def test_changed_transports_are_reported_but_not_regressions() -> None:
    old = run(record(), record("gpu0-gpu2", transports={}))
    new = run(record(transports={"SHM": 2}), record("gpu0-gpu2", transports={"SHM": 2}))
    comparison = compare(old, new)
    assert comparison.transport_changes == [
        {
            "case": "suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-PIX-inherited]", "probe": "pair_exchange",
            "devices": ["gpu0", "gpu1"], "device_ids": UUIDS[:2], "link": "PIX", "env_name": "inherited",
            "baseline": ["P2P_IPC/read"], "current": ["SHM"],
        }
    ]  # fmt: skip
    assert comparison.regressions == [] and comparison.exit_status == 0
    assert "TRANSPORT CHANGES (reported, not regressions) (1):" in comparison.lines()
    # the same transports counted differently (more channels) is no change
    assert compare(old, run(record(transports={"P2P_IPC/read": 8}))).transport_changes == []


def test_fixes_other_changes_new_and_missing() -> None:
    old = run(
        record("gpu0-gpu1", verdict="hang"),
        record("gpu0-gpu2", verdict="hang"),
        record("gpu1-gpu2"),
        record("gpu0-gpu1", rung="p2p_level_nvl"),
    )
    new = run(
        record("gpu0-gpu1"),
        record("gpu0-gpu2", verdict="error", summary="rank 1: NCCL error"),  # still failing, less badly
        record("gpu1-gpu2"),
        record("gpu1-gpu2", rung="p2p_off", verdict="error"),
    )
    comparison = compare(old, new)
    prefix = "suites/test_pairs.py::test_pair_exchange"
    assert cases(comparison.fixes, "baseline", "current") == [(f"{prefix}[gpu0-gpu1-PIX-inherited]", "hang", "pass")]
    assert cases(comparison.verdict_changes, "baseline", "current", "summary") == [
        (f"{prefix}[gpu0-gpu2-SYS-inherited]", "hang", "error", "rank 1: NCCL error")
    ]
    assert cases(comparison.new, "verdict", "env_name") == [(f"{prefix}[gpu1-gpu2-SYS-p2p_off]", "error", "p2p_off")]
    assert cases(comparison.missing, "verdict") == [(f"{prefix}[gpu0-gpu1-PIX-p2p_level_nvl]", "pass")]
    assert comparison.regressions == [] and comparison.exit_status == 0
    assert comparison.counts() == {
        "matched": 3, "regressions": 0, "verdict_regressions": 0, "bandwidth_drops": 0, "links_changed": 0,
        "gpus_lost": 0, "machine_faults": 0, "fixes": 1, "verdict_changes": 1, "transport_changes": 0, "new": 1,
        "missing": 1, "bandwidth_not_compared": 0,
    }  # fmt: skip
    assert json.loads(json.dumps(comparison.to_json()))["counts"] == comparison.counts()


def test_a_worse_verdict_is_a_regression_and_wrong_data_turns_the_machine_not_fit() -> None:
    """Hang -> fail (wrong data): the worst verdict, filed once as OTHER VERDICT CHANGES; and NOT FIT now."""
    old = run(record("gpu0-gpu2", verdict="hang"), record("gpu1-gpu2", verdict="error"))
    new = run(record("gpu0-gpu2", verdict="fail", summary="rank 1: wrong data"), record("gpu1-gpu2", verdict="hang"))
    comparison = compare(old, new)
    prefix = "suites/test_pairs.py::test_pair_exchange"
    assert [(r["kind"], r["metric"], r["baseline"], r["current"]) for r in comparison.regressions] == [
        ("machine", "NOT FIT", "fit", "NOT FIT"), ("verdict", "verdict", "hang", "fail"),
        ("verdict", "verdict", "error", "hang"),
    ]  # fmt: skip
    assert comparison.regressions[0]["summary"] == f"wrong data: {prefix}[gpu0-gpu2-SYS-inherited]"
    assert comparison.verdict_changes == [] and comparison.exit_status == 1
    fixed = compare(new, old)  # fail -> hang, hang -> error: better, still failing: changes, no regression
    assert fixed.regressions == [] and len(fixed.verdict_changes) == 2 and fixed.exit_status == 0


def test_every_verdict_but_pass_is_a_regression_and_negative_controls_compare_as_usual() -> None:
    worse = ["fail", "hang", "crash", "error", "inconclusive", "skip"]
    pairs = ["gpu0-gpu1", "gpu0-gpu2", "gpu1-gpu2"]
    rungs = ["inherited", "clean"]
    slots = [(p, r) for r in rungs for p in pairs]
    old = run(*(record(p, r) for p, r in slots), record(rung="x", expected_verdict="error", verdict="error"))
    new = run(
        *(record(p, r, verdict=v) for (p, r), v in zip(slots, worse, strict=True)),
        record(rung="x", expected_verdict="error", verdict="error"),
    )
    comparison = compare(old, new)
    assert [(r["current"], r["env_name"]) for r in comparison.regressions if r["kind"] == "verdict"] == [
        (v, r) for (_, r), v in zip(slots, worse, strict=True)
    ]
    assert comparison.regressions[0]["metric"] == "NOT FIT"  # the wrong data among them
    assert comparison.matched == 7 and comparison.verdict_changes == [] and comparison.fixes == []
    # the negative control now passing is a verdict change like any other: reported as a fix
    fixed = compare(old, run(record(rung="x", expected_verdict="error", verdict="pass")))
    assert cases(fixed.fixes, "baseline", "current") == [
        ("suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-PIX-x]", "error", "pass")
    ]


def test_cases_match_by_device_identity_not_by_name() -> None:
    # CUDA_VISIBLE_DEVICES=1,2 names the same two GPUs gpu0 and gpu1: still the same case
    renamed = record(
        "gpu0-gpu1", verdict="hang", device_ids=UUIDS[1:], link="SYS",
        nodeid="suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-SYS-inherited]",
        ladder_key="test_pair_exchange[gpu0-gpu1-SYS]",
    )  # fmt: skip
    original = record("gpu1-gpu2")
    assert match_id(CaseRecord.from_json(original)) == (
        f"test_pairs.py::test_pair_exchange[{UUIDS[1]}-{UUIDS[2]}-inherited]"  # the link class is no part of it
    )
    assert case_key(CaseRecord.from_json(renamed)) == case_key(CaseRecord.from_json(original))
    comparison = compare(run(original, record()), run(renamed))
    assert cases(comparison.regressions, "baseline", "current") == [
        ("suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-SYS-inherited]", "pass", "hang")
    ]
    assert cases(comparison.missing, "verdict") == [
        ("suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-PIX-inherited]", "pass")
    ]
    # the same names on other GPUs are other cases: nothing matches
    other = [u.replace("aaaa", "bbbb") for u in UUIDS]
    elsewhere = run(record(device_ids=other[:2], verdict="hang"), host="gpu-box-2", uuids=other)
    allowed = compare(run(record()), elsewhere, allow_different_machines=True)
    assert (allowed.matched, len(allowed.new), len(allowed.missing), allowed.exit_status) == (0, 1, 1, 0)
    assert allowed.machines == "hosts differ: gpu-box-1 / gpu-box-2"
    # a set named without device names (all2) is told apart by its device ids alone
    all2 = {"set_kind": "all", "link": "all", "nodeid": "suites/test_collectives.py::test_all_reduce[all2-inherited]"}
    apart = compare(run(record(**all2)), run(record(device_ids=other[:2], **all2)), allow_different_machines=True)
    assert (apart.matched, len(apart.new), len(apart.missing)) == (0, 1, 1)
    assert "different machines (allowed): hosts differ: gpu-box-1 / gpu-box-2" in allowed.lines()


def test_device_names_replaced_as_whole_words_only() -> None:
    many = record(devices=["gpu1", "gpu10"], device_ids=["U1", "U10"], nodeid="dir/test_gpu1.py::t[gpu1-gpu10-x]")
    assert match_id(CaseRecord.from_json(many)) == "test_gpu1.py::t[U1-U10-x]"
    cpu = CaseRecord.from_json({"ladder_key": "t[cpu0]", "devices": ["cpu0"], "device_ids": ["cpu0"]})
    assert match_id(cpu) == "t[cpu0]"


def test_different_machines_refused_unless_allowed() -> None:
    other = [u.replace("aaaa", "bbbb") for u in UUIDS]
    with pytest.raises(CompareError, match=r"^the runs come from different machines \(hosts differ: gpu-box-1 / "):
        compare(run(record()), run(record(), host="gpu-box-2"))
    # the same host name, other GPUs
    with pytest.raises(CompareError, match=r"device ids differ: 3 only in the baseline \(GPU-aaaa0000-"):
        compare(run(record()), run(record(device_ids=other[:2]), uuids=other))
    # no run.json: the device ids the records name
    without_facts = run(record(device_ids=other[:2]), host=None)
    with pytest.raises(CompareError, match="device ids differ: 2 only in the baseline"):
        compare(run(record(), host=None), without_facts)
    assert compare(run(record(), host=None), without_facts, allow_different_machines=True).matched == 0
    # a run that saw part of the machine (CUDA_VISIBLE_DEVICES, -k) is the same machine
    assert compare(run(record()), run(record("gpu1-gpu2"), uuids=UUIDS[1:])).machines is None
    assert compare(run(record(), host=None), run(record())).matched == 1


def test_bad_runs_refused() -> None:
    garbage = Run("garbage.jsonl", RunFacts(), [], ["garbage.jsonl: line 1 is not whole JSON (cut off?); skipped"])
    with pytest.raises(CompareError, match=r"^garbage.jsonl: no readable record \(garbage.jsonl: line 1 is not"):
        compare(run(record()), garbage)
    foreign = Run("other.jsonl", RunFacts(), typed([{"a": 1}, {"verdict": "pass"}]))
    with pytest.raises(CompareError, match=r"^other.jsonl: no record of this suite \(none of 2 has a verdict"):
        compare(foreign, run(record()))
    with pytest.raises(CompareError, match=r"^both runs are empty \(a, b\): no case to compare$"):
        compare(Run("a", RunFacts(), []), Run("b", RunFacts(), []))
    with pytest.raises(CompareError, match="must be a ratio above 0 and at most 1"):
        compare(run(record()), run(record()), tolerance=0)
    # one empty side is a comparison: everything new
    assert len(compare(Run("a", RunFacts(), []), run(record())).new) == 1


def test_repeated_cases_and_reading_warnings_are_said() -> None:
    cut = "results.jsonl: line 3 is not whole JSON (cut off?); skipped"
    new = Run("current", RunFacts(), typed([record(verdict="hang"), record()]), [cut])
    comparison = compare(run(record()), new)
    assert comparison.regressions == []  # the last record of a case counts
    assert comparison.warnings == [
        cut,
        "current: 1 case(s) recorded more than once; the last record of each is compared",
    ]
    assert comparison.lines()[-4:-2] == [f"warning: {w}" for w in comparison.warnings]


# --------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------


def write_run(folder: Path, *records: dict[str, Any], host: str = HOST, lines: list[str] | None = None) -> Path:
    folder.mkdir(parents=True)
    facts = {"host": host, "run_id": folder.name, "topology": machine(), "torch": "2.5.1", "nccl": "2.21.5"}
    (folder / "run.json").write_text(json.dumps(facts))
    text = [json.dumps(r) for r in records] + (lines or [])
    (folder / "results.jsonl").write_text("".join(f"{line}\n" for line in text))
    return folder


def test_command_exit_status_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write_run(tmp_path / "old", record(), record("gpu0-gpu2"))
    new = write_run(tmp_path / "new", record(), record("gpu0-gpu2", verdict="crash"), lines=['{"verdict": "pa'])
    status, out, err = cli(capsys, "compare", "--json", old, new)
    assert status == 1
    cut = f"{new}/results.jsonl: line 3 is not whole JSON (cut off?); skipped"
    assert err == f"python -m conformance compare: warning: {cut}\n"
    report = json.loads(out)
    assert cases(report["regressions"], "baseline", "current") == [
        ("suites/test_pairs.py::test_pair_exchange[gpu0-gpu2-SYS-inherited]", "pass", "crash")
    ]
    assert report["baseline"]["versions"] == {"driver": DRIVER, "cuda": CUDA, "nccl": "2.21.5", "torch": "2.5.1"}
    assert report["exit_status"] == 1 and report["bandwidth_tolerance"] == 0.8
    status, out, _ = cli(capsys, "compare", "--reports-dir", tmp_path, "old", "old")  # bare run ids
    assert status == 0
    assert out.splitlines()[-1].startswith("no regressions: 0 regression(s)")
    assert "warning:" not in out  # warnings go to stderr only
    status, out, err = cli(capsys, "compare", "--bandwidth-tolerance=0.001", new, new)
    assert status == 0 and "warning:" not in out and err.count("warning:") == 2


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "nowhere", "{d}/nowhere: no such run folder or file"),
        (
            lambda d: write_text(d / "r.jsonl", "garbage\nmore garbage\n"),
            "{d}/r.jsonl: no readable record ({d}/r.jsonl: line 1",
        ),
        (lambda d: write_text(d / "r.jsonl", '{"a": 1}\n'), "{d}/r.jsonl: no record of this suite (none of 1 has"),
        (lambda d: write_text(d / "r.xml", "<testsuites><testsuite"), "{d}/r.xml: not a readable JUnit XML file: "),
        (
            lambda d: write_text(
                d / "r.xml", '<testsuites><testsuite name="x"><testcase name="t"/></testsuite></testsuites>'
            ),
            "{d}/r.xml: no testsuite carries the suite's conformance.* properties",
        ),
        (lambda d: write_bytes(d / "r.jsonl", b"\xff\xfe{}\n"), "{d}/r.jsonl: cannot be read: 'utf-8' codec"),
        (lambda d: (d / "folder").mkdir() or d / "folder", "{d}/folder: not a run folder (no results.jsonl)"),
    ],
    ids=[
        "missing",
        "garbage-jsonl",
        "not-records",
        "unreadable-xml",
        "junit-without-properties",
        "binary",
        "no-results",
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Callable[[Path], Path], message: str
) -> None:
    good = write_run(tmp_path / "good", record())
    bad = make(tmp_path)
    for args in ((good, bad), (bad, good)):
        status, out, err = cli(capsys, "compare", *args)
        assert (status, out) == (2, "")
        assert err.startswith(f"python -m conformance compare: {message.format(d=tmp_path)}")
        assert err.count("\n") == 1


def write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_two_empty_runs_and_different_machines_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = write_run(tmp_path / "empty")
    status, _, err = cli(capsys, "compare", empty, empty)
    assert (status, err) == (
        2,
        f"python -m conformance compare: both runs are empty ({empty}, {empty}): no case to compare\n",
    )
    here = write_run(tmp_path / "here", record())
    there = write_run(tmp_path / "there", record(verdict="hang"), host="gpu-box-2")
    status, out, err = cli(capsys, "compare", here, there)
    assert (status, out) == (2, "")
    assert err == (
        "python -m conformance compare: the runs come from different machines (hosts differ: gpu-box-1 / gpu-box-2); "
        "compare them anyway with --allow-different-machines\n"
    )
    # the same GPUs under another host name (a topology file replayed): allowed, and the cases match
    status, out, _ = cli(capsys, "compare", "--allow-different-machines", here, there)
    assert status == 1
    assert "different machines (allowed): hosts differ: gpu-box-1 / gpu-box-2" in out.splitlines()
    status, _, err = cli(capsys, "compare", "--bandwidth-tolerance=1.5", here, here)
    assert status == 2 and err.count("\n") == 1 and "'1.5' must be a ratio above 0 and at most 1" in err


def test_comparison_api_shape() -> None:
    comparison = compare(run(record()), run(record(verdict="hang")), 0.8, False)
    assert isinstance(comparison, Comparison) and issubclass(CompareError, ValueError)
    assert comparison.exit_status == 1
    assert comparison.regressions == [
        {
            "case": "suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-PIX-inherited]", "probe": "pair_exchange",
            "devices": ["gpu0", "gpu1"], "device_ids": UUIDS[:2], "link": "PIX", "env_name": "inherited",
            "kind": "verdict", "metric": "verdict", "baseline": "pass", "current": "hang", "summary": "",
        }
    ]  # fmt: skip


def host_check(verdict: str, soft: str) -> dict[str, Any]:
    """A host check's record as the suite writes it (conformance/host_checks.py): no devices, no rung."""
    return {
        "schema": 1, "run_id": "run-1", "nodeid": "suites/test_environment.py::test_open_file_limit",
        "probe": "host:open_files", "verdict": verdict, "set_kind": "host", "summary": f"soft {soft}",
        "metrics": {"nofile_soft": soft},
    }  # fmt: skip


def test_a_host_check_that_stops_passing_is_a_regression() -> None:
    comparison = compare(run(record(), host_check("pass", "1024")), run(record(), host_check("error", "512")))
    assert cases(comparison.regressions, "baseline", "current", "summary") == [
        ("suites/test_environment.py::test_open_file_limit", "pass", "error", "soft 512")
    ]
    assert comparison.matched == 2 and comparison.exit_status == 1


# --------------------------------------------------------------------------------------------
# the machine: a GPU lost, a link changed, a health check that fails now
# --------------------------------------------------------------------------------------------

BUS_IDS = [f"0000:{0x18 + i:02x}:00.0" for i in range(3)]


def inventoried(topology: dict[str, Any], listed: list[str]) -> dict[str, Any]:
    return {**topology, "inventory": {"pci_gpus": BUS_IDS, "nvml_gpus": listed}}


def run_on(listed: list[str], visible: list[int], *records: dict[str, Any]) -> Run:
    """A run whose machine's NVML lists ``listed`` bus ids and which tested the GPUs ``visible``."""
    topology = machine()
    topology["devices"] = [topology["devices"][i] for i in visible]
    facts = {"host": HOST, "run_id": "r", "topology": inventoried(topology, listed), "torch": "2.5.1"}
    return Run("run", RunFacts.from_json(facts), typed(list(records)))


def test_a_gpu_the_machine_no_longer_has_is_a_regression_whatever_the_run_tested() -> None:
    baseline = run_on(BUS_IDS, [0, 1, 2], record("gpu0-gpu1"), record("gpu0-gpu2"), record("gpu1-gpu2"))
    current = run_on(BUS_IDS[:2], [0, 1], record("gpu0-gpu1"))
    comparison = compare(baseline, current)
    assert [(r["kind"], r["metric"], r["case"]) for r in comparison.regressions] == [
        ("machine", "GPU lost", f"gpu2 ({UUIDS[2]}, {BUS_IDS[2]})")
    ]
    assert comparison.exit_status == 1
    lines = comparison.lines()
    assert lines[-1].startswith("REGRESSED: 1 regression(s) (1 GPU lost, 0 verdict, 0 bandwidth below 0.8x)")
    assert any(line.split()[:3] == ["GPU", "lost", "gpu2"] for line in lines)
    # the same machine with a GPU hidden on purpose (CUDA_VISIBLE_DEVICES=0,1): nothing lost
    hidden = compare(baseline, run_on(BUS_IDS, [0, 1], record("gpu0-gpu1")))
    assert (hidden.regressions, hidden.exit_status) == ([], 0)
    # a run from before inventories says nothing of the GPUs it did not test
    old = Run("run", RunFacts.from_json({"host": HOST, "topology": machine()}), typed([record("gpu0-gpu1")]))
    assert compare(baseline, old).regressions == []


def test_a_pair_whose_link_changed_is_one_regression_not_a_case_gone_and_a_new_one() -> None:
    def pair(link: str, probe: str, verdict: str = "pass") -> dict[str, Any]:
        return record("gpu0-gpu1", verdict=verdict, link=link, probe=probe,
                      nodeid=f"suites/test_pairs.py::test_{probe}[gpu0-gpu1-{link}-inherited]",
                      ladder_key=f"test_{probe}[gpu0-gpu1-{link}]")  # fmt: skip

    baseline = run(pair("NV18", "pair_exchange"), pair("NV18", "p2p_copy"))
    comparison = compare(baseline, run(pair("NV17", "pair_exchange"), pair("NV17", "p2p_copy")))
    assert (comparison.new, comparison.missing, comparison.matched) == ([], [], 2)
    assert [(r["kind"], r["baseline"], r["current"]) for r in comparison.regressions] == [("link", "NV18", "NV17")]
    assert comparison.regressions[0]["summary"].startswith("gpu0-gpu1 was NV18, now NV17")
    assert comparison.exit_status == 1 and "1 link changed" in comparison.lines()[-1]


def test_a_health_check_that_passed_and_fails_now_is_a_regression() -> None:
    def check(verdict: str) -> dict[str, Any]:
        nodeid = "suites/test_environment.py::test_gpu_inventory"
        summary = "1 GPU(s) on the PCI bus that NVML does not list"
        return {"schema": 1, "nodeid": nodeid, "probe": "host:gpu_inventory", "verdict": verdict, "set_kind": "host",
                "summary": summary}  # fmt: skip

    comparison = compare(run(check("pass"), record()), run(check("error"), record()))
    assert [(r["kind"], r["case"], r["current"]) for r in comparison.regressions] == [
        ("verdict", "suites/test_environment.py::test_gpu_inventory", "error")
    ]
    assert comparison.exit_status == 1


def test_error_counters_that_grew_and_an_xid_during_the_run_are_regressions() -> None:
    def watched(grown: int, xids: list[dict[str, Any]]) -> Run:
        gpu = {"errors_start": {"nvlink2 crc_flit": 10, "nvlink2 replay": 0},
               "errors_end": {"nvlink2 crc_flit": 10, "nvlink2 replay": grown}, "xids": xids}  # fmt: skip
        facts = {"host": HOST, "run_id": "r", "topology": machine(), "watch": {"gpus": {"gpu1": gpu}, "seconds": 60}}
        return Run("run", RunFacts.from_json(facts), typed([record()]))

    quiet = watched(0, [{"xid": 45, "time": 1.0}])  # an application's Xid: no fault of the machine
    comparison = compare(quiet, watched(5, [{"xid": 79, "time": 2.0}]))
    assert [(r["kind"], r["metric"], r["case"]) for r in comparison.regressions] == [
        ("machine", "Xid during the run", "xid[gpu1-79]"), ("machine", "link errors grew", "link_errors[gpu1]")
    ]  # fmt: skip
    assert comparison.regressions[1]["summary"].startswith("gpu1: link error counters grew during the run "
                                                           "(nvlink2 replay +5)")  # fmt: skip
    assert comparison.exit_status == 1 and "2 machine fault" in comparison.lines()[-1]
    assert compare(watched(5, []), watched(5, [])).regressions == []  # the baseline had it too: not new
