"""The run's shared state: one typed object every owner of the pytest layer reads (and the suites' fixture)."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conformance.common.bounded_parse import json_value
from conformance.common.families import inherited_variables
from conformance.common.versions import release
from conformance.discover.nccl_config import NcclConfig, read_nccl_config, simulated_config
from conformance.discover.topology import Topology
from conformance.discover.topology_source import choose_backend
from conformance.discover.versions import NcclVersions, loaded_nccl_version, nccl_wheel_version, package_version
from conformance.discover.watch import Watch
from conformance.harness.failed_tests import FailedTests
from conformance.harness.workers import Role
from conformance.nodes.group import NodeGroup
from conformance.nodes.layout import NodeSetup
from conformance.nodes.start_check import StartCheck
from conformance.plan.ladder import LADDER_FILE, LadderBook
from conformance.plan.matrix import NodePairing, Rung, build_ladder
from conformance.plan.parametrize import Plan
from conformance.plan.transport import SHM, NcclHost, pair_paths
from conformance.rank.scenario import Scenario
from conformance.record.coverage import Coverage
from conformance.record.records import RunEnd, RunFacts, RungFacts
from conformance.record.run_folder import RunFolder
from conformance.record.runs import Run
from conformance.settings import Settings, deadlines
from conformance.summarise.conclude import Conclusion

# Message sizes per case; on GPU they straddle NCCL's protocol switch points (LL, LL128, Simple).
COLLECTIVE_SIZES = {"cpu": [4, 64 << 10, 1 << 20], "gpu": [4, 256 << 10, 1 << 20, 64 << 20]}


@dataclass(frozen=True)
class RunInputs:
    """What the run is asked to test, checked and read before it starts (``harness.setup``)."""

    settings: Settings
    topology: Topology
    scenario: Scenario | None
    run_id: str
    user_rungs: tuple[tuple[Rung, str], ...] = ()
    baseline: Run | None = None
    node_setup: NodeSetup | None = None  # a multi-node run's layout; the nodes are met at session start


def user_timeout(config: pytest.Config) -> float | None:
    """pytest-timeout's ``--timeout`` where the user gave one (0 or none: no limit)."""
    try:
        given = config.getoption("timeout")
    except ValueError:  # pytest-timeout not loaded
        return None
    try:
        seconds = float(given) if given is not None else 0.0
    except (TypeError, ValueError):
        return None  # pytest-timeout refuses it itself
    return seconds if seconds > 0 else None


@dataclass
class RunOutcome:
    """How the run ended, filled in at its end (``harness.ending``) and read by the terminal and JUnit."""

    conclusion: Conclusion = field(default_factory=Conclusion)
    end: RunEnd | None = None
    failed_nodes: tuple[str, ...] = ()  # other nodes that failed: the run failed here too
    store_problems: tuple[str, ...] = ()  # node 0: its store flooded by a stranger, or ended: the run fails
    node_notes: list[str] = field(default_factory=list)  # what the nodes' meetings said, for the summary
    unwritten: list[str] = field(default_factory=list)  # "run.json NOT written: <why>": each fails the run
    notes: list[str] = field(default_factory=list)  # what the end wrote where ("metrics for Prometheus: <path>")
    facts: RunFacts | None = None  # the end's facts, where run.json could not take them


class RunContext:
    """The run: its inputs, plan, ladder book, folder, other nodes, and what it has seen so far."""

    def __init__(self, config: pytest.Config, inputs: RunInputs, role: Role) -> None:
        self.config = config
        self.role = role
        self.settings = inputs.settings
        self.topology = inputs.topology
        self.scenario = inputs.scenario
        self.baseline = inputs.baseline
        self.user_rungs = inputs.user_rungs
        self.node_setup = inputs.node_setup
        self.backend = choose_backend(self.settings.backend, self.topology)
        self.deadlines = deadlines(self.settings, self.backend)
        self.nccl = self._nccl_versions()
        self.nccl_host = NcclHost(self.topology.cpu, self.nccl.used, self.topology.cuda_driver)
        self.nccl_config = self._nccl_config()
        self.nodes: NodeGroup | None = None  # a multi-node run's group, once met
        self.start: StartCheck | None = None
        self.coverage = Coverage()
        self.failed_tests = FailedTests(config.rootpath)
        self.outcome = RunOutcome()
        self.gpu_watch: Watch | None = None  # the run's owner watches its GPUs from start to end
        self.replan(inputs.run_id, build_ladder(self.user_rungs))

    def replan(self, run_id: str, ladder: Sequence[Rung]) -> None:
        """The run's folder, plan and ladder book (again once claimed, and once the nodes have agreed)."""
        self.folder = RunFolder(self.settings.reports_dir, run_id, self.node_rank)
        nnodes = self.node_setup.nnodes if self.node_setup else 1
        pairing = NodePairing.of(nnodes, self.settings.node_pairs, seed=run_id)
        fallbacks_matter = self.backend == "nccl" or self.simulated
        self.plan = Plan(self.topology, ladder, self.settings.matrix, fallbacks_matter, pairing)
        book_file = self.folder.path / LADDER_FILE
        self.book = LadderBook(book_file, ladder, self.settings.matrix, self.deadlines.rung_wait, self.nccl_host)

    @property
    def run_id(self) -> str:
        return self.folder.run_id

    @property
    def run_dir(self) -> Path:
        return self.folder.path

    @property
    def results_path(self) -> Path:
        return self.folder.results

    def ensure_run_dir(self) -> Path:
        """The run folder, with run.json saying the run has started."""
        return self.folder.ensure(self.run_facts)

    def results_file(self) -> Path:
        """results.jsonl, in a run folder that exists."""
        self.ensure_run_dir()
        return self.results_path

    def _nccl_versions(self) -> NcclVersions:
        """The NCCL the run tests: a simulated machine's own (its topology file's "nccl"), else what torch loads.

        Faults injected into this host's ranks (a scenario without a topology) leave the NCCL this host's:
        the second real-GPU run had said "NCCL n/a" there (docs/gpu-runs/2026-11-28-h200).
        """
        if self.machine_played:  # never this host's wheel: the machine's answer must not depend on where it is played
            return NcclVersions(self.topology.nccl, None)
        # The library torch loads, asked only on NCCL runs (importing torch here costs a second or two).
        return NcclVersions(loaded_nccl_version() if self.backend == "nccl" else None, nccl_wheel_version())

    def _nccl_config(self) -> NcclConfig:
        """NCCL's configuration files: a simulated image's (its scenario's), else this host's on NCCL runs."""
        if self.machine_played or (self.scenario is not None and self.scenario.nccl_conf):
            return simulated_config(self.scenario.nccl_conf if self.scenario else None)
        return read_nccl_config(os.environ, release(self.nccl.used)) if self.backend == "nccl" else NcclConfig()

    @functools.cached_property
    def nccl_environ(self) -> dict[str, str]:
        """The environment NCCL sees in a rank that inherits the run's: its configuration files' values added.

        Read once: the run's own environment does not change while it runs (the planner asks thousands of times).
        """
        return self.nccl_config.environment(os.environ)

    @property
    def machine_played(self) -> bool:
        """The machine is not this host: a topology file's, or a GPU machine played by gloo ranks on CPU."""
        return self.topology.source not in ("nvml", "virtual") or (
            self.topology.kind == "gpu" and self.backend == "gloo"
        )

    @property
    def simulated(self) -> bool:
        """Faults injected, or a GPU machine (a topology file) played by gloo ranks on CPU."""
        return self.scenario is not None or (self.topology.kind == "gpu" and self.backend == "gloo")

    @property
    def cpu_only(self) -> str | None:
        """Why no GPU was tested, on a run of CPU ranks that stands for itself (a simulated one says SIMULATED)."""
        if self.topology.kind != "cpu" or self.simulated:
            return None
        return self.topology.note or "virtual CPU devices"

    @property
    def node_rank(self) -> int | None:
        return self.nodes.me if self.nodes else None

    @property
    def setup(self) -> NodeSetup | None:
        return self.nodes.setup if self.nodes else None

    @property
    def sizes(self) -> list[int]:
        """The collectives' message sizes; the largest, where bus bandwidth is measured, is ``--max-bytes``."""
        sizes = COLLECTIVE_SIZES["gpu" if self.backend == "nccl" else "cpu"]
        top = self.settings.max_bytes
        return sizes if top is None else [*(s for s in sizes if s < top), top]

    @property
    def shm_predicted(self) -> bool:
        """Whether NCCL would use its SHM transport between some of the run's GPUs (transport.py; unknown: yes)."""
        devices = self.topology.devices
        transports = self.nccl_host.transports(pair_paths(self.topology, devices), len(devices), self.nccl_environ)
        return transports is None or SHM in transports

    @property
    def lease_dir(self) -> Path | None:
        """GPUs are leased machine-wide; a simulated GPU machine within its run; CPU ranks not at all."""
        if self.topology.kind != "gpu":
            return None
        return self.settings.lease_dir if self.backend == "nccl" else self.run_dir / "leases"

    def run_facts(self) -> RunFacts:
        return RunFacts(
            run_id=self.run_id,
            host=socket.gethostname(),
            backend=self.backend,
            topology=json_value(self.topology.to_json()),  # its own JSON: the one parser all the same
            torch=package_version("torch"),
            nccl=self.nccl.used,
            nccl_warning=self.nccl.warning,
            inherited_env=inherited_variables(),
            nccl_config=self.nccl_config.to_json() if self.nccl_config.files else None,
            simulated=self.simulated,
            scenario=self.scenario.path if self.scenario else None,
            matrix=self.plan.mode,
            ladder=tuple(RungFacts(r.name, dict(r.set), r.unset_families) for r in self.plan.ladder),
            case_timeout=self.settings.case_timeout,
            step_deadline=self.deadlines.step_deadline,
            small_step_wait=self.deadlines.small_step_wait,
            confirm_wait=self.deadlines.confirm_wait,
            node_rank=self.node_rank,
            nnodes=self.setup.nnodes if self.setup else 1,
            cpu_only=self.cpu_only,
            not_tested=self.plan.untestable,
            unsigned=self.nodes.unsigned if self.nodes is not None else None,
            slow_ratio=self.settings.slow_ratio,
            bandwidth_floors=dict(self.settings.bandwidth_floor),
            end=RunEnd(),
        )
