"""Every path the suite is given: a symbolic link loop or a path it cannot use is one line, never a traceback.

Issue 51, item 7.  The walk finds the places itself: every setting whose value is a path
(``Setting.is_path`` in ``conformance/settings.py``) and every path argument of every
``python -m conformance`` command (found in the commands' own parsers).  Each is given

* a symbolic link loop (``loop -> loop2 -> loop``): Python 3.10-3.12's ``Path.resolve()`` raised
  RuntimeError for one, INTERNALERROR exit 3 in a pytest run, a traceback from merge-junit;
* a path it cannot use: a named pipe (FIFO) no one writes to.  The tests run as root, for whom
  no chmod makes a file unreadable; a FIFO is refused whatever the user, where a file is wanted
  (opening it would block) and where a folder is wanted (nothing can be made in it) alike.

A pytest run refuses with ``pytest.UsageError`` (exit status 4) and one line; a command with
exit status 2 and one line on stderr (``conformance/cli/common.py``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.cli.main import build_parser, main
from conformance.settings import SETTINGS
from test_bad_cli_input import MERGE_RUN_A, prepare, run_folder

pytestmark = pytest.mark.usefixtures("isolated_env")

PATH_SETTINGS = [setting for setting in SETTINGS if setting.is_path]
BAD_PATHS = ("loop", "fifo")


def bad_path(folder: Path, kind: str) -> Path:
    if kind == "loop":
        (folder / "loop").symlink_to("loop2")
        (folder / "loop2").symlink_to("loop")
        return folder / "loop"
    os.mkfifo(folder / "fifo")
    return folder / "fifo"


def test_the_walk_finds_every_path_setting() -> None:
    """A new path setting is walked as soon as it is declared one (``is_path``); these are today's."""
    names = {setting.name for setting in PATH_SETTINGS}
    assert names >= {"env_rungs_file", "topology_file", "scenario", "reports_dir", "metrics_file", "baseline"}


@pytest.mark.parametrize("kind", BAD_PATHS)
@pytest.mark.parametrize("setting", PATH_SETTINGS, ids=[s.name for s in PATH_SETTINGS])
def test_a_path_setting_refuses_a_loop_or_an_unusable_path_in_one_line(
    pytester: pytest.Pytester, setting: object, kind: str
) -> None:
    option = setting.option  # type: ignore[attr-defined]
    path = bad_path(pytester.path, kind)
    pytester.makepyfile(test_nothing="def test_nothing(conformance):\n    pass\n")
    reports = () if option == "--reports-dir" else (f"--reports-dir={pytester.path / 'reports'}",)

    result = pytester.runpytest_inprocess(
        "-p", "conformance.plugin", "-p", "no:cacheprovider", *reports, f"{option}={path}"
    )

    said = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, said
    errors = [line for line in result.stderr.lines if line.strip()]
    assert len(errors) == 1 and "Traceback" not in said and "INTERNALERROR" not in said, said
    assert errors[0].startswith(f"ERROR: conformance: command-line option {option}: "), errors
    assert path.name in errors[0], errors


def cli_path_arguments() -> Iterator[tuple[str, str]]:
    """(command, argument) for every argument of a command that names a file or a folder."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sorted(commands.choices.items()):
        for action in command._actions:
            if action.type is Path or action.metavar in ("RUN", "BASELINE", "CURRENT"):
                yield name, action.option_strings[-1] if action.option_strings else action.dest


CLI_PATHS = sorted(set(cli_path_arguments()))


def test_the_walk_finds_every_path_argument() -> None:
    assert set(CLI_PATHS) >= {
        ("compare", "baseline"), ("compare", "current"), ("compare", "--reports-dir"),
        ("diagnose", "paths"), ("merge-junit", "--output"), ("merge-junit", "inputs"),
        ("recommend", "run_path"), ("recommend", "--reports-dir"), ("report", "run_path"),
        ("report", "--reports-dir"), ("smoke", "--out"), ("topology", "--topology-file"),
    }  # fmt: skip


POSITIONAL = {"compare": ("baseline", "current"), "recommend": ("run_path",), "report": ("run_path",)}
POSITIONAL |= {"diagnose": ("paths",), "merge-junit": ("inputs",)}
REQUIRED = {"merge-junit": ("--output",)}


def command_line(command: str, argument: str, bad: Path, d: Path) -> list[str]:
    """The command with ``bad`` for ``argument`` and good values for every other argument it needs."""
    good = {
        "baseline": str(d / "old"),
        "current": str(d / "run"),
        "run_path": str(d / "run"),
        "paths": str(d / "job.log"),
        "inputs": str(d / "a.xml"),
        "--output": str(d / "merged.xml"),
    }
    if argument == "--reports-dir":  # the run it reads is found there: reports/latest
        good = {**good, "run_path": "", "current": "run-a"}
    value = {name: str(bad) if name == argument else good[name] for name in {*good, argument}}
    options = [
        part for name in {*REQUIRED.get(command, ()), argument} if name.startswith("-") for part in (name, value[name])
    ]
    return [command, *options, *(value[name] for name in POSITIONAL.get(command, ()) if value[name])]


@pytest.mark.parametrize("kind", BAD_PATHS)
@pytest.mark.parametrize(("command", "argument"), CLI_PATHS, ids=[f"{c} {a}" for c, a in CLI_PATHS])
def test_a_command_refuses_a_loop_or_an_unusable_path_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    argument: str,
    kind: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    prepare(tmp_path, {**MERGE_RUN_A, **run_folder("old"), **run_folder(), "job.log": "[rank0]:step 1\n"})
    bad = bad_path(tmp_path, kind)

    status = main(command_line(command, argument, bad, tmp_path))

    out, err = capsys.readouterr()
    assert status == 2 and "Traceback" not in err, (status, out, err)
    assert err.count("\n") == 1 and err.startswith(f"python -m conformance {command}: "), err
    assert bad.name in err, err
