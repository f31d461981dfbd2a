"""Who wrote a log line, when, at what level, and what it said: every prefix a launcher or a logger writes, parsed once.

A line of a job's log carries the prefixes of everything it passed through, outermost first: a log
collector's JSON record or timestamp, pdsh's host, srun's task label, mpirun's tag, torchrun's
``[default3]:``, then the process's own (torch's ``[rank3]:``, a logging library's level, time and
source line).  :data:`WRITER_PREFIXES` holds every shape, each with where it comes from;
:func:`parse_line` takes them off in any order and returns each line as a :class:`ParsedLine` (the
text, its writer, its time and its level).

**Hostile text.**  A prefix is only ever matched at the start of what is left of the line, each of the
writer's fields is taken once, and a launcher's prefix (:data:`OUTER`) is never taken after a
process's own (:data:`INNER`): text inside a message (``RuntimeError: [rank3]: ...``, ``[rank0]:12:
loss``) never names a writer.  A JSON record is unwrapped once (its text is not unwrapped again), and
only when it parses within the bounded parser's depth (:mod:`conformance.common.bounded_parse`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from conformance.common.bounded_parse import NotParsed, json_value
from conformance.diagnose.line_forms import clock_seconds, line_time

OUTER, INNER, EITHER = "outer", "inner", "either"  # a launcher's or collector's prefix; the process's own; either
MAX_PREFIXES = 24  # taken off one line at most (every pattern takes at least one character)


@dataclass(frozen=True)
class Who:
    """The process a line came from, as far as the logs say: any of these may be unknown."""

    rank: int | None = None
    local_rank: int | None = None
    task: int | None = None  # srun's task id (a node's torchrun when one runs per node)
    host: str | None = None
    pid: int | None = None

    def merged(self, other: Who) -> Who:
        """Who this is, completed with what ``other`` knows and this one does not."""
        return Who(
            self.rank if self.rank is not None else other.rank,
            self.local_rank if self.local_rank is not None else other.local_rank,
            self.task if self.task is not None else other.task,
            self.host if self.host is not None else other.host,
            self.pid if self.pid is not None else other.pid,
        )


@dataclass(frozen=True)
class ParsedLine:
    """One line, its prefixes taken off: the text, who wrote it, when (seconds into the year), at what level."""

    text: str
    who: Who
    time: float | None = None
    level: str | None = None  # debug, info, warning, error, fatal; None where no prefix says
    via: tuple[str, ...] = field(default=())  # the launchers and loggers whose prefixes it carried, outermost first


@dataclass(frozen=True)
class WriterPrefix:
    """One shape of prefix, and the layer that writes it.

    Its pattern's named groups say the writer (``rank``, ``local_rank``, ``task``, ``host``, ``pid``), the time
    (``mon`` or ``mname``, ``day``, ``clock``) and the level (``level``).
    """

    name: str
    pattern: re.Pattern[str]  # matched at the start of what is left of the line
    layer: str = OUTER


WHO_FIELDS = ("rank", "local_rank", "task", "host", "pid")
_MNAME = r"(?P<mname>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_CLOCK = r"(?P<clock>\d\d:\d\d:\d\d(?:[.,]\d{1,9})?)"
_ISO = r"\d{4}-(?P<mon>\d\d)-(?P<day>\d\d)[ T_]" + _CLOCK + r"(?:Z|[+-]\d\d:?\d\d)?"
_LEVEL = r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)"
_LEVEL_WORDS = r"(?:DEBUG|INFO|WARN|WARNING|ERROR|CRITICAL|FATAL)\b"


def _p(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


WRITER_PREFIXES: tuple[WriterPrefix, ...] = (
    # Kubernetes' CRI log files (/var/log/pods/..., kubelet pkg/kubelet/kuberuntime/logs/logs.go): "<RFC 3339 time>
    # <stream> <P|F> <text>", e.g. "2016-10-06T00:17:09.669794202Z stdout F log content".
    WriterPrefix("cri", _p(_ISO + r" (?:stdout|stderr) [FP] ")),
    # syslog as journalctl's default "short" output and rsyslog write it (RFC 3164): "Nov 28 15:44:22 node1 kernel: ",
    # "Nov 28 15:44:22 node1 python[1234]: "; journalctl -o short-iso: "2026-11-28T15:44:22+0000 node1 kernel: ".
    WriterPrefix(
        "syslog",
        _p(
            _MNAME + r" (?P<day>[ \d]\d) " + _CLOCK + r" (?!" + _LEVEL_WORDS + r")(?P<host>[\w.-]{1,64}) "
            r"[\w./@-]{1,64}(?:\[(?P<pid>\d{1,10})\])?: "
        ),
    ),
    WriterPrefix(
        "syslog",
        _p(
            r"\d{4}-(?P<mon>\d\d)-(?P<day>\d\d)T" + _CLOCK + r"(?:Z|[+-]\d\d:?\d\d) (?!" + _LEVEL_WORDS + r")"
            r"(?P<host>[\w.-]{1,64}) [\w./@-]{1,64}(?:\[(?P<pid>\d{1,10})\])?: "
        ),
    ),
    # ctime(3)'s "Sat Nov 28 15:44:22 2026": dmesg -T ("[Sat Nov 28 15:44:22 2026] "), Open MPI's --timestamp-output
    # (orte/mca/iof/base/iof_base_output.c, v4.1), PMIx's ("[%s]", openpmix src/common/pmix_iof.c), Horovod's
    # --prefix-output-with-timestamp (horovod/runner/common/util/safe_shell_exec.py, time.asctime()).
    WriterPrefix(
        "ctime",
        _p(r"\[?(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) " + _MNAME + r" (?P<day>[ \d]\d) " + _CLOCK + r" \d{4}\]? ?"),
        EITHER,
    ),
    # The kernel's printk time in dmesg: "[12345.678901] " (seconds since boot: no clock to order by).
    WriterPrefix("dmesg", _p(r"\[ {0,8}\d{1,8}\.\d{6}\] ")),
    # DeepSpeed's logger (deepspeed/utils/logging.py): "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:
    # %(funcName)s] ", e.g. "[2024-01-01 12:00:00,123] [ERROR] [launch.py:325:sigkill_handler] ".
    WriterPrefix(
        "deepspeed-log", _p(r"\[" + _ISO + r"\] \[" + _LEVEL + r"\] \[[\w.<>-]{1,120}:\d{1,6}:[\w<>]{1,80}\] "), INNER
    ),
    # torch 2.0-2.1's logging (torch/_logging): "[2023-10-19 08:25:21,316]
    # torch.distributed.elastic.multiprocessing.api: [ERROR] ".
    WriterPrefix("torch-log", _p(r"\[" + _ISO + r"\] [\w.]{1,160}: \[" + _LEVEL + r"\] "), INNER),
    # Ray's C++ log format (src/ray/util/logging.cc, "[%Y-%m-%d %H:%M:%S,%e %L %P %t] "): "[2023-12-17 07:01:10,094 E
    # 64995 64995] " -- time, level letter, pid, thread.
    WriterPrefix("ray-cpp", _p(r"\[" + _ISO + r" (?P<level>[DIWEFC]) (?P<pid>\d{1,10}) \d{1,10}\] "), INNER),
    # A logging library's timestamp before the line ("2024-04-29 06:01:12.977 ", "[2024-04-29 06:01:12,977] ",
    # "2024-04-29T06:01:12.977Z ", "[2026-11-28 15:44:22] "): formatting.
    WriterPrefix("timestamp", _p(r"\[?" + _ISO + r"\]? "), EITHER),
    # torch's C++ logs (c10/util/logging_is_not_google_glog.h, MessageLogger): "[W1128 15:44:22.918140540
    # ProcessGroupNCCL.cpp:1234] " (torch >= 2.4), "[W socket.cpp:663] " (earlier releases): level letter, time, file.
    WriterPrefix(
        "c10",
        _p(
            r"\[(?P<level>[IWEF])(?:(?P<mon>\d\d)(?P<day>\d\d) " + _CLOCK + r")?(?: \d{1,10})? ?"
            r"[^\s\]]{1,200}:\d{1,6}\] ?"
        ),
        INNER,
    ),
    # glog's own format (google/glog src/logging.cc: "I1128 15:44:22.918140  1234 file.cc:123] ") and torch's Python
    # logs in torch >= 2.2 (torch/_logging/_internal.py TorchLogsFormatter: "W1128 15:44:22.918000 1234
    # torch/distributed/elastic/multiprocessing/api.py:897] ", then a trace id "[0/0]" where there is one).
    WriterPrefix(
        "glog",
        _p(
            r"(?P<level>[IWEF])(?P<mon>\d\d)(?P<day>\d\d) " + _CLOCK + r" +\d{1,10} [^\s\]]{1,200}:\d{1,6}\]"
            r"(?: \[[^\]\s]{1,60}\])* ?"
        ),
        INNER,
    ),
    # torch's own distributed logging, torch >= 2.2: "[rank3]:" before every line a rank writes to stderr
    # (torch/_logging/_internal.py rankprefix, and c10d's C++ logs: "[rank3]:[W1128 ...] ").
    WriterPrefix("torch", _p(r"\[rank(?P<rank>\d{1,7})\]:\s?"), INNER),
    # torchrun --tee / --log-dir: "[default3]:" -- the role and the local rank
    # (torch/distributed/elastic/multiprocessing/tail_log.py: header = f"[{self._name}{local_rank}]:").
    WriterPrefix("torchrun", _p(r"\[(?!rank\d)[A-Za-z_]{1,40}?(?P<local_rank>\d{1,5})\]:\s?")),
    # torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (torch/distributed/run.py; its documented example for the
    # global rank, elastic/agent/server/local_elastic_agent.py: "[${rank}]:"): "[3]:text".  torchrun's own summary
    # block opens with "[0]:" alone on its line, which this never takes (text must follow).
    WriterPrefix("torchrun", _p(r"\[(?P<rank>\d{1,7})\]:(?=\s?\S)\s?")),
    # Open MPI's mpirun --tag-output: "[1,3]<stderr>:" (orte/mca/iof/base/iof_base_output.c, v4.1: "[%s,%s]<%s>:");
    # Open MPI 5 / PRRTE through PMIx (openpmix src/common/pmix_iof.c): "[1,3]<stdout>: ", --output tag-detailed
    # "[1,3][node1:1234]<stdout>: ", tag-fullname "[prterun-node1-1234@1,3]<stdout>: ", --output rank "[3]<stdout>: ";
    # Horovod's gloo launcher (horovod/runner/common/util/safe_shell_exec.py: "[{rank}]<{prefix}>:").
    WriterPrefix(
        "mpirun",
        _p(
            r"\[(?:[^\],\[\s]{1,120},)?(?P<rank>\d{1,7})\](?:\[(?P<host>[^\]:\s]{1,64}):(?:(?P<pid>\d{1,10})|[a-z]{1,10})\])?"
            r"<std(?:out|err|diag)>:\s?"
        ),
    ),
    # Open MPI's --xml output (iof_base_output.c: "<%s rank=\"%s\">"), its closing tag left at the end of the text.
    WriterPrefix("mpirun", _p(r"<std(?:out|err|diag) rank=\"(?P<rank>\d{1,7})\">")),
    # SLURM's srun --label: "3: ", right-aligned to the widest task id; a heterogeneous job's "P1  3: "
    # (SchedMD/slurm src/common/write_labelled_message.c _build_label: "%*d: ", "P%u %*d: ").
    WriterPrefix("srun", _p(r"(?:P\d{1,5} )?\s{0,6}(?P<task>\d{1,7}): ")),
    # Ray's log monitor before every line of a worker: "(RayWorkerWrapper pid=2789, ip=10.0.0.2) ", "(pid=2789) "
    # (ray/_private/worker.py print_worker_logs); vLLM's own workers: "(VllmWorkerProcess pid=8732) ",
    # "(EngineCore_DP0 pid=511) " (vllm/executor/multiproc_worker_utils.py, v1/engine/core.py).
    WriterPrefix(
        "ray",
        _p(r"\((?:[A-Za-z_][\w.:-]{0,80} )?pid=(?P<pid>\d{1,10})(?:, ip=(?P<host>[0-9A-Fa-f.:]{2,45}))?\)\s?"),
    ),
    # ... and before its own components' lines: "(raylet) ", "(raylet, ip=10.0.0.2) ", "(autoscaler +1m2s) ".
    WriterPrefix(
        "ray",
        _p(r"\((?:raylet|gcs_server|autoscaler(?: \+[\dhms]{1,12})?)(?:, ip=(?P<host>[0-9A-Fa-f.:]{2,45}))?\)\s?"),
    ),
    # Lightning's rank_prefixed_message: "[rank: 1] " (lightning/fabric/utilities/rank_zero.py).
    WriterPrefix("lightning", _p(r"\[rank: (?P<rank>\d{1,7})\]\s?"), INNER),
    # DeepSpeed's log_dist: "[Rank 0] " (deepspeed/utils/logging.py).
    WriterPrefix("deepspeed", _p(r"\[Rank (?P<rank>\d{1,7})\]\s?"), INNER),
    # vLLM's log format before each line it logs, a traceback's lines included: "ERROR 08-27 05:12:18
    # worker_base.py:382] " (vllm/logger.py: "%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s",
    # datefmt "%m-%d %H:%M:%S").
    WriterPrefix(
        "vllm",
        _p(
            r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<mon>\d\d)-(?P<day>\d\d) "
            + _CLOCK
            + r" [\w.-]{1,80}:\d{1,6}\] "
        ),
        INNER,
    ),
    # Python's logging.basicConfig() default (logging.BASIC_FORMAT "%(levelname)s:%(name)s:%(message)s"):
    # "WARNING:torch.distributed.run:", "ERROR:torch.distributed.elastic.multiprocessing.api:" (torch <= 1.13).
    WriterPrefix("logging", _p(r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]{1,160}:"), INNER),
    # A workflow tool's "[177/train/578 (pid 28936)] " (Metaflow's "[<task> (pid <pid>)]"), a run's UUID
    # ("[09c561ee-a44c-4795-967c-7183a83b3160] ").
    WriterPrefix("task", _p(r"\[[\w/.-]{1,80} \(pid (?P<pid>\d{1,10})\)\] ")),
    WriterPrefix("uuid", _p(r"\[[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\] ")),
    # pdsh, DeepSpeed's multi-node runner (deepspeed/launcher/multinode_runner.py PDSHRunner), prefixes every line with
    # the host: "worker-1: " (pdsh's "%s: ").  Only a lower-case name with a digit in it is taken for a host, so
    # "RuntimeError: " or "INFO: " never is.
    WriterPrefix("pdsh", _p(r"(?P<host>[a-z][a-z0-9_.-]{0,62}[0-9][a-z0-9_.-]{0,62}): (?=\S)")),
)

# Terminal colours a launcher puts around its prefixes (Ray: "\x1b[36m(RayWorkerWrapper pid=7)\x1b[0m"), with their
# ESC or without it (lost when a log is pasted into an issue): formatting, not text.
_COLOURS = re.compile(r"\x1b?\[[0-9;]{1,12}m")
# Ray's de-duplication suffix (ray/_private/ray_logging.py): " [repeated 6x across cluster]".
_REPEATED = re.compile(r" \[repeated \d+x across cluster\]$")
_XML_END = re.compile(r"</std(?:out|err|diag)>$")
_LEADING = re.compile(r"[ \t]{1,8}")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_LEVELS = {
    "D": "debug", "DEBUG": "debug", "I": "info", "INFO": "info", "W": "warning", "WARN": "warning",
    "WARNING": "warning", "E": "error", "ERROR": "error", "F": "fatal", "C": "fatal", "FATAL": "fatal",
    "CRITICAL": "fatal",
}  # fmt: skip


def _time_of(groups: dict[str, str | None]) -> float | None:
    clock, day = groups.get("clock"), groups.get("day")
    if clock is None or day is None:
        return None
    name = groups.get("mname")
    month = int(groups["mon"] or 0) if groups.get("mon") else (_MONTHS.index(name) + 1 if name else 0)
    if not month:
        return None
    h, m, s = clock.split(":")
    return clock_seconds(month, int(day.strip()), int(h), int(m), float(s.replace(",", ".")))


@dataclass
class _Taken:
    """What the prefixes taken off so far said."""

    found: dict[str, int | str] = field(default_factory=dict)
    time: float | None = None
    level: str | None = None
    via: list[str] = field(default_factory=list)
    inner: bool = False  # a process's own prefix was taken: no launcher's prefix may follow


def _take(prefix: WriterPrefix, m: re.Match[str], taken: _Taken) -> None:
    groups = m.groupdict()
    for name in WHO_FIELDS:
        value = groups.get(name)
        if value is not None:
            taken.found[name] = value if name == "host" else int(value)
    if taken.time is None:
        taken.time = _time_of(groups)
    if groups.get("level"):
        taken.level = _LEVELS.get(str(groups["level"]).upper(), taken.level)
    taken.inner = taken.inner or prefix.layer == INNER
    taken.via.append(prefix.name)


def _contradicts(m: re.Match[str], taken: _Taken) -> bool:
    """Whether a prefix names another writer than those taken off already did (then it is text, not a prefix)."""
    for name, value in m.groupdict().items():
        if value is None or name not in WHO_FIELDS or name not in taken.found:
            continue
        if taken.found[name] != (value if name == "host" else int(value)):
            return True
    return False


# Any prefix at all, in one search (the groups unnamed: names repeat between prefixes): most lines of a big log
# (NCCL's INFO, training steps) have none, and then one match in C answers instead of one per prefix in Python.
_ANY_PREFIX = re.compile(
    "|".join(f"(?:{re.sub(r'[(][?]P<[a-z_]+>', '(?:', p.pattern.pattern)})" for p in WRITER_PREFIXES),
    WRITER_PREFIXES[0].pattern.flags,
)


def _next_prefix(line: str, at: int, taken: _Taken) -> tuple[WriterPrefix, re.Match[str]] | None:
    if _ANY_PREFIX.match(line, at) is None:
        return None
    for prefix in WRITER_PREFIXES:
        if taken.inner and prefix.layer == OUTER:
            continue
        m = prefix.pattern.match(line, at)
        if m is None or m.end() == at:
            continue
        if _contradicts(m, taken):
            continue
        return prefix, m
    return None


def _prefixes_off(line: str, who: Who, taken: _Taken) -> ParsedLine:
    """The line without its leading prefixes, with what they said (``taken`` may hold a JSON record's already)."""
    if "m" in line and "[" in line:
        line = _COLOURS.sub("", line)
    if line.endswith("cluster]"):
        line = _REPEATED.sub("", line)
    at = 0
    for _ in range(MAX_PREFIXES):
        space = _LEADING.match(line, at)
        start = space.end() if space else at
        found = _next_prefix(line, start, taken)
        if found is None:
            break
        prefix, m = found
        _take(prefix, m, taken)
        at = m.end()
    text = line[at:]
    if text.endswith(">") and "mpirun" in taken.via:
        text = _XML_END.sub("", text)
    writer = replace(who, **taken.found) if taken.found else who  # type: ignore[arg-type]
    return ParsedLine(text, writer, taken.time, taken.level, tuple(taken.via))


# --------------------------------------------------------------------------------------------
# JSON records: one line of a log collector's or a structured logger's output
# --------------------------------------------------------------------------------------------

# The keys that hold the text, where the writer and the time are, in the records these write: Docker's json-file
# driver ({"log": "...\n", "stream": "stderr", "time": "..."}), fluent-bit's Kubernetes filter (adds "kubernetes":
# {"host": <node>, "pod_name": ...}), Ray's JSONFormatter (ray/_private/ray_logging/formatters.py: "asctime",
# "levelname", "message", "exc_text"), journalctl -o json (systemd.journal-fields(7): "MESSAGE", "_HOSTNAME", "_PID",
# "PRIORITY"), and loggers' common "msg"/"level"/"timestamp".
TEXT_KEYS = ("log", "message", "msg", "MESSAGE")
MORE_TEXT_KEYS = ("exc_text",)  # Ray: the traceback of a logged exception, after the message
TIME_KEYS = ("time", "asctime", "timestamp", "@timestamp")
LEVEL_KEYS = ("levelname", "level", "severity")
HOST_KEYS = ("hostname", "host", "_HOSTNAME")
PID_KEYS = ("pid", "_PID")
# journald's PRIORITY (syslog's severities, RFC 5424): 0-2 fatal, 3 error, 4 warning, 5-6 info, 7 debug.
_PRIORITIES = ("fatal", "fatal", "fatal", "error", "warning", "info", "info", "debug")


def _first(record: dict[str, object], keys: tuple[str, ...]) -> object | None:
    return next((record[key] for key in keys if record.get(key) not in (None, "")), None)


def _record_time(value: object) -> float | None:
    if isinstance(value, str):
        return line_time(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1 << 35:  # seconds since 1970
        when = datetime.fromtimestamp(value, tz=timezone.utc)
        return clock_seconds(when.month, when.day, when.hour, when.minute, when.second + when.microsecond / 1e6)
    return None


def _record_level(record: dict[str, object]) -> str | None:
    level = _first(record, LEVEL_KEYS)
    if isinstance(level, str):
        return _LEVELS.get(level.upper())
    priority = record.get("PRIORITY")
    if isinstance(priority, str) and priority.isdigit() and int(priority) < len(_PRIORITIES):
        return _PRIORITIES[int(priority)]
    return None


def _record_who(record: dict[str, object]) -> Who:
    kubernetes = record.get("kubernetes")
    host = kubernetes.get("host") if isinstance(kubernetes, dict) else None
    host = host if isinstance(host, str) else _first(record, HOST_KEYS)
    pid = _first(record, PID_KEYS)
    pid_number = int(pid) if isinstance(pid, int) or (isinstance(pid, str) and pid.isdigit()) else None
    return Who(host=host[:64] if isinstance(host, str) else None, pid=pid_number)


@dataclass(frozen=True)
class JsonRecord:
    """One JSON log record: its text's lines, its writer, time and level."""

    lines: list[str]
    who: Who
    time: float | None
    level: str | None


def json_record(line: str) -> JsonRecord | None:
    """A JSON log record's lines of text, writer, time and level; None for a line that is no such record."""
    stripped = line.strip()
    if not (stripped.startswith("{") and stripped.endswith("}") and '"' in stripped):
        return None
    try:
        record = json_value(stripped)
    except NotParsed:
        return None
    if not isinstance(record, dict):
        return None
    text = _first(record, TEXT_KEYS)
    if not isinstance(text, str):
        return None
    more = _first(record, MORE_TEXT_KEYS)
    lines = text.rstrip("\n").split("\n") + (more.rstrip("\n").split("\n") if isinstance(more, str) else [])
    return JsonRecord(lines, _record_who(record), _record_time(_first(record, TIME_KEYS)), _record_level(record))


# --------------------------------------------------------------------------------------------
# The one entry point
# --------------------------------------------------------------------------------------------


def segments(text: str) -> list[str]:
    """A line's parts between carriage returns, each read as a line of its own (one number for them all).

    A progress bar rewrites its line with ``\\r`` and the next message may follow on the same line; a forged
    "answer" may hide behind one.  Either way every part is read, none hides another.
    """
    if "\r" not in text:
        return [text]
    return [part for part in text.split("\r") if part.strip()] or [text.replace("\r", " ")]


def parse_line(text: str, who: Who | None = None) -> list[ParsedLine]:
    """Every line one line of a log holds, each with its writer (``who``: what the file's path says), time, level.

    One, mostly; the parts between carriage returns, and the lines of a JSON record's text, each one of their own.
    """
    who = who or Who()
    parsed: list[ParsedLine] = []
    for segment in segments(text):
        record = json_record(segment) if segment.lstrip().startswith("{") else None
        if record is None:
            parsed.append(_with_time(_prefixes_off(segment, who, _Taken()), segment))
            continue
        for inner in record.lines:
            taken = _Taken(_who_fields(record.who), record.time, record.level, ["json"])
            parsed.append(_with_time(_prefixes_off(inner, who, taken), inner))
    return parsed


def _who_fields(who: Who) -> dict[str, int | str]:
    return {name: value for name in WHO_FIELDS if (value := getattr(who, name)) is not None}


def _with_time(parsed: ParsedLine, original: str) -> ParsedLine:
    """A line whose prefixes gave no time: the first timestamp in the original line, if any (``line_forms``)."""
    if parsed.time is not None:
        return parsed
    found = line_time(original)
    return parsed if found is None else replace(parsed, time=found)


def strip_prefixes(line: str, who: Who) -> tuple[str, Who]:
    """The line without its leading writer prefixes (nor colours, nor Ray's repeat count), and ``who`` with them."""
    parsed = _prefixes_off(line, who, _Taken())
    return parsed.text, parsed.who
