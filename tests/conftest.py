"""Shared helpers for the project's own tests.

Runs of the suite go through ``pytester.runpytest_subprocess`` with ``-p conformance.plugin`` and
a fresh reports dir.  Every such run is tagged with an environment variable that its forkserver
and ranks inherit, so a test can prove that nothing it started is left running.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# The project's own tests need the dev extra; a bare ``pytest`` in a checkout without it says so in
# one line, and says how the machine is tested, instead of failing on the first missing import.
DEV_MODULES = ("psutil", "xmlschema", "junitparser", "jinja2", "prometheus_client", "hypothesis")
_MISSING = [name for name in DEV_MODULES if importlib.util.find_spec(name) is None]
if _MISSING:
    pytest.exit(
        f"these are the project's own tests; they need its dev extra ({', '.join(_MISSING)} not installed): "
        "pip install -e '.[dev]'. To test this machine: pytest suites/",
        returncode=pytest.ExitCode.USAGE_ERROR,
    )

import psutil  # noqa: E402 - after the check that names the extra

from conformance.common.families import INHERITED_FAMILIES  # noqa: E402
from conformance.common.lifetime import process_gone  # noqa: E402
from conformance.plan.matrix import in_rounds  # noqa: E402

pytest_plugins = ["pytester"]

TAG_VARIABLE = "CONFORMANCE_TEST_TAG"
REPO = Path(__file__).resolve().parent.parent


def tagged_processes(tag: str) -> list[int]:
    """PIDs of live processes (not zombies) whose environment carries ``tag``."""
    found = []
    for process in psutil.process_iter():
        try:
            tagged = process.pid != os.getpid() and process.environ().get(TAG_VARIABLE) == tag
            if tagged and not process_gone(process.pid):
                found.append(process.pid)
        except psutil.Error:  # gone meanwhile, or another user's
            continue
    return found


def wait_until_gone(tag: str, seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    left = tagged_processes(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = tagged_processes(tag)
    return left


def wait_while_running(
    proc: subprocess.Popen[bytes], output: Path, ready: Callable[[], bool], what: str, seconds: float = 60.0
) -> None:
    """Poll ``ready`` until it holds; fail, with pytest's output, if pytest ends first or ``seconds`` pass."""
    begun = time.monotonic()
    while time.monotonic() - begun < seconds:
        if ready():
            return
        assert proc.poll() is None, output.read_text()
        time.sleep(0.1)
    pytest.fail(f"{what}:\n{output.read_text()}")


def ladder_lines(reports_dir: Path) -> list[dict[str, Any]]:
    """The latest run's ladder decisions (``ladder.jsonl``), in the order they were written."""
    text = (reports_dir / "latest" / "ladder.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_records(reports_dir: Path) -> list[dict[str, Any]]:
    path = reports_dir / "latest" / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs see no CONFORMANCE_* setting, no inherited NCCL/GLOO/TORCH variable and no GPU.

    So results do not depend on the shell the tests run in (rung ``clean`` is then the same
    environment as ``inherited``), and a GPU host behaves like this machine.
    """
    from conformance.settings import SETTINGS

    for setting in SETTINGS:
        monkeypatch.delenv(setting.env_var, raising=False)
    for name in list(os.environ):
        if name.startswith(INHERITED_FAMILIES):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


WHOLE_SUITE = tuple(sorted(path.name for path in (REPO / "suites").glob("test_*.py")))  # every file of the suite


def copy_suites(pytester: pytest.Pytester, *names: str) -> list[str]:
    """Copy the repository's suite files into the pytester folder; return their relative paths."""
    return copy_suite_files(pytester.path, *names)


def copy_suite_files(folder: Path, *names: str) -> list[str]:
    """Copy the repository's suite files into ``folder``/suites; return their paths relative to ``folder``."""
    target = folder / "suites"
    target.mkdir(exist_ok=True)
    for name in names:
        shutil.copy(REPO / "suites" / name, target / name)
    return [f"suites/{name}" for name in names]


@pytest.fixture
def run_tag(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Tag every process this test starts; fail the test if any outlives it."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG_VARIABLE, tag)
    yield tag
    left = wait_until_gone(tag)
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def reports_dir(pytester: pytest.Pytester) -> Path:
    return pytester.path / "reports"


@pytest.fixture
def run_suite(pytester: pytest.Pytester, reports_dir: Path, run_tag: str) -> Callable[..., pytest.RunResult]:
    """Run pytest on the files already made in ``pytester`` with the conformance plugin."""

    def run(*args: str, timeout: float = 120) -> pytest.RunResult:
        return pytester.runpytest_subprocess(
            "-p", "conformance.plugin", "-p", "no:cacheprovider",
            f"--reports-dir={reports_dir}", *args, timeout=timeout,
        )  # fmt: skip

    return run


def scenario_text(*rules: str, name: str = "test scenario") -> str:
    """A scenario file from rule bodies, e.g. ``'effect = "hang"\\nranks = [1]'``."""
    body = "".join(f"\n[[rule]]\n{rule}\n" for rule in rules)
    return f'[scenario]\nname = "{name}"\n{body}'


PEAK_PROBE = (
    "import re, sys\nfrom pathlib import Path\nfrom conformance.cli.main import main\n"
    "status = main(['diagnose', sys.argv[1]])\n"
    "print('peak', re.search(r'VmHWM:\\s*(\\d+) kB', Path('/proc/self/status').read_text())[1])\n"
    "sys.exit(status)"
)


def diagnose_peak(log: Path, timeout: float = 1200) -> tuple[subprocess.CompletedProcess[str], float]:
    """``conformance diagnose LOG`` in a process of its own, and that process's peak resident memory in MB.

    The process's own peak (VmHWM, its address space's since exec), not getrusage's ru_maxrss: that one is
    kept across fork and exec, so it would count the pytest worker that started the process.
    """
    import sys

    done = subprocess.run(
        [sys.executable, "-c", PEAK_PROBE, str(log)], capture_output=True, text=True, timeout=timeout, check=False
    )
    peak = done.stdout.rsplit("peak", 1)
    return done, int(peak[1]) / 1024 if len(peak) == 2 else float("inf")


COLLECTIVE_TEST = """
from conformance.plan.matrix import DeviceSet

def test_case(conformance_case, conformance):
    conformance_case("{probe}", DeviceSet(conformance.topology.devices, "all"), sizes=[4])
"""


def free_ports(count: int) -> list[int]:
    """``count`` different TCP ports free on loopback now (all held open together while chosen).

    Chosen below the kernel's ephemeral range where there is room: a port the kernel hands out for
    port 0 is also one it may give the next outgoing connection of any process on the machine as
    its local port, between this choice and the test's own bind (``Address already in use``).
    """
    import random
    import socket

    low = _ephemeral_low()
    candidates = random.sample(range(PORTS_FROM, low), min(low - PORTS_FROM, 200)) if low > PORTS_FROM else []
    probes: list[socket.socket] = []
    try:
        for port in candidates:
            if len(probes) == count:
                break
            probe = socket.socket()
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                probe.close()
                continue
            probes.append(probe)
        while len(probes) < count:  # no room below the range: the kernel's choice
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            probes.append(probe)
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


PORTS_FROM = 10000  # the tests' ports: from here to the kernel's ephemeral range


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return PORTS_FROM


def free_port() -> int:
    return free_ports(1)[0]


class Node:
    """One node of a multi-node run: a pytest process of its own, its output in a file."""

    def __init__(self, process: Any, log: Path, reports: Path, started: float) -> None:
        self.process = process
        self.log = log
        self.reports = reports
        self.started = started

    def wait(self, timeout: float = 150) -> tuple[int, float]:
        """(exit code, seconds since it started)."""
        code = self.process.wait(timeout=timeout)
        return code, time.monotonic() - self.started

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")


# The run token the tests' runs across nodes share unless a test gives its own (conformance token's kind).
TEST_RUN_TOKEN = secrets.token_urlsafe(32)


@pytest.fixture
def signed_runs(isolated_env: None, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every pytest this test starts holds the same run token (CONFORMANCE_RUN_TOKEN): its runs across nodes sign."""
    monkeypatch.setenv("CONFORMANCE_RUN_TOKEN", TEST_RUN_TOKEN)
    return TEST_RUN_TOKEN


def start_node(
    folder: Path,
    rank: int,
    nnodes: int,
    port: int,
    *args: str,
    addr: str = "127.0.0.1",
    prefix: tuple[str, ...] = (),
    run_token: str | None = TEST_RUN_TOKEN,
) -> Node:
    """Start ``pytest`` as node ``rank`` in ``folder``, whose suites/ is already copied.

    ``prefix`` goes before the command (``ip netns exec NAME``); ``run_token`` reaches it as
    CONFORMANCE_RUN_TOKEN unless the arguments give a token or --unsigned (None: no token at all).
    """
    import subprocess
    import sys

    reports = folder / f"reports-node{rank}"
    log = folder / f"node{rank}.log"
    command = [
        *prefix, sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider",
        "-p", "no:warnings", "-rfs", f"--reports-dir={reports}", f"--nnodes={nnodes}", f"--node-rank={rank}",
        f"--master-addr={addr}", f"--master-port={port}", *args,
    ]  # fmt: skip
    env = dict(os.environ)
    if run_token is None:
        env.pop("CONFORMANCE_RUN_TOKEN", None)
    elif not any(arg.startswith(("--run-token", "--unsigned")) for arg in args):  # a run across nodes is signed
        env.setdefault("CONFORMANCE_RUN_TOKEN", run_token)
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=folder, stdout=out, stderr=subprocess.STDOUT, env=env)
    return Node(process, log, reports, time.monotonic())


def in_rounds_named(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``plan.matrix.in_rounds`` on device names: the order the plan runs pairs in."""

    @dataclass(frozen=True)
    class Named:
        name: str

    ordered = in_rounds([(Named(a), Named(b)) for a, b in pairs])  # type: ignore[arg-type]
    return [(a.name, b.name) for a, b in ordered]
