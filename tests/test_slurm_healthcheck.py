"""``conformance-healthcheck``: the quick suite on one node; a node it fails on is drained in SLURM.

The first tests give it stand-ins for ``scontrol`` and ``sinfo`` (first on PATH) that write down
what they were asked and keep the node's state as SLURM would (scontrol strips a reason's outer
``"``); the rules about drains give it the suite's verdict directly (``run_quick_suite`` stood in
for), since what they test is what it does in SLURM.  The last ones run it on the tests' own SLURM
cluster (``slurm_cluster``): through ``srun -w n1`` as a job step, and as slurmd runs a
``HealthCheckProgram`` (no argument, ``SLURMD_NODENAME`` its only variable, no PATH), and read the
node's state back with ``sinfo``.  Where SLURM cannot be had, those skip with the reason.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conformance.cli import slurm_health
from conformance.cli.slurm_health import (
    DRAIN_FAILED,
    HEALTHY,
    UNHEALTHY,
    USAGE,
    Outcome,
    main,
    parse,
    prune_runs,
)
from conformance.common.verdicts import Verdict
from conformance.record.records import HOST_SET_KIND, CaseRecord, RunFacts
from conformance.record.runs import Run
from conftest import REPO
from slurm_cluster import SlurmCluster, module_cluster

pytestmark = pytest.mark.usefixtures("isolated_env")
HEALTHY_8GPU = ("--topology-file", str(REPO / "conformance" / "scenarios" / "topologies" / "nvswitch-8gpu.json"))
HEALTHY_ARGS = (*HEALTHY_8GPU, "--virtual-devices", "8")
REASON_BYTES = 255  # slurmdbd's TINYTEXT
NOT_CHECKED = 4
GPU_LOST = (
    "gpu-conformance: SIMULATED: host check host:gpu_inventory: ERROR: 1 GPU(s) on the PCI bus that NVML does "
    "not list: 0000:48:00.0 (8 on the PCI bus, 7 in NVML)"
)
# In its init, not its 4-byte step: a hang there is called by the 30 s step deadline, after the time limit
# (one in a small step would be called after 5 s, inside it).
HANG_IN_ALL_REDUCE = '[scenario]\nname = "all_reduce hangs"\n[[rule]]\neffect = "hang"\nphase = "init"\n'
HANG_IN_ALL_REDUCE += 'probes = ["all_reduce"]\nignore_sigterm = true\n'
DRAINED_SECONDS = 15.0  # a node draining under the health check's own job is drained once the job ends
LOAD_MARGIN = 5.0  # seconds a loaded 2-core machine may add to a bounded wait
# Outside text at its worst: NUL, a line break, quotes at the end (scontrol strips them), ESC, 10 KiB.
HOSTILE = 'a\x00b\nc\r"quoted" \x1b[31mred\x1b]0;title\x07 \u202eevil ' + "x" * 10240 + ' "'


# --- scontrol and sinfo stood in for: what the health check asks of SLURM ---


FAKE_SCONTROL = """#!/bin/sh
printf '%s\\n' "$@" >> "$0.calls"
echo "--" >> "$0.calls"
if [ -n "$FAKE_LOCK" ]; then
    if flock -n "$FAKE_LOCK" true; then echo free >> "$0.locks"; else echo held >> "$0.locks"; fi
fi
[ "${FAKE_SCONTROL_STATUS:-0}" = 0 ] || exit "$FAKE_SCONTROL_STATUS"
state=
for arg in "$@"; do
    case "$arg" in
        State=DRAIN) state=drained ;;
        State=RESUME) state=idle ;;
        Reason=*) reason=${arg#Reason=}; reason=${reason#\\"}; reason=${reason%\\"} ;;
    esac
done
case "$state" in
    drained) printf 'drained|%s' "$reason" > "$(dirname "$0")/node" ;;
    idle) printf 'idle|none' > "$(dirname "$0")/node" ;;
esac
"""
FAKE_SINFO = """#!/bin/sh
if [ -n "$FAKE_NODE_STATE" ]; then printf '%s\\n' "$FAKE_NODE_STATE"
elif [ -f "$(dirname "$0")/node" ]; then cat "$(dirname "$0")/node"; echo
else echo 'idle|none'; fi
"""


@pytest.fixture
def fake_slurm(tmp_path: Path) -> Path:
    """A folder holding stand-ins for scontrol (its calls written to scontrol.calls) and sinfo."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("sinfo", FAKE_SINFO)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def calls(fake_slurm: Path) -> list[list[str]]:
    path = fake_slurm / "scontrol.calls"
    text = path.read_text() if path.exists() else ""
    return [call.strip("\n").split("\n") for call in text.split("--\n") if call.strip()]


def updates(fake_slurm: Path) -> list[str]:
    """What each scontrol call set: ``State=DRAIN Reason=...``, ``State=RESUME``."""
    return [" ".join(call[2:]) for call in calls(fake_slurm)]


def set_node(fake_slurm: Path, state: str) -> None:
    """The node's state and reason as sinfo prints them (``drained|fan 3 failed``), as if a person set them."""
    (fake_slurm / "node").write_text(state)


def node(fake_slurm: Path) -> str:
    path = fake_slurm / "node"
    return path.read_text() if path.exists() else "idle|none"


def environ(fake_slurm: Path, **variables: str) -> dict[str, str]:
    state = fake_slurm.parent / "state"
    return {
        **os.environ,
        "PATH": f"{fake_slurm}{os.pathsep}{os.environ.get('PATH', '')}",
        "CONFORMANCE_HEALTHCHECK_STATE_DIR": str(state),
        "FAKE_LOCK": str(state / "healthcheck.lock"),
        **variables,
    }


def verdicts(monkeypatch: pytest.MonkeyPatch, *outcomes: Outcome | Callable[[], Outcome]) -> None:
    """The quick suite's verdict on each next check, without running it."""
    queue = list(outcomes)

    def run_quick_suite(args: object, pytest_args: object, reports: Path, env: object) -> Outcome:
        reports.mkdir(parents=True, exist_ok=True)  # as the real one does first
        outcome = queue.pop(0)
        return outcome() if callable(outcome) else outcome

    monkeypatch.setattr(slurm_health, "run_quick_suite", run_quick_suite)


FAILS, PASSES = Outcome(False, "host check host:nvlink: ERROR: gpu2: 17 of 18 NVLinks up"), Outcome(True)
OUR_REASON = "gpu-conformance: host check host:nvlink: ERROR: gpu2: 17 of 18 NVLinks up"


def test_a_node_that_fails_the_quick_suite_is_drained_with_the_answers_first_failure(
    fake_slurm: Path, tmp_path: Path, run_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--reports-dir", str(tmp_path / "reports"), "--scenario", "gpu-lost"]
    status = main(argv, environ(fake_slurm, SLURMD_NODENAME="gpu17"))
    out = capsys.readouterr().out
    assert status == UNHEALTHY, out
    [call] = calls(fake_slurm)
    assert call[:3] == ["update", "NodeName=gpu17", "State=DRAIN"], call
    reason = call[3].removeprefix("Reason=")
    assert reason.startswith(GPU_LOST) and reason.endswith("..."), reason
    assert len(reason.encode()) == REASON_BYTES and "\n" not in reason
    assert f"conformance-healthcheck: node gpu17: drained: {reason}" in out.splitlines()
    assert (tmp_path / "reports" / "healthcheck.log").read_text().strip()  # what pytest said, kept for the admin
    record = tmp_path / "state" / "drain-record.json"  # the exact reason it set, where only it can write
    assert json.loads(record.read_text()) == {"node": "gpu17", "reason": reason}
    assert record.stat().st_mode & 0o077 == 0 and (tmp_path / "state").stat().st_mode & 0o077 == 0


def test_a_healthy_node_is_left_alone_and_one_it_drained_itself_is_resumed(
    fake_slurm: Path, tmp_path: Path, run_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = ["--reports-dir", str(tmp_path / "reports"), "--node", "gpu3"]
    argv = [*reports, *HEALTHY_ARGS]
    assert main(argv, environ(fake_slurm)) == HEALTHY, capsys.readouterr().out
    assert calls(fake_slurm) == []  # idle: nothing asked of scontrol
    assert main([*reports, "--scenario", "nvlink-down"], environ(fake_slurm)) == UNHEALTHY  # idle: this check drains
    [drained] = updates(fake_slurm)
    assert drained.startswith("State=DRAIN Reason=gpu-conformance: SIMULATED: host check host:nvlink: ERROR: ")
    assert main(argv, environ(fake_slurm)) == HEALTHY
    assert updates(fake_slurm)[1:] == ["State=RESUME"] and node(fake_slurm) == "idle|none"
    assert "node gpu3: resumed (drained earlier by this health check" in capsys.readouterr().out


@pytest.mark.parametrize("state", ["drained", "draining", "mixed+drain", "down*", "reserved", "drained+maint"])
@pytest.mark.parametrize("reason", ["fan 3 failing, do not use", "gpu-conformance: RMA ticket 123"])
def test_an_administrators_drain_is_never_overwritten_nor_resumed_whatever_its_reason_says(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    state: str, reason: str,
) -> None:  # fmt: skip
    """Drained, down or reserved by a person, with this check's own prefix or without.

    A failing check and the next passing one leave it, its reason unchanged, and say so.
    """
    set_node(fake_slurm, f"{state}|{reason}")
    verdicts(monkeypatch, FAILS, PASSES)
    argv = ["--reports-dir", str(tmp_path / "reports"), "--node", "gpu4"]
    assert main(argv, environ(fake_slurm)) == UNHEALTHY
    assert f"node gpu4: already {state} by someone else ({reason}): left as it is" in capsys.readouterr().out
    assert main(argv, environ(fake_slurm)) == HEALTHY
    assert f"node gpu4: {state}, not by this check ({reason}): left for a person" in capsys.readouterr().out
    assert calls(fake_slurm) == [] and node(fake_slurm) == f"{state}|{reason}"


def test_a_drain_read_back_is_shown_escaped(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (fake_slurm / "node").write_bytes(b"mixed+drain|\x1b]0;pwned\x07 by someone \xff")  # not even UTF-8
    verdicts(monkeypatch, FAILS)
    assert main(["--reports-dir", str(tmp_path / "reports"), "--node", "gpu4"], environ(fake_slurm)) == UNHEALTHY
    out = capsys.readouterr().out
    assert "already mixed+drain by someone else (\\x1b]0;pwned\\x07 by someone \ufffd): left as it is" in out, out
    assert calls(fake_slurm) == []


def test_its_own_earlier_drain_is_left_as_it_is_and_resumed_by_the_next_pass(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    verdicts(monkeypatch, FAILS, Outcome(False, "host check host:ecc: ERROR: another failure"), PASSES, PASSES)
    argv = ["--reports-dir", str(tmp_path / "reports"), "--node", "gpu5"]
    assert main(argv, environ(fake_slurm)) == UNHEALTHY
    assert node(fake_slurm) == f"drained|{OUR_REASON}"
    assert main(argv, environ(fake_slurm)) == UNHEALTHY  # drained already, by itself: not drained over
    assert f"node gpu5: already drained by this health check earlier ({OUR_REASON}): left as it is" in (
        capsys.readouterr().out
    )
    assert updates(fake_slurm) == [f"State=DRAIN Reason={OUR_REASON}"] and node(fake_slurm) == f"drained|{OUR_REASON}"
    assert main(argv, environ(fake_slurm)) == HEALTHY
    assert updates(fake_slurm)[1:] == ["State=RESUME"]
    assert main(argv, environ(fake_slurm)) == HEALTHY  # resumed once: nothing of its own is left
    assert len(calls(fake_slurm)) == 2 and not (tmp_path / "state" / "drain-record.json").exists()


def _other_users(record: Path) -> None:
    os.chown(record, 65534, 65534)


def _symlinked(record: Path) -> None:
    kept = record.with_name("elsewhere.json")
    record.rename(kept)
    record.symlink_to(kept)


RECORD_SPOILED: dict[str, Callable[[Path], object]] = {
    "missing": lambda record: record.unlink(),
    "not JSON": lambda record: record.write_text('{"node": "gpu6", "reason": '),
    "nested too deep": lambda record: record.write_text("[" * 100 + "]" * 100),
    "over 4 KiB": lambda record: record.write_text(record.read_text().rstrip() + " " * 5000),
    "another node's": lambda record: record.write_text(record.read_text().replace('"gpu6"', '"gpu7"')),
    "writable by others": lambda record: record.chmod(0o666),
    "owned by another user": _other_users,
    "a symlink": _symlinked,
}


@pytest.mark.parametrize("spoiled", RECORD_SPOILED)
def test_a_record_missing_or_not_its_own_alone_resumes_nothing(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    spoiled: str,
) -> None:  # fmt: skip
    """The node drained with exactly its reason, but the record of it gone, spoiled or writable by someone else."""
    if spoiled == "owned by another user" and os.geteuid() != 0:
        pytest.skip("only root gives a file away")
    verdicts(monkeypatch, FAILS, PASSES)
    argv = ["--reports-dir", str(tmp_path / "reports"), "--node", "gpu6"]
    assert main(argv, environ(fake_slurm)) == UNHEALTHY
    [record] = [
        p for p in tmp_path.rglob("*") if p.is_file() and p.parent != fake_slurm and OUR_REASON in p.read_text()
    ]
    RECORD_SPOILED[spoiled](record)
    capsys.readouterr()
    assert main(argv, environ(fake_slurm)) == HEALTHY
    out = capsys.readouterr().out
    assert updates(fake_slurm) == [f"State=DRAIN Reason={OUR_REASON}"], out  # never resumed
    assert node(fake_slurm) == f"drained|{OUR_REASON}" and "left for a person" in out, out


def test_a_state_folder_others_can_write_checks_nothing_and_changes_nothing(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "state").mkdir(mode=0o777)
    (tmp_path / "state").chmod(0o777)
    verdicts(monkeypatch, FAILS)
    assert main(["--reports-dir", str(tmp_path / "reports"), "--node", "gpu6"], environ(fake_slurm)) == NOT_CHECKED
    err = capsys.readouterr().err
    assert "node gpu6: NOT CHECKED, nothing changed in SLURM: the state folder " in err and "writable by others" in err
    assert calls(fake_slurm) == []


def _lock_is_held(lock: Path) -> bool:
    if not lock.exists():
        return False
    with lock.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def test_two_checks_at_once_run_one_after_the_other(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lock is held across the run, the drain and the resume.

    A second check waits its bounded time, then says so (exit status 4) and changes nothing; once the first
    has ended, the next one runs.
    """
    lock = tmp_path / "state" / "healthcheck.lock"
    first_running, let_it_end = threading.Event(), threading.Event()
    held_during_runs: list[bool] = []

    def a_run_that_waits() -> Outcome:
        held_during_runs.append(_lock_is_held(lock))
        first_running.set()
        assert let_it_end.wait(timeout=30)
        return FAILS

    def a_quick_pass() -> Outcome:
        held_during_runs.append(_lock_is_held(lock))
        return PASSES

    verdicts(monkeypatch, a_run_that_waits, a_quick_pass)
    argv = ["--reports-dir", str(tmp_path / "reports"), "--node", "gpu8"]
    statuses: list[int] = []
    first = threading.Thread(target=lambda: statuses.append(main(argv, environ(fake_slurm))), daemon=True)
    first.start()
    try:
        assert first_running.wait(timeout=30)
        began = time.monotonic()
        assert main([*argv, "--lock-wait", "0.5"], environ(fake_slurm)) == NOT_CHECKED
        waited = time.monotonic() - began
        assert 0.5 <= waited < 0.5 + LOAD_MARGIN, waited
        assert "node gpu8: NOT CHECKED, nothing changed in SLURM: another health check holds " in (
            capsys.readouterr().err
        )
        assert calls(fake_slurm) == []
    finally:
        let_it_end.set()
        first.join(timeout=30)
    assert statuses == [UNHEALTHY] and updates(fake_slurm) == [f"State=DRAIN Reason={OUR_REASON}"]
    assert main(argv, environ(fake_slurm)) == HEALTHY  # the next one, after it: it resumes what the first drained
    assert updates(fake_slurm)[1:] == ["State=RESUME"]
    assert held_during_runs == [True, True]
    assert (fake_slurm / "scontrol.locks").read_text().split() == ["held", "held"]  # the drain's and the resume's


# A check of another run ending after this one's: its folder the newest, 'latest' pointing at it.
ANOTHER_RUN = """
import json, os, subprocess, sys
reports, record, command = sys.argv[1], sys.argv[2], sys.argv[3:]
status = subprocess.call(command)
os.mkdir(os.path.join(reports, "29991231-235959-beef"))
with open(os.path.join(reports, "29991231-235959-beef", "run.json"), "w") as f:
    json.dump({"run_id": "29991231-235959-beef", "backend": "gloo", "end": {"state": "complete"}}, f)
with open(os.path.join(reports, "29991231-235959-beef", "results.jsonl"), "w") as f:
    f.write(record + "\\n")
os.symlink("29991231-235959-beef", os.path.join(reports, ".other-latest"))
os.replace(os.path.join(reports, ".other-latest"), os.path.join(reports, "latest"))
sys.exit(status)
"""


def test_each_check_reads_its_own_run_folder_never_latest(
    fake_slurm: Path, tmp_path: Path, run_tag: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    other = CaseRecord(
        run_id="29991231-235959-beef", nodeid="suites/test_machine_health.py::test_ecc", probe="host:ecc",
        verdict=Verdict.ERROR, set_kind=HOST_SET_KIND, summary="ANOTHER RUN'S FAILURE",
    )  # fmt: skip
    real = slurm_health.quick_suite_command
    monkeypatch.setattr(
        slurm_health,
        "quick_suite_command",
        lambda *args: [sys.executable, "-c", ANOTHER_RUN, str(args[1]), json.dumps(other.to_json()), *real(*args)],
    )
    argv = ["--reports-dir", str(tmp_path / "reports"), "--node", "gpu9", "--tests", "test_machine_health.py"]
    assert main([*argv, "--scenario", "nvlink-down"], environ(fake_slurm)) == UNHEALTHY
    [drained] = updates(fake_slurm)
    assert drained.startswith("State=DRAIN Reason=gpu-conformance: SIMULATED: host check host:nvlink: ERROR: gpu2: 17 "
                              "of 18 NVLinks up"), (drained, capsys.readouterr().out)  # fmt: skip
    assert (tmp_path / "reports" / "latest").resolve().name == "29991231-235959-beef"


# --- the SLURM sink: every outside text that reaches a drain reason, escaped at one place ---


def _answer_line(text: str) -> str:
    record = CaseRecord(
        nodeid="suites/test_machine_health.py::test_nvlink", probe="host:nvlink", verdict=Verdict.ERROR,
        set_kind=HOST_SET_KIND, summary=text,
    )  # fmt: skip
    return slurm_health.failure_reason(Run("by hand", RunFacts(run_id="r1"), [record]), [], 1)


def _reports_folder(text: str) -> str:
    outcome = slurm_health.run_quick_suite(parse(["--tests", "none"])[0], [], Path("/dev/null") / text, {})
    return outcome.reason


# Each place a reason's text comes from (``Outcome(False, ...)`` in slurm_health.py, and failure_reason's sources).
REASON_SOURCES: dict[str, Callable[[str], str]] = {
    "the answer's first failing line": _answer_line,
    "pytest's ERROR: line": lambda text: slurm_health.failure_reason(None, [f"ERROR: {text}\n"], 4),
    "pytest's last line": lambda text: slurm_health.failure_reason(None, ["collected 3 items\n", text], 1),
    "the test stopped at the time limit": lambda text: slurm_health.timed_out_reason(
        40,
        ["suites/t.py::test_" + "_".join(text.split()) + " PASSED\n"],  # pytest -v's line: no white space in a name
    ),
    "the reports folder": _reports_folder,
}


def test_every_source_of_a_reason_is_one_of_those_tested() -> None:
    source = (REPO / "conformance" / "cli" / "slurm_health.py").read_text()
    assert len(re.findall(r"Outcome\(False,", source)) == 3  # the reports folder, the time limit, failure_reason
    assert source.count("DrainReason.of(") == 1
    drains = [p for p in (REPO / "conformance").rglob("*.py") if re.search(r'"State=DRAIN"|Reason=\{', p.read_text())]
    assert drains == [REPO / "conformance" / "cli" / "slurm_node.py"]  # the one module that drains
    assert drains[0].read_text().count("Reason={") == 1


@pytest.mark.parametrize("source", REASON_SOURCES)
def test_hostile_text_reaches_a_drain_reason_as_one_line_slurm_keeps_byte_for_byte(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    source: str,
) -> None:  # fmt: skip
    text = REASON_SOURCES[source](HOSTILE)
    assert "\x1b" in text or "quoted" in text, text  # the hostile text did reach it
    verdicts(monkeypatch, Outcome(False, text), PASSES)
    argv = ["--reports-dir", str(tmp_path / "reports"), "--node", "gpu10"]
    assert main(argv, environ(fake_slurm)) == UNHEALTHY
    [call] = calls(fake_slurm)
    reason = call[3].removeprefix("Reason=")
    assert call[:3] == ["update", "NodeName=gpu10", "State=DRAIN"] and len(call) == 4, call
    assert reason.startswith("gpu-conformance: ") and len(reason.encode()) <= REASON_BYTES, reason
    assert reason.isascii() and reason.isprintable() and '"' not in reason, reason
    assert node(fake_slurm) == f"drained|{reason}"  # what scontrol kept is what it sent
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x00" not in out and "\u202e" not in out
    assert main(argv, environ(fake_slurm)) == HEALTHY  # and the record of it matches SLURM's, byte for byte
    assert updates(fake_slurm)[1:] == ["State=RESUME"], capsys.readouterr().out


@pytest.mark.parametrize(
    ("given", "variables", "source"),
    [
        (["--node", "n[1-100]"], {}, "--node"),
        (["--node", "n1,n2"], {}, "--node"),
        (["--node", "ALL"], {}, "--node"),
        ([], {"SLURMD_NODENAME": "all"}, "SLURMD_NODENAME"),
        ([], {"SLURMD_NODENAME": "gpu1 State=DOWN"}, "SLURMD_NODENAME"),
    ],
)
def test_a_node_name_that_is_not_one_nodes_is_refused_before_anything_runs(
    fake_slurm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], given: list[str],
    variables: dict[str, str], source: str,
) -> None:  # fmt: skip
    argv = ["--reports-dir", str(tmp_path / "reports"), *given, "--scenario", "nvlink-down"]
    assert main(argv, environ(fake_slurm, **variables)) == USAGE
    assert f"conformance-healthcheck: error: {source} is " in capsys.readouterr().err
    assert calls(fake_slurm) == [] and not (tmp_path / "reports").exists() and not (tmp_path / "state").exists()


def test_past_its_time_limit_the_suite_is_stopped_and_the_node_drained_naming_the_test(
    fake_slurm: Path, tmp_path: Path, run_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rank that hangs and ignores SIGTERM: the time limit ends it all, and nothing is left running."""
    scenario = tmp_path / "hang.toml"
    scenario.write_text(HANG_IN_ALL_REDUCE)
    # the limit leaves a loaded machine time to start pytest and torch and reach the all-reduce
    argv = ["--reports-dir", str(tmp_path / "reports"), "--time-limit", "12", "--scenario", str(scenario)]
    begun = time.monotonic()
    status = main(argv, environ(fake_slurm, SLURMD_NODENAME="gpu5"))
    took = time.monotonic() - begun
    assert status == UNHEALTHY, capsys.readouterr().out
    [call] = calls(fake_slurm)
    assert call[3].startswith(
        "Reason=gpu-conformance: no answer within 12s (the health check's time limit): stopped in "
    ) and call[3].endswith("test_collectives.py::test_all_reduce[all4-inherited]"), call
    assert took < 12 + slurm_health.STOP_SECONDS + slurm_health.OUTPUT_SECONDS + LOAD_MARGIN, took


def test_a_drain_scontrol_refuses_is_exit_status_3_and_says_why(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (fake_slurm / "scontrol").write_text(
        "#!/bin/sh\necho 'slurm_update error: Invalid node name specified' >&2\nexit 1\n"
    )
    verdicts(monkeypatch, FAILS, FAILS)
    argv = ["--reports-dir", str(tmp_path / "reports"), "--node", "nosuch"]
    assert main(argv, environ(fake_slurm)) == DRAIN_FAILED
    err = capsys.readouterr().err
    assert "node nosuch: the drain failed: slurm_update error: Invalid node name specified" in err
    (fake_slurm / "sinfo").write_text("#!/bin/sh\necho 'slurm_load_node error: Unable to contact controller' >&2\n")
    assert main(argv, environ(fake_slurm)) == DRAIN_FAILED  # a state it cannot read is never drained over
    err = capsys.readouterr().err
    assert "node nosuch: not drained: its state could not be read first (" in err and "Unable to contact" in err


def test_no_drain_reports_without_asking_slurm_and_bad_arguments_are_exit_status_2(
    fake_slurm: Path, tmp_path: Path, run_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--reports-dir", str(tmp_path / "reports"), "--no-drain", "--scenario", "nvlink-down"]
    assert main(argv, environ(fake_slurm, SLURMD_NODENAME="gpu2")) == UNHEALTHY
    out = capsys.readouterr().out
    assert "node gpu2: UNHEALTHY: SIMULATED: host check host:nvlink: ERROR: gpu2: 17 of 18 NVLinks up" in out
    assert calls(fake_slurm) == []
    assert main(["--time-limit", "soon"], environ(fake_slurm)) == USAGE
    assert "conformance-healthcheck: error: argument --time-limit: " in capsys.readouterr().err


def test_pytest_options_pass_through_and_the_reason_fits_slurmdbd() -> None:
    from conformance.cli.slurm_node import DrainReason, NodeState

    args, rest = parse(["--time-limit", "30", "--expect-gpus", "8", "--no-resume", "--", "--time-limit", "x"])
    assert (args.time_limit, args.no_resume, rest) == (30.0, True, ["--expect-gpus", "8", "--time-limit", "x"])
    assert DrainReason.of("a\nb\t c é").text == "gpu-conformance: a b c \\xe9"
    assert DrainReason.of("\x1b]0;title\x07 ok").text == "gpu-conformance: \\x1b]0;title\\x07 ok"
    assert DrainReason.of('"x"').text == "gpu-conformance: 'x'"  # scontrol would strip a last '"'
    assert len(DrainReason.of("x" * 1000).raw) == REASON_BYTES
    ours = DrainReason.of("x").raw
    assert NodeState("drained", ours).drained_with(ours) and NodeState("mixed+drain", ours).drained_with(ours)
    assert not NodeState("drained", b"admin: " + ours).drained_with(ours)
    assert not NodeState("idle", ours).drained_with(ours) and not NodeState("down+drain", ours).drained_with(ours)


def test_a_run_id_given_to_the_suite_must_be_a_run_folders_name() -> None:
    from conformance.record.run_folder import given_run_id

    assert given_run_id({"CONFORMANCE_RUN_ID": "20260101-000000-abcd"}) == "20260101-000000-abcd"
    assert given_run_id({}) is None
    for bad in ("../../etc", "20260101-000000-abcd/x", "latest", "20260101-000000-ABCD"):
        with pytest.raises(ValueError, match="not a run id"):
            given_run_id({"CONFORMANCE_RUN_ID": bad})


def test_the_reports_folder_keeps_the_newest_runs(tmp_path: Path) -> None:
    names = [f"20260101-00000{k}-abcd" for k in range(5)] + ["20260101-000001-abcd-node1", "mine"]
    for name in names:
        (tmp_path / name).mkdir()
    prune_runs(tmp_path, 2, current="20260101-000000-abcd")  # the run just made is never removed
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["20260101-000000-abcd", "20260101-000003-abcd", "20260101-000004-abcd", "mine"]


# --- the tests' own SLURM cluster ---


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from module_cluster(tmp_path_factory)


def healthcheck_program() -> str:
    program = Path(sys.executable).with_name("conformance-healthcheck")
    assert program.exists(), f"{program} is missing: install the package again (pip install -e .)"
    return str(program)


def node_state(cluster: SlurmCluster, node: str) -> tuple[str, str]:
    line = cluster.command("sinfo", "-h", "-N", "-n", node, "-o", "%T|%E", timeout=10).stdout.strip()
    state, _, reason = line.partition("|")
    return state, reason


def wait_for_state(cluster: SlurmCluster, node: str, state: str) -> tuple[str, str]:
    deadline = time.monotonic() + DRAINED_SECONDS
    found = node_state(cluster, node)
    while found[0] != state and time.monotonic() < deadline:
        time.sleep(0.2)
        found = node_state(cluster, node)
    return found


@pytest.mark.slow
def test_srun_a_broken_node_ends_drained_with_the_answer_and_a_healthy_one_stays_idle(
    cluster: SlurmCluster, tmp_path: Path, run_tag: str
) -> None:
    program = healthcheck_program()
    broken = cluster.command(
        "srun", "-w", "n1", "-N1", "-n1", program, f"--reports-dir={tmp_path / 'n1'}",
        f"--state-dir={tmp_path / 'n1-state'}", "--scenario", "gpu-lost",
        cwd=tmp_path,
    )  # fmt: skip
    assert broken.returncode == UNHEALTHY, broken.stdout + broken.stderr
    state, reason = wait_for_state(cluster, "n1", "drained")
    assert state == "drained" and reason.startswith(GPU_LOST), (state, reason, broken.stdout)
    assert f"conformance-healthcheck: node n1: drained: {reason}" in broken.stdout
    healthy = cluster.command(
        "srun",
        "-w",
        "n2",
        "-N1",
        "-n1",
        program,
        f"--reports-dir={tmp_path / 'n2'}",
        f"--state-dir={tmp_path / 'n2-state'}",
        *HEALTHY_ARGS,
        cwd=tmp_path,
    )
    assert healthy.returncode == HEALTHY, healthy.stdout + healthy.stderr
    assert "conformance-healthcheck: node n2: healthy" in healthy.stdout
    assert wait_for_state(cluster, "n2", "idle") == ("idle", "none")


@pytest.mark.slow
def test_as_slurmd_runs_a_health_check_program_it_resumes_only_its_own_drain(
    cluster: SlurmCluster, tmp_path: Path, run_tag: str
) -> None:
    """No argument but the wrapper's, no PATH: scontrol found where SLURM installs it."""
    program = healthcheck_program()
    # slurmd's environment for it is SLURMD_NODENAME alone; SLURM_CONF names the tests' cluster, as a wrapper would
    slurmd_env = {"SLURMD_NODENAME": "n3", "SLURM_CONF": str(cluster.conf), "CONFORMANCE_TEST_TAG": run_tag}
    folders = [f"--reports-dir={tmp_path / 'n3'}", f"--state-dir={tmp_path / 'n3-state'}"]
    check = [program, *folders, *HEALTHY_ARGS]
    broken = [program, *folders, "--scenario", "nvlink-down"]

    def run_check() -> None:
        done = subprocess.run(check, env=slurmd_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == HEALTHY, done.stdout + done.stderr

    admin = "gpu-conformance: RMA ticket 123"  # a person's, though it keeps this check's prefix
    assert cluster.command("scontrol", "update", "NodeName=n3", "State=DRAIN", f"Reason={admin}").returncode == 0
    failing = subprocess.run(broken, env=slurmd_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert failing.returncode == UNHEALTHY, failing.stdout + failing.stderr
    assert f"node n3: already drained by someone else ({admin}): left as it is" in failing.stdout
    run_check()
    assert node_state(cluster, "n3") == ("drained", admin)  # a person's drain stays, unchanged
    assert cluster.command("scontrol", "update", "NodeName=n3", "State=RESUME").returncode == 0
    assert wait_for_state(cluster, "n3", "idle") == ("idle", "none")
    failing = subprocess.run(broken, env=slurmd_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert failing.returncode == UNHEALTHY, failing.stdout + failing.stderr
    assert wait_for_state(cluster, "n3", "drained")[1].startswith("gpu-conformance: SIMULATED: host check host:nvlink")
    run_check()
    assert wait_for_state(cluster, "n3", "idle") == ("idle", "none")  # its own drain, resumed


@pytest.mark.slow
def test_slurm_keeps_a_hostile_reason_byte_for_byte(cluster: SlurmCluster) -> None:
    """What scontrol and slurmctld keep of an escaped reason, sinfo prints back as it was sent."""
    from conformance.cli.slurm_node import DrainReason, drain_node, read_node_state, resume_node

    env = cluster.environ()
    for text in (HOSTILE + " back\\slash | pipe 'single' %s", 'rank 0: "CUDA error"'):  # scontrol strips a last '"'
        reason = DrainReason.of(text)
        assert drain_node("n2", reason, env) is None
        found = read_node_state("n2", env)
        try:
            assert not isinstance(found, str) and found.drained_with(reason.raw), (found, reason)
        finally:
            assert resume_node("n2", env) is None
        assert wait_for_state(cluster, "n2", "idle") == ("idle", "none")


def test_a_node_that_tested_no_gpu_says_so_in_its_last_line(
    fake_slurm: Path, tmp_path: Path, run_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--reports-dir", str(tmp_path / "reports"), "--node", "vm1", "--virtual-devices", "2"]
    assert main(argv, environ(fake_slurm)) == HEALTHY
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("conformance-healthcheck: node vm1: healthy (CPU ONLY: no GPU tested: "), last
    env_file = next((tmp_path / "reports").glob("2*/recommended.env")).read_text()
    assert env_file.startswith("# CPU ONLY: no GPU was tested ("), env_file
