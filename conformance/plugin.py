"""Hook wiring only: the run's state lives in :class:`ConformanceSession`, registered here."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from conformance import host_checks, junit
from conformance.common.deadlines import DeadlineError
from conformance.common.lifetime import die_with_parent
from conformance.common.suite import SUITES_DIR, SUITES_PACKAGE, baseline_path, shipped_baselines
from conformance.common.verdicts import Verdict
from conformance.discover.topology import (
    Topology,
    TopologyError,
    discover,
    load_topology_file,
    refuse_broken_gpu_machine,
)
from conformance.launch.case import CaseResult, failure_text, headline
from conformance.nodes.layout import LauncherError, NodeError, NodeSetup, extra_local_process, node_setup
from conformance.plan.matrix import (
    DEVICE_SET_FIXTURES,
    NODE_SET_FIXTURES,
    DeviceSet,
    Rung,
    RungError,
    load_rungs_file,
    parse_rung_spec,
)
from conformance.plan.parametrize import NO_NCCL
from conformance.plan.scenario_fit import RunBounds, check_scenario_fits
from conformance.rank.scenario import Scenario, ScenarioError, load_scenario
from conformance.record.results import new_run_id
from conformance.record.runs import Run, RunError, load_run
from conformance.session import NOT_NEEDED_KEY, ConformanceSession, uses_xdist
from conformance.settings import NODE_LAYOUT, SettingError, Settings, add_options
from conformance.settings import resolve as resolve_settings
from conformance.shared_group import MARKER_HELP
from conformance.summarise.compare import machine_difference

SESSION_KEY = pytest.StashKey[ConformanceSession]()
WORKER_RUN_ID = "conformance_run_id"
WORKER_CONTROLLER = "conformance_controller_pid"
WORKER_TOPOLOGY = "conformance_topology"

RunCase = Callable[..., CaseResult]
RunCollective = Callable[[DeviceSet], CaseResult]


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def _topology(config: pytest.Config, settings: Settings, scenario: Scenario | None) -> Topology:
    """The controller's topology on xdist workers; else a topology file, else discovery."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and WORKER_TOPOLOGY in workerinput:
        return Topology.from_json(workerinput[WORKER_TOPOLOGY])
    simulated = None
    if settings.topology_file is not None:
        simulated = load_topology_file(settings.topology_file, settings.source("topology_file"))
    elif scenario is not None and scenario.topology is not None:
        simulated = load_topology_file(scenario.topology, f"{scenario.path} [scenario] topology")
    if simulated is not None:  # a simulated machine whose NVML fails stops as a real one does
        refuse_broken_gpu_machine(simulated.inventory, settings.backend, f"simulated ({simulated.source}): ")
        return simulated
    try:
        return discover(settings.backend, settings.virtual_devices)
    except TopologyError:
        raise  # one line naming CUDA_VISIBLE_DEVICES or NVML; the backend setting is not its source
    except ValueError as exc:
        raise SettingError(f"{settings.source('backend')}: {exc}") from None


def _user_rungs(settings: Settings) -> list[tuple[Rung, str]]:
    """The user's rungs (file first, then each --env-rung), each with where it came from."""
    where = settings.source("env_rung")
    user = [(parse_rung_spec(spec, where), where) for spec in settings.env_rung]
    if settings.env_rungs_file is not None:
        from_file = load_rungs_file(settings.env_rungs_file, settings.source("env_rungs_file"))
        user = [(rung, str(settings.env_rungs_file)) for rung in from_file] + user
    return user


def _baseline(config: pytest.Config, settings: Settings) -> Run | None:
    """Read before any case starts, so a bad baseline stops the run at once (the controller only)."""
    if settings.baseline is None or hasattr(config, "workerinput"):
        return None
    path = baseline_path(settings.baseline)
    try:
        return load_run(path)
    except RunError as exc:
        shipped = "" if path.exists() else f" (nor is it a shipped baseline: {', '.join(shipped_baselines())})"
        raise SettingError(f"{settings.source('baseline')}: {exc}{shipped}") from None


def _check_baseline(session: ConformanceSession) -> None:
    """A baseline this run could never be compared with stops it now, not after every case has run."""
    baseline, source = session.baseline, session.settings.source("baseline")
    if baseline is None:
        return
    if not baseline.usable_records:
        raise SettingError(f"{source}: {baseline.source}: no case of this suite recorded, nothing to compare with")
    difference = machine_difference(baseline, Run("this run", session.run_facts(), []))
    if difference:
        raise SettingError(
            f"{source}: {baseline.source} comes from another machine ({difference}); "
            "compare such runs afterwards with `python -m conformance compare --allow-different-machines`"
        )


def _node_setup(config: pytest.Config, settings: Settings) -> NodeSetup | None:
    """A multi-node run's layout, checked here; the session meets the other nodes when it starts."""
    explicit = {name: getattr(settings, name) for name in NODE_LAYOUT}
    try:
        setup = node_setup(explicit, os.environ, settings.run_token)
    except LauncherError as exc:  # it names the variable; the settings given are not what is wrong
        raise SettingError(str(exc)) from None
    except NodeError as exc:
        sources = ", ".join(f"{settings.source(n)}" for n in NODE_LAYOUT if explicit[n] is not None)
        raise SettingError(f"{exc}" + (f" (from {sources})" if sources else "")) from None
    if not setup.multi_node or config.option.help or config.option.version:
        return None
    if uses_xdist(config):
        raise SettingError(
            f"{setup.nnodes} nodes (from {setup.source}): a multi-node run is one pytest process per node; "
            "drop -n/--dist (cross-node cases must run in the same order on every node)"
        )
    return setup


def _die_with_controller(workerinput: dict[str, Any]) -> None:
    """An xdist worker dies the moment its controller does, and its forkserver and ranks with it.

    Otherwise a killed controller leaves the worker running its case until execnet notices.  Only a
    worker the controller started itself (popen): a remote one (``--tx ssh=...``) has another parent.
    """
    controller = workerinput.get(WORKER_CONTROLLER)
    if controller is not None and os.getppid() == controller and not die_with_parent(controller):
        os._exit(1)  # the controller died before the request took hold


PLUGIN_NAMES = ("conformance.plugin", "conformance")  # as "-p NAME" spells it
SUITE_FIXTURES = frozenset({"conformance", "conformance_case", "collective_case"})


def runs_the_suite(config: pytest.Config) -> bool:
    """Whether this pytest run is the suite's; in any other the plugin adds only its options and markers.

    pytest loads the plugin in every run of an environment it is installed in (its entry point),
    so it acts only where asked: the suite's tests named (a path in or around ``conformance/suites``,
    the checkout's ``suites/`` link included, or ``--pyargs conformance.suites...``), ``-p
    conformance.plugin`` given (tests of one's own), or an xdist worker of such a run.
    """
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return WORKER_RUN_ID in workerinput
    if any(name in PLUGIN_NAMES for name in config.known_args_namespace.plugins or ()):
        return True
    for arg in config.args:
        named = arg.split("::")[0]
        if config.option.pyargs and (named == "conformance" or named.split(".")[:2] == SUITES_PACKAGE.split(".")):
            return True
        path = (config.invocation_params.dir / named).resolve()
        if path == SUITES_DIR or SUITES_DIR in path.parents or path in SUITES_DIR.parents:
            return True
    return False


class NotTheSuite:
    """A run that is not the suite's: a test asking for the suite's fixtures is refused saying how to run it."""

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        fixtures = SUITE_FIXTURES | set(DEVICE_SET_FIXTURES) | set(NODE_SET_FIXTURES)
        asking = [item.nodeid for item in items if fixtures & set(getattr(item, "fixturenames", ()))]
        if asking:
            more = f" (and {len(asking) - 1} more)" if len(asking) > 1 else ""
            raise pytest.UsageError(
                f"conformance: {asking[0]}{more} uses the suite's fixtures, but this run is not the suite's: "
                f"name the suite (pytest --pyargs {SUITES_PACKAGE}, or its folder) or add -p conformance.plugin"
            )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance_gpu: the case needs the NCCL backend and GPUs")
    config.addinivalue_line(
        "markers", f"{NO_NCCL}: the probe uses no NCCL: it runs once, on inherited, outside the ladder"
    )
    config.addinivalue_line("markers", MARKER_HELP)
    config.addinivalue_line("markers", host_checks.MARKER_HELP)
    if not runs_the_suite(config):
        config.pluginmanager.register(NotTheSuite(), "conformance_not_the_suite")
        return
    extra = extra_local_process(os.environ)
    if extra is not None:  # exit 0: torchrun would stop the node's real pytest if this one failed
        pytest.exit(f"conformance: {extra}", returncode=0)
    workerinput = getattr(config, "workerinput", None)
    if workerinput:
        _die_with_controller(workerinput)
    run_id = workerinput[WORKER_RUN_ID] if workerinput and WORKER_RUN_ID in workerinput else new_run_id()
    try:
        settings = resolve_settings(config)
        scenario = load_scenario(settings.scenario, settings.source("scenario")) if settings.scenario else None
        topology = _topology(config, settings, scenario)
        setup = _node_setup(config, settings)
        if scenario is not None:
            nnodes = setup.nnodes if setup else 1
            bounds = RunBounds.of(topology, nnodes, settings.case_timeout, settings.source("case_timeout"))
            check_scenario_fits(scenario, bounds)
        user_rungs = _user_rungs(settings)
        baseline = _baseline(config, settings)
        session = ConformanceSession(config, settings, topology, scenario, run_id, user_rungs, baseline, setup)
        _check_baseline(session)
    except (SettingError, ScenarioError, TopologyError, RungError, RunError) as exc:
        raise pytest.UsageError(f"conformance: {exc}") from None
    except DeadlineError as exc:
        raise pytest.UsageError(f"conformance: the deadlines are out of order: {exc}") from None
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, "conformance_session")
    config.pluginmanager.register(host_checks.HostChecks(session), "conformance_host_checks")
    config.pluginmanager.register(junit.JunitHooks(session), "conformance_junit")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(session), "conformance_xdist")


class XdistHooks:
    """The controller decides the run id, the topology and which worker runs what; every worker gets the same."""

    def __init__(self, session: ConformanceSession) -> None:
        self.session = session

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKER_RUN_ID] = self.session.run_id
        node.workerinput[WORKER_CONTROLLER] = os.getpid()
        node.workerinput[WORKER_TOPOLOGY] = self.session.topology.to_json()

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A worker's later rungs not run (never reported): covered, and counted deselected as pytest counts them."""
        ids = list(getattr(node, "workeroutput", {}).get(NOT_NEEDED_KEY, ()))
        for nodeid in ids:
            self.session.coverage.reported(nodeid)
        terminal = self.session.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.stats.setdefault("deselected", []).extend(ids)

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """The controller collects nothing itself: the run's plan is what its workers collected."""
        self.session.coverage.collected(len(ids))

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """Plain ``-n N`` (xdist's ``load``): every rung of a device set goes to one worker (``Plan.worker_scope``)."""
        if config.getoption("dist", "load") != "load":
            return None  # the user chose a distribution: theirs
        from xdist.scheduler import LoadScopeScheduling

        scope = self.session.plan.worker_scope

        class DeviceSetScheduling(LoadScopeScheduling):  # type: ignore[misc]
            def _split_scope(self, nodeid: str) -> str:
                return scope(nodeid)

        return DeviceSetScheduling(config, log)


@pytest.fixture
def conformance(request: pytest.FixtureRequest) -> ConformanceSession:
    """The run's session: topology, settings, backend."""
    return request.config.stash[SESSION_KEY]


@pytest.fixture
def host_metric(request: pytest.FixtureRequest) -> host_checks.HostMetric:
    """``host_metric(name, value)``: a value a host check found, kept in its record's ``metrics``."""
    return partial(host_checks.keep_metric, request.node)


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
        if result.verdict == Verdict.SKIP:
            pytest.skip(result.decision.summary)
        if result.verdict != Verdict.PASS:
            request.node.stash[junit.HEADLINE] = headline(result)
            pytest.fail(failure_text(result), pytrace=False)
        return result

    return run


@pytest.fixture
def collective_case(
    request: pytest.FixtureRequest, conformance: ConformanceSession, conformance_case: RunCase
) -> RunCollective:
    """Run the collective the test declares with ``@pytest.mark.collective(probe, **params)``, at the run's sizes.

    Declared so, the collectives of several tests over one device set may share one process group
    (``conformance/shared_group.py``); each test still gets its own verdict.
    """
    declared = conformance.collective(request.node)
    if declared is None:
        pytest.fail(f"collective_case needs the marker @pytest.mark.{MARKER_HELP}", pytrace=False)
    probe, params = declared
    return lambda device_set: conformance_case(probe, device_set, **params)
