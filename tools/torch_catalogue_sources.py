"""Reading message formats out of torch's sources: Python (``ast``) and C++ (a token scan), no build, no import.

The helpers of ``tools/torch_catalogue_extract.py``; ``tests/test_torch_catalogue.py`` uses them on the
venv's torch.  A message is a list of *pieces*: a literal string as the source wrote it (one C literal, one
f-string part) or ``{"expr": text}`` for what the program fills in; ``style`` says which conversions a
literal itself holds: ``plain`` (none), ``printf`` (``%s``, logging's lazy arguments), ``fmt`` (``{}``,
``str.format`` and C++ ``fmt::format``) or ``template`` (``string.Template``'s ``${name}``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

Piece = str | dict[str, str]

# --------------------------------------------------------------------------------------------
# Python
# --------------------------------------------------------------------------------------------

LOG_LEVELS = ("debug", "info", "warning", "warn", "error", "exception", "critical")
LOGGERS = ("logger", "log", "logging", "_logger", "LOG", "_log")
# An assignment whose target is named so holds a message built for later (a raise, a log, a Template).
MESSAGE_NAME = re.compile(r"(?i)(?:^|_)(?:msg|message|template|format|err|error_str|reason)$")


@dataclass
class Message:
    """One message format found in one file of one version."""

    path: str
    line: int
    kind: str  # raise:<Exception>, log:<level>, warn, text (a named message), or the C++ call
    style: str
    pieces: list[Piece] = field(default_factory=list)

    def key(self) -> str:
        """The format as one text, placeholders as ``{=expr}``: what records are merged by."""
        return "".join(p if isinstance(p, str) else "{=" + p["expr"] + "}" for p in self.pieces)

    def literal(self) -> int:
        return sum(len(p) for p in self.pieces if isinstance(p, str))


def _joined(node: ast.JoinedStr) -> list[Piece]:
    pieces: list[Piece] = []
    for value in node.values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            pieces.append(value.value)
        elif isinstance(value, ast.FormattedValue):
            pieces.append({"expr": ast.unparse(value.value)})
    return pieces


def string_pieces(node: ast.expr) -> tuple[list[Piece], str] | None:
    """The pieces and style of a string expression, or None where it holds no literal text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value], ("template" if "${" in node.value else "plain")
    if isinstance(node, ast.JoinedStr):
        return _joined(node), "plain"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = string_pieces(node.left), string_pieces(node.right)
        if left is None and right is None:
            return None
        pieces: list[Piece] = [*(left[0] if left else [{"expr": ast.unparse(node.left)}])]
        pieces += right[0] if right else [{"expr": ast.unparse(node.right)}]
        styles = {s for s in (left and left[1], right and right[1]) if s and s != "plain"}
        return pieces, (styles.pop() if len(styles) == 1 else "plain")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        left = string_pieces(node.left)
        return (left[0], "printf") if left else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        base = string_pieces(node.func.value)
        return (base[0], "fmt") if base else None
    return None


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _owner(func: ast.expr) -> str:
    return func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""


def _kind_of_call(node: ast.Call) -> str | None:
    name, owner = _call_name(node.func), _owner(node.func)
    if name in LOG_LEVELS and (owner in LOGGERS or owner.endswith("logger")):
        return f"log:{name}"
    if name == "warn" and owner == "warnings":
        return "warn"
    return None


def _from_call(path: str, node: ast.Call, kind: str) -> Message | None:
    if not node.args:
        return None
    found = string_pieces(node.args[0])
    if found is None:
        return None
    pieces, style = found
    if kind.startswith("log:") and len(node.args) > 1:
        style = "printf"
    return Message(path, node.lineno, kind, style, pieces)


def _from_raise(path: str, node: ast.Raise) -> Message | None:
    exc = node.exc
    if not isinstance(exc, ast.Call) or not exc.args:
        return None
    found = string_pieces(exc.args[0])
    return Message(path, node.lineno, f"raise:{_call_name(exc.func)}", found[1], found[0]) if found else None


def _target_name(target: ast.expr) -> str:
    return target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""


def _from_assign(path: str, node: ast.Assign | ast.AnnAssign) -> Message | None:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    if node.value is None or not any(MESSAGE_NAME.search(_target_name(t)) for t in targets):
        return None
    found = string_pieces(node.value)
    return Message(path, node.lineno, "text", found[1], found[0]) if found else None


def module_of(path: str) -> str:
    """The module a file of torch's tree is (``torch/distributed/run.py``: ``torch.distributed.run``)."""
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _exception_name(node: ast.AST) -> str:
    """The name of the exception class this statement defines, else ''.

    A class deriving an ``*Error`` or ``*Exception``, or torch/distributed/__init__.py's
    ``DistBackendError = torch._C._DistBackendError``.
    """
    if isinstance(node, ast.ClassDef):
        bases = [_call_name(b) for b in node.bases]
        return node.name if any(b.endswith(("Error", "Exception")) for b in bases) else ""
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        name = node.targets[0].id
        return name if re.fullmatch(r"Dist\w*Error", name) and isinstance(node.value, ast.Attribute) else ""
    return ""


def python_messages(path: str, source: str) -> list[Message]:
    """Every raise, logging call, ``warnings.warn`` and named message string of one Python file.

    And the qualified name of each exception class it defines: what a traceback's last line starts with.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out: list[Message] = []
    for node in ast.walk(tree):
        found: Message | None = None
        if exception := _exception_name(node):
            found = Message(path, getattr(node, "lineno", 0), "class", "plain", [f"{module_of(path)}.{exception}"])
        elif isinstance(node, ast.Raise):
            found = _from_raise(path, node)
        elif isinstance(node, ast.Call) and (kind := _kind_of_call(node)):
            found = _from_call(path, node, kind)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            found = _from_assign(path, node)
        if found is not None and found.literal() > 0:
            out.append(found)
    return sorted(out, key=lambda m: (m.line, m.kind, m.key()))


# --------------------------------------------------------------------------------------------
# C++
# --------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""(?P<skip>\\\r?\n|//[^\n]*|/\*.*?\*/|\s+)
      |(?P<str>(?:u8|[uUL])?R"(?P<delim>[^(\s]*)\((?P<raw>.*?)\)(?P=delim)"|(?:u8|[uUL])?"(?:[^"\\\n]|\\.)*")
      |(?P<chr>'(?:[^'\\\n]|\\.)*')
      |(?P<id>[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)
      |(?P<num>\.?\d(?:[eEpP][+-]|[\w.'])*)
      |(?P<punct><<|::|->|.)""",
    re.VERBOSE | re.DOTALL,
)
_ESCAPE = re.compile(r"\\(?:x[0-9a-fA-F]+|[0-7]{1,3}|.)", re.DOTALL)
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
# Calls whose arguments make a message, and how many leading arguments are not part of it.
CALLS = {
    "c10::str": 0, "TORCH_CHECK": 1, "TORCH_CHECK_WITH": 2, "TORCH_CHECK_MSG": 2, "C10_THROW_ERROR": 1,
    "C10D_THROW_ERROR": 1, "TORCH_INTERNAL_ASSERT": 1, "TORCH_WARN": 0, "TORCH_WARN_ONCE": 0,
    "std::runtime_error": 0, "std::invalid_argument": 0, "fn": 0,
}  # fmt: skip
# Calls whose first argument is an fmt format string (``{}`` placeholders) and the rest its arguments.
FMT_CALLS = ("fmt::format", "C10D_ERROR", "C10D_WARNING", "C10D_INFO", "C10D_DEBUG", "C10D_TRACE", "recordError")
PRINTF_CALLS = {"fprintf": 1, "printf": 0, "snprintf": 2}


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    line: int


def _unescape(m: re.Match[str]) -> str:
    body = m.group()[1:]
    if body[0] == "x":
        return chr(int(body[1:], 16) % 0x110000)
    if body[0] in "01234567":
        return chr(int(body, 8))
    return _SIMPLE.get(body, body)


def literal_value(token: str) -> str:
    """The characters of a C++ string literal (raw or not, prefix and quotes dropped, escapes decoded)."""
    raw = re.match(r'(?:u8|[uUL])?R"([^(\s]*)\((.*)\)\1"\Z', token, re.DOTALL)
    if raw:
        return raw.group(2)
    return _ESCAPE.sub(_unescape, token[token.index('"') + 1 : -1])


def tokens(source: str) -> list[Token]:
    out, line = [], 1
    for m in _TOKEN.finditer(source):
        kind = m.lastgroup if m.lastgroup != "raw" and m.lastgroup != "delim" else "str"
        if m["str"] is not None:
            kind = "str"
        if kind != "skip":
            out.append(Token(kind or "punct", m.group(), line))
        line += m.group().count("\n")
    return out


def _arguments(toks: list[Token], opening: int) -> tuple[list[list[Token]], int]:
    """The top-level arguments of the call whose '(' is at ``opening``, and the index after its ')'."""
    args: list[list[Token]] = [[]]
    depth, i = 0, opening + 1
    while i < len(toks):
        t = toks[i]
        if t.kind == "punct" and t.text in "([{":
            depth += 1
        elif t.kind == "punct" and t.text in ")]}":
            if depth == 0:
                return ([a for a in args if a] if any(args) else []), i + 1
            depth -= 1
        elif t.kind == "punct" and t.text == "," and depth == 0:
            args.append([])
            i += 1
            continue
        args[-1].append(t)
        i += 1
    return [a for a in args if a], i


def _split(arg: list[Token], operator: str) -> list[list[Token]]:
    parts: list[list[Token]] = [[]]
    depth = 0
    for t in arg:
        if t.kind == "punct" and t.text in "([{":
            depth += 1
        elif t.kind == "punct" and t.text in ")]}":
            depth -= 1
        if t.kind == "punct" and t.text == operator and depth == 0:
            parts.append([])
        else:
            parts[-1].append(t)
    return [p for p in parts if p]


def _operand(part: list[Token]) -> list[Piece]:
    """A literal run (adjacent literals: one C string) or an expression placeholder."""
    if all(t.kind == "str" for t in part):
        return ["".join(literal_value(t.text) for t in part)]
    return [{"expr": " ".join(t.text for t in part)}]


def concatenation(arg: list[Token], operator: str = "+") -> list[Piece]:
    """The pieces of ``a + "b" + c`` (or of a ``<<`` chain); one placeholder where no operand is a literal."""
    if len(arg) >= 4 and arg[0].text == "FMT_COMPILE" and arg[1].text == "(":
        arg = arg[2:-1]
    parts = _split(arg, operator)
    if operator == "+" and not any(all(t.kind == "str" for t in part) for part in parts):
        return [{"expr": " ".join(t.text for t in arg)}]
    pieces: list[Piece] = []
    for part in parts:
        pieces += _operand(part)
    return pieces


def _has_literal(pieces: list[Piece]) -> bool:
    return any(isinstance(p, str) and p.strip() for p in pieces)


def _call_message(name: str, args: list[list[Token]]) -> tuple[list[Piece], str] | None:
    if name in FMT_CALLS or name in PRINTF_CALLS:
        skip = PRINTF_CALLS.get(name, 0)
        if len(args) <= skip or not any(t.kind == "str" for t in args[skip]):
            return None
        return concatenation(args[skip]), ("printf" if name in PRINTF_CALLS else "fmt")
    pieces: list[Piece] = []
    for arg in args[CALLS[name] :]:
        if len(arg) >= 2 and arg[0].kind == "id" and arg[0].text in CALLS and arg[1].text == "(":
            return None  # a message call inside: that call is the message
        pieces += concatenation(arg)
    return (pieces, "plain") if _has_literal(pieces) else None


def _log_chain(toks: list[Token], start: int) -> tuple[list[Piece], int]:
    """The pieces of ``LOG(X) << a << "b" ...;`` from the first ``<<``, and the index after the ``;``."""
    end = start
    while end < len(toks) and toks[end].text not in (";", "#", "{", "}"):  # a macro's body ends at the next #
        end += 1
    return concatenation(toks[start:end], "<<"), end + 1


def _assigned(toks: list[Token], at: int) -> list[Piece] | None:
    """The pieces of ``name = "a" + b ...;`` when the ``=`` at ``at`` assigns a concatenation holding a literal."""
    before, after = toks[at - 1], toks[at + 1] if at + 1 < len(toks) else None
    if before.kind != "id" or after is None or after.text == "=" or toks[at - 2].text in ("=", "!", "<", ">"):
        return None
    end = at + 1
    while end < len(toks) and toks[end].text not in (";", "{", "}"):
        end += 1
    expr = toks[at + 1 : end]
    named = MESSAGE_NAME.search(before.text) or re.search(r"(?i)(?:report|msg|str)$", before.text)
    if len(_split(expr, "+")) < 2 and not (named and expr and all(t.kind == "str" for t in expr)):
        return None
    pieces = concatenation(expr)
    return pieces if _has_literal(pieces) else None


def cpp_messages(path: str, source: str) -> list[Message]:
    """The messages of one C++ file.

    The calls of :data:`CALLS`, :data:`FMT_CALLS` and :data:`PRINTF_CALLS`, ``LOG(...) <<`` chains, and a string
    assigned a concatenation with a literal (``std::string err = "NCCL error in: " + ...``).
    """
    toks, out, i = tokens(source), [], 0
    while i < len(toks):
        t = toks[i]
        opens = i + 1 < len(toks) and toks[i + 1].text == "("
        if t.kind == "punct" and t.text == "=" and i >= 2 and (assigned := _assigned(toks, i)):
            out.append(Message(path, t.line, "assign", "plain", assigned))
        elif t.kind == "id" and opens and (t.text in CALLS or t.text in FMT_CALLS or t.text in PRINTF_CALLS):
            args, _ = _arguments(toks, i + 1)
            found = _call_message(t.text, args)
            if found:
                out.append(Message(path, t.line, t.text, found[1], found[0]))
        elif t.kind == "id" and t.text in ("LOG", "VLOG", "C10_LOG_EVERY_MS") and opens:
            level, after = _arguments(toks, i + 1)
            if after < len(toks) and toks[after].text == "<<":
                pieces, _ = _log_chain(toks, after + 1)
                name = " ".join(x.text for x in level[0]) if level else ""
                if _has_literal(pieces):
                    out.append(Message(path, t.line, f"{t.text}({name})", "plain", pieces))
        i += 1
    return out
