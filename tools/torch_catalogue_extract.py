"""torch's c10d, ProcessGroupNCCL and torchelastic message formats, read from torch's release wheels (2.0.0-2.13.0).

    python tools/torch_catalogue_extract.py [--wheels DIR]     writes tools/catalogue_inputs/torch_messages_raw.json
    python tools/torch_catalogue_extract.py --check            exits 1 when what it would write differs

The first stage of the torch catalogue (the second, ``tools/torch_catalogue_build.py``, needs no wheels).  A wheel
holds torch's Python sources, the C++ headers of ``torch/csrc/distributed/c10d`` and the compiled libraries, but
not the ``.cpp`` files; so three sources, each read per release:

* Python: every ``raise``, logging call, ``warnings.warn`` and named message string (``msg = f"..."``,
  ``_FAILURE_FORMAT_TEMPLATE``) of :data:`PYTHON_FILES`, with ``ast`` (``torch_catalogue_sources.python_messages``);
* C++ headers: the message calls (``c10::str``, ``TORCH_CHECK``, ``C10_THROW_ERROR``, ``fmt::format``, ``LOG() <<``,
  ``std::string err = "..." + ...``) of ``torch/include/torch/csrc/distributed/c10d/*.h*``, with a token scan;
* C++ ``.cpp`` (ProcessGroupNCCL.cpp, NCCLUtils.cpp, TCPStore.cpp, socket.cpp, ProcessGroupWrapper.cpp): the
  formats in ``tools/catalogue_inputs/torch_cpp_read.json``, transcribed from stored copies of pytorch/pytorch
  (each names what was read: a commit, or a stored version's id and size), and dated here: a format is in a
  release when every literal piece of it of :data:`MIN_PIECE` characters or more is a NUL-ended string in the
  ``.rodata`` of that wheel's ``libtorch_cuda.so`` or ``libtorch_cpu.so`` (what the compiler kept of the source).

Wheels: ``pip download torch==V --no-deps --only-binary=:all: --platform manylinux1_x86_64 --python-version 3.11``
for each release of :data:`VERSIONS` into one folder (``--wheels`` or ``$TORCH_WHEELS``; 25 wheels, 20 GB).  Output
is sorted and written with ``\\n`` line ends; ``tests/test_torch_catalogue.py`` reruns the Python and header
extraction on the venv's torch and compares it with the 2.13.0 records.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from catalogue_files import write_or_check  # noqa: E402 (tools/ is the script's folder)
from torch_catalogue_sources import Message, cpp_messages, python_messages  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
INPUTS = REPO / "tools" / "catalogue_inputs"
RAW = INPUTS / "torch_messages_raw.json"
CPP_READ = INPUTS / "torch_cpp_read.json"
DEFAULT_WHEELS = Path("/work/torch-wheels/linux")
VERSIONS = (
    "2.0.0", "2.0.1", "2.1.0", "2.1.1", "2.1.2", "2.2.0", "2.2.1", "2.2.2", "2.3.0", "2.3.1", "2.4.0", "2.4.1",
    "2.5.0", "2.5.1", "2.6.0", "2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0", "2.12.1",
    "2.13.0",
)  # fmt: skip
PYTHON_FILES = (
    "torch/distributed/elastic/*", "torch/distributed/launcher/*", "torch/distributed/distributed_c10d.py",
    "torch/distributed/rendezvous.py", "torch/distributed/run.py", "torch/distributed/c10d_logger.py",
    "torch/distributed/__init__.py",
)  # fmt: skip
HEADERS = "torch/include/torch/csrc/distributed/c10d/"
LIBRARIES = ("torch/lib/libtorch_cuda.so", "torch/lib/libtorch_cpu.so")
MIN_PIECE = 6  # a shorter literal ("] ", ", ") is in any library: it dates nothing


def selected(path: str) -> bool:
    """A Python file of :data:`PYTHON_FILES` (a trailing ``*``: the folder, any depth) or a c10d header."""
    if path.startswith(HEADERS):
        return "/" not in path[len(HEADERS) :] and path.endswith((".h", ".hpp"))
    if not path.endswith(".py"):
        return False
    return any(path.startswith(p[:-1]) if p.endswith("*") else path == p for p in PYTHON_FILES)


def messages_of(path: str, text: str) -> list[Message]:
    """The messages of one selected file, named by its path in pytorch/pytorch."""
    if path.startswith(HEADERS):
        return cpp_messages("torch/csrc/distributed/c10d/" + path[len(HEADERS) :], text)
    return python_messages(path, text)


def tree_messages(files: Iterable[tuple[str, str]]) -> list[Message]:
    """The messages of (path, text) pairs of one release, the unselected left out."""
    out: list[Message] = []
    for path, text in sorted(files):
        if selected(path):
            out += messages_of(path, text)
    return out


def installed_files(torch_dir: Path) -> Iterable[tuple[str, str]]:
    """(path, text) of an installed torch (a site-packages ``torch`` folder), as a wheel names them."""
    for file in sorted(torch_dir.rglob("*")):
        path = "torch/" + file.relative_to(torch_dir).as_posix()
        if file.is_file() and selected(path):
            yield path, file.read_text(encoding="utf-8", errors="replace")


def wheel_files(wheel: zipfile.ZipFile) -> Iterable[tuple[str, str]]:
    for name in sorted(wheel.namelist()):
        if selected(name):
            yield name, wheel.read(name).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------------
# The compiled libraries' strings
# --------------------------------------------------------------------------------------------


def elf_rodata(data: bytes) -> bytes:
    """The ``.rodata`` section of a little-endian ELF64 file (where a C++ string literal is kept)."""
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, names = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize) for i in range(count)]
    table = sections[names][4]
    for section in sections:
        name = data[table + section[0] : data.index(b"\0", table + section[0])]
        if name == b".rodata":
            return data[section[4] : section[4] + section[5]]
    return b""


def library_strings(wheel: zipfile.ZipFile) -> bytes:
    """The ``.rodata`` of the wheel's libraries of :data:`LIBRARIES`, joined."""
    names = set(wheel.namelist())
    return b"\0".join(elf_rodata(wheel.read(lib)) for lib in LIBRARIES if lib in names)


def pieces_in(pieces: list[object], rodata: bytes) -> bool:
    """Whether every literal piece of :data:`MIN_PIECE` characters or more is a NUL-ended string in ``rodata``."""
    checked = [p for p in pieces if isinstance(p, str) and len(p) >= MIN_PIECE]
    return bool(checked) and all(p.encode() + b"\0" in rodata for p in checked)


# --------------------------------------------------------------------------------------------
# Records over the releases
# --------------------------------------------------------------------------------------------


def versions_record(versions: Iterable[str]) -> dict[str, object]:
    """The releases a text is in, compactly: the first, the last, and those between them it is missing from."""
    order = [v for v in VERSIONS if v in set(versions)]
    if not order:
        return {"first_version": "", "last_version": "", "missing_between": []}
    gaps = [v for v in VERSIONS[VERSIONS.index(order[0]) : VERSIONS.index(order[-1]) + 1] if v not in order]
    return {"first_version": order[0], "last_version": order[-1], "missing_between": gaps}


def in_versions(record: dict[str, object]) -> list[str]:
    """The releases of a record (the inverse of :func:`versions_record`)."""
    first, last = str(record["first_version"]), str(record["last_version"])
    if not first:
        return []
    span = VERSIONS[VERSIONS.index(first) : VERSIONS.index(last) + 1]
    return [v for v in span if v not in record["missing_between"]]  # type: ignore[operator]


def merged(per_version: dict[str, list[Message]]) -> list[dict[str, object]]:
    """One record per (file, kind, style, format), with its line in the last release it is in."""
    seen: dict[tuple[str, str, str, str], dict[str, Message]] = {}
    for version in VERSIONS:
        for m in per_version.get(version, []):
            seen.setdefault((m.path, m.kind, m.style, m.key()), {})[version] = m
    records = []
    for (path, kind, style, _), by_version in seen.items():
        versions = versions_record(by_version)
        last = by_version[str(versions["last_version"])]
        records.append({"file": path, "line": last.line, "kind": kind, "style": style, "pieces": last.pieces,
                        **versions})  # fmt: skip
    return sorted(records, key=lambda r: (str(r["file"]), int(str(r["line"])), json.dumps(r["pieces"])))


def dated_cpp(read: dict[str, object], rodata: dict[str, bytes]) -> list[dict[str, object]]:
    """The transcribed ``.cpp`` formats, each with the releases whose libraries hold its literal pieces."""
    out = []
    for record in read["records"]:  # type: ignore[attr-defined]
        versions = [v for v in VERSIONS if v in rodata and pieces_in(record["pieces"], rodata[v])]
        out.append({**record, **versions_record(versions)})
    return out


def counts(per_version: dict[str, list[Message]]) -> dict[str, dict[str, int]]:
    return {
        v: {"python": sum(not m.path.endswith((".h", ".hpp")) for m in ms),
            "headers": sum(m.path.endswith((".h", ".hpp")) for m in ms)}
        for v, ms in per_version.items()
    }  # fmt: skip


def git_version(wheel: zipfile.ZipFile) -> str:
    """The commit of pytorch/pytorch the wheel was built from (``torch/version.py``)."""
    m = re.search(r"git_version = '([0-9a-f]{40})'", wheel.read("torch/version.py").decode())
    return m.group(1) if m else ""


def wheel_path(wheels: Path, version: str) -> Path:
    found = sorted(wheels.glob(f"torch-{version}-*manylinux*x86_64.whl")) + sorted(
        wheels.glob(f"torch-{version}-*-cp311-*.whl")
    )
    if not found:
        raise SystemExit(f"no torch {version} wheel in {wheels}")
    return found[0]


def extracted(wheels: Path) -> str:
    """What the extraction writes."""
    per_version: dict[str, list[Message]] = {}
    rodata: dict[str, bytes] = {}
    names: dict[str, dict[str, str]] = {}
    for version in VERSIONS:
        path = wheel_path(wheels, version)
        with zipfile.ZipFile(path) as wheel:
            names[version] = {"wheel": path.name, "git_version": git_version(wheel)}
            per_version[version] = tree_messages(wheel_files(wheel))
            rodata[version] = library_strings(wheel)
    read = json.loads(CPP_READ.read_text())
    raw = {
        "source": {"wheels": names, "python_files": list(PYTHON_FILES), "headers": HEADERS,
                   "libraries": list(LIBRARIES), "cpp_read": read["reads"],
                   "extractor": "tools/torch_catalogue_extract.py"},
        "counts_per_version": counts(per_version),
        "records": merged(per_version),
        "cpp_records": dated_cpp(read, rodata),
    }  # fmt: skip
    return dumps(raw)


def dumps(value: object) -> str:
    return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, default=Path(os.environ.get("TORCH_WHEELS", DEFAULT_WHEELS)))
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = parser.parse_args(argv)
    if not args.wheels.is_dir():
        print(f"no folder of torch wheels at {args.wheels} (--wheels, $TORCH_WHEELS)", file=sys.stderr)
        return 2
    text = extracted(args.wheels)
    status = write_or_check({RAW: text}, args.check)
    if args.check:
        return status
    raw = json.loads(text)
    undated = [r["pieces"] for r in raw["cpp_records"] if not r["first_version"]]
    print(f"{len(raw['records'])} Python and header formats, {len(raw['cpp_records'])} .cpp formats "
          f"({len(undated)} in no release's libraries)")  # fmt: skip
    for pieces in undated:
        print("  not in any release:", re.sub(r"\s+", " ", json.dumps(pieces))[:150])
    return 0


if __name__ == "__main__":
    sys.exit(main())
