"""What the run writes on the terminal: its header before the tests, the answer and summary after them."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from conformance.common.families import inherited_variables
from conformance.common.outside_text import shown
from conformance.discover.nccl_config import CONF_FILE_VARIABLE
from conformance.discover.topology import link_matrix_lines, link_note_lines
from conformance.discover.versions import package_version
from conformance.harness.context import RunContext, user_timeout
from conformance.harness.strategy import config_left, config_overrides
from conformance.plan.transport import pair_paths
from conformance.settings import token_on_command_line
from conformance.summarise.answer import Answer, Tone
from conformance.summarise.bandwidth import floors_text
from conformance.summarise.collectives import collective_lines
from conformance.summarise.summary import (
    ladder_summary_lines,
    node_records,
    one_record_per_case,
    summary_lines,
    tally,
)

if TYPE_CHECKING:
    from _pytest.terminal import TerminalReporter

PREFIX = "conformance: "
# pytest's terminal writer drops the markup where pytest has no colour (no tty, --color=no, NO_COLOR).
TONE_MARKUP: dict[Tone, dict[str, bool]] = {
    "bad": {"red": True},
    "good": {"green": True},
    "warn": {"yellow": True},
    "plain": {},
}


class TerminalOutput:
    """A plugin object of its own: the header and the end of the run's terminal output."""

    def __init__(self, run: RunContext) -> None:
        self.run = run

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return [shown(PREFIX + line) for line in header_lines(self.run)]  # config files, variables: outside text

    def pytest_terminal_summary(self, terminalreporter: TerminalReporter) -> None:
        if not self.run.role.worker:
            write_summary(self.run, terminalreporter)


def header_lines(run: RunContext) -> list[str]:
    t = run.topology
    models = sorted({d.model for d in t.devices if d.model})
    devices = ", ".join(d.name for d in t.devices) + (f" ({', '.join(models)})" if models else "")
    lines = [
        f"run {run.run_id}, backend {run.backend}, {len(t.devices)} devices: {devices}",
        f"torch {package_version('torch') or 'not installed'}, NCCL {run.nccl.used or 'n/a'}, reports in {run.run_dir}",
    ]
    if run.nccl.warning:
        lines.append(f"WARNING {run.nccl.warning}")
    token_warning = token_on_command_line(run.settings)
    if token_warning:
        lines.append(f"WARNING {token_warning}")
    if t.note:
        lines.append(t.note)
    if t.driver or t.cuda_driver:
        lines.append(f"driver {t.driver or '?'}, CUDA driver {t.cuda_driver or '?'}")
    lines += t.platform.header_lines()
    lines += _inventory_lines(run)
    lines.extend(f"  {line}" for line in link_matrix_lines(t))
    lines.extend(link_note_lines(t))
    lines.append(f"matrix {run.plan.mode}, rungs: {', '.join(r.name for r in run.plan.rungs)}")
    limit = user_timeout(run.config)
    if limit is not None:
        lines.append(
            f"pytest-timeout --timeout {limit:g}: every case ends within it (its limit {run.settings.case_timeout:g}s, "
            f"then the stop ladder's {run.deadlines.stop_ladder.total:g}s)"
        )
    if t.kind == "gpu":
        lines.append(floors_text())
        lines += _transport_lines(run)
    inherited = inherited_variables()
    if inherited:
        lines.append("inherited " + " ".join(f"{k}={v}" for k, v in inherited.items()))
    lines += _nccl_config_lines(run)
    if run.scenario:
        lines.append(f"SIMULATED run, scenario {run.scenario.name!r} ({run.scenario.path})")
    return lines + _node_lines(run)


def _transport_lines(run: RunContext) -> list[str]:
    """The NICs NCCL may use, and the transport NCCL's rules predict per link class as the run starts."""
    t = run.topology
    lines = [
        f"NIC {nic.device} ({nic.rate_gbps:g} Gb/s, PCIe Gen{nic.pcie_gen or '?'} x{nic.pcie_width or '?'}): "
        + ", ".join(f"{gpu} {path}" for gpu, path in sorted(nic.paths.items()))
        for nic in t.nics
    ]
    predicted = run.nccl_host.summary(pair_paths(t, t.devices), len(t.devices), run.nccl_environ)
    if predicted:
        uses = ", ".join(f"{link} {transport}" for link, transport in predicted.items())
        lines.append(f"NCCL's transports as the run starts (its rules, predicted): {uses}")
    return lines


def _nccl_config_lines(run: RunContext) -> list[str]:
    """What NCCL's configuration files set, and how a rung that removes variables overrides them."""
    lines = run.nccl_config.header_lines(os.environ)
    for rung in run.plan.rungs:
        overrides = config_overrides(run, rung)  # what its cases set: the header says exactly that
        emptied = sorted(k for k in overrides if k != CONF_FILE_VARIABLE)
        given = [f"{CONF_FILE_VARIABLE}={overrides[CONF_FILE_VARIABLE]}"] if CONF_FILE_VARIABLE in overrides else []
        if emptied:
            lines.append(
                f"rung {rung.name}: {' and '.join([*given, ', '.join(f'{k}=' for k in emptied)])} (empty: NCCL reads "
                "an empty value as unset, and reads /etc/nccl.conf whatever NCCL_CONF_FILE says)"
            )
        elif given:
            lines.append(f"rung {rung.name}: {given[0]} (NCCL then reads no file of the user's, only /etc/nccl.conf)")
        left = config_left(run, rung)
        if left:
            lines.append(
                f"rung {rung.name} cannot remove {', '.join(left)}: NCCL takes an empty value of it as a value, "
                "and reads the file whatever the environment says; edit the file to test without it"
            )
    return lines


def _inventory_lines(run: RunContext) -> list[str]:
    """The machine's GPUs counted on the PCI bus and by NVML, beside those this run tests."""
    inventory, expected = run.topology.inventory, run.settings.expect_gpus
    if not (inventory.nvidia_present or inventory.nvml_gpus or expected):
        return []
    tested = sum(d.kind == "gpu" for d in run.topology.devices)
    wanted = f", {expected} expected" if expected else ""
    return [f"GPUs: {inventory.counts_text()}, {tested} tested{wanted}"]


def _node_lines(run: RunContext) -> list[str]:
    if run.nodes is None or run.start is None:
        return []
    setup, start = run.nodes.setup, run.start
    lines = [
        f"node {setup.node_rank} of {setup.nnodes} (layout from {setup.source}), "
        f"run store on {setup.master_addr}:{setup.master_port}; shared interfaces: "
        f"{', '.join(start.interfaces) or 'none'}"
    ]
    identity = setup.identity or "none (by hand: the run token tells this run from another)"
    pairing = run.plan.pairing
    first = "every pair in rounds" if pairing.mode == "all" else "one random round, then re-checks"
    lines.append(f"run identity {identity}; node pairs {pairing.mode} ({first})")
    lines += list(start.missing.values())
    if start.check is not None and start.check.differing:
        lines.append(f"the nodes differ where they may ({', '.join(start.check.differing)}):")
        lines += [f"  {row}" for row in start.check.table]
    return lines


def write_summary(run: RunContext, write: TerminalReporter) -> None:
    """How far the run got, the nodes' notes, the cases and the ladder (the answer comes last of all)."""
    simulated = " (SIMULATED)" if run.simulated else ""
    outcome = run.outcome
    if outcome.end is not None and outcome.end.incomplete:
        line = f"{PREFIX}INCOMPLETE RUN ({outcome.end.incomplete}): what follows covers only what ran"
        write.write_line(shown(line), yellow=True, bold=True)
    records = one_record_per_case(run.folder.own_records())
    if records or outcome.node_notes:
        write.write_sep("=", f"conformance summary{simulated}")
    for line in outcome.node_notes:
        write.write_line(shown(PREFIX + line))
    if records:
        for text, bad in summary_lines(records):
            write.write_line(shown(text), red=bad)
        for line in ladder_summary_lines(records, run.plan.ladder, run.deadlines.step_deadline):
            write.write_line(shown(line))
        for line in collective_lines(records):
            write.write_line(shown(line))
    for line in outcome.conclusion.lines:
        write.write_line(shown(line))


def write_answer(run: RunContext, write: TerminalReporter, answer: Answer | None) -> None:
    """The tests in the suite's words, then the answer: red where something failed, green where all passed.

    Last of all (``harness.ending``): after pytest's own summary and its count line, so a run's last
    screen starts with it.
    """
    for line in run.outcome.notes:
        write.write_line(shown(line))
    written = run.folder.own_records() if run.folder.facts_file.exists() else []
    counted = tally(
        node_records(written, run.node_rank), run.outcome.end, run.node_rank if run.nodes is not None else None
    )
    if counted is not None:
        write.write_line(counted.text())
    simulated = " (SIMULATED)" if run.simulated else ""
    if answer is None and run.outcome.unwritten:  # nothing recorded to answer from, and files lost: said all the same
        write.write_sep("=", f"conformance: the answer{simulated}", **TONE_MARKUP["bad"], bold=True)
        for line in run.outcome.unwritten:
            write.write_line(shown(line), **TONE_MARKUP["bad"], bold=True)
        return
    if answer is None:
        return
    write.write_sep("=", f"conformance: the answer{simulated}", **TONE_MARKUP[answer.tone], bold=True)
    for text, tone in answer.rows():
        write.write_line(shown(text), **TONE_MARKUP[tone], bold=tone != "plain")
