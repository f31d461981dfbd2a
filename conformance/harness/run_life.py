"""The run's start and end.

At its start its folder is claimed, its nodes met, its GPUs watched; at its end run.json says how
far it got, then the run is concluded (answer, baseline, exit status); ``--metrics-file`` says
``running`` at the start and the run's results at the end (``summarise/metrics.py``).
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from conformance.common.clock import wall
from conformance.discover.topology_source import watch_run
from conformance.discover.versions import suite_version
from conformance.harness.across_nodes import meet_nodes
from conformance.harness.context import RunContext
from conformance.harness.junit import JunitSummary
from conformance.record.records import PYTEST_OUTCOMES, JunitRun, time_spent
from conformance.record.run_folder import RunFolder, stop_watch
from conformance.record.runs import Run, RunError, load_run
from conformance.summarise.answer import Answer
from conformance.summarise.conclude import conclude
from conformance.summarise.metrics import RunStatus, metrics_text, write_metrics

STARTED = pytest.StashKey[tuple[float, float]]()  # when the run started: wall time (for people), monotonic clock


def start_run(run: RunContext) -> None:
    """Claim the run folder, meet the other nodes of a multi-node run, say the run has started.

    Before the header, so it names the run id claimed; before xdist starts its workers, who are given it.
    A plain run or xdist's controller chooses the run id; node 0 for every node of a multi-node run.
    """
    run.config.stash[STARTED] = (wall(), time.monotonic())
    first_node = run.node_setup is None or run.node_setup.node_rank == 0
    if run.role.ends_run and first_node:
        run.replan(RunFolder.claimed(run.settings.reports_dir, run.run_id).run_id, run.plan.ladder)
    meet_nodes(run)
    if not run.role.runs_nothing:
        run.ensure_run_dir()  # run.json says the run has started
    if run.role.ends_run:
        metrics_at_start(run)
        run.gpu_watch = watch_run(run.topology, run.backend)


def write_end(run: RunContext, session: pytest.Session) -> None:
    """run.json says how far the run got (``RunEnd``), before anything reads the run back."""
    watch, run.gpu_watch = run.gpu_watch, None
    if run.role.worker or not run.folder.facts_file.exists():
        if watch is not None:
            watch.close()
        return
    records = run.folder.own_records()
    end = run.coverage.end(session.exitstatus, session.shouldfail or session.shouldstop, pytest_counts(run.config))
    failed_nodes = run.outcome.failed_nodes
    unexplained = run.failed_tests.unexplained(records)
    run.outcome.end = replace(
        end,
        harness_errors=unexplained,
        failed_nodes=failed_nodes,
        store_problems=run.outcome.store_problems,
        spent=time_spent(records),
    )
    watched = stop_watch(watch, records, run.node_rank) if watch is not None else None
    facts = replace(run.run_facts(), end=run.outcome.end, watch=watched.to_json() if watched else None)
    try:
        run.folder.write_end(facts)
    except OSError as exc:  # a full disk: said, and the run fails; the answer comes from the facts in memory
        run.outcome.unwritten.append(f"{run.folder.facts_file.name} NOT written: {exc.strerror or exc}")
        run.outcome.facts = facts


def pytest_counts(config: pytest.Config) -> dict[str, int] | None:
    """The tests by outcome as pytest's last line counts them (``TerminalReporter.stats``); None without it."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return None
    return {outcome: len(reporter.stats.get(outcome, ())) for outcome in PYTEST_OUTCOMES}


def conclude_run(run: RunContext, session: pytest.Session) -> None:
    """The answer, the baseline comparison and the report; what fails the run fails a passing session."""
    if run.role.worker or not run.folder.facts_file.exists():  # results.jsonl may be gone: its loss is said
        return
    run.outcome.conclusion = conclude(run.run_dir, run.settings, run.baseline, run.outcome.facts)
    run.outcome.unwritten += run.outcome.conclusion.unwritten
    if run.outcome.conclusion.fails_run:
        fail_session(session)


def fail_session(session: pytest.Session) -> None:
    """A session whose tests passed fails: the run's answer found something (other exit statuses stand)."""
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def final_answer(run: RunContext) -> Answer | None:
    """The run's answer with everything its end could not write so far (each fails the run)."""
    answer, unwritten = run.outcome.conclusion.answer, tuple(run.outcome.unwritten)
    return replace(answer, unwritten=unwritten) if answer is not None and unwritten else answer


def metrics_at_start(run: RunContext) -> None:
    """The metrics file says the run is running: a run killed before its end never leaves the last run's green."""
    path = run.settings.metrics_file
    if path is None:
        return
    try:
        write_metrics(
            path,
            metrics_text(
                load_run(run.run_dir), RunStatus(started=run.config.stash[STARTED][0]), run.settings.metrics_per_case
            ),
        )
    except (OSError, RunError) as exc:
        raise pytest.UsageError(f"conformance: {run.settings.source('metrics_file')}: {path}: {exc}") from None


def metrics_at_end(run: RunContext, exit_status: int) -> None:
    """The run's results in the metrics file, the failure of a run that cannot be read back included.

    One that cannot be written is removed (none says 'running'), and named in the answer.
    """
    path = run.settings.metrics_file
    if path is None:
        return
    started = run.config.stash.get(STARTED, None)
    status = RunStatus(
        started[0] if started else None,
        wall(),
        exit_status,
        final_answer(run),
        seconds=time.monotonic() - started[1] if started else None,
    )
    try:
        read = load_run(run.run_dir)
    except RunError:  # nothing of the run can be read back: it did not pass
        read = Run(str(run.run_dir), replace(run.run_facts(), end=run.outcome.end), [])
        status = replace(status, unreadable=True)
    try:
        write_metrics(path, metrics_text(read, status, run.settings.metrics_per_case))
    except OSError as exc:
        why = exc.strerror or exc
        try:  # a file left saying "running" would outlive the run
            path.unlink(missing_ok=True)
            left = "the old file removed, so none says 'running'"
        except OSError as gone:
            left = f"the old file could not be removed either ({gone.strerror or gone})"
        run.outcome.unwritten.append(f"metrics NOT written to {path}: {why}; {left}")
        return
    run.outcome.notes.append(f"metrics for Prometheus: {path}")


def junit_summary(run: RunContext) -> JunitSummary:
    """The run and its answer, for the testsuite of the JUnit file (``harness.junit``)."""
    answer = final_answer(run)
    return JunitSummary(
        run=JunitRun(run.run_id, str(run.results_path.resolve()), suite_version() or "unknown"),
        node_rank=run.node_rank,
        answer=tuple(answer.lines()) if answer else (),
        exports=answer.exports if answer else (),
        cpu_only=run.cpu_only,
        unsigned=run.nodes.unsigned if run.nodes is not None else None,
        findings=answer.findings() if answer else (),
    )
