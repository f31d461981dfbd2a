"""The torch catalogue ``conformance diagnose`` ships, built from the pinned raw input: pure Python, no wheels.

    python tools/torch_catalogue_build.py            writes conformance/diagnose/catalogues/torch_messages.json
    python tools/torch_catalogue_build.py --check    exits 1 when what it would write differs

Reads ``tools/catalogue_inputs/torch_messages_raw.json`` (``tools/torch_catalogue_extract.py``) and gives every line
of every message format (a format is split at its newlines: each line is a log line of its own) that has
:data:`MIN_LITERAL` characters of literal text or more:

* a regex, searched anywhere in a log line (torch's messages come after a logger's or a traceback's prefix): the
  literal text escaped, each placeholder a pattern of what it prints, digits where the expression is a rank, a
  sequence number, a count or an exit code, named after the expression (``(?P<seq>\\d+)``); a text placeholder
  at the line's end takes the rest of the line, one at its start is left out;
* a class, a role and a fix from the ONE table of ``tools/torch_catalogue_rules.py``.

Prints the entries per class; the output is sorted and byte-identical on a rerun (``tests/test_torch_catalogue.py``
checks the committed catalogue is this script's output).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from catalogue_files import write_or_check  # noqa: E402 (tools/ is the script's folder)
from torch_catalogue_rules import CLASSES, rule_for  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RAW = REPO / "tools" / "catalogue_inputs" / "torch_messages_raw.json"
OUT = REPO / "conformance" / "diagnose" / "catalogues" / "torch_messages.json"
MIN_LITERAL = 12  # a line with less literal text ("${boarder}", "[%s]:") would match too much: left out

_PRINTF = re.compile(r"%(?:\((?P<name>\w+)\))?[-+ #0]*(?:\d+|\*)?(?:\.\d+)?[hlLqjzt]*(?P<conv>[diouxXeEfFgGcrsa%])")
_FMT = re.compile(r"\{\{|\}\}|\{(?P<name>[A-Za-z_]\w*|\d*)(?:![rsa])?(?::[^{}]*)?\}")
_TEMPLATE = re.compile(r"\$(?:\$|\{(?P<braced>[A-Za-z_]\w*)\}|(?P<name>[A-Za-z_]\w*))")
_NUMERIC_NAME = re.compile(
    r"(?i)(?:rank|seq|pid|exitcode|numelin|numelout|numel|size|count|idx|index|port|attempts|restarts|round|insec|"
    r"world_size|nnodes|nodes|sec|seconds|ms)$"
)
NUMBER = r"-?\d+"
FLOAT = r"-?[0-9.]+(?:e[-+]?\d+)?"


@dataclass(frozen=True)
class Hole:
    """A placeholder: its group name ('' for none) and whether it prints a number."""

    name: str
    numeric: bool


Part = str | Hole


def _name_of(expr: str) -> str:
    words = re.findall(r"[A-Za-z_]\w*", expr.replace("count()", "count"))
    words = [w for w in words if w not in ("self", "std", "to_string", "c10", "str", "len", "this", "size")] or words
    if len(words) > 1 and words[-1] in ("count", "what", "load", "dump", "value"):
        words = words[:-1]
    return re.sub(r"[^a-z0-9]", "", words[-1].lower()) if words else ""


def _hole(expr: str) -> Hole:
    name = _name_of(expr)
    return Hole(name, bool(_NUMERIC_NAME.search(name)) or expr.endswith(("size()", ".count()")))


def _split_literal(text: str, style: str) -> list[Part]:
    """A literal piece's text and the conversions its style puts in it."""
    pattern = {"printf": _PRINTF, "fmt": _FMT, "template": _TEMPLATE}.get(style)
    if pattern is None:
        return [text]
    parts: list[Part] = []
    at = 0
    for m in pattern.finditer(text):
        parts.append(text[at : m.start()])
        at = m.end()
        token = m.group()
        if token in ("%%", "{{", "}}", "$$"):
            parts.append(token[0])
            continue
        name = (m.groupdict().get("name") or m.groupdict().get("braced") or "").lower()
        numeric = style == "printf" and m["conv"] in "diouxX" or bool(name and _NUMERIC_NAME.search(name))
        parts.append(Hole("" if name.isdigit() else name, numeric))
    parts.append(text[at:])
    return [p for p in parts if p != ""]


def parts_of(record: dict[str, object]) -> list[Part]:
    parts: list[Part] = []
    for piece in record["pieces"]:  # type: ignore[attr-defined]
        parts += _split_literal(piece, str(record["style"])) if isinstance(piece, str) else [_hole(piece["expr"])]
    return parts


def lines_of(parts: list[Part]) -> list[list[Part]]:
    """The format cut at its newlines: one list of parts per log line."""
    lines: list[list[Part]] = [[]]
    for part in parts:
        if isinstance(part, Hole):
            lines[-1].append(part)
            continue
        for i, chunk in enumerate(part.split("\n")):
            if i:
                lines.append([])
            if chunk:
                lines[-1].append(chunk)
    return lines


def _trimmed(line: list[Part]) -> list[Part]:
    """The line without the whitespace around it and without text placeholders at its start."""
    while line and (
        isinstance(line[0], Hole) and not line[0].numeric or isinstance(line[0], str) and not line[0].strip()
    ):
        line = line[1:]
    if line and isinstance(line[0], str):
        line = [line[0].lstrip(), *line[1:]]
    if line and isinstance(line[-1], str):
        line = [*line[:-1], line[-1].rstrip()]
    return [p for p in line if p != ""]


@dataclass(frozen=True)
class Pattern:
    regex: str
    literal: int
    needle: str  # the longest literal piece of the required head: a line without it cannot match
    text: str  # the line with its placeholders written {}


def _part_regex(part: Part, last: bool, used: Counter[str]) -> str:
    if isinstance(part, str):
        return re.escape(part)
    body = NUMBER if part.numeric else (".*" if last else ".*?")
    used[part.name] += 1
    name = part.name if used[part.name] == 1 else f"{part.name}{used[part.name]}"
    return f"(?P<{name}>{body})" if re.fullmatch(r"[a-z]\w*", name or "") else f"({body})"


def _head(line: list[Part]) -> int:
    """How many parts a line must show: up to the literal piece that brings :data:`MIN_LITERAL` characters."""
    seen = 0
    for i, part in enumerate(line):
        seen += len(part) if isinstance(part, str) else 0
        if seen >= MIN_LITERAL:
            return i + 1
    return len(line)


def pattern_of(line: list[Part]) -> Pattern:
    """The line's regex: its head required, each part after it optional in turn.

    A long line that a log cut or wrapped still matches as far as it goes; every placeholder is a group, so the
    literal text matched can be counted.
    """
    used: Counter[str] = Counter()
    regexes = [_part_regex(part, i == len(line) - 1, used) for i, part in enumerate(line)]
    head = _head(line)
    units: list[str] = []  # a placeholder with the literal after it is one unit: its lazy ".*?" needs that end
    for i in range(head, len(line)):
        if units and isinstance(line[i], str) and isinstance(line[i - 1], Hole):
            units[-1] += regexes[i]
        else:
            units.append(regexes[i])
    tail = "".join(f"(?:{u}" for u in units) + ")?" * len(units)
    literals = [p for p in line if isinstance(p, str)]
    needle = max((p for p in line[:head] if isinstance(p, str)), key=len, default="")
    text = "".join(p if isinstance(p, str) else "{}" for p in line)
    return Pattern("".join(regexes[:head]) + tail, sum(map(len, literals)), needle, text)


def _provenance(record: dict[str, object], source: str) -> dict[str, object]:
    keep = ("file", "line", "function", "first_version", "last_version", "missing_between", "read")
    return {"source": source, **{k: record[k] for k in keep if k in record}}


def entries_of(record: dict[str, object], source: str) -> list[dict[str, object]]:
    """The catalogue's entries for one format: one per line with enough literal text."""
    lines = lines_of(parts_of(record))
    out = []
    for index, line in enumerate(lines):
        pattern = pattern_of(_trimmed(line))
        if pattern.literal < MIN_LITERAL:
            continue
        re.compile(pattern.regex)  # every regex compiles, here rather than in a user's run
        rule = rule_for(str(record["file"]), str(record["kind"]), pattern.text)
        out.append({
            "text": pattern.text, "regex": pattern.regex, "literal": pattern.literal, "needle": pattern.needle,
            "line_of_format": f"{index + 1}/{len(lines)}", "kind": record["kind"], "class": rule.cls,
            "role": rule.role, "fix": rule.fix, "rule": rule.name,
            "refine": [{"regex": r, "class": c, "role": role, "fix": f} for r, c, role, f in rule.refine],
            "provenance": _provenance(record, source),
        })  # fmt: skip
    return out


def entries(raw: dict[str, object]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for record in raw["records"]:  # type: ignore[attr-defined]
        source = "header" if str(record["file"]).endswith((".h", ".hpp")) else "python"
        out += entries_of(record, source)
    for record in raw["cpp_records"]:  # type: ignore[attr-defined]
        if record["first_version"]:  # in no release's libraries: a transcription no release printed
            out += entries_of(record, "cpp")
    return _deduplicated(out)


def _deduplicated(found: list[dict[str, object]]) -> list[dict[str, object]]:
    """One entry per regex: the one of the latest release (then of the first source), its provenance kept."""
    best: dict[str, dict[str, object]] = {}
    for entry in found:
        key = str(entry["regex"])
        if key not in best or _recency(entry) > _recency(best[key]):
            best[key] = entry
    return sorted(best.values(), key=lambda e: (str(e["text"]), str(e["regex"])))


def _recency(entry: dict[str, object]) -> tuple[int, str, str]:
    from torch_catalogue_extract import VERSIONS  # the order of releases, nothing read

    p = entry["provenance"]
    assert isinstance(p, dict)
    last = str(p["last_version"])
    return (VERSIONS.index(last) if last in VERSIONS else -1, str(p["file"]), str(p.get("line", "")))


def built() -> dict[Path, str]:
    """What the build writes: each file's text."""
    raw = json.loads(RAW.read_text())
    source = {k: raw["source"][k] for k in ("wheels", "python_files", "headers", "libraries", "cpp_read")}
    catalogue = {"source": {**source, "builder": "tools/torch_catalogue_build.py"}, "classes": CLASSES,
                 "entries": entries(raw)}  # fmt: skip
    return {OUT: json.dumps(catalogue, indent=1, sort_keys=True, ensure_ascii=True) + "\n"}


def counts(texts: dict[Path, str]) -> str:
    """Entries per class, one line each, as the build prints them."""
    found = json.loads(texts[OUT])["entries"]
    per_class = Counter(e["class"] for e in found)
    per_source = Counter(e["provenance"]["source"] for e in found)
    lines = [f"{len(found)} torch message lines ({', '.join(f'{n} {s}' for s, n in sorted(per_source.items()))}):"]
    lines += [f"  {cls:15} {n:4}  {CLASSES.get(cls, cls)}" for cls, n in sorted(per_class.items(), key=lambda c: -c[1])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = parser.parse_args(argv)
    texts = built()
    print(counts(texts))
    return write_or_check(texts, args.check)


if __name__ == "__main__":
    sys.exit(main())
