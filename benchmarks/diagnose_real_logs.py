"""How often ``conformance diagnose`` is right on real logs from public issue threads, on both halves.

Each folder of tests/data/diagnose/real/ holds a log as a user posted it and ``case.toml``: the
thread's URL, the class the thread established, the root-cause rank (-1: none named), words a right
fix must contain, and how the log ends.  The labels were set from the threads before diagnose ever
read the logs.  ``split.toml`` names the third set aside before any rule was written from the corpus
(tools/split_corpus.py): the figures are printed for the half the rules were developed on and for the
half set aside, one line per class, then the false answers that matter most: "no failure" on a
failed job's log.  Cases are listed one per line for the developed half only (``--all`` lists both).

    python benchmarks/diagnose_real_logs.py [--all] [--markdown] [FOLDER]
"""

from __future__ import annotations

import argparse
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
HALVES = ("developed on", "set aside")


def diagnose_case(folder: Path) -> tuple[dict[str, object], dict[str, object]]:
    """(the thread's labels, diagnose's JSON answer) for one case folder."""
    labels = tomllib.loads((folder / "case.toml").read_text())
    logs = [str(p) for p in sorted(folder.iterdir()) if p.name != "case.toml"]
    out = StringIO()
    with redirect_stdout(out):
        main(["diagnose", "--json", *logs])
    return labels, json.loads(out.getvalue())


def verdict_right(labels: dict[str, object], answer: dict[str, object]) -> bool:
    """Whether the answer to a job that did not fail is right.

    "no failure" where its log shows the normal end; where the posted log is cut before the end, any
    answer but "no failure" (nothing in it can show the job ended).
    """
    if labels.get("ending") == "normal":
        return answer["verdict"] == "no failure"
    return answer["verdict"] != "no failure"


def scores(labels: dict[str, object], answer: dict[str, object]) -> tuple[bool, bool, bool]:
    """(class right, root rank right, fix right); a job that did not fail: the verdict is the class and the fix."""
    expected = labels["class"]
    if expected == "none":
        right = verdict_right(labels, answer)
        return right, right and answer["root_ranks"] == [], right
    class_right = answer["class"] == expected
    root = labels["root_rank"]
    root_right = answer["root_ranks"] == ([] if root == -1 else [root])
    fix = f"{answer['title']} {answer['fix']} {answer['check']}".lower()  # the answer's cause line, its fix, its check
    keywords = [str(k).lower() for k in labels.get("fix_keywords", [])]  # type: ignore[attr-defined]
    fix_right = answer["failure_found"] is True and all(k in fix for k in keywords)
    return class_right, root_right, fix_right


def held_out(folder: Path) -> set[str]:
    split = folder / "split.toml"
    return set(tomllib.loads(split.read_text())["held_out"]) if split.is_file() else set()


def _cells(counts: Counter[str]) -> str:
    n = counts["cases"]
    return f"{n} | {counts['class']} | {counts['root']} | {counts['fix']}" if n else "0 | | |"


def print_markdown(per_class: dict[tuple[str, str], Counter[str]], totals: dict[str, Counter[str]]) -> None:
    """The per-class table for docs/diagnose.md: each half's cases, class, root and fix right."""
    print("| thread's class | developed on: cases | class | root | fix | set aside: cases | class | root | fix |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in sorted({name for name, _ in per_class}):
        row = " | ".join(_cells(per_class.get((name, half), Counter())) for half in HALVES)
        print(f"| `{name}` | {row} |")
    shares = []
    for half in HALVES:
        t = totals[half]
        shares.append(
            " | ".join(
                [f"**{t['cases']}**", *(f"**{t[k]} ({t[k] / t['cases']:.0%})**" for k in ("class", "root", "fix"))]
            )
        )
    print(f"| **all** | {' | '.join(shares)} |")


def print_scores(folder: Path, list_all: bool = False, markdown: bool = False) -> int:
    aside = held_out(folder)
    totals = {half: Counter[str]() for half in HALVES}
    per_class: dict[tuple[str, str], Counter[str]] = {}
    false_green: list[str] = []
    for case in sorted(p for p in folder.iterdir() if (p / "case.toml").is_file()):
        labels, answer = diagnose_case(case)
        half = HALVES[case.name in aside]
        right = scores(labels, answer)
        counts = per_class.setdefault((str(labels["class"]), half), Counter())
        for name, ok in zip(("class", "root", "fix"), right, strict=True):
            totals[half][name] += ok
            counts[name] += ok
        totals[half]["cases"] += 1
        counts["cases"] += 1
        if labels["class"] != "none" and answer["verdict"] == "no failure":
            false_green.append(f"{case.name} ({half})")
        if labels["class"] != "none" and answer["verdict"] == "not judged":
            totals[half]["not judged"] += 1
        if (half == HALVES[0] or list_all) and not markdown:
            marks = " ".join("ok " if ok else "-- " for ok in right)
            got = answer["class"] or answer["verdict"]
            print(f"{marks} {case.name:52} expected {labels['class']:18} got {got}")
    if markdown:
        print_markdown(per_class, totals)
        return 0
    print(f"\n{'class':18} {'half':13} cases  class  root  fix")
    for (name, half), counts in sorted(per_class.items()):
        print(f"{name:18} {half:13} {counts['cases']:5}  {counts['class']:5}  {counts['root']:4}  {counts['fix']:3}")
    for half in HALVES:
        t = totals[half]
        n = t["cases"] or 1
        shares = ", ".join(f"{name} {t[key] / n:.0%}" for name, key in SHARES)
        print(f"{half:13} {t['cases']:3} cases: {shares}; failed jobs not judged: {t['not judged']}")
    print(
        f"'no failure' on a failed job's log: {len(false_green)}" + (f" ({', '.join(false_green)})" * bool(false_green))
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", type=Path, default=DATA)
    parser.add_argument("--all", action="store_true", help="list the set-aside cases one by one too")
    parser.add_argument("--markdown", action="store_true", help="print the per-class table for the docs")
    arguments = parser.parse_args()
    sys.exit(print_scores(arguments.folder, arguments.all, arguments.markdown))
