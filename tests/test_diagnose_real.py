"""``conformance diagnose`` on real logs from public issue threads (tests/data/diagnose/real/).

Each case's labels come from its thread (case.toml names the URL), set before diagnose read the
logs.  Every case must be usable input; the shares right must not fall below what the README states.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from diagnose_real_logs import DATA, diagnose_case, scores  # noqa: E402

CASES = sorted(p for p in DATA.iterdir() if (p / "case.toml").is_file())
README_FLOOR = {"class": 14, "root": 17, "fix": 15}  # README's "Real logs" table, of 19 cases


@pytest.mark.parametrize("case", CASES, ids=[p.name for p in CASES])
def test_every_real_log_is_read(case: Path) -> None:
    labels, answer = diagnose_case(case)

    assert answer["lines"], "nothing was read"
    assert labels["source"].startswith("https://github.com/")  # type: ignore[union-attr]
    if labels["class"] == "none":
        assert answer["class"] is None, answer  # a job that did not fail is never given a cause


def test_the_shares_right_are_at_least_the_readmes() -> None:
    right = {"class": 0, "root": 0, "fix": 0}
    for case in CASES:
        for name, ok in zip(right, scores(*diagnose_case(case)), strict=True):
            right[name] += ok

    assert len(CASES) == 19
    assert right == {name: max(count, README_FLOOR[name]) for name, count in right.items()}, right
