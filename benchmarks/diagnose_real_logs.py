"""How often ``conformance diagnose`` is right on real logs from public issue threads.

Each folder of tests/data/diagnose/real/ holds a log as a user posted it and ``case.toml``: the
thread's URL, the class the thread established, the root-cause rank (-1: none named), and words a
right fix must contain.  The labels were set from the threads before diagnose ever read the logs.
Prints one line per case and the shares right: class, root-cause rank, fix.

    python benchmarks/diagnose_real_logs.py [FOLDER]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import tomllib

from conformance.cli.main import main

SHARES = (("class", "class"), ("root-cause rank", "root"), ("fix", "fix"))
DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "diagnose" / "real"


def diagnose_case(folder: Path) -> tuple[dict[str, object], dict[str, object]]:
    """(the thread's labels, diagnose's JSON answer) for one case folder."""
    labels = tomllib.loads((folder / "case.toml").read_text())
    logs = [str(p) for p in sorted(folder.iterdir()) if p.name != "case.toml"]
    out = StringIO()
    with redirect_stdout(out):
        main(["diagnose", "--json", *logs])
    return labels, json.loads(out.getvalue())


def scores(labels: dict[str, object], answer: dict[str, object]) -> tuple[bool, bool, bool]:
    """(class right, root rank right, fix right); "none" is right only when no failure was found."""
    expected = labels["class"]
    found = answer["class"] or "none"
    class_right = found == expected
    root = labels["root_rank"]
    root_right = answer["root_ranks"] == ([] if root == -1 else [root])
    fix = f"{answer['title']} {answer['fix']} {answer['check']}".lower()  # the answer's cause line, its fix, its check
    keywords = [str(k).lower() for k in labels.get("fix_keywords", [])]  # type: ignore[attr-defined]
    fix_right = (found == "none") if expected == "none" else all(k in fix for k in keywords)
    return class_right, root_right, fix_right


def print_scores(folder: Path) -> int:
    totals: Counter[str] = Counter()
    per_class: dict[str, Counter[str]] = {}
    for case in sorted(p for p in folder.iterdir() if (p / "case.toml").is_file()):
        labels, answer = diagnose_case(case)
        right = scores(labels, answer)
        counts = per_class.setdefault(str(labels["class"]), Counter())
        for name, ok in zip(("class", "root", "fix"), right, strict=True):
            totals[name] += ok
            counts[name] += ok
        totals["cases"] += 1
        counts["cases"] += 1
        marks = " ".join("ok " if ok else "-- " for ok in right)
        print(f"{marks} {case.name:44} expected {labels['class']:18} got {answer['class'] or 'none'}")
    print(f"\n{'class':18} cases  class  root  fix")
    for name, counts in sorted(per_class.items()):
        print(f"{name:18} {counts['cases']:5}  {counts['class']:5}  {counts['root']:4}  {counts['fix']:3}")
    n = totals["cases"]
    print(f"{'all':18} {n:5}  {totals['class']:5}  {totals['root']:4}  {totals['fix']:3}")
    shares = ", ".join(f"{name} {totals[key] / n:.0%}" for name, key in SHARES)
    print(f"shares right: {shares}")
    return 0


if __name__ == "__main__":
    sys.exit(print_scores(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA))
