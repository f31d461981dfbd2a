"""Hook wiring only: the run's state lives in :class:`ConformanceSession`, registered here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from conformance.launch.case import CaseResult
from conformance.matrix import DeviceSet, Rung, RungError, build_ladder, load_rungs_file
from conformance.results import new_run_id
from conformance.runs import Run, RunError, load_run
from conformance.scenario import Scenario, ScenarioError, load_scenario
from conformance.session import ConformanceSession, failure_text
from conformance.settings import SettingError, Settings, add_options
from conformance.settings import resolve as resolve_settings
from conformance.topology import Topology, TopologyError, discover, load_topology_file

SESSION_KEY = pytest.StashKey[ConformanceSession]()
WORKER_RUN_ID = "conformance_run_id"
WORKER_TOPOLOGY = "conformance_topology"

RunCase = Callable[..., CaseResult]


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def _topology(config: pytest.Config, settings: Settings, scenario: Scenario | None) -> Topology:
    """The controller's topology on xdist workers; else a topology file, else discovery."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and WORKER_TOPOLOGY in workerinput:
        return Topology.from_json(workerinput[WORKER_TOPOLOGY])
    if settings.topology_file is not None:
        return load_topology_file(settings.topology_file, settings.source("topology_file"))
    if scenario is not None and scenario.topology is not None:
        return load_topology_file(scenario.topology, f"{scenario.path} [scenario] topology")
    try:
        return discover(settings.backend, settings.virtual_devices)
    except ValueError as exc:
        raise SettingError(f"{settings.source('backend')}: {exc}") from None


def _ladder(settings: Settings) -> tuple[Rung, ...]:
    user = [(rung, settings.source("env_rung")) for rung in settings.env_rung]
    if settings.env_rungs_file is not None:
        where = settings.source("env_rungs_file")
        user = [(rung, str(settings.env_rungs_file)) for rung in load_rungs_file(settings.env_rungs_file, where)] + user
    return build_ladder(user)


def _baseline(config: pytest.Config, settings: Settings) -> Run | None:
    """Read before any case starts, so a bad baseline stops the run at once (the controller only)."""
    if settings.baseline is None or hasattr(config, "workerinput"):
        return None
    try:
        return load_run(settings.baseline)
    except RunError as exc:
        raise SettingError(f"{settings.source('baseline')}: {exc}") from None


def pytest_configure(config: pytest.Config) -> None:
    try:
        settings = resolve_settings(config)
        scenario = load_scenario(settings.scenario, settings.source("scenario")) if settings.scenario else None
        topology = _topology(config, settings, scenario)
        ladder = _ladder(settings)
        baseline = _baseline(config, settings)
    except (SettingError, ScenarioError, TopologyError, RungError, RunError) as exc:
        raise pytest.UsageError(f"conformance: {exc}") from None
    workerinput = getattr(config, "workerinput", None)
    run_id = workerinput[WORKER_RUN_ID] if workerinput and WORKER_RUN_ID in workerinput else new_run_id()
    session = ConformanceSession(config, settings, topology, scenario, run_id, ladder, baseline)
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, "conformance_session")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(session), "conformance_xdist")


class XdistHooks:
    """The controller decides the run id and the topology; every worker gets the same."""

    def __init__(self, session: ConformanceSession) -> None:
        self.session = session

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKER_RUN_ID] = self.session.run_id
        node.workerinput[WORKER_TOPOLOGY] = self.session.topology.to_json()


@pytest.fixture
def conformance(request: pytest.FixtureRequest) -> ConformanceSession:
    """The run's session: topology, settings, backend."""
    return request.config.stash[SESSION_KEY]


@pytest.fixture
def conformance_case(request: pytest.FixtureRequest, conformance: ConformanceSession) -> RunCase:
    """Run a probe as one case and turn its verdict into the test's outcome.

    ``run(probe, device_set, **params)``: pass -> returns, skip -> skipped, anything else ->
    failed.  With ``expect="<verdict>"`` the caller checks the result itself (negative controls).
    """

    def run(probe: str, device_set: DeviceSet, expect: str | None = None, **params: Any) -> CaseResult:
        result = conformance.run(request.node, probe, device_set, expect=expect, **params)
        if expect is not None:
            return result
        if result.verdict == "skip":
            pytest.skip(result.decision.summary)
        if result.verdict != "pass":
            pytest.fail(failure_text(result), pytrace=False)
        return result

    return run
