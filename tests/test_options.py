"""The suite's options beside popular plugins', and what --help shows of them.

The plugins: pytest-html, pytest-cov, pytest-benchmark, pytest-xdist, pytest-timeout, pytest-rerunfailures.

The plugins the project does not need are installed for the comparison alone, into a folder of
their own (``pip --target``), so the project's other tests never load them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.common.values import BadValue, message_bytes
from conformance.settings import SETTINGS

EXTRA = ("pytest-html", "pytest-metadata", "pytest-cov", "coverage", "pytest-benchmark", "py-cpuinfo",
         "pytest-rerunfailures")  # fmt: skip
POPULAR = ("html", "cov", "benchmark", "xdist", "timeout", "rerunfailures")
DUMP_OPTIONS = """
import json

def pytest_configure(config):
    parser = config._parser  # the one place pytest keeps every registered option
    found = {}
    for group in [*parser._groups, parser._anonymous]:
        for option in group.options:
            found.update({name: group.name for name in option.names() if name.startswith("--")})
    plugins = sorted(name for name, _ in config.pluginmanager.list_name_plugin() if name)
    with open("options.json", "w") as out:
        json.dump({"options": found, "plugins": plugins}, out)
"""


def confusable(ours: str, theirs: str) -> bool:
    """The same option, or one the other with a word added (``--html-report`` beside ``--html``)."""
    a, b = ours.lstrip("-").replace("_", "-"), theirs.lstrip("-").replace("_", "-")
    return a == b or a.startswith(b + "-") or b.startswith(a + "-")


@pytest.fixture(scope="module")
def plugins_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("popular-plugins")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder), *EXTRA],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot install {', '.join(EXTRA)} to compare options with: {done.stderr.strip()[-300:]}")
    return folder


@pytest.mark.slow
def test_no_option_collides_with_or_looks_like_a_popular_plugins(
    pytester: pytest.Pytester, plugins_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(plugins_folder))
    pytester.makepyfile(dump_options=DUMP_OPTIONS)
    result = pytester.runpytest_subprocess("-p", "dump_options", "-p", "conformance.plugin", "--co", "-q")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stdout.str() + result.stderr.str()
    dumped = json.loads((pytester.path / "options.json").read_text())
    missing = [name for name in POPULAR if not any(name in plugin for plugin in dumped["plugins"])]
    assert not missing, f"not loaded: {missing} (loaded: {dumped['plugins']})"
    others = {name: group for name, group in dumped["options"].items() if group != "conformance"}
    assert confusable("--html-report", "--html") and "--html" in others  # the rule catches the old name
    clashes = [
        f"{setting.option} beside {name} ({group})"
        for setting in SETTINGS
        for name, group in others.items()
        if confusable(setting.option, name)
    ]
    assert clashes == []


def test_help_names_the_kind_of_each_value(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("-p", "conformance.plugin", "--help")
    assert result.ret == 0
    lines = result.stdout.str()
    for setting in SETTINGS:
        match = re.search(rf"^  {re.escape(setting.option)}(=(\S+))?", lines, flags=re.MULTILINE)
        assert match, setting.option
        metavar = match.group(2)
        if setting.is_flag:
            assert metavar is None, setting.option
        else:
            assert metavar is not None and metavar != setting.name.upper(), (setting.option, metavar)
    assert "--case-timeout=SECONDS" in lines and "--backend={auto,gloo,nccl}" in lines


@pytest.mark.parametrize(
    ("raw", "value"),
    [("64M", 64 << 20), ("8G", 8 << 30), ("8GiB", 8 << 30), ("1024", 1024), ("256k", 256 << 10)],
)
def test_a_message_size_reads_as_nccl_tests_reads_it(raw: str, value: int) -> None:
    assert message_bytes(raw) == value


@pytest.mark.parametrize("raw", ["", "8 T", "-1", "2", "17G", "lots"])
def test_a_message_size_out_of_range_or_not_a_size_is_refused(raw: str) -> None:
    with pytest.raises(BadValue):
        message_bytes(raw)
