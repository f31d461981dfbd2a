"""Every NCCL ``WARN(...)`` format string and the ``ncclResult_t`` codes, read from NVIDIA/nccl's sources per release.

    python tools/nccl_catalogue_extract.py [--mirror DIR]     writes tools/catalogue_inputs/nccl_*_raw.json
    python tools/nccl_catalogue_extract.py --check            exits 1 when what it would write differs

The first stage of the NCCL catalogue (the second, ``tools/nccl_catalogue_build.py``, needs no mirror).  It
reads a bare mirror of https://github.com/NVIDIA/nccl (``git clone --mirror``; ``--mirror`` or
``$NCCL_MIRROR``) at each tag of :data:`TAGS`, with ``git ls-tree`` and ``git cat-file`` only: no checkout.

WARN calls: every C/C++ source and header under ``src/`` (the net, tuner, profiler, env and gin plugin
loaders included) is scanned with its comments and string and character literals skipped whole; each word
``WARN`` followed by ``(`` is a call (``#define WARN(...)`` itself, in ``src/include/debug.h``, is not), and
its first argument, read as C tokens (line continuations and comments as space) up to the first comma or
parenthesis at its own level, is the format.  A format of adjacent string literals is joined (C's translation
phase 6), the ``<inttypes.h>`` macros between them (``"%" PRIu64``) are written as glibc's x86_64 expansion,
and a parameter of the ``#define`` around the call (``"Call to " name " failed"``, ``#name "() failed: %s"``)
is written ``${name}``, for the build to match as a word.  Any other first argument (a variable, a wrapper
macro's ``fmt``) is not a literal: counted per tag and listed, never guessed.  The C that a Python generator
in ``src/`` writes at build time (``src/device/symmetric/generate.py``, 2.30) is read from its string constants.

ncclResult_t: the ``typedef enum { ... } ncclResult_t`` of ``src/nccl.h.in`` and the ``case`` and ``default``
strings of ``ncclGetErrorString`` (``src/init.cc``), per tag.

Output is sorted (keys, records) and written with ``\\n`` line ends, so a rerun on the same mirror is
byte-identical; ``tests/test_catalogues.py`` reruns it when the mirror is there.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from catalogue_files import write_or_check  # tools/ is the script's folder, and the tests put it on the path

REPO = Path(__file__).resolve().parent.parent
INPUTS = REPO / "tools" / "catalogue_inputs"
WARNINGS_RAW = INPUTS / "nccl_warnings_raw.json"
RESULTS_RAW = INPUTS / "nccl_results_raw.json"
DEFAULT_MIRROR = Path("/work/.mirror/NVIDIA+nccl/repo")
UPSTREAM = "https://github.com/NVIDIA/nccl"

# Every release tag from 2.18.3 (torch 2.1's NCCL) to 2.30.7, oldest first.
TAGS = (
    "v2.18.3-1", "v2.18.5-1", "v2.18.6-1", "v2.19.1-1", "v2.19.3-1", "v2.19.4-1", "v2.20.3-1", "v2.20.5-1",
    "v2.21.5-1", "v2.22.3-1", "v2.23.4-1", "v2.24.3-1", "v2.25.1-1", "v2.26.2-1", "v2.26.3-1", "v2.26.5-1",
    "v2.26.6-1", "v2.27.3-1", "v2.27.5-1", "v2.27.6-1", "v2.27.7-1", "v2.28.3-1", "v2.28.7-1", "v2.28.9-1",
    "v2.29.2-1", "v2.29.3-1", "v2.29.7-1", "v2.30.3-1", "v2.30.4-1", "v2.30.7-1",
)  # fmt: skip
SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp")
GENERATOR_SUFFIXES = (".py",)  # Python that writes C at build time

# glibc's <inttypes.h> on x86_64 and aarch64 (__PRI64_PREFIX "l"): what NCCL's release builds expand them to.
INTTYPES = {
    f"PRI{conversion}{bits}": ("l" if bits == 64 else "") + conversion
    for conversion in "diouxX"
    for bits in (8, 16, 32, 64)
}

# One C token at a time (of a WARN call's argument); a comment or a line continuation is whitespace (C translation
# phases 2 and 3).
_TOKEN = re.compile(
    r"""(?P<skip>\\\r?\n|//[^\n]*|/\*.*?\*/|[ \t\r\f\v]+)
      |(?P<nl>\n)
      |(?P<str>(?:u8|[uUL])?"(?:[^"\\\n]|\\.)*")
      |(?P<chr>(?:u8|[uUL])?'(?:[^'\\\n]|\\.)*')
      |(?P<id>[A-Za-z_]\w*)
      |(?P<num>\.?\d(?:[eEpP][+-]|[\w.])*)
      |(?P<punct>\#\#|.)""",
    re.VERBOSE | re.DOTALL,
)
_ESCAPE = re.compile(r"\\(?:x[0-9a-fA-F]+|[0-7]{1,3}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "e": "\x1b"}


@dataclass(frozen=True)
class Token:
    kind: str  # str, chr, id, num, punct
    text: str


def _unescape(m: re.Match[str]) -> str:
    body = m.group()[1:]
    if body[0] == "x":
        return chr(int(body[1:], 16))
    if body[0] in "01234567":
        return chr(int(body, 8))
    return _SIMPLE_ESCAPES.get(body, body)


def string_value(literal: str) -> str:
    """The characters of a C string literal (its prefix and quotes dropped, escapes decoded)."""
    return _ESCAPE.sub(_unescape, literal[literal.index('"') + 1 : -1])


@dataclass
class Call:
    """One WARN call: where it is and its format (None: not a literal; ``raw`` is then its text)."""

    path: str
    line: int
    format: str | None
    raw: str
    params: tuple[str, ...] = ()


# What a C file is made of, as far as finding WARN calls goes: comments and literals (skipped whole, so a "WARN(" in
# them is no call) and the word WARN; everything else (a literal's u8/L prefix too) is passed over by the regex engine,
# which can skip to the next of / " ' W without trying each alternative at each character.
_SCAN = re.compile(r"""//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|WARN\b""", re.DOTALL)
_IDENTIFIER_CHAR = re.compile(r"\w")
_CALL_OPENS = re.compile(r"(?:\s|\\\r?\n)*\(")
# A function-like #define at the start of a logical line (lines joined by backslash-newline), and its parameters.
_DEFINE = re.compile(r"[ \t]*#[ \t]*define[ \t]+\w+\((?P<params>[^)]*)\)")


def _first_argument(source: str, opening: int) -> list[Token]:
    """The tokens of the first argument of the call whose '(' is at ``opening``."""
    depth, out = 0, []
    for m in _TOKEN.finditer(source, opening + 1):
        kind, text = m.lastgroup or "punct", m.group()
        if kind in ("skip", "nl"):
            continue
        if kind == "punct" and text in "([{":
            depth += 1
        elif kind == "punct" and text in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif kind == "punct" and text == "," and depth == 0:
            break
        out.append(Token(kind, text))
    return out


def format_of(arg: list[Token], params: tuple[str, ...]) -> tuple[str | None, tuple[str, ...]]:
    """The format a first argument makes, and the #define parameters in it; None where it is not a literal."""
    pieces: list[str] = []
    used: list[str] = []
    literal, i = False, 0
    while i < len(arg):
        tok = arg[i]
        stringified = tok.text == "#" and i + 1 < len(arg) and arg[i + 1].text in params
        if tok.kind == "str":
            pieces.append(string_value(tok.text))
            literal = True
        elif tok.kind == "id" and tok.text in INTTYPES:
            pieces.append(INTTYPES[tok.text])
        elif tok.kind == "id" and tok.text in params or stringified:
            name = arg[i + 1].text if stringified else tok.text
            pieces.append("${" + name + "}")
            used.append(name)
            i += int(stringified)
        else:
            return None, ()
        i += 1
    return ("".join(pieces), tuple(used)) if literal else (None, ())


def _macro_params(source: str, at: int) -> tuple[str, ...]:
    """The parameters of the function-like #define whose logical line holds ``at`` (none outside a #define)."""
    start = source.rfind("\n", 0, at)
    while start > 0 and source.endswith(("\\", "\\\r"), 0, start):  # a continued line: its start is further back
        start = source.rfind("\n", 0, start)
    m = _DEFINE.match(source, start + 1)
    return tuple(re.findall(r"\w+", m["params"])) if m else ()


def warn_calls(path: str, source: str) -> list[Call]:
    """Every WARN call of one file (``#define WARN(...)`` itself is none)."""
    if "WARN" not in source:
        return []
    calls, line, counted = [], 1, 0
    for m in _SCAN.finditer(source):
        if m.group() != "WARN" or _IDENTIFIER_CHAR.match(source, max(0, m.start() - 1), m.start()):
            continue  # a comment, a literal, or the end of another identifier (NOWARN)
        opens = _CALL_OPENS.match(source, m.end())
        if opens is None or re.search(r"#[ \t]*define[ \t]+$", source[max(0, m.start() - 40) : m.start()]):
            continue
        line += source.count("\n", counted, m.start())
        counted = m.start()
        arg = _first_argument(source, opens.end() - 1)
        fmt, used = format_of(arg, _macro_params(source, m.start()))
        calls.append(Call(path, line, fmt, " ".join(t.text for t in arg), used))
    return calls


def generated_warn_calls(path: str, source: str) -> list[Call]:
    """The WARN calls of the C a Python generator in src/ writes (``src/device/symmetric/generate.py``, 2.30).

    Each plain string constant of the generator that holds ``WARN(`` is read as C, at the constant's line;
    an f-string's pieces are not whole C text and are left out.
    """
    if "WARN" not in source:
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    pieces = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in pieces:
            for call in warn_calls(path, node.value):
                calls.append(Call(path, node.lineno + call.line - 1, call.format, call.raw, call.params))
    return sorted(calls, key=lambda c: c.line)


# --------------------------------------------------------------------------------------------
# The mirror
# --------------------------------------------------------------------------------------------


class Mirror:
    """A bare clone of NVIDIA/nccl, read with git; each blob read once over all tags."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._blobs: dict[str, str] = {}
        self._cat = subprocess.Popen(
            ["git", "-C", str(path), "cat-file", "--batch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def close(self) -> None:
        assert self._cat.stdin is not None
        self._cat.stdin.close()
        self._cat.wait()

    def files(self, tag: str, under: str = "src", suffixes: tuple[str, ...] = SOURCE_SUFFIXES) -> list[tuple[str, str]]:
        """(path, blob id) of every file under ``under`` at ``tag`` whose name ends in one of ``suffixes``."""
        listing = subprocess.run(
            ["git", "-C", str(self.path), "ls-tree", "-r", "-z", tag, "--", under],
            capture_output=True, check=True,
        ).stdout.decode()  # fmt: skip
        out = []
        for entry in filter(None, listing.split("\0")):
            meta, path = entry.split("\t", 1)
            if meta.split()[1] == "blob" and path.endswith(suffixes):
                out.append((path, meta.split()[2]))
        return sorted(out)

    def blob(self, sha: str) -> str:
        if sha not in self._blobs:
            assert self._cat.stdin is not None and self._cat.stdout is not None
            self._cat.stdin.write(sha.encode() + b"\n")
            self._cat.stdin.flush()
            size = int(self._cat.stdout.readline().split()[2])
            data = self._cat.stdout.read(size + 1)[:size]
            self._blobs[sha] = data.decode("utf-8", errors="replace")
        return self._blobs[sha]

    def show(self, tag: str, path: str) -> str | None:
        found = [sha for p, sha in self.files(tag, path, ("",)) if p == path]
        return self.blob(found[0]) if found else None


# --------------------------------------------------------------------------------------------
# WARN formats over the tags
# --------------------------------------------------------------------------------------------


def _versions_record(versions: list[str]) -> dict[str, object]:
    """The tags a text is in, compactly: the first, the last, and those between them it is missing from."""
    order = [t for t in TAGS if t in versions]
    gaps = [t for t in TAGS[TAGS.index(order[0]) : TAGS.index(order[-1]) + 1] if t not in order]
    return {"first_version": order[0], "last_version": order[-1], "missing_between": gaps}


def _warning_records(per_tag: dict[str, list[Call]]) -> list[dict[str, object]]:
    seen: dict[tuple[str, tuple[str, ...]], dict[str, list[str]]] = {}
    for tag in TAGS:
        for call in per_tag[tag]:
            if call.format is not None:
                in_tags = seen.setdefault((call.format, call.params), {})
                in_tags.setdefault(tag, []).append(f"{call.path}:{call.line}")
    records = []
    for (fmt, params), by_tag in seen.items():
        versions = _versions_record(list(by_tag))
        sites = sorted(set(by_tag[str(versions["last_version"])]), key=_site_order)
        path, line = sites[0].rsplit(":", 1)
        records.append(
            {"format": fmt, "macro_params": sorted(set(params)), "file": path, "line": int(line), "sites": sites,
             **versions}
        )  # fmt: skip
    return sorted(records, key=lambda r: (str(r["format"]), str(r["macro_params"])))


def _site_order(site: str) -> tuple[str, int]:
    path, line = site.rsplit(":", 1)
    return path, int(line)


def _non_literal(per_tag: dict[str, list[Call]]) -> list[dict[str, object]]:
    seen: dict[tuple[str, str], set[str]] = {}
    last_line: dict[tuple[str, str], int] = {}
    for tag in TAGS:
        for call in per_tag[tag]:
            if call.format is None:
                seen.setdefault((call.path, call.raw), set()).add(tag)
                last_line[call.path, call.raw] = call.line
    records = [
        {"file": path, "line": last_line[path, raw], "argument": raw, **_versions_record(sorted(tags))}
        for (path, raw), tags in seen.items()
    ]
    return sorted(records, key=lambda r: (str(r["file"]), str(r["argument"])))


def warnings_raw(mirror: Mirror) -> dict[str, object]:
    per_tag: dict[str, list[Call]] = {}
    by_blob: dict[tuple[str, str], list[Call]] = {}  # a file unchanged between tags is tokenised once
    for tag in TAGS:
        per_tag[tag] = []
        for path, sha in mirror.files(tag, suffixes=SOURCE_SUFFIXES + GENERATOR_SUFFIXES):
            if (path, sha) not in by_blob:
                read = generated_warn_calls if path.endswith(GENERATOR_SUFFIXES) else warn_calls
                by_blob[path, sha] = read(path, mirror.blob(sha))
            per_tag[tag].extend(by_blob[path, sha])
    counts = {
        tag: {"calls": len(calls), "literal": sum(c.format is not None for c in calls),
              "non_literal": sum(c.format is None for c in calls)}
        for tag, calls in per_tag.items()
    }  # fmt: skip
    return {
        "source": _source(mirror, "every WARN( call in src/**/*{" + ",".join(SOURCE_SUFFIXES) + "}"),
        "counts_per_version": counts,
        "records": _warning_records(per_tag),
        "non_literal": _non_literal(per_tag),
    }


def _source(mirror: Mirror, what: str) -> dict[str, object]:
    commits = {
        tag: subprocess.run(
            ["git", "-C", str(mirror.path), "rev-parse", f"{tag}^{{commit}}"], capture_output=True, text=True,
            check=True,
        ).stdout.strip()
        for tag in TAGS
    }  # fmt: skip
    return {"repository": UPSTREAM, "tags": list(TAGS), "commits": commits, "what": what,
            "extractor": "tools/nccl_catalogue_extract.py"}  # fmt: skip


# --------------------------------------------------------------------------------------------
# ncclResult_t and ncclGetErrorString
# --------------------------------------------------------------------------------------------

_ENUM = re.compile(r"typedef\s+enum\s*\{(?P<body>[^}]*)\}\s*ncclResult_t\s*;")
_ENUMERATOR = re.compile(r"(?P<name>\w+)\s*=\s*(?P<value>\d+)")
_GET_ERROR_STRING = re.compile(r"const\s+char\s*\*\s*ncclGetErrorString\s*\(\s*ncclResult_t\s+\w+\s*\)\s*\{")
_CASE = re.compile(r"(?:case\s+(?P<name>\w+)|(?P<default>default))\s*:\s*return\s+(?P<literal>\"(?:[^\"\\]|\\.)*\")")
HEADER, ERROR_STRINGS = "src/nccl.h.in", "src/init.cc"


def _line_at(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _result_codes(header: str) -> dict[str, tuple[int, int]]:
    enum = _ENUM.search(header)
    if enum is None:
        raise SystemExit(f"no typedef enum ... ncclResult_t in {HEADER}")
    start = enum.start("body")
    return {
        m["name"]: (int(m["value"]), _line_at(header, start + m.start())) for m in _ENUMERATOR.finditer(enum["body"])
    }


def _error_strings(source: str) -> dict[str, tuple[str, int]]:
    function = _GET_ERROR_STRING.search(source)
    if function is None:
        raise SystemExit(f"no ncclGetErrorString in {ERROR_STRINGS}")
    end = source.index("\n}", function.end())
    return {
        m["name"] or "default": (string_value(m["literal"]), _line_at(source, m.start()))
        for m in _CASE.finditer(source, function.end(), end)
    }


def results_raw(mirror: Mirror) -> dict[str, object]:
    seen: dict[tuple[str, int | None, str], dict[str, str]] = {}
    for tag in TAGS:
        header, init = mirror.show(tag, HEADER) or "", mirror.show(tag, ERROR_STRINGS) or ""
        codes, strings = _result_codes(header), _error_strings(init)
        for name in sorted(set(codes) | set(strings)):
            value, enum_line = codes.get(name, (None, 0))
            text, string_line = strings.get(name, ("", 0))
            where = {"enum_at": f"{HEADER}:{enum_line}" if enum_line else "",
                     "string_at": f"{ERROR_STRINGS}:{string_line}" if string_line else ""}  # fmt: skip
            seen.setdefault((name, value, text), {})[tag] = json.dumps(where, sort_keys=True)
    records = []
    for (name, value, text), by_tag in seen.items():
        versions = _versions_record(list(by_tag))
        where = json.loads(by_tag[str(versions["last_version"])])
        records.append({"name": name, "value": value, "string": text, **where, **versions})
    return {
        "source": _source(mirror, f"typedef enum ncclResult_t in {HEADER}; ncclGetErrorString in {ERROR_STRINGS}"),
        "records": sorted(records, key=lambda r: (r["value"] if r["value"] is not None else 1 << 30, r["name"],
                                                  r["first_version"] and TAGS.index(str(r["first_version"])))),
    }  # fmt: skip


# --------------------------------------------------------------------------------------------


def dumps(value: object) -> str:
    return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def extracted(mirror_path: Path) -> dict[Path, str]:
    """What the extraction writes: each file's text."""
    mirror = Mirror(mirror_path)
    try:
        return {WARNINGS_RAW: dumps(warnings_raw(mirror)), RESULTS_RAW: dumps(results_raw(mirror))}
    finally:
        mirror.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, default=Path(os.environ.get("NCCL_MIRROR", DEFAULT_MIRROR)))
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    args = parser.parse_args(argv)
    if not (args.mirror / "HEAD").is_file():
        print(f"no bare mirror of {UPSTREAM} at {args.mirror} (git clone --mirror {UPSTREAM})", file=sys.stderr)
        return 2
    texts = extracted(args.mirror)
    status = write_or_check(texts, args.check)
    if args.check:
        return status
    raw = json.loads(texts[WARNINGS_RAW])
    last = raw["counts_per_version"][TAGS[-1]]
    print(f"{len(raw['records'])} distinct WARN formats over {len(TAGS)} tags; {TAGS[-1]}: {last}")
    print(f"{len(raw['non_literal'])} distinct WARN calls with a format that is not a literal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
