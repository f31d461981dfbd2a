"""What a run leaves behind, as types: one ``CaseRecord`` per case and the run's ``RunFacts``.

A record is written once (``results.case_record``), as one JSON object per line of
``results.jsonl``, and read back only through ``CaseRecord.from_json`` (``runs.py`` reads folders,
JSONL files, and JUnit files through the run their testsuites name: ``JunitRun``).

Fields hold JSON text where the suite does not interpret them itself: a probe's ``metrics``, the
NCCL log parse (``nccl``), a rank's flight-recorder extract and barrier facts, NVML's P2P status
and the topology in ``run.json``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from conformance.common.verdicts import Verdict

SCHEMA = 1
SIMULATED_GBPS = "simulated_gbps"  # a simulated pair's bandwidth in its metrics: its link's rate (link_rate.py)
LINK_GBPS = "link_gbps"  # a GPU pair's physical link rate in its metrics, GB/s per direction (link_rate.py)
HOST_SET_KIND = "host"  # the set_kind of a host check's record (conformance/host_checks.py): no devices, no rung
JUNIT_PREFIX = "conformance."

JsonObject = Mapping[str, Any]  # a JSON object the suite stores as it came (a boundary, not a contract)


@dataclass(frozen=True)
class RootCause:
    rank: int | None
    kind: str
    message: str
    phase: str | None
    step: str | None


@dataclass(frozen=True)
class RankRecord:
    rank: int = 0
    device: str = ""
    phase: str = ""
    step: str = ""
    exit: str | int | None = None  # the exit code, or the signal's name
    status: str = ""
    seconds: float = 0.0
    stopped_by: str | None = None
    unkillable: bool = False
    stack: str | None = None  # innermost frames when the watchdog stopped it
    collectives: JsonObject | None = None  # its flight recorder's last entries
    barrier: JsonObject | None = None  # barrier probes: its GPU and the one its barrier ran on
    cause: str | None = None  # a known cause its last log lines name: "Too many open files (...)"


UNKNOWN_VERDICT = "?"


@dataclass(frozen=True)
class CaseRecord:
    """One case, as results.jsonl holds it."""

    nodeid: str = ""
    probe: str = ""
    verdict: Verdict | None = None  # None: the record names no verdict this suite knows (not usable)
    schema: int = SCHEMA
    run_id: str | None = None
    devices: tuple[str, ...] = ()
    device_ids: tuple[str, ...] = ()
    link: str | None = None
    set_kind: str | None = None
    ladder_key: str | None = None
    backend: str | None = None
    env_name: str | None = None
    env: Mapping[str, str | None] = field(default_factory=dict)  # a rung's variables; None: removed
    expected_verdict: str | None = None  # a negative control's expected verdict
    summary: str = ""
    root_cause: RootCause | None = None
    victims: tuple[int, ...] = ()
    ranks: tuple[RankRecord, ...] = ()
    bandwidth_gbps: float | None = None
    metrics: JsonObject = field(default_factory=dict)
    p2p_status: Mapping[str, str] | None = None
    transports: JsonObject = field(default_factory=dict)
    predicted: Mapping[str, str] = field(default_factory=dict)  # link class -> transport NCCL should pick
    nccl_warnings: tuple[Any, ...] = ()
    nccl: JsonObject | None = None
    seconds: float | None = None
    lease_wait: float | None = None
    stop_reason: str | None = None
    stop_seconds: float | None = None
    simulated: bool = False
    node_rank: int | None = None
    nodes: tuple[int, ...] | None = None
    root_node: int | None = None
    node_verdicts: Mapping[str, str] | None = None
    case_dir: str | None = None
    time: float | None = None  # when the case ended, wall time for people
    # ... and on its host's monotonic clock: compared only with that host's other readings (the GPU watch's events)
    clock: float | None = None
    shared_by: str | None = None  # the test whose case also ran this one's collective (one process group)
    one_rung: bool = False  # its test is not parametrised over the rungs: it runs as inherited only
    no_nccl: bool = False  # its probe uses no NCCL (a peer copy): a failure is the machine's, never a class's rung

    @property
    def outcome(self) -> Verdict | None:
        """The verdict, when the record names one this suite knows."""
        return Verdict.of(self.verdict)

    @property
    def verdict_text(self) -> str:
        """The verdict as people read it; ``?`` where the record names none this suite knows."""
        outcome = self.outcome  # a record built by hand may hold the text
        return outcome.value if outcome is not None else UNKNOWN_VERDICT

    @property
    def usable(self) -> bool:
        """A record of a case this suite ran: it names the test, the probe and a known verdict."""
        return bool(self.nodeid and self.probe) and self.outcome is not None

    @property
    def ended_as_expected(self) -> bool:
        """A negative control that ended as its test expected: the suite checking itself, no failure."""
        return self.expected_verdict is not None and self.expected_verdict == self.verdict

    @property
    def counts(self) -> bool:
        """A case that says something about the machine: it ran on a rung (not skipped), no negative control."""
        ran = self.env_name is not None and self.verdict != Verdict.SKIP
        return self.usable and ran and self.expected_verdict is None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: JsonObject) -> CaseRecord:
        """A record read back; fields it lacks take their defaults, fields it does not know are left out."""
        values = _known(cls, data)
        values["verdict"] = Verdict.of(values.get("verdict"))
        for name in ("devices", "device_ids", "victims", "nccl_warnings"):
            if name in values:
                values[name] = tuple(values[name] or ())
        if values.get("nodes") is not None:
            values["nodes"] = tuple(values["nodes"])
        if isinstance(values.get("root_cause"), dict):
            values["root_cause"] = RootCause(**_known(RootCause, values["root_cause"], required=True))
        values["ranks"] = tuple(
            RankRecord(**_known(RankRecord, r)) for r in values.get("ranks") or () if isinstance(r, dict)
        )
        for name in ("env", "metrics", "transports", "predicted"):
            if name in values and values[name] is None:
                values[name] = {}
        return cls(**values)


def _texts(kind: type, data: JsonObject) -> dict[str, str]:
    """Every field of ``kind`` (all text) from ``data``; a missing or non-text one as text."""
    return {f.name: str(data.get(f.name, "")) for f in fields(kind)}


def _known(kind: type, data: JsonObject, required: bool = False) -> dict[str, Any]:
    names = [f.name for f in fields(kind)]
    if required:
        return {name: data.get(name) for name in names}
    return {name: data[name] for name in names if name in data}


# -- JUnit: the run a testsuite names --------------------------------------------------------

JUNIT_RUN_ID = f"{JUNIT_PREFIX}run_id"
JUNIT_RESULTS = f"{JUNIT_PREFIX}results"
JUNIT_VERSION = f"{JUNIT_PREFIX}version"


@dataclass(frozen=True)
class JunitRun:
    """The run a JUnit ``<testsuite>`` belongs to, as its properties name it.

    The xunit2 schema allows properties on a testsuite, not on a test case, so a JUnit file holds
    no record: it names the run (its id, its ``results.jsonl`` as an absolute path, the suite's
    version), and readers take the records from there.
    """

    run_id: str
    results: str
    version: str

    def properties(self) -> list[tuple[str, str]]:
        return [(JUNIT_RUN_ID, self.run_id), (JUNIT_RESULTS, self.results), (JUNIT_VERSION, self.version)]

    @classmethod
    def from_properties(cls, properties: Mapping[str, str | None]) -> JunitRun | None:
        """None unless both the run id and the results file are named (not this suite's, or written before)."""
        run_id, results = properties.get(JUNIT_RUN_ID), properties.get(JUNIT_RESULTS)
        if not run_id or not results:
            return None
        return cls(run_id, results, properties.get(JUNIT_VERSION) or "")


# -- run.json ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HarnessError:
    """A test pytest reported failed or errored that no case record explains.

    A harness error, a fixture's, a plugin of the user's raising, a worker that crashed, a negative
    control that did not end as its test expected: the suite cannot say what the machine did there.
    """

    nodeid: str  # as the records name the suite's tests (``suites/<file>::<test>``)
    when: str  # setup | call | teardown | worker crashed
    message: str  # the first line of what pytest reported

    @property
    def text(self) -> str:
        return f"{self.nodeid} ({self.when}: {self.message})"


# pytest's outcomes as its last line counts them (``TerminalReporter.stats``), kept in ``RunEnd.tests``
PYTEST_OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "deselected")


@dataclass(frozen=True)
class RunEnd:
    """How far a run got: ``started`` is written when it begins, the rest when it ends.

    A run.json still saying only ``started`` belongs to a run that never reached its end (killed) or
    is still running; either way its records do not cover its plan.
    """

    state: str = "started"  # started | complete | incomplete
    planned: int | None = None  # tests collected to run (after -k/-m/deselection)
    ran: int | None = None  # tests that got an outcome (fallback rungs found not needed are not counted)
    stopped_by: str | None = None  # what ended an incomplete run early
    harness_errors: tuple[HarnessError, ...] = ()  # failed tests no record explains: no answer from them
    failed_nodes: tuple[str, ...] = ()  # other nodes of the run that failed ("node 2: exit 1"): it failed here too
    store_problems: tuple[str, ...] = ()  # node 0: its store flooded by a client not of the run, or ended
    fallback: int | None = None  # of ``planned``, tests on fallback rungs: they run only where a class needs them
    fallback_ran: int | None = None  # of ``ran``, those on fallback rungs
    not_needed: int | None = None  # fallback-rung tests found not needed (pytest counts them deselected)
    tests: Mapping[str, int] | None = None  # pytest's counts by outcome (``PYTEST_OUTCOMES``); None: older runs
    # case seconds by what ended each case (``time_spent``): {"passed": {"cases": 40, "seconds": 31.2}, ...}
    spent: Mapping[str, Mapping[str, float]] | None = None

    @property
    def incomplete(self) -> str | None:
        if self.state == "complete":
            return None
        if self.state == "started":
            return "it never reached its end: killed, or still running"
        return f"{self.stopped_by or 'stopped'}: {self.how_far}"

    @property
    def how_far(self) -> str:
        """``40 of the 115 tests on the machine as it is ran, and 3 on fallback rungs (run only where needed)``."""
        if self.planned is None:
            return f"{self.ran} tests ran"
        if not self.fallback or self.fallback_ran is None:
            return f"{self.ran} of {self.planned} tests ran"
        first, first_ran = self.planned - self.fallback, (self.ran or 0) - self.fallback_ran
        return (
            f"{first_ran} of the {first} tests on the machine as it is ran, and {self.fallback_ran} of the "
            f"{self.fallback} on fallback rungs (those run only for a class that failed the rung before)"
        )

    @classmethod
    def from_json(cls, data: object) -> RunEnd:
        if not isinstance(data, dict) or data.get("state") not in ("started", "complete", "incomplete"):
            raise FactsError(f"run.json: end is not a run's end: {data!r}")
        values = _known(cls, data)
        errors = values.get("harness_errors") or []
        if not isinstance(errors, list) or not all(isinstance(e, dict) for e in errors):
            raise FactsError(f"run.json: end.harness_errors is not a list of failed tests: {errors!r}")
        values["harness_errors"] = tuple(HarnessError(**_texts(HarnessError, e)) for e in errors)
        for name in ("failed_nodes", "store_problems"):
            texts = values.get(name) or []
            if not isinstance(texts, list) or not all(isinstance(n, str) for n in texts):
                raise FactsError(f"run.json: end.{name} is not a list of texts: {texts!r}")
            values[name] = tuple(texts)
        tests = values.get("tests")
        if tests is not None and not (
            isinstance(tests, dict) and all(isinstance(k, str) and type(v) is int for k, v in tests.items())
        ):
            raise FactsError(f"run.json: end.tests is not pytest's counts by outcome: {tests!r}")
        spent = values.get("spent")
        if spent is not None and not (isinstance(spent, dict) and all(_numbers(v) for v in spent.values())):
            raise FactsError(f"run.json: end.spent is not case seconds by outcome: {spent!r}")
        return cls(**values)


def _numbers(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(x, (int, float)) for x in value.values())


HANG_ENDS = {
    "stalled": "hang: deadline paid",
    "deadline": "hang: deadline paid",
    "small_step": "hang: stuck in a small step",
    "confirm": "hang: stuck where its class hung",
}


def time_spent(records: Iterable[CaseRecord]) -> dict[str, dict[str, float]]:
    """Case seconds by what ended each case: passed, each way a hang was called, each other verdict.

    A case several tests share (one group, several collectives) counts once.
    """
    cases = {r.case_dir: r for r in records if r.case_dir and r.seconds is not None and r.verdict is not None}
    spent: dict[str, dict[str, float]] = {}
    for r in cases.values():
        verdict = str(r.verdict)
        outcome = HANG_ENDS.get(r.stop_reason or "", "hang: other") if verdict == "hang" else verdict
        entry = spent.setdefault(outcome, {"cases": 0, "seconds": 0.0})
        entry["cases"] += 1
        entry["seconds"] = round(entry["seconds"] + (r.seconds or 0.0), 3)
    return dict(sorted(spent.items()))


@dataclass(frozen=True)
class RungFacts:
    """A rung as a run wrote it down."""

    name: str
    set: Mapping[str, str] = field(default_factory=dict)
    unset_families: tuple[str, ...] = ()


class FactsError(ValueError):
    """run.json holds something unusable; the message says what."""


@dataclass(frozen=True)
class RunFacts:
    """``run.json``."""

    schema: int = SCHEMA
    run_id: str | None = None
    host: str | None = None
    backend: str | None = None
    topology: JsonObject | None = None  # as ``Topology.to_json`` wrote it
    torch: str | None = None
    nccl: str | None = None  # the NCCL torch loads (pip's nvidia-nccl-cu* version where that is not known)
    nccl_warning: str | None = None  # pip's metadata names another NCCL than the one loaded
    inherited_env: Mapping[str, str] = field(default_factory=dict)
    nccl_config: JsonObject | None = None  # what NCCL's configuration files set (``discover/nccl_config.py``)
    simulated: bool = False
    scenario: str | None = None
    matrix: str | None = None
    ladder: tuple[RungFacts, ...] | None = None  # None: the run did not say (older runs)
    case_timeout: float | None = None
    step_deadline: float | None = None  # seconds without progress that made a hang (older runs: None)
    small_step_wait: float | None = None  # seconds every rank sat in one small step that made a hang (None: older)
    confirm_wait: float | None = None  # seconds stuck where the class leader hung that made a hang (None: older)
    node_rank: int | None = None
    nnodes: int = 1
    cpu_only: str | None = None  # why no GPU was tested, on a run of CPU ranks that is not a simulation
    not_tested: str | None = None  # why the machine's GPUs were not tested together (MIG): no pair or set ran
    unsigned: str | None = None  # why a run across nodes beyond loopback signed nothing (``nodes/group.py``)
    slow_ratio: float | None = None  # a pair below this fraction of its class's median is SLOW (None: older runs)
    bandwidth_floors: Mapping[str, float] = field(default_factory=dict)  # link class -> least GB/s of a pair
    watch: JsonObject | None = None  # what NVML said during the run (``discover/watch.py``); None: not watched
    end: RunEnd | None = None  # None: an older run (whether it finished is not known)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: JsonObject) -> RunFacts:
        """Raises FactsError for a ladder that is not a list of rungs."""
        values = _known(cls, data)
        if values.get("ladder") is not None:
            values["ladder"] = _ladder(values["ladder"])
        for name in ("inherited_env", "bandwidth_floors"):
            if values.get(name) is None:
                values.pop(name, None)
        values["simulated"] = bool(values.get("simulated"))
        if values.get("end") is not None:
            values["end"] = RunEnd.from_json(values["end"])
        return cls(**values)

    @property
    def incomplete(self) -> str | None:
        """Why the run does not cover its plan, to follow "the run is incomplete" (None: it finished).

        Older runs did not say, and count as finished.
        """
        return self.end.incomplete if self.end else None

    @property
    def harness_errors(self) -> tuple[HarnessError, ...]:
        """The tests that failed without a record to explain them (older runs did not say: none)."""
        return self.end.harness_errors if self.end else ()

    @property
    def failed_nodes(self) -> tuple[str, ...]:
        """Other nodes of a multi-node run that failed, each with how (older runs did not say: none)."""
        return self.end.failed_nodes if self.end else ()

    @property
    def store_problems(self) -> tuple[str, ...]:
        """Node 0 of a multi-node run: its store flooded by a client not of the run, or ended (older runs: none)."""
        return self.end.store_problems if self.end else ()


def _ladder(entries: Any) -> tuple[RungFacts, ...]:
    if not isinstance(entries, list):
        raise FactsError("run.json: ladder is not a list of rungs")
    return tuple(_rung(number, entry) for number, entry in enumerate(entries, start=1))


def _rung(number: int, entry: Any) -> RungFacts:
    try:
        name, env, unset = entry["name"], entry.get("set") or {}, entry.get("unset_families") or []
        texts: Sequence[Any] = [name, *env, *env.values(), *unset]
        valid = isinstance(unset, list) and all(isinstance(v, str) for v in texts)
    except (TypeError, KeyError, AttributeError):
        valid = False
    if not valid:
        raise FactsError(f"run.json: ladder entry {number} is not {{name, set, unset_families}}: {entry!r}")
    return RungFacts(name, dict(env), tuple(unset))
