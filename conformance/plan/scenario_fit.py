"""Whether a scenario's rules can fire in this run: the checks that need the run's topology and settings.

``load_scenario`` checks each rule on its own.  Here each value a rule selects on is checked against
what this run can have: a rank of its largest case, a device of its topology, a probe the ranks
know, a link class and a device-set kind the plan makes; and a slow step against the case limit.
A rule naming anything else would never fire, and the run would pass as if the fault had been
simulated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from conformance.discover.nvml_topology import ANCESTOR_LINKS
from conformance.discover.topology import CPU_LINK, UNKNOWN_LINK, Topology
from conformance.plan.matrix import NET_LINK, SET_KINDS
from conformance.rank.probes import PROBES
from conformance.rank.scenario import Rule, Scenario, ScenarioError

NVLINK_CLASS = re.compile(r"NV[1-9][0-9]*")  # NV<n>: n active NVLinks, as nvidia-smi topo -m names it
FIXED_LINK_CLASSES = (*dict.fromkeys(link for _, link in ANCESTOR_LINKS), CPU_LINK, NET_LINK, UNKNOWN_LINK)


@dataclass(frozen=True)
class RunBounds:
    """What a rule may name in this run."""

    world_size: int  # the ranks of the largest case: every device of every node
    nnodes: int
    devices: tuple[str, ...]
    topology_links: frozenset[str]  # a topology file may name classes beyond the fixed ones
    case_timeout: float
    case_timeout_source: str

    @classmethod
    def of(cls, topology: Topology, nnodes: int, case_timeout: float, case_timeout_source: str) -> RunBounds:
        names = tuple(device.name for device in topology.devices)
        links = frozenset(topology.links.values())
        return cls(len(names) * nnodes, nnodes, names, links, case_timeout, case_timeout_source)

    def is_link_class(self, name: str) -> bool:
        return name in FIXED_LINK_CLASSES or name in self.topology_links or NVLINK_CLASS.fullmatch(name) is not None


def check_scenario_fits(scenario: Scenario, bounds: RunBounds) -> None:
    """Refuse the first value a rule names that this run can never have, naming the file, the rule and the field."""
    for index, rule in enumerate(scenario.rules, start=1):
        problem = rule_problem(rule, bounds)
        if problem is not None:
            raise ScenarioError(f"{scenario.path} rule {index} {problem}")


def rule_problem(rule: Rule, bounds: RunBounds) -> str | None:
    """``"<field>: <why>"`` for the first value of the rule this run can never have, else None."""
    probes, kinds = f"the ranks know {', '.join(sorted(PROBES))}", f"the plan makes {', '.join(SET_KINDS)}"
    problems = (
        _rank_problem(rule.ranks or (), bounds),
        _unknown("devices", rule.devices, bounds.devices.__contains__, "no device", _devices_text(bounds)),
        _unknown("probes", rule.probes, PROBES.__contains__, "unknown probe", probes),
        _unknown("links", rule.links, bounds.is_link_class, "unknown link class", _links_text(bounds)),
        _unknown("sets", rule.sets, SET_KINDS.__contains__, "unknown device-set kind", kinds),
        _seconds_problem(rule, bounds),
    )
    return next((problem for problem in problems if problem is not None), None)


def _rank_problem(ranks: Iterable[int], bounds: RunBounds) -> str | None:
    outside = [rank for rank in ranks if rank >= bounds.world_size]
    if not outside:
        return None
    nodes = f" on {bounds.nnodes} nodes" if bounds.nnodes > 1 else ""
    return (
        f"ranks: rank {outside[0]} is outside every case of this run: the largest has {bounds.world_size} ranks "
        f"(0 to {bounds.world_size - 1}, one per device{nodes})"
    )


def _unknown(
    field: str, values: Iterable[str] | None, known: Callable[[str], bool], what: str, choices: str
) -> str | None:
    unknown = [value for value in values or () if not known(value)]
    return f"{field}: {what} {unknown[0]!r}; {choices}" if unknown else None


def _seconds_problem(rule: Rule, bounds: RunBounds) -> str | None:
    if rule.seconds < bounds.case_timeout:
        return None
    return (
        f"seconds: {rule.seconds:g} s is not shorter than the whole case may last (case-timeout "
        f"{bounds.case_timeout:g} s, {bounds.case_timeout_source}), so the sleep could never end; "
        'use effect = "hang" for a rank that never returns'
    )


def _devices_text(bounds: RunBounds) -> str:
    return f"this run's topology has {', '.join(bounds.devices)}"


def _links_text(bounds: RunBounds) -> str:
    extra = sorted(n for n in bounds.topology_links - set(FIXED_LINK_CLASSES) if not NVLINK_CLASS.fullmatch(n))
    return "link classes are NV<n>, " + ", ".join((*FIXED_LINK_CLASSES, *extra))
