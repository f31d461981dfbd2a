"""The suite as a user installs it: a wheel, a fresh environment, no checkout anywhere on the path.

The fresh environment sees this one's site-packages after its own (a ``.pth`` line: torch, pytest
and the rest without installing them again), so its ``conformance`` is the wheel's: the checked
import path says so.  Every way of naming the suite, installed or in a checkout, with and without
xdist, gives the verdicts and counts of ``pytest suites/`` in the checkout.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow
RUN_SECONDS = 300.0


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # setuptools builds in the checkout's build/: two xdist workers building at once would share it.
    with (tmp_path_factory.getbasetemp().parent / "wheel-build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out)]
        built = subprocess.run([*command, str(REPO)], capture_output=True, text=True, timeout=RUN_SECONDS, check=False)
    assert built.returncode == 0, built.stderr
    return next(out.glob("gpu_conformance-*.whl"))


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel installed; returns its bin/ folder."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=RUN_SECONDS)
    python = venv / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(own, "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True, text=True, timeout=RUN_SECONDS, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return venv / "bin"


def clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("CONFORMANCE_")
    }


def test_the_wheel_holds_the_suites_the_scenarios_the_plugin_and_the_command(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "conformance/suites/test_pairs.py" in names and "conformance/suites/__init__.py" in names
    catalogues = (REPO / "conformance").glob("*/catalogues/*.json")  # the NCCL and CUDA catalogues
    for shipped in [*(REPO / "conformance" / "scenarios").rglob("*"), *catalogues]:  # every scenario, topology, run
        if shipped.is_file() and "__pycache__" not in shipped.parts:
            assert shipped.relative_to(REPO).as_posix() in names, shipped
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[pytest11]\nconformance.plugin = conformance.plugin" in text
    assert "[console_scripts]\nconformance = conformance.cli.main:console" in text
    assert "conformance-healthcheck = conformance.cli.slurm_health:console" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)  # the MIT text, as project.license says
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT\n" in metadata
    requires = [
        line.removeprefix("Requires-Dist: ") for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    ]
    core = [r for r in requires if "extra ==" not in r]
    assert not [r for r in core if r.startswith(("jinja2", "junitparser"))], core  # a GPU image runs without them
    assert 'jinja2>=3.1; extra == "report"' in requires and 'junitparser>=3; extra == "junit"' in requires, requires


# What the core install lacks: imported, they fail (the outer environment this one sees has them).
WITHOUT_EXTRAS = "import sys; sys.modules['jinja2'] = sys.modules['junitparser'] = None; "


def test_installed_without_its_extras_the_plugin_imports_and_the_suite_runs(installed: Path, tmp_path: Path) -> None:
    """The core install (``pip install --no-deps`` plus the run's dependencies): no jinja2, no junitparser."""
    env = {**clean_env(), "CUDA_VISIBLE_DEVICES": ""}
    script = WITHOUT_EXTRAS + (
        "import conformance, conformance.plugin, conformance.cli.main, conformance.cli.slurm_health; "
        "print(conformance.__file__); import pytest; "
        "sys.exit(pytest.main(['--pyargs', 'conformance.suites.test_environment', '-p', 'no:cacheprovider', "
        "'--reports-dir=reports']))"
    )
    run = subprocess.run(
        [str(installed / "python"), "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=RUN_SECONDS,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith(str(installed.parent)), run.stdout  # the wheel's conformance, not the checkout's
    assert "passed" in run.stdout and "conformance: run " in run.stdout
    helped = subprocess.run(
        [str(installed / "conformance-healthcheck"), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert helped.returncode == 0 and helped.stdout.startswith("usage: conformance-healthcheck "), helped.stderr


def test_installed_the_suite_runs_from_any_folder_with_pyargs(installed: Path, tmp_path: Path) -> None:
    env = clean_env()
    where = subprocess.run(
        [str(installed / "python"), "-c", "import conformance; print(conformance.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert str(installed.parent) in where and str(REPO) not in where, where
    version = subprocess.run(
        [str(installed / "conformance"), "--version"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert (version.returncode, version.stdout.strip()) == (0, "gpu-conformance 0.1.0"), version.stderr
    run = subprocess.run(
        [str(installed / "python"), "-m", "pytest", "--pyargs", "conformance.suites.test_environment",
         "-p", "no:cacheprovider", "--reports-dir=reports"],
        cwd=tmp_path, env={**env, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=RUN_SECONDS,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "passed" in run.stdout and "conformance: run " in run.stdout
    records = [
        json.loads(line) for line in (tmp_path / "reports" / "latest" / "results.jsonl").read_text().splitlines()
    ]
    assert records and all(r["nodeid"].startswith("suites/test_environment.py::") for r in records), records


def test_installed_the_plugin_stays_out_of_other_pytest_runs(installed: Path, tmp_path: Path) -> None:
    """The entry point loads it into every pytest run there; a run of other tests sees nothing of it."""
    (tmp_path / "test_mine.py").write_text("def test_mine():\n    assert True\n")
    run = subprocess.run(
        [str(installed / "python"), "-m", "pytest", "-p", "no:cacheprovider", "test_mine.py"],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=RUN_SECONDS,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "conformance:" not in run.stdout and "plugins: gpu-conformance-0.1.0" in run.stdout, run.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test_mine.py"]  # no reports folder, nothing else


def test_a_test_using_the_suites_fixtures_outside_a_suite_run_says_how_to_run_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own(conformance_case):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        "ERROR: conformance: test_own.py::test_own uses the suite's fixtures, but this run is not the suite's: "
        "name the suite (pytest --pyargs conformance.suites, or its folder) or add -p conformance.plugin"
    ) in result.stderr.str()
    assert pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "conformance.plugin", "--co").ret == 0


Verdicts = dict[str, str]


def run_the_suite(python: Path, cwd: Path, reports: Path, *naming: str) -> tuple[Verdicts, dict[str, int]]:
    """Run the suite as named; its records' verdicts by test and pytest's counts of its outcomes."""
    run = subprocess.run(
        [str(python), "-m", "pytest", *naming, "-p", "no:cacheprovider", f"--reports-dir={reports}"],
        cwd=cwd, env={**clean_env(), "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
        timeout=RUN_SECONDS,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    last = run.stdout.strip().splitlines()[-1]
    counts = {word: int(number) for number, word in re.findall(r"(\d+) (\w+)", last)}
    records = [json.loads(line) for line in (reports / "latest" / "results.jsonl").read_text().splitlines()]
    return {r["nodeid"]: r["verdict"] for r in records}, counts


@pytest.fixture(scope="module")
def checkout_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Verdicts, dict[str, int]]:
    """``pytest suites/`` in the checkout, as the README's quick start runs it."""
    return run_the_suite(Path(sys.executable), REPO, tmp_path_factory.mktemp("reports"), "suites/")


NAMINGS = {
    "suites": ("checkout", "suites/"),
    "package-folder": ("checkout", "conformance/suites"),
    "one-file": ("checkout", "suites/test_collectives.py"),
    "pyargs-elsewhere": ("elsewhere", "--pyargs", "conformance.suites"),
}


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["plain", "xdist"])
@pytest.mark.parametrize("naming", sorted(NAMINGS))
def test_every_way_of_naming_the_suite_gives_the_same_verdicts(
    checkout_run: tuple[Verdicts, dict[str, int]], tmp_path: Path, naming: str, xdist: tuple[str, ...]
) -> None:
    where, *args = NAMINGS[naming]
    cwd = REPO if where == "checkout" else tmp_path
    verdicts, counts = run_the_suite(Path(sys.executable), cwd, tmp_path / "reports", *args, *xdist)
    expected, expected_counts = checkout_run
    if naming == "one-file":  # a part of the suite: its own tests' verdicts, the same as in the whole
        expected = {k: v for k, v in expected.items() if k.startswith("suites/test_collectives.py::")}
    else:
        assert counts == expected_counts
    assert verdicts == expected


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["plain", "xdist"])
def test_installed_the_whole_suite_gives_the_checkouts_verdicts(
    installed: Path, checkout_run: tuple[Verdicts, dict[str, int]], tmp_path: Path, xdist: tuple[str, ...]
) -> None:
    verdicts, counts = run_the_suite(
        installed / "python", tmp_path, tmp_path / "reports", "--pyargs", "conformance.suites", *xdist
    )
    assert (verdicts, counts) == checkout_run


MODULE_LINES = 550  # pytest-timeout's one module, the size STYLE.md holds a module to: split by responsibility past it


def test_no_module_of_the_package_is_over_550_lines() -> None:
    over = {
        str(path.relative_to(REPO)): lines
        for path in sorted((REPO / "conformance").rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MODULE_LINES
    }
    assert not over, f"split these by responsibility (at most {MODULE_LINES} lines a module): {over}"
