"""Simulated faults: a TOML scenario of rules applied inside real ranks.

    [scenario]
    name = "one rank hangs"
    description = "what real failure this reproduces"
    topology = "machine.json"  # optional: the simulated machine (relative to this file)
    nccl_conf = "NCCL_P2P_LEVEL=LOC"  # optional: the simulated image's /etc/nccl.conf (discover/nccl_config.py)

    [[rule]]
    effect = "hang"            # hang | device_hang | crash | error | wrong_data | oom | slow | slow_link
    phase = "probe"            # start | control | init | probe | verify | teardown
    ranks = [1]                # optional: only these ranks
    devices = ["cpu1"]         # optional: only ranks bound to these devices
    probes = ["all_reduce"]    # optional: only these probes
    links = ["SYS"]            # optional: only cases whose devices are joined by one of these classes
    sets = ["last_half"]       # optional: only these device-set kinds (all, single, pair, last_half, ...)
    wrong_barrier_device = true  # optional: only while torch's barrier is about to run on another
                               #   GPU than the rank's own (barrier_device.py has torch's rule)
    p2p = true                 # optional: only when NCCL would (true) / would not (false) use P2P over
                               #   those links under the case's environment, by NCCL's own rule
                               #   (plan/transport.py: default level PXB, SYS on AMD with <= 2 GPUs;
                               #   NVML's P2P status; NCCL_P2P_DISABLE and NCCL_P2P_LEVEL)
    net = true                 # optional: only when NCCL would (true) / would not (false) send traffic between
                               #   GPUs of the node over the network over those links (plan/net_path.py:
                               #   ncclTopoCheckNet, a NIC faster than the GPUs' own path)
    refused = true             # optional: only when NCCL's own rule refuses a pair of the case: P2P
                               #   disabled in NVML between NVLink-connected GPUs (plan/transport.py,
                               #   NCCL's graph/paths.cc), under the case's environment
    when_env = { NCCL_P2P_DISABLE = "0" }    # optional: only when every variable has this value
    unless_env = { NCCL_P2P_DISABLE = "1" }  # optional: not when every variable has this value
    ignore_sigterm = true      # hang only
    signal = "SIGSEGV"         # crash only
    message = "text"           # error and oom
    seconds = 5                # slow only: sleeps this long at every entry into the phase
    fraction = 0.3             # slow_link only: the pair's simulated bandwidth is this fraction of its
                               #   link's physical rate (a healthy pair's is 0.8 of it)

Every value is checked before any case starts: here on its own, and in ``plan/scenario_fit.py``
against the run (its ranks, devices, probes, link classes, device-set kinds and case limit), so
a rule that could never fire is refused rather than passing as if its fault had been simulated.

A rule's ``env`` conditions are checked in the rank, against the environment the case gave it.
``slow_link`` changes no rank: a simulated machine's bandwidth is not gloo's (host memory copies)
but its pairs' physical link rates (``discover/link_rate.py``) times 0.8, or times ``fraction``
for the pairs it selects by devices, links, probes and sets (``summarise/bandwidth.py`` judges it).
``hang`` blocks the rank on the host where the phase begins; ``device_hang`` is a kernel that never
finishes: the host call returns at once (as NCCL's do) and the rank blocks at the step's next
device synchronize, which is how a real GPU hang looks.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conformance.common.bounded_parse import NotParsed, toml_table
from conformance.common.inputs import NotReadable, absolute, read_user_file
from conformance.common.jsonl import JsonDict
from conformance.common.suite import scenario_path, shipped_scenarios

PHASES = ("start", "control", "init", "probe", "verify", "teardown")
EFFECTS = ("hang", "device_hang", "crash", "error", "wrong_data", "oom", "slow", "slow_link")
ONLY_PHASE = {"wrong_data": "verify", "device_hang": "probe"}  # effects tied to one phase
EFFECT_FIELDS = {
    "hang": {"ignore_sigterm"},
    "device_hang": set(),
    "crash": {"signal"},
    "error": {"message"},
    "oom": {"message"},
    "slow": {"seconds"},
    "wrong_data": set(),
    "slow_link": {"fraction"},
}
# slow_link is read in the parent, where no rank's environment or barrier exists: it selects by these only
PARENT_SIDE_FILTERS = {"devices", "links", "probes", "sets"}
COMMON_FIELDS = {
    "effect", "phase", "ranks", "devices", "probes", "links", "sets", "p2p", "net", "refused", "wrong_barrier_device",
    "when_env", "unless_env",
}  # fmt: skip
ALL_EFFECT_FIELDS = set().union(*EFFECT_FIELDS.values())


class ScenarioError(ValueError):
    """The scenario file is unusable; the message names the file and the rule."""


@dataclass(frozen=True)
class Placement:
    """Where a rank stands: what a rule's filters are matched against."""

    rank: int
    device: str
    probe: str
    set_kind: str = "all"
    links: tuple[str, ...] = ()
    p2p_links: tuple[str, ...] = ()  # the links NCCL would use P2P over (the parent predicts it: transport.py)
    net_links: tuple[str, ...] = ()  # the links NCCL would send over the network inside the node (net_path.py)
    wrong_barrier_device: bool | None = None  # known only while a barrier probe is about to run one
    refused: bool = False  # NCCL's own rule refuses a pair of the case (the parent predicts it: transport.py)


@dataclass(frozen=True)
class Rule:
    effect: str
    phase: str
    ranks: tuple[int, ...] | None = None
    devices: tuple[str, ...] | None = None
    probes: tuple[str, ...] | None = None
    links: tuple[str, ...] | None = None
    sets: tuple[str, ...] | None = None
    p2p: bool | None = None
    net: bool | None = None
    wrong_barrier_device: bool | None = None
    refused: bool | None = None
    when_env: Mapping[str, str] = field(default_factory=dict)
    unless_env: Mapping[str, str] = field(default_factory=dict)
    ignore_sigterm: bool = False
    signal: str = "SIGSEGV"
    message: str = "simulated failure"
    seconds: float = 0.0
    fraction: float = 1.0

    def applies(self, where: Placement, phase: str, environ: Mapping[str, str]) -> bool:
        if phase != self.phase or not self._selects(where):
            return False
        for wanted, used in ((self.p2p, where.p2p_links), (self.net, where.net_links)):
            if wanted is not None:
                links = [link for link in where.links if self.links is None or link in self.links]
                if not links or any(link in used for link in links) != wanted:
                    return False
        if self.wrong_barrier_device is not None and where.wrong_barrier_device != self.wrong_barrier_device:
            return False
        if self.refused is not None and where.refused != self.refused:
            return False
        if any(environ.get(k) != v for k, v in self.when_env.items()):
            return False
        return not (self.unless_env and all(environ.get(k) == v for k, v in self.unless_env.items()))

    def _selects(self, where: Placement) -> bool:
        checks = (
            (self.ranks, where.rank),
            (self.devices, where.device),
            (self.probes, where.probe),
            (self.sets, where.set_kind),
        )
        if any(allowed is not None and value not in allowed for allowed, value in checks):
            return False
        return self.links is None or any(link in self.links for link in where.links)

    def to_dict(self) -> JsonDict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rule:
        values = dict(data)
        for key in ("ranks", "devices", "probes", "links", "sets"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        return cls(**values)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    path: str
    rules: tuple[Rule, ...]
    topology: Path | None = None
    nccl_conf: str | None = None  # the simulated image's /etc/nccl.conf; this host's files are not read


def _string_list(value: Any, where: str, item_type: type) -> tuple[Any, ...]:
    if not isinstance(value, list) or not all(isinstance(v, item_type) and not isinstance(v, bool) for v in value):
        raise ScenarioError(f"{where}: expected a list of {item_type.__name__}, got {value!r}")
    if not value:
        raise ScenarioError(
            f"{where}: an empty list matches nothing, so the rule could never fire (leave the field out to match any)"
        )
    return tuple(value)


def _rank_list(value: Any, where: str) -> tuple[int, ...]:
    ranks: tuple[int, ...] = _string_list(value, where, int)
    negative = [rank for rank in ranks if rank < 0]
    if negative:
        raise ScenarioError(f"{where}: rank {negative[0]} is negative; ranks count from 0")
    return ranks


def _optional_bool(raw: Mapping[str, Any], key: str, where: str) -> bool | None:
    if key not in raw:
        return None
    if not isinstance(raw[key], bool):
        raise ScenarioError(f"{where}: {key} must be true or false, got {raw[key]!r}")
    return bool(raw[key])


def _env_table(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ScenarioError(f'{where}: expected a table of VARIABLE = "value" strings, got {value!r}')
    return dict(value)


def _check_effect_fields(raw: Mapping[str, Any], effect: str, where: str) -> None:
    for key in raw:
        if key not in COMMON_FIELDS and key not in ALL_EFFECT_FIELDS:
            known = ", ".join(sorted(COMMON_FIELDS | ALL_EFFECT_FIELDS))
            raise ScenarioError(f"{where}: unknown field {key!r} (known fields: {known})")
        if key in ALL_EFFECT_FIELDS and key not in EFFECT_FIELDS[effect]:
            raise ScenarioError(f"{where}: field {key!r} does not apply to effect {effect!r}")


def _effect_options(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if "ignore_sigterm" in raw:
        if not isinstance(raw["ignore_sigterm"], bool):
            raise ScenarioError(f"{where}: ignore_sigterm must be true or false")
        options["ignore_sigterm"] = raw["ignore_sigterm"]
    if "signal" in raw:
        if not isinstance(raw["signal"], str):
            raise ScenarioError(f"{where}: signal must be a name such as 'SIGSEGV', got {raw['signal']!r}")
        name = raw["signal"].upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if not isinstance(getattr(signal, name, None), signal.Signals):
            raise ScenarioError(f"{where}: unknown signal {raw['signal']!r}")
        options["signal"] = name
    if "message" in raw:
        if not isinstance(raw["message"], str):
            raise ScenarioError(f"{where}: message must be a string")
        options["message"] = raw["message"]
    if "seconds" in raw:
        seconds = raw["seconds"]
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < math.inf:
            raise ScenarioError(f"{where}: seconds must be a finite, non-negative number, got {seconds!r}")
        options["seconds"] = float(seconds)
    return options


def _check_slow_link(raw: Mapping[str, Any], where: str) -> None:
    extra = sorted(set(raw) & (COMMON_FIELDS - PARENT_SIDE_FILTERS - {"effect", "phase"}))
    if extra:
        raise ScenarioError(
            f"{where}: slow_link selects pairs by devices, links, probes and sets only, not {extra[0]!r}"
        )
    fraction = raw.get("fraction")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ScenarioError(f"{where}: slow_link needs fraction, a number above 0 and at most 1, got {fraction!r}")


def parse_rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: a rule must be a table")
    if "effect" not in raw:
        raise ScenarioError(f"{where}: effect is missing; choose one of {', '.join(EFFECTS)}")
    effect = raw["effect"]
    if effect not in EFFECTS:
        raise ScenarioError(f"{where}: unknown effect {effect!r}; choose one of {', '.join(EFFECTS)}")
    _check_effect_fields(raw, effect, where)
    if effect == "slow_link":
        _check_slow_link(raw, where)
    phase = raw.get("phase", ONLY_PHASE.get(effect, "probe"))
    if phase not in PHASES:
        raise ScenarioError(f"{where}: unknown phase {phase!r}; choose one of {', '.join(PHASES)}")
    if effect in ONLY_PHASE and phase != ONLY_PHASE[effect]:
        raise ScenarioError(f"{where}: {effect} happens in phase {ONLY_PHASE[effect]!r} only, not {phase!r}")
    return Rule(
        effect=effect,
        phase=phase,
        ranks=_rank_list(raw["ranks"], f"{where} ranks") if "ranks" in raw else None,
        devices=_string_list(raw["devices"], f"{where} devices", str) if "devices" in raw else None,
        probes=_string_list(raw["probes"], f"{where} probes", str) if "probes" in raw else None,
        links=_string_list(raw["links"], f"{where} links", str) if "links" in raw else None,
        sets=_string_list(raw["sets"], f"{where} sets", str) if "sets" in raw else None,
        p2p=_optional_bool(raw, "p2p", where),
        net=_optional_bool(raw, "net", where),
        wrong_barrier_device=_optional_bool(raw, "wrong_barrier_device", where),
        refused=_optional_bool(raw, "refused", where),
        when_env=_env_table(raw.get("when_env", {}), f"{where} when_env"),
        unless_env=_env_table(raw.get("unless_env", {}), f"{where} unless_env"),
        fraction=float(raw.get("fraction", 1.0)),
        **_effect_options(raw, where),
    )


def load_scenario(path: Path, where: str) -> Scenario:
    """Read and validate a scenario file, or a shipped one by name; ``where`` names the setting that pointed at it."""
    path = scenario_path(path)
    data = _scenario_table(path, where)
    unknown = set(data) - {"scenario", "rule"}
    if unknown:
        raise ScenarioError(f"{path}: unknown top-level key(s) {sorted(unknown)}; expected [scenario] and [[rule]]")
    header = data.get("scenario", {})
    if not isinstance(header, dict) or set(header) - {"name", "description", "topology", "nccl_conf"}:
        raise ScenarioError(f"{path}: [scenario] takes only name, description, topology and nccl_conf")
    for key in ("name", "description", "nccl_conf"):
        if not isinstance(header.get(key, ""), str):
            raise ScenarioError(f"{path}: [scenario] {key} must be a string, got {header[key]!r}")
    topology = header.get("topology")
    if topology is not None and not isinstance(topology, str):
        raise ScenarioError(f"{path}: [scenario] topology must be a file name")
    rules_raw = data.get("rule", [])
    if not isinstance(rules_raw, list) or not (rules_raw or topology):
        # a machine's own faults (NVML failing, a GPU gone, a link down) are its topology's: no rule needed
        raise ScenarioError(f"{path}: no [[rule]] tables; a scenario needs at least one rule or a topology")
    rules = tuple(parse_rule(raw, f"{path} rule {i + 1}") for i, raw in enumerate(rules_raw))
    return Scenario(
        name=str(header.get("name", path.stem)),
        description=str(header.get("description", "")),
        path=str(path),
        rules=rules,
        topology=_topology_path(path, topology) if topology else None,
        nccl_conf=header.get("nccl_conf"),
    )


def _scenario_table(path: Path, where: str) -> dict[str, Any]:
    """The scenario file's TOML; ScenarioError naming the setting and the file when it cannot be read."""
    try:
        text = read_user_file(path, "scenario file", where, ScenarioError)
    except ScenarioError as exc:
        if path.exists():
            raise
        raise ScenarioError(f"{exc} (nor is it a shipped scenario: {', '.join(shipped_scenarios())})") from None
    try:
        return toml_table(text)
    except NotParsed as exc:
        raise ScenarioError(f"{where}: scenario file {str(path)!r} is {exc}") from None


def _topology_path(path: Path, topology: str) -> Path:
    """The topology file a scenario names, beside the scenario file."""
    try:
        return absolute(path.parent / topology)
    except NotReadable as exc:
        raise ScenarioError(f"{path}: [scenario] topology {topology!r} {exc}") from None
