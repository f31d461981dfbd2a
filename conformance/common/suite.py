"""Where the suite lives, and the test ids its records carry wherever it was run from.

The suite is the package ``conformance.suites``; a checkout's ``suites/`` is a link to it.  pytest
names a test by its path from the rootdir, so the same test is ``suites/test_pairs.py::...`` in
a checkout and ``::...`` (a path outside the rootdir) under ``pytest --pyargs`` elsewhere; the
records name every test of the suite the checkout's way, so runs compare whichever way they ran.
"""

from __future__ import annotations

from pathlib import Path

SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"
SUITES_PACKAGE = "conformance.suites"
SCENARIOS_DIR = Path(__file__).resolve().parent.parent / "scenarios"  # the simulated machines it ships
BASELINES_DIR = SCENARIOS_DIR / "baselines"  # runs of healthy simulated machines, to compare broken ones with


def shipped_scenarios() -> list[str]:
    """The names of the scenarios the package ships (``--scenario NAME`` takes them)."""
    return sorted(path.stem for path in SCENARIOS_DIR.glob("*.toml"))


def scenario_path(path: Path) -> Path:
    """``path`` itself when it exists, else the shipped scenario of that name (with or without ``.toml``)."""
    shipped = SCENARIOS_DIR / f"{path.name.removesuffix('.toml')}.toml"
    return shipped if not path.exists() and shipped.is_file() else path


def shipped_baselines() -> list[str]:
    """The names of the baseline runs the package ships (``--baseline NAME`` takes them)."""
    return sorted(path.name for path in BASELINES_DIR.iterdir() if (path / "results.jsonl").is_file())


def baseline_path(path: Path) -> Path:
    """``path`` itself when it exists, else the shipped baseline run of that name."""
    shipped = BASELINES_DIR / path.name
    return shipped if not path.exists() and (shipped / "results.jsonl").is_file() else path


def record_nodeid(path: Path, nodeid: str) -> str:
    """``nodeid`` of a test in ``path``; a test of the suite as ``suites/<file>::<name>`` however it was run."""
    resolved = path.resolve()
    if SUITES_DIR not in resolved.parents:
        return nodeid
    name = nodeid.split("::", 1)[1] if "::" in nodeid else nodeid
    return f"suites/{resolved.relative_to(SUITES_DIR).as_posix()}::{name}"
