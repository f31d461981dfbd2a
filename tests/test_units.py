"""Fast unit tests of the harness's parts, without ranks.

Settings, scenarios, verdicts, records, the test-id matrix and the topology (NVML through a fake
``pynvml``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import types
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conformance.common import jsonl
from conformance.common.suite import shipped_scenarios
from conformance.discover import nvml_topology
from conformance.discover.topology import Device, DeviceSelectionError, Topology, cpu_topology
from conformance.discover.topology_source import discover
from conformance.plan.matrix import DeviceSet, Rung, all_devices, barrier_sets, build_ladder, each_device, each_pair
from conformance.plan.parametrize import Plan
from conformance.rank.scenario import Placement, Rule, ScenarioError, load_scenario, parse_rule
from conformance.record import results
from conformance.settings import SETTINGS, SettingError, Settings, resolve
from conformance.verdict.decision import RankReport, decide, exit_label

# --------------------------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------------------------

EFFECT_NAMES = "hang, device_hang, crash, error, wrong_data, oom, slow, slow_link"


class StubConfig:
    """The few parts of ``pytest.Config`` that :func:`resolve` reads."""

    def __init__(
        self,
        root: Path,
        cli: Mapping[str, str] | None = None,
        ini: Mapping[str, str] | None = None,
        inipath: Path | None = None,
        invocation_dir: Path | None = None,
    ) -> None:
        self._cli = {f"conformance_{k}": v for k, v in (cli or {}).items()}
        self._ini = {f"conformance_{k}": v for k, v in (ini or {}).items()}
        self.inipath = inipath
        self.rootpath = root
        self.invocation_params = types.SimpleNamespace(dir=invocation_dir or root)

    def getoption(self, dest: str) -> Any:
        return self._cli.get(dest)

    def getini(self, key: str) -> Any:
        return self._ini.get(key, "")


def resolve_with(root: Path, cli: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
                 ini: Mapping[str, str] | None = None, inipath: Path | None = None) -> Settings:  # fmt: skip
    config = StubConfig(root, cli=cli, ini=ini, inipath=inipath)
    return resolve(config, environ=dict(env or {}))  # type: ignore[arg-type]


def test_settings_defaults(tmp_path: Path) -> None:
    s = resolve_with(tmp_path)
    timeouts = (s.init_timeout, s.op_timeout, s.step_timeout, s.case_timeout, s.grace)
    assert (s.backend, s.virtual_devices, timeouts) == ("auto", 4, (20.0, 20.0, 30.0, 120.0, 3.0))
    assert s.scenario is None
    assert s.reports_dir == (tmp_path / "reports").resolve()
    assert s.reports_dir.is_dir()
    assert list(s.reports_dir.iterdir()) == []  # the write check cleans up after itself
    assert all(s.source(x.name) == "default" for x in SETTINGS)


def test_settings_priority_and_sources(tmp_path: Path) -> None:
    ini_file = tmp_path / "tox.ini"
    ini = {"virtual_devices": "2", "grace": "5", "backend": "gloo"}
    env = {"CONFORMANCE_VIRTUAL_DEVICES": "3", "CONFORMANCE_GRACE": "6"}
    cli = {"virtual_devices": "4"}
    s = resolve_with(tmp_path, cli=cli, env=env, ini=ini, inipath=ini_file)
    assert (s.virtual_devices, s.grace, s.backend, s.case_timeout) == (4, 6.0, "gloo", 120.0)
    assert s.source("virtual_devices") == "command-line option --virtual-devices"
    assert s.source("grace") == "environment variable CONFORMANCE_GRACE"
    assert s.source("backend") == f"ini key conformance_backend in {ini_file}"
    assert s.source("case_timeout") == "default"
    s = resolve_with(tmp_path, env=env, ini=ini, inipath=ini_file)
    assert s.virtual_devices == 3
    s = resolve_with(tmp_path, ini=ini, inipath=ini_file)
    assert (s.virtual_devices, s.grace) == (2, 5.0)


def test_settings_relative_paths(tmp_path: Path) -> None:
    ini_dir = tmp_path / "project"
    ini_dir.mkdir()
    s = resolve_with(tmp_path, ini={"reports_dir": "out", "scenario": "faults.toml"}, inipath=ini_dir / "tox.ini")
    assert s.reports_dir == (ini_dir / "out").resolve()  # relative to the ini file's folder
    assert s.scenario == (ini_dir / "faults.toml").resolve()
    s = resolve_with(tmp_path, env={"CONFORMANCE_REPORTS_DIR": "elsewhere"})
    assert s.reports_dir == (tmp_path / "elsewhere").resolve()  # relative to the invocation dir


def test_settings_backend_is_normalised(tmp_path: Path) -> None:
    assert resolve_with(tmp_path, cli={"backend": " GLOO "}).backend == "gloo"


@pytest.mark.parametrize(
    ("cli", "env", "ini", "message"),
    [
        ({"backend": "mpi"}, {}, {},
         "command-line option --backend: unknown backend 'mpi'; choose one of auto, gloo, nccl"),
        ({}, {"CONFORMANCE_BACKEND": "ucx"}, {},
         "environment variable CONFORMANCE_BACKEND: unknown backend 'ucx'; choose one of auto, gloo, nccl"),
        ({}, {}, {"backend": "mpi"},
         "ini key conformance_backend in {ini}: unknown backend 'mpi'; choose one of auto, gloo, nccl"),
        ({"case_timeout": "abc"}, {}, {}, "command-line option --case-timeout: 'abc' is not a number"),
        ({"op_timeout": "0"}, {}, {},
         "command-line option --op-timeout: '0' must be a positive, finite number of seconds"),
        ({"init_timeout": "-3"}, {}, {},
         "command-line option --init-timeout: '-3' must be a positive, finite number of seconds"),
        ({"grace": "nan"}, {}, {}, "command-line option --grace: 'nan' must be a positive, finite number of seconds"),
        ({}, {"CONFORMANCE_GRACE": "inf"}, {},
         "environment variable CONFORMANCE_GRACE: 'inf' must be a positive, finite number of seconds"),
        ({"virtual_devices": "0"}, {}, {},
         "command-line option --virtual-devices: '0' must be a positive whole number"),
        ({"virtual_devices": "two"}, {}, {}, "command-line option --virtual-devices: 'two' is not a whole number"),
        ({}, {}, {"virtual_devices": "2.5"},
         "ini key conformance_virtual_devices in {ini}: '2.5' is not a whole number"),
        ({"init_timeout": "30"}, {}, {},
         "command-line option --init-timeout: init-timeout 30s must be shorter than step-timeout 30s (default), "
         "so the in-rank timeout fires before the watchdog"),
        ({"case_timeout": "10", "init_timeout": "5"}, {"CONFORMANCE_OP_TIMEOUT": "12.5"}, {},
         "environment variable CONFORMANCE_OP_TIMEOUT: op-timeout 12.5s must be shorter than case-timeout 10s "
         "(command-line option --case-timeout), so the in-rank timeout fires before the watchdog"),
        ({"scenario": ""}, {}, {}, "command-line option --scenario: an empty path is not allowed"),
        ({"reports_dir": "  "}, {}, {}, "command-line option --reports-dir: an empty path is not allowed"),
    ],
)  # fmt: skip
def test_setting_errors(
    tmp_path: Path, cli: dict[str, str], env: dict[str, str], ini: dict[str, str], message: str
) -> None:
    ini_file = tmp_path / "tox.ini"
    with pytest.raises(SettingError) as caught:
        resolve_with(tmp_path, cli=cli, env=env, ini=ini, inipath=ini_file)
    assert str(caught.value) == message.format(ini=ini_file)


def test_setting_error_reports_dir_unwritable(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(SettingError) as caught:
        resolve_with(tmp_path, cli={"reports_dir": str(plain / "reports")})
    assert str(caught.value) == (
        f"command-line option --reports-dir: reports dir '{plain / 'reports'}' cannot be written: Not a directory"
    )
    with pytest.raises(SettingError) as caught:
        resolve_with(tmp_path, env={"CONFORMANCE_REPORTS_DIR": str(plain)})
    assert str(caught.value) == (
        f"environment variable CONFORMANCE_REPORTS_DIR: reports dir '{plain}' cannot be written: File exists"
    )
    assert plain.read_text() == "x"


# --------------------------------------------------------------------------------------------
# scenarios
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("effect", "phase"),
    [("wrong_data", "verify"), ("hang", "probe"), ("crash", "probe"), ("error", "probe"),
     ("oom", "probe"), ("slow", "probe")],
)  # fmt: skip
def test_rule_default_phase(effect: str, phase: str) -> None:
    rule = parse_rule({"effect": effect}, "f rule 1")
    assert rule == Rule(effect=effect, phase=phase)
    assert (rule.ranks, rule.devices, rule.probes) == (None, None, None)
    assert (rule.when_env, rule.unless_env) == ({}, {})
    assert (rule.ignore_sigterm, rule.signal, rule.message, rule.seconds) == (
        False, "SIGSEGV", "simulated failure", 0.0,
    )  # fmt: skip


def test_rule_all_fields() -> None:
    rule = parse_rule(
        {
            "effect": "crash", "phase": "init", "ranks": [1, 3], "devices": ["cpu1"],
            "probes": ["all_reduce", "barrier"], "when_env": {"NCCL_P2P_DISABLE": "0"},
            "unless_env": {"NCCL_IB_DISABLE": "1"}, "signal": "abrt",
        },
        "f rule 1",
    )  # fmt: skip
    assert rule == Rule(
        effect="crash", phase="init", ranks=(1, 3), devices=("cpu1",), probes=("all_reduce", "barrier"),
        when_env={"NCCL_P2P_DISABLE": "0"}, unless_env={"NCCL_IB_DISABLE": "1"}, signal="SIGABRT",
    )  # fmt: skip
    assert parse_rule({"effect": "slow", "seconds": 2}, "w").seconds == 2.0
    assert parse_rule({"effect": "hang", "ignore_sigterm": True}, "w").ignore_sigterm is True
    assert parse_rule({"effect": "oom", "message": "CUDA out of memory"}, "w").message == "CUDA out of memory"
    assert parse_rule({"effect": "crash", "signal": "SIGKILL"}, "w").signal == "SIGKILL"
    assert Rule.from_dict(rule.to_dict()) == rule


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("not a table", "W: a rule must be a table"),
        ({"phase": "probe"}, f"W: effect is missing; choose one of {EFFECT_NAMES}"),
        ({"effect": "explode"}, f"W: unknown effect 'explode'; choose one of {EFFECT_NAMES}"),
        ({"effect": "hang", "phase": "lunch"},
         "W: unknown phase 'lunch'; choose one of start, control, init, probe, verify, teardown"),
        ({"effect": "hang", "colour": "red"},
         "W: unknown field 'colour' (known fields: devices, effect, fraction, ignore_sigterm, links, message, net, "
         "p2p, phase, probes, ranks, refused, seconds, sets, signal, unless_env, when_env, wrong_barrier_device)"),
        ({"effect": "hang", "signal": "SIGKILL"}, "W: field 'signal' does not apply to effect 'hang'"),
        ({"effect": "wrong_data", "message": "x"}, "W: field 'message' does not apply to effect 'wrong_data'"),
        ({"effect": "crash", "signal": "SIGFOO"}, "W: unknown signal 'SIGFOO'"),
        ({"effect": "crash", "signal": "SIG_DFL"}, "W: unknown signal 'SIG_DFL'"),
        ({"effect": "hang", "ignore_sigterm": "yes"}, "W: ignore_sigterm must be true or false"),
        ({"effect": "error", "message": 3}, "W: message must be a string"),
        ({"effect": "crash", "signal": 11}, "W: signal must be a name such as 'SIGSEGV', got 11"),
        ({"effect": "slow", "seconds": -1}, "W: seconds must be a finite, non-negative number, got -1"),
        ({"effect": "slow", "seconds": True}, "W: seconds must be a finite, non-negative number, got True"),
        ({"effect": "slow", "seconds": float("nan")}, "W: seconds must be a finite, non-negative number, got nan"),
        ({"effect": "slow", "seconds": float("inf")}, "W: seconds must be a finite, non-negative number, got inf"),
        ({"effect": "slow", "seconds": "5"}, "W: seconds must be a finite, non-negative number, got '5'"),
        ({"effect": "hang", "ranks": [-1]}, "W ranks: rank -1 is negative; ranks count from 0"),
        ({"effect": "hang", "ranks": 1}, "W ranks: expected a list of int, got 1"),
        ({"effect": "hang", "ranks": [1.0]}, "W ranks: expected a list of int, got [1.0]"),
        ({"effect": "hang", "probes": []},
         "W probes: an empty list matches nothing, so the rule could never fire (leave the field out to match any)"),
        ({"effect": "hang", "links": ["SYS", 4]}, "W links: expected a list of str, got ['SYS', 4]"),
        ({"effect": "hang", "unless_env": "X=1"},
         "W unless_env: expected a table of VARIABLE = \"value\" strings, got 'X=1'"),
        ({"effect": "hang", "ranks": ["1"]}, "W ranks: expected a list of int, got ['1']"),
        ({"effect": "hang", "ranks": [True]}, "W ranks: expected a list of int, got [True]"),
        ({"effect": "hang", "devices": "cpu0"}, "W devices: expected a list of str, got 'cpu0'"),
        ({"effect": "hang", "when_env": {"X": 1}},
         "W when_env: expected a table of VARIABLE = \"value\" strings, got {'X': 1}"),
    ],
)  # fmt: skip
def test_rule_errors(raw: Any, message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_rule(raw, "W")
    assert str(caught.value) == message


def test_wrong_data_phase_error_names_the_phase_given() -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_rule({"effect": "wrong_data", "phase": "probe"}, "W")
    text = str(caught.value)
    assert text.startswith("W: wrong_data")
    assert "'probe'" in text, f"the message does not name the bad phase: {text}"


def test_load_scenario(tmp_path: Path) -> None:
    path = tmp_path / "two-faults.toml"
    path.write_text(
        '[scenario]\nname = "p2p off hang"\ndescription = "rank 1 hangs"\n'
        '[[rule]]\neffect = "hang"\nranks = [1]\n'
        '[[rule]]\neffect = "wrong_data"\nprobes = ["all_gather"]\n'
    )
    scenario = load_scenario(path, "command-line option --scenario")
    assert (scenario.name, scenario.description, scenario.path) == ("p2p off hang", "rank 1 hangs", str(path))
    assert scenario.rules == (
        Rule(effect="hang", phase="probe", ranks=(1,)),
        Rule(effect="wrong_data", phase="verify", probes=("all_gather",)),
    )
    bare = tmp_path / "bare.toml"
    bare.write_text('[[rule]]\neffect = "oom"\n')
    scenario = load_scenario(bare, "x")
    assert (scenario.name, scenario.description) == ("bare", "")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "SRC: scenario file '{p}' cannot be read: No such file or directory (nor is it a shipped scenario: "
               + ", ".join(shipped_scenarios()) + ")"),
        ("effect = hang", "SRC: scenario file '{p}' is not valid TOML: *"),
        ('rules = 1\n[[rule]]\neffect = "hang"\n',
         "{p}: unknown top-level key(s) ['rules']; expected [scenario] and [[rule]]"),
        ('[scenario]\nname = "x"\nauthor = "me"\n[[rule]]\neffect = "hang"\n',
         "{p}: [scenario] takes only name, description, topology and nccl_conf"),
        ('[scenario]\nname = "x"\n', "{p}: no [[rule]] tables; a scenario needs at least one rule or a topology"),
        ('[scenario]\nname = 5\n[[rule]]\neffect = "hang"\n', "{p}: [scenario] name must be a string, got 5"),
        ('[[rule]]\neffect = "hang"\n[[rule]]\neffect = "crash"\nsignal = "SIGNOPE"\n',
         "{p} rule 2: unknown signal 'SIGNOPE'"),
    ],
)  # fmt: skip
def test_load_scenario_errors(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "s.toml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path, "SRC")
    expected = message.format(p=path)
    if expected.endswith("*"):
        assert str(caught.value).startswith(expected[:-1])
    else:
        assert str(caught.value) == expected


def applies(rule: Rule, rank: int = 0, device: str = "cpu0", probe: str = "all_reduce", phase: str = "probe",
            environ: Mapping[str, str] | None = None) -> bool:  # fmt: skip
    return rule.applies(Placement(rank, device, probe), phase, environ or {})


def test_rule_applies() -> None:
    any_rank = Rule("hang", "probe")
    assert applies(any_rank)
    assert applies(any_rank, rank=7, device="gpu3", probe="barrier")
    assert not applies(any_rank, phase="verify")

    ranked = Rule("hang", "probe", ranks=(1, 2))
    assert [applies(ranked, rank=r) for r in range(4)] == [False, True, True, False]

    on_device = Rule("hang", "probe", devices=("cpu1",))
    assert applies(on_device, device="cpu1") and not applies(on_device, device="cpu0")

    on_probe = Rule("hang", "probe", probes=("barrier",))
    assert applies(on_probe, probe="barrier") and not applies(on_probe, probe="all_reduce")

    when = Rule("hang", "probe", when_env={"A": "1", "B": "x"})
    assert applies(when, environ={"A": "1", "B": "x", "C": "z"})
    assert not applies(when, environ={"A": "1"})
    assert not applies(when, environ={"A": "0", "B": "x"})
    assert not applies(when)

    unless = Rule("hang", "probe", unless_env={"A": "1", "B": "x"})
    assert applies(unless)
    assert applies(unless, environ={"A": "1"})  # only when every variable matches is it suppressed
    assert applies(unless, environ={"A": "1", "B": "y"})
    assert not applies(unless, environ={"A": "1", "B": "x"})

    both = Rule("crash", "init", ranks=(0,), when_env={"NCCL_P2P_DISABLE": "0"}, unless_env={"NCCL_IB_DISABLE": "1"})
    assert applies(both, phase="init", environ={"NCCL_P2P_DISABLE": "0"})
    assert not applies(both, phase="init", environ={"NCCL_P2P_DISABLE": "0", "NCCL_IB_DISABLE": "1"})
    assert not applies(both, rank=1, phase="init", environ={"NCCL_P2P_DISABLE": "0"})


# --------------------------------------------------------------------------------------------
# verdicts
# --------------------------------------------------------------------------------------------


def rr(rank: int, status: str = "ok", **kw: Any) -> RankReport:
    values: dict[str, Any] = {
        "device": f"cpu{rank}", "pid": 1000 + rank, "phase": "probe", "step": "all_reduce", "phase_time": None,
        "progress": 4, "exit": 0, "seconds": 1.0,
    }  # fmt: skip
    values.update(kw)
    return RankReport(rank=rank, status=status, **values)


def ranks_of(reports: list[RankReport]) -> list[int]:
    return sorted(r.rank for r in reports)


def test_all_ok_passes() -> None:
    d = decide([rr(0), rr(1), rr(2)])
    assert (d.verdict, d.root, d.victims, d.summary) == ("pass", None, [], "")


def test_wrong_data_beats_everything() -> None:
    reports = [
        rr(0, "crash", time=1.0, message="killed by SIGSEGV", exit="SIGSEGV"),
        rr(1, "error", time=2.0, error_type="RuntimeError", message="boom"),
        rr(2, "fail", time=5.0, phase="verify", error_type="WrongData", message="element 3: 2.0 != 6.0"),
        rr(3, "stopped", stopped_by="deadline", progress=1),
    ]
    d = decide(reports)
    assert d.verdict == "fail"
    assert d.root is reports[2]
    assert ranks_of(d.victims) == [0, 1, 3]
    assert d.summary == "rank 2 (cpu2) in verify (all_reduce): WrongData: element 3: 2.0 != 6.0"


def test_earliest_wrong_data_is_root() -> None:
    d = decide([rr(0, "fail", time=9.0), rr(1, "fail", time=3.0), rr(2)])
    assert d.verdict == "fail" and d.root is not None and d.root.rank == 1


def test_earliest_real_error_is_root_and_victims_are_not() -> None:
    reports = [
        rr(0, "error", time=1.0, message="Connection closed by peer"),  # earliest, but a victim
        rr(1, "error", time=12.0, error_type="RuntimeError", message="late error"),
        rr(2, "error", time=10.0, error_type="ValueError", message="the real one"),
        rr(3, "error", time=2.0, message="Timed out waiting 30000ms for recv operation"),
        rr(4),
    ]
    d = decide(reports)
    assert d.verdict == "error"
    assert d.root is reports[2]
    assert ranks_of(d.victims) == [0, 1, 3]
    assert d.summary == "rank 2 (cpu2) in probe (all_reduce): ValueError: the real one"


def test_crash_root_gives_crash() -> None:
    reports = [rr(0, "crash", time=4.0, message="killed by SIGSEGV", exit="SIGSEGV"), rr(1, "error", time=5.0,
               message="boom")]  # fmt: skip
    d = decide(reports)
    assert (d.verdict, d.root) == ("crash", reports[0])
    assert ranks_of(d.victims) == [1]


@pytest.mark.parametrize(
    "message",
    [
        "Connection closed by peer [127.0.0.1]:29500",
        "Timed out waiting 1800000ms for recv operation to complete",
        "Socket Timeout",
        "Connection reset by peer",
        "Broken pipe",
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)",
        "NCCL communicator was aborted on rank 0",
        "wait timeout after 30000ms",
    ],
)
def test_victim_patterns(message: str) -> None:
    assert rr(0, "error", message=message).victim
    assert rr(0, "crash", message=f"killed by SIGABRT; it last said: {message}").victim
    assert not rr(0, "ok", message=message).victim


@pytest.mark.parametrize(
    "message", ["CUDA error: an illegal memory access was encountered", "deliberate failure", "killed by SIGSEGV"]
)
def test_real_errors_are_not_victims(message: str) -> None:
    assert not rr(0, "error", message=message).victim
    assert not rr(0, "crash", message=message).victim


def test_only_victim_errors_is_a_hang_rooted_at_the_earliest() -> None:
    reports = [
        rr(0, "error", time=8.0, message="Timed out waiting for peer"),
        rr(1, "error", time=6.0, message="Connection closed by peer"),
    ]
    d = decide(reports)
    assert d.verdict == "hang"
    assert d.root is reports[1]
    assert ranks_of(d.victims) == [0]


def test_watchdog_stopped_ranks_hang_rooted_at_least_progressed() -> None:
    waiting = 'File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2, in all_reduce'
    reports = [
        rr(0, "stopped", stopped_by="deadline", progress=4, stack=waiting, phase_time=3.0),
        rr(1, "stopped", stopped_by="deadline", progress=2, phase="init", step="init_process_group(gloo)",
           stack='File "/x/probes.py", line 9, in spin', phase_time=1.0),
        rr(2, "stopped", stopped_by="deadline", progress=4, stack=waiting, phase_time=3.1),
        rr(3, "error", time=7.0, message="Connection reset by peer"),
    ]  # fmt: skip
    d = decide(reports)
    assert d.verdict == "hang"
    assert d.root is reports[1]
    assert ranks_of(d.victims) == [0, 2, 3]
    assert d.summary == "rank 1 (cpu1) in init (init_process_group(gloo)): made no progress and was stopped (deadline)"


def test_stopped_rank_not_waiting_in_a_collective_is_root() -> None:
    waiting = 'File "/torch/distributed/distributed_c10d.py", line 2, in barrier'
    reports = [
        rr(0, "stopped", stopped_by="deadline", stack=waiting),
        rr(1, "stopped", stopped_by="deadline", stack='File "/work/model.py", line 3, in step'),
    ]
    d = decide(reports)
    assert d.verdict == "hang" and d.root is reports[1]


def test_all_ranks_stuck_alike_has_no_root() -> None:
    waiting = 'File "/torch/distributed/distributed_c10d.py", line 2, in all_reduce'
    reports = [rr(r, "stopped", stopped_by="deadline", stack=waiting, phase_time=2.0 + r) for r in range(3)]
    d = decide(reports)
    assert d.verdict == "hang"
    assert d.root is None
    assert ranks_of(d.victims) == [0, 1, 2]
    assert d.summary == "ranks 0,1,2 all stuck in probe (all_reduce)"


def test_a_stuck_rank_that_issued_fewer_nccl_operations_is_the_root() -> None:
    """The second real-GPU run: both ranks' last phase line was 'send/recv 4B'.

    Only rank 0's flight recorder held the send and recv (3 entries); rank 1's held none: it never
    joined (the rule of torch's own analyser of these dumps).
    """
    waiting = 'File "/torch/distributed/distributed_c10d.py", line 2, in send'
    reports = [
        rr(0, "stopped", stopped_by="stalled", stack=waiting, step="send/recv 4B", collectives={"issued": 3}),
        rr(1, "stopped", stopped_by="stalled", stack=waiting, step="send/recv 4B", collectives={"issued": 0}),
    ]
    d = decide(reports)
    assert (d.verdict, d.root, ranks_of(d.victims)) == ("hang", reports[1], [0])
    assert d.summary == (
        "rank 1 (cpu1) in probe (send/recv 4B): made no progress and was stopped (stalled); it issued 0 "
        "operation(s) where rank 0 issued 3: they wait in one it never joined (flight recorder)"
    )
    # a rank without a dump leaves the counts out: stuck alike, as before
    reports[1].collectives = None
    assert decide(reports).root is None


def test_root_in_control_phase_is_inconclusive() -> None:
    reports = [
        rr(0, "error", time=1.0, phase="control", step="store check-in", error_type="RuntimeError", message="store"),
        rr(1, "error", time=2.0, phase="control", step="store check-in", message="Timed out waiting for store"),
    ]
    d = decide(reports)
    assert d.verdict == "inconclusive"
    assert d.root is reports[0]
    assert ranks_of(d.victims) == [1]


def test_all_stuck_in_control_is_inconclusive() -> None:
    reports = [rr(r, "stopped", stopped_by="deadline", phase="control", step="store check-in") for r in range(2)]
    d = decide(reports)
    assert (d.verdict, d.root) == ("inconclusive", None)


def test_skip() -> None:
    d = decide([rr(0, "skip", message="needs 2 GPUs"), rr(1, "skip", message="needs 2 GPUs")])
    assert (d.verdict, d.root, d.victims, d.summary) == ("skip", None, [], "needs 2 GPUs")


@pytest.mark.parametrize(
    ("code", "label"), [(-11, "SIGSEGV"), (-9, "SIGKILL"), (-6, "SIGABRT"), (0, 0), (1, 1), (None, None),
                        (-200, "signal 200")]
)  # fmt: skip
def test_exit_label(code: int | None, label: Any) -> None:
    assert exit_label(code) == label


# --------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------

WRITERS = 4
RECORDS_EACH = 200
PAYLOAD = "x" * 6000  # longer than PIPE_BUF, so unlocked writers could interleave


def _writer(path: str, writer: int) -> None:
    for i in range(RECORDS_EACH):
        jsonl.append_line(Path(path), {"writer": writer, "i": i, "payload": PAYLOAD})


def test_append_record_from_many_processes(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    data = path.read_bytes()
    assert data.endswith(b"\n")
    lines = data.decode().split("\n")[:-1]
    assert len(lines) == WRITERS * RECORDS_EACH
    seen = set()
    for line in lines:
        record = json.loads(line)
        assert record["payload"] == PAYLOAD
        seen.add((record["writer"], record["i"]))
    assert seen == {(w, i) for w in range(WRITERS) for i in range(RECORDS_EACH)}
    assert len(jsonl.read_lines(path).objects) == WRITERS * RECORDS_EACH


def test_read_records_skips_cut_off_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    jsonl.append_line(path, {"n": 1})
    jsonl.append_line(path, {"n": 2, "when": Path("/x")})  # default=str for odd values
    with path.open("a") as f:
        f.write('{"n": 3, "verdict": "pa')
    assert jsonl.read_lines(path).objects == [{"n": 1}, {"n": 2, "when": "/x"}]
    assert jsonl.read_lines(tmp_path / "missing.jsonl").objects == []


def test_jsonl_follower_reads_only_what_was_added(tmp_path: Path) -> None:
    path = tmp_path / "ladder.jsonl"
    follower = jsonl.JsonlFollower(path)
    assert follower.new_objects() == []  # no file yet
    jsonl.append_line(path, {"n": 1})
    jsonl.append_line(path, {"n": 2}, durable=False)
    assert follower.new_objects() == [{"n": 1}, {"n": 2}]
    assert follower.new_objects() == []
    with path.open("a") as f:
        f.write('{"n": 3}\n{"n": ')  # a writer in the middle of its line
    assert follower.new_objects() == [{"n": 3}]
    with path.open("a") as f:
        f.write("4}\n")
    assert follower.new_objects() == [{"n": 4}]


def test_point_latest_replaces_link(tmp_path: Path) -> None:
    results.point_latest(tmp_path, "run-a")
    results.point_latest(tmp_path, "run-b")
    assert os.readlink(tmp_path / "latest") == "run-b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


# --------------------------------------------------------------------------------------------
# matrix ids
# --------------------------------------------------------------------------------------------


def gpu(i: int, uuid: str | None = None) -> Device:
    return Device(name=f"gpu{i}", index=i, kind="gpu", uuid=uuid or f"GPU-{i:08d}", model="H100",
                  pci_bus_id=f"00000000:{i:02X}:00.0")  # fmt: skip


def test_device_set_ids_cpu() -> None:
    topo = cpu_topology(4)
    assert [s.id for s in all_devices(topo)] == ["all4-inherited"]
    assert [s.id for s in barrier_sets(topo)] == [
        "all4-inherited",
        "last_half-cpu2-cpu3-inherited",
        "every_other-cpu1-cpu3-inherited",
    ]
    assert [s.id for s in each_device(topo)] == [f"cpu{i}-inherited" for i in range(4)]
    pairs = each_pair(cpu_topology(3))
    assert [s.id for s in pairs] == ["cpu0-cpu1-inherited", "cpu0-cpu2-inherited", "cpu1-cpu2-inherited"]
    assert [s.link for s in pairs] == ["CPU"] * 3
    assert [s.id for s in all_devices(cpu_topology(1))] == ["all1-inherited"]
    assert [s.id for s in barrier_sets(cpu_topology(2))] == ["all2-inherited"]


def test_device_set_ids_gpu() -> None:
    gpus = tuple(gpu(i) for i in range(4))
    topo = Topology(kind="gpu", devices=gpus, source="nvml", links={"gpu0-gpu3": "SYS", "gpu0-gpu1": "NV12"})
    assert DeviceSet((gpus[0], gpus[3]), topo.link(gpus[0], gpus[3]), kind="pair").id == "gpu0-gpu3-SYS-inherited"
    assert [s.id for s in each_pair(topo)] == [  # class by class, each in rounds of disjoint pairs
        "gpu0-gpu1-NV12-inherited",
        "gpu0-gpu2-?-inherited",
        "gpu1-gpu3-?-inherited",
        "gpu1-gpu2-?-inherited",
        "gpu2-gpu3-?-inherited",
        "gpu0-gpu3-SYS-inherited",
    ]
    assert topo.link(gpus[3], gpus[0]) == "SYS"
    assert topo.link(gpus[0], gpus[1]) == "NV12"
    assert topo.link(gpus[1], gpus[2]) == "?"
    assert DeviceSet(gpus, "all").id == "all4-inherited"
    rung = Rung("p2p-off", {"NCCL_P2P_DISABLE": "1"}, unset_families=("NCCL_",))
    assert DeviceSet((gpus[0], gpus[3]), "SYS", rung, kind="pair").id == "gpu0-gpu3-SYS-p2p-off"
    assert rung.unset({"NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "0", "GLOO_X": "1"}) == ("NCCL_DEBUG",)


def test_worker_scope_is_the_test_id_less_its_rung() -> None:
    """What one xdist worker runs together: every rung of one device set, whatever the test."""
    gpus = tuple(gpu(i) for i in range(4))
    topo = Topology(kind="gpu", devices=gpus, source="nvml", links={})
    user = Rung("p2p-off", {"NCCL_P2P_DISABLE": "1"})
    plan = Plan(topo, build_ladder([(user, "test")]), "full")
    scope = plan.worker_scope
    assert scope("suites/test_pairs.py::test_pair_exchange[gpu0-gpu1-?-inherited]") == "gpu0-gpu1-?"
    assert scope("suites/test_pairs.py::test_peer_copy[gpu0-gpu1-?-p2p_level_nvl]") == "gpu0-gpu1-?"
    assert scope("suites/test_pairs.py::test_peer_copy[gpu0-gpu1-?-p2p-off]") == "gpu0-gpu1-?"
    assert scope("suites/test_collectives.py::test_broadcast[all4-clean]") == "all4"
    assert scope("suites/test_collectives.py::test_barrier_first[all4-clean-barrier]") == "all4-barrier"
    no_set = "suites/test_environment.py::test_open_file_limit"
    assert scope(no_set) == no_set
    assert scope("suites/test_collectives.py::test_world_of_one[gpu1-inherited]") != scope(
        "suites/test_collectives.py::test_world_of_one[gpu2-inherited]"
    )


# --------------------------------------------------------------------------------------------
# topology
# --------------------------------------------------------------------------------------------


def test_cpu_topology() -> None:
    topo = cpu_topology(3, note="why")
    assert topo.kind == "cpu" and topo.source == "virtual" and topo.note == "why"
    assert topo.devices == tuple(Device(name=f"cpu{i}", index=i, kind="cpu") for i in range(3))
    assert topo.by_name(["cpu2", "cpu0"]) == (topo.devices[2], topo.devices[0])
    assert len(topo.pairs()) == 3


def test_topology_json_round_trip() -> None:
    topo = Topology(kind="gpu", devices=(gpu(0), gpu(1)), source="nvml", note="n", links={"gpu0-gpu1": "NV4"})
    text = topo.to_json()
    back = Topology.from_json(text)
    assert back == topo
    assert isinstance(back.devices, tuple) and isinstance(back.devices[0], Device)
    assert back.to_json() == text
    cpu = cpu_topology(2, note="no GPU")
    assert Topology.from_json(cpu.to_json()) == cpu


FOUR = [gpu(0, "GPU-aaaa-0000"), gpu(1, "GPU-bbbb-1111"), gpu(2, "GPU-cccc-2222"), gpu(3, "GPU-dddd-3333")]


def renumbered(gpus: list[Device]) -> list[tuple[str, int, str | None]]:
    return [(g.name, g.index, g.uuid) for g in gpus]


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, [("gpu0", 0, "GPU-aaaa-0000"), ("gpu1", 1, "GPU-bbbb-1111"), ("gpu2", 2, "GPU-cccc-2222"),
                ("gpu3", 3, "GPU-dddd-3333")]),
        ("2,0", [("gpu0", 0, "GPU-cccc-2222"), ("gpu1", 1, "GPU-aaaa-0000")]),
        (" 3 , 1 ", [("gpu0", 0, "GPU-dddd-3333"), ("gpu1", 1, "GPU-bbbb-1111")]),
        ("GPU-dddd,GPU-bbbb-1111", [("gpu0", 0, "GPU-dddd-3333"), ("gpu1", 1, "GPU-bbbb-1111")]),
        ("1,GPU-cc", [("gpu0", 0, "GPU-bbbb-1111"), ("gpu1", 1, "GPU-cccc-2222")]),
        ("", []),
        ("-1", []),
    ],
)  # fmt: skip
def test_visible_filter(visible: str | None, expected: list[tuple[str, int, str]]) -> None:
    chosen = nvml_topology._visible_filter(list(FOUR), visible)
    assert renumbered(chosen) == expected
    if chosen:
        assert {g.pci_bus_id for g in chosen} <= {g.pci_bus_id for g in FOUR}


@pytest.mark.parametrize("visible", ["1,7,0", "GPU-zzzz,0"])
def test_visible_entry_matching_no_gpu_is_refused(visible: str) -> None:
    """CUDA would quietly stop at the bad entry; the suite refuses it (the run stops with exit 4)."""
    with pytest.raises(DeviceSelectionError, match="matches no GPU"):
        nvml_topology._visible_filter(list(FOUR), visible)


class UntouchableNVML(types.ModuleType):
    """A ``pynvml`` that fails the test if anything is asked of it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"pynvml.{name} was used")


def test_discover_gloo_never_asks_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", UntouchableNVML("pynvml"))
    found = discover("gloo", 2, environ={})
    assert (found.devices, found.note) == (cpu_topology(2).devices, "backend gloo chosen")  # no NVIDIA GPU here


def test_deadlines_text_counts_confirmed_hangs_apart() -> None:
    from conformance.summarise.summary import deadlines_text

    def stopped(*reasons: str | None) -> list[Any]:
        return [types.SimpleNamespace(stop_reason=r) for r in reasons]

    assert deadlines_text(stopped("stalled", None, "grace"), 3) == "deadlines paid: 1 (step deadline 3s)"
    assert deadlines_text(stopped("stalled", "confirm", "confirm", "deadline")) == (
        "deadlines paid: 2 (1 at the whole-case limit); 2 hang(s) confirmed sooner: 2 stuck where their class hung"
    )
    assert deadlines_text(stopped("small_step", "confirm", "small_step", "stalled"), 30) == (
        "deadlines paid: 1 (step deadline 30s); 3 hang(s) confirmed sooner: 1 stuck where their class hung, "
        "2 stuck in a small step"
    )


def test_a_rule_for_cases_nccl_refuses_fires_only_there() -> None:
    """``refused``: NCCL's own rule refuses a pair of the case (P2P disabled in NVML over NVLink), under its env."""
    rule = parse_rule({"effect": "error", "phase": "init", "refused": True, "message": "m"}, "f rule 1")
    refused = Placement(0, "gpu2", "pair_exchange", "pair", ("NV18",), ("NV18",), refused=True)
    assert rule.applies(refused, "init", {})
    assert not rule.applies(replace(refused, refused=False), "init", {})
    with pytest.raises(ScenarioError, match="refused"):
        parse_rule({"effect": "error", "refused": "yes"}, "f rule 1")
