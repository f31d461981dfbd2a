"""CUDA's error codes, read per release from NVIDIA's own headers and runtime library: the catalogue's raw input.

    python tools/cuda_catalogue_extract.py [--wheels DIR]    writes tools/catalogue_inputs/cuda_errors_raw.json
    python tools/cuda_catalogue_extract.py --check           exits 1 when what it would write differs
    python tools/cuda_catalogue_extract.py --download        first fetches the pinned wheels with pip

The first stage of the CUDA catalogue (the second, ``tools/cuda_catalogue_build.py``, needs none of this).  Its
source is NVIDIA's CUDA runtime wheels on PyPI, one per CUDA release from 11.8 to 13.5 (:data:`RELEASES`, each
pinned by its sha256): ``nvidia-cuda-runtime-cu11``, ``-cu12`` and, from 13.0, ``nvidia-cuda-runtime``.  Each wheel
holds the CUDA toolkit's own ``driver_types.h`` and ``cuda.h`` and the runtime library ``libcudart.so``.  A
directory of those wheels (``--wheels`` or ``$CUDA_WHEELS``; ``--download`` fills it with ``pip download``) is
this stage's mirror; the wheels are read with :mod:`zipfile`, never installed.

Per release, three things:

* ``enum cudaError`` of ``driver_types.h`` (the runtime's ``cudaError_t``) and ``typedef enum cudaError_enum
  { ... } CUresult`` of ``cuda.h`` (the driver's): each enumerator's name, number and the first sentence of the
  doc comment above it (``\\deprecated`` dropped and flagged, Doxygen's ``::`` links written as plain names);
* ``cudaGetErrorString`` and ``cudaGetErrorName`` of that release's ``libcudart.so`` for every runtime code: the
  text torch (``CUDA error: <text>``), NCCL (``Cuda failure <n> '<text>'``) and nccl-tests print.  The library is
  loaded with :mod:`ctypes` in a child process per release: neither call needs a GPU or a driver.  The driver's
  ``cuGetErrorString`` is in ``libcuda.so``, which comes with the driver, not the toolkit: not read.

Output is sorted and written with ``\\n`` line ends, so a rerun on the same wheels is byte-identical;
``tests/test_cuda_catalogue.py`` reruns it when the wheels are there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from catalogue_files import write_or_check  # tools/ is the script's folder, and the tests put it on the path

REPO = Path(__file__).resolve().parent.parent
RAW = REPO / "tools" / "catalogue_inputs" / "cuda_errors_raw.json"
DEFAULT_WHEELS = Path(os.environ.get("CUDA_WHEELS", Path.home() / ".cache" / "conformance" / "cuda-wheels"))
INDEX = "https://pypi.org/simple"
RUNTIME_HEADER, DRIVER_HEADER = "driver_types.h", "cuda.h"


@dataclass(frozen=True)
class Release:
    """One CUDA release's runtime wheel: the CUDA version its ``cuda.h`` says, the package, its version and hash."""

    cuda: str  # "12.9": CUDA_VERSION 12090 of the wheel's cuda.h
    package: str
    version: str
    wheel: str
    sha256: str


def _release(cuda: str, package: str, version: str, tag: str, sha256: str) -> Release:
    dist = package.replace("-", "_")
    return Release(cuda, package, version, f"{dist}-{version}-py3-none-{tag}.whl", sha256)


_M1, _M2014 = "manylinux1_x86_64", "manylinux2014_x86_64"
_M2017 = "manylinux2014_x86_64.manylinux_2_17_x86_64"
_CU11, _CU12, _CU13 = "nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime"
# The last wheel of each CUDA minor release on PyPI (12.7 was never released), oldest first.
RELEASES: tuple[Release, ...] = (
    _release("11.8", _CU11, "11.8.89", _M2014, "92d04069a987e1fbc9213f8376d265df0f7bb42617d44f5eda1f496acea7f2d1"),
    _release("12.0", _CU12, "12.0.146", _M1, "18c038592af387684812fa712642aa9a26c12da80acb488b6709f7cced147f71"),
    _release("12.1", _CU12, "12.1.105", _M1, "6e258468ddf5796e25f1dc591a31029fa317d97a0a94ed93468fc86301d61e40"),
    _release("12.2", _CU12, "12.2.140", _M1, "acb9cb7e44594a3512533497ea790d9f0b0e399abcc888584c157d1ffa080e41"),
    _release("12.3", _CU12, "12.3.101", _M1, "04604679ddca6acb96c76a7a9306282cddc16981f92e148e2dfe227078883cda"),
    _release("12.4", _CU12, "12.4.127", _M2014, "64403288fa2136ee8e467cdc9c9427e0434110899d07c779f25b5c068934faa5"),
    _release("12.5", _CU12, "12.5.82", _M2014, "3e79a060e126df40fd3a068f3f787eb000fa51b251ec6cd97d09579632687115"),
    _release("12.6", _CU12, "12.6.77", _M2014, "a84d15d5e1da416dd4774cb42edf5e954a3e60cc945698dc1d5be02321c44dc8"),
    _release("12.8", _CU12, "12.8.90", _M2017, "adade8dcbd0edf427b7204d480d6066d33902cab2a4707dcfc48a2d0fd44ab90"),
    _release("12.9", _CU12, "12.9.79", _M2017, "25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3"),
    _release("13.0", _CU13, "13.0.96", _M2017, "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548"),
    _release("13.1", _CU13, "13.1.80", _M2017, "dac25b52e69050e5a7a84957e6df470a85b185f8f648a99a1ab1dfce027576cf"),
    _release("13.2", _CU13, "13.2.86", _M2017, "3498247680dfddce31bad102af7e3e26fc795342a3cac64722bb0fa95e7f60f0"),
    _release("13.3", _CU13, "13.3.29", _M2017, "e04420616e72f563167a7733272992d7e6df6dc5cb54b2f94f9f1520ea9e30c1"),
    _release("13.4", _CU13, "13.4.92", _M2017, "9641f797da20ce1dd8e779b6e96d08cf9ba564cec8e8225458811ee26423f3a5"),
    _release("13.5", _CU13, "13.5.37", _M2017, "df2b79a8852f10d1fef8c848489c49eebb5754051bf870202a862831412b179d"),
)
VERSIONS = tuple(r.cuda for r in RELEASES)

# --------------------------------------------------------------------------------------------
# The headers
# --------------------------------------------------------------------------------------------

_ENUMS = {
    "runtime": (RUNTIME_HEADER, re.compile(r"enum\s+__device_builtin__\s+cudaError\s*\{(?P<body>.*?)\}\s*;", re.S)),
    "driver": (DRIVER_HEADER, re.compile(r"typedef\s+enum\s+cudaError_enum\s*\{(?P<body>.*?)\}\s*CUresult\s*;", re.S)),
}
_ENUMERATOR = re.compile(
    r"(?:/\*\*(?P<doc>(?:[^*]|\*(?!/))*)\*/\s*)?,?\s*(?P<name>[A-Za-z_]\w*)\s*=\s*(?P<value>\d+)\s*,?", re.S
)
_CUDA_VERSION = re.compile(r"#define\s+CUDA_VERSION\s+(?P<v>\d+)")
# A sentence ends at a full stop and a space before a capital, or at the end; "e.g." and "i.e." are no ends.
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)\.(?=\s+[A-Z\\]|\s*$)")


@dataclass(frozen=True)
class Code:
    """One enumerator: its name, number, doc's first sentence, whether deprecated, and its line in the header."""

    name: str
    value: int
    description: str
    deprecated: bool
    line: int


def doc_text(doc: str) -> tuple[str, bool]:
    """A doc comment's words on one line (its ``*`` margins, ``\\deprecated`` and ``::`` dropped), and deprecated."""
    lines = [re.sub(r"^\s*\*\s?", "", line).strip() for line in doc.splitlines()]
    text = " ".join(line for line in lines if line)
    deprecated = "\\deprecated" in text
    text = re.sub(r"\\deprecated\s*", "", text)
    text = re.sub(r"::(?=\w)", "", text)
    return " ".join(text.split()), deprecated


def first_sentence(text: str) -> str:
    """The first sentence of a doc text, with its full stop."""
    m = _SENTENCE_END.search(text)
    return text[: m.end()] if m else text


def codes(header: str, api: str) -> list[Code]:
    """Every enumerator of the runtime's or the driver's error enum in one header's text."""
    file, enum = _ENUMS[api]
    found = enum.search(header)
    if found is None:
        raise SystemExit(f"no {api} error enum in {file}")
    out = []
    for m in _ENUMERATOR.finditer(found["body"]):
        text, deprecated = doc_text(m["doc"] or "")
        line = header.count("\n", 0, found.start("body") + m.start("name")) + 1
        out.append(Code(m["name"], int(m["value"]), first_sentence(text), deprecated, line))
    return out


def cuda_version(cuda_h: str) -> str:
    m = _CUDA_VERSION.search(cuda_h)
    if m is None:
        raise SystemExit(f"no CUDA_VERSION in {DRIVER_HEADER}")
    v = int(m["v"])
    return f"{v // 1000}.{v % 1000 // 10}"


# --------------------------------------------------------------------------------------------
# The runtime library: cudaGetErrorString, cudaGetErrorName
# --------------------------------------------------------------------------------------------

# Run in a child process per release: two releases' libcudart.so.12 share one soname.
_PROBE = """
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.cudaGetErrorString.restype = lib.cudaGetErrorName.restype = ctypes.c_char_p
lib.cudaGetErrorString.argtypes = lib.cudaGetErrorName.argtypes = [ctypes.c_int]
out = {c: [lib.cudaGetErrorName(c).decode(), lib.cudaGetErrorString(c).decode()] for c in json.loads(sys.argv[2])}
print(json.dumps(out))
"""


def runtime_strings(libcudart: Path, values: list[int]) -> dict[int, tuple[str, str]]:
    """(cudaGetErrorName, cudaGetErrorString) of each code, from one release's libcudart.so."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(libcudart), json.dumps(values)],
        capture_output=True, text=True, check=True, timeout=120, env={"PATH": os.environ.get("PATH", "")},
    )  # fmt: skip
    return {int(k): (v[0], v[1]) for k, v in json.loads(done.stdout).items()}


# --------------------------------------------------------------------------------------------
# The wheels
# --------------------------------------------------------------------------------------------


def _member(wheel: zipfile.ZipFile, suffix: str) -> str:
    found = [n for n in wheel.namelist() if n.endswith(f"/include/{suffix}")]
    if len(found) != 1:
        raise SystemExit(f"{wheel.filename}: {len(found)} files named {suffix}")
    return found[0]


def _libcudart(wheel: zipfile.ZipFile) -> str:
    found = [n for n in wheel.namelist() if re.search(r"/lib/libcudart\.so\.\d+(?:\.\d+)?$", n)]
    if len(found) != 1:
        raise SystemExit(f"{wheel.filename}: {len(found)} libcudart.so")
    return found[0]


def verified(wheels: Path, release: Release) -> Path:
    """The release's wheel in ``wheels``, its sha256 checked."""
    path = wheels / release.wheel
    if not path.is_file():
        raise SystemExit(f"{path} missing: python tools/cuda_catalogue_extract.py --download (or pip download)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != release.sha256:
        raise SystemExit(f"{path.name}: sha256 {digest}, pinned {release.sha256}")
    return path


@dataclass(frozen=True)
class ReleaseCodes:
    """What one release says: each API's codes, and the runtime's (name, string) from its library."""

    release: Release
    runtime: list[Code]
    driver: list[Code]
    strings: dict[int, tuple[str, str]]
    files: dict[str, str]  # header -> its path in the wheel


def read_release(wheels: Path, release: Release) -> ReleaseCodes:
    with zipfile.ZipFile(verified(wheels, release)) as wheel:
        files = {name: _member(wheel, name) for name in (RUNTIME_HEADER, DRIVER_HEADER)}
        runtime_h, cuda_h = (wheel.read(files[n]).decode("utf-8", "replace") for n in (RUNTIME_HEADER, DRIVER_HEADER))
        if cuda_version(cuda_h) != release.cuda:
            raise SystemExit(f"{release.wheel}: cuda.h says CUDA {cuda_version(cuda_h)}, pinned {release.cuda}")
        runtime = codes(runtime_h, "runtime")
        with tempfile.TemporaryDirectory() as tmp:
            lib = Path(wheel.extract(_libcudart(wheel), tmp))
            strings = runtime_strings(lib, [c.value for c in runtime])
    return ReleaseCodes(release, runtime, codes(cuda_h, "driver"), strings, files)


# --------------------------------------------------------------------------------------------
# Records over the releases
# --------------------------------------------------------------------------------------------


def versions_record(versions: list[str]) -> dict[str, object]:
    """The releases a record is in: the first, the last, and those between them it is missing from."""
    order = [v for v in VERSIONS if v in versions]
    gaps = [v for v in VERSIONS[VERSIONS.index(order[0]) : VERSIONS.index(order[-1]) + 1] if v not in order]
    return {"first_version": order[0], "last_version": order[-1], "missing_between": gaps}


def _key(api: str, code: Code, strings: dict[int, tuple[str, str]]) -> tuple[object, ...]:
    library_name, string = strings.get(code.value, ("", "")) if api == "runtime" else ("", "")
    return (code.name, code.value, code.description, code.deprecated, string, library_name)


def records(per_release: list[ReleaseCodes], api: str) -> list[dict[str, object]]:
    """One record per distinct (name, number, description, deprecated, string, library name), with its releases."""
    seen: dict[tuple[object, ...], dict[str, str]] = {}
    for got in per_release:
        for code in got.runtime if api == "runtime" else got.driver:
            where = f"{_ENUMS[api][0]}:{code.line}"
            seen.setdefault(_key(api, code, got.strings), {})[got.release.cuda] = where
    out = []
    for (name, value, description, deprecated, string, library_name), at in seen.items():
        versions = versions_record(list(at))
        record = {"name": name, "value": value, "description": description, "deprecated": deprecated,
                  "at": at[str(versions["last_version"])], **versions}  # fmt: skip
        if api == "runtime":
            record |= {"string": string, "library_name": library_name}
        out.append(record)
    return sorted(out, key=lambda r: (r["value"], str(r["name"]), VERSIONS.index(str(r["first_version"]))))


def raw(per_release: list[ReleaseCodes]) -> dict[str, object]:
    releases = [
        {"cuda": r.release.cuda, "package": r.release.package, "version": r.release.version,
         "wheel": r.release.wheel, "sha256": r.release.sha256, "headers": r.files}
        for r in per_release
    ]  # fmt: skip
    source = {
        "index": INDEX,
        "releases": releases,
        "versions": list(VERSIONS),
        "what": f"enum cudaError in {RUNTIME_HEADER}, enum cudaError_enum (CUresult) in {DRIVER_HEADER}, "
        "cudaGetErrorName and cudaGetErrorString of libcudart.so, per release",
        "extractor": "tools/cuda_catalogue_extract.py",
    }
    return {"source": source, "runtime": records(per_release, "runtime"), "driver": records(per_release, "driver")}


def dumps(value: object) -> str:
    return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def extracted(wheels: Path) -> dict[Path, str]:
    """What the extraction writes: each file's text."""
    return {RAW: dumps(raw([read_release(wheels, release) for release in RELEASES]))}


def have_wheels(wheels: Path) -> bool:
    return all((wheels / r.wheel).is_file() for r in RELEASES)


def download(wheels: Path) -> None:
    """``pip download`` of each pinned wheel not yet in ``wheels`` (the hash is checked when read)."""
    wheels.mkdir(parents=True, exist_ok=True)
    for r in RELEASES:
        if not (wheels / r.wheel).is_file():
            platform = r.wheel.rsplit("-", 1)[1].removesuffix(".whl").split(".")[0]
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform", platform,
                 "--python-version", "3.10", "-d", str(wheels), f"{r.package}=={r.version}"],
                check=True,
            )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS, help="the directory of the pinned wheels")
    parser.add_argument("--download", action="store_true", help="pip download the wheels the directory lacks")
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = parser.parse_args(argv)
    if args.download:
        download(args.wheels)
    if not have_wheels(args.wheels):
        print(f"the pinned CUDA runtime wheels are not all in {args.wheels} (--download fetches them)", file=sys.stderr)
        return 2
    texts = extracted(args.wheels)
    status = write_or_check(texts, args.check)
    if args.check:
        return status
    got = json.loads(texts[RAW])
    print(f"{len(got['runtime'])} cudaError_t records, {len(got['driver'])} CUresult records over {len(RELEASES)} "
          f"releases ({VERSIONS[0]} to {VERSIONS[-1]})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
