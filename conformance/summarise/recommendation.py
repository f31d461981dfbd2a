"""A recommendation: what to set per topology class and overall, as lines, export lines and JSON.

``conformance.summarise.recommend`` works it out from a run; ``conformance.summarise.env_file``
writes it as ``recommended.env``.  The export lines are shell text (``common/shell_text.py``: each
value quoted for a POSIX shell); the lines are for the terminal, which escapes them itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from conformance.common.shell_text import export_line
from conformance.discover.nccl_config import (
    CONF_FILE_VARIABLE,
    EMPTY_IS_A_VALUE,
    NO_FILE,
    ConfigValue,
    NcclConfig,
    neutralised,
    user_files,
)
from conformance.plan.matrix import Rung
from conformance.record.records import HarnessError, JsonObject
from conformance.summarise.summary import rung_env_text

UNFIT_REASON = (
    "framework copies (tensor.to between GPUs, cudaMemcpyPeer) are affected too, whatever NCCL is told; "
    "no environment makes this machine safe: fix it (IOMMU/ACS, driver, hardware) and run the suite again"
)


@dataclass(frozen=True)
class FigureCost:
    """One bandwidth figure on the class's rung against the best passing rung that measured it."""

    figure: str  # "pair_exchange" (bandwidth_gbps) or "all_reduce busbw 1MiB" (metrics.busbw_gbps)
    gbps: float
    best_gbps: float
    best_rung: str

    @property
    def cost_percent(self) -> float:
        if self.best_gbps <= 0:
            return 0.0
        return round(max(0.0, (self.best_gbps - self.gbps) / self.best_gbps * 100), 1)

    def to_json(self) -> JsonObject:
        return {
            "figure": self.figure,
            "gbps": self.gbps,
            "best_gbps": self.best_gbps,
            "best_rung": self.best_rung,
            "cost_percent": self.cost_percent,
        }


@dataclass(frozen=True)
class BandwidthCost:
    """What a class's rung costs against its best passing rung; ``reason`` when not measured."""

    rung: str
    comparisons: tuple[FigureCost, ...] = ()
    reason: str = ""

    @property
    def worst(self) -> FigureCost | None:
        if not self.comparisons:
            return None
        return max(self.comparisons, key=lambda c: (c.cost_percent, c.figure))

    def text(self) -> str:
        worst = self.worst
        if worst is None:
            return f"not measured ({self.reason})"
        if worst.cost_percent == 0:
            return f"no cost: {self.rung} is the fastest passing rung ({worst.figure}: {worst.gbps:.2f} GB/s)"
        return (
            f"costs {worst.cost_percent:.1f}% against {worst.best_rung} "
            f"({worst.figure}: {worst.gbps:.2f} vs {worst.best_gbps:.2f} GB/s)"
        )

    def to_json(self) -> JsonObject:
        worst = self.worst
        return {
            "measured": worst is not None,
            "cost_percent": worst.cost_percent if worst else None,
            "reason": self.reason or None,
            "text": self.text(),
            "comparisons": [c.to_json() for c in self.comparisons],
        }


@dataclass(frozen=True)
class ClassAdvice:
    """One topology class: its first passing rung, or the cases no rung fixed."""

    name: str
    rung: Rung | None
    bandwidth: BandwidthCost | None = None
    failing: tuple[tuple[str, str], ...] = ()  # (nodeid, verdict) of the cases that never passed
    tried: tuple[str, ...] = ()  # the rungs the class's failing cases ran on, in ladder order
    not_passing_on_rung: tuple[tuple[str, str], ...] = ()  # cases that passed earlier but not on the rung

    def line(self) -> str:
        if self.rung is None:
            tried = ", ".join(self.tried)
            return f"{self.name}: no rung passed (tried {tried}): no environment fixes it; failing cases:"
        bandwidth = self.bandwidth.text() if self.bandwidth else "not measured"
        return f"{self.name}: {self.rung.name}: {rung_env_text(self.rung)}; bandwidth cost: {bandwidth}"

    def to_json(self) -> JsonObject:
        rung = self.rung
        return {
            "rung": rung.name if rung else None,
            "set": dict(rung.set) if rung else {},
            "unset_families": list(rung.unset_families) if rung else [],
            "env_text": rung_env_text(rung) if rung else None,
            "bandwidth": self.bandwidth.to_json() if self.bandwidth else None,
            "failing": [{"nodeid": n, "verdict": v} for n, v in self.failing],
            "tried": list(self.tried),
            "not_passing_on_rung": [{"nodeid": n, "verdict": v} for n, v in self.not_passing_on_rung],
        }


@dataclass(frozen=True)
class Conflict:
    """One variable two classes' rungs set differently; the later rung in ladder order wins."""

    variable: str
    chosen: str
    chosen_rung: str
    wanted: tuple[tuple[str, str, str], ...]  # (value, rung, class) per class that sets it

    def text(self) -> str:
        wants = ", ".join(f"{value} for {cls} ({rung})" for value, rung, cls in self.wanted)
        return f"conflict: {self.variable} is {wants}; using {self.chosen} from {self.chosen_rung}, the later rung"

    def to_json(self) -> JsonObject:
        return {
            "variable": self.variable,
            "chosen": self.chosen,
            "chosen_rung": self.chosen_rung,
            "wanted": [{"value": v, "rung": r, "class": c} for v, r, c in self.wanted],
        }


@dataclass(frozen=True)
class WrongData:
    """A case that delivered wrong data (verdict ``fail``), on whichever rung."""

    nodeid: str
    link_class: str
    rung: str | None
    summary: str

    def to_json(self) -> JsonObject:
        return {"nodeid": self.nodeid, "class": self.link_class, "rung": self.rung, "summary": self.summary}


@dataclass
class Recommendation:
    """What to set, per class and overall; ``unfit`` when any case delivered wrong data."""

    run_id: str | None
    source: str
    simulated: bool
    unfit: bool
    classes: list[ClassAdvice] = field(default_factory=list)
    wrong_data: list[WrongData] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    unset_families: tuple[str, ...] = ()
    conflicts: list[Conflict] = field(default_factory=list)
    needed_by: dict[str, list[str]] = field(default_factory=dict)  # "VAR=VALUE" or the unset text -> classes
    inherited_env: dict[str, str] = field(default_factory=dict)
    incomplete: str | None = None  # the run did not cover its plan: no recommendation (RunFacts.incomplete)
    harness_errors: tuple[HarnessError, ...] = ()  # failed tests no record explains: no recommendation
    cpu_only: str | None = None  # why no GPU was tested (a run of CPU ranks that is no simulation)
    config: NcclConfig = field(default_factory=NcclConfig)  # NCCL's configuration files, as the run read them

    # -- derived ---------------------------------------------------------------------------
    @property
    def withheld(self) -> bool:
        """No environment is handed out: wrong data (unfit), a run that did not cover its plan, harness errors."""
        return self.unfit or self.incomplete is not None or bool(self.harness_errors)

    @property
    def from_config(self) -> dict[str, ConfigValue]:
        """What the unset removes that NCCL's configuration files set: ``unset`` cannot reach a file."""
        unset = self.unset_families
        return {k: v for k, v in sorted(self.config.values.items()) if unset and k.startswith(unset)}

    @property
    def config_kept_out(self) -> frozenset[str]:
        """The user's files ``NCCL_CONF_FILE=/dev/null`` keeps out, where the unset removes NCCL_CONF_FILE too."""
        unset = self.unset_families
        return user_files(self.config) if unset and CONF_FILE_VARIABLE.startswith(unset) else frozenset()

    def config_exports(self) -> dict[str, str]:
        """What keeps the files' values out as the passing rung's cases kept them out (harness/strategy.py)."""
        kept_out = self.config_kept_out
        given = {CONF_FILE_VARIABLE: NO_FILE} if kept_out else {}
        return {**given, **neutralised(list(self.from_config), self.config, {}, kept_out)}

    @property
    def fixed(self) -> list[ClassAdvice]:
        return [c for c in self.classes if c.rung is not None]

    @property
    def unfixed(self) -> list[str]:
        return [c.name for c in self.classes if c.rung is None]

    @property
    def serves_every_class(self) -> bool:
        """One rung's setting is what every class that some rung fixed needs."""
        return len({_setting(c.rung) for c in self.fixed if c.rung is not None}) == 1

    @property
    def broader(self) -> list[tuple[str, str]]:
        """(class, its own rung) of the classes the overall environment gives more than they need."""
        overall = (tuple(sorted(self.env.items())), self.unset_families)
        return [(c.name, c.rung.name) for c in self.fixed if c.rung is not None and _setting(c.rung) != overall]

    def exports(self) -> list[str]:
        """The environment as shell lines; empty when nothing needs setting (or unfit, or incomplete)."""
        if self.withheld:
            return []
        lines = [rung_env_text(Rung("overall", unset_families=self.unset_families))] if self.unset_families else []
        lines += [export_line(k, v) for k, v in self.config_exports().items()]
        return lines + [export_line(k, v) for k, v in sorted(self.env.items())]

    # -- text --------------------------------------------------------------------------------
    def lines(self) -> list[str]:
        lines = ["SIMULATED run: this is for the simulated machine, not this host"] if self.simulated else []
        if self.harness_errors:
            lines.append(self.harness_line())
        if self.unfit:
            return lines + self._unfit_lines()
        if self.incomplete:
            return lines + [self.incomplete_line()]
        if self.harness_errors:
            return lines
        if not self.classes:
            return lines + ["nothing to recommend: no case ran that can be used (all skipped or negative controls)"]
        lines.append("per topology class, the first rung on which every case of the class passed:")
        for advice in self.classes:
            lines.append(f"  {advice.line()}")
            lines += [f"    {verdict.upper()} {nodeid}" for nodeid, verdict in advice.failing]
            if advice.not_passing_on_rung:
                lines.append(f"    caution: on {advice.rung.name if advice.rung else '?'} these did not pass:")
                lines += [f"      {verdict.upper()} {nodeid}" for nodeid, verdict in advice.not_passing_on_rung]
        lines += self._overall_lines()
        return lines

    def harness_line(self) -> str:
        # A test that failed without a verdict may be the case that would have changed a class's rung.
        tests = "; ".join(e.text for e in self.harness_errors)
        return (
            f"no recommendation: {len(self.harness_errors)} test(s) failed without a verdict on the machine "
            f"(harness errors): {tests}; fix what failed them and run the suite again"
        )

    def incomplete_line(self) -> str:
        # A class whose leader passed may still hang on a pair that never ran: advice would be a guess.
        return (
            f"no recommendation: the run is incomplete ({self.incomplete}); "
            "a rung can only be chosen from every case of its class: run the whole suite"
        )

    def _unfit_lines(self) -> list[str]:
        count = len(self.wrong_data)
        lines = [
            f"NOT FIT FOR TRAINING: wrong data (verdict fail) in {count} case{'' if count == 1 else 's'}; "
            f"{UNFIT_REASON}:"
        ]
        for case in self.wrong_data:
            lines.append(f"  FAIL {case.nodeid} ({case.link_class}, rung {case.rung}): {case.summary}")
        return lines

    def _overall_lines(self) -> list[str]:
        fixed = self.fixed
        unfixed = ", ".join(self.unfixed)
        if not fixed:
            return [f"no environment fixes any class ({unfixed}); see the failing cases above"]
        scope = f"every class an environment fixes (not {unfixed})" if unfixed else "every class"
        if not self.env and not self.unset_families:
            return [f"nothing needs setting: {scope} passed with the environment as it is", *self.inherited_note()]
        if self.serves_every_class:
            lines = [f"one setting serves {scope}:"]
        elif self.conflicts:
            lines = ["classes need conflicting settings:", *(f"  {c.text()}" for c in self.conflicts)]
        else:
            lines = [f"classes need different settings; they do not conflict, so their union serves {scope}:"]
        if not self.serves_every_class:
            lines += [f"  {what}: needed by {', '.join(classes)}" for what, classes in self.needed_by.items()]
            broader = ", ".join(f"{cls} (needs {rung})" for cls, rung in self.broader)
            lines.append(f"  would then run on a broader setting than they need: {broader}")
        lines += [f"  {line}" for line in self.exports()]
        return lines + self.config_note() + self.inherited_note()

    def config_note(self) -> list[str]:
        return [self._config_line(k, v) for k, v in self.from_config.items()]

    def _config_line(self, name: str, value: ConfigValue) -> str:
        said = f"note: {name}={value.value} is set in {value.file}"
        if value.file in self.config_kept_out:
            return f"{said}: {CONF_FILE_VARIABLE}={NO_FILE} keeps that file out"
        if name in EMPTY_IS_A_VALUE:
            return (
                f"{said}, which NCCL reads whatever the environment says, and it takes an empty {name} as a value: "
                f"no environment removes it; remove it there"
            )
        return (
            f"{said}: unset cannot remove it (NCCL reads the file again); remove it there, or give it an empty "
            "value, which NCCL reads as unset"
        )

    def inherited_note(self) -> list[str]:
        unset = self.unset_families
        kept = {k: v for k, v in self.inherited_env.items() if not (unset and k.startswith(unset))}
        if not kept:
            return []
        return [
            f"note: every rung ran on top of what the run inherited: {' '.join(f'{k}={v}' for k, v in kept.items())}"
        ]

    # -- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> JsonObject:
        return {
            "run_id": self.run_id,
            "source": self.source,
            "simulated": self.simulated,
            "unfit": self.unfit,
            "incomplete": self.incomplete,
            "harness_errors": [asdict(e) for e in self.harness_errors],
            "wrong_data": [case.to_json() for case in self.wrong_data],
            "classes": {c.name: c.to_json() for c in self.classes},
            "unfixed": self.unfixed,
            "env": {} if self.withheld else dict(sorted(self.env.items())),
            "unset_families": [] if self.withheld else list(self.unset_families),
            "serves_every_class": bool(self.fixed) and self.serves_every_class,
            "conflicts": [c.to_json() for c in self.conflicts],
            "needed_by": self.needed_by,
            "broader": [{"class": cls, "needs": rung} for cls, rung in self.broader],
            "exports": self.exports(),
            "inherited_env": self.inherited_env,
            "lines": self.lines(),
        }


def _setting(rung: Rung) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    return tuple(sorted(rung.set.items())), tuple(rung.unset_families)
