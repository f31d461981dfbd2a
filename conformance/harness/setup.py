"""From pytest's config to the run's inputs: settings, scenario, topology, node layout, rungs, baseline.

Everything a run could be refused for is read and checked here, before any case starts, and turned
into one ``pytest.UsageError`` naming the bad value and where it came from.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from conformance.common.suite import baseline_path, shipped_baselines
from conformance.discover.topology import Topology, TopologyError
from conformance.discover.topology_source import discover, load_topology_file, refuse_broken_gpu_machine
from conformance.harness.context import RunContext, RunInputs, user_timeout
from conformance.harness.workers import RUN_ID, TOPOLOGY, Role, worker_input
from conformance.nodes.layout import LauncherError, NodeError, NodeSetup, node_setup
from conformance.plan.matrix import Rung, RungError, load_rungs_file, parse_rung_spec
from conformance.plan.scenario_fit import RunBounds, check_scenario_fits
from conformance.rank.scenario import Scenario, ScenarioError, load_scenario
from conformance.record.results import new_run_id
from conformance.record.run_folder import given_run_id
from conformance.record.runs import Run, RunError, load_run
from conformance.settings import NODE_LAYOUT, SettingError, Settings, deadlines
from conformance.settings import resolve as resolve_settings
from conformance.summarise.compare import machine_difference


def run_context(config: pytest.Config) -> RunContext:
    """The run's context, or a ``pytest.UsageError`` saying what stops the run."""
    role = Role.of(config)
    try:
        context = RunContext(config, _inputs(config, role), role)
        _check_baseline(context)
    except (SettingError, ScenarioError, TopologyError, RungError, RunError) as exc:
        raise pytest.UsageError(f"conformance: {exc}") from None
    return context


def _inputs(config: pytest.Config, role: Role) -> RunInputs:
    handed = worker_input(config) or {}
    settings = honour_pytest_timeout(user_timeout(config), resolve_settings(config))
    scenario = load_scenario(settings.scenario, settings.source("scenario")) if settings.scenario else None
    topology = Topology.from_json(handed[TOPOLOGY]) if TOPOLOGY in handed else _topology(settings, scenario)
    setup = _node_setup(config, settings, role)
    if scenario is not None:
        nnodes = setup.nnodes if setup else 1
        check_scenario_fits(
            scenario, RunBounds.of(topology, nnodes, settings.case_timeout, settings.source("case_timeout"))
        )
    return RunInputs(
        settings=settings,
        topology=topology,
        scenario=scenario,
        run_id=handed.get(RUN_ID) or _given_run_id() or new_run_id(),
        user_rungs=tuple(_user_rungs(settings)),
        baseline=None if role.worker else _baseline(settings),
        node_setup=setup,
    )


def _given_run_id() -> str | None:
    try:
        return given_run_id(os.environ)
    except ValueError as exc:
        raise SettingError(str(exc)) from None


IN_RANK_MARGIN = 1.0  # seconds between the in-rank timeouts and the case limit that bounds them


def honour_pytest_timeout(limit: float | None, settings: Settings) -> Settings:
    """Every case ends within pytest-timeout's ``--timeout``: the case limit shrinks to fit the stop ladder in it.

    The in-rank timeouts must still fire inside the case limit (the deadlines' layers), and the stop
    ladder must fit after it: a limit below that cannot judge a hang and reap its ranks, and is refused.
    """
    if limit is None:
        return settings
    stop = deadlines(settings, "gloo").stop_ladder.total
    in_rank = max(settings.init_timeout, settings.op_timeout)
    need = in_rank + IN_RANK_MARGIN + stop
    if limit < need:
        raise SettingError(
            f"pytest-timeout --timeout {limit:g}: below what one case needs to be judged and stopped ({need:g}s: "
            f"its in-rank timeouts of {in_rank:g}s, a margin of {IN_RANK_MARGIN:g}s and the stop ladder's {stop:g}s); "
            f"give --timeout {need:g} or more, or shorter --init-timeout/--op-timeout, or leave it out: the suite "
            "bounds each case itself (--case-timeout)"
        )
    case_timeout = min(settings.case_timeout, limit - stop)
    return replace(settings, case_timeout=case_timeout, step_timeout=min(settings.step_timeout, case_timeout))


def _topology(settings: Settings, scenario: Scenario | None) -> Topology:
    """A topology file (given, or the scenario's), else discovery."""
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


def _baseline(settings: Settings) -> Run | None:
    """Read before any case starts, so a bad baseline stops the run at once (the controller only)."""
    if settings.baseline is None:
        return None
    path = baseline_path(settings.baseline)
    try:
        return load_run(path)
    except RunError as exc:
        shipped = "" if path.exists() else f" (nor is it a shipped baseline: {', '.join(shipped_baselines())})"
        raise SettingError(f"{settings.source('baseline')}: {exc}{shipped}") from None


def _check_baseline(context: RunContext) -> None:
    """A baseline this run could never be compared with stops it now, not after every case has run."""
    baseline, source = context.baseline, context.settings.source("baseline")
    if baseline is None:
        return
    if not baseline.usable_records:
        raise SettingError(f"{source}: {baseline.source}: no case of this suite recorded, nothing to compare with")
    difference = machine_difference(baseline, Run("this run", context.run_facts(), []))
    if difference:
        raise SettingError(
            f"{source}: {baseline.source} comes from another machine ({difference}); "
            "compare such runs afterwards with `python -m conformance compare --allow-different-machines`"
        )


def _node_setup(config: pytest.Config, settings: Settings, role: Role) -> NodeSetup | None:
    """A multi-node run's layout, checked here; the nodes are met when the session starts."""
    explicit = {name: getattr(settings, name) for name in NODE_LAYOUT}
    try:
        setup = node_setup(explicit, os.environ, settings.run_token, settings.unsigned)
    except LauncherError as exc:  # it names the variable; the settings given are not what is wrong
        raise SettingError(str(exc)) from None
    except NodeError as exc:
        sources = ", ".join(f"{settings.source(n)}" for n in NODE_LAYOUT if explicit[n] is not None)
        raise SettingError(f"{exc}" + (f" (from {sources})" if sources else "")) from None
    if not setup.multi_node or config.option.help or config.option.version:
        return None
    if role.spread:
        raise SettingError(
            f"{setup.nnodes} nodes (from {setup.source}): a multi-node run is one pytest process per node; "
            "drop -n/--dist (cross-node cases must run in the same order on every node)"
        )
    return setup
