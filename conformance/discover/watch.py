"""What NVML says while the run runs: Xid events, link error counters, PCIe generation under load, slowdowns.

``health.py`` reads each GPU once, before any case; this watch reads them for the whole run, on a
thread of the pytest process that owns the run (the controller under xdist):

- Xid events (``nvmlEventTypeXidCriticalError``), each attributed at the end to the case that was
  running on that GPU when it came (by the records' start and end times and devices);
- NVLink error counters (replay, recovery, CRC flit and data, ECC data, per link) and the PCIe
  replay counter, read when the run starts and when it ends: their growth is judged;
- the clock slowdown reasons, sampled every ``TICK`` seconds, judged whenever they were seen;
- the PCIe link generation while data moves: each rank reads its GPUs' generation with its timed
  transfers in flight (``rank/link_gen.py``; an idle GPU lowers it to save power, and a case's
  processes starting move nothing), and the watch keeps each GPU's highest.

The kernel log's earlier Xids are read once at discovery, where the log is readable
(``discover/kernel_log.py``).  A simulated machine's topology file carries the same facts (``"watch"``), played back
when the run ends: its Xid events name the probe during which they came.

Thresholds, as DCGM 4.6.0 judges them (NVIDIA/DCGM ``common/DcgmGPUHardwareLimits.h`` and
``modules/health/DcgmHealthWatch.cpp``, ``MonitorNVLink4Fields`` and ``GetExpectedPcieReplayRate``):
an NVLink replay or recovery error (``DCGM_LIMIT_MAX_NVLINK_ERROR`` 1, growth >= 1) fails; CRC
errors fail at 100 a second and more ("RM has informed us that CRC errors only matter at rates of
100+ per second") and are a WARNING below; PCIe replays beyond the generation's rate per lane (1e-12
of the bit rate a minute: Gen5 x16 allows 31 a minute) are a WARNING (DCGM 3.3.8 dropped its fixed 8
a minute).  Xid meanings and what to do: NVIDIA's Xid catalog (https://docs.nvidia.com/deploy/xid-errors/,
its "Resolution Bucket").
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any, NamedTuple, TypeVar

from conformance.common.clock import wall
from conformance.common.inputs import dataclass_from_json
from conformance.common.jsonl import JsonDict
from conformance.discover.health import GpuHealth, ask, slowdown_names

TICK = 0.5  # seconds between samples, and the longest an Xid event waits to be read
NVLINK_ERRORS = 1  # DCGM_LIMIT_MAX_NVLINK_ERROR: a replay or recovery error this many or more fails
NVLINK_CRC_PER_SECOND = 100.0  # DCGM_LIMIT_MAX_NVLINK_CRC_ERROR: a rate this high or higher fails
# DcgmHealthWatch.cpp, pcieGenReplayRatePerLane: 1e-12 of each generation's GT/s, a minute, per lane
PCIE_REPLAYS_PER_LANE_MINUTE = {1: 0.15, 2: 0.3, 3: 0.48, 4: 0.96, 5: 1.92, 6: 3.84}
# nvmlNvLinkErrorCounter_t (nvml.h): DL_REPLAY 0, DL_RECOVERY 1, DL_CRC_FLIT 2, DL_CRC_DATA 3, DL_ECC_DATA 4.
# Hopper counts received data errors as ECC data; CRC data is the older GPUs' (no CRC-data counter in the driver's
# ctrl2080nvlink.h; nvidia-smi and DataDog's agent read replay, recovery, CRC flit and ECC data on H100): each GPU
# answers NotSupported for the ones it lacks, and the watch stops asking after the first.
NVLINK_COUNTERS = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data", 4: "ecc_data"}
NVLINK_RATE_COUNTERS = ("crc_flit", "crc_data", "ecc_data")  # judged by their rate, as DCGM judges CRC
PCIE_REPLAY = "pcie replay"


class XidKind(NamedTuple):
    meaning: str
    machine: bool  # a fault of the GPU, its memory or its links (else: what an application did)
    fix: str


RESET = "reset the GPU (`nvidia-smi -r`) or reboot; if it comes back, have the GPU serviced"
CATALOG = "https://docs.nvidia.com/deploy/xid-errors/"
# NVIDIA's Xid catalog: the Xids a conformance run meets, with their resolution bucket.  13, 31, 43
# and 45 come from what an application did (45: a process killed, as the stop ladder kills a hung rank).
# 109 "Context Switch Timeout Error": RESET_GPU (Meta's gcm counts it non-critical; the catalog wins).
# 154 "GPU Recovery Action Changed": "informational only regarding another Xid" (it names the action
# the other Xid needs: that Xid is judged).
XIDS = {
    13: XidKind("graphics engine exception", False, "restart the application"),
    31: XidKind("GPU memory page fault", False, "restart the application"),
    43: XidKind("GPU stopped processing", False, "restart the application"),
    45: XidKind("preemptive cleanup after a process ended", False, "none: a process was killed"),
    48: XidKind("double-bit ECC error", True, RESET),
    61: XidKind("internal micro-controller breakpoint", True, RESET),
    62: XidKind("internal micro-controller halt", True, RESET),
    63: XidKind("row remapping pending", True, "reset the GPU to apply the remap (`nvidia-smi -r`)"),
    64: XidKind("row remapping failed", True, "the GPU needs replacing (RMA)"),
    74: XidKind("NVLink error", True, RESET + "; check the NVLink (`nvidia-smi nvlink -e`)"),
    79: XidKind("GPU has fallen off the bus", True, "reboot; reseat the GPU and check its power and riser"),
    92: XidKind("high single-bit ECC error rate", True, RESET),
    94: XidKind("contained ECC error", True, "restart the application; reset the GPU when convenient"),
    95: XidKind("uncontained ECC error", True, RESET),
    109: XidKind("context switch timeout", True, RESET),
    119: XidKind("GSP RPC timeout", True, RESET),
    120: XidKind("GSP error", True, RESET),
    140: XidKind("unrecovered ECC error", True, RESET),
    154: XidKind(
        "GPU recovery action changed", False, "informational: the action it names is for this GPU's other Xids"
    ),
}


def xid_kind(xid: int) -> XidKind:
    """An Xid's meaning; one the table does not list is a WARNING to look up, not a verdict on a guess."""
    return XIDS.get(xid, XidKind("not in this suite's table", False, f"look it up in NVIDIA's Xid catalog ({CATALOG})"))


@dataclass(frozen=True)
class XidEvent:
    """One Xid NVML delivered during the run."""

    xid: int
    time: float | None = None  # when it was read, wall time for people (None: a simulated one)
    probe: str | None = None  # simulated: the probe during whose case on this GPU it comes
    case: str | None = None  # the case running on the GPU when it came (filled in when the run ends)
    verdict: str | None = None  # that case's verdict
    clock: float | None = None  # when it was read on the host's monotonic clock: which case it came in


@dataclass(frozen=True)
class GpuLost:
    """A GPU NVML answered NVML_ERROR_GPU_IS_LOST for during the run, in nvmlEventSetWait_v2 or a sample.

    nvml.h: "the target GPU has fallen off the bus or is otherwise inaccessible".
    """

    time: float | None = None  # when it was first met, wall time for people (None: a simulated one)
    probe: str | None = None  # simulated: the probe during whose case on this GPU it comes
    case: str | None = None  # the case running on the GPU then (filled in when the run ends)
    verdict: str | None = None  # that case's verdict
    clock: float | None = None  # when it was first met on the host's monotonic clock: which case it came in


@dataclass(frozen=True)
class GpuWatch:
    """What NVML said of one GPU while the run ran; None where it would not say."""

    pcie_gen_busy: int | None = None  # the highest PCIe generation seen while a case ran on the GPU
    slowdowns: tuple[str, ...] | None = None  # hardware and thermal slowdowns seen at any sample
    errors_start: Mapping[str, int] | None = None  # "nvlink<k> <counter>" and "pcie replay" when the run started
    errors_end: Mapping[str, int] | None = None  # the same when it ended
    xids: tuple[XidEvent, ...] = ()
    lost: GpuLost | None = None

    def grown(self) -> dict[str, int]:
        """Each error counter that grew during the run, by how much (a counter reset by a reboot is not growth)."""
        start, end = self.errors_start or {}, self.errors_end or {}
        return {name: end[name] - start[name] for name in end if name in start and end[name] > start[name]}


@dataclass(frozen=True)
class RunWatch:
    """The watch of one run: per GPU name, and what could not be watched."""

    gpus: Mapping[str, GpuWatch] = field(default_factory=dict)
    seconds: float | None = None  # how long the watch ran (error rates are per this)
    note: str = ""  # what was not watched, and why ("" when everything was)

    def to_json(self) -> JsonDict:
        return asdict(self)


class WatchError(ValueError):
    """A topology file's or run.json's watch of the wrong shape: the message names the GPU and the field."""


def watch_from_json(data: object, where: str = "watch") -> RunWatch:
    if not isinstance(data, dict):
        raise WatchError(f"{where} is {data!r}, not an object")
    gpus = data.get("gpus", {})
    if not isinstance(gpus, dict):
        raise WatchError(f"{where}.gpus is {gpus!r}, not an object keyed by GPU name")
    seconds, note = data.get("seconds"), data.get("note", "")
    if seconds is not None and (not isinstance(seconds, (int, float)) or isinstance(seconds, bool)):
        raise WatchError(f"{where}.seconds is {seconds!r}, not a number")
    return RunWatch({str(n): _gpu_watch(g, f"{where} of {n}") for n, g in gpus.items()}, seconds, str(note))


def _gpu_watch(data: object, where: str) -> GpuWatch:
    if not isinstance(data, dict):
        raise WatchError(f"{where} is {data!r}, not an object")
    events = data.get("xids", [])
    events = [] if events is None else events
    if not isinstance(events, list):
        raise WatchError(f"{where}: xids is {events!r}, not a list")
    xids = tuple(dataclass_from_json(XidEvent, e, f"{where}: an Xid event", WatchError) for e in events)
    lost = data.get("lost")
    lost = None if lost is None else dataclass_from_json(GpuLost, lost, f"{where}: lost", WatchError)
    for name in ("errors_start", "errors_end"):
        counters = data.get(name)
        if counters is not None and not (isinstance(counters, dict) and all(type(v) is int for v in counters.values())):
            raise WatchError(f"{where}: {name} is {counters!r}, not an object of counter name -> integer")
    return replace(dataclass_from_json(GpuWatch, {**data, "xids": [], "lost": None}, where, WatchError), xids=xids,
                   lost=lost)  # fmt: skip


# --------------------------------------------------------------------------------------------
# watching NVML
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    gpu: str
    slowdowns: tuple[str, ...] | None


def error_counters(nvml: Any, handle: Any, links: int, unsupported: set[int]) -> dict[str, int] | None:
    """The GPU's NVLink error counters (``links`` links) and PCIe replay counter; None where NVML gives none.

    ``unsupported``: the counters this GPU answered NotSupported for, kept between calls: never asked again.
    """
    counters: dict[str, int] = {}
    for number, name in NVLINK_COUNTERS.items():
        for link in range(links if number not in unsupported else 0):
            try:
                counters[f"nvlink{link} {name}"] = int(nvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, number))
            except nvml.NVMLError_NotSupported:
                unsupported.add(number)
                break
            except nvml.NVMLError:
                continue
    replays = ask(nvml, lambda: nvml.nvmlDeviceGetPcieReplayCounter(handle))
    if replays is not None:
        counters[PCIE_REPLAY] = int(replays)
    return counters or None


class NvmlWatch:
    """Watches the run's GPUs on a thread of its own from construction to :meth:`stop`."""

    def __init__(self, nvml: Any, handles: Mapping[str, Any], links: Mapping[str, int], tick: float = TICK) -> None:
        self.nvml, self.handles, self.links, self.tick = nvml, dict(handles), dict(links), tick
        self.started = time.monotonic()
        self.unsupported: dict[str, set[int]] = {name: set() for name in handles}  # NVLink counters NotSupported
        self.start_counters = {
            name: error_counters(nvml, h, self.links.get(name, 0), self.unsupported[name])
            for name, h in handles.items()
        }
        self.samples: list[Sample] = []
        self.events: list[tuple[str, XidEvent]] = []
        self.lost: dict[str, GpuLost] = {}  # GPU name -> when NVML first answered that it is lost
        self.notes: list[str] = []
        self.event_set = self._register()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conformance-gpu-watch", daemon=True)
        self._thread.start()

    def _register(self) -> Any:
        """An NVML event set with every GPU's Xid events, or None (and a note) where NVML refuses it."""
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            self.notes.append(f"Xid events not watched: {exc}")
            return None
        for name, handle in self.handles.items():
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
            except nvml.NVMLError as exc:
                self.notes.append(f"Xid events of {name} not watched: {exc}")
        return events

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wait_for_event()
            self._sample()

    def _wait_for_event(self) -> None:
        nvml = self.nvml
        if self.event_set is None:
            self._stopping.wait(self.tick)
            return
        try:
            data = nvml.nvmlEventSetWait_v2(self.event_set, int(self.tick * 1000))
        except nvml.NVMLError_Timeout:
            return
        except nvml.NVMLError:  # GpuIsLost among them: the sample that follows names the GPU
            self._stopping.wait(self.tick)
            return
        gpu = self._gpu_of(data.device)
        if gpu is not None:
            self.events.append((gpu, XidEvent(int(data.eventData), wall(), clock=time.monotonic())))

    def _gpu_of(self, device: Any) -> str | None:
        address = ctypes.cast(device, ctypes.c_void_p).value
        for name, handle in self.handles.items():
            if ctypes.cast(handle, ctypes.c_void_p).value == address:
                return name
        return None

    def _sample(self) -> None:
        nvml = self.nvml
        for name, handle in self.handles.items():
            try:
                reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
            except nvml.NVMLError_GpuIsLost:
                self.lost.setdefault(name, GpuLost(wall(), clock=time.monotonic()))
                reasons = None
            except nvml.NVMLError:
                reasons = None
            slowdowns = None if reasons is None else slowdown_names(int(reasons))
            self.samples.append(Sample(name, slowdowns))

    def _end_thread(self) -> None:
        """The sampling thread stopped and the Xid event set freed."""
        self._stopping.set()
        self._thread.join()
        if self.event_set is not None:
            ask(self.nvml, partial(self.nvml.nvmlEventSetFree, self.event_set))
            self.event_set = None

    def stop(self, generations: Mapping[str, int]) -> RunWatch:
        """Ends the watch; ``generations``: per GPU name, the highest PCIe generation its ranks read in transfers."""
        self._end_thread()
        self._sample()
        gpus = {
            name: GpuWatch(
                pcie_gen_busy=generations.get(name),
                slowdowns=_slowdowns_seen(self.samples, name),
                errors_start=self.start_counters[name],
                errors_end=error_counters(self.nvml, handle, self.links.get(name, 0), self.unsupported[name]),
                xids=tuple(event for gpu, event in self.events if gpu == name),
                lost=self.lost.get(name),
            )
            for name, handle in self.handles.items()
        }
        ask(self.nvml, self.nvml.nvmlShutdown)
        return RunWatch(gpus, round(time.monotonic() - self.started, 3), "; ".join([*self.notes, *self._unread()]))

    def _unread(self) -> list[str]:
        """A note per NVLink counter some GPU does not have (NotSupported): not read, so not judged."""
        lacking = {
            name: [gpu for gpu, numbers in self.unsupported.items() if number in numbers]
            for number, name in NVLINK_COUNTERS.items()
        }
        return [
            f"NVLink {name} counter NotSupported on {', '.join(gpus)}: not read"
            for name, gpus in lacking.items()
            if gpus
        ]

    def close(self) -> None:
        """Stops the thread and lets NVML go (the run ended before its facts were asked for)."""
        self._end_thread()
        ask(self.nvml, self.nvml.nvmlShutdown)


class PlayedWatch:
    """A simulated machine's watch: its topology file's facts, given back when the run ends."""

    def __init__(self, facts: RunWatch) -> None:
        self.facts, self.started = facts, time.monotonic()

    def stop(self, generations: Mapping[str, int]) -> RunWatch:
        """The facts, each GPU's generation under load as its ranks read it (none: that GPU moved no data)."""
        gpus = {name: replace(gpu, pcie_gen_busy=generations.get(name)) for name, gpu in self.facts.gpus.items()}
        gpus |= {name: GpuWatch(pcie_gen_busy=gen) for name, gen in generations.items() if name not in gpus}
        seconds = self.facts.seconds or round(time.monotonic() - self.started, 3)
        return replace(self.facts, gpus=gpus, seconds=seconds)

    def close(self) -> None:
        pass


Watch = NvmlWatch | PlayedWatch


def start_nvml_watch(nvml_indexes: Mapping[str, int], links: Mapping[str, int]) -> Watch:
    """The real GPUs' watch (GPU name -> NVML index, number of NVLinks); where NVML will not start, why not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = {name: pynvml.nvmlDeviceGetHandleByIndex(index) for name, index in nvml_indexes.items()}
    except (ImportError, OSError) as exc:
        return PlayedWatch(RunWatch(note=f"nothing watched during the run: {exc}"))
    except pynvml.NVMLError as exc:
        return PlayedWatch(RunWatch(note=f"nothing watched during the run: NVML: {exc}"))
    return NvmlWatch(pynvml, handles, links)


def _slowdowns_seen(samples: Sequence[Sample], gpu: str) -> tuple[str, ...] | None:
    read = [s.slowdowns for s in samples if s.gpu == gpu and s.slowdowns is not None]
    if not read:
        return None
    return tuple(sorted({reason for reasons in read for reason in reasons}))


# --------------------------------------------------------------------------------------------
# the cases that ran: busy windows and Xid attribution
# --------------------------------------------------------------------------------------------


class CaseSpan(NamedTuple):
    """A case that ran on GPUs: its test, probe, verdict and when it ran (the host's monotonic clock)."""

    case: str
    probe: str
    verdict: str
    gpus: tuple[str, ...]
    start: float
    end: float


Attributed = TypeVar("Attributed", XidEvent, GpuLost)


def attribute_xids(watch: RunWatch, spans: Sequence[CaseSpan]) -> RunWatch:
    """Each Xid, and a GPU lost, names the case that ran on its GPU then (by time; a simulated one by its probe)."""

    def during(gpu: str, event: Attributed) -> Attributed:
        for span in spans:
            if gpu not in span.gpus:
                continue
            if event.clock is not None and span.start <= event.clock <= span.end + TICK:
                return replace(event, case=span.case, verdict=span.verdict)
            if event.clock is None and event.probe is not None and span.probe == event.probe:
                return replace(event, case=span.case, verdict=span.verdict)
        return event

    gpus = {
        name: replace(g, xids=tuple(during(name, event) for event in g.xids), lost=g.lost and during(name, g.lost))
        for name, g in watch.gpus.items()
    }
    return replace(watch, gpus=gpus)


# --------------------------------------------------------------------------------------------
# judging
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WatchFinding:
    """One thing the watch saw that fails the run (``machine``) or is only worth a line."""

    kind: str  # xid, pcie_gen, link_errors, slowdown
    subject: str  # what it is about: the GPU, and an Xid's number (``gpu3-79``)
    text: str  # what was seen, naming the fix
    machine: bool = True

    @property
    def test_name(self) -> str:
        """Its failed test case's name in the JUnit file: ``xid[gpu3-79]``, ``pcie_gen[gpu3]``."""
        return f"{self.kind}[{self.subject}]" if self.subject else self.kind


def watch_findings(watch: RunWatch, health: Mapping[str, GpuHealth]) -> list[WatchFinding]:
    """Every finding of the run's watch, GPU by GPU; ``health``: each GPU's facts when the run started."""
    findings: list[WatchFinding] = []
    for name, gpu in watch.gpus.items():
        facts = health.get(name, GpuHealth())
        findings += [_xid_finding(name, event) for event in gpu.xids]
        if gpu.lost is not None:
            findings.append(_lost_finding(name, gpu.lost))
        highest = facts.pcie_max_gen
        if gpu.pcie_gen_busy is not None and highest is not None and gpu.pcie_gen_busy < highest:
            findings.append(
                WatchFinding(
                    "pcie_gen",
                    name,
                    f"{name}: PCIe gen{gpu.pcie_gen_busy} at most while its cases ran, where the GPU and slot "
                    f"allow gen{highest}: a link trained down (check the slot's BIOS setting and the riser; "
                    "`nvidia-smi -q -d PCIE` during a transfer)",
                )
            )
        findings += _counter_findings(name, gpu.grown(), watch.seconds or 0.0, facts)
        if gpu.slowdowns:
            findings.append(
                WatchFinding(
                    "slowdown",
                    name,
                    f"{name}: clocks held down during the run ({', '.join(gpu.slowdowns)}): check cooling, power "
                    "and the power-brake signal (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`)",
                )
            )
    return findings


def _counter_findings(gpu: str, grown: Mapping[str, int], seconds: float, facts: GpuHealth) -> list[WatchFinding]:
    """The error counters' growth judged as DCGM judges it (module docstring): failures, then WARNINGs."""
    failed: list[str] = []
    warned: list[str] = []
    for name, growth in grown.items():
        if name == PCIE_REPLAY:
            if growth > _pcie_replays_allowed(facts, seconds):
                warned.append(f"{name} +{growth}")
        elif name.endswith(NVLINK_RATE_COUNTERS):
            rate = growth / max(seconds, 1.0)
            (failed if rate >= NVLINK_CRC_PER_SECOND else warned).append(f"{name} +{growth}")
        elif growth >= NVLINK_ERRORS:
            failed.append(f"{name} +{growth}")
    findings = []
    if failed:
        findings.append(
            WatchFinding(
                "link_errors",
                gpu,
                f"{gpu}: link error counters grew during the run ({', '.join(failed)}): reset the GPU; if they "
                "grow again, have the link serviced (`nvidia-smi nvlink -e`, `nvidia-smi -q -d PCIE`)",
            )
        )
    if warned:
        findings.append(
            WatchFinding(
                "link_errors_low",
                gpu,
                f"{gpu}: link error counters grew during the run, below DCGM's failure rates ({', '.join(warned)}): "
                "watch them (`nvidia-smi nvlink -e`, `nvidia-smi -q -d PCIE`)",
                machine=False,
            )
        )
    return findings


def _pcie_replays_allowed(facts: GpuHealth, seconds: float) -> float:
    """PCIe replays DCGM expects over ``seconds`` on this link (a short run gets a minute's allowance)."""
    gen = facts.pcie_max_gen if facts.pcie_max_gen in PCIE_REPLAYS_PER_LANE_MINUTE else 1
    lanes = facts.pcie_max_width or facts.pcie_width or 1
    per_minute = math.ceil(PCIE_REPLAYS_PER_LANE_MINUTE[gen] * lanes)
    return per_minute * max(seconds / 60, 1.0)


def _lost_finding(gpu: str, lost: GpuLost) -> WatchFinding:
    where = f" during {lost.case} (its verdict: {lost.verdict})" if lost.case else " between cases"
    return WatchFinding(
        "gpu_lost",
        gpu,
        f"{gpu}: NVML lost the GPU{where} (NVML_ERROR_GPU_IS_LOST: fallen off the bus or otherwise inaccessible) -> "
        "reboot; reseat the GPU and check its power and riser (`dmesg | grep -i xid`: Xid 79); one that stays lost "
        "is a hardware case",
    )


def _xid_finding(gpu: str, event: XidEvent) -> WatchFinding:
    kind = xid_kind(event.xid)
    where = f" during {event.case} (its verdict: {event.verdict})" if event.case else " between cases"
    return WatchFinding(
        "xid",
        f"{gpu}-{event.xid}",
        f"{gpu}: Xid {event.xid} ({kind.meaning}){where} -> {kind.fix}",
        kind.machine,
    )
