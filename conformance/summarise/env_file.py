"""``recommended.env`` in the run folder: the recommendation as a file a shell sources.

    set -a; . ./recommended.env; set +a

Comment lines say what the run found (its classes, conflicts, what NCCL's configuration files set,
what it inherited); then one ``VAR=VALUE`` line per variable to set.  Every line is shell text from
``common/shell_text.py``: values quoted for a POSIX shell where they need it, notes on comment
lines with every control shown as its escape, and a variable no shell can set said in a comment.
``bash -n`` reads the file clean, and sourcing it sets exactly the recommended values.
"""

from __future__ import annotations

from pathlib import Path

from conformance.common.files import write_atomic
from conformance.common.shell_text import assignment, comment, file_bytes
from conformance.plan.matrix import Rung
from conformance.record.runs import Run, RunError
from conformance.summarise.recommendation import UNFIT_REASON, Recommendation
from conformance.summarise.summary import rung_env_text

ENV_FILE = "recommended.env"
USAGE = (  # docker and systemd take a value as it is written: a quoted one would keep its quotes there
    f"VAR=VALUE lines, values quoted for sh where they need it: set -a; . ./{ENV_FILE}; set +a "
    "(docker --env-file, systemd EnvironmentFile=: when no value is quoted)"
)


def env_file_text(rec: Recommendation) -> str:
    """The whole file, as text (``write_env_file`` writes its bytes)."""
    return "".join(f"{line}\n" for line in env_file_lines(rec))


def env_file_lines(rec: Recommendation) -> list[str]:
    """The file's lines: a header of comments, then an assignment per variable (none when withheld)."""
    notes = [f"recommended environment from conformance run {rec.run_id or '(unknown run id)'}"]
    if rec.cpu_only is not None:  # first: nothing below is about a GPU
        notes.insert(0, f"CPU ONLY: no GPU was tested ({rec.cpu_only})")
    if rec.simulated:
        notes.append("SIMULATED run: this is for the simulated machine, not this host")
    notes.append(USAGE)
    withheld = _withheld_notes(rec)
    if withheld is not None:
        return [comment(note) for note in notes + withheld]
    notes += [*_class_notes(rec), *rec.config_note(), *rec.inherited_note()]
    if rec.unset_families:
        notes.append(f"{rung_env_text(Rung('overall', unset_families=rec.unset_families))} before these: "
                     "a .env file cannot unset")  # fmt: skip
    if not rec.env and not rec.unset_families:
        notes.append("nothing needs setting: the environment as it is")
    assignments = [assignment(k, v) for k, v in rec.config_exports().items()]
    assignments += [assignment(k, v) for k, v in sorted(rec.env.items())]
    return [comment(note) for note in notes] + assignments


def _withheld_notes(rec: Recommendation) -> list[str] | None:
    """The notes of a file that sets nothing (wrong data, an incomplete run, harness errors, no case)."""
    if rec.unfit:
        return [f"NOT FIT FOR TRAINING: wrong data (verdict fail); {UNFIT_REASON}"] + [
            f"  FAIL {case.nodeid}" for case in rec.wrong_data
        ]
    if rec.incomplete:
        return [rec.incomplete_line()]
    if rec.harness_errors:
        return [rec.harness_line()]
    if not rec.classes:
        return ["nothing to recommend: no case ran that can be used"]
    return None


def _class_notes(rec: Recommendation) -> list[str]:
    notes = []
    for advice in rec.classes:
        if advice.rung is None:
            notes.append(f"{advice.name}: no environment fixes it (no rung passed; tried {', '.join(advice.tried)})")
        else:
            notes.append(f"{advice.name}: {advice.rung.name}: {_assignments(advice.rung)}")
    notes += [c.text() for c in rec.conflicts]
    if rec.broader and not rec.serves_every_class:
        broader = ", ".join(f"{cls} (needs {rung})" for cls, rung in rec.broader)
        notes.append(f"broader setting than needed for: {broader}")
    return notes


def _assignments(rung: Rung) -> str:
    """``VAR=VALUE ...`` of one rung, for a note (the unset text for ``clean``)."""
    parts = [rung_env_text(Rung(rung.name, unset_families=rung.unset_families))] if rung.unset_families else []
    parts += [f"{k}={v}" for k, v in sorted(rung.set.items())]
    return " ".join(parts) or "nothing to set"


def write_env_file(run: Run, recommendation: Recommendation) -> Path:
    """``recommended.env`` in the run folder; returns its path (OSError when it cannot be written)."""
    if run.folder is None:
        raise RunError(f"{run.source}: no run folder to write {ENV_FILE} into")
    path = run.folder / ENV_FILE
    write_atomic(path, file_bytes(env_file_lines(recommendation)))
    return path
