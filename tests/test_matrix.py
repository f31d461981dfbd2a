"""The environment matrix: rungs (built-in and the user's), the plan, and the adaptive ladder.

Validation errors go through real pytest subprocesses (exit status 4, one line naming the source);
the plan is checked with ``--collect-only`` on a simulated 8-GPU NVSwitch box; the adaptive
ladder is checked on small simulated machines whose pairs are played by real gloo ranks, with the
decisions read back from ``ladder.jsonl`` and the cases from ``results.jsonl``.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from xml.etree import ElementTree

import pytest

from conformance.common.deadlines import Deadlines
from conformance.plan.ladder import CLAIMS_FILE, OUT_OF_ORDER, LadderBook, RungDecision, Step
from conformance.plan.matrix import (
    BUILTIN_LADDER,
    INHERITED,
    Rung,
    RungError,
    build_ladder,
    load_rungs_file,
    parse_rung_spec,
)
from conformance.plan.relevance import RUNG_REACH, Between, cannot_change
from conformance.plan.transport import NcclHost, PairPath
from conftest import COLLECTIVE_TEST, REPO, copy_suites, in_rounds_named, ladder_lines, read_records, scenario_text
from test_seed_scenarios import failed_nodeids

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RunSuite = Callable[..., pytest.RunResult]

BUILTIN_NAMES = [
    "inherited", "clean", "nvls_off", "cumem_host_off", "cumem_off", "p2p_level_nvl",
    "p2p_off", "shm_off", "p2p_shm_off", "ib_off", "net_socket",
]  # fmt: skip
FAMILIES = "NCCL_, TORCH_NCCL_, TORCH_, GLOO_, CUDA_"
TIMEOUTS = ("--step-timeout=3", "--op-timeout=2", "--init-timeout=2", "--grace=1")
NVSWITCH = REPO / "scenarios" / "topologies" / "nvswitch-8gpu.json"
ALREADY_PASSED = "adaptive matrix: rung {} already passed"
SAME_ENV = "same environment as rung inherited here"

PAIR_TEST = """
def test_pair(conformance_case, device_pair):
    conformance_case("pair_exchange", device_pair, sizes=[4])
"""


pytestmark = pytest.mark.usefixtures("isolated_env")


def write_topology(pytester: pytest.Pytester, name: str, links: dict[str, str], cpu: str = "amd") -> Path:
    """A simulated GPU machine (the topology file format), its GPUs named by the links given.

    AMD CPUs by default: NCCL then uses P2P over every path of a pair, SYS included (transport.py).
    """
    names = sorted({n for key in links for n in key.split("-")}, key=lambda n: int(n[3:]))
    devices = [{"name": n, "index": i, "kind": "gpu", "numa_node": 0} for i, n in enumerate(names)]
    data = {"kind": "gpu", "source": "file", "note": f"simulated: {name}", "devices": devices, "links": links}
    data["cpu"] = cpu
    path = pytester.path / f"{name}.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def ladder_map(reports_dir: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(key, rung) -> (outcome, reason); every (key, rung) must be decided exactly once."""
    lines = ladder_lines(reports_dir)
    counts = Counter((line["key"], line["rung"]) for line in lines)
    assert [k for k, n in counts.items() if n > 1] == [], "a rung was decided twice"
    return {(line["key"], line["rung"]): (line["outcome"], line["reason"]) for line in lines}


def verdict_map(reports_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """Ladder key -> [(rung, verdict), ...] in ladder order."""
    found: dict[str, list[tuple[str, str]]] = {}
    for record in read_records(reports_dir):
        found.setdefault(record["ladder_key"], []).append((record["env_name"], record["verdict"]))
    return {key: sorted(rungs, key=lambda rv: BUILTIN_NAMES.index(rv[0])) for key, rungs in found.items()}


def table_row(first: str, width: int, cells: dict[str, str]) -> str:
    """A line of the link class x rung table: the class, then each cell right-aligned under its rung."""
    return first.ljust(width) + "".join(f"{cell:>{len(name) + 2}}" for name, cell in cells.items())


def assert_nothing_recorded(reports_dir: Path) -> None:
    """A refused run starts no case: no run folder, no ``latest``, no records."""
    left = sorted(p.relative_to(reports_dir) for p in reports_dir.rglob("*")) if reports_dir.exists() else []
    assert left == [], f"a refused run left {left}"


# ---------------------------------------------------------------------------------------------
# Rung validation through real runs
# ---------------------------------------------------------------------------------------------


@dataclass
class Bad:
    """A bad rung input and the message it must produce ({here}: the run folder, {ini}: its ini file)."""

    message: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    ini: str | None = None
    rungs_file: str | bytes | None = None
    prefix: bool = False  # the message is where the line starts (the rest is the fix's wording)


NOT_IDENTIFIER = "rung name {!r} is not a valid identifier"
TAKEN = "rung name {!r} is already taken"
OUTSIDE = f"variable 'PATH' is not in the {FAMILIES} families"
CLI = "command-line option --env-rung: "
ENV = "environment variable CONFORMANCE_ENV_RUNG: "
INI = "ini key conformance_env_rung in {ini}: "
FILE_CLI = "command-line option --env-rungs-file: rungs file '{here}/rungs.toml'"
IN_FILE = "{here}/rungs.toml rung "
RUNG_TABLE = 'a rung takes name = "..." and env = {{ VAR = "value" }}'
NOT_TOML = "this is = = not toml\n"

BAD_RUNGS = {
    # --env-rung
    "cli-name-starts-with-digit": Bad(CLI + NOT_IDENTIFIER.format("1bad"), ("--env-rung=1bad:NCCL_X=1",)),
    "cli-name-with-dash": Bad(CLI + NOT_IDENTIFIER.format("a-b"), ("--env-rung=a-b:NCCL_X=1",)),
    "cli-duplicate-name": Bad(CLI + TAKEN.format("mine"), ("--env-rung=mine:NCCL_X=1", "--env-rung=mine:NCCL_Y=2")),
    "cli-builtin-name": Bad(CLI + TAKEN.format("p2p_off"), ("--env-rung=p2p_off:NCCL_X=1",)),
    "cli-variable-outside-families": Bad(CLI + OUTSIDE, ("--env-rung=mine:PATH=/x",)),
    "cli-missing-equals": Bad(CLI + "'NCCL_X' in 'mine:NCCL_X' is not VAR=VALUE", ("--env-rung=mine:NCCL_X",)),
    "cli-second-assignment-missing-equals": Bad(
        CLI + "'NCCL_Y' in 'mine:NCCL_X=1,NCCL_Y' is not VAR=VALUE", ("--env-rung=mine:NCCL_X=1,NCCL_Y",)
    ),
    "cli-missing-colon": Bad(CLI + "'mineNCCL_X=1' is not NAME:VAR=VALUE[,VAR=VALUE...]", ("--env-rung=mineNCCL_X=1",)),
    "cli-no-assignment": Bad(CLI + "'' in 'mine:' is not VAR=VALUE", ("--env-rung=mine:",)),
    "cli-variable-twice": Bad(
        CLI + "NCCL_ALGO is set twice in 'x:NCCL_ALGO=Ring,NCCL_ALGO=Tree'; a rung sets each variable once",
        ("--env-rung=x:NCCL_ALGO=Ring,NCCL_ALGO=Tree",),
    ),
    "override-ini-name": Bad(
        "command-line option -o conformance_env_rung: " + NOT_IDENTIFIER.format("a-b"),
        ("-o", "conformance_env_rung=a-b:NCCL_X=1"),
    ),
    # the ini line list
    "ini-bad-name": Bad(
        INI + NOT_IDENTIFIER.format("bad-name"), ini="conformance_env_rung =\n    good:NCCL_A=1\n    bad-name:NCCL_B=1"
    ),
    "ini-duplicate-name": Bad(
        INI + TAKEN.format("mine"), ini="conformance_env_rung =\n    mine:NCCL_A=1\n    mine:NCCL_B=1"
    ),
    "ini-builtin-name": Bad(INI + TAKEN.format("clean"), ini="conformance_env_rung =\n    clean:NCCL_A=1"),
    "ini-variable-outside-families": Bad(INI + OUTSIDE, ini="conformance_env_rung =\n    mine:PATH=/x"),
    "ini-missing-equals": Bad(
        INI + "'NCCL_A' in 'mine:NCCL_A' is not VAR=VALUE", ini="conformance_env_rung =\n    mine:NCCL_A"
    ),
    # the environment variable, ';'-separated
    "env-bad-name": Bad(ENV + NOT_IDENTIFIER.format("1bad"), env={"CONFORMANCE_ENV_RUNG": "ok:NCCL_A=1;1bad:NCCL_B=1"}),
    "env-duplicate-name": Bad(ENV + TAKEN.format("mine"), env={"CONFORMANCE_ENV_RUNG": "mine:NCCL_A=1;mine:NCCL_B=2"}),
    "env-builtin-name": Bad(ENV + TAKEN.format("shm_off"), env={"CONFORMANCE_ENV_RUNG": "shm_off:NCCL_A=1"}),
    "env-variable-outside-families": Bad(ENV + OUTSIDE, env={"CONFORMANCE_ENV_RUNG": "ok:NCCL_A=1;bad:PATH=/x"}),
    "env-missing-colon": Bad(
        ENV + "'okNCCL_A=1' is not NAME:VAR=VALUE[,VAR=VALUE...]", env={"CONFORMANCE_ENV_RUNG": "okNCCL_A=1"}
    ),
    # --env-rungs-file
    "file-missing": Bad(
        "command-line option --env-rungs-file: rungs file '{here}/missing.toml' cannot be read: "
        "No such file or directory",
        ("--env-rungs-file=missing.toml",),
    ),
    "file-missing-env": Bad(
        "environment variable CONFORMANCE_ENV_RUNGS_FILE: rungs file '{here}/gone.toml' cannot be read: "
        "No such file or directory",
        env={"CONFORMANCE_ENV_RUNGS_FILE": "gone.toml"},
    ),
    "file-not-toml": Bad(FILE_CLI + " is not valid TOML: {toml_error}", rungs_file=NOT_TOML),
    # not UTF-8: must be refused like any unreadable file, not end in an INTERNALERROR (exit 3)
    "file-not-utf8": Bad(FILE_CLI + " ", rungs_file=b'\xff\xfe[[rung]]\nname = "a"\n', prefix=True),
    "file-other-table": Bad(
        FILE_CLI + " must hold only [[rung]] tables",
        rungs_file='[other]\nx = 1\n[[rung]]\nname = "a"\nenv = { NCCL_X = "1" }\n',
    ),
    "file-value-not-string": Bad(
        IN_FILE + "1: value 1 of NCCL_X must be a string without newlines",
        rungs_file='[[rung]]\nname = "a"\nenv = { NCCL_X = 1 }\n',
    ),
    "file-value-with-newline": Bad(
        IN_FILE + "1: value 'x\\ny' of NCCL_X must be a string without newlines",
        rungs_file='[[rung]]\nname = "a"\nenv = { NCCL_X = "x\\ny" }\n',
    ),
    "file-unknown-key": Bad(
        IN_FILE + "2: " + RUNG_TABLE,
        rungs_file='[[rung]]\nname = "a"\nenv = { NCCL_X = "1" }\n'
        '[[rung]]\nname = "b"\ncolour = "red"\nenv = { NCCL_X = "1" }\n',
    ),
    "file-no-env": Bad(IN_FILE + "1: " + RUNG_TABLE, rungs_file='[[rung]]\nname = "a"\n'),
    "file-bad-name": Bad(
        IN_FILE + "1: " + NOT_IDENTIFIER.format("eth0 only"),
        rungs_file='[[rung]]\nname = "eth0 only"\nenv = { NCCL_SOCKET_IFNAME = "eth0" }\n',
    ),
    "file-variable-outside-families": Bad(
        IN_FILE + "1: " + OUTSIDE, rungs_file='[[rung]]\nname = "a"\nenv = { PATH = "/x" }\n'
    ),
    "file-builtin-name": Bad(
        "{here}/rungs.toml: " + TAKEN.format("shm_off"),
        rungs_file='[[rung]]\nname = "shm_off"\nenv = { NCCL_X = "1" }\n',
    ),
    "file-name-taken-by-env-rung": Bad(
        CLI + TAKEN.format("a"), ("--env-rung=a:NCCL_Y=1",), rungs_file='[[rung]]\nname = "a"\nenv = { NCCL_X = "1" }\n'
    ),
    # --matrix
    "matrix-bogus": Bad(
        "command-line option --matrix: unknown matrix 'bogus'; choose one of adaptive, full, inherited",
        ("--matrix=bogus",),
    ),
    "matrix-bogus-env": Bad(
        "environment variable CONFORMANCE_MATRIX: unknown matrix 'all'; choose one of adaptive, full, inherited",
        env={"CONFORMANCE_MATRIX": "all"},
    ),
}


def toml_error(text: str) -> str:
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return str(exc)
    raise AssertionError(f"{text!r} is valid TOML")


@pytest.mark.parametrize("bad", BAD_RUNGS.values(), ids=BAD_RUNGS.keys())
def test_bad_rung_is_refused_with_its_source(
    bad: Bad, pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = pytester.path.resolve()
    pytester.makepyfile(test_case=COLLECTIVE_TEST.format(probe="all_reduce"))
    ini = pytester.makeini(f"[pytest]\n{bad.ini}\n").resolve() if bad.ini else None
    args = bad.args
    if bad.rungs_file is not None:
        raw = bad.rungs_file if isinstance(bad.rungs_file, bytes) else bad.rungs_file.encode()
        (here / "rungs.toml").write_bytes(raw)
        args = (*args, "--env-rungs-file=rungs.toml")
    for name, value in bad.env.items():
        monkeypatch.setenv(name, value)
    result = run_suite(*args, "--virtual-devices=2", "test_case.py", timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR == 4, result.stdout.str() + result.stderr.str()
    message = bad.message.format(here=here, ini=ini, toml_error=toml_error(NOT_TOML))
    lines = [line for line in result.errlines if line.strip()]
    if bad.prefix:
        assert len(lines) == 1 and lines[0].startswith(f"ERROR: conformance: {message}"), lines
    else:
        assert lines == [f"ERROR: conformance: {message}"]
    assert "collected" not in result.stdout.str()
    assert_nothing_recorded(reports_dir)


def rungs_line(result: pytest.RunResult) -> str:
    lines = [line for line in result.outlines if line.startswith("conformance: matrix ")]
    assert len(lines) == 1, result.stdout.str()
    return lines[0]


def test_user_rungs_from_every_source_follow_the_builtin_ladder(
    pytester: pytest.Pytester, run_suite: RunSuite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the refusals above: good rungs are accepted, file rungs first, then --env-rung."""
    pytester.makepyfile(test_case=COLLECTIVE_TEST.format(probe="all_reduce"))
    builtin = ", ".join(BUILTIN_NAMES)
    (pytester.path / "rungs.toml").write_text(
        '[[rung]]\nname = "eth0_only"\nenv = { NCCL_SOCKET_IFNAME = "eth0", GLOO_SOCKET_IFNAME = "eth0" }\n'
        '[[rung]]\nname = "ring"\nenv = { NCCL_ALGO = "Ring" }\n'
    )

    def collect(*args: str, matrix: str = "full") -> pytest.RunResult:  # full: every rung is planned
        result = run_suite("--collect-only", "--virtual-devices=2", f"--matrix={matrix}", *args, "test_case.py")
        assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
        return result

    user = ("--env-rungs-file=rungs.toml", "--env-rung=simple:NCCL_PROTO=Simple,TORCH_NCCL_BLOCKING_WAIT=1")
    assert rungs_line(collect(*user)) == f"conformance: matrix full, rungs: {builtin}, eth0_only, ring, simple"
    # adaptive on gloo plans only what gloo reads (eth0_only sets GLOO_SOCKET_IFNAME): the header names no more
    assert rungs_line(collect(*user, matrix="adaptive")) == "conformance: matrix adaptive, rungs: inherited, eth0_only"
    assert rungs_line(collect()) == f"conformance: matrix full, rungs: {builtin}"
    pytester.makeini("[pytest]\nconformance_env_rung =\n    from_ini:NCCL_ALGO=Tree\n    cuda:CUDA_LAUNCH_BLOCKING=1\n")
    assert rungs_line(collect()) == f"conformance: matrix full, rungs: {builtin}, from_ini, cuda"
    monkeypatch.setenv("CONFORMANCE_ENV_RUNG", "e1:TORCH_DISTRIBUTED_DEBUG=DETAIL;e2:GLOO_SOCKET_IFNAME=lo")
    monkeypatch.setenv("CONFORMANCE_MATRIX", "full")
    assert rungs_line(collect()) == f"conformance: matrix full, rungs: {builtin}, e1, e2"


# ---------------------------------------------------------------------------------------------
# Units: parse_rung_spec, load_rungs_file, build_ladder, Rung.effective
# ---------------------------------------------------------------------------------------------


def test_builtin_ladder() -> None:
    assert [r.name for r in BUILTIN_LADDER] == BUILTIN_NAMES
    assert BUILTIN_LADDER[0] is INHERITED
    assert {r.name: dict(r.set) for r in BUILTIN_LADDER} == {
        "inherited": {},
        "clean": {},
        "cumem_off": {"NCCL_CUMEM_ENABLE": "0"},
        "cumem_host_off": {"NCCL_CUMEM_HOST_ENABLE": "0"},
        "nvls_off": {"NCCL_NVLS_ENABLE": "0"},
        "p2p_level_nvl": {"NCCL_P2P_LEVEL": "NVL"},
        "p2p_off": {"NCCL_P2P_DISABLE": "1"},
        "shm_off": {"NCCL_SHM_DISABLE": "1"},
        "p2p_shm_off": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
        "ib_off": {"NCCL_IB_DISABLE": "1"},
        "net_socket": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1"},
    }
    assert [r.name for r in BUILTIN_LADDER if r.unset_families] == ["clean"]
    assert BUILTIN_LADDER[1].unset_families == ("NCCL_", "TORCH_NCCL_")


@pytest.mark.parametrize(
    ("spec", "name", "env"),
    [
        ("mine:NCCL_ALGO=Ring", "mine", {"NCCL_ALGO": "Ring"}),
        ("two:NCCL_ALGO=Ring,NCCL_PROTO=Simple", "two", {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}),
        ("  spaced : NCCL_ALGO=Tree ", "spaced", {"NCCL_ALGO": "Tree"}),
        ("eq:NCCL_IB_HCA=mlx5_0:1=x", "eq", {"NCCL_IB_HCA": "mlx5_0:1=x"}),
        ("empty:NCCL_DEBUG=", "empty", {"NCCL_DEBUG": ""}),
        (
            "families:TORCH_NCCL_ASYNC_ERROR_HANDLING=1,TORCH_X=2,GLOO_SOCKET_IFNAME=lo,CUDA_LAUNCH_BLOCKING=1",
            "families",
            {
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                "TORCH_X": "2",
                "GLOO_SOCKET_IFNAME": "lo",
                "CUDA_LAUNCH_BLOCKING": "1",
            },
        ),
        ("_under9:NCCL_X=1", "_under9", {"NCCL_X": "1"}),
    ],
)
def test_parse_rung_spec(spec: str, name: str, env: dict[str, str]) -> None:
    rung = parse_rung_spec(spec, "here")
    assert rung == Rung(name, env, description="from the user")
    assert rung.unset_families == ()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("1bad:NCCL_X=1", "here: rung name '1bad' is not a valid identifier"),
        ("a-b:NCCL_X=1", "here: rung name 'a-b' is not a valid identifier"),
        (":NCCL_X=1", "here: rung name '' is not a valid identifier"),
        ("mine:PATH=/x", f"here: variable 'PATH' is not in the {FAMILIES} families"),
        ("mine:nccl_x=1", f"here: variable 'nccl_x' is not in the {FAMILIES} families"),
        ("mine:NCCL_X-Y=1", f"here: variable 'NCCL_X-Y' is not in the {FAMILIES} families"),
        ("mine:=1", f"here: variable '' is not in the {FAMILIES} families"),
        ("mine:NCCL_X", "here: 'NCCL_X' in 'mine:NCCL_X' is not VAR=VALUE"),
        ("mine:NCCL_X=1,", "here: '' in 'mine:NCCL_X=1,' is not VAR=VALUE"),
        ("mineNCCL_X=1", "here: 'mineNCCL_X=1' is not NAME:VAR=VALUE[,VAR=VALUE...]"),
        ("mine:NCCL_X=a\nb", "here: value 'a\\nb' of NCCL_X must be a string without newlines"),
        ("mine:NCCL_X=a\0b", "here: value 'a\\x00b' of NCCL_X must be a string without newlines"),
    ],
)
def test_parse_rung_spec_refuses(spec: str, message: str) -> None:
    with pytest.raises(RungError) as caught:
        parse_rung_spec(spec, "here")
    assert str(caught.value) == message


def test_load_rungs_file(tmp_path: Path) -> None:
    path = tmp_path / "rungs.toml"
    path.write_text(
        '[[rung]]\nname = "eth0_only"\nenv = { NCCL_SOCKET_IFNAME = "eth0" }\n'
        '[[rung]]\nname = "ring_simple"\nenv = { NCCL_ALGO = "Ring", NCCL_PROTO = "Simple" }\n'
    )
    assert load_rungs_file(path, "where") == [
        Rung("eth0_only", {"NCCL_SOCKET_IFNAME": "eth0"}, description="from the user"),
        Rung("ring_simple", {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}, description="from the user"),
    ]


R1 = "{path} rung 1: "
NOT_STRING = "of NCCL_X must be a string without newlines"
ONLY_RUNG_TABLES = "where: rungs file '{path}' must hold only [[rung]] tables"
BAD_RUNG_FILES = {
    "missing": (None, "where: rungs file '{path}' cannot be read: No such file or directory"),
    "not-toml": (NOT_TOML, "where: rungs file '{path}' is not valid TOML: " + toml_error(NOT_TOML)),
    "empty": ("", ONLY_RUNG_TABLES),
    "rung-not-table": ('rung = "x"\n', ONLY_RUNG_TABLES),
    "rung-single-table": ('[rung]\nname = "a"\n', ONLY_RUNG_TABLES),
    "value-int": ('[[rung]]\nname = "a"\nenv = { NCCL_X = 1 }\n', R1 + "value 1 " + NOT_STRING),
    "value-list": ('[[rung]]\nname = "a"\nenv = { NCCL_X = ["1"] }\n', R1 + "value ['1'] " + NOT_STRING),
    "value-multiline": (
        '[[rung]]\nname = "a"\nenv = { NCCL_X = """\nmulti\nline""" }\n',
        R1 + "value 'multi\\nline' " + NOT_STRING,
    ),
    "value-carriage-return": ('[[rung]]\nname = "a"\nenv = { NCCL_X = "a\\rb" }\n', R1 + "value 'a\\rb' " + NOT_STRING),
    "unknown-key": ('[[rung]]\nname = "a"\nenv = { NCCL_X = "1" }\nextra = 1\n', R1 + RUNG_TABLE),
    "env-not-table": ('[[rung]]\nname = "a"\nenv = "NCCL_X=1"\n', R1 + RUNG_TABLE),
    "no-name": ('[[rung]]\nenv = { NCCL_X = "1" }\n', R1 + "rung name '' is not a valid identifier"),
    "name-int": ('[[rung]]\nname = 7\nenv = { NCCL_X = "1" }\n', R1 + "rung name 7 is not a valid identifier"),
    "empty-env": ('[[rung]]\nname = "a"\nenv = {}\n', R1 + "rung 'a' sets no variable"),
    "variable-outside-families": (
        '[[rung]]\nname = "a"\nenv = { HOME = "/" }\n',
        R1 + f"variable 'HOME' is not in the {FAMILIES} families",
    ),
}


@pytest.mark.parametrize(("text", "message"), BAD_RUNG_FILES.values(), ids=BAD_RUNG_FILES.keys())
def test_load_rungs_file_refuses(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "rungs.toml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(RungError) as caught:
        load_rungs_file(path, "where")
    assert str(caught.value) == message.format(path=path)


def test_build_ladder() -> None:
    mine = Rung("mine", {"NCCL_ALGO": "Ring"})
    other = Rung("other", {"NCCL_PROTO": "LL"})
    assert build_ladder([]) == BUILTIN_LADDER
    ladder = build_ladder([(mine, "a"), (other, "b")])
    assert [r.name for r in ladder] == [*BUILTIN_NAMES, "mine", "other"]
    assert ladder[-2:] == (mine, other)
    with pytest.raises(RungError) as caught:
        build_ladder([(mine, "first"), (Rung("mine", {"NCCL_X": "1"}), "second source")])
    assert str(caught.value) == "second source: rung name 'mine' is already taken"
    for name in BUILTIN_NAMES:
        with pytest.raises(RungError) as caught:
            build_ladder([(Rung(name, {"NCCL_X": "1"}), "src")])
        assert str(caught.value) == f"src: rung name {name!r} is already taken"


def rung(name: str) -> Rung:
    return {r.name: r for r in BUILTIN_LADDER}[name]


def test_rung_effective_and_unset() -> None:
    environ = {
        "NCCL_DEBUG": "INFO",
        "NCCL_P2P_DISABLE": "0",
        "TORCH_NCCL_BLOCKING_WAIT": "1",
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        "GLOO_SOCKET_IFNAME": "lo",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "PATH": "/usr/bin",
        "HOME": "/root",
        "NCCLX": "not a family member",
    }
    families = {k: v for k, v in environ.items() if k not in ("PATH", "HOME", "NCCLX")}
    assert INHERITED.effective(environ) == families
    assert INHERITED.unset(environ) == ()
    clean = rung("clean")
    assert clean.unset(environ) == ("NCCL_DEBUG", "NCCL_P2P_DISABLE", "TORCH_NCCL_BLOCKING_WAIT")
    assert clean.effective(environ) == {
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        "GLOO_SOCKET_IFNAME": "lo",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    assert rung("p2p_off").effective(environ) == {**families, "NCCL_P2P_DISABLE": "1"}
    assert rung("p2p_off").unset(environ) == ()
    assert rung("net_socket").effective({}) == {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_IB_DISABLE": "1",
    }
    # a rung that only repeats the caller's value gives the same environment as inherited
    assert rung("cumem_off").effective({"NCCL_CUMEM_ENABLE": "0"}) == INHERITED.effective({"NCCL_CUMEM_ENABLE": "0"})
    # clean keeps a variable a rung sets itself
    keeps = Rung("keeps", {"NCCL_DEBUG": "WARN"}, unset_families=("NCCL_",))
    assert keeps.unset(environ) == ("NCCL_P2P_DISABLE",)
    assert keeps.effective(environ)["NCCL_DEBUG"] == "WARN"
    # with no NCCL variable inherited, clean is the inherited environment
    plain = {"PATH": "/usr/bin", "GLOO_SOCKET_IFNAME": "lo"}
    assert clean.effective(plain) == INHERITED.effective(plain) == {"GLOO_SOCKET_IFNAME": "lo"}


# ---------------------------------------------------------------------------------------------
# LadderBook decisions (units; the runs below check the same through real ranks)
# ---------------------------------------------------------------------------------------------


def make_book(tmp_path: Path, mode: str = "adaptive", ladder: tuple[Rung, ...] = BUILTIN_LADDER) -> LadderBook:
    return LadderBook(tmp_path / "ladder.jsonl", ladder, mode, decision_wait=lambda k: 0.3)


def step(key: str, rung_name: str, leader: str | None = None, ladder: tuple[Rung, ...] = BUILTIN_LADDER) -> Step:
    index = [r.name for r in ladder].index(rung_name)
    return Step(key=key, rung_index=index, leader_key=leader, link="SYS" if "SYS" in key else None)


def record(book: LadderBook, key: str, outcomes: dict[str, str]) -> None:
    for name, outcome in outcomes.items():
        book.record(step(key, name, ladder=book.ladder), outcome)


def test_ladder_book_climbs_only_past_failures(tmp_path: Path) -> None:
    book = make_book(tmp_path)
    key = "test_x[all2]"
    assert book.decide(step(key, "inherited"), {}) == RungDecision(True)
    record(book, key, {"inherited": "hang"})
    assert book.decide(step(key, "clean"), {}) == RungDecision(False, SAME_ENV)
    assert book.decide(step(key, "clean"), {"NCCL_DEBUG": "INFO"}) == RungDecision(True)
    record(book, key, {"clean": "skipped", "cumem_off": "error"})
    assert book.decide(step(key, "nvls_off"), {}) == RungDecision(True)
    assert book.decide(step(key, "nvls_off"), {"NCCL_NVLS_ENABLE": "0"}) == RungDecision(
        False, "same environment as rung inherited here"
    )
    record(book, key, {"nvls_off": "pass"})
    for later in BUILTIN_NAMES[4:]:
        assert book.decide(step(key, later), {}) == RungDecision(False, ALREADY_PASSED.format("nvls_off"))
        record(book, key, {later: "skipped"})
    # full: every rung runs, whatever passed before
    assert make_book(tmp_path, "full").decide(step(key, "p2p_off"), {}) == RungDecision(True)


def test_ladder_book_user_rung_same_as_builtin_is_skipped(tmp_path: Path) -> None:
    mine = Rung("mine", {"NCCL_P2P_LEVEL": "NVL"}, description="from the user")
    ladder = (*BUILTIN_LADDER, mine)
    book = make_book(tmp_path, ladder=ladder)
    key = "test_x[all2]"
    record(book, key, {name: "hang" for name in BUILTIN_NAMES})
    decision = book.decide(step(key, "mine", ladder=ladder), {})
    assert decision == RungDecision(False, "same environment as rung p2p_level_nvl here")


def test_ladder_book_follower_jumps_to_the_leaders_rung(tmp_path: Path) -> None:
    book = make_book(tmp_path)
    leader, follower = "test_p[gpu0-gpu3-SYS]", "test_p[gpu1-gpu3-SYS]"
    record(book, leader, {"inherited": "hang", "clean": "skipped", "nvls_off": "hang"})
    record(book, follower, {"inherited": "hang", "clean": "skipped"})
    no_rung = "no rung up to {} passed for link class SYS (test_p[gpu0-gpu3-SYS])"
    assert book.decide(step(follower, "nvls_off", leader), {}) == RungDecision(False, no_rung.format("nvls_off"))
    record(book, follower, {"nvls_off": "skipped", "cumem_host_off": "skipped"})
    record(book, leader, {"cumem_host_off": "hang", "cumem_off": "hang", "p2p_level_nvl": "pass"})
    assert book.decide(step(follower, "cumem_off", leader), {}) == RungDecision(False, no_rung.format("cumem_off"))
    record(book, follower, {"cumem_off": "skipped"})
    assert book.decide(step(follower, "p2p_level_nvl", leader), {}) == RungDecision(True)
    # the rung failed for the follower: it goes on down the ladder by itself
    record(book, follower, {"p2p_level_nvl": "hang"})
    record(book, leader, {"p2p_off": "skipped"})
    assert book.decide(step(follower, "p2p_off", leader), {}) == RungDecision(True)


NEVER_DECIDED = "was never decided (its worker died?): deciding alone, this rung runs"


def lines_of(book: LadderBook) -> list[dict]:
    return [json.loads(line) for line in book.path.read_text().splitlines()]


def test_ladder_book_follower_of_a_dead_leader_decides_alone(tmp_path: Path) -> None:
    book = make_book(tmp_path)
    leader, follower = "test_p[gpu0-gpu1-SYS]", "test_p[gpu1-gpu2-SYS]"
    record(book, follower, {"inherited": "hang", "clean": "skipped"})
    expected = RungDecision(True, f"rung inherited, clean, nvls_off of {leader} {NEVER_DECIDED}")
    assert book.decide(step(follower, "nvls_off", leader), {}) == expected
    record(book, follower, {"nvls_off": "hang"})
    # the next follower decision waits only for the leader's new rung
    decision = book.decide(step(follower, "cumem_host_off", leader), {})
    assert decision == RungDecision(
        True, f"rung inherited, clean, nvls_off, cumem_host_off of {leader} {NEVER_DECIDED}"
    )
    assert [g["rung"] for g in lines_of(book) if g["outcome"] == "undecided"] == [
        "inherited", "clean", "nvls_off", "cumem_host_off"]  # fmt: skip


def test_ladder_book_waits_only_for_selected_rungs(tmp_path: Path) -> None:
    book = make_book(tmp_path)
    key = "test_x[all2]"
    alone = book.decide(step(key, "nvls_off"), {})  # the deciding worker died: decide for itself
    assert alone == RungDecision(True, f"rung inherited, clean of {key} {NEVER_DECIDED}")
    given_up = lines_of(book)
    assert [(g["rung"], g["outcome"]) for g in given_up] == [("inherited", "undecided"), ("clean", "undecided")]
    assert given_up[0]["reason"].startswith("not decided within 0s of waiting")
    # nobody waits for a rung given up on again; a real outcome, when it comes, takes its place
    assert book.decide(step(key, "nvls_off"), {}) == alone  # e.g. the replacement worker, on the same item
    assert len(lines_of(book)) == 2
    record(book, key, {"inherited": "hang", "clean": "pass"})
    book.record(step(key, "inherited"), "undecided")  # a late give-up does not overwrite it
    assert book.decide(step(key, "cumem_off"), {}) == RungDecision(False, ALREADY_PASSED.format("clean"))
    # only nvls_off and cumem_off are in this run (-k): nothing earlier is waited for
    selected = {(key, 2), (key, 3)}
    assert book.decide(step(key, "nvls_off"), {}, selected) == RungDecision(True)
    record(book, key, {"nvls_off": "pass"})
    assert book.decide(step(key, "cumem_off"), {}, selected) == RungDecision(False, ALREADY_PASSED.format("nvls_off"))


def test_ladder_book_waits_no_more_once_the_runs_folder_is_gone(tmp_path: Path) -> None:
    """Seen: a run folder removed mid-run left a later rung waiting 13 minutes for outcomes nobody could write."""
    folder = tmp_path / "run"
    folder.mkdir()
    book = LadderBook(folder / "ladder.jsonl", BUILTIN_LADDER, "adaptive", decision_wait=lambda k: 600.0)
    key = "test_x[all2]"
    record(book, key, {"inherited": "hang"})
    shutil.rmtree(folder)
    begun = time.monotonic()
    decision = book.decide(step(key, "nvls_off"), {})
    assert time.monotonic() - begun < 60.0  # not the 600 s decision wait: at once, with room for a loaded machine
    assert decision.run and decision.reason.endswith(f"of {key} {NEVER_DECIDED}")


# ---------------------------------------------------------------------------------------------
# The plan, not the run: ids and counts from a topology file
# ---------------------------------------------------------------------------------------------


def collected(run_suite: RunSuite, *args: str) -> list[str]:
    result = run_suite("--collect-only", "-q", f"--topology-file={NVSWITCH}", *args, timeout=90)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    return [line for line in result.outlines if "::" in line]


def pair_ids(items: list[str]) -> list[str]:
    prefix = "suites/test_pairs.py::test_pair_exchange["
    return [line[len(prefix) : -1] for line in items if line.startswith(prefix)]


# in the plan's order: rounds of disjoint pairs
NVSWITCH_PAIRS = [
    f"{a}-{b}-NV18" for a, b in in_rounds_named(list(itertools.combinations([f"gpu{i}" for i in range(8)], 2)))
]


def test_plan_lists_every_pair_per_rung(pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path) -> None:
    suite = copy_suites(pytester, "test_pairs.py")[0]
    items = collected(run_suite, suite)
    ids = pair_ids(items)
    assert len(NVSWITCH_PAIRS) == 28
    assert len(ids) == len(set(ids)) == 28 * 11
    by_rung: dict[str, list[str]] = {}
    for ident in ids:
        base, _, name = ident.partition("-NV18-")
        by_rung.setdefault(name, []).append(f"{base}-NV18")
    assert sorted(by_rung) == sorted(BUILTIN_NAMES)
    for name in BUILTIN_NAMES:
        assert sorted(by_rung[name]) == sorted(NVSWITCH_PAIRS), name
    assert "gpu0-gpu3-NV18-inherited" in ids
    # ordered rung by rung: the whole inherited rung before any fallback
    assert ids[:28] == [f"{p}-inherited" for p in NVSWITCH_PAIRS]
    # a second collection plans the same items in the same order
    assert collected(run_suite, suite) == items
    # the plan starts no case
    assert not (reports_dir / "latest" / "results.jsonl").exists()


def test_plan_inherited_matrix_and_user_rung(pytester: pytest.Pytester, run_suite: RunSuite) -> None:
    suite = copy_suites(pytester, "test_pairs.py")[0]
    items = collected(run_suite, "--matrix=inherited", suite)
    assert pair_ids(items) == [f"{p}-inherited" for p in NVSWITCH_PAIRS]
    assert len([line for line in items if "::test_peer_copy[" in line]) == 28
    assert len(items) == 56
    assert collected(run_suite, "--matrix=inherited", suite) == items
    with_user = pair_ids(collected(run_suite, "--env-rung=ring:NCCL_ALGO=Ring", suite))
    assert len(with_user) == 28 * 12
    assert with_user[-28:] == [f"{p}-ring" for p in NVSWITCH_PAIRS]


# ---------------------------------------------------------------------------------------------
# Adaptive, full and inherited on a healthy simulated machine
# ---------------------------------------------------------------------------------------------

HEALTHY_LINKS = {"gpu0-gpu1": "PIX", "gpu0-gpu2": "SYS", "gpu1-gpu2": "SYS"}
HEALTHY_KEYS = ["test_pair[gpu0-gpu1-PIX]", "test_pair[gpu0-gpu2-SYS]", "test_pair[gpu1-gpu2-SYS]"]


@pytest.fixture
def healthy(pytester: pytest.Pytester) -> tuple[str, ...]:
    """A 3-GPU box (PIX and SYS pairs) whose scenario touches nothing, and the pair test."""
    pytester.makepyfile(test_pair=PAIR_TEST)
    topology = write_topology(pytester, "three-gpus", HEALTHY_LINKS)
    scenario = pytester.makefile(".toml", scen=scenario_text('effect = "slow"\nseconds = 0'))
    return (f"--topology-file={topology}", f"--scenario={scenario}", *TIMEOUTS, "-rs", "test_pair.py")


def test_adaptive_runs_only_inherited_on_a_healthy_machine(
    run_suite: RunSuite, reports_dir: Path, healthy: tuple[str, ...]
) -> None:
    result = run_suite(*healthy, f"--junitxml={reports_dir / 'junit.xml'}")
    # Rungs not needed are no tests that could not run: deselected, as pytest counts -k, no JUnit case
    result.assert_outcomes(passed=3, deselected=30)
    result.stdout.fnmatch_lines(
        [
            "conformance: matrix adaptive, rungs: " + ", ".join(BUILTIN_NAMES),
            "conformance: SIMULATED run, scenario 'test scenario' (*)",
        ]
    )
    assert "SKIPPED" not in result.stdout.str()
    cases = ElementTree.parse(reports_dir / "junit.xml").getroot().iter("testcase")
    assert sorted(case.get("name") for case in cases) == sorted(
        f"test_pair[{key[10:-1]}-inherited]" for key in HEALTHY_KEYS
    )
    records = read_records(reports_dir)
    assert sorted((r["ladder_key"], r["env_name"], r["verdict"]) for r in records) == [
        (key, "inherited", "pass") for key in HEALTHY_KEYS
    ]
    assert all(r["simulated"] is True and r["env"] == {} for r in records)
    expected = {(key, "inherited"): ("pass", "") for key in HEALTHY_KEYS}
    for key in HEALTHY_KEYS:
        for name in BUILTIN_NAMES[1:]:
            expected[(key, name)] = ("skipped", ALREADY_PASSED.format("inherited"))
    assert ladder_map(reports_dir) == expected
    result.stdout.fnmatch_lines(
        ["PIX, SYS: first passing rung inherited: nothing to set: the environment as it is", "deadlines paid: 0 *"]
    )


def test_full_runs_every_rung_for_every_pair(run_suite: RunSuite, reports_dir: Path, healthy: tuple[str, ...]) -> None:
    result = run_suite("--matrix=full", *healthy)
    result.assert_outcomes(passed=33)
    records = read_records(reports_dir)
    assert sorted((r["ladder_key"], r["env_name"]) for r in records) == sorted(
        itertools.product(HEALTHY_KEYS, BUILTIN_NAMES)
    )
    assert {r["verdict"] for r in records} == {"pass"}
    for r in records:
        # no NCCL variable is inherited, so clean removes nothing: each rung's env is what it sets
        assert r["env"] == dict(rung(r["env_name"]).set), r["nodeid"]
    assert ladder_map(reports_dir) == {
        (key, name): ("pass", "") for key, name in itertools.product(HEALTHY_KEYS, BUILTIN_NAMES)
    }
    result.stdout.fnmatch_lines(
        [
            table_row("class", 5, {n: n for n in BUILTIN_NAMES}),
            table_row("PIX", 5, {n: "1/1" for n in BUILTIN_NAMES}),
            table_row("SYS", 5, {n: "2/2" for n in BUILTIN_NAMES}),
            "PIX, SYS: first passing rung inherited: nothing to set: the environment as it is",
            "deadlines paid: 0 (step deadline 3s)",
        ]
    )


def test_inherited_plans_no_fallback(run_suite: RunSuite, reports_dir: Path, healthy: tuple[str, ...]) -> None:
    result = run_suite("--matrix=inherited", *healthy)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["collected 3 items"])
    records = read_records(reports_dir)
    assert sorted((r["nodeid"], r["env_name"], r["verdict"]) for r in records) == [
        (f"test_pair.py::test_pair[{key[len('test_pair[') : -1]}-inherited]", "inherited", "pass")
        for key in HEALTHY_KEYS
    ]
    assert ladder_map(reports_dir) == {(key, "inherited"): ("pass", "") for key in HEALTHY_KEYS}


SKIPPING_TEST = """
def test_all(conformance_case, device_set):
    conformance_case("pair_exchange", device_set, sizes=[4])
"""


def test_a_case_that_skips_does_not_climb_the_ladder(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    """A skip (the probe does not apply here) is no failure: no fallback rung can change it.

    pair_exchange over all three GPUs skips in the ranks ("needs exactly 2 ranks").  Climbing the
    ladder for it runs nine more cases that skip the same way, and the summary then reports the
    class as "no rung passed", as if the machine were broken.
    """
    pytester.makepyfile(test_all=SKIPPING_TEST)
    topology = write_topology(pytester, "three-gpus", HEALTHY_LINKS)
    result = run_suite(f"--topology-file={topology}", *TIMEOUTS, "-rs", "test_all.py")
    result.assert_outcomes(skipped=1, deselected=10)  # the later rungs are not needed: no tests
    records = read_records(reports_dir)
    assert [(r["env_name"], r["verdict"], r["summary"]) for r in records] == [
        ("inherited", "skip", "pair_exchange needs exactly 2 ranks, got 3")
    ]
    decisions = ladder_map(reports_dir)
    assert decisions[("test_all[all3]", "inherited")] == ("skip", "")
    assert {decisions[("test_all[all3]", name)][0] for name in BUILTIN_NAMES[1:]} == {"skipped"}
    result.stdout.no_fnmatch_line("*no rung passed*")


# ---------------------------------------------------------------------------------------------
# The class leader searches the ladder; its followers jump to the rung that worked
# ---------------------------------------------------------------------------------------------

# gpu3 sits on the other socket: three SYS pairs, the first (gpu0-gpu3) leads its class
LEADER_LINKS = {
    "gpu0-gpu1": "PIX",
    "gpu0-gpu2": "NODE",
    "gpu0-gpu3": "SYS",
    "gpu1-gpu2": "NODE",
    "gpu1-gpu3": "SYS",
    "gpu2-gpu3": "SYS",
}
LEADER = "test_pair[gpu0-gpu3-SYS]"  # the first SYS pair in the plan's order
FOLLOWERS = ["test_pair[gpu1-gpu3-SYS]", "test_pair[gpu2-gpu3-SYS]"]
HEALTHY_PAIRS = ["test_pair[gpu0-gpu1-PIX]", "test_pair[gpu0-gpu2-NODE]", "test_pair[gpu1-gpu2-NODE]"]
LADDER_COLUMNS = ["inherited", "cumem_off", "p2p_level_nvl"]  # the rungs that ran (no NVLink, no SHM over SYS)
SYS_HANG_RULE = 'effect = "hang"\nphase = "probe"\nprobes = ["pair_exchange"]\nlinks = ["SYS"]\np2p = true'


def expected_leader_ladder() -> dict[tuple[str, str], tuple[str, str]]:
    expected = {(key, "inherited"): ("pass", "") for key in HEALTHY_PAIRS}
    for key in HEALTHY_PAIRS:
        for name in BUILTIN_NAMES[1:]:
            expected[(key, name)] = ("skipped", ALREADY_PASSED.format("inherited"))
    nvls_futile = f"rung nvls_off cannot change a case over SYS: {RUNG_REACH['nvls_off'].why}"
    shm_futile = "rung cumem_host_off cannot change a case over SYS: NCCL uses no SHM there"
    for key in [LEADER, *FOLLOWERS]:
        expected[(key, "inherited")] = ("hang", "")
        expected[(key, "clean")] = ("skipped", SAME_ENV)
        expected[(key, "nvls_off")] = ("skipped", nvls_futile)
        expected[(key, "cumem_host_off")] = ("skipped", shm_futile)
        # cuMem P2P could be what broke: the leader tries it, its followers follow it
        leader_hung = ("skipped", f"no rung up to cumem_off passed for link class SYS ({LEADER})")
        expected[(key, "cumem_off")] = ("hang", "") if key == LEADER else leader_hung
        expected[(key, "p2p_level_nvl")] = ("pass", "")
        for name in BUILTIN_NAMES[6:]:
            expected[(key, name)] = ("skipped", ALREADY_PASSED.format("p2p_level_nvl"))
    return expected


@pytest.mark.slow
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_class_leader_searches_and_followers_jump(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, workers: tuple[str, ...]
) -> None:
    pytester.makepyfile(test_pair=PAIR_TEST)
    topology = write_topology(pytester, "four-gpus", LEADER_LINKS)
    scenario = pytester.makefile(".toml", scen=scenario_text(SYS_HANG_RULE))
    result = run_suite(
        f"--topology-file={topology}", f"--scenario={scenario}", *TIMEOUTS, *workers, "test_pair.py", timeout=240
    )
    outcomes = result.parseoutcomes()  # later rungs not needed: deselected, or skipped where decided after a wait
    not_run = outcomes.get("skipped", 0) + outcomes.get("deselected", 0)
    assert (outcomes["failed"], outcomes["passed"], not_run) == (4, 6, 56)
    assert verdict_map(reports_dir) == {
        **{key: [("inherited", "pass")] for key in HEALTHY_PAIRS},
        LEADER: [("inherited", "hang"), ("cumem_off", "hang"), ("p2p_level_nvl", "pass")],
        **{key: [("inherited", "hang"), ("p2p_level_nvl", "pass")] for key in FOLLOWERS},
    }
    decided, expected = ladder_map(reports_dir), expected_leader_ladder()
    if workers:  # a later rung may be decided before its own inherited outcome is in: same skip, other reason
        decided = {k: v if k[0] not in HEALTHY_PAIRS else v[0] for k, v in decided.items()}
        expected = {k: v if k[0] not in HEALTHY_PAIRS else v[0] for k, v in expected.items()}
    assert decided == expected
    records = read_records(reports_dir)
    hangs = [r for r in records if r["verdict"] == "hang"]
    assert len(hangs) == 4
    stops = {r["ladder_key"]: r["stop_reason"] for r in hangs if r["env_name"] == "inherited"}
    assert stops[LEADER] == "stalled"
    # followers stuck where the leader hung are confirmed sooner; under xdist one may start before
    # the leader's hang is recorded, and then pays its own deadline
    assert all(stops[f] == "confirm" for f in FOLLOWERS) if not workers else set(stops.values()) <= {
        "stalled", "confirm"}  # fmt: skip
    for r in hangs:
        assert r["root_cause"] == {
            "rank": None, "kind": "hang", "message": "ranks 0,1 all stuck in probe (send/recv 4B)",
            "phase": None, "step": None,
        }  # fmt: skip
        assert r["link"] == "SYS" and r["simulated"] is True
    assert [r["env"] for r in records if r["env_name"] == "p2p_level_nvl"] == [{"NCCL_P2P_LEVEL": "NVL"}] * 3
    paid = sum(r["stop_reason"] == "stalled" for r in records)
    confirmed = f"; {4 - paid} hang(s) confirmed sooner: {4 - paid} stuck where their class hung" if paid < 4 else ""
    result.stdout.fnmatch_lines(
        [
            "link class x rung (passed/run)",
            table_row("class", 5, {n: n for n in LADDER_COLUMNS}),
            table_row("NODE", 5, dict(zip(LADDER_COLUMNS, ["2/2", "-", "-"], strict=True))),
            table_row("PIX", 5, dict(zip(LADDER_COLUMNS, ["1/1", "-", "-"], strict=True))),
            table_row("SYS", 5, dict(zip(LADDER_COLUMNS, ["0/3", "0/1", "3/3"], strict=True))),
            "NODE, PIX: first passing rung inherited: nothing to set: the environment as it is",
            "SYS: first passing rung p2p_level_nvl: export NCCL_P2P_LEVEL=NVL",
            f"deadlines paid: {paid} (step deadline 3s){confirmed}",
        ]
    )
    assert paid == 2 or workers  # the leader on inherited and on cumem_off
    failed = failed_nodeids(result)
    assert failed == sorted(
        [
            "test_pair.py::test_pair[gpu0-gpu3-SYS-cumem_off]",
            "test_pair.py::test_pair[gpu0-gpu3-SYS-inherited]",
            "test_pair.py::test_pair[gpu1-gpu3-SYS-inherited]",
            "test_pair.py::test_pair[gpu2-gpu3-SYS-inherited]",
        ]
    )


# ---------------------------------------------------------------------------------------------
# Which rungs can change a case (plan/relevance.py)
# ---------------------------------------------------------------------------------------------

RUNG_REACH_CASES = [
    # rung, devices, links, can change it (every pair's NVML P2P status OK; NCCL and CPU unknown)
    ("cumem_off", 2, ("SYS",), True), ("cumem_off", 2, ("NV18",), True), ("cumem_off", 1, (), True),
    ("nvls_off", 2, ("PIX",), False), ("nvls_off", 8, ("NV18",), True), ("nvls_off", 1, (), False),
    ("nvls_off", 2, ("NV18",), True),  # the NCCL version unknown: a pair may use NVLS (2.28.7 on)
    ("cumem_host_off", 1, (), False), ("cumem_host_off", 2, ("NV18",), False), ("cumem_host_off", 2, ("SYS",), True),
    ("p2p_level_nvl", 2, ("NV18",), False), ("p2p_level_nvl", 2, ("PIX",), True), ("p2p_level_nvl", 1, (), False),
    ("p2p_off", 2, ("NV18",), True), ("p2p_off", 1, (), False),
    ("p2p_off", 2, ("PXB",), False),  # SHM, as p2p_level_nvl before it already made it
    ("shm_off", 1, (), False), ("shm_off", 2, ("NODE",), True),
    ("p2p_shm_off", 1, (), False), ("ib_off", 1, (), False), ("net_socket", 2, ("PXB",), True),
    # a set with both kinds of path: a rung for either kind may change it
    ("cumem_off", 8, ("NODE", "PIX", "SYS", "NV4"), True), ("p2p_level_nvl", 8, ("NV4", "PIX"), True),
    # paths the table does not know (between nodes, virtual CPU devices), rungs it does not list
    ("p2p_level_nvl", 2, ("NET",), True), ("nvls_off", 2, ("CPU",), True), ("nvls_off", 0, (), True),
    ("inherited", 1, (), True), ("clean", 2, ("SYS",), True), ("mine", 2, ("SYS",), True),
]  # fmt: skip
LADDER_WITH_MINE = (*BUILTIN_LADDER, Rung("mine", {"NCCL_ALGO": "Ring"}))


def futile(rung: str, devices: int, links: tuple[str, ...], nccl: str | None = None) -> str | None:
    """relevance.cannot_change for a built-in rung on a set whose pairs are ``links`` (NVML P2P OK)."""
    names = [r.name for r in LADDER_WITH_MINE]
    k = names.index(rung)
    between = Between(devices, tuple(PairPath(link, True) for link in links))
    return cannot_change(LADDER_WITH_MINE, k, between, NcclHost("", nccl), {}, tuple(range(k)))


@pytest.mark.parametrize(("rung", "devices", "links", "changes"), RUNG_REACH_CASES)
def test_rung_relevance_table(rung: str, devices: int, links: tuple[str, ...], changes: bool) -> None:
    reason = futile(rung, devices, links)
    assert (reason is None) == changes, reason
    if reason is not None:
        assert reason.startswith(f"rung {rung} cannot change a case ")
        transport = ("NCCL uses no SHM there", "NCCL would use SHM over PXB as on rung p2p_level_nvl")
        assert RUNG_REACH[rung].why in reason or reason.endswith(transport)


@pytest.mark.parametrize(
    ("nccl", "tried_on_a_pair"),
    [("2.18.3", False), ("2.27.5+cuda12.9", False), ("2.28.3", False), ("2.28.7", True), ("2.29.3", True),
     (None, True), ("unknown", True)],
)  # fmt: skip
def test_nvls_off_is_tried_on_a_pair_only_where_that_nccl_uses_nvls_on_pairs(
    nccl: str | None, tried_on_a_pair: bool
) -> None:
    """nvls.cc's ncclNvlsInit: `gpuCount <= 2` skips NVLS from v2.18.3-1 to v2.28.3-1, `gpuCount < 2` from v2.28.7-1."""
    reason = futile("nvls_off", 2, ("NV18",), nccl)
    assert (reason is None) == tried_on_a_pair
    if reason is not None:
        assert reason == f"rung nvls_off cannot change a case on 2 GPUs: NCCL {nccl} uses NVLS from 3 GPUs only"
    assert futile("nvls_off", 3, ("NV18", "NV18", "NV18"), nccl) is None


def test_rung_relevance_table_covers_every_builtin_fallback() -> None:
    assert set(RUNG_REACH) == {r.name for r in BUILTIN_LADDER} - {"inherited", "clean"}


def test_ladder_book_skips_futile_rungs_without_waiting_for_them(tmp_path: Path) -> None:
    book = make_book(tmp_path)
    leader, follower = "test_p[gpu0-gpu4-PIX]", "test_p[gpu1-gpu5-PIX]"

    def pix_step(key: str, name: str, leader_key: str | None = None) -> Step:
        return replace(step(key, name, leader_key), devices=2, paths=(PairPath("PIX", True),))

    for futile_rung in ("nvls_off", "cumem_host_off"):  # no NVLink; P2P predicted, so no SHM
        decision = book.decide(pix_step(leader, futile_rung), {})
        assert not decision.run and decision.reason.startswith(f"rung {futile_rung} cannot change a case over PIX")
    # the leader's futile rungs are never recorded by anyone: the follower does not wait for them
    record(book, leader, {"inherited": "hang", "clean": "skipped", "cumem_off": "hang", "p2p_level_nvl": "pass"})
    record(book, follower, {"inherited": "hang", "clean": "skipped", "cumem_off": "skipped"})
    assert book.decide(pix_step(follower, "p2p_level_nvl", leader), {}) == RungDecision(True)
    assert not any(line["outcome"] == "undecided" for line in lines_of(book))


# ---------------------------------------------------------------------------------------------
# One deadline per hung class: followers stuck where their leader hung are confirmed sooner
# ---------------------------------------------------------------------------------------------

# Three SYS pairs; only the rank on gpu0 hangs (where NCCL would use P2P): gpu0-gpu1 leads and
# hangs, gpu0-gpu2 hangs like it, gpu1-gpu2 is healthy: a pair that differs from its class.
GPU0_HANGS = 'effect = "hang"\nphase = "probe"\nprobes = ["pair_exchange"]\ndevices = ["gpu0"]\np2p = true'
SLOW_TIMEOUTS = ("--step-timeout=8", "--op-timeout=7", "--init-timeout=7", "--grace=1")  # confirm after 2 s


@pytest.mark.slow
def test_followers_stuck_where_the_leader_hung_are_confirmed_sooner(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    pytester.makepyfile(test_pair=PAIR_TEST)
    topology = write_topology(pytester, "sys3", {"gpu0-gpu1": "SYS", "gpu0-gpu2": "SYS", "gpu1-gpu2": "SYS"})
    scenario = pytester.makefile(".toml", scen=scenario_text(GPU0_HANGS))
    result = run_suite(f"--topology-file={topology}", f"--scenario={scenario}", *SLOW_TIMEOUTS, "test_pair.py")
    records = {(r["ladder_key"], r["env_name"]): r for r in read_records(reports_dir)}
    leader, same, differs = (f"test_pair[{p}-SYS]" for p in ("gpu0-gpu1", "gpu0-gpu2", "gpu1-gpu2"))
    assert {k: r["verdict"] for k, r in records.items()} == {
        (leader, "inherited"): "hang", (leader, "cumem_off"): "hang", (leader, "p2p_level_nvl"): "pass",
        (same, "inherited"): "hang", (same, "p2p_level_nvl"): "pass",
        (differs, "inherited"): "pass",  # found, though its class hangs
    }  # fmt: skip
    # the leader: stuck in its 4-byte step for 5 s (the machine not saturated), else the 8 s step deadline
    assert records[(leader, "inherited")]["stop_reason"] in ("small_step", "stalled", "grace")
    confirmed = records[(same, "inherited")]
    assert confirmed["stop_reason"] == "confirm", confirmed["summary"]
    assert confirmed["summary"] == "ranks 0,1 all stuck in probe (send/recv 4B)"
    ladder = {(d["key"], d["rung"]): d for d in ladder_lines(reports_dir)}
    assert ladder[(leader, "inherited")]["stuck"] == "probe (send/recv 4B)"
    result.stdout.fnmatch_lines(
        [
            "*stopped by the watchdog (confirm, stuck where the first pair of its link class hung)*",
            "deadlines paid: * (step deadline 8s); * hang(s) confirmed sooner: 1 stuck where their class hung*",
        ]
    )


def test_ladder_book_first_rung_confirms_only_after_the_leader_hung(tmp_path: Path) -> None:
    book = make_book(tmp_path)
    leader, follower = "test_p[gpu0-gpu1-SYS]", "test_p[gpu0-gpu2-SYS]"
    first = step(follower, "inherited", leader)
    assert book.decide(first, {}) == RungDecision(True)  # nothing known of the leader yet: no waiting either
    book.record(step(leader, "inherited"), "pass")
    assert book.decide(first, {}) == RungDecision(True)
    other = "test_p[gpu1-gpu2-SYS]"
    book.record(step(other, "inherited"), "hang")  # hung, but nobody knows where
    assert book.decide(step("test_p[gpu1-gpu3-SYS]", "inherited", other), {}) == RungDecision(True)
    book.record(step(other, "inherited"), "hang", stuck="probe (send/recv 4B)")
    decision = book.decide(step("test_p[gpu1-gpu3-SYS]", "inherited", other), {})
    assert decision == RungDecision(True, confirm_at="probe (send/recv 4B)")
    assert book.decide(step(other, "inherited"), {}) == RungDecision(True)  # the leader itself: its own deadline


@pytest.mark.parametrize(("step_timeout", "confirm"), [(60, 10.0), (20, 5.0), (4, 2.0), (1.5, 1.5)])
def test_confirm_wait_is_short_and_never_beyond_the_step_deadline(step_timeout: float, confirm: float) -> None:
    assert Deadlines(1.0, 1.0, 600.0, 1.0, step_timeout=step_timeout).confirm_wait == confirm


DECISION_WAIT = 60.0
AT_ONCE = 10.0  # the margin for load: a few polls of 0.1 s on a busy machine, far below DECISION_WAIT


def test_a_rung_whose_runner_died_is_given_up_at_once(tmp_path: Path) -> None:
    """A claim by a process that is gone ends the wait now, not at the decision deadline; a live one waits."""
    book = LadderBook(tmp_path / "ladder.jsonl", BUILTIN_LADDER, "adaptive", decision_wait=lambda k: DECISION_WAIT)
    key = "test_p[gpu0-gpu1-SYS]"
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    LadderBook(tmp_path / "ladder.jsonl", BUILTIN_LADDER, "adaptive", lambda k: 0.0).claim(step(key, "inherited"))
    claims = (tmp_path / CLAIMS_FILE).read_text().replace(str(os.getpid()), str(dead.pid))
    (tmp_path / CLAIMS_FILE).write_text(claims)  # as the dead process would have written it
    begun = time.monotonic()
    decision = book.decide(step(key, "clean"), {"NCCL_DEBUG": "INFO"})
    assert time.monotonic() - begun < AT_ONCE  # not the decision deadline
    assert decision == RungDecision(True, f"rung inherited of {key} {NEVER_DECIDED}")
    (given_up,) = lines_of(book)
    assert given_up["reason"] == f"its worker (pid {dead.pid}) died running it"
    # a worker of the run has died: a rung nobody has started is not waited for either (out of order now)
    other = "test_p[gpu0-gpu2-SYS]"
    assert book.decide(step(other, "clean"), {"NCCL_DEBUG": "INFO"}).reason.endswith(NEVER_DECIDED)
    assert time.monotonic() - begun < AT_ONCE
    assert lines_of(book)[1]["reason"] == OUT_OF_ORDER
    # a rung claimed by a live process (this one) is waited for until its deadline
    (tmp_path / "live").mkdir()
    book = LadderBook(tmp_path / "live" / "ladder.jsonl", BUILTIN_LADDER, "adaptive", decision_wait=lambda k: 0.5)
    book.claim(step(key, "inherited"))
    assert book.decide(step(key, "clean"), {"NCCL_DEBUG": "INFO"}).reason.endswith(NEVER_DECIDED)
    assert lines_of(book)[0]["reason"].startswith("not decided within")
