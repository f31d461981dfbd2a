"""The host checks of suites/test_environment.py: they fail below their cited figures and say what to set.

The open-file limit is lowered for real in the pytest subprocess (soft limit only, before it starts);
/dev/shm and the locked-memory limit cannot be changed here, so their messages are checked on the
suite's own functions.
"""

from __future__ import annotations

import importlib.util
import resource
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

from conftest import REPO, copy_suites, free_port, read_records, start_node

pytestmark = pytest.mark.usefixtures("isolated_env", "run_tag")
HARD_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
# Sets the soft open-file limit to argv[1], keeps the hard one, then becomes the command that follows.
SET_SOFT_NOFILE = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_NOFILE)[1])); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)
FIX = ("`* - nofile 131072` in a file under /etc/security/limits.d/", "`--ulimit nofile=131072:131072`")


def with_soft_nofile(soft: int) -> tuple[str, ...]:
    if HARD_NOFILE != resource.RLIM_INFINITY and HARD_NOFILE < soft:
        pytest.skip(f"the hard open-file limit here ({HARD_NOFILE}) is below the {soft} this test sets")
    return (sys.executable, "-c", SET_SOFT_NOFILE, str(soft))


def run_open_file_check(pytester: pytest.Pytester, soft: int) -> pytest.RunResult:
    files = copy_suites(pytester, "test_environment.py")
    return pytester.run(
        *with_soft_nofile(soft), sys.executable, "-m", "pytest", f"--basetemp={pytester.path / 'basetemp'}",
        "-p", "conformance.plugin", "-p", "no:cacheprovider", f"--reports-dir={pytester.path / 'reports'}",
        "--junitxml=host.xml", "-rfs", "-k", "test_open_file_limit", *files, timeout=120,
    )  # fmt: skip


def junit_case(path: Path, test: str) -> ET.Element:
    return next(c for c in ET.parse(path).getroot().iter("testcase") if c.get("name") == test)


def test_one_node_fails_below_1024_open_files_naming_the_limit_and_the_fix(pytester: pytest.Pytester) -> None:
    result = run_open_file_check(pytester, 512)
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert f"open-file limit (RLIMIT_NOFILE) is soft 512, hard {HARD_NOFILE}" in output
    assert "a one-node run needs a soft limit of at least 1024" in output
    assert "NCCL raises only rank 0 to the hard limit" in output
    assert f"`ulimit -n {min(HARD_NOFILE, 131072)}` in the job script" in output
    assert all(fix in output for fix in FIX), output
    assert "record_property" not in output  # its values are the record's, not JUnit properties (not in xunit2)
    assert junit_case(pytester.path / "host.xml", "test_open_file_limit").find("properties") is None
    # a record like any case's: compare, report and the summary see it
    [record] = read_records(pytester.path / "reports")
    assert (record["probe"], record["verdict"], record["set_kind"]) == ("host:open_files", "error", "host")
    assert record["summary"].startswith("open-file limit (RLIMIT_NOFILE) is soft 512, hard "), record["summary"]
    assert record["metrics"] == {"nofile_soft": "512", "nofile_hard": str(HARD_NOFILE), "nofile_needed": 1024}
    assert "host:open_files" in output  # the summary's probe row
    report = pytester.run(sys.executable, "-m", "conformance", "report", "--reports-dir", pytester.path / "reports")
    html = Path(report.outlines[-1]).read_text()
    assert '<section id="host"><h2>Host checks</h2>' in html and "open_files</td><td>open-file limit" in html


def test_one_node_passes_with_1024_open_files_and_records_both_limits(pytester: pytest.Pytester) -> None:
    result = run_open_file_check(pytester, 1024)
    result.assert_outcomes(passed=1)
    [record] = read_records(pytester.path / "reports")
    assert (record["nodeid"].split("::")[1], record["verdict"]) == ("test_open_file_limit", "pass")
    assert record["metrics"] == {"nofile_soft": "1024", "nofile_hard": str(HARD_NOFILE), "nofile_needed": 1024}
    assert junit_case(pytester.path / "host.xml", "test_open_file_limit").find("properties") is None


@pytest.mark.slow
@pytest.mark.parametrize(("soft", "passes"), [(2048, False), (4096, True)])
def test_two_nodes_need_4096_open_files(pytester: pytest.Pytester, soft: int, passes: bool) -> None:
    files = copy_suites(pytester, "test_environment.py")
    port = free_port()
    args = (*files, "--rendezvous-timeout=20", "-k", "test_open_file_limit")
    prefix = with_soft_nofile(soft)
    nodes = [start_node(pytester.path, rank, 2, port, *args, prefix=prefix) for rank in (0, 1)]
    for node in nodes:
        code, _ = node.wait()
        output = node.output
        if passes:
            assert code == 0 and "1 passed" in output, output
        else:
            assert code == 1 and "1 failed" in output, output
            assert f"is soft {soft}, hard {HARD_NOFILE}; a 2-node run needs a soft limit of at least 4096" in output
            assert "NVIDIA/nccl#127" in output
            assert all(fix in output for fix in FIX), output


# The suite's own functions, for what cannot be changed on this machine.


@pytest.fixture(scope="module")
def environment() -> ModuleType:
    spec = importlib.util.spec_from_file_location("suite_environment", REPO / "suites" / "test_environment.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_open_file_thresholds(environment: ModuleType) -> None:
    assert [environment.open_files_needed(n) for n in (1, 2, 16)] == [1024, 4096, 4096]
    assert environment.open_files_problem(1024, 1024, 1) is None
    assert environment.open_files_problem(resource.RLIM_INFINITY, resource.RLIM_INFINITY, 8) is None
    assert environment.open_files_problem(4095, 1 << 20, 2) is not None
    # a hard limit below the need: ulimit -n cannot help, only root can
    problem = environment.open_files_problem(1024, 1024, 2)
    assert "The hard limit (1024) is below that too, so only root can raise it" in problem
    assert "ulimit -n" not in problem and "/etc/security/limits.d/" in problem


def test_dev_shm_messages(environment: ModuleType) -> None:
    assert environment.shm_problem(1 << 30, "nccl") is None
    assert environment.shm_problem(64 << 20, "gloo") is None
    nccl = environment.shm_problem(63 << 20, "nccl")
    assert nccl.startswith("/dev/shm has 63 MiB free; a nccl run needs at least 1024 MiB")
    assert "NVIDIA/nccl#1518" in nccl and "`--shm-size=1g --ulimit memlock=-1`" in nccl
    assert "mount -o remount,size=1G /dev/shm" in nccl
    gloo = environment.shm_problem(10 << 20, "gloo")
    assert "a gloo run needs at least 64 MiB" in gloo and "only a sanity floor" in gloo


def test_dev_shm_needs_nccl_room_only_where_nccl_uses_shm(environment: ModuleType) -> None:
    assert environment.shm_problem(100 << 20, "nccl", shm_used=False) is None  # one GPU, or P2P everywhere
    floor = environment.shm_problem(10 << 20, "nccl", shm_used=False)
    assert floor.startswith("/dev/shm has 10 MiB free; a nccl run needs at least 64 MiB") and "sanity floor" in floor
    assert environment.shm_needed("nccl", shm_used=False) == 64 << 20 and environment.shm_needed("nccl") == 1 << 30


def test_locked_memory_fails_only_a_run_across_nodes(environment: ModuleType) -> None:
    problem, note = environment.memlock_verdict(8192, 8192, ["mlx5_0"], nnodes=1)
    assert problem is None and note.startswith("one node: NCCL registers no InfiniBand memory here; a job across")
    problem, note = environment.memlock_verdict(8192, 8192, ["mlx5_0"], nnodes=2)
    assert problem is not None and "ibv_reg_mr failed" in problem and note is None
    unlimited = resource.RLIM_INFINITY
    assert environment.memlock_verdict(unlimited, unlimited, ["mlx5_0"], nnodes=4) == (None, None)


def test_locked_memory_messages(environment: ModuleType) -> None:
    unlimited = resource.RLIM_INFINITY
    assert environment.memlock_problem(unlimited, unlimited, ["mlx5_0"]) is None
    problem = environment.memlock_problem(8192, 8192, ["mlx5_0"])
    assert "soft 8192 bytes, hard 8192, with InfiniBand devices ['mlx5_0']" in problem
    assert "`* soft memlock unlimited` and `* hard memlock unlimited` in /etc/security/limits.conf" in problem
    assert "`--ulimit memlock=-1`" in problem and "ulimit -l unlimited" not in problem
    assert "`ulimit -l unlimited` in the job script" in environment.memlock_problem(65536, unlimited, ["mlx5_0"])
