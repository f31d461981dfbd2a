"""Text written by someone else reaches no terminal, report, drain reason or metrics file raw.

One function (conformance.common.outside_text.shown) escapes it; these tests feed each sink text
that would move the cursor, erase a line, set the title, write the clipboard (OSC 52) or reorder what
is read (bidi overrides), and check that every such character arrives as a visible escape.
"""

from __future__ import annotations

import re
from pathlib import Path
from xml.etree import ElementTree

import pytest

from conformance.cli.slurm_node import DrainReason
from conformance.common.outside_text import shown, shown_lines
from conformance.common.verdicts import Verdict
from conformance.record.records import CaseRecord, RunEnd, RunFacts
from conformance.record.runs import Run
from conformance.summarise.metrics import RunStatus, metrics_text
from conformance.summarise.report import render_report
from conftest import COLLECTIVE_TEST, scenario_text
from test_report import make_run, pcie_topology, record

EVIL = "ok\x1b]0;pwned\x07 \x1b]52;c;ZXZpbA==\x07 \x1b[2J\x1b[1A\rforged\x08 \u202etxt.exe \u2066x\u2069 \x85 \x9b"
# Any character that acts on a terminal, or reorders text, left raw: C0 but \t and \n, DEL, C1, bidi controls.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def test_shown_escapes_every_control_and_bidi_character() -> None:
    said = shown(EVIL)

    assert RAW.search(said) is None
    assert said == (
        "ok\\x1b]0;pwned\\x07 \\x1b]52;c;ZXZpbA==\\x07 \\x1b[2J\\x1b[1A\\x0dforged\\x08 \\u202etxt.exe \\u2066x\\u2069 "
        "\\x85 \\x9b"
    )


def test_shown_leaves_text_as_it_is() -> None:
    text = "NCCL WARN Cuda failure 'unknown error'\téàß 日本語 Ω\u00a0"
    assert shown(text) == text


def test_shown_lines_keeps_line_breaks_only() -> None:
    assert shown_lines("a\x1b[2K\nb\r\nc") == "a\\x1b[2K\nb\\x0d\nc"


def test_a_drain_reason_carries_no_control_character() -> None:
    reason = DrainReason.of(f"rank 3: {EVIL}").text

    assert RAW.search(reason) is None and "\\x1b]52" in reason


def test_a_metrics_label_value_carries_no_control_character() -> None:
    record = CaseRecord(nodeid=f"t.py::test_x[{EVIL}\nsecond line]", probe="all_reduce", verdict=Verdict.PASS)
    run = Run("by hand", RunFacts(run_id="r", end=RunEnd("complete")), [record])
    text = metrics_text(run, RunStatus(0.0, 1.0, 0), per_case=True)

    assert all(RAW.search(line) is None for line in text.splitlines())
    assert "\\\\x1b]52" in text and "\\nsecond line]" in text  # the exposition format's own escapes


def test_a_ranks_message_reaches_the_terminal_escaped(pytester: pytest.Pytester, run_suite) -> None:
    """A rank raises with a message that clears the screen and forges a line: pytest's output shows it escaped."""
    message = "".join(c if " " <= c < "\x7f" and c not in '"\\' else f"\\u{ord(c):04x}" for c in EVIL)  # TOML
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe="all_reduce"))
    scenario = pytester.makefile(".toml", scen=scenario_text(f'effect = "error"\nranks = [1]\nmessage = "{message}"'))

    junit = pytester.path / "junit.xml"
    result = run_suite(f"--scenario={scenario}", "--virtual-devices=2", "--step-timeout=30", f"--junitxml={junit}")

    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert RAW.search(output.replace("\n", "")) is None, [line for line in result.outlines if RAW.search(line)]
    assert "SimulatedError: ok\\x1b]0;pwned\\x07" in output
    written = junit.read_text(encoding="utf-8")
    ElementTree.fromstring(written)  # well-formed: XML 1.0 holds no control character
    assert RAW.search(written.replace("\n", "")) is None


def test_the_html_report_shows_outside_text_escaped() -> None:
    topology = pcie_topology(2)
    failed = record(topology, 0, 1, "pair_exchange", "inherited", "error", summary=f"rank 1 said {EVIL}")

    html = render_report(make_run(topology, [failed]), [])

    assert RAW.search(html.replace("\n", "")) is None
    assert "\\x1b]52;c;ZXZpbA==" in html


def test_an_nccl_config_file_s_value_reaches_the_header_escaped(pytester: pytest.Pytester, run_suite) -> None:
    """/etc/nccl.conf is someone else's text: a value that would rewrite the terminal shows as its escapes."""
    value = "".join(c if " " <= c < "\x7f" and c not in '"\\' else f"\\u{ord(c):04x}" for c in EVIL)  # TOML
    topology = Path(__file__).resolve().parent.parent / "conformance" / "scenarios" / "topologies" / "pcie-2gpu.json"
    pytester.makefile(
        ".toml", scen=f'[scenario]\nname = "x"\ntopology = "{topology}"\nnccl_conf = "NCCL_SOCKET_IFNAME={value}\\n"\n'
    )
    pytester.makepyfile(test_x="def test_nothing():\n    pass\n")
    result = run_suite(f"--scenario={pytester.path / 'scen.toml'}", "test_x.py")

    header = [line for line in result.outlines if line.startswith("conformance: NCCL config ")]
    assert header == [f"conformance: NCCL config /etc/nccl.conf: NCCL_SOCKET_IFNAME={shown(EVIL)}"], result.outlines
    assert all(RAW.search(line) is None for line in result.outlines)
