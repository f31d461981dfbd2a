"""The end of a run: the answer, the recommended environment, the baseline comparison and the HTML report.

Called once, by the controller, after every case has been recorded, so it reads the run back from
its folder exactly as ``python -m conformance recommend/compare/report`` would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from conformance.record.records import RunFacts
from conformance.record.runs import Run, RunError, load_run
from conformance.settings import Settings
from conformance.summarise.answer import Answer, answer
from conformance.summarise.compare import COMPARISON_FILE, CompareError, compare, write_comparison
from conformance.summarise.env_file import ENV_FILE, write_env_file
from conformance.summarise.recommend import recommend
from conformance.summarise.report import ReportUnavailable, write_report


@dataclass
class Conclusion:
    lines: list[str] = field(default_factory=list)
    fails_run: bool = False  # a finding, a regression, an output asked for and not written: the run fails
    answer: Answer | None = None
    unwritten: list[str] = field(default_factory=list)  # "recommended.env NOT written: <why>", for the answer

    def written(self, what: str, write: Callable[[], Path | None], said: str) -> None:
        """``write`` a file: ``said`` names it ({path}), or ``unwritten`` says why it was not, which fails the run."""
        try:
            path = write()
        except (ReportUnavailable, OSError) as exc:
            self.unwritten.append(not_written(what, exc))
            self.fails_run = True
        else:
            self.lines += [said.format(path=path)] if path else []


def not_written(what: str, exc: BaseException) -> str:
    """``<what> NOT written: <why>``: one line of the answer for each output of the run's end that was lost."""
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
    return f"{what} NOT written: {why}"


def conclude(run_dir: Path, settings: Settings, baseline: Run | None, facts: RunFacts | None = None) -> Conclusion:
    """Recommend, compare and report on the finished run in ``run_dir``.

    ``facts``: the run's own, where its run.json could not be written at the end (a full disk).
    """
    conclusion = Conclusion()
    try:
        run = load_run(run_dir)
    except RunError as exc:
        conclusion.lines.append(f"no recommendation: {exc}")
        return conclusion
    if facts is not None:
        run = replace(run, facts=facts)
    if not (run.records or run.facts.harness_errors or run.facts.store_problems or run.facts.incomplete):
        return conclusion  # nothing to answer for: a run that ran no case and was not cut short
    recommendation = recommend(run)
    conclusion.answer = answer(run, recommendation)
    # a SLOW pair or an Xid fails the run; so does a test without a verdict (a lost record: pytest passed it)
    conclusion.fails_run = bool(conclusion.answer.findings() or run.facts.harness_errors)
    conclusion.lines += ["recommended environment:", *recommendation.lines()]
    conclusion.written(ENV_FILE, lambda: write_env_file(run, recommendation), "(written to {path})")
    if baseline is not None:
        _compare(conclusion, baseline, run, settings)
    if settings.run_report:  # asked for and not written: the run fails, saying why
        report = partial(write_report, run, recommendation.lines(), answer=conclusion.answer)
        conclusion.written("HTML report", report, "HTML report: {path}")
    return conclusion


def _compare(conclusion: Conclusion, baseline: Run, run: Run, settings: Settings) -> None:
    try:
        comparison = compare(baseline, run, settings.bandwidth_tolerance)
    except CompareError as exc:
        conclusion.lines.append(f"baseline comparison not possible: {exc}")
        conclusion.fails_run = True
        return
    conclusion.lines += [f"against baseline {baseline.source}:", *comparison.lines()]
    conclusion.fails_run = conclusion.fails_run or comparison.exit_status != 0
    conclusion.written(COMPARISON_FILE, lambda: write_comparison(comparison), "(comparison kept in {path})")
