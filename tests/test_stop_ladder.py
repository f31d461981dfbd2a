"""The stop ladder on ranks that ignore SIGTERM: stacks first, then SIGTERM, then SIGKILL.

Every process must be reaped within 2 s of the watchdog's decision, the failure must show where
the stuck rank stood (its Python stack) and carry the rank's stderr.log.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import COLLECTIVE_TEST, read_records, scenario_text, tagged_processes, wait_until_gone

STEP_TIMEOUT = 4.0
TIMEOUTS = (f"--step-timeout={STEP_TIMEOUT:g}", "--op-timeout=3", "--init-timeout=3", "--grace=1")
STOP_BOUND = 2.0
REACH_SLACK = 3.0  # the margin for load: how long the ranks may take to reach the step that hangs
# The innermost frame shown: the probe's step the simulated hang stopped in (the rank's context,
# which injected it, is the harness's own and left out of stacks; its stderr.log keeps every frame).
FRAME = re.compile(r'^  File ".*/conformance/rank/probes\.py", line \d+ in sized_steps$')


def stack_after(lines: list[str], heading: str) -> list[str]:
    """The stack excerpt printed under ``heading`` in the failure text."""
    assert heading in lines, "\n".join(lines)
    start = lines.index(heading) + 1
    excerpt = []
    for line in lines[start:]:
        if not line.startswith('  File "'):
            break
        excerpt.append(line)
    return excerpt


@pytest.mark.parametrize(
    ("ranks_rule", "stuck"), [("ranks = [1]\n", [1]), ("", [0, 1, 2, 3])], ids=["rank1", "every-rank"]
)
def test_sigterm_ignored_hang_is_reaped_within_bound(
    pytester: pytest.Pytester, run_suite, reports_dir: Path, run_tag: str, ranks_rule: str, stuck: list[int]
) -> None:
    pytester.makepyfile(test_x=COLLECTIVE_TEST.format(probe="all_reduce"))
    scenario = pytester.makefile(".toml", scen=scenario_text(f'effect = "hang"\n{ranks_rule}ignore_sigterm = true'))
    result = run_suite(f"--scenario={scenario}", *TIMEOUTS, "--virtual-devices=4", "-v")  # -v: the ranks' stacks
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"conformance: SIMULATED run, scenario 'test scenario' ({scenario})"])

    # nothing this run started outlives it (the run_tag fixture checks again at teardown)
    assert wait_until_gone(run_tag) == []
    assert tagged_processes(run_tag) == []

    (record,) = read_records(reports_dir)
    assert record["verdict"] == "hang"
    assert record["simulated"] is True
    stop_seconds = record["stop_seconds"]
    assert stop_seconds is not None and 0 < stop_seconds < STOP_BOUND, stop_seconds
    stopped = "stopped by the watchdog (stalled: no rank reported progress for the step deadline)"
    result.stdout.fnmatch_lines([f"{stopped}; last rank reaped {stop_seconds:.2f}s later"])
    for r in record["ranks"]:
        assert r["unkillable"] is False, r
        if r["rank"] in stuck:
            # SIGTERM was ignored: only the ladder's SIGKILL could end it
            assert (r["exit"], r["status"], r["stopped_by"], r["phase"]) == ("SIGKILL", "stopped", "stalled", "probe")
            assert STEP_TIMEOUT <= r["seconds"] < STEP_TIMEOUT + STOP_BOUND + REACH_SLACK, r
            assert FRAME.match(r["stack"].splitlines()[0]), r["stack"]  # the record keeps the stack too
        else:
            assert (r["exit"], r["status"], r["stopped_by"], r["stack"]) == (1, "error", None, None), r

    lines = result.outlines
    if stuck == [1]:
        assert record["root_cause"]["rank"] == 1
        result.stdout.fnmatch_lines(["root cause: rank 1 on cpu1, phase probe (all_reduce 4B), exit SIGKILL"])
    else:
        assert record["root_cause"]["rank"] is None
    for rank in stuck:
        excerpt = stack_after(lines, f"stack of rank {rank} at the deadline:")
        assert excerpt, f"no stack excerpt for rank {rank}"
        assert FRAME.match(excerpt[0]), excerpt  # innermost frame: where the simulated hang stopped the probe
        assert len(excerpt) <= 12
    # the stuck rank's stderr.log is attached, with the stacks the ladder's SIGUSR1 made it dump
    result.stdout.fnmatch_lines(
        [
            "*Captured rank 1 stderr.log call*",
            "Current thread 0x* (most recent call first):",
            '  File "*", line * in apply_effect',
        ]
    )
