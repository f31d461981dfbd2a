"""Every setting of the suite, resolved and validated in one place.

Each setting has a command-line option, an ini key (``conformance_<name>``) and an environment
variable (``CONFORMANCE_<NAME>``).  Priority, from low to high:

    built-in default  <  ini key  <  environment variable  <  command-line option

A bad value raises :class:`SettingError` naming the value and where it came from; the plugin turns
it into ``pytest.UsageError`` before any case starts.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from conformance.common import values
from conformance.common.deadlines import Deadlines
from conformance.common.inputs import (
    NO_JINJA2,
    NO_PROMETHEUS_CLIENT,
    NotReadable,
    absolute,
    jinja2_missing,
    prometheus_client_missing,
    read_bounded,
)
from conformance.common.run_token import token_file_refused, weak_token
from conformance.common.values import BadValue

if TYPE_CHECKING:
    import pytest

BACKENDS = ("auto", "gloo", "nccl")
MATRIX_MODES = ("adaptive", "full", "inherited")
NODE_PAIR_MODES = ("auto", "all", "quick")
ALL_NODE_PAIRS_UP_TO = 8  # auto: every pair up to 8 nodes (7 rounds); beyond, the quick pass
T = TypeVar("T")


class SettingError(ValueError):
    """A setting's value is unusable; the message names the value and its source."""


def _checked(parse: Callable[[str], T]) -> Callable[[str, str], T]:
    """A ``values`` parser whose complaint names where the value came from."""

    def checked(raw: str, where: str) -> T:
        try:
            return parse(raw)
        except BadValue as exc:
            raise SettingError(f"{where}: {exc}") from None

    return checked


_positive_number = _checked(values.positive_seconds)
_ratio = _checked(values.ratio)
_positive_int = _checked(lambda raw: values.whole_number(raw, minimum=1))
_node_rank = _checked(lambda raw: values.whole_number(raw, minimum=0))
_device_count = _checked(values.device_count)
_port = _checked(values.port)
_host = _checked(values.host)
_floor = _checked(values.bandwidth_floor)
_message_bytes = _checked(values.message_bytes)


@dataclass(frozen=True)
class _Choice:
    """A parser of one of fixed ``choices``; --help shows them as its value (``{auto,gloo,nccl}``)."""

    what: str
    choices: tuple[str, ...]

    def __call__(self, raw: str, where: str) -> str:
        value = raw.strip().lower()
        if value not in self.choices:
            raise SettingError(f"{where}: unknown {self.what} {raw!r}; choose one of {', '.join(self.choices)}")
        return value

    @property
    def metavar(self) -> str:
        return "{" + ",".join(self.choices) + "}"


def _text(raw: str, where: str) -> str:
    return raw


def _token(raw: str, where: str) -> str:
    value = raw.strip()
    if not value or not value.isprintable():
        shown = f"{len(raw)} character(s), not shown"  # the token is the run's secret, even when mistyped
        raise SettingError(f"{where}: the run token ({shown}) must be printable text, not empty")
    weak = weak_token(value)  # the rule: conformance/common/run_token.py
    if weak:
        raise SettingError(f"{where}: {weak}")
    return value


def _flag(raw: str, where: str) -> bool:
    value = str(raw).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise SettingError(f"{where}: {raw!r} is not a yes/no value (1, true, yes, on / 0, false, no, off)")


@dataclass(frozen=True)
class Setting:
    name: str
    help: str
    default: str | None
    parse: Callable[[str, str], Any]
    is_path: bool = False
    is_flag: bool = False  # an option without a value (--run-report); ini and environment take yes/no
    multiple: bool = False  # repeatable option, ini line list, ';'-separated environment variable
    metavar: str = ""  # the kind of value in --help (SECONDS, N, FILE, ...); a _Choice lists its choices

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def ini_key(self) -> str:
        return f"conformance_{self.name}"

    @property
    def env_var(self) -> str:
        return f"CONFORMANCE_{self.name.upper()}"

    @property
    def dest(self) -> str:
        return f"conformance_{self.name}"


BACKEND_HELP = "torch.distributed backend for the cases: auto (nccl when GPUs are found, else gloo), gloo or nccl."
VIRTUAL_DEVICES_HELP = "Number of virtual CPU devices (gloo ranks) when no GPU is used (at most 32)."
INIT_TIMEOUT_HELP = "Seconds a rank waits for rendezvous and process-group set-up (in-rank)."
OP_TIMEOUT_HELP = "gloo: seconds a collective may take in a rank (init_process_group timeout); unused on NCCL."
STEP_TIMEOUT_HELP = (
    "Seconds a case may go without any rank reporting progress (a new step, or a part of a long one) "
    "before the watchdog calls it a hang."
)
CASE_TIMEOUT_HELP = "Seconds the watchdog gives a whole case, progressing or not: the last net."
GRACE_HELP = "Seconds the other ranks get after one rank fails, before they are stopped."
MATRIX_HELP = "Environment rungs to run: adaptive (fallback rungs only where inherited fails), full, inherited."
ENV_RUNG_HELP = "An extra environment rung NAME:VAR=VALUE[,VAR=VALUE] (repeatable; env var: ';'-separated)."
ENV_RUNGS_FILE_HELP = 'TOML file of extra rungs: [[rung]] name = "...", env = { VAR = "value" }.'
TOPOLOGY_FILE_HELP = "JSON topology (from 'python -m conformance topology --json') used instead of NVML."
BASELINE_HELP = "A run (folder, results.jsonl or JUnit XML) to compare this run against; a regression fails the run."
BANDWIDTH_TOLERANCE_HELP = "Bandwidth ratio current/baseline below which a passing case counts as a drop."
SLOW_RATIO_HELP = (
    "A pair whose bandwidth is below this fraction of its link class's median in the same run is SLOW "
    "(judged where bandwidth measures a GPU link: NCCL runs, simulated machines)."
)
BANDWIDTH_FLOOR_HELP = "CLASS=GBPS: a pair of that link class below this many GB/s is SLOW (repeatable; env: ';')."
RUN_REPORT_HELP = "Write the run's self-contained HTML report (report.html in the run folder) at the end."
SCENARIO_HELP = (
    "TOML file of simulated faults applied inside real ranks (marks the run simulated), or the name of a "
    "shipped one (driver-p2p-hang, ...)."
)
NNODES_HELP = "Nodes in a multi-node run (one pytest per node). Default: SLURM_NNODES, NNODES, else 1."
NODE_RANK_HELP = "This node's rank, 0 for the node hosting the run's store. Default: SLURM_NODEID, NODE_RANK."
MASTER_ADDR_HELP = "Address of node 0, whose TCPStore serves the run. Default: SLURM_JOB_NODELIST, MASTER_ADDR."
MASTER_PORT_HELP = "TCP port of the run's store on node 0. Default: MASTER_PORT, else 29500."
NODE_PAIRS_HELP = (
    "Pairs of nodes to test: all (every pair, N-1 rounds), quick (one random round, then each node of a failed "
    f"pair re-paired with a node known good, naming the bad node), auto (all up to {ALL_NODE_PAIRS_UP_TO} nodes)."
)
RUN_TOKEN_HELP = (
    "The secret every node of a run across nodes holds (the same on each): it signs every value the nodes exchange, "
    "and a node of another run on the same port is turned away. At least 128 bits: `python -m conformance token` "
    "makes one. On the command line any local user can read it (/proc/PID/cmdline): prefer "
    "CONFORMANCE_RUN_TOKEN or --run-token-file."
)
UNSIGNED_HELP = (
    "Let a run across nodes go on without signing when it has no way to sign (no run token, and not under SLURM "
    "with MUNGE); its answer then opens with UNSIGNED on every node. Without it such a run is refused."
)
MAX_BYTES_HELP = (
    "The largest collective message, at which bus bandwidth is measured (bytes, or 64M, 8G: powers of 1024); "
    "the default is 64M on GPUs, 1M on CPU ranks. 8G gives the busbw all_reduce_perf -b 8G -e 8G reports."
)
RUN_TOKEN_FILE_HELP = (
    "A file holding the run token (its first line), instead of --run-token: a regular file of at most 4 KiB, "
    "owned by this user (or root) and open to nobody else (mode 0600 or 0400, as ssh wants of a key). Under SLURM "
    "without a token, MUNGE signs the run."
)
RENDEZVOUS_TIMEOUT_HELP = "Seconds the nodes wait for each other at the start before a missing node is a hang."
EXPECT_GPUS_HELP = (
    "GPUs the machine must have (NVML's count, whatever CUDA_VISIBLE_DEVICES hides); fewer fails the run "
    "(host check gpu_inventory)."
)
REPORTS_DIR_HELP = "Folder where each run writes reports/<run-id>/ and the 'latest' link."
LEASE_DIR_HELP = (
    "Folder of the GPU leases every run on this machine shares (made 01777, like /tmp), so runs never share a "
    "GPU (in /tmp, not TMPDIR, which users set differently). Give a run its own only where it must share GPUs "
    "with another: two nodes of a test run on one machine."
)
METRICS_FILE_HELP = (
    "Write the run's results in Prometheus' text format to this file (replaced atomically, at the run's start "
    "and end), e.g. for node_exporter's textfile collector; its folder must exist."
)
METRICS_PER_CASE_HELP = (
    "Add a series per case to the metrics file (the pytest node id a label: about 500 on an 8-GPU node); by "
    "default its series are bounded by the machine (at most 150 on an 8-GPU node)."
)

SETTINGS: tuple[Setting, ...] = (
    Setting("backend", BACKEND_HELP, "auto", _Choice("backend", BACKENDS)),
    Setting("virtual_devices", VIRTUAL_DEVICES_HELP, "4", _device_count, metavar="N"),
    Setting("expect_gpus", EXPECT_GPUS_HELP, None, _positive_int, metavar="N"),
    Setting("init_timeout", INIT_TIMEOUT_HELP, "20", _positive_number, metavar="SECONDS"),
    Setting("op_timeout", OP_TIMEOUT_HELP, "20", _positive_number, metavar="SECONDS"),
    Setting("step_timeout", STEP_TIMEOUT_HELP, "30", _positive_number, metavar="SECONDS"),
    Setting("case_timeout", CASE_TIMEOUT_HELP, "120", _positive_number, metavar="SECONDS"),
    Setting("grace", GRACE_HELP, "3", _positive_number, metavar="SECONDS"),
    Setting("matrix", MATRIX_HELP, "adaptive", _Choice("matrix", MATRIX_MODES)),
    Setting(
        "env_rung", ENV_RUNG_HELP, None, _text, multiple=True, metavar="NAME:VAR=VALUE[,VAR=VALUE]"
    ),  # parsed into rungs by the plan
    Setting("env_rungs_file", ENV_RUNGS_FILE_HELP, None, _text, is_path=True, metavar="FILE"),
    Setting("topology_file", TOPOLOGY_FILE_HELP, None, _text, is_path=True, metavar="FILE"),
    Setting("scenario", SCENARIO_HELP, None, _text, is_path=True, metavar="FILE|NAME"),
    Setting("reports_dir", REPORTS_DIR_HELP, "reports", _text, is_path=True, metavar="DIR"),
    Setting("lease_dir", LEASE_DIR_HELP, "/tmp/conformance-leases", _text, is_path=True, metavar="DIR"),
    Setting("metrics_file", METRICS_FILE_HELP, None, _text, is_path=True, metavar="FILE"),
    Setting("metrics_per_case", METRICS_PER_CASE_HELP, "no", _flag, is_flag=True),
    Setting("baseline", BASELINE_HELP, None, _text, is_path=True, metavar="RUN"),
    Setting("bandwidth_tolerance", BANDWIDTH_TOLERANCE_HELP, "0.8", _ratio, metavar="RATIO"),
    Setting("slow_ratio", SLOW_RATIO_HELP, "0.6", _ratio, metavar="RATIO"),
    Setting("bandwidth_floor", BANDWIDTH_FLOOR_HELP, None, _floor, multiple=True, metavar="CLASS=GBPS"),
    Setting("max_bytes", MAX_BYTES_HELP, None, _message_bytes, metavar="SIZE"),
    Setting("run_report", RUN_REPORT_HELP, "no", _flag, is_flag=True),
    Setting("nnodes", NNODES_HELP, None, _positive_int, metavar="N"),
    Setting("node_rank", NODE_RANK_HELP, None, _node_rank, metavar="N"),
    Setting("master_addr", MASTER_ADDR_HELP, None, _host, metavar="HOST"),
    Setting("master_port", MASTER_PORT_HELP, None, _port, metavar="PORT"),
    Setting("rendezvous_timeout", RENDEZVOUS_TIMEOUT_HELP, "60", _positive_number, metavar="SECONDS"),
    Setting("node_pairs", NODE_PAIRS_HELP, "auto", _Choice("node pairs mode", NODE_PAIR_MODES)),
    Setting("run_token", RUN_TOKEN_HELP, None, _token, metavar="TEXT"),
    Setting("run_token_file", RUN_TOKEN_FILE_HELP, None, _text, is_path=True, metavar="FILE"),
    Setting("unsigned", UNSIGNED_HELP, "no", _flag, is_flag=True),
)
NODE_LAYOUT = ("nnodes", "node_rank", "master_addr", "master_port")


def settings_table() -> str:
    """Every setting as a Markdown table: docs/settings.md holds it (``tools/settings_doc.py`` writes it)."""
    rows = [
        "| option | ini key | environment variable | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for setting in SETTINGS:
        value = "" if setting.is_flag else f"={setting.metavar or _choices(setting)}"
        ini = f"`{setting.ini_key}`" + (" (lines)" if setting.multiple else " (yes/no)" if setting.is_flag else "")
        env = f"`{setting.env_var}`" + (" (`;`-separated)" if setting.multiple else "")
        default = "none" if setting.default is None else f"`{setting.default}`"
        meaning = " ".join(setting.help.split()).replace("|", "\\|")
        option = f"`{setting.option}{value}`".replace("|", "\\|")
        rows.append(f"| {option} | {ini} | {env} | {default} | {meaning} |")
    return "\n".join(rows) + "\n"


def _choices(setting: Setting) -> str:
    return "{" + ",".join(setting.parse.choices) + "}" if isinstance(setting.parse, _Choice) else "VALUE"


@dataclass(frozen=True)
class Settings:
    """Every setting's resolved value; the defaults are the ``SETTINGS`` entries' (written once, there)."""

    backend: str
    virtual_devices: int
    expect_gpus: int | None
    init_timeout: float
    op_timeout: float
    step_timeout: float
    case_timeout: float
    grace: float
    matrix: str
    env_rung: tuple[str, ...]  # NAME:VAR=VALUE[,...] specs, as given
    env_rungs_file: Path | None
    topology_file: Path | None
    scenario: Path | None
    reports_dir: Path
    lease_dir: Path
    metrics_file: Path | None
    metrics_per_case: bool
    baseline: Path | None
    bandwidth_tolerance: float
    slow_ratio: float
    bandwidth_floor: tuple[tuple[str, float], ...]
    max_bytes: int | None
    run_report: bool
    nnodes: int | None
    node_rank: int | None
    master_addr: str | None
    master_port: int | None
    rendezvous_timeout: float
    node_pairs: str
    run_token: str | None
    run_token_file: Path | None
    unsigned: bool
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def source(self, name: str) -> str:
        return self.sources.get(name, "default")


SETTING = {setting.name: setting for setting in SETTINGS}


def default_of(name: str) -> Any:
    """A setting's built-in default, parsed (relative paths stay relative)."""
    setting = SETTING[name]
    return None if setting.default is None else setting.parse(setting.default, "default")


def reports_dir_outside_pytest(environ: Mapping[str, str]) -> Path:
    """Where runs are for the commands outside pytest: the environment variable, else the default."""
    setting = SETTING["reports_dir"]
    return Path(environ.get(setting.env_var) or str(setting.default))


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup(
        "conformance",
        "GPU environment conformance suite. Examples: pytest suites/ (this machine, as it is); "
        "pytest suites/ --scenario driver-p2p-hang (a simulated broken box, no GPU needed); "
        "pytest suites/ --junitxml=conformance.xml --baseline reports/good (CI, against a known-good run)",
    )
    for setting in SETTINGS:
        default_note = f" Default: {setting.default}." if setting.default else ""
        help_text = f"{setting.help}{default_note} Also ini {setting.ini_key}, env {setting.env_var}."
        if setting.is_flag:
            group.addoption(
                setting.option, dest=setting.dest, default=None, action="store_const", const="yes", help=help_text
            )
            parser.addini(setting.ini_key, setting.help, default=None)
            continue
        group.addoption(
            setting.option,
            dest=setting.dest,
            default=None,
            action="append" if setting.multiple else "store",
            metavar=setting.parse.metavar if isinstance(setting.parse, _Choice) else setting.metavar,
            help=help_text,
        )
        if setting.multiple:
            parser.addini(setting.ini_key, setting.help, type="linelist", default=None)
        else:
            parser.addini(setting.ini_key, setting.help, default=None)


def _as_items(setting: Setting, raw: Any) -> Any:
    """A repeatable setting's raw value as a list of strings (the environment uses ';')."""
    if not setting.multiple or raw is None:
        return raw
    if isinstance(raw, str):
        raw = raw.split(";")
    return [str(item) for item in raw if str(item).strip()]


def _raw_value(setting: Setting, config: pytest.Config, environ: Mapping[str, str]) -> tuple[Any, str, Path]:
    """Return (raw value, where it came from, directory relative paths are taken from)."""
    cli = config.getoption(setting.dest)
    if cli is not None:
        raw = cli if setting.multiple else str(cli)
        return raw, f"command-line option {setting.option}", config.invocation_params.dir
    if setting.env_var in environ:
        where = f"environment variable {setting.env_var}"
        return environ[setting.env_var], where, config.invocation_params.dir
    overrides = config.getoption("override_ini") or []
    for override in reversed(overrides):
        if override.startswith(f"{setting.ini_key}="):
            where = f"command-line option -o {setting.ini_key}"
            return override.split("=", 1)[1], where, config.invocation_params.dir
    ini = config.getini(setting.ini_key)
    if ini not in (None, "", []):
        inifile = config.inipath or "the ini file"
        base = config.inipath.parent if config.inipath else config.rootpath
        return ini if setting.multiple else str(ini), f"ini key {setting.ini_key} in {inifile}", base
    return setting.default, "default", config.rootpath


def _parse(setting: Setting, raw: Any, where: str, base: Path) -> Any:
    if setting.multiple:
        return tuple(setting.parse(item, where) for item in _as_items(setting, raw))
    value = setting.parse(raw, where)
    if setting.is_path:
        if not str(value).strip():
            raise SettingError(f"{where}: an empty path is not allowed")
        try:
            value = absolute(base / Path(value).expanduser())
        except NotReadable as exc:  # a loop: one line here, before any reader meets it
            raise SettingError(f"{where}: {str(value)!r} {exc}") from None
    return value


def resolve(config: pytest.Config, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve every setting by the documented priority and validate it."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        raw, where, base = _raw_value(setting, config, environ)
        sources[setting.name] = where
        if raw is not None:
            values[setting.name] = _parse(setting, raw, where, base)
        else:
            values[setting.name] = () if setting.multiple else None
    settings = with_token_from_file(Settings(**values, sources=sources))
    check_deadline_layers(settings)
    check_reports_dir(settings.reports_dir, settings.source("reports_dir"))
    check_lease_dir(settings.lease_dir, settings.source("lease_dir"))
    if settings.metrics_file is not None:
        check_metrics_file(settings.metrics_file, settings.source("metrics_file"))
        if prometheus_client_missing():  # refused now, not after the whole run
            raise SettingError(f"{settings.source('metrics_file')}: --metrics-file: {NO_PROMETHEUS_CLIENT}")
    elif settings.metrics_per_case:
        raise SettingError(f"{settings.source('metrics_per_case')}: --metrics-per-case: give --metrics-file too")
    if settings.run_report and jinja2_missing():  # refused now, not after the whole run
        raise SettingError(f"{settings.source('run_report')}: --run-report: {NO_JINJA2}")
    return settings


def deadlines(settings: Settings, backend: str) -> Deadlines:
    """Every deadline and wait of the run, derived from the settings (``common/deadlines.py``)."""
    return Deadlines(
        init_timeout=settings.init_timeout,
        op_timeout=settings.op_timeout,
        case_timeout=settings.case_timeout,
        grace=settings.grace,
        backend=backend,
        step_timeout=settings.step_timeout,
        rendezvous_timeout=settings.rendezvous_timeout,
    )


def check_deadline_layers(settings: Settings) -> None:
    """In-rank timeouts must fire before the parent's step deadline, or hangs lose their phase.

    The rule is ``Deadlines.in_rank_too_late``'s; here the message names where each value came from.
    The step deadline is --step-timeout, or --case-timeout where that is shorter (no step outlasts
    its case); the message names whichever of the two it is.
    """
    outer = "step_timeout" if settings.step_timeout <= settings.case_timeout else "case_timeout"
    limit = getattr(settings, outer)
    for inner, value in deadlines(settings, "gloo").in_rank_too_late():
        raise SettingError(
            f"{settings.source(inner)}: {inner.replace('_', '-')} {value:g}s must be shorter "
            f"than {outer.replace('_', '-')} {limit:g}s ({settings.source(outer)}), "
            "so the in-rank timeout fires before the watchdog"
        )


REPORTS_MIN_FREE = 16 << 20  # a run's records, run.json and its ranks' logs: a folder with less fills mid-run
WRITE_CHECK = b"\0" * (64 << 10)  # written and synced: a quota or a full disk refuses it where statvfs looks fine


TOKEN_FILE_BYTES = 4096


def with_token_from_file(settings: Settings) -> Settings:
    """The settings with the run token read from ``run_token_file`` (its first line); one source only."""
    path = settings.run_token_file
    if path is None:
        return settings
    where = settings.source("run_token_file")
    if settings.run_token is not None:
        raise SettingError(f"{where}: a run token file and a run token ({settings.source('run_token')}): give one")
    refused = token_file_refused(path)
    if refused:
        raise SettingError(f"{where}: run token file {str(path)!r} {refused}")
    try:
        text = read_bounded(path, TOKEN_FILE_BYTES).decode("utf-8")
    except NotReadable as exc:
        raise SettingError(f"{where}: run token file {str(path)!r} {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise SettingError(f"{where}: run token file {str(path)!r} cannot be read: {why}") from None
    first = text.splitlines()[0] if text.splitlines() else ""
    return replace(settings, run_token=_token(first, f"{where}: run token file {str(path)!r}"))


def token_on_command_line(settings: Settings) -> str | None:
    """The warning for a run token given on the command line, where any local user reads it; None elsewhere."""
    where = settings.source("run_token")
    if settings.run_token is None or not where.startswith("command-line option"):
        return None
    return (
        f"the run token is on the command line ({where}): any user of this machine can read it in /proc/PID/cmdline "
        "(ps); give it as CONFORMANCE_RUN_TOKEN or --run-token-file instead"
    )


def check_reports_dir(path: Path, where: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-") as probe:
            probe.write(WRITE_CHECK)
            probe.flush()
            os.fsync(probe.fileno())
        room = os.statvfs(path)
    except OSError as exc:
        raise SettingError(f"{where}: reports dir {str(path)!r} cannot be written: {exc.strerror or exc}") from None
    free = room.f_bavail * room.f_frsize
    if free < REPORTS_MIN_FREE:
        raise SettingError(
            f"{where}: reports dir {str(path)!r} has {free >> 10} KiB free; a run needs at least "
            f"{REPORTS_MIN_FREE >> 20} MiB for its records and its ranks' logs"
        )


def check_lease_dir(path: Path, where: str) -> None:
    """The lease folder is a folder where it exists (``launch/leases.py`` makes it, shared, where it does not)."""
    if path.exists() and not path.is_dir():
        raise SettingError(
            f"{where}: lease folder {str(path)!r} is not a folder (a file, a named pipe?); name a folder"
        )


def check_metrics_file(path: Path, where: str) -> None:
    """The metrics file can be replaced: its folder exists (never made: a typo is not a new folder) and takes files."""
    shown = f"metrics file {str(path)!r}"
    if path.is_dir():
        raise SettingError(f"{where}: {shown} is a folder; name a file in it (gpu_conformance.prom)")
    if path.exists() and not path.is_file():  # replaced at the end of the run, a FIFO or a device would be lost
        raise SettingError(f"{where}: {shown} is not a regular file (a named pipe or a device?); name a file")
    if not path.parent.is_dir():
        missing = "is not a folder" if path.parent.exists() else "does not exist"
        raise SettingError(f"{where}: {shown} cannot be written: its folder {str(path.parent)!r} {missing}")
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".write-check"):
            pass
    except OSError as exc:
        raise SettingError(f"{where}: {shown} cannot be written: {exc.strerror or exc}") from None
