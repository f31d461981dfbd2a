"""The plugin pytest loads: options, markers, fixtures; a run of the suite gets a ``ConformanceSession``."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from conformance.common.inputs import NotReadable, absolute
from conformance.common.suite import SUITES_DIR, SUITES_PACKAGE
from conformance.common.verdicts import Verdict
from conformance.harness import host_checks, junit
from conformance.harness.cases import detailed
from conformance.harness.context import RunContext
from conformance.harness.local import collective
from conformance.harness.setup import run_context
from conformance.harness.shared_group import MARKER_HELP
from conformance.harness.workers import RUN_ID, die_with_controller, worker_input
from conformance.launch.case import CaseResult, failure_text, headline
from conformance.nodes.layout import extra_local_process
from conformance.plan.matrix import DEVICE_SET_FIXTURES, NODE_SET_FIXTURES, DeviceSet
from conformance.plan.parametrize import NO_NCCL
from conformance.session import ConformanceSession
from conformance.settings import add_options

SESSION_KEY = pytest.StashKey[ConformanceSession]()
RunCase = Callable[..., CaseResult]
RunCollective = Callable[[DeviceSet], CaseResult]


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


PLUGIN_NAMES = ("conformance.plugin", "conformance")  # as "-p NAME" spells it
SUITE_FIXTURES = frozenset({"conformance", "conformance_case", "collective_case"})


def runs_the_suite(config: pytest.Config) -> bool:
    """Whether this pytest run is the suite's; in any other the plugin adds only its options and markers.

    pytest loads the plugin in every run of an environment it is installed in (its entry point),
    so it acts only where asked: the suite's tests named (a path in or around ``conformance/suites``,
    the checkout's ``suites/`` link included, or ``--pyargs conformance.suites...``), ``-p
    conformance.plugin`` given (tests of one's own), or an xdist worker of such a run.
    """
    handed = worker_input(config)
    if handed is not None:
        return RUN_ID in handed
    if any(name in PLUGIN_NAMES for name in config.known_args_namespace.plugins or ()):
        return True
    for arg in config.args:
        named = arg.split("::")[0]
        if config.option.pyargs and (named == "conformance" or named.split(".")[:2] == SUITES_PACKAGE.split(".")):
            return True
        try:
            path = absolute(config.invocation_params.dir / named)
        except NotReadable:  # a link loop: not the suite's; pytest names the path it cannot collect
            continue
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
    die_with_controller(config)
    session = config.stash[SESSION_KEY] = ConformanceSession(run_context(config))
    session.register(config.pluginmanager)


@pytest.fixture
def conformance(request: pytest.FixtureRequest) -> RunContext:
    """The run: topology, settings, backend."""
    return request.config.stash[SESSION_KEY].run


@pytest.fixture
def host_metric(request: pytest.FixtureRequest) -> host_checks.HostMetric:
    """``host_metric(name, value)``: a value a host check found, kept in its record's ``metrics``."""
    return partial(host_checks.keep_metric, request.node)


@pytest.fixture
def conformance_case(request: pytest.FixtureRequest) -> RunCase:
    """Run a probe as one case and turn its verdict into the test's outcome.

    ``run(probe, device_set, **params)``: pass -> returns, skip -> skipped, anything else ->
    failed.  With ``expect="<verdict>"`` the caller checks the result itself (negative controls).
    """
    session = request.config.stash[SESSION_KEY]

    def run(probe: str, device_set: DeviceSet, expect: str | None = None, **params: Any) -> CaseResult:
        result = session.run_case(request.node, probe, device_set, expect, **params)
        if expect is not None:
            return result
        if result.verdict == Verdict.SKIP:
            pytest.skip(result.decision.summary)
        if result.verdict != Verdict.PASS:
            request.node.stash[junit.HEADLINE] = headline(result)
            pytest.fail(failure_text(result, full=detailed(request.config)), pytrace=False)
        return result

    return run


@pytest.fixture
def collective_case(request: pytest.FixtureRequest, conformance_case: RunCase) -> RunCollective:
    """Run the collective the test declares with ``@pytest.mark.collective(probe, **params)``, at the run's sizes.

    Declared so, the collectives of several tests over one device set may share one process group
    (``conformance/harness/shared_group.py``); each test still gets its own verdict.
    """
    declared = collective(request.config.stash[SESSION_KEY].run, request.node)
    if declared is None:
        pytest.fail(f"collective_case needs the marker @pytest.mark.{MARKER_HELP}", pytrace=False)
    probe, params = declared
    return lambda device_set: conformance_case(probe, device_set, **params)
