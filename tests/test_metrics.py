"""``--metrics-file``: the run's results for Prometheus (node_exporter's textfile collector).

Real runs of the suite, each once per module and read by several tests: a healthy run on two
virtual devices (collectives, pairs, host checks; with ``--metrics-per-case``), the simulated box
whose pair gpu1-gpu5 is SLOW (every case passes, the run fails), the one whose PCIe P2P hangs, the
whole suite on that 8-GPU box (its series bounded), and a run interrupted half-way that also looks
at the file while it runs.  Each file is parsed with ``prometheus_client``'s parser and, where
``promtool`` is installed, checked by it; bad paths are refused before any case.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conformance.common import files
from conformance.common.families import INHERITED_FAMILIES
from conformance.common.verdicts import Verdict
from conformance.record.records import PYTEST_OUTCOMES, CaseRecord, RunEnd, RunFacts
from conformance.record.runs import Run, load_run
from conformance.settings import SETTINGS
from conformance.summarise import metrics
from conformance.summarise.metrics import RunStatus, metrics_text, run_verdict, write_metrics
from conftest import COLLECTIVE_TEST, REPO, TAG_VARIABLE, WHOLE_SUITE, copy_suite_files, wait_until_gone

prometheus_parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client is in the dev extra")

RunSuite = Callable[..., pytest.RunResult]
PAIR_TEST = """
def test_pair(conformance_case, device_pair):
    conformance_case("pair_exchange", device_pair, sizes=[4])
"""
TIMEOUTS = ("--step-timeout=3", "--op-timeout=2", "--init-timeout=2", "--grace=1")
PROM = "gpu_conformance.prom"


@dataclass(frozen=True)
class Finished:
    """A run of the suite in a folder of its own, and the metrics file it left."""

    folder: Path
    ret: int
    output: str
    metrics: Path

    @property
    def text(self) -> str:
        return self.metrics.read_text()

    @property
    def families(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        parsed = prometheus_parser.text_string_to_metric_families(self.text)
        return {f.name: [(dict(s.labels), s.value) for s in f.samples] for f in parsed}

    def value(self, name: str, **labels: str) -> float:
        """The one sample of ``name`` whose labels include ``labels``."""
        found = [v for sample, v in self.families[name] if labels.items() <= sample.items()]
        assert len(found) == 1, (name, labels, self.families.get(name))
        return found[0]

    def run(self) -> Run:
        return load_run(self.folder / "reports" / "latest")


def isolated_environ(tag: str) -> dict[str, str]:
    """The ``isolated_env`` fixture's environment for a module's runs: no CONFORMANCE_*, no NCCL variable, no GPU."""
    names = {s.env_var for s in SETTINGS}
    environ = {k: v for k, v in os.environ.items() if k not in names and not k.startswith(INHERITED_FAMILIES)}
    return {**environ, "CUDA_VISIBLE_DEVICES": "", TAG_VARIABLE: tag}


def run_in(folder: Path, *args: str, timeout: float = 180) -> Finished:
    folder.mkdir(parents=True, exist_ok=True)
    metrics_file = folder / "textfile" / PROM
    metrics_file.parent.mkdir(exist_ok=True)
    tag = uuid.uuid4().hex
    command = [
        sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider", "-q",
        f"--reports-dir={folder / 'reports'}", f"--metrics-file={metrics_file}", *args,
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=folder, env=isolated_environ(tag), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert not wait_until_gone(tag), "processes left behind"
    return Finished(folder, done.returncode, done.stdout + done.stderr, metrics_file)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    folder = tmp_path_factory.mktemp("healthy")
    files = copy_suite_files(folder, "test_collectives.py", "test_pairs.py", "test_environment.py")
    return run_in(folder, "--virtual-devices=2", "--metrics-per-case", *files)


@pytest.fixture(scope="module")
def slow_pair(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """Two SYS pairs of the simulated 8-GPU box, one at 0.3 of its link: every case passes, the run fails."""
    folder = tmp_path_factory.mktemp("slow")
    files = copy_suite_files(folder, "test_pairs.py", "test_collectives.py")
    return run_in(folder, "--scenario=slow-pair", "-k", "gpu1-gpu5 or gpu0-gpu5 or test_all_reduce", *files)


@pytest.fixture(scope="module")
def whole_suite_8_gpus(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """Every test of the suite on the 8-GPU PCIe box whose P2P hangs: classes fail, fallback rungs run."""
    folder = tmp_path_factory.mktemp("eight")
    files = copy_suite_files(folder, *WHOLE_SUITE)
    return run_in(folder, "--scenario=driver-p2p-hang", "--metrics-per-case", *files, timeout=900)


@pytest.fixture(scope="module")
def hang(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """A PIX pair whose P2P hangs (driver-p2p-hang), the environment as it is only."""
    folder = tmp_path_factory.mktemp("hang")
    files = copy_suite_files(folder, "test_pairs.py")
    selected = "test_pair_exchange and (gpu0-gpu1- or gpu0-gpu4-)"
    return run_in(folder, "--scenario=driver-p2p-hang", "--matrix=inherited", *TIMEOUTS, "-k", selected, *files)


INTERRUPTED_SUITE = """
import shutil
from pathlib import Path

def test_1_pair(conformance_case, device_pair):
    conformance_case("pair_exchange", device_pair, sizes=[4])

def test_2_look_at_the_metrics_meanwhile(pytestconfig):
    shutil.copy(pytestconfig.getoption("conformance_metrics_file"), "seen-while-running.prom")

def test_3_ctrl_c():
    raise KeyboardInterrupt

def test_4_never_runs():
    pass
"""


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    folder = tmp_path_factory.mktemp("interrupted")
    (folder / "test_i.py").write_text(INTERRUPTED_SUITE)
    return run_in(folder, "--virtual-devices=2", "-p", "no:randomly", "test_i.py")


# -- a healthy run ----------------------------------------------------------------------------


def test_a_passing_run_reads_passed(healthy: Finished) -> None:
    assert healthy.ret == 0, healthy.output
    assert f"metrics for Prometheus: {healthy.metrics}" in healthy.output
    run = healthy.run()
    (info,) = healthy.families["gpu_conformance_run_info"]
    assert info == (
        {"run_id": run.run_id, "host": run.facts.host, "backend": "gloo", "simulated": "false", "scenario": "",
         "verdict": "passed", "signed": "true"},
        1.0,
    )  # fmt: skip
    assert healthy.value("gpu_conformance_run_passed") == 1
    assert healthy.value("gpu_conformance_run_exit_status") == 0
    verdicts = dict((labels["verdict"], v) for labels, v in healthy.families["gpu_conformance_run_verdict"])
    assert verdicts == {"passed": 1, "failed": 0, "incomplete": 0, "running": 0}
    problems = healthy.families["gpu_conformance_answer_problems"]
    assert {labels["kind"] for labels, _ in problems} >= {"slow_pair", "harness_error", "failing_class"}
    assert all(v == 0 for _, v in problems)
    start = healthy.value("gpu_conformance_run_start_timestamp_seconds")
    end = healthy.value("gpu_conformance_run_end_timestamp_seconds")
    assert start <= end and healthy.value("gpu_conformance_run_duration_seconds") == pytest.approx(
        end - start, abs=0.01
    )
    assert healthy.metrics.stat().st_mtime >= end - 1


def test_every_verdict_is_counted_zero_or_more(healthy: Finished) -> None:
    counted = {labels["verdict"]: v for labels, v in healthy.families["gpu_conformance_cases"]}
    assert set(counted) == {v.value for v in Verdict}
    cases = [r for r in healthy.run().usable_records if r.set_kind != "host"]
    assert counted["pass"] == len(cases) > 0
    assert sum(counted.values()) == counted["pass"]


def test_the_tests_are_pytest_s_count(healthy: Finished) -> None:
    tests = {labels["outcome"]: v for labels, v in healthy.families["gpu_conformance_tests"]}
    last = re.search(r"(\d+) passed, (\d+) skipped in ", healthy.output)
    assert last is not None, healthy.output
    assert tests == {**dict.fromkeys(PYTEST_OUTCOMES, 0), "passed": int(last[1]), "skipped": int(last[2])}
    assert f"tests: pytest's {int(last[1]) + int(last[2])} = " in healthy.output


def test_per_case_series_behind_the_option(healthy: Finished, hang: Finished) -> None:
    run = healthy.run()
    cases = [r for r in run.usable_records if r.set_kind != "host"]
    assert len(healthy.families["gpu_conformance_case_passed"]) == len(cases)
    for record in cases:
        assert healthy.value("gpu_conformance_case_passed", test=record.nodeid) == 1
        assert healthy.value("gpu_conformance_case_duration_seconds", test=record.nodeid) == record.seconds
        assert healthy.value("gpu_conformance_case_verdict", test=record.nodeid, verdict="pass") == 1
    (all_reduce,) = [
        labels for labels, _ in healthy.families["gpu_conformance_case_passed"] if "all_reduce" in labels["test"]
    ]
    assert all_reduce == {
        "test": "suites/test_collectives.py::test_all_reduce[all2-inherited]",
        "family": "suites/test_collectives.py::test_all_reduce",
        "device_set": "all2", "rung": "inherited", "link": "all",
    }  # fmt: skip
    probes = {labels["probe"] for labels, _ in healthy.families["gpu_conformance_case_bandwidth_bytes_per_second"]}
    assert probes == {"pair_exchange", "peer_copy"}
    assert not [name for name in hang.families if name.startswith("gpu_conformance_case_")]  # not by default


def test_each_host_check_that_ran_has_its_series(healthy: Finished) -> None:
    checks = [r for r in healthy.run().usable_records if r.set_kind == "host"]
    assert {r.probe for r in checks} >= {"host:dev_shm", "host:hostname"}
    ran = {labels["check"]: v for labels, v in healthy.families["gpu_conformance_host_check_passed"]}
    assert ran == {
        r.probe.removeprefix("host:"): float(r.outcome is Verdict.PASS) for r in checks if r.outcome is not Verdict.SKIP
    }
    assert any(r.outcome is Verdict.SKIP for r in checks)  # a skipped check has no series: never a false red


def test_bandwidths_per_pair_and_collective(healthy: Finished) -> None:
    assert healthy.families["gpu_conformance_pair_passed"] == [({"pair": "cpu0-cpu1", "link": "CPU"}, 1.0)]
    (pair, figure), *more = healthy.families["gpu_conformance_pair_bandwidth_bytes_per_second"]
    assert pair == {"pair": "cpu0-cpu1", "link": "CPU"} and figure > 0 and not more
    figures = [r.bandwidth_gbps for r in healthy.run().records if r.set_kind == "pair"]
    assert figure == round(min(f for f in figures if f is not None) * 1e9)  # the lowest of its probes
    # gloo on CPU ranks measures host copies: no GPU link, so no link rate
    assert "gpu_conformance_link_rate_bytes_per_second" not in healthy.families
    busbw = healthy.families["gpu_conformance_collective_busbw_bytes_per_second"]
    assert {labels["collective"] for labels, _ in busbw} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}
    assert {(labels["device_set"], labels["link"]) for labels, _ in busbw} == {("all2", "CPU")}
    record = next(r for r in healthy.run().records if r.probe == "all_reduce" and "busbw_gbps" in r.metrics)
    (size, gbps), *_ = record.metrics["busbw_gbps"].items()
    assert healthy.value("gpu_conformance_collective_busbw_bytes_per_second", collective="all_reduce", size=size) == (
        round(gbps * 1e9)
    )


def test_an_8_gpu_node_writes_at_most_150_series_by_default(whole_suite_8_gpus: Finished) -> None:
    """About 500 series a node with the pytest node id a label; bounded by the machine, not the tests."""
    run = whole_suite_8_gpus
    assert run.ret == 1, run.output
    series = {name: len(samples) for name, samples in run.families.items()}
    per_case = sum(n for name, n in series.items() if name.startswith("gpu_conformance_case_"))
    bounded = sum(series.values()) - per_case
    assert bounded <= metrics.SERIES_BOUND_8_GPUS == 150, series
    assert per_case > 150, series  # what the option adds grows with the tests and rungs
    classes = len(run.families["gpu_conformance_class_passed"])
    links = len(run.families.get("gpu_conformance_link_rate_bytes_per_second", []))
    checks = len(run.families["gpu_conformance_host_check_passed"])
    collectives = len(run.families["gpu_conformance_collective_algbw_bytes_per_second"])
    assert series["gpu_conformance_pair_passed"] == 28  # every pair of 8 GPUs, whatever rungs it climbed
    assert bounded <= metrics.series_bound(28, classes, links, collectives, checks) <= 150
    assert run.value("gpu_conformance_class_rung", **{"class": "PIX pairs"}) == 1
    (pix,) = [labels for labels, _ in run.families["gpu_conformance_class_rung"] if labels["class"] == "PIX pairs"]
    assert pix["rung"] == "p2p_level_nvl"
    assert run.value("gpu_conformance_pair_passed", pair="gpu0-gpu1") == 0  # PIX: hangs as it is
    assert run.value("gpu_conformance_pair_passed", pair="gpu0-gpu4") == 1  # SYS: passes as it is


def test_the_file_is_well_formed(healthy: Finished) -> None:
    lines = healthy.text.splitlines()
    declared = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    assert len(declared) == len(set(declared))
    for name in declared:
        assert lines.count(f"# TYPE {name} gauge") == 1 and any(line.startswith(f"# HELP {name} ") for line in lines)
        assert re.fullmatch(r"gpu_conformance_[a-z_]+", name)
    samples = [line for line in lines if not line.startswith("#")]
    assert len(samples) == len(set(line.rsplit(" ", 1)[0] for line in samples))  # no series twice
    assert healthy.text.endswith("\n")
    assert stat.S_IMODE(healthy.metrics.stat().st_mode) == 0o644  # node_exporter reads it as its own user
    assert sorted(p.name for p in healthy.metrics.parent.iterdir()) == [PROM]  # no temporary file left


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool is not installed (Debian: apt-get install prometheus)"
)
def test_promtool_accepts_every_file(
    healthy: Finished, slow_pair: Finished, hang: Finished, interrupted: Finished
) -> None:
    for run in (healthy, slow_pair, hang, interrupted):
        for text in (run.text, *(p.read_text() for p in run.folder.glob("seen-while-running.prom"))):
            checked = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
            assert checked.returncode == 0, (run.folder, checked.stdout, checked.stderr)


# -- failures are never green -----------------------------------------------------------------


def test_a_slow_pair_fails_the_run_though_every_case_passed(slow_pair: Finished) -> None:
    assert slow_pair.ret == 1, slow_pair.output
    assert slow_pair.value("gpu_conformance_run_info", verdict="failed", simulated="true", scenario="slow-pair") == 1
    assert slow_pair.value("gpu_conformance_run_passed") == 0
    assert slow_pair.value("gpu_conformance_run_exit_status") == 1
    assert slow_pair.value("gpu_conformance_answer_problems", kind="slow_pair") == 2  # pair_exchange, peer_copy
    counted = {labels["verdict"]: v for labels, v in slow_pair.families["gpu_conformance_cases"]}
    assert counted["pass"] == 5 and sum(counted.values()) == 5  # every case passed
    passed = {labels["pair"]: v for labels, v in slow_pair.families["gpu_conformance_pair_passed"]}
    assert passed == {"gpu1-gpu5": 0, "gpu0-gpu5": 1}  # SLOW: not passed, though its cases passed
    # a simulated pair's figure is its link's physical rate times its share: 0.8 healthy, 0.8 x 0.3 slow
    rate = slow_pair.value("gpu_conformance_link_rate_bytes_per_second", link="SYS")
    bandwidth = "gpu_conformance_pair_bandwidth_bytes_per_second"
    assert slow_pair.value(bandwidth, pair="gpu0-gpu5", link="SYS") / rate == pytest.approx(0.8, abs=0.001)
    assert slow_pair.value(bandwidth, pair="gpu1-gpu5", link="SYS") / rate == pytest.approx(0.24, abs=0.001)
    # a collective over all eight GPUs: its slowest link, the farthest path among links of one rate
    (labels, ratio), *_ = slow_pair.families["gpu_conformance_collective_busbw_link_ratio"]
    assert (labels["device_set"], labels["link"]) == ("all8", "SYS") and ratio > 0


def test_a_hang_shows_as_a_failed_pair_and_class(hang: Finished) -> None:
    assert hang.ret == 1, hang.output
    assert hang.value("gpu_conformance_run_info", verdict="failed") == 1
    assert hang.value("gpu_conformance_run_passed") == 0
    assert hang.value("gpu_conformance_cases", verdict="hang") == 1
    assert hang.value("gpu_conformance_cases", verdict="pass") == 1
    assert hang.value("gpu_conformance_answer_problems", kind="failing_class") == 1
    assert hang.value("gpu_conformance_pair_passed", pair="gpu0-gpu1", link="PIX") == 0
    assert hang.value("gpu_conformance_pair_passed", pair="gpu0-gpu4", link="SYS") == 1
    assert hang.value("gpu_conformance_class_passed", **{"class": "PIX pairs"}) == 0
    assert hang.value("gpu_conformance_class_rung", **{"class": "PIX pairs"}, rung="none") == 1  # inherited only
    bandwidth = hang.families["gpu_conformance_pair_bandwidth_bytes_per_second"]
    assert [labels["pair"] for labels, _ in bandwidth] == ["gpu0-gpu4"]  # a hung pair measured nothing


def test_the_file_says_running_meanwhile_and_incomplete_after_an_interruption(interrupted: Finished) -> None:
    assert interrupted.ret == pytest.ExitCode.INTERRUPTED, interrupted.output
    meanwhile = Finished(interrupted.folder, 0, "", interrupted.folder / "seen-while-running.prom")
    assert meanwhile.value("gpu_conformance_run_info", verdict="running") == 1
    assert meanwhile.value("gpu_conformance_run_passed") == 0
    assert meanwhile.value("gpu_conformance_run_start_timestamp_seconds") == interrupted.value(
        "gpu_conformance_run_start_timestamp_seconds"
    )
    for absent in ("run_exit_status", "run_end_timestamp_seconds", "run_duration_seconds", "answer_problems"):
        assert f"gpu_conformance_{absent}" not in meanwhile.families
    assert interrupted.value("gpu_conformance_run_info", verdict="incomplete") == 1
    assert interrupted.value("gpu_conformance_run_passed") == 0
    assert interrupted.value("gpu_conformance_run_exit_status") == pytest.ExitCode.INTERRUPTED
    assert interrupted.value("gpu_conformance_answer_problems", kind="incomplete") == 1
    assert interrupted.value("gpu_conformance_cases", verdict="pass") == 1  # the pair that ran before


@pytest.mark.usefixtures("isolated_env")
def test_under_xdist_the_controller_writes_every_worker_s_cases(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    pytester.makepyfile(test_p=PAIR_TEST, test_c=COLLECTIVE_TEST.format(probe="all_reduce"))
    textfile = pytester.path / "textfile"
    textfile.mkdir()
    result = run_suite("--virtual-devices=3", "-n", "2", f"--metrics-file={textfile / PROM}", "--metrics-per-case")
    assert result.ret == 0, result.stdout.str()
    finished = Finished(pytester.path, result.ret, "", textfile / PROM)
    assert finished.value("gpu_conformance_run_info", verdict="passed") == 1
    assert finished.value("gpu_conformance_cases", verdict="pass") == 4  # three pairs and one collective
    tests = {labels["test"] for labels, _ in finished.families["gpu_conformance_case_passed"]}
    assert tests == {r.nodeid for r in load_run(reports_dir / "latest").records}
    assert sorted(p.name for p in textfile.iterdir()) == [PROM]


# -- bad paths: refused before any case -------------------------------------------------------


@pytest.mark.usefixtures("isolated_env")
@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("no-such-folder/m.prom", "cannot be written: its folder '{here}/no-such-folder' does not exist"),
        ("plain-file/m.prom", "cannot be written: its folder '{here}/plain-file' is not a folder"),
        ("folder", "is a folder; name a file in it (gpu_conformance.prom)"),
    ],
    ids=["missing-folder", "folder-is-a-file", "path-is-a-folder"],
)
def test_a_bad_metrics_path_is_refused_before_any_case(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, given: str, problem: str
) -> None:
    pytester.makepyfile(test_p=PAIR_TEST)
    (pytester.path / "plain-file").write_text("")
    (pytester.path / "folder").mkdir()
    here = pytester.path
    shown = f"metrics file '{here / given}' {problem.format(here=here)}"
    result = run_suite("--virtual-devices=2", f"--metrics-file={given}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: conformance: command-line option --metrics-file: {shown}"])
    assert not reports_dir.exists() or not any(reports_dir.iterdir())  # no run started


@pytest.mark.usefixtures("isolated_env")
def test_the_refusal_names_the_environment_variable_and_the_ini_key(
    pytester: pytest.Pytester, run_suite: RunSuite, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_p=PAIR_TEST)
    monkeypatch.setenv("CONFORMANCE_METRICS_FILE", "gone/m.prom")
    result = run_suite("--virtual-devices=2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: conformance: environment variable CONFORMANCE_METRICS_FILE: metrics file *"])
    monkeypatch.delenv("CONFORMANCE_METRICS_FILE")
    ini = pytester.makeini("[pytest]\nconformance_metrics_file = gone/m.prom\n")
    result = run_suite("--virtual-devices=2")
    result.stderr.fnmatch_lines(
        [f"ERROR: conformance: ini key conformance_metrics_file in {ini}: metrics file *gone/m.prom*"]
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
@pytest.mark.usefixtures("isolated_env")
def test_a_read_only_folder_is_refused(pytester: pytest.Pytester, run_suite: RunSuite) -> None:
    pytester.makepyfile(test_p=PAIR_TEST)
    folder = pytester.path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        result = run_suite("--virtual-devices=2", f"--metrics-file={folder / 'm.prom'}")
    finally:
        folder.chmod(0o700)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: conformance: command-line option --metrics-file: * cannot be written: Permission denied"]
    )


# -- the format and the file, without a run ---------------------------------------------------


def a_run(*records: CaseRecord, end: RunEnd | None = None) -> Run:
    return Run("by hand", RunFacts(run_id="r1", backend="nccl", end=end or RunEnd(state="complete")), list(records))


def test_label_values_are_escaped() -> None:
    nasty = 'suites/t.py::test_x[a\\b-"q"-line\nbreak]'
    record = CaseRecord(nodeid=nasty, probe="all_reduce", verdict=Verdict.PASS, env_name="inherited", seconds=1.5)
    text = metrics_text(a_run(record), RunStatus(started=1.0, ended=2.0, exit_status=0), per_case=True)
    assert 'test="suites/t.py::test_x[a\\\\b-\\"q\\"-line\\nbreak]"' in text
    parsed = {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}
    (sample,) = parsed["gpu_conformance_case_passed"].samples
    assert sample.labels["test"] == nasty and sample.value == 1


def test_a_test_recorded_twice_is_one_series() -> None:
    first = CaseRecord(nodeid="t.py::test_x[all2-inherited]", probe="all_reduce", verdict=Verdict.HANG, seconds=9.0)
    again = CaseRecord(nodeid=first.nodeid, probe="all_reduce", verdict=Verdict.PASS, seconds=1.0)
    text = metrics_text(a_run(first, again), RunStatus(0, 1, 0), per_case=True)
    parsed = {f.name: f.samples for f in prometheus_parser.text_string_to_metric_families(text)}
    assert [s.value for s in parsed["gpu_conformance_case_passed"]] == [1]
    assert [s.labels["verdict"] for s in parsed["gpu_conformance_case_verdict"]] == ["pass"]


def test_no_false_green_whatever_the_answer_says() -> None:
    """A non-zero exit status, an unreadable run or an answer with a failure never reads as passed."""
    run = a_run(CaseRecord(nodeid="t::a", probe="p", verdict=Verdict.PASS))
    assert run_verdict(run, RunStatus(0, 1, 0)) == "passed"
    for status in (4, 5, 137):  # a usage error, no tests, killed by a signal
        assert run_verdict(run, RunStatus(0, 1, status)) == "failed"
    assert run_verdict(run, RunStatus(0, 1, 0, unreadable=True)) == "failed"
    assert run_verdict(run, RunStatus(0, 1, 1)) == "failed"
    assert run_verdict(run, RunStatus(0, 1, 2)) == "incomplete"
    assert run_verdict(run, RunStatus(0, None, None)) == "running"
    cut = a_run(end=RunEnd(state="incomplete", planned=3, ran=1, stopped_by="KeyboardInterrupt"))
    assert run_verdict(cut, RunStatus(0, 1, 0)) == "incomplete"
    assert run_verdict(cut, RunStatus(0, 1, 1)) == "failed"
    text = metrics_text(run, RunStatus(0, 1, 3))
    assert "gpu_conformance_run_passed 0.0\n" in text and 'verdict="failed"} 1.0\n' in text


@pytest.fixture
def textfile(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "textfile_collector"
    folder.mkdir()
    yield folder / PROM


def test_the_write_replaces_the_file_atomically(textfile: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_metrics(textfile, "old 1\n")
    inode = textfile.stat().st_ino
    write_metrics(textfile, "new 2\n")
    assert textfile.read_text() == "new 2\n" and textfile.stat().st_ino != inode  # a new file renamed over the old
    assert [p.name for p in textfile.parent.iterdir()] == [PROM]

    def refused(source: object, target: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", refused)
    with pytest.raises(OSError, match="No space left"):
        write_metrics(textfile, "never 3\n")
    assert textfile.read_text() == "new 2\n"  # the collector still reads the whole last file
    assert [p.name for p in textfile.parent.iterdir()] == [PROM]  # no temporary file left


def test_the_temporary_file_is_not_read_by_the_collector(textfile: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """node_exporter reads ``*.prom`` only: the temporary file is hidden and ends otherwise."""
    seen: list[str] = []
    monkeypatch.setattr(files.os, "replace", lambda source, target: seen.append(Path(source).name))
    write_metrics(textfile, "x 1\n")
    (name,) = seen
    assert name.startswith(".") and not name.endswith(".prom")


# -- the docs ---------------------------------------------------------------------------------


def test_every_metric_is_documented() -> None:
    names = re.findall(r'f"\{PREFIX\}(\w+)"', Path(metrics.__file__).read_text())
    assert len(names) >= 20
    docs = (REPO / "docs" / "after-a-run.md").read_text()
    section = docs[docs.index("## Metrics for Prometheus") :]
    missing = [name for name in names if f"`gpu_conformance_{name}`" not in section]
    assert missing == []


def test_the_file_is_readable_by_node_exporter_whatever_the_umask(textfile: Path) -> None:
    """prometheus_client's write_to_textfile leaves 0600 under umask 077 (measured): the suite writes 0644."""
    old = os.umask(0o077)
    try:
        write_metrics(textfile, "x 1\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(textfile.stat().st_mode) == 0o644


@pytest.mark.usefixtures("isolated_env")
def test_per_case_series_without_a_metrics_file_are_refused(pytester: pytest.Pytester, run_suite: RunSuite) -> None:
    pytester.makepyfile(test_p=PAIR_TEST)
    result = run_suite("--virtual-devices=2", "--metrics-per-case")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: conformance: command-line option --metrics-per-case: --metrics-per-case: give --metrics-file too"]
    )
