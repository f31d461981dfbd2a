"""``conformance diagnose`` on real logs from public issue threads (tests/data/diagnose/real/).

Each case's labels come from its thread (case.toml names the URL), set before diagnose read the
logs; split.toml names the third set aside before any rule was written from the corpus.  Every case
must be usable input; no failed job's log may be answered "no failure"; the shares right, on the
half developed on and on the half set aside, must not fall below what the README states.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import tomllib

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from diagnose_real_logs import DATA, diagnose_case, held_out, scores  # noqa: E402

CASES = sorted(p for p in DATA.iterdir() if (p / "case.toml").is_file())
SET_ASIDE = held_out(DATA)
# The README's table "Real logs", each half: cases, then class, root-cause rank and fix right.
README_FLOOR = {
    "developed on": {"cases": 80, "class": 58, "root": 72, "fix": 57},
    "set aside": {"cases": 40, "class": 15, "root": 32, "fix": 12},
}


@pytest.fixture(scope="module")
def answers() -> dict[str, tuple[dict[str, object], dict[str, object]]]:
    return {case.name: diagnose_case(case) for case in CASES}


def test_the_corpus_is_as_the_docs_say() -> None:
    labels = [tomllib.loads((case / "case.toml").read_text()) for case in CASES]
    assert len(CASES) >= 60
    assert len({label["project"] for label in labels}) >= 25
    assert SET_ASIDE <= {case.name for case in CASES}
    assert len(SET_ASIDE) == round(len(CASES) / 3)
    assert all(str(label["source"]).startswith("https://github.com/") for label in labels)


@pytest.mark.parametrize("case", CASES, ids=[p.name for p in CASES])
def test_every_real_log_is_read_and_no_failed_job_is_no_failure(
    case: Path, answers: dict[str, tuple[dict[str, object], dict[str, object]]]
) -> None:
    labels, answer = answers[case.name]

    assert answer["lines"], "nothing was read"
    if labels["class"] != "none":
        assert answer["verdict"] != "no failure", answer  # the worst answer: a failed job called healthy
    elif labels["ending"] == "normal":
        assert answer["class"] is None, answer  # a job that ended normally is never given a cause


def test_the_shares_right_are_at_least_the_readmes(
    answers: dict[str, tuple[dict[str, object], dict[str, object]]],
) -> None:
    right = {half: Counter[str]() for half in README_FLOOR}
    for name, (labels, answer) in answers.items():
        half = right["set aside" if name in SET_ASIDE else "developed on"]
        half["cases"] += 1
        for key, ok in zip(("class", "root", "fix"), scores(labels, answer), strict=True):
            half[key] += ok

    for half, floor in README_FLOOR.items():
        assert right[half]["cases"] == floor["cases"], half
        assert all(right[half][key] >= floor[key] for key in floor), (half, dict(right[half]))
