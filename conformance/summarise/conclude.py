"""The end of a run: the answer, the recommended environment, the baseline comparison and the HTML report.

Called once, by the controller, after every case has been recorded, so it reads the run back from
its folder exactly as ``python -m conformance recommend/compare/report`` would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from conformance.record.runs import Run, RunError, load_run
from conformance.settings import Settings
from conformance.summarise.answer import Answer, answer
from conformance.summarise.compare import CompareError, compare, write_comparison
from conformance.summarise.recommend import recommend, write_env_file
from conformance.summarise.report import ReportUnavailable, write_report


@dataclass
class Conclusion:
    lines: list[str] = field(default_factory=list)
    fails_run: bool = False  # a finding, a regression, an output asked for and not written: the run fails
    answer: Answer | None = None


def conclude(run_dir: Path, settings: Settings, baseline: Run | None) -> Conclusion:
    """Recommend, compare and report on the finished run in ``run_dir``."""
    conclusion = Conclusion()
    try:
        run = load_run(run_dir)
    except RunError as exc:
        conclusion.lines.append(f"no recommendation: {exc}")
        return conclusion
    if not run.records and not run.facts.harness_errors:
        return conclusion
    recommendation = recommend(run)
    conclusion.answer = answer(run, recommendation)
    conclusion.fails_run = bool(conclusion.answer.findings())  # a SLOW pair or an Xid fails the run
    env_file = write_env_file(run, recommendation)
    conclusion.lines += ["recommended environment:", *recommendation.lines(), f"(written to {env_file})"]
    if baseline is not None:
        try:
            comparison = compare(baseline, run, settings.bandwidth_tolerance)
        except CompareError as exc:
            conclusion.lines.append(f"baseline comparison not possible: {exc}")
            conclusion.fails_run = True
        else:
            conclusion.lines += [f"against baseline {baseline.source}:", *comparison.lines()]
            conclusion.fails_run = conclusion.fails_run or comparison.exit_status != 0
            kept = write_comparison(comparison)
            conclusion.lines += [f"(comparison kept in {kept})"] if kept else []
    if settings.run_report:
        try:
            path = write_report(run, recommendation.lines(), answer=conclusion.answer)
        except (ReportUnavailable, OSError) as exc:  # asked for and not written: the run fails, saying why
            conclusion.lines.append(f"HTML report NOT written: {exc}")
            conclusion.fails_run = True
        else:
            conclusion.lines.append(f"HTML report: {path}")
    return conclusion
