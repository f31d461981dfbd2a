"""The NCCL catalogue: generated from NCCL's sources, every entry classed with an action, real lines found.

The two stages are checked against what is committed: the build (pure Python) on the pinned raw inputs gives the
shipped catalogue byte for byte, and the extraction, where a mirror of NVIDIA/nccl is at hand, gives the raw inputs.
The known lines are NCCL's WARN texts as its format strings print them (each test names the file it comes from).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import sys
from pathlib import Path

import pytest

from conformance.common.bounded_parse import toml_table
from conformance.diagnose.catalogue import (
    RESULTS_FILE,
    WARNINGS_FILE,
    class_titles,
    nccl_result,
    nccl_warning,
    result_entries,
    warning_entries,
)
from conformance.verdict.job_causes import CLASSES
from conformance.verdict.nccl_log import warning_text
from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "benchmarks"))

import nccl_catalogue_build as build  # noqa: E402
import nccl_catalogue_extract as extract  # noqa: E402
from nccl_catalogue_speed import render  # noqa: E402

# The classes the catalogue adds where conformance/verdict/job_causes.py has none that fits.
CATALOGUE_ONLY = {"cuda_error", "invalid_usage", "nccl_setting", "net_plugin", "proxy_network", "nccl_internal"}
ACTIONS = (
    "check", "set", "unset", "run", "rerun", "free", "raise", "give", "find", "fix", "load", "select", "name",
    "start", "look", "correct", "test", "wait", "read", "upgrade", "install", "compare",
)  # fmt: skip
MIRROR = Path(os.environ.get("NCCL_MIRROR", extract.DEFAULT_MIRROR))


def is_action(fix: str) -> bool:
    first = fix.split(None, 1)[0].lower() if fix.strip() else ""
    return first in ACTIONS or "`" in fix or bool(re.search(rf"\b(?:{'|'.join(ACTIONS)})\b", fix))


def test_every_warning_entry_has_a_class_an_action_and_its_provenance() -> None:
    known = {c.key for c in CLASSES} | CATALOGUE_ONLY
    entries = warning_entries()
    assert len(entries) > 800, len(entries)  # 851 formats from 2.18.3-1 to 2.30.7-1
    for entry in entries:
        assert entry.failure_class in known and entry.title in class_titles().values(), entry
        assert entry.fix.split(None, 1)[0] in ACTIONS and "error occurred" not in entry.fix, entry
        p = entry.provenance
        assert p.file.startswith("src/") and p.line > 0, entry
        assert extract.TAGS.index(p.first_version) <= extract.TAGS.index(p.last_version), entry


def test_every_result_code_has_a_class_an_action_and_its_provenance() -> None:
    names = [entry.name for entry in result_entries()]
    for name in ("ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError", "ncclInvalidArgument",
                 "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress", "ncclTimeout", "default"):  # fmt: skip
        assert name in names
    assert "ncclSuccess" not in names and "ncclNumResults" not in names  # no failures
    for entry in result_entries():
        assert entry.failure_class in {c.key for c in CLASSES} | CATALOGUE_ONLY, entry
        assert is_action(entry.fix) and entry.string and entry.provenance.file == "src/init.cc", entry
        assert entry.provenance.first_version in extract.TAGS and entry.provenance.last_version in extract.TAGS
    timeout = next(e for e in result_entries() if e.name == "ncclTimeout")
    assert (timeout.value, timeout.provenance.first_version) == (8, "v2.30.3-1")  # new in 2.30


def test_the_build_on_the_pinned_inputs_gives_the_shipped_catalogue_byte_for_byte() -> None:
    texts = build.built()
    assert set(texts) == {WARNINGS_FILE, RESULTS_FILE}
    for path, text in texts.items():
        assert path.read_text() == text, f"{path.name} is stale: run python tools/nccl_catalogue_build.py"


def test_the_build_prints_the_entries_per_class(capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["--check"]) == 0
    printed = capsys.readouterr().out
    counts: dict[str, int] = {}
    for entry in json.loads(WARNINGS_FILE.read_text())["entries"]:
        counts[entry["class"]] = counts.get(entry["class"], 0) + 1
    assert printed.startswith(f"{sum(counts.values())} NCCL WARN formats")
    for cls, n in counts.items():
        assert re.search(rf"^  {cls} +{n} ", printed, re.M), (cls, n, printed)
    assert "up to date" in printed


@pytest.mark.skipif(not (MIRROR / "HEAD").is_file(), reason=f"no bare mirror of NVIDIA/nccl at {MIRROR} (NCCL_MIRROR)")
def test_the_extraction_from_the_mirror_gives_the_pinned_inputs() -> None:
    for path, text in extract.extracted(MIRROR).items():
        assert path.read_text() == text, f"{path.name} differs: run python tools/nccl_catalogue_extract.py"


def test_the_catalogues_are_package_data() -> None:
    package_data = toml_table((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for path in (WARNINGS_FILE, RESULTS_FILE):
        inside = path.relative_to(REPO / "conformance" / "diagnose").as_posix()
        assert any(fnmatch.fnmatch(inside, glob) for glob in package_data["conformance.diagnose"]), inside


# (WARN text as NCCL prints it, the format it comes from, its file, the class)
KNOWN_LINES = (
    # src/include/cudawrap.h CUCHECK (>= 2.19), as the cuMem allocations of include/alloc.h print it
    ("Cuda failure 2 'out of memory'", "Cuda failure %d '%s'", "src/include/cudawrap.h", "oom"),
    # src/include/checks.h CUDACHECK
    ("Cuda failure 'out of memory'", "Cuda failure '%s'", "src/include/checks.h", "oom"),
    ("Cuda failure 'peer access is not supported between these two devices'", "Cuda failure '%s'",
     "src/include/checks.h", "transport"),
    # src/plugin/net.cc ncclNetPluginInit (2.27 and later; 2.28.9 included)
    ("Failed to initialize any NET plugin", "Failed to initialize any NET plugin", "src/plugin/net.cc", "net_plugin"),
    # src/init.cc initTransportsRank
    ("Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000",
     "Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx", "src/init.cc", "barrier_device"),
    # src/transport/net_ib.cc (2.18-2.19): the completion of a work request with an error status
    ("NET/IB : Got completion from peer 10.0.0.2<44562> with error 12, opcode 0, len 0, vendor err 129 (Send) "
     "localGid ::ffff:10.0.0.1 remoteGid ::ffff:10.0.0.2",
     "NET/IB : Got completion from peer %s with error %d, opcode %d, len %d, vendor err %d (%s)%s%s%s%s",
     "src/transport/net_ib.cc", "ib_network"),
    # src/transport/net_ib/p2p.cc (2.27 and later)
    ("NET/IB: Got completion from peer 10.0.0.2<44562> with status=transport retry counter exceeded(12) "
     "opcode=SEND(0) vendor_err=129 localGid fe80::1 remoteGid fe80::2 hca mlx5_0",
     "NET/IB: Got completion from peer %s with status=%s(%d) opcode=%s(%d) vendor_err=%u %s%s%s%s hca %s",
     "src/transport/net_ib/p2p.cc", "ib_network"),
    # src/misc/ibvwrap.cc IBV_INT_CHECK_RET_ERRNO: "Call to " name " failed with error %s"
    ("Call to ibv_reg_mr failed with error Cannot allocate memory", "Call to ${name} failed with error %s",
     "src/misc/ibvwrap.cc", "ib_network"),
    # src/misc/shmutils.cc ncclShmOpen (2.18-2.21) and src/os/linux.cc (2.29 and later, with the errno)
    ("Error: failed to extend /dev/shm/nccl-WU88OE to 9637892 bytes", "Error: failed to extend %s to %ld bytes",
     "src/misc/shmutils.cc", "host_limit"),
    ("Error: failed to extend /dev/shm/nccl-WU88OE to 9637892 bytes, error: No space left on device (28)",
     "Error: failed to extend %s to %ld bytes, error: %s (%d)", "src/os/linux.cc", "host_limit"),
    # src/misc/socket.cc socketProgress
    ("socketProgress: Connection closed by remote peer node2.cluster<41234>",
     "socketProgress: Connection closed by remote peer %s", "src/misc/socket.cc", "rank_error"),
    # src/transport/nvls.cc nvlsGroupBindMem: its first line (the rest of the format is on the log's next lines)
    ("Failed to bind NVLink SHARP (NVLS) Multicast memory of size 1073741824 : CUDA error 801 'operation not "
     "supported'.", "Failed to bind NVLink SHARP (NVLS) Multicast memory of size %ld : CUDA error %d '%s'.",
     "src/transport/nvls.cc", "machine_fault"),
)  # fmt: skip


@pytest.mark.parametrize(("text", "fmt", "file", "cls"), KNOWN_LINES, ids=lambda v: str(v)[:40])
def test_known_lines_find_their_format(text: str, fmt: str, file: str, cls: str) -> None:
    entry = nccl_warning(text)
    assert entry is not None, text
    assert entry.format.startswith(fmt) and entry.provenance.file == file and entry.failure_class == cls, entry
    assert is_action(entry.fix), entry.fix
    line = f"node3:41234:41290 [5] {file.removeprefix('src/')}:112 NCCL WARN {text}"  # as debug.cc writes it
    assert nccl_warning(warning_text(line) or "") == entry


def test_the_failed_verb_in_a_verbs_line_gets_its_fix() -> None:
    entry = nccl_warning("Call to ibv_reg_mr failed with error Cannot allocate memory")
    assert entry is not None and "ulimit -l" in entry.fix


@pytest.mark.parametrize("text", ["", "   ", "this is no NCCL warning", "Cuda", "NET/IB", "hello %s world"])
def test_a_text_no_format_prints_finds_nothing(text: str) -> None:
    assert nccl_warning(text) is None


def test_every_format_finds_its_own_text_or_a_more_specific_format() -> None:
    raw = {e["format"]: e for e in json.loads(WARNINGS_FILE.read_text())["entries"]}
    lost = []
    for entry in warning_entries():
        if raw[entry.format]["matchable"]:
            found = nccl_warning(render(entry))
            if found is None or (found.format != entry.format and found.literal < entry.literal):
                lost.append((entry.format, found and found.format))
    assert not lost, lost


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("ncclRemoteError", "ncclRemoteError"),
        ("remote process exited or there was a network error", "ncclRemoteError"),
        ("NCCL error: remote process exited or there was a network error, NCCL version 2.20.5", "ncclRemoteError"),
        ("ncclUnhandledCudaError: Call to CUDA function failed.", "ncclUnhandledCudaError"),
        ("unhandled cuda error (run with NCCL_DEBUG=INFO for details)", "ncclUnhandledCudaError"),
        (
            "NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, invalid usage (run with NCCL_DEBUG=WARN "
            "for details), NCCL version 2.14.3",
            "ncclInvalidUsage",
        ),
        ("invalid usage", "ncclInvalidUsage"),
        ("unhandled system error (run with NCCL_DEBUG=INFO for details)", "ncclSystemError"),
        ("internal error - please report this issue to the NCCL developers", "ncclInternalError"),
        ("NCCL operation in progress", "ncclInProgress"),
        ("timeout", "ncclTimeout"),
        ("unknown result code", "default"),
    ],
)
def test_result_codes_are_found_by_name_and_by_string(text: str, name: str) -> None:
    entry = nccl_result(text)
    assert entry is not None and entry.name == name, (text, entry)


@pytest.mark.parametrize("text", ["", "all good", "Watchdog caught collective operation timeout: WorkNCCL(...)",
                                  "Call to ibv_reg_mr failed with error Invalid argument"])  # fmt: skip
def test_texts_that_only_contain_a_short_string_name_no_result(text: str) -> None:
    assert nccl_result(text) is None
