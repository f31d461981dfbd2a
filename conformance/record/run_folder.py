"""One run's folder: claimed once, run.json written when the run starts and again when it ends.

``reports/<run id>/`` holds run.json (the run's facts, ``end`` saying how far it got), results.jsonl
(a line per case) and the cases' folders; ``reports/latest`` points at the newest run.  On a
multi-node run the other nodes write ``<run id>-node<k>`` beside it (a shared file system).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from conformance.common import casefiles
from conformance.discover.watch import CaseSpan, RunWatch, Watch, attribute_xids
from conformance.record import results
from conformance.record.records import HOST_SET_KIND, CaseRecord, RunFacts
from conformance.record.runs import RUN_FACTS, read_jsonl

# A run folder's name: ``<run id>`` (results.new_run_id: date-time-hex) or ``<run id>-node<k>`` (RunFolder.path).
FOLDER_NAME = re.compile(r"(?P<run_id>\d{8}-\d{6}-[0-9a-f]+)(?:-node\d+)?")


def run_id_of(name: str) -> str | None:
    """The run id a run folder's name holds; None for a name that is no run folder's."""
    m = FOLDER_NAME.fullmatch(name)
    return m["run_id"] if m else None


# The id its caller chose for a run (conformance-healthcheck, to read back its own run's folder and no other).
GIVEN_RUN_ID = "CONFORMANCE_RUN_ID"


def given_run_id(environ: Mapping[str, str]) -> str | None:
    """The run id in ``$CONFORMANCE_RUN_ID`` (None: none given); ValueError for one that is no run folder's name."""
    given = environ.get(GIVEN_RUN_ID)
    if not given:
        return None
    if run_id_of(given) != given:
        raise ValueError(f"{GIVEN_RUN_ID}={given!r}: not a run id (YYYYMMDD-HHMMSS-<hex>, as results.new_run_id makes)")
    return given


@dataclass(frozen=True)
class RunFolder:
    reports_dir: Path
    run_id: str
    node_rank: int | None = None

    @classmethod
    def claimed(cls, reports_dir: Path, run_id: str, node_rank: int | None = None) -> RunFolder:
        """A folder of its own: the run id gets a suffix where another run of the same second holds it."""
        return cls(reports_dir, results.claim_run_folder(reports_dir, run_id), node_rank)

    @property
    def path(self) -> Path:
        folder = self.run_id if not self.node_rank else f"{self.run_id}-node{self.node_rank}"
        return self.reports_dir / folder

    @property
    def results(self) -> Path:
        return self.path / results.RESULTS_FILE

    @property
    def facts_file(self) -> Path:
        return self.path / RUN_FACTS

    def ensure(self, facts: Callable[[], RunFacts]) -> Path:
        """The folder with its run.json (``end`` still ``started``) and results.jsonl; ``latest`` at it."""
        if not self.facts_file.exists():
            self.path.mkdir(parents=True, exist_ok=True)
            self.results.touch()  # a run folder holds both from its start, records or not
            casefiles.write_json_atomic(self.facts_file, facts().to_json())
            if not self.node_rank:  # other nodes leave 'latest' to node 0 (a shared file system)
                results.point_latest(self.reports_dir, self.run_id)
        return self.path

    def write_end(self, facts: RunFacts) -> None:
        """run.json says how far the run got, before anything reads the run back.

        A results.jsonl deleted during the run is made again, empty: the run stays a run folder, and
        run.json's harness errors name every test whose record went with it.
        """
        casefiles.write_json_atomic(self.facts_file, facts.to_json())
        self.results.touch()

    def append(self, record: CaseRecord) -> None:
        results.append_case(self.results, record)

    def all_records(self) -> list[CaseRecord]:
        """Every record of results.jsonl (node 0's holds the other nodes' too, once gathered).

        A line that is no record of this suite is left out here; the run's answer names it (``load_run``'s warnings).
        """
        return read_jsonl(self.results, missing_ok=True)[0]

    def own_records(self) -> list[CaseRecord]:
        """The records of this run in its results file (none yet: an empty list)."""
        return [r for r in self.all_records() if r.run_id == self.run_id]


def stop_watch(watch: Watch, records: Sequence[CaseRecord], node_rank: int | None) -> RunWatch:
    """What the GPUs' watch saw, each Xid naming the case that ran on its GPU then."""
    own = [r for r in records if r.set_kind != HOST_SET_KIND and r.node_rank == node_rank]
    spans = [
        CaseSpan(r.nodeid, r.probe, r.verdict_text, r.devices, r.clock - r.seconds, r.clock)
        for r in own
        if r.clock is not None and r.seconds is not None
    ]
    return attribute_xids(watch.stop(transfer_generations(own)), spans)


def transfer_generations(records: Iterable[CaseRecord]) -> dict[str, int]:
    """Per GPU, the highest PCIe generation its ranks read while their timed transfers moved data."""
    highest: dict[str, int] = {}
    for record in records:
        read = record.metrics.get(casefiles.TRANSFER_GENERATIONS)
        for gpu, gen in read.items() if isinstance(read, dict) else ():
            if isinstance(gen, int):
                highest[gpu] = max(highest.get(gpu, 0), gen)
    return highest
