"""What NVML says during the run: Xid events, link error counters, PCIe generation under load (issue 26, item 4)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pynvml
import pytest
import torch

import fake_nvml as nv
from conformance.common.casefiles import TRANSFER_GENERATIONS
from conformance.discover.health import GpuHealth
from conformance.discover.kernel_log import kernel_log_lines, kernel_xid_problems, kernel_xids
from conformance.discover.watch import (
    CaseSpan,
    GpuWatch,
    NvmlWatch,
    RunWatch,
    WatchError,
    XidEvent,
    attribute_xids,
    watch_findings,
    watch_from_json,
)
from conformance.rank.link_gen import LinkGenerations
from conformance.rank.probes import LINK_READ_ITERATIONS, timed
from conformance.record.records import CaseRecord
from conformance.record.run_folder import transfer_generations
from conftest import copy_suites, read_records
from test_junit_schema import schema_errors
from test_scenario_answers import answer_lines

TOPOLOGIES = Path(__file__).resolve().parent.parent / "conformance" / "scenarios" / "topologies"
LOAD_MARGIN = 30.0  # seconds a busy machine may take to run the watch thread's few NVML calls


# --------------------------------------------------------------------------------------------
# the kernel log
# --------------------------------------------------------------------------------------------

KMSG = [
    "4,1001,4123456,-;NVRM: Xid (PCI:0000:3a:00): 48, pid=1022, name=python, DBE (double-bit error) ...",
    "6,1020,5023456,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Feb 25 03:48:19 UTC 2025",
    "6,1021,5123456,-;nvidia-nvlink: Nvlink Core is being initialized",
    "4,1187,9123456,-;NVRM: Xid (PCI:0000:3a:00): 79, pid=2211, name=python, GPU has fallen off the bus.",
    " SUBSYSTEM=pci",
    "4,1190,9223456,-;NVRM: Xid (PCI:0000:18:00): 45, pid=2211, name=python, Ch 00000008",
    "4,1191,9323456,-;NVRM: Xid (PCI:0000:3a:00): 79, pid=2215, name=python, GPU has fallen off the bus.",
    "4,1192,9423456,-;NVRM: Xid (PCI:0000:77:00): 48, an NVIDIA GPU this run does not test",
    "4,1193,9523456,-;NVRM: Xid (PCI:0000:5d:00): 63, pid=2300, name=python, Row Remapper: New row marked for "
    "remapping, reset gpu to activate.",
    "4,1194,9623456,-;NVRM: Xid (PCI:0000:5d:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU "
    "Reset Required)",
    "4,1195,9723456,-;NVRM: Xid (PCI:0000:5d:00): 171, a number the suite's table does not know",
]


def test_the_kernel_logs_xids_name_their_gpu_by_bus_id_and_the_drivers_load_resets_them(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("\n".join(KMSG) + "\n")
    lines, unread = kernel_log_lines(kmsg)
    assert unread == "" and lines is not None
    assert lines[3] == "NVRM: Xid (PCI:0000:3a:00): 79, pid=2211, name=python, GPU has fallen off the bus."
    buses = {"gpu0": "00000000:18:00.0", "gpu1": "00000000:3A:00.0", "gpu2": "00000000:5D:00.0"}
    found = kernel_xids(lines, buses)
    assert found == {"gpu0": ((45,), ()), "gpu1": ((79, 79), (48,)), "gpu2": ((63, 154, 171), ())}
    health = {
        name: GpuHealth(kernel_xids=xids.since_load, kernel_xids_before_load=xids.before_load)
        for name, xids in found.items()
    }
    machine, warnings = kernel_xid_problems(health)
    assert machine == {
        "gpu1": "Xid 79 (GPU has fallen off the bus) 2x in the kernel log since the driver's last load -> reboot; "
        "reseat the GPU and check its power and riser",
        "gpu2": "Xid 63 (row remapping pending) 1x in the kernel log since the driver's last load -> reset the GPU "
        "to apply the remap (`nvidia-smi -r`)",
    }
    assert warnings == {
        "gpu0": "Xid 45 (preemptive cleanup after a process ended) 1x in the kernel log since the driver's last "
        "load -> none: a process was killed",
        "gpu1": "Xid 48 (double-bit ECC error) 1x before the driver's last load, which reset the GPU ('NVRM: "
        "loading NVIDIA' in the kernel log)",
        "gpu2": "Xid 154 (GPU recovery action changed) 1x in the kernel log since the driver's last load -> "
        "informational: the action it names is for this GPU's other Xids; Xid 171 (not in this suite's table) 1x "
        "in the kernel log since the driver's last load -> look it up in NVIDIA's Xid catalog "
        "(https://docs.nvidia.com/deploy/xid-errors/)",
    }


def test_an_xid_of_the_gpus_memory_that_nvml_shows_reset_since_is_a_warning() -> None:
    """A GPU reset prints nothing in the kernel log: NVML's state now says whether the fault was cleared."""
    reset = GpuHealth(kernel_xids=(48, 63, 95), ecc_uncorrected=0, remap_pending=False)
    machine, warnings = kernel_xid_problems({"gpu3": reset})
    assert machine == {}
    assert warnings["gpu3"].startswith(
        "Xid 48 (double-bit ECC error) 1x in the kernel log since the driver's last load, cleared since: NVML's "
        "volatile uncorrectable ECC count is 0 now"
    )
    assert (
        "Xid 63 (row remapping pending) 1x in the kernel log since the driver's last load, cleared since: NVML "
        "reports no row remapping pending now (a reset applied it)"
    ) in warnings["gpu3"]
    still = GpuHealth(kernel_xids=(48, 63, 74), ecc_uncorrected=2, remap_pending=True)
    machine, _ = kernel_xid_problems({"gpu3": still})
    assert re.findall(r"Xid (\d+) \(", machine["gpu3"]) == ["48", "63", "74"]
    unknown = GpuHealth(kernel_xids=(48, 63))  # NVML said nothing of the memory: the Xid stands
    machine, _ = kernel_xid_problems({"gpu3": unknown})
    assert machine["gpu3"].startswith("Xid 48 (double-bit ECC error)")


def test_an_unreadable_kernel_log_says_why(tmp_path: Path) -> None:
    lines, unread = kernel_log_lines(tmp_path / "no-kmsg")
    assert lines is None
    assert unread == f"the kernel log ({tmp_path / 'no-kmsg'}) is not readable here: No such file or directory"


# --------------------------------------------------------------------------------------------
# the watch, on the fake NVML
# --------------------------------------------------------------------------------------------


def h100_box(errors: bool = True) -> nv.FakeMachine:
    machine = nv.nvswitch_box()
    for gpu in machine.gpus:
        # Hopper: replay, recovery, CRC flit and ECC data; no CRC data counter (NotSupported)
        gpu.nvlink_errors = [[0, 0, 0, None, 0] for _ in range(18)] if errors else None
    return machine


def start(monkeypatch: pytest.MonkeyPatch, machine: nv.FakeMachine) -> tuple[NvmlWatch, nv.FakeNvmlLibrary]:
    library = nv.install(monkeypatch, machine)
    pynvml.nvmlInit()
    handles = {f"gpu{i}": pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 3)}
    return NvmlWatch(pynvml, handles, {"gpu0": 18, "gpu3": 18}, tick=0.05), library


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + LOAD_MARGIN
    while not condition():
        assert time.monotonic() < deadline, "the watch thread did not get there"
        time.sleep(0.01)


def test_the_watch_reads_xids_counters_and_slowdowns_and_keeps_the_ranks_generations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = h100_box()
    watch, library = start(monkeypatch, machine)
    gpu3 = machine.gpus[3]
    begun = time.time()
    machine.xid_events.append((3, 79))
    wait_until(lambda: bool(watch.events))
    ended = time.time()
    gpu3.nvlink_errors[2][2] = 4000  # type: ignore[index]
    gpu3.nvlink_errors[5][1] = 2  # type: ignore[index]
    gpu3.nvlink_errors[7][4] = 9  # type: ignore[index]
    gpu3.pcie_replays = 3
    gpu3.clock_reasons = nv.CLOCKS_HW_THERMAL
    watched = watch.stop({"gpu3": 4})  # the highest generation gpu3's ranks read in their transfers
    assert library.initialised == 0  # NVML let go
    three, zero = watched.gpus["gpu3"], watched.gpus["gpu0"]
    assert three.pcie_gen_busy == 4 and zero.pcie_gen_busy is None  # gpu0 moved no data: its generation is unknown
    assert "nvmlDeviceGetCurrPcieLinkGeneration" not in library.calls  # a sample between transfers says nothing
    assert three.grown() == {"nvlink2 crc_flit": 4000, "nvlink5 recovery": 2, "nvlink7 ecc_data": 9, "pcie replay": 3}
    assert zero.grown() == {} and len(zero.errors_end or {}) == 18 * 4 + 1  # four counters on each of 18 links
    asked = [c for c in library.calls if c == "nvmlDeviceGetNvLinkErrorCounter"]
    assert len(asked) == 2 * 2 * 18 * 4 + 2  # each GPU asked CRC data once, at the start: not again
    assert [x.xid for x in three.xids] == [79] and begun <= (three.xids[0].time or 0) <= ended
    assert three.slowdowns == ("hw_thermal",) and zero.slowdowns == ()
    assert watched.note == "NVLink crc_data counter NotSupported on gpu0, gpu3: not read"
    assert watched.seconds is not None


def test_a_rank_reads_its_gpus_generation_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = h100_box()
    machine.gpus[3].pcie = (16, 16, 5, 5)  # moving data: the link at its best
    nv.install(monkeypatch, machine)
    reader = LinkGenerations()
    found = reader.read([machine.gpus[3].uuid, machine.gpus[0].uuid, "GPU-not-on-this-machine"])
    assert found == {machine.gpus[3].uuid: 5, machine.gpus[0].uuid: 1}  # at rest: gen1; an unknown GPU left out
    nv.install(monkeypatch, replace(machine, init_error=nv.ERROR_DRIVER_NOT_LOADED))
    assert LinkGenerations().read([machine.gpus[3].uuid]) == {}  # NVML refusing never fails the rank


class TimedRank:
    """What ``timed`` asks of a rank, recording the order of events (a GPU rank's: backend nccl)."""

    def __init__(self) -> None:
        self.params = {"bandwidth_iterations": 3, "bandwidth_warmup": 1}
        self.backend = "nccl"
        self.torch_device = torch.device("cpu")
        self.events: list[str] = []

    def wait_for_turn(self) -> None:
        self.events.append("turn")

    def phase(self, name: str, step: str) -> None:
        self.events.append(name)

    def read_link_generations(self, devices: tuple[torch.device, ...]) -> None:
        self.events.append("read")

    def synchronize(self, *devices: torch.device) -> None:
        self.events.append("synchronize")


def test_a_rank_reads_the_generation_with_untimed_transfers_in_flight() -> None:
    rank = TimedRank()
    timed(rank, "copy", lambda: rank.events.append("transfer"))  # type: ignore[arg-type]
    timed_part = ["transfer"] * (1 + 3)  # warm-up and timed iterations: no NVML call among them
    in_flight = ["transfer"] * LINK_READ_ITERATIONS + ["read", "synchronize"]
    assert rank.events == ["turn", "probe", *timed_part, *in_flight]
    rank.backend, rank.events = "gloo", []  # CPU ranks: no GPU to read
    timed(rank, "copy", lambda: rank.events.append("transfer"))  # type: ignore[arg-type]
    assert "read" not in rank.events


def test_the_generation_read_in_transfers_is_kept_per_gpu_at_its_highest() -> None:
    def record(gens: object) -> CaseRecord:
        return CaseRecord(nodeid="t", probe="peer_copy", metrics={TRANSFER_GENERATIONS: gens})

    records = [record({"gpu0": 4, "gpu1": 5}), record({"gpu0": 5}), record("not a mapping"), record({"gpu2": "5"})]
    assert transfer_generations(records) == {"gpu0": 5, "gpu1": 5}


def test_a_gpu_lost_while_the_watch_waits_is_named_with_its_case(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = h100_box()
    watch, library = start(monkeypatch, machine)
    begun = time.monotonic()
    machine.lost.append(3)  # gpu3 falls off the bus: the event wait answers GPU_IS_LOST, naming no GPU
    wait_until(lambda: "gpu3" in watch.lost)
    watched = watch.stop({})
    lost = watched.gpus["gpu3"].lost
    assert lost is not None and lost.time is not None and lost.clock is not None and lost.clock >= begun
    assert watched.gpus["gpu0"].lost is None
    assert library.calls.count("nvmlEventSetWait_v2") <= 2 + (time.monotonic() - begun) / watch.tick  # no busy loop
    span = CaseSpan("suites/test_pairs.py::test_peer_copy[gpu2-gpu3-NV18-inherited]", "peer_copy", "hang",
                    ("gpu2", "gpu3"), begun - 1, time.monotonic())  # fmt: skip
    (finding,) = watch_findings(attribute_xids(watched, [span]), {})
    assert (finding.test_name, finding.machine) == ("gpu_lost[gpu3]", True)
    assert finding.text.startswith(
        f"gpu3: NVML lost the GPU during {span.case} (its verdict: hang) (NVML_ERROR_GPU_IS_LOST: fallen off the bus "
        "or otherwise inaccessible) -> reboot"
    )


def test_what_nvml_refuses_is_unknown_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = replace(h100_box(errors=False), missing=["nvmlEventSetCreate"])
    for gpu in machine.gpus:
        gpu.pcie_replays = None
    watch, _ = start(monkeypatch, machine)
    watched = watch.stop({})
    assert watched.note.startswith("Xid events not watched: ")
    assert watched.gpus["gpu3"].errors_start is None and watched.gpus["gpu3"].grown() == {}


# --------------------------------------------------------------------------------------------
# attribution and judging
# --------------------------------------------------------------------------------------------

SPANS = [
    CaseSpan("suites/test_pairs.py::test_peer_copy[gpu2-gpu3-NV18-inherited]", "peer_copy", "hang", ("gpu2", "gpu3"),
             100.0, 160.0),
    CaseSpan("suites/test_pairs.py::test_peer_copy[gpu0-gpu1-NV18-inherited]", "peer_copy", "pass", ("gpu0", "gpu1"),
             100.0, 110.0),
]  # fmt: skip


def test_each_xid_names_the_case_running_on_its_gpu() -> None:
    watched = RunWatch(
        {
            "gpu3": GpuWatch(xids=(XidEvent(79, clock=150.0), XidEvent(74, clock=500.0))),
            "gpu1": GpuWatch(xids=(XidEvent(45, probe="peer_copy"),)),  # a simulated one: by its probe
        },
        seconds=600.0,
    )
    named = attribute_xids(watched, SPANS)
    assert named.gpus["gpu3"].xids[0].case == SPANS[0].case and named.gpus["gpu3"].xids[0].verdict == "hang"
    assert named.gpus["gpu3"].xids[1].case is None  # no case ran on gpu3 then
    assert named.gpus["gpu1"].xids[0].case == SPANS[1].case
    findings = watch_findings(named, {})
    assert [(f.test_name, f.machine) for f in findings] == [
        ("xid[gpu3-79]", True), ("xid[gpu3-74]", True), ("xid[gpu1-45]", False)
    ]  # fmt: skip
    assert findings[0].text == (
        f"gpu3: Xid 79 (GPU has fallen off the bus) during {SPANS[0].case} (its verdict: hang) -> reboot; reseat "
        "the GPU and check its power and riser"
    )
    assert findings[1].text.startswith("gpu3: Xid 74 (NVLink error) between cases -> reset the GPU")


GEN5_X16 = GpuHealth(pcie_max_gen=5, pcie_max_width=16)


@pytest.mark.parametrize(
    ("grown", "seconds", "failed", "warned"),
    [
        ({"nvlink0 replay": 1}, 60.0, "nvlink0 replay +1", ""),  # DCGM: a replay or recovery error fails
        ({"nvlink0 recovery": 3}, 600.0, "nvlink0 recovery +3", ""),
        ({"nvlink3 crc_flit": 5000}, 60.0, "", "nvlink3 crc_flit +5000"),  # 83 a second: below DCGM's 100
        ({"nvlink3 crc_data": 6000}, 60.0, "nvlink3 crc_data +6000", ""),  # 100 a second: DCGM fails it
        ({"nvlink3 ecc_data": 7000}, 60.0, "nvlink3 ecc_data +7000", ""),  # Hopper's data errors, judged alike
        ({"nvlink3 ecc_data": 40}, 60.0, "", "nvlink3 ecc_data +40"),
        ({"pcie replay": 31}, 30.0, "", ""),  # Gen5 x16: ceil(1.92 x 16) = 31 a minute; a short run gets a minute
        ({"pcie replay": 63}, 120.0, "", "pcie replay +63"),  # 31.5 a minute: DCGM warns
    ],
)
def test_error_counters_are_judged_by_dcgms_limits(
    grown: dict[str, int], seconds: float, failed: str, warned: str
) -> None:
    watched = RunWatch({"gpu0": GpuWatch(errors_start=dict.fromkeys(grown, 10),
                                         errors_end={k: 10 + v for k, v in grown.items()})}, seconds)  # fmt: skip
    findings = watch_findings(watched, {"gpu0": GEN5_X16})
    said = {f.kind: f.text.split("(")[1].split(")")[0] for f in findings}
    assert (said.get("link_errors", ""), said.get("link_errors_low", "")) == (failed, warned)
    assert all(f.machine == (f.kind == "link_errors") for f in findings)


def test_pcie_replays_are_judged_by_the_links_generation_and_width() -> None:
    watched = RunWatch({"gpu0": GpuWatch(errors_start={"pcie replay": 0}, errors_end={"pcie replay": 12})}, 60.0)
    assert watch_findings(watched, {"gpu0": GEN5_X16}) == []
    (gen3_x8,) = watch_findings(watched, {"gpu0": GpuHealth(pcie_max_gen=3, pcie_max_width=8)})  # 4 a minute
    assert gen3_x8.kind == "link_errors_low" and not gen3_x8.machine


def test_a_counter_reset_by_a_reboot_is_not_growth() -> None:
    assert GpuWatch(errors_start={"pcie replay": 50}, errors_end={"pcie replay": 0}).grown() == {}


def test_the_generation_under_load_and_the_slowdowns_are_judged() -> None:
    watched = RunWatch({"gpu0": GpuWatch(pcie_gen_busy=3, slowdowns=("hw_slowdown",)),
                        "gpu1": GpuWatch(pcie_gen_busy=5, slowdowns=())}, 60.0)  # fmt: skip
    findings = watch_findings(watched, {name: GpuHealth(pcie_max_gen=5) for name in ("gpu0", "gpu1")})
    assert [f.test_name for f in findings] == ["pcie_gen[gpu0]", "slowdown[gpu0]"]
    assert findings[0].text.startswith("gpu0: PCIe gen3 at most while its cases ran, where the GPU and slot allow gen5")
    assert watch_findings(watched, {}) == findings[1:]  # the GPU's highest generation unknown: not judged


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "watch is [], not an object"),
        ({"gpus": []}, "watch.gpus is [], not an object keyed by GPU name"),
        ({"gpus": {"gpu0": {"xids": {}}}}, "watch of gpu0: xids is {}, not a list"),
        ({"gpus": {"gpu0": {"xids": [{"xid": "79"}]}}},
         "watch of gpu0: an Xid event: xid is '79', which is not a whole number"),
        ({"gpus": {"gpu0": {"errors_end": {"pcie replay": 1.5}}}},
         "watch of gpu0: errors_end is {'pcie replay': 1.5}, not an object of counter name -> integer"),
        ({"gpus": {"gpu0": {"pcie_gen": 4}}},
         "watch of gpu0: unknown field 'pcie_gen' (it has errors_end, errors_start, lost, pcie_gen_busy, slowdowns, "
         "xids)"),
        ({"seconds": "long"}, "watch.seconds is 'long', not a number"),
    ],
)  # fmt: skip
def test_a_watch_of_the_wrong_shape_is_named(data: Any, message: str) -> None:
    with pytest.raises(WatchError) as caught:
        watch_from_json(data)
    assert str(caught.value) == message


# --------------------------------------------------------------------------------------------
# the whole suite on a simulated machine
# --------------------------------------------------------------------------------------------


def with_watch(pytester: pytest.Pytester, watch: dict[str, Any], kernel: dict[str, list[int]] | None = None) -> Path:
    """The 2-GPU PCIe box with what NVML says during the run (and the kernel log's Xids)."""
    data = json.loads((TOPOLOGIES / "pcie-2gpu.json").read_text())
    data["watch"] = watch
    for name, xids in (kernel or {}).items():
        data["health"][name]["kernel_xids"] = xids
    path = pytester.path / "watched.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.usefixtures("isolated_env")
def test_an_xid_during_a_case_fails_the_run_in_the_answer_run_json_junit_and_exit_status(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult], reports_dir: Path
) -> None:
    files = copy_suites(pytester, "test_pairs.py")
    junit = pytester.path / "xid.xml"
    xid = {"gpus": {"gpu1": {"xids": [{"xid": 79, "probe": "peer_copy"}], "pcie_gen_busy": 4}}}
    result = run_suite("--topology-file", str(with_watch(pytester, xid)), f"--junitxml={junit}", *files, timeout=240)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()  # every case passed
    first = answer_lines(result)[0]
    assert first.startswith("DURING THE RUN: gpu1: Xid 79 (GPU has fallen off the bus) during suites/test_pairs.py::"
                            "test_peer_copy[gpu0-gpu1-PHB-inherited] (its verdict: pass) -> reboot")  # fmt: skip
    facts = json.loads((reports_dir / "latest" / "run.json").read_text())
    (event,) = facts["watch"]["gpus"]["gpu1"]["xids"]
    assert event["case"] == "suites/test_pairs.py::test_peer_copy[gpu0-gpu1-PHB-inherited]"
    (suite,) = ElementTree.parse(junit).getroot().findall("testsuite")
    found = [c for c in suite.iter("testcase") if c.get("classname") == "gpu-conformance"]
    assert [c.get("name") for c in found] == ["xid[gpu1-79]"] and found[0].find("failure") is not None
    assert schema_errors(junit) == []


@pytest.mark.usefixtures("isolated_env")
def test_an_applications_xid_is_a_warning_and_a_quiet_watch_passes(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult]
) -> None:
    files = copy_suites(pytester, "test_pairs.py")
    quiet = {"gpus": {"gpu0": {"xids": [{"xid": 45}], "errors_start": {"pcie replay": 3},
                               "errors_end": {"pcie replay": 4}, "slowdowns": []}}}  # fmt: skip
    result = run_suite("--topology-file", str(with_watch(pytester, quiet)), *files, timeout=240)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    lines = answer_lines(result)
    assert lines[0] == (
        "WARNING during the run: gpu0: Xid 45 (preemptive cleanup after a process ended) between cases -> none: a "
        "process was killed"
    )
    assert lines[1].startswith("everything passed")


@pytest.mark.usefixtures("isolated_env")
def test_the_kernel_logs_earlier_xids_are_a_host_check(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult], reports_dir: Path
) -> None:
    files = copy_suites(pytester, "test_machine_health.py")
    topology = with_watch(pytester, {}, kernel={"gpu0": [45], "gpu1": [48, 79]})
    junit = pytester.path / "xid_log.xml"
    result = run_suite("--topology-file", str(topology), f"--junitxml={junit}", *files, "-k", "kernel_log")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    assert answer_lines(result)[0].startswith("host check host:xid_log: ERROR: gpu1: Xid 48 (double-bit ECC error)")
    facts = json.loads((reports_dir / "latest" / "run.json").read_text())
    assert facts["topology"]["health"]["gpu1"]["kernel_xids"] == [48, 79]
    (case,) = ElementTree.parse(junit).getroot().iter("testcase")
    assert case.get("name") == "test_no_gpu_fault_in_the_kernel_log" and case.find("failure") is not None
    (record,) = [r for r in read_records(reports_dir) if r["probe"] == "host:xid_log"]
    assert record["verdict"] == "error"
    assert record["metrics"]["gpu1"] == {"kernel_xids": [48, 79], "kernel_xids_before_load": None}
    assert record["summary"].startswith(
        "gpu1: Xid 48 (double-bit ECC error) 1x in the kernel log since the driver's last load -> reset the GPU"
    )
    assert record["metrics"]["warning"].startswith("gpu0: Xid 45")
    topology = with_watch(pytester, {}, kernel={"gpu0": [45]})
    application = run_suite("--topology-file", str(topology), *files, "-k", "kernel_log")
    assert application.ret == pytest.ExitCode.OK, application.stdout.str()
    assert answer_lines(application)[0].startswith("WARNING host check host:xid_log: gpu0: Xid 45")


@pytest.mark.usefixtures("isolated_env")
def test_only_a_gpu_that_moved_data_has_its_generation_judged(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult]
) -> None:
    """gpu6 trains to Gen3 under load; barriers time no transfer, so no GPU's generation is read or judged."""
    files = copy_suites(pytester, "test_collectives.py", "test_pairs.py")
    topology = str(TOPOLOGIES / "pcie-gen3-under-load-8gpu.json")
    barriers = run_suite("--topology-file", topology, *files, "-k", "barrier and all8", timeout=240)
    assert barriers.ret == pytest.ExitCode.OK, barriers.stdout.str()
    pairs = run_suite("--topology-file", topology, *files, "-k", "peer_copy and gpu6", timeout=240)
    assert pairs.ret == pytest.ExitCode.TESTS_FAILED, pairs.stdout.str()
    assert answer_lines(pairs)[0].startswith("DURING THE RUN: gpu6: PCIe gen3 at most while its cases ran")
