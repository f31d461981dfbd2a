"""Every sink escapes outside text for itself, at one place per sink (issue 51, item 4).

The sinks: the terminal (``common/outside_text.py`` ``shown``; the commands' ``cli.common.say``),
JUnit XML (``common/xml_text.py``: ``junit_text`` and the one writer ``write_junit``), shell text
(``common/shell_text.py``: ``recommended.env`` and the export lines), the HTML report (Jinja2's
autoescape after ``shown_lines``), Prometheus' text format (``metrics.Family.add``, then
``prometheus_client``'s own escaping).  SLURM drain reasons are ``cli/slurm_health.py``'s.

One run of the suite on a simulated machine whose host name, inherited variables (names and
values), NCCL configuration file (names and values), scenario (name, description) and ranks'
messages all carry :data:`hostile.HOSTILE` feeds every sink at once; each sink's output is then
checked in its own format.  Unit tests drive each escape with the same string through every outside
text that reaches it, and greps prove that every writer of a sink goes through its one place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from xml.etree import ElementTree

import pytest
import xmlschema
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from conformance.cli.main import main
from conformance.common.outside_text import shown_lines
from conformance.record.runs import load_run
from conformance.summarise.answer import answer
from conformance.summarise.env_file import ENV_FILE, write_env_file
from conformance.summarise.metrics import RunStatus, metrics_text
from conformance.summarise.recommend import recommend
from conformance.summarise.report import render_report
from hostile import (
    CONFIG_NAME,
    HOSTILE,
    IN_ENVIRONMENT,
    NEWLINES,
    NUL,
    PWNED,
    SETTABLE,
    SURROGATE,
    carried,
    hostile_run_folder,
    toml_string,
)
from test_report import parse

RunSuite = Callable[..., pytest.RunResult]
SCHEMA = Path(__file__).with_name("junit-10.xsd")
# Any character that acts on a terminal, or reorders text, left raw: C0 but \t and \n, DEL, C1, bidi controls,
# line and paragraph separators, surrogates.
RAW_ON_TERMINAL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]"
)
PACKAGE = Path(__file__).resolve().parent.parent / "conformance"
NOT_XML_CHAR = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")  # XML 1.0 §2.2 Char
IN_TOML = carried(HOSTILE, SURROGATE)  # what a scenario file can hold of it
ONE_LINE = carried(IN_TOML, NEWLINES + NUL)  # a line of NCCL's configuration file (NCCL ends it at a NUL)

PAIR_TEST = """
def test_pair(conformance_case, device_pair):
    conformance_case("pair_exchange", device_pair, sizes=[4])
"""
HOSTNAME_CONFTEST = """
import platform, socket
HOSTNAME = {hostname!r}
socket.gethostname = lambda: HOSTNAME  # the suite's run.json
platform.node = lambda: HOSTNAME  # pytest's JUnit testsuite
"""


def hostile_scenario() -> str:
    """A scenario whose every text is hostile; its rule fails a case while the hostile variable is inherited."""
    nccl_conf = f"NCCL_SOCKET_IFNAME={ONE_LINE}\nNCCL_{ONE_LINE}=1\n"
    return (
        f"[scenario]\nname = {toml_string(IN_TOML)}\ndescription = {toml_string(IN_TOML)}\n"
        f"nccl_conf = {toml_string(nccl_conf)}\n\n"
        f'[[rule]]\neffect = "error"\nmessage = {toml_string(IN_TOML)}\n'
        f"when_env = {{ NCCL_HOSTILE = {toml_string(carried(IN_ENVIRONMENT, SURROGATE))} }}\n"
    )


@pytest.mark.slow
def test_one_hostile_run_leaves_every_sink_valid(
    pytester: pytest.Pytester, run_suite: RunSuite, monkeypatch: pytest.MonkeyPatch, isolated_env: None
) -> None:
    """Host name, variables, NCCL's file, the scenario and the ranks say HOSTILE: every output stays its format."""
    pytester.makepyfile(test_p=PAIR_TEST)
    pytester.makeconftest(HOSTNAME_CONFTEST.format(hostname=carried(IN_ENVIRONMENT, SURROGATE)))
    scenario = pytester.makefile(".toml", hostile=hostile_scenario())
    monkeypatch.setenv("NCCL_HOSTILE", carried(IN_ENVIRONMENT, SURROGATE))
    for family in ("NCCL_", "GLOO_"):  # a hostile name, a hostile value (gloo reads no such name)
        monkeypatch.setenv(family + carried(IN_ENVIRONMENT, "="), IN_ENVIRONMENT)
    reports = pytester.path / carried(IN_ENVIRONMENT, "/" + SURROGATE)  # a path the sinks print and write
    junit, prom = pytester.path / "junit.xml", pytester.path / "run.prom"

    result = run_suite(
        f"--scenario={scenario}", "--virtual-devices=2", "--step-timeout=30", f"--reports-dir={reports}",
        f"--junitxml={junit}", f"--metrics-file={prom}", "--metrics-per-case", "--run-report", "test_p.py",
    )  # fmt: skip

    output = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    assert RAW_ON_TERMINAL.search(output) is None, [line for line in result.outlines if RAW_ON_TERMINAL.search(line)]
    last_block = output[output.rindex("\n==") :]  # the answer is the last block on the screen
    assert "conformance: the answer (SIMULATED)" in last_block.splitlines()[1], last_block
    run = (reports / "latest").resolve()
    facts = json.loads((run / "run.json").read_text())
    assert facts["end"]["state"] == "complete" and facts["host"] == carried(IN_ENVIRONMENT, SURROGATE)
    check_junit(junit)
    check_env_file(run / ENV_FILE, pytester.path, {CONFIG_NAME: ""})  # clean fixed the pair: NCCL's file emptied
    assert "GLOO_" in (run / ENV_FILE).read_text(errors="replace")  # the inherited variable's note
    check_html((run / "report.html").read_text())
    (info,) = check_metrics(prom.read_text())["gpu_conformance_run_info"]
    assert info["host"] == shown_lines(carried(IN_ENVIRONMENT, SURROGATE))
    assert not list(pytester.path.rglob(f"{PWNED}*"))


def test_a_host_name_with_control_characters_still_ends_with_the_answer(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, isolated_env: None
) -> None:
    """Pytest writes the host name raw; the run's JUnit step used to crash on it, with no answer (item 3)."""
    hostname = carried(IN_ENVIRONMENT, SURROGATE)
    pytester.makepyfile(test_p=PAIR_TEST)
    pytester.makeconftest(HOSTNAME_CONFTEST.format(hostname=hostname))
    junit = pytester.path / "junit.xml"

    result = run_suite("--virtual-devices=2", f"--junitxml={junit}", "test_p.py")

    output = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, output
    last_block = output[output.rindex("\n==") :]
    assert "conformance: the answer" in last_block.splitlines()[1] and "1 case in 1 class passed" in last_block
    check_junit(junit)
    facts = json.loads((reports_dir / "latest" / "run.json").read_text())
    assert facts["end"]["state"] == "complete" and facts["host"] == hostname


def check_junit(path: Path) -> None:
    """Strict XML 1.0 (expat) and valid xunit2 (Jenkins xunit's junit-10.xsd, as pytest's own tests check)."""
    text = path.read_text(encoding="utf-8")
    assert NOT_XML_CHAR.search(text) is None
    ElementTree.fromstring(text)
    assert [f"{e.path}: {e.reason}" for e in xmlschema.XMLSchema(SCHEMA).iter_errors(str(path))] == []


def sourced(path: Path, cwd: Path) -> dict[bytes, bytes]:
    """What ``set -a; . FILE; set +a`` defines in a bare bash, beyond what bash defines by itself."""

    def defined(script: str) -> dict[bytes, bytes]:
        bare = ["env", "-i", "PATH=/usr/bin:/bin", "bash", "--norc", "--noprofile", "-c", script, "bash", str(path)]
        out = subprocess.run(bare, cwd=cwd, capture_output=True, check=True).stdout
        return dict(item.split(b"=", 1) for item in out.split(b"\0") if item)

    before, after = defined("env -0"), defined('set -a; . "$1"; set +a; env -0')
    return {name: value for name, value in after.items() if before.get(name) != value}


def check_env_file(path: Path, cwd: Path, expected: dict[str, str]) -> None:
    """``bash -n`` clean; sourced, it defines exactly ``expected`` (as bytes) and runs nothing."""
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True)
    assert (syntax.returncode, syntax.stderr) == (0, b"")
    assert sourced(path, cwd) == {os.fsencode(k): os.fsencode(v) for k, v in expected.items()}
    assert not list(cwd.glob(f"{PWNED}*"))


def check_html(html: str) -> None:
    """Well formed (every element closed as opened), no script, comment or raw control; the markup escaped."""
    parse(html)
    assert "<script" not in html and "<!--" not in html and "]]>" not in html
    assert RAW_ON_TERMINAL.search(html.replace("\n", "")) is None
    assert "&lt;/script&gt;&lt;script&gt;&lt;!--" in html


def check_metrics(text: str) -> dict[str, list[dict[str, str]]]:
    """prometheus_client's own parser reads it, one sample per series, no family but the suite's."""
    families = {f.name: [dict(s.labels) for s in f.samples] for f in text_string_to_metric_families(text)}
    assert all(name.startswith("gpu_conformance_") for name in families), sorted(families)
    for name, samples in families.items():
        series = [tuple(sorted(labels.items())) for labels in samples]
        assert len(series) == len(set(series)), name
    return families


# -- the terminal ---------------------------------------------------------------------------------


def test_every_command_shows_outside_text_as_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """recommend, report, compare and a refusal: a run whose every text (and its folder's name) is hostile."""
    folder = hostile_run_folder(tmp_path)
    for argv in (
        ["recommend", str(folder)], ["recommend", "--json", str(folder)], ["report", str(folder)],
        ["compare", str(folder), str(folder)], ["recommend", str(folder / HOSTILE.replace(NUL, ""))],
    ):  # fmt: skip
        main(argv)
        said = capsys.readouterr()
        for text in (said.out, said.err):
            assert RAW_ON_TERMINAL.search(text) is None, (
                argv,
                [s for s in text.split("\n") if RAW_ON_TERMINAL.search(s)],
            )
    assert not list(tmp_path.rglob(f"{PWNED}*"))


def _calls(pattern: str, *, skip: tuple[str, ...] = (), importing: str = "", code: bool = True) -> dict[str, int]:
    """Modules of the package (those whose imports match ``importing``) matching ``pattern``, and how often.

    ``code``: strings on one line and comments are left out first (a call, not a word in a message).
    """
    found: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name, text = str(path.relative_to(PACKAGE.parent)), path.read_text()
        searched = re.sub(r"#[^\n]*", "", re.sub(r'"[^"\n]*"|\'[^\'\n]*\'', '""', text)) if code else text
        count = len(re.findall(pattern, searched))
        if count and name not in skip and re.search(rf"^(?:from|import) [\w.]*(?:{importing})", text, re.M):
            found[name] = count
    return found


def test_only_the_terminals_owners_write_to_it() -> None:
    """Every print goes through cli.common (say, fail, warn); every line to pytest's terminal through 3 owners.

    ``cli/slurm_health.py`` is the drain check's (its reasons and lines are shown there, ``test_outside_text``).
    """
    assert _calls(r"\bprint\(|sys\.std(?:out|err)\.write\(", skip=("conformance/cli/slurm_health.py",)) == {
        "conformance/cli/common.py": 1,
        "conformance/launch/forkserver.py": 1,  # to its own log file (its stderr), the line shown
    }
    assert set(_calls(r"\.(?:write_line|rewrite|write_sep)\(")) == {
        "conformance/harness/terminal.py",  # every outside line shown
        "conformance/harness/progress.py",  # the test id and the ranks' phases shown first
        "conformance/session.py",  # the suite's own words and counts
    }


# -- JUnit XML ------------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.text())
def test_junit_text_leaves_no_character_xml_forbids(text: str) -> None:
    from conformance.common.xml_text import junit_text

    assert NOT_XML_CHAR.search(junit_text(text)) is None


def hostile_junit(path: Path, results: Path) -> Path:
    """A JUnit file as pytest writes it on a host named HOSTILE (ElementTree, as its junitxml), then completed."""
    from conformance.harness.junit import JunitSummary, complete
    from conformance.record.records import JunitRun

    raw = carried(HOSTILE, SURROGATE)  # pytest writes utf-8 strictly: a surrogate fails its own writer
    suites = ElementTree.Element("testsuites", name="pytest tests")
    attributes = {"name": "pytest", "errors": "0", "failures": "0", "skipped": "0", "tests": "1", "time": "1.0"}
    suite = ElementTree.SubElement(suites, "testsuite", attributes, timestamp="2025-01-01T00:00:00", hostname=raw)
    ElementTree.SubElement(suite, "testcase", classname=raw, name="t", time="1.0")
    path.write_text('<?xml version="1.0" encoding="utf-8"?>' + ElementTree.tostring(suites, encoding="unicode"))
    run = JunitRun(HOSTILE, str(results), HOSTILE)
    summary = JunitSummary(run, None, (HOSTILE,), (HOSTILE,), HOSTILE, ((HOSTILE, HOSTILE),), HOSTILE)
    complete(path, summary)
    return path


def test_the_junit_file_stays_xml_whatever_pytest_and_the_run_said(tmp_path: Path) -> None:
    """Pytest left the host name raw; the run's id, paths, answer, exports and findings are hostile."""
    path = hostile_junit(tmp_path / "junit.xml", tmp_path / "results.jsonl")
    check_junit(path)
    suite = ElementTree.parse(path).getroot().find("testsuite")
    assert suite is not None and suite.get("hostname") == shown_lines(carried(HOSTILE, SURROGATE))
    assert [p.get("value") for p in suite.iter("property")][0] == shown_lines(HOSTILE)  # the run id, shown


def test_merged_junit_stays_xml_whatever_run_json_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = hostile_run_folder(tmp_path)
    first = hostile_junit(tmp_path / "first.xml", folder / "results.jsonl")
    merged = tmp_path / "merged.xml"
    assert main(["merge-junit", "-o", str(merged), str(first)]) == 0, capsys.readouterr()
    check_junit(merged)
    host = [p.get("value") for p in ElementTree.parse(merged).getroot().iter("property")]
    assert shown_lines(HOSTILE) in host


def test_only_the_one_writer_writes_junit() -> None:
    """No module but common/xml_text.py writes an XML tree (ElementTree, junitparser): all go through its escape."""
    writes = _calls(r"\.write\(|\btostring\(|xml_declaration", importing="xml|junitparser|lxml")
    assert set(writes) == {"conformance/common/xml_text.py"}


# -- shell text: recommended.env and the export lines ----------------------------------------------


def test_a_sourced_env_file_sets_exactly_the_recommended_values(tmp_path: Path) -> None:
    """Values, names, notes and NCCL's configuration: all hostile; sourced, the file sets what it recommends."""
    run = load_run(hostile_run_folder(tmp_path))
    recommendation = recommend(run)
    path = write_env_file(run, recommendation)
    # the hostile file is the user's (NCCL_CONF_FILE's): NCCL_CONF_FILE=/dev/null keeps it out, nothing emptied
    check_env_file(path, tmp_path, {"NCCL_CONF_FILE": "/dev/null", SETTABLE: IN_ENVIRONMENT})
    (export,) = [line for line in recommendation.exports() if line.startswith(f"export {SETTABLE}=")]
    script = tmp_path / "launch.sh"
    script.write_bytes(os.fsencode(export + "\n"))
    check_env_file(script, tmp_path, {SETTABLE: IN_ENVIRONMENT})


@settings(max_examples=25, deadline=None)
@given(st.text())
def test_any_value_reads_back_exactly_or_is_said_unsettable(value: str) -> None:
    from conformance.common.shell_text import assignment, file_bytes, unsettable

    with tempfile.TemporaryDirectory() as name:  # hypothesis runs the body many times: a folder each
        path = Path(name) / ENV_FILE
        path.write_bytes(file_bytes([assignment("VALUE", value)]))
        check_env_file(path, Path(name), {} if unsettable("VALUE", value) else {"VALUE": value})


def test_only_shell_text_makes_shell_lines() -> None:
    """Every assignment or export line comes from common/shell_text.py; recommended.env from env_file.py alone."""
    assert set(_calls(r"""f["']export |["']export ["']""", code=False)) == {"conformance/common/shell_text.py"}
    assert set(_calls(r"\bENV_FILE\b")) <= {
        "conformance/summarise/env_file.py", "conformance/summarise/conclude.py", "conformance/cli/recommend.py"
    }  # fmt: skip


# -- HTML -------------------------------------------------------------------------------------------


def test_the_html_report_shows_every_outside_text_escaped(tmp_path: Path) -> None:
    run = load_run(hostile_run_folder(tmp_path))
    recommendation = recommend(run)
    check_html(render_report(run, recommendation.lines(), answer=answer(run, recommendation)))


def test_no_template_marks_text_safe() -> None:
    """Autoescape on in the one Jinja2 environment; nothing marked safe, so every text is escaped."""
    templates = PACKAGE / "summarise" / "templates"
    assert not [p for p in templates.iterdir() if re.search(r"\|\s*safe\b|autoescape\s+false", p.read_text())]
    assert set(_calls(r"\bMarkup\(|autoescape=")) == {"conformance/summarise/report.py"}
    assert "autoescape=True" in (PACKAGE / "summarise" / "report.py").read_text()


# -- Prometheus ---------------------------------------------------------------------------------------


def hostile_metrics(tmp_path: Path) -> str:
    run = load_run(hostile_run_folder(tmp_path))
    return metrics_text(run, RunStatus(0.0, 1.0, 1, answer(run, recommend(run))), per_case=True)


def test_metrics_keep_every_label_a_label(tmp_path: Path) -> None:
    """Host, run id, scenario, test ids, links, rungs, checks and sizes all hostile: one sample per series."""
    families = check_metrics(hostile_metrics(tmp_path))
    (info,) = families["gpu_conformance_run_info"]
    assert info["host"] == info["run_id"] == shown_lines(HOSTILE)
    tests = [labels["test"] for labels in families["gpu_conformance_case_passed"]]
    assert tests and all(test.startswith(shown_lines(f"suites/test_{HOSTILE}")) for test in tests)


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool is not installed (Debian: apt-get install prometheus)"
)
def test_promtool_accepts_the_hostile_metrics(tmp_path: Path) -> None:
    checked = subprocess.run(
        ["promtool", "check", "metrics"], input=hostile_metrics(tmp_path), capture_output=True, text=True
    )
    assert checked.returncode == 0, (checked.stdout, checked.stderr)
