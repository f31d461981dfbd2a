"""Records: nothing lost without a word (issue 40, part 2).

A results.jsonl deleted while the run runs loses records; a disk that fills tears the line being
written. Real runs through ``pytester`` and real files: every test whose record is gone is a
HARNESS ERROR in the answer, run.json and the exit status, and no class it belonged to is called
"passed as they are"; a line is written whole or the write fails, leaving no torn line behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conformance.common.jsonl import append_line, read_lines
from conformance.harness.failed_tests import LOST, LOST_MESSAGE
from conftest import copy_suites

RunSuite = Callable[..., pytest.RunResult]
pytestmark = pytest.mark.usefixtures("isolated_env")

DELETE_RESULTS = """
from pathlib import Path


def test_zz_an_accident_deletes_the_runs_records(reports_dir_path=None):
    latest = Path("reports/latest/results.jsonl")
    latest.unlink()
"""


def test_records_deleted_during_the_run_are_harness_errors_naming_each_test(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    files = copy_suites(pytester, "test_collectives.py")
    pytester.makepyfile(test_zz_accident=DELETE_RESULTS)
    result = run_suite("--virtual-devices=2", "--reports-dir=reports", *files, "test_zz_accident.py")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()  # every test passed
    facts = json.loads((pytester.path / "reports" / "latest" / "run.json").read_text())
    lost = facts["end"]["harness_errors"]
    assert lost and all(e["when"] == LOST and e["message"] == LOST_MESSAGE for e in lost)
    assert "suites/test_collectives.py::test_all_reduce[all2-inherited]" in {e["nodeid"] for e in lost}
    out = result.stdout.str()
    assert f"HARNESS ERROR in {len(lost)} test(s): " in out and "everything passed" not in out
    assert "passed as they are" not in out


def test_a_line_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    """A file size limit (RLIMIT_FSIZE) cuts a write short as a full disk does: the line is taken back."""
    path = tmp_path / "results.jsonl"
    append_line(path, {"n": 1})
    size = path.stat().st_size
    program = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from conformance.common.jsonl import append_line\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({size + 10}, {size + 10}))\n"
        "try:\n"
        f"    append_line(Path({str(path)!r}), {{'n': 2, 'text': 'x' * 100}})\n"
        "except OSError as exc:\n"
        "    print('refused:', exc.strerror)\n"
        "    sys.exit(0)\n"
        "sys.exit('written, past the limit')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.startswith("refused: File too large"), done.stdout + done.stderr
    assert path.stat().st_size == size  # the torn part taken back
    assert [o["n"] for o in read_lines(path).objects] == [1] and not read_lines(path).skipped


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of its own (root and mount needed), unmounted after the test."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(folder)], capture_output=True,
                             text=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"a small file system of its own needs mount (root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


# A disk full at the end: tests/test_the_end_answers.py walks it with every other failure of the run's end.


def test_a_reports_folder_without_room_is_refused_at_the_start(
    pytester: pytest.Pytester, run_suite: RunSuite, small_disk: Path
) -> None:
    files = copy_suites(pytester, "test_collectives.py")
    with (small_disk / "filler").open("wb") as filler:
        filler.write(b"x" * (20 << 20))  # 4 MiB left: under the 16 MiB a run needs
    result = run_suite("--virtual-devices=2", f"--reports-dir={small_disk}", *files)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    refused = f"ERROR: conformance: command-line option --reports-dir: reports dir '{small_disk}' has * KiB free; "
    result.stderr.fnmatch_lines([refused + "a run needs at least 16 MiB for its records and its ranks' logs"])
