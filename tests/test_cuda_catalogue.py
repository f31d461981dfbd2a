"""The CUDA error catalogue: generated from NVIDIA's headers and runtime library, every code classed with an action.

The two stages are checked against what is committed: the build (pure Python) on the pinned raw input gives the
shipped catalogue byte for byte, and the extraction, where the pinned CUDA runtime wheels are at hand, gives the raw
input.  The codes are checked against CUDA's own definitions (``driver_types.h``, ``cuda.h``), and the lookup by the
texts logs print.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys

import pytest

from conformance.common.bounded_parse import toml_table
from conformance.verdict import cuda_errors
from conformance.verdict.cuda_errors import CATALOGUE, catalogue_errors, cuda_error, cuda_error_in
from conformance.verdict.job_causes import CLASSES
from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))

import cuda_catalogue_build as build  # noqa: E402
import cuda_catalogue_extract as extract  # noqa: E402

KINDS = (cuda_errors.MACHINE, cuda_errors.VERSION, cuda_errors.OOM, cuda_errors.TRANSPORT, cuda_errors.RANK)
ACTIONS = ("check", "free", "compare", "upgrade", "install", "remove", "test", "rerun", "find", "unset")
WHEELS = extract.DEFAULT_WHEELS


def test_every_entry_has_a_kind_an_action_and_its_provenance() -> None:
    entries = catalogue_errors()
    assert len(entries) > 230, len(entries)  # 138 cudaError_t and 105 CUresult failure codes, CUDA 11.8 to 13.5
    raw = {e["name"]: e for e in json.loads(CATALOGUE.read_text())["entries"]}
    for error in entries:
        assert error.kind in KINDS and error.meaning and error.description, error
        assert error.fix.split(None, 1)[0] in ACTIONS and ("`" in error.fix or "=" in error.fix), error.fix
        p = raw[error.name]["provenance"]
        assert p["file"] == ("driver_types.h" if error.api == "runtime" else "cuda.h") and p["line"] > 0, error
        assert extract.VERSIONS.index(p["first_version"]) <= extract.VERSIONS.index(p["last_version"]), error
        assert raw[error.name]["class"] in {c.key for c in CLASSES}, error
    assert {e.api for e in entries} == {"runtime", "driver"}
    assert not [e for e in entries if e.name in ("cudaSuccess", "CUDA_SUCCESS")]  # no failures


def test_the_build_on_the_pinned_input_gives_the_shipped_catalogue_byte_for_byte() -> None:
    for path, text in build.built().items():
        assert path == CATALOGUE and path.read_text() == text, f"{path.name} is stale: run cuda_catalogue_build.py"


def test_the_build_prints_the_codes_per_api_and_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["--check"]) == 0
    printed = capsys.readouterr().out
    runtime = [e for e in catalogue_errors() if e.api == "runtime"]
    assert printed.startswith(f"{len(catalogue_errors())} CUDA error codes, CUDA 11.8 to 13.5")
    assert f"runtime   {len(runtime)}  " in printed and "up to date" in printed


@pytest.mark.skipif(not extract.have_wheels(WHEELS), reason=f"the pinned CUDA runtime wheels are not in {WHEELS}")
def test_the_extraction_from_the_wheels_gives_the_pinned_input() -> None:
    for path, text in extract.extracted(WHEELS).items():
        assert path.read_text() == text, f"{path.name} differs: run python tools/cuda_catalogue_extract.py"


def test_the_catalogue_is_package_data() -> None:
    package_data = toml_table((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    inside = CATALOGUE.relative_to(REPO / "conformance" / "verdict").as_posix()
    assert any(fnmatch.fnmatch(inside, glob) for glob in package_data["conformance.verdict"]), inside


def test_every_name_a_rule_gives_is_a_code_and_every_rule_classes_one() -> None:
    names = {e.name for e in catalogue_errors()}
    for rule in build.RULES:
        assert set(rule.names) <= names, (rule.name, set(rule.names) - names)
    used = {build.rule_for(name).name for name in names}
    assert used == {rule.name for rule in build.RULES}, {rule.name for rule in build.RULES} - used


def test_a_runtime_code_and_the_driver_code_of_its_number_are_classed_alike() -> None:
    driver = {e.code: e for e in catalogue_errors() if e.api == "driver"}
    for error in (e for e in catalogue_errors() if e.api == "runtime" and e.code in driver):
        assert (error.kind, error.fix) == (driver[error.code].kind, driver[error.code].fix), (error, driver[error.code])


# (number, runtime name, driver name or "", kind) as driver_types.h and cuda.h define them
KNOWN = (
    (2, "cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY", "oom"),
    (35, "cudaErrorInsufficientDriver", "", "version"),
    (46, "cudaErrorDevicesUnavailable", "CUDA_ERROR_DEVICE_UNAVAILABLE", "machine"),
    (100, "cudaErrorNoDevice", "CUDA_ERROR_NO_DEVICE", "machine"),
    (101, "cudaErrorInvalidDevice", "CUDA_ERROR_INVALID_DEVICE", "machine"),
    (209, "cudaErrorNoKernelImageForDevice", "CUDA_ERROR_NO_BINARY_FOR_GPU", "version"),
    (214, "cudaErrorECCUncorrectable", "CUDA_ERROR_ECC_UNCORRECTABLE", "machine"),
    (217, "cudaErrorPeerAccessUnsupported", "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "transport"),
    (220, "cudaErrorNvlinkUncorrectable", "CUDA_ERROR_NVLINK_UNCORRECTABLE", "machine"),
    (221, "cudaErrorJitCompilerNotFound", "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "version"),
    (222, "cudaErrorUnsupportedPtxVersion", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "version"),
    (700, "cudaErrorIllegalAddress", "CUDA_ERROR_ILLEGAL_ADDRESS", "rank"),
    (714, "cudaErrorHardwareStackError", "CUDA_ERROR_HARDWARE_STACK_ERROR", "machine"),
    (716, "cudaErrorMisalignedAddress", "CUDA_ERROR_MISALIGNED_ADDRESS", "rank"),
    (719, "cudaErrorLaunchFailure", "CUDA_ERROR_LAUNCH_FAILED", "rank"),
    (802, "cudaErrorSystemNotReady", "CUDA_ERROR_SYSTEM_NOT_READY", "machine"),
    (803, "cudaErrorSystemDriverMismatch", "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "version"),
    (804, "cudaErrorCompatNotSupportedOnDevice", "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "version"),
    (999, "cudaErrorUnknown", "CUDA_ERROR_UNKNOWN", "machine"),
)


@pytest.mark.parametrize(("code", "runtime", "driver", "kind"), KNOWN, ids=lambda v: str(v))
def test_known_codes_map_as_cuda_defines_them(code: int, runtime: str, driver: str, kind: str) -> None:
    error = cuda_error(code)
    assert error is not None and (error.name, error.api, error.kind) == (runtime, "runtime", kind), error
    if driver:
        own = cuda_error(code, "driver")
        assert own is not None and (own.name, own.kind) == (driver, kind), own
        assert cuda_error_in(driver) == own


# What the hand-written table of conformance/verdict/cuda_errors.py (before the catalogue) said of each code's kind:
# the catalogue keeps every one.
HAND_TABLE_KINDS = {
    2: "oom", 3: "machine", 35: "version", 46: "machine", 98: "version", 100: "machine", 101: "machine",
    209: "version", 214: "machine", 217: "transport", 220: "machine", 222: "version", 401: "rank", 700: "rank",
    719: "rank", 801: "machine", 802: "machine", 803: "version", 804: "version", 999: "machine",
}  # fmt: skip


def test_the_catalogue_keeps_the_hand_tables_kinds() -> None:
    got = {code: error.kind for code in HAND_TABLE_KINDS if (error := cuda_error(code)) is not None}
    assert got == HAND_TABLE_KINDS


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("CUDA error 700", "cudaErrorIllegalAddress"),
        ("cudaErrorIllegalAddress", "cudaErrorIllegalAddress"),
        ("an illegal memory access was encountered", "cudaErrorIllegalAddress"),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "cudaErrorIllegalAddress"),
        ("CUDA driver error 802", "CUDA_ERROR_SYSTEM_NOT_READY"),  # NCCL's misc/cudawrap.cc
        ("CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_ADDRESS"),
        ("Cuda failure 2 'out of memory'", "cudaErrorMemoryAllocation"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB", "cudaErrorMemoryAllocation"),
        ("Test CUDA failure common.cu:941 'system not yet initialized'", "cudaErrorSystemNotReady"),
        ("uncorrectable NVLink error detected during the execution", "cudaErrorNvlinkUncorrectable"),
        ("the provided PTX was compiled with an unsupported toolchain.", "cudaErrorUnsupportedPtxVersion"),
        ("operation not permitted when stream is capturing", "cudaErrorStreamCaptureUnsupported"),  # the longest
        (
            "CUDA error: GPU fabric is not ready within the probe wait budget; application may retry (see "
            "CUDA_FABRIC_INIT_TIMEOUT_MS)",
            "cudaErrorFabricNotReady",
        ),  # new in 13.4
        # texts short or glibc's too: only where CUDA's printers put them
        ("RuntimeError: CUDA error: invalid argument", "cudaErrorInvalidValue"),
        ("NCCL WARN Cuda failure 'unknown error'", "cudaErrorUnknown"),
        ("Test CUDA failure common.cu:12 'misaligned address'", "cudaErrorMisalignedAddress"),
        ("Failed to bind NVLink SHARP memory : CUDA error 801 'operation not supported'.", "cudaErrorNotSupported"),
    ],
)
def test_a_name_a_number_or_a_text_finds_its_code(text: str, name: str) -> None:
    error = cuda_error_in(text)
    assert error is not None and error.name == name, (text, error)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "all good",
        "OSError: [Errno 22] Invalid argument: '/dev/shm/x'",
        "PermissionError: [Errno 1] Operation not permitted",
        "OSError: [Errno 95] Operation not supported",
        "strerror: Unknown error 524",
        "exit code 700",
        "cudaErrorNoSuchThing",
    ],
)
def test_an_os_error_or_a_bare_number_names_no_cuda_error(text: str) -> None:
    assert cuda_error_in(text) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's strerror texts")
def test_every_text_glibc_prints_too_is_read_only_where_cuda_prints_it() -> None:
    errno_texts = {os.strerror(n).lower() for n in range(1, 134)}
    for error in catalogue_errors():
        for text, alone in error.texts:
            if text.lower() in errno_texts or text.lower().startswith("unknown error"):
                assert not alone and text.lower() in build.ERRNO_TEXTS, (error.name, text)


def test_the_header_reader_takes_names_numbers_and_first_sentences() -> None:
    header = """
enum __device_builtin__ cudaError
{
    /**
     * The API call returned with no errors. In the case of query calls, this
     * also means that the operation being queried is complete (see
     * ::cudaEventQuery() and ::cudaStreamQuery()).
     */
    cudaSuccess                           =      0,
    /**
     * \\deprecated
     * This error return is deprecated as of CUDA 5.0. It is no longer an error
     * to call ::cudaProfilerStart() when profiling is already enabled, e.g. twice.
     */
    cudaErrorProfilerAlreadyStarted       =     7,
    /**
     * This indicates that an unknown internal error has occurred.
     */
    cudaErrorUnknown                      =    999
    , cudaErrorApiFailureBase               =  10000
};
"""
    got = [(c.name, c.value, c.description, c.deprecated) for c in extract.codes(header, "runtime")]
    assert got == [
        ("cudaSuccess", 0, "The API call returned with no errors.", False),
        ("cudaErrorProfilerAlreadyStarted", 7, "This error return is deprecated as of CUDA 5.0.", True),
        ("cudaErrorUnknown", 999, "This indicates that an unknown internal error has occurred.", False),
        ("cudaErrorApiFailureBase", 10000, "", False),
    ]
    assert extract.first_sentence("It failed, e.g. on a GPU. More.") == "It failed, e.g. on a GPU."
