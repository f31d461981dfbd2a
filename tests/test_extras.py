"""The suite without its extras: jinja2 (``report``), junitparser (``junit``) and prometheus_client (``metrics``).

Each is imported where it is used.

A GPU image with torch installs the package with ``--no-deps`` and only what a run needs
(``docs/container.md``); a run there must pass, and what needs an extra must say which in one line
and never read green: ``--run-report`` without jinja2 and ``--metrics-file`` without prometheus_client
are refused at the start, naming the extra.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conformance.cli.main import main
from conformance.summarise import report
from conftest import copy_suites

pytestmark = pytest.mark.usefixtures("isolated_env")
NO_JINJA2 = "the HTML report needs jinja2: pip install 'gpu-conformance[report]'"
NO_PROMETHEUS_CLIENT = "the metrics file needs prometheus_client: pip install 'gpu-conformance[metrics]'"


@pytest.fixture
def without_jinja2(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """jinja2 cannot be imported: here (sys.modules) and in the runs this test starts (a jinja2 that raises)."""
    hidden = pytester.path / "hidden"
    hidden.mkdir()
    (hidden / "jinja2.py").write_text('raise ImportError("jinja2 hidden by the test")\n')
    monkeypatch.setenv("PYTHONPATH", str(hidden))
    monkeypatch.setitem(sys.modules, "jinja2", None)
    report._templates.cache_clear()
    yield
    report._templates.cache_clear()


def test_imports_of_a_run_need_no_extra() -> None:
    script = (
        "import sys; sys.modules['jinja2'] = sys.modules['junitparser'] = sys.modules['prometheus_client'] = None; "
        "import conformance.plugin, conformance.cli.main, conformance.cli.slurm_health"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def test_without_jinja2_a_run_passes_and_run_report_is_refused_at_the_start_naming_the_extra(
    pytester: pytest.Pytester,
    run_suite: Callable[..., pytest.RunResult],
    reports_dir: Path,
    without_jinja2: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = copy_suites(pytester, "test_environment.py")
    plain = run_suite("--virtual-devices=2", *files)
    assert plain.ret == pytest.ExitCode.OK, plain.stdout.str()
    asked = run_suite("--virtual-devices=2", "--run-report", *files)
    assert asked.ret == pytest.ExitCode.USAGE_ERROR, asked.stdout.str()  # refused at the start, not after the run
    refused = f"ERROR: conformance: command-line option --run-report: --run-report: {NO_JINJA2}"
    assert [line for line in asked.stderr.lines if line] == [refused]
    assert "Traceback" not in asked.stdout.str() + asked.stderr.str()
    assert "collected" not in asked.stdout.str()

    capsys.readouterr()
    assert main(["report", "--reports-dir", str(reports_dir)]) == 2  # the command: one line, the extra named
    err = capsys.readouterr().err
    assert err == f"python -m conformance report: {NO_JINJA2}\n"


def test_without_prometheus_client_a_metrics_file_is_refused_at_the_start_naming_the_extra(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    hidden = pytester.path / "hidden"
    hidden.mkdir()
    (hidden / "prometheus_client.py").write_text('raise ImportError("prometheus_client hidden by the test")\n')
    monkeypatch.setenv("PYTHONPATH", str(hidden))
    files = copy_suites(pytester, "test_environment.py")
    asked = run_suite("--virtual-devices=2", f"--metrics-file={pytester.path / 'm.prom'}", *files)
    assert asked.ret == pytest.ExitCode.USAGE_ERROR, asked.stdout.str()
    refused = f"ERROR: conformance: command-line option --metrics-file: --metrics-file: {NO_PROMETHEUS_CLIENT}"
    assert [line for line in asked.stderr.lines if line] == [refused]
    assert "collected" not in asked.stdout.str() and not (pytester.path / "m.prom").exists()
