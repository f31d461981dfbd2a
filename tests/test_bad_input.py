"""Bad input is refused before any case starts, and nothing recorded earlier is touched.

Every run here is a real pytest subprocess with the conformance plugin over a test file that would
start real ranks.  A bad setting or scenario must give a usage error (exit code 4) whose message
names the bad value and where it came from (option, environment variable, ini key and file, or the
scenario file and rule), must start no rank (no run folder, no ``latest``, no ``results.jsonl``),
and must leave an earlier run's records byte for byte as they were.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import COLLECTIVE_TEST, read_records, scenario_text

OLD_RECORDS = b'{"run_id": "old-run", "verdict": "pass"}\n{"run_id": "old-run", "verdict": "hang"}\n'


@dataclass
class Existing:
    """The reports dir as an earlier run left it."""

    reports_dir: Path
    file: Path
    content: bytes

    def assert_untouched(self) -> None:
        assert self.file.read_bytes() == self.content
        names = sorted(p.name for p in self.reports_dir.iterdir())
        assert names == ["old-run"], f"the refused run left {names} in {self.reports_dir}"
        assert sorted(p.name for p in (self.reports_dir / "old-run").iterdir()) == ["results.jsonl"]
        found = sorted(self.reports_dir.rglob("results.jsonl"))
        assert found == [self.file]


pytestmark = pytest.mark.usefixtures("isolated_env")


@pytest.fixture
def existing(reports_dir: Path) -> Existing:
    old = reports_dir / "old-run" / "results.jsonl"
    old.parent.mkdir(parents=True)
    old.write_bytes(OLD_RECORDS)
    return Existing(reports_dir, old, OLD_RECORDS)


@pytest.fixture
def collective_file(pytester: pytest.Pytester) -> Path:
    return pytester.makepyfile(test_case=COLLECTIVE_TEST.format(probe="all_reduce"))


def assert_refused(result: pytest.RunResult, pattern: str, existing: Existing) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR == 4, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines([pattern])
    errors = [line for line in result.stderr.lines if line.strip()]
    assert len(errors) == 1, result.stderr.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    out = result.stdout.str()
    assert "collected" not in out and "passed" not in out and "failed" not in out, out
    existing.assert_untouched()


@dataclass
class Case:
    """One bad input.  ``pattern`` may use {here} (the run's folder) and {ini} (its ini file)."""

    args: tuple[str, ...] = ()
    pattern: str = ""
    env: dict[str, str] = field(default_factory=dict)
    ini: str | None = None
    scenario: str | None = None
    setup: Callable[[Path], None] | None = None


def make_regular_file(here: Path) -> None:
    (here / "plain-file").write_text("not a folder\n")


DEEP = 100_000  # levels of nesting, far past the interpreter's recursion limit


def deep_run_folder(folder: Path) -> None:
    folder.mkdir()
    (folder / "results.jsonl").write_text("[" * DEEP + "]" * DEEP + "\n")


SCENARIO = "--scenario=scenario.toml"
SC = "ERROR: conformance: {here}/scenario.toml rule"
SECONDS_NOT_FINITE = " 1: seconds must be a finite, non-negative number, got {}"
NEVER_FIRES = "an empty list matches nothing, so the rule could never fire (leave the field out to match any)"


def as_is(text: str) -> str:
    """Text for a Case pattern that means itself: a '[' is no fnmatch class, a brace no format field."""
    return text.replace("[", "[[]").replace("{", "{{").replace("}", "}}")


def refused_rule(body: str, pattern: str, *args: str) -> Case:
    """A scenario of one rule (the run has the default 4 virtual devices); ``pattern`` follows "rule"."""
    return Case((SCENARIO, *args), SC + as_is(pattern), scenario=scenario_text(body))


BAD_INPUTS = {
    # backend, from each source
    "backend-cli": Case(
        ("--backend=mpi",),
        "ERROR: conformance: command-line option --backend: unknown backend 'mpi'; choose one of auto, gloo, nccl",
    ),
    "backend-env": Case(
        env={"CONFORMANCE_BACKEND": "mpi"},
        pattern="ERROR: conformance: environment variable CONFORMANCE_BACKEND: unknown backend 'mpi'*",
    ),
    "backend-ini": Case(
        ini="conformance_backend = mpi",
        pattern="ERROR: conformance: ini key conformance_backend in {ini}: unknown backend 'mpi'*",
    ),
    "backend-nccl-without-gpu": Case(
        ("--backend=nccl",),
        "ERROR: conformance: command-line option --backend: the nccl backend needs GPUs, and none was found (*)",
    ),
    # timeouts
    "case-timeout-abc": Case(
        ("--case-timeout=abc",), "ERROR: conformance: command-line option --case-timeout: 'abc' is not a number"
    ),
    "op-timeout-zero": Case(
        ("--op-timeout=0",),
        "ERROR: conformance: command-line option --op-timeout: '0' must be a positive, finite number of seconds",
    ),
    "init-timeout-negative": Case(
        ("--init-timeout=-3",),
        "ERROR: conformance: command-line option --init-timeout: '-3' must be a positive, finite number of seconds",
    ),
    "grace-nan": Case(
        ("--grace=nan",),
        "ERROR: conformance: command-line option --grace: 'nan' must be a positive, finite number of seconds",
    ),
    "grace-inf-env": Case(
        env={"CONFORMANCE_GRACE": "inf"},
        pattern="ERROR: conformance: environment variable CONFORMANCE_GRACE: 'inf' must be a positive, finite*",
    ),
    "case-timeout-ini": Case(
        ini="conformance_case_timeout = soon",
        pattern="ERROR: conformance: ini key conformance_case_timeout in {ini}: 'soon' is not a number",
    ),
    # device counts
    "virtual-devices-zero": Case(
        ("--virtual-devices=0",),
        "ERROR: conformance: command-line option --virtual-devices: '0' must be a positive whole number",
    ),
    "virtual-devices-two": Case(
        ("--virtual-devices=two",),
        "ERROR: conformance: command-line option --virtual-devices: 'two' is not a whole number",
    ),
    "virtual-devices-too-many": Case(
        ("--virtual-devices=100000",),
        "ERROR: conformance: command-line option --virtual-devices: '100000' devices is more than the 32 one "
        "node's plan takes",
    ),
    "virtual-devices-env-fraction": Case(
        env={"CONFORMANCE_VIRTUAL_DEVICES": "2.5"},
        pattern="ERROR: conformance: environment variable CONFORMANCE_VIRTUAL_DEVICES: '2.5' is not a whole number",
    ),
    "expect-gpus-zero": Case(
        ("--expect-gpus=0",),
        "ERROR: conformance: command-line option --expect-gpus: '0' must be a positive whole number",
    ),
    "expect-gpus-negative": Case(
        ("--expect-gpus=-1",),
        "ERROR: conformance: command-line option --expect-gpus: '-1' must be a positive whole number",
    ),
    "expect-gpus-word-env": Case(
        env={"CONFORMANCE_EXPECT_GPUS": "eight"},
        pattern="ERROR: conformance: environment variable CONFORMANCE_EXPECT_GPUS: 'eight' is not a whole number",
    ),
    "bandwidth-floor-without-rate": Case(
        ("--bandwidth-floor=SYS",),
        "ERROR: conformance: command-line option --bandwidth-floor: 'SYS' is not CLASS=GBPS (e.g. NV18=300 or SYS=10)",
    ),
    "bandwidth-floor-unknown-class": Case(
        ("--bandwidth-floor=NVL=10",),
        "ERROR: conformance: command-line option --bandwidth-floor: 'NVL=10': unknown link class 'NVL'; classes are "
        "NV<n>, PIX, PXB, PHB, NODE, SYS",
    ),
    "bandwidth-floor-negative-env": Case(
        env={"CONFORMANCE_BANDWIDTH_FLOOR": "NV18=300;SYS=-4"},
        pattern="ERROR: conformance: environment variable CONFORMANCE_BANDWIDTH_FLOOR: 'SYS=-4': the floor must be "
        "a positive number of GB/s",
    ),
    "slow-ratio-above-one": Case(
        ("--slow-ratio=1.5",),
        "ERROR: conformance: command-line option --slow-ratio: '1.5' must be a ratio above 0 and at most 1",
    ),
    # deadline layers: in-rank timeouts must be shorter than the watchdog's
    "init-timeout-equals-step-timeout": Case(
        ("--init-timeout=30",),
        "ERROR: conformance: command-line option --init-timeout: init-timeout 30s must be shorter than "
        "step-timeout 30s (default), so the in-rank timeout fires before the watchdog",
    ),
    "init-timeout-above-step-timeout-ini": Case(
        ini="conformance_step_timeout = 10",
        pattern="ERROR: conformance: default: init-timeout 20s must be shorter than "
        "step-timeout 10s (ini key conformance_step_timeout in {ini})*",
    ),
    "op-timeout-above-case-timeout": Case(
        ("--case-timeout=10", "--init-timeout=5", "--op-timeout=20"),
        "ERROR: conformance: command-line option --op-timeout: op-timeout 20s must be shorter than "
        "case-timeout 10s (command-line option --case-timeout)*",
    ),
    "case-timeout-env-below-default-init": Case(
        env={"CONFORMANCE_CASE_TIMEOUT": "15"},
        pattern="ERROR: conformance: default: init-timeout 20s must be shorter than "
        "case-timeout 15s (environment variable CONFORMANCE_CASE_TIMEOUT)*",
    ),
    # scenario files
    "scenario-missing": Case(
        ("--scenario=missing.toml",),
        "ERROR: conformance: command-line option --scenario: scenario file '{here}/missing.toml' "
        "cannot be read: No such file or directory (nor is it a shipped scenario: *)",
    ),
    "scenario-missing-env": Case(
        env={"CONFORMANCE_SCENARIO": "gone.toml"},
        pattern="ERROR: conformance: environment variable CONFORMANCE_SCENARIO: scenario file "
        "'{here}/gone.toml' cannot be read: No such file or directory (nor is it a shipped scenario: *)",
    ),
    "scenario-missing-ini": Case(
        ini="conformance_scenario = nowhere.toml",
        pattern="ERROR: conformance: ini key conformance_scenario in {ini}: scenario file "
        "'{here}/nowhere.toml' cannot be read: No such file or directory (nor is it a shipped scenario: *)",
    ),
    "scenario-dev-zero": Case(  # endless: read until the kernel's OOM killer stopped it
        ("--scenario=/dev/zero",),
        "ERROR: conformance: command-line option --scenario: scenario file '/dev/zero' is a character device, not a "
        "regular file",
    ),
    "scenario-fifo": Case(  # no writer: the read would wait for ever
        ("--scenario=pipe.toml",),
        "ERROR: conformance: command-line option --scenario: scenario file '{here}/pipe.toml' is a named pipe (FIFO), "
        "not a regular file",
        setup=lambda here: os.mkfifo(here / "pipe.toml"),
    ),
    "topology-file-too-large": Case(
        ("--topology-file=huge.json",),
        "ERROR: conformance: command-line option --topology-file: topology file '{here}/huge.json' is over 16 MiB, "
        "the most the suite reads of such a file",
        setup=lambda here: (here / "huge.json").write_bytes(b" " * (17 << 20)),
    ),
    # nested deeper than any reader follows (issue 51): one line, never a RecursionError
    "topology-file-nested-deep": Case(
        ("--topology-file=deep.json",),
        "ERROR: conformance: command-line option --topology-file: topology file '{here}/deep.json' is not a "
        "topology: nested deeper than 64 levels",
        setup=lambda here: (here / "deep.json").write_text("[" * DEEP + "]" * DEEP),
    ),
    "scenario-nested-deep": Case(
        (SCENARIO,),
        "ERROR: conformance: command-line option --scenario: scenario file '{here}/scenario.toml' is nested deeper "
        "than 64 levels",
        scenario="rule = " + "[" * DEEP + "]" * DEEP + "\n",
    ),
    "rungs-file-nested-deep": Case(
        ("--env-rungs-file=rungs.toml",),
        "ERROR: conformance: command-line option --env-rungs-file: rungs file '{here}/rungs.toml' is nested deeper "
        "than 64 levels",
        setup=lambda here: (here / "rungs.toml").write_text("rung = " + "{a = " * DEEP + "1" + "}" * DEEP + "\n"),
    ),
    "baseline-nested-deep": Case(
        ("--baseline=base",),
        "ERROR: conformance: command-line option --baseline: {here}/base: no readable record "
        "({here}/base/results.jsonl: line 1 is nested deeper than 64 levels; skipped)",
        setup=lambda here: deep_run_folder(here / "base"),
    ),
    "scenario-not-toml": Case(
        (SCENARIO,),
        "ERROR: conformance: command-line option --scenario: scenario file '{here}/scenario.toml' is not valid TOML: *",
        scenario="effect = hang\nthis is not toml",
    ),
    "scenario-unknown-effect": Case(
        (SCENARIO,),
        SC + " 1: unknown effect 'explode'; choose one of hang, device_hang, crash, error, wrong_data, oom, slow, "
        "slow_link",
        scenario=scenario_text('effect = "explode"'),
    ),
    "scenario-unknown-phase": Case(
        (SCENARIO,),
        SC + " 2: unknown phase 'lunch'; choose one of start, control, init, probe, verify, teardown",
        scenario=scenario_text('effect = "hang"', 'effect = "error"\nphase = "lunch"'),
    ),
    "scenario-unknown-field": Case(
        (SCENARIO,),
        SC + " 1: unknown field 'colour' (known fields: *)",
        scenario=scenario_text('effect = "hang"\ncolour = "red"'),
    ),
    "scenario-field-not-for-effect": Case(
        (SCENARIO,),
        SC + " 1: field 'signal' does not apply to effect 'hang'",
        scenario=scenario_text('effect = "hang"\nsignal = "SIGKILL"'),
    ),
    "scenario-unknown-signal": Case(
        (SCENARIO,),
        SC + " 1: unknown signal 'SIGFOO'",
        scenario=scenario_text('effect = "crash"\nsignal = "SIGFOO"'),
    ),
    "scenario-effect-missing": refused_rule(
        'phase = "probe"',
        " 1: effect is missing; choose one of hang, device_hang, crash, error, wrong_data, oom, slow, slow_link",
    ),
    "scenario-name-not-a-string": Case(
        (SCENARIO,),
        "ERROR: conformance: {here}/scenario.toml: " + as_is("[scenario] name must be a string, got 3"),
        scenario='[scenario]\nname = 3\n[[rule]]\neffect = "hang"\n',
    ),
    "scenario-signal-number": refused_rule(
        'effect = "crash"\nsignal = 11', " 1: signal must be a name such as 'SIGSEGV', got 11"
    ),
    # a slow step's seconds: finite, non-negative, and shorter than the whole case
    "scenario-seconds-nan": refused_rule('effect = "slow"\nseconds = nan', SECONDS_NOT_FINITE.format("nan")),
    "scenario-seconds-inf": refused_rule('effect = "slow"\nseconds = inf', SECONDS_NOT_FINITE.format("inf")),
    "scenario-seconds-negative": refused_rule('effect = "slow"\nseconds = -0.5', SECONDS_NOT_FINITE.format("-0.5")),
    "scenario-seconds-true": refused_rule('effect = "slow"\nseconds = true', SECONDS_NOT_FINITE.format("True")),
    "scenario-seconds-text": refused_rule('effect = "slow"\nseconds = "5"', SECONDS_NOT_FINITE.format("'5'")),
    "scenario-seconds-1e308": refused_rule(
        'effect = "slow"\nseconds = 1e308',
        " 1 seconds: 1e+308 s is not shorter than the whole case may last (case-timeout 120 s, default), so the "
        'sleep could never end; use effect = "hang" for a rank that never returns',
    ),
    "scenario-seconds-beyond-case-timeout": refused_rule(
        'effect = "slow"\nseconds = 45',
        " 1 seconds: 45 s is not shorter than the whole case may last (case-timeout 30 s, command-line option "
        "--case-timeout), so the sleep could never end*",
        "--case-timeout=30",
    ),
    # ranks: whole numbers of the largest case this run has (one rank per device)
    "scenario-rank-outside-world": refused_rule(
        'ranks = [1, 99]\neffect = "hang"',
        " 1 ranks: rank 99 is outside every case of this run: the largest has 4 ranks (0 to 3, one per device)",
    ),
    "scenario-rank-outside-world-of-two": refused_rule(
        'effect = "hang"\nranks = [2]',
        " 1 ranks: rank 2 is outside every case of this run: the largest has 2 ranks (0 to 1, one per device)",
        "--virtual-devices=2",
    ),
    "scenario-rank-huge": refused_rule(
        'effect = "hang"\nranks = [9223372036854775807]',
        " 1 ranks: rank 9223372036854775807 is outside every case of this run: the largest has 4 ranks*",
    ),
    "scenario-rank-negative": refused_rule(
        'effect = "hang"\nranks = [-1]', " 1 ranks: rank -1 is negative; ranks count from 0"
    ),
    "scenario-rank-not-int": refused_rule(
        'effect = "hang"\nranks = [1.0]', " 1 ranks: expected a list of int, got [1.0]"
    ),
    "scenario-rank-text": refused_rule('effect = "hang"\nranks = ["1"]', " 1 ranks: expected a list of int, got ['1']"),
    # names: what the run's topology, the ranks and the plan know
    "scenario-device-unknown": refused_rule(
        'effect = "hang"\ndevices = ["gpu0"]',
        " 1 devices: no device 'gpu0'; this run's topology has cpu0, cpu1, cpu2, cpu3",
    ),
    "scenario-probe-unknown": refused_rule(
        'effect = "hang"\nprobes = ["all_reduce", "allreduce"]',
        " 1 probes: unknown probe 'allreduce'; the ranks know all_gather, all_reduce, all_to_all, barrier, *",
    ),
    "scenario-link-unknown": refused_rule(
        'effect = "hang"\nlinks = ["NVLINK"]',
        " 1 links: unknown link class 'NVLINK'; link classes are NV<n>, PIX, PXB, PHB, NODE, SYS, CPU, NET, ?",
    ),
    "scenario-set-unknown": refused_rule(
        'effect = "hang"\nsets = ["evens"]',
        " 1 sets: unknown device-set kind 'evens'; the plan makes all, single, pair, last_half, every_other, *",
    ),
    # list fields: a list, of the right type, not empty
    "scenario-ranks-not-a-list": refused_rule('effect = "hang"\nranks = 1', " 1 ranks: expected a list of int, got 1"),
    "scenario-devices-ints": refused_rule(
        'effect = "hang"\ndevices = [0, 1]', " 1 devices: expected a list of str, got [0, 1]"
    ),
    "scenario-probes-string": refused_rule(
        'effect = "hang"\nprobes = "all_reduce"', " 1 probes: expected a list of str, got 'all_reduce'"
    ),
    "scenario-links-ints": refused_rule('effect = "hang"\nlinks = [4]', " 1 links: expected a list of str, got [4]"),
    "scenario-sets-string": refused_rule('effect = "hang"\nsets = "all"', " 1 sets: expected a list of str, got 'all'"),
    "scenario-probes-empty": refused_rule('effect = "hang"\nprobes = []', f" 1 probes: {NEVER_FIRES}"),
    "scenario-ranks-empty": refused_rule('effect = "hang"\nranks = []', f" 1 ranks: {NEVER_FIRES}"),
    "scenario-when-env-number": refused_rule(
        'effect = "hang"\nwhen_env = { NCCL_P2P_DISABLE = 1 }',
        " 1 when_env: expected a table of VARIABLE = \"value\" strings, got {'NCCL_P2P_DISABLE': 1}",
    ),
    "scenario-unless-env-string": refused_rule(
        'effect = "hang"\nunless_env = "NCCL_P2P_DISABLE=1"',
        " 1 unless_env: expected a table of VARIABLE = \"value\" strings, got 'NCCL_P2P_DISABLE=1'",
    ),
    "scenario-wrong-data-not-at-verify": Case(
        (SCENARIO,),
        SC + " 1: *wrong_data*'probe'*",  # names the effect and the phase it was given
        scenario=scenario_text('effect = "wrong_data"\nphase = "probe"'),
    ),
    # reports dir
    "reports-dir-under-regular-file": Case(
        ("--reports-dir=plain-file/reports",),
        "ERROR: conformance: command-line option --reports-dir: reports dir '{here}/plain-file/reports' "
        "cannot be written: Not a directory",
        setup=make_regular_file,
    ),
    "reports-dir-is-regular-file": Case(
        ("--reports-dir=plain-file",),
        "ERROR: conformance: command-line option --reports-dir: reports dir '{here}/plain-file' "
        "cannot be written: File exists",
        setup=make_regular_file,
    ),
    "backend-override-ini": Case(
        ("-o", "conformance_backend=mpi"),
        "ERROR: conformance: command-line option -o conformance_backend: unknown backend 'mpi'*",
    ),
    "reports-dir-empty": Case(
        ("--reports-dir=",),
        "ERROR: conformance: command-line option --reports-dir: an empty path is not allowed",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_refused_before_any_case(
    case: Case,
    pytester: pytest.Pytester,
    run_suite: Callable[..., pytest.RunResult],
    monkeypatch: pytest.MonkeyPatch,
    existing: Existing,
    collective_file: Path,
) -> None:
    here = pytester.path.resolve()
    ini = pytester.makeini(f"[pytest]\n{case.ini}\n").resolve() if case.ini else None
    if case.scenario is not None:
        (here / "scenario.toml").write_text(case.scenario)
    if case.setup is not None:
        case.setup(here)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    result = run_suite(*case.args, collective_file.name, timeout=60)
    assert_refused(result, case.pattern.format(here=here, ini=ini), existing)
    if case.setup is make_regular_file:
        assert (here / "plain-file").read_text() == "not a folder\n"


def test_good_input_runs_and_records(
    run_suite: Callable[..., pytest.RunResult], existing: Existing, collective_file: Path
) -> None:
    """The control for the checks above: the same file with good settings runs ranks and records."""
    result = run_suite("--virtual-devices=2", collective_file.name, timeout=90)
    result.assert_outcomes(passed=1)
    assert existing.file.read_bytes() == existing.content
    latest = existing.reports_dir / "latest"
    assert latest.is_symlink()
    records = (latest / "results.jsonl").read_text().splitlines()
    assert len(records) == 1
    assert '"verdict": "pass"' in records[0]
    assert sorted(p.name for p in existing.reports_dir.iterdir()) == sorted(
        ["old-run", "latest", str(latest.readlink())]
    )


SET_WITH_LINKS_TEST = """
from conformance.plan.matrix import all_devices

def test_case(conformance_case, conformance):
    conformance_case("all_reduce", all_devices(conformance.topology)[0], sizes=[4])
"""
EVERY_FILTER = (
    'effect = "error"\nphase = "verify"\nranks = [1]\ndevices = ["cpu1"]\nprobes = ["all_reduce"]\nlinks = ["CPU"]\n'
    'sets = ["all"]\nwhen_env = { CONFORMANCE_TEST_FLAG = "on" }\nmessage = "every filter matched"'
)


def test_good_scenario_runs_and_its_rule_fires(
    pytester: pytest.Pytester,
    run_suite: Callable[..., pytest.RunResult],
    monkeypatch: pytest.MonkeyPatch,
    existing: Existing,
) -> None:
    """The control for the scenario checks: a rank, device, probe, link class and set kind this run has are accepted.

    The rule fires (the case is an error on rank 1), so each value it names matched a real case.
    """
    pytester.makepyfile(test_case=SET_WITH_LINKS_TEST)
    slow = 'effect = "slow"\nphase = "start"\nseconds = 0.1'
    (pytester.path / "scenario.toml").write_text(scenario_text(slow, EVERY_FILTER))
    monkeypatch.setenv("CONFORMANCE_TEST_FLAG", "on")
    result = run_suite(SCENARIO, "--virtual-devices=2", "test_case.py", timeout=90)
    result.assert_outcomes(failed=1)
    assert existing.file.read_bytes() == existing.content
    (record,) = read_records(existing.reports_dir)
    assert record["verdict"] == "error", record["summary"]
    assert record["root_cause"]["rank"] == 1
    assert "every filter matched" in record["summary"], record["summary"]


HEADER = "conformance: run *, backend gloo, {n} devices: {names}"


def header(n: int) -> str:
    return HEADER.format(n=n, names=", ".join(f"cpu{i}" for i in range(n)))


def test_priority_command_line_over_env_over_ini_over_default(
    pytester: pytest.Pytester,
    run_suite: Callable[..., pytest.RunResult],
    monkeypatch: pytest.MonkeyPatch,
    collective_file: Path,
) -> None:
    def devices_line(*args: str) -> pytest.RunResult:
        result = run_suite("--collect-only", *args, collective_file.name, timeout=60)
        assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
        return result

    # default
    devices_line().stdout.fnmatch_lines([header(4)])
    # ini beats default
    pytester.makeini("[pytest]\nconformance_virtual_devices = 2\n")
    devices_line().stdout.fnmatch_lines([header(2)])
    # env beats ini
    monkeypatch.setenv("CONFORMANCE_VIRTUAL_DEVICES", "3")
    devices_line().stdout.fnmatch_lines([header(3)])
    # command line beats env
    result = devices_line("--virtual-devices=4")
    result.stdout.fnmatch_lines([header(4)])
    result.stdout.no_fnmatch_line("*backend gloo, 3 devices*")
    # and back down: drop the command line -> env, drop env -> ini
    devices_line().stdout.fnmatch_lines([header(3)])
    monkeypatch.delenv("CONFORMANCE_VIRTUAL_DEVICES")
    devices_line().stdout.fnmatch_lines([header(2)])


def test_priority_bad_lower_value_is_named_by_the_winner(
    pytester: pytest.Pytester,
    run_suite: Callable[..., pytest.RunResult],
    monkeypatch: pytest.MonkeyPatch,
    existing: Existing,
    collective_file: Path,
) -> None:
    """A bad value is reported with the source that actually won, not a lower one."""
    ini = pytester.makeini("[pytest]\nconformance_backend = gloo\n").resolve()
    monkeypatch.setenv("CONFORMANCE_BACKEND", "tcp")
    result = run_suite(collective_file.name, timeout=60)
    assert_refused(
        result, "ERROR: conformance: environment variable CONFORMANCE_BACKEND: unknown backend 'tcp'*", existing
    )
    result = run_suite("--backend=ucc", collective_file.name, timeout=60)
    assert_refused(result, "ERROR: conformance: command-line option --backend: unknown backend 'ucc'*", existing)
    monkeypatch.delenv("CONFORMANCE_BACKEND")
    pytester.makeini("[pytest]\nconformance_backend = smoke-signals\n")
    result = run_suite(collective_file.name, timeout=60)
    assert_refused(
        result, f"ERROR: conformance: ini key conformance_backend in {ini}: unknown backend 'smoke-signals'*", existing
    )


# --------------------------------------------------------------------------------------------
# a fake GPU machine (tests/fake_nvml.py under the real nvidia-ml-py): CUDA_VISIBLE_DEVICES, NVML
# --------------------------------------------------------------------------------------------

H100_MIG_UUID = "MIG-c0ffee00-1111-4222-8333-444455556666"


def on_fake_gpus(monkeypatch: pytest.MonkeyPatch, visible: str, lost_while_listing: int | None = None) -> list[str]:
    """The next run sees the 8-GPU NVSwitch box with MIG instances on GPU 3; returns the ``-p`` option to pass."""
    import os

    import fake_nvml as nv

    migs = [nv.FakeMig(f"{H100_MIG_UUID[:-1]}{slot}", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40448) for slot in "56"]
    machine = nv.with_mig(nv.nvswitch_box(), 3, migs)
    if lost_while_listing is not None:
        machine.failures.append(nv.Failure("nvmlDeviceGetUUID", nv.ERROR_GPU_IS_LOST, gpu=lost_while_listing))
    tests = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv(nv.MACHINE_VARIABLE, machine.to_json())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    return ["-p", "fake_nvml"]


GPU3_H100 = "GPU 3 (NVIDIA H100 80GB HBM3, GPU-a1b2c3d3-5e6f-7a8b-9c0d-1e2f3a4b5c63)"
H100_GPUS = "8 GPUs (NVIDIA H100 80GB HBM3): " + ", ".join(f"{i} GPU-a1b2c3d{i}-..." for i in range(8))


@pytest.mark.parametrize(
    ("visible", "reason"),
    [(f"0,{H100_MIG_UUID}",
      f"CUDA_VISIBLE_DEVICES='0,{H100_MIG_UUID}': entry '{H100_MIG_UUID}' is a MIG instance of {GPU3_H100}; "
      "this suite tests whole GPUs (NCCL has no P2P between MIG instances): list GPUs by index or GPU- UUID"),
     ("0,8", f"CUDA_VISIBLE_DEVICES='0,8': entry '8' matches no GPU; this machine has {H100_GPUS}")],
    ids=["mig-instance", "unknown-index"],
)  # fmt: skip
def test_bad_cuda_visible_devices_on_a_gpu_machine_is_refused(
    visible: str,
    reason: str,
    run_suite: Callable[..., pytest.RunResult],
    monkeypatch: pytest.MonkeyPatch,
    existing: Existing,
    collective_file: Path,
) -> None:
    """Not a green CPU run: exit status 4 and one line naming the entry and what the machine has."""
    plugins = on_fake_gpus(monkeypatch, visible)
    result = run_suite(*plugins, "--collect-only", collective_file.name, timeout=60)
    assert_refused(result, f"ERROR: conformance: *{reason}", existing)
    errors = [line for line in result.stderr.lines if line.strip()]
    assert len(errors) == 1 and errors[0].endswith(reason), result.stderr.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_nvml_that_cannot_list_its_gpus_is_refused(
    run_suite: Callable[..., pytest.RunResult],
    monkeypatch: pytest.MonkeyPatch,
    existing: Existing,
    collective_file: Path,
) -> None:
    plugins = on_fake_gpus(monkeypatch, "0,1", lost_while_listing=5)
    result = run_suite(*plugins, "--collect-only", collective_file.name, timeout=60)
    assert_refused(
        result,
        "ERROR: conformance: *NVML is loaded but listing the GPUs failed: GPU is lost (nvmlDeviceGetUUID of GPU 5); "
        "fix the driver, or run on CPU with --backend gloo",
        existing,
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_good_cuda_visible_devices_on_a_gpu_machine(
    run_suite: Callable[..., pytest.RunResult], monkeypatch: pytest.MonkeyPatch, collective_file: Path
) -> None:
    """The control for the two above: the same fake machine, whole GPUs listed, collects."""
    plugins = on_fake_gpus(monkeypatch, "GPU-a1b2c3d3, 6")
    result = run_suite(*plugins, "--collect-only", collective_file.name, timeout=60)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["conformance: run *, backend nccl, 2 devices: gpu0, gpu1 (NVIDIA H100 80GB HBM3)"])
