"""A fake ``libnvidia-ml.so.1`` for the real nvidia-ml-py (``pynvml``) to call.

Only what cannot run here is faked: the C library.  :func:`install` puts a
:class:`FakeNvmlLibrary` where ``pynvml`` keeps its loaded library (``pynvml.nvmlLib``) and empties
its function-pointer cache, so the real wrappers, ``_nvmlGetFunctionPointer``, ``_nvmlCheckReturn``,
``NVMLError`` and its subclass dispatch by code, and the str conversions all run as on a GPU host.

Each symbol takes its arguments exactly as the wrappers pass them to ctypes (``fn(c_index,
byref(device))``), refuses what ctypes would refuse (``ctypes.ArgumentError``, e.g. nvidia-ml-py's
``NVML_P2P_CAPS_INDEX_READ = 0,`` tuple), writes its outputs through the pointers and returns an NVML
return code.  An argument of the wrong C type, which a real library would misread silently, raises
:class:`FakeNvmlMisuse`.  Device handles are real ``c_nvmlDevice_t`` pointers whose address names the
GPU or MIG instance; they are never dereferenced.  A symbol this driver lacks raises AttributeError,
which ``pynvml`` turns into ``NVMLError_FunctionNotFound``.

Machines are plain data (:class:`FakeMachine`, JSON round trip), so a pytest subprocess can load one:
``-p fake_nvml`` with ``FAKE_NVML_MACHINE`` holding ``machine.to_json()`` installs it before the
conformance plugin discovers the topology.  The numeric values below are nvml.h's (ABI), checked
against nvidia-ml-py's names by the tests.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pynvml
import pytest

MACHINE_VARIABLE = "FAKE_NVML_MACHINE"
LIBRARY_NAME = "libnvidia-ml.so.1"

# nvmlReturn_t
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_GPU_IS_LOST = 15
ERROR_UNKNOWN = 999
ERROR_TEXT = {
    ERROR_UNINITIALIZED: "Uninitialized",
    ERROR_INVALID_ARGUMENT: "Invalid Argument",
    ERROR_NOT_SUPPORTED: "Not Supported",
    ERROR_NO_PERMISSION: "Insufficient Permissions",
    ERROR_NOT_FOUND: "Not Found",
    ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    ERROR_TIMEOUT: "Timeout",
    ERROR_GPU_IS_LOST: "GPU is lost",
}
# nvmlGpuTopologyLevel_t
TOPOLOGY_INTERNAL, TOPOLOGY_SINGLE, TOPOLOGY_MULTIPLE, TOPOLOGY_HOSTBRIDGE = 0, 10, 20, 30
TOPOLOGY_NODE, TOPOLOGY_SYSTEM = 40, 50
# nvmlGpuP2PCapsIndex_t and nvmlGpuP2PStatus_t
CAPS_READ, CAPS_WRITE, CAPS_NVLINK, CAPS_ATOMICS, CAPS_PCI = 0, 1, 2, 3, 4
P2P_OK, P2P_CHIPSET_NOT_SUPPORTED, P2P_GPU_NOT_SUPPORTED, P2P_IOH_TOPOLOGY_NOT_SUPPORTED = 0, 1, 2, 3
P2P_DISABLED_BY_REGKEY, P2P_NOT_SUPPORTED, P2P_UNKNOWN = 4, 5, 6
# nvmlIntNvLinkDeviceType_t, nvmlEnableState_t, MIG modes
LINK_TO_GPU, LINK_TO_IBMNPU, LINK_TO_SWITCH = 0x00, 0x01, 0x02
FEATURE_DISABLED, FEATURE_ENABLED = 0, 1
MIG_DISABLE, MIG_ENABLE = 0, 1
# nvmlComputeMode_t, nvmlGpuFabricState_t, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
COMPUTE_DEFAULT, COMPUTE_PROHIBITED, COMPUTE_EXCLUSIVE_PROCESS = 0, 2, 3
FABRIC_NOT_SUPPORTED, FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_COMPLETED = 0, 1, 2, 3
MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC = 1, 0
NVLINK_VERSION_3_0, NVLINK_VERSION_4_0 = 4, 6
CLOCKS_GPU_IDLE, CLOCKS_HW_SLOWDOWN, CLOCKS_HW_THERMAL, CLOCKS_HW_POWER_BRAKE = 0x1, 0x8, 0x40, 0x80
EVENT_XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
EVENT_SET_ADDRESS = 0x7F3B00000000  # the one event set this fake hands out
MAX_MIG_DEVICES = 7  # what an A100 or H100 reports with MIG on

# Queries that name a GPU; they still answer for a GPU that is lost (its other queries fail).
IDENTITY_SYMBOLS = frozenset({"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
                              "nvmlDeviceGetPciInfo_v3"})  # fmt: skip
HANDLE_BASE = 0x7F3A00000000
HANDLE_STRIDE = 0x1000  # per GPU; MIG instances are HANDLE_BASE + gpu * stride + 0x10 * (slot + 1)


class FakeNvmlMisuse(TypeError):
    """An argument a real libnvidia-ml would misread (wrong C type, wrong count): a bug in the caller."""


# --------------------------------------------------------------------------------------------
# the machine: plain data
# --------------------------------------------------------------------------------------------

NvLink = tuple[str, int] | None  # (far end's bus id, LINK_TO_*), or None: the link is down


@dataclass
class FakeMig:
    uuid: str
    name: str
    memory_mib: int


@dataclass
class FakeGpu:
    uuid: str
    name: str
    bus_id: str  # as NVML spells it: 00000000:1B:00.0
    memory_mib: int
    numa: int | None  # None: nvmlDeviceGetNumaNodeId is not supported (older drivers)
    capability: tuple[int, int] = (9, 0)  # CUDA compute capability (major, minor): H100's
    nvlinks: list[NvLink] | None = None  # None: no NVLink at all (NotSupported on link 0)
    mig: tuple[int, int] | None = (MIG_DISABLE, MIG_DISABLE)  # (current, pending); None: no MIG
    migs: list[FakeMig | None] = field(default_factory=list)  # MIG instances by slot
    # health (None: the query is NotSupported on this GPU)
    pcie: tuple[int, int, int, int] | None = (16, 16, 4, 4)  # width, max width, generation, max generation
    ecc_uncorrected: int | None = 0  # volatile uncorrectable ECC errors
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # corrected, uncorrected, pending, failed
    retired_pages_pending: int | None = None  # NotSupported from A100 on (row remapping replaced it)
    fabric: tuple[int, int] | None = None  # (state, status) with Fabric Manager; None: no NVSwitch fabric
    persistence: int = FEATURE_ENABLED
    compute_mode: int = COMPUTE_DEFAULT
    clock_reasons: int = CLOCKS_GPU_IDLE  # nvmlClocksEventReason* bits
    nvlink_version: int = NVLINK_VERSION_4_0  # answered where the GPU has NVLinks
    processes: list[tuple[int, int]] = field(default_factory=list)  # compute processes: (pid, MiB)
    # per NVLink: [replay, recovery, CRC flit, CRC data, ECC data] error counts (nvmlNvLinkErrorCounter_t order);
    # a None count is NotSupported (H100: CRC data), as is the whole list's None
    nvlink_errors: list[list[int | None]] | None = None
    pcie_replays: int | None = 0


@dataclass(frozen=True)
class Failure:
    """``symbol`` returns ``code`` for calls about ``gpu`` (and ``peer``); None matches any."""

    symbol: str
    code: int
    gpu: int | None = None  # NVML index: the first device argument, or the index asked for
    peer: int | None = None  # the second device argument


@dataclass
class FakeMachine:
    gpus: list[FakeGpu]
    ancestors: list[list[int]]  # [i][j] -> TOPOLOGY_*
    p2p: list[list[list[int]]]  # [i][j][caps index] -> P2P_*
    driver: str = "550.54.15"
    cuda: int = 12040
    init_error: int = SUCCESS  # what nvmlInitWithFlags returns
    missing: list[str] = field(default_factory=list)  # symbols this driver's library lacks
    failures: list[Failure] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)  # GPUs whose every non-identity query fails
    xid_events: list[tuple[int, int]] = field(default_factory=list)  # (GPU index, Xid) an event set delivers next

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FakeMachine:
        data = json.loads(text)
        gpus = [_gpu_from_dict(gpu) for gpu in data.pop("gpus")]
        failures = [Failure(**failure) for failure in data.pop("failures")]
        return cls(gpus=gpus, failures=failures, **data)


def _gpu_from_dict(data: dict[str, Any]) -> FakeGpu:
    nvlinks = data.pop("nvlinks")
    mig = data.pop("mig")
    for name in ("pcie", "remapped_rows", "fabric", "capability"):  # tuples, as JSON lists
        data[name] = None if data.get(name) is None else tuple(data[name])
    data["processes"] = [tuple(p) for p in data.get("processes", [])]
    return FakeGpu(
        **{key: value for key, value in data.items() if key != "migs"},
        nvlinks=None if nvlinks is None else [None if link is None else (link[0], link[1]) for link in nvlinks],
        mig=None if mig is None else (mig[0], mig[1]),
        migs=[None if m is None else FakeMig(**m) for m in data["migs"]],
    )


def matrix(count: int, value: Callable[[int, int], Any]) -> list[list[Any]]:
    return [[value(i, j) for j in range(count)] for i in range(count)]


def p2p_matrix(count: int, status: Callable[[int, int, int], int]) -> list[list[list[int]]]:
    caps = (CAPS_READ, CAPS_WRITE, CAPS_NVLINK, CAPS_ATOMICS, CAPS_PCI)
    return matrix(count, lambda i, j: [status(i, j, cap) for cap in caps])


# --------------------------------------------------------------------------------------------
# ctypes-level argument handling
# --------------------------------------------------------------------------------------------

_CArgObject = type(ctypes.byref(ctypes.c_int()))
_CTYPES_PASSABLE = (bytes, str, type(None), ctypes._SimpleCData, ctypes._Pointer, ctypes.Array, ctypes.Structure,
                    _CArgObject)  # fmt: skip
_LONG_RANGE = range(-(2**63), 2**64)


def _ctypes_would_pass(position: int, value: object) -> None:
    """What ctypes does with an argument of a function without argtypes: convert it or refuse it."""
    if isinstance(value, int):
        if value not in _LONG_RANGE:
            raise ctypes.ArgumentError(f"argument {position}: OverflowError: int too long to convert")
        return
    if not isinstance(value, _CTYPES_PASSABLE):
        raise ctypes.ArgumentError(f"argument {position}: TypeError: Don't know how to convert parameter {position}")


Param = Callable[[object], Any]  # checks one C argument, returns what the implementation works with


def _device(value: object) -> int:
    if not isinstance(value, pynvml.c_nvmlDevice_t):
        raise FakeNvmlMisuse(f"expected an nvmlDevice_t, got {value!r}")
    return ctypes.cast(value, ctypes.c_void_p).value or 0


def _uint(value: object) -> int:
    if isinstance(value, ctypes.c_uint):
        return value.value
    if isinstance(value, int):
        return value & 0xFFFFFFFF  # C converts to unsigned int
    raise FakeNvmlMisuse(f"expected an unsigned int, got {value!r}")


def _char_p(value: object) -> bytes:
    if not isinstance(value, ctypes.c_char_p) or value.value is None:
        raise FakeNvmlMisuse(f"expected a char pointer, got {value!r}")
    return value.value


def _buffer(value: object) -> ctypes.Array[ctypes.c_char]:
    if not (isinstance(value, ctypes.Array) and value._type_ is ctypes.c_char):
        raise FakeNvmlMisuse(f"expected a char buffer, got {value!r}")
    return value


def _out(*types: type) -> Param:
    """A pointer argument (``byref(x)``) to one of ``types``; the implementation gets ``x``."""

    def target(value: object) -> Any:
        pointee = getattr(value, "_obj", None)
        if not isinstance(value, _CArgObject) or not isinstance(pointee, types):
            raise FakeNvmlMisuse(f"expected byref() of {' or '.join(t.__name__ for t in types)}, got {value!r}")
        return pointee

    return target


def _process_array(value: object) -> Any:
    """None (the first call asks for the count) or an array of c_nvmlProcessInfo_v3_t."""
    if value is None or (isinstance(value, ctypes.Array) and value._type_ is pynvml.c_nvmlProcessInfo_v3_t):
        return value
    raise FakeNvmlMisuse(f"expected None or an array of c_nvmlProcessInfo_v3_t, got {value!r}")


def _event_set(value: object) -> int:
    if not isinstance(value, pynvml.c_nvmlEventSet_t):
        raise FakeNvmlMisuse(f"expected an nvmlEventSet_t, got {value!r}")
    return ctypes.cast(value, ctypes.c_void_p).value or 0


def _ulonglong(value: object) -> int:
    if not isinstance(value, ctypes.c_ulonglong):
        raise FakeNvmlMisuse(f"expected an unsigned long long, got {value!r}")
    return value.value


_DEVICE_OUT = _out(pynvml.c_nvmlDevice_t)
_UINT_OUT = _out(ctypes.c_uint)
_PCI_OUT = _out(pynvml.nvmlPciInfo_t)

# The C prototypes (nvml.h) of every symbol the fake has.
SIGNATURES: dict[str, tuple[Param, ...]] = {
    "nvmlInitWithFlags": (_uint,),
    "nvmlShutdown": (),
    "nvmlErrorString": (_uint,),
    "nvmlSystemGetDriverVersion": (_buffer, _uint),
    "nvmlSystemGetCudaDriverVersion": (_out(ctypes.c_int),),
    "nvmlDeviceGetCount_v2": (_UINT_OUT,),
    "nvmlDeviceGetHandleByIndex_v2": (_uint, _DEVICE_OUT),
    "nvmlDeviceGetHandleByUUID": (_char_p, _DEVICE_OUT),
    "nvmlDeviceGetUUID": (_device, _buffer, _uint),
    "nvmlDeviceGetName": (_device, _buffer, _uint),
    "nvmlDeviceGetPciInfo_v3": (_device, _PCI_OUT),
    "nvmlDeviceGetNumaNodeId": (_device, _out(ctypes.c_uint, ctypes.c_int)),
    "nvmlDeviceGetCudaComputeCapability": (_device, _out(ctypes.c_int), _out(ctypes.c_int)),
    "nvmlDeviceGetMemoryInfo": (_device, _out(pynvml.c_nvmlMemory_t)),
    "nvmlDeviceGetMigMode": (_device, _UINT_OUT, _UINT_OUT),
    "nvmlDeviceGetNvLinkState": (_device, _uint, _UINT_OUT),
    "nvmlDeviceGetNvLinkRemotePciInfo_v2": (_device, _uint, _PCI_OUT),
    "nvmlDeviceGetNvLinkRemoteDeviceType": (_device, _uint, _UINT_OUT),
    "nvmlDeviceGetTopologyCommonAncestor": (_device, _device, _UINT_OUT),
    "nvmlDeviceGetP2PStatus": (_device, _device, _uint, _UINT_OUT),
    "nvmlDeviceGetMaxMigDeviceCount": (_device, _UINT_OUT),
    "nvmlDeviceGetMigDeviceHandleByIndex": (_device, _uint, _DEVICE_OUT),
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": (_device, _DEVICE_OUT),
    "nvmlDeviceIsMigDeviceHandle": (_device, _UINT_OUT),
    "nvmlDeviceGetCurrPcieLinkWidth": (_device, _UINT_OUT),
    "nvmlDeviceGetMaxPcieLinkWidth": (_device, _UINT_OUT),
    "nvmlDeviceGetCurrPcieLinkGeneration": (_device, _UINT_OUT),
    "nvmlDeviceGetMaxPcieLinkGeneration": (_device, _UINT_OUT),
    "nvmlDeviceGetTotalEccErrors": (_device, _uint, _uint, _out(ctypes.c_ulonglong)),
    "nvmlDeviceGetRemappedRows": (_device, _UINT_OUT, _UINT_OUT, _UINT_OUT, _UINT_OUT),
    "nvmlDeviceGetRetiredPagesPendingStatus": (_device, _UINT_OUT),
    "nvmlDeviceGetGpuFabricInfo": (_device, _out(pynvml.c_nvmlGpuFabricInfo_t)),
    "nvmlDeviceGetPersistenceMode": (_device, _UINT_OUT),
    "nvmlDeviceGetComputeMode": (_device, _UINT_OUT),
    "nvmlDeviceGetCurrentClocksEventReasons": (_device, _out(ctypes.c_ulonglong)),
    "nvmlDeviceGetNvLinkVersion": (_device, _uint, _UINT_OUT),
    "nvmlDeviceGetComputeRunningProcesses_v3": (_device, _UINT_OUT, _process_array),
    "nvmlDeviceGetNvLinkErrorCounter": (_device, _uint, _uint, _out(ctypes.c_ulonglong)),
    "nvmlDeviceGetPcieReplayCounter": (_device, _UINT_OUT),
    "nvmlEventSetCreate": (_out(pynvml.c_nvmlEventSet_t),),
    "nvmlDeviceRegisterEvents": (_device, _ulonglong, _event_set),
    "nvmlEventSetWait_v2": (_event_set, _out(pynvml.c_nvmlEventData_t), _uint),
    "nvmlEventSetFree": (_event_set,),
}
NEEDS_NO_INIT = frozenset({"nvmlInitWithFlags", "nvmlErrorString"})


def handle_address(gpu: int, mig_slot: int | None = None) -> int:
    address = HANDLE_BASE + HANDLE_STRIDE * (gpu + 1)
    return address if mig_slot is None else address + 0x10 * (mig_slot + 1)


def _set_pointer(target: ctypes._Pointer[Any], address: int) -> None:
    ctypes.c_void_p.from_address(ctypes.addressof(target)).value = address


class _Return(Exception):
    """Ends a fake call with this NVML return code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Symbol:
    """One exported function: checks arguments as ctypes and the C prototype would, then runs."""

    def __init__(self, library: FakeNvmlLibrary, name: str, params: tuple[Param, ...]) -> None:
        self.__name__ = name
        self.library = library
        self.params = params
        self.restype: Any = ctypes.c_int  # wrappers may set it, as on a real _FuncPtr
        self.argtypes: Any = None

    def __call__(self, *args: object) -> Any:
        for position, value in enumerate(args, start=1):
            _ctypes_would_pass(position, value)
        if len(args) != len(self.params):
            raise FakeNvmlMisuse(f"{self.__name__} takes {len(self.params)} arguments, got {len(args)}")
        return self.library.call(self.__name__, [check(value) for check, value in zip(self.params, args, strict=True)])


# --------------------------------------------------------------------------------------------
# the library
# --------------------------------------------------------------------------------------------


class FakeNvmlLibrary:
    """The stand-in for ``CDLL("libnvidia-ml.so.1")`` describing ``machine``."""

    def __init__(self, machine: FakeMachine) -> None:
        self.machine = machine
        self.calls: list[str] = []  # symbol names, in call order
        self.initialised = 0  # nvmlInitWithFlags minus nvmlShutdown
        self.symbols: dict[str, _Symbol] = {}
        self.registered: set[int] = set()  # GPUs whose Xid events the event set delivers

    def __getattr__(self, name: str) -> _Symbol:
        if name.startswith("_") or name not in SIGNATURES or name in self.machine.missing:
            raise AttributeError(f"{LIBRARY_NAME}: undefined symbol: {name}")
        return self.symbols.setdefault(name, _Symbol(self, name, SIGNATURES[name]))

    def call(self, name: str, args: list[Any]) -> Any:
        self.calls.append(name)
        try:
            self.check_state(name, args)
            result: Any = getattr(self, f"_{name}")(*args)
        except _Return as done:
            return done.code
        return SUCCESS if result is None else result

    def check_state(self, name: str, args: list[Any]) -> None:
        if not self.initialised and name not in NEEDS_NO_INIT:
            raise _Return(ERROR_UNINITIALIZED)
        subjects = self.subjects(name, args)
        if name not in IDENTITY_SYMBOLS and any(gpu in self.machine.lost for gpu in subjects):
            raise _Return(ERROR_GPU_IS_LOST)
        for failure in self.machine.failures:
            if failure.symbol == name and _matches(failure, subjects):
                raise _Return(failure.code)

    def subjects(self, name: str, args: list[Any]) -> list[int]:
        """The NVML indices a call is about, in argument order."""
        if name == "nvmlDeviceGetHandleByIndex_v2":
            return [args[0]]
        params = SIGNATURES[name]
        return [self.decode(arg)[0] for param, arg in zip(params, args, strict=True) if param is _device]

    def decode(self, address: int) -> tuple[int, int | None]:
        """(GPU index, MIG slot or None) of a handle this library gave out; else Invalid Argument."""
        offset = address - HANDLE_BASE
        gpu, rest = divmod(offset, HANDLE_STRIDE)
        gpu -= 1
        slot = None if rest == 0 else rest // 0x10 - 1
        if offset < 0 or rest % 0x10 or not 0 <= gpu < len(self.machine.gpus) or self.mig(gpu, slot) is False:
            raise _Return(ERROR_INVALID_ARGUMENT)
        return gpu, slot

    def mig(self, gpu: int, slot: int | None) -> FakeMig | None | bool:
        """The MIG instance at ``slot``; None for the whole GPU; False where there is none."""
        if slot is None:
            return None
        migs = self.machine.gpus[gpu].migs
        found = migs[slot] if 0 <= slot < len(migs) else None
        return False if found is None else found

    def gpu(self, address: int) -> tuple[int, FakeGpu]:
        """A whole GPU's handle; a MIG instance's is Invalid Argument here."""
        index, slot = self.decode(address)
        if slot is not None:
            raise _Return(ERROR_INVALID_ARGUMENT)
        return index, self.machine.gpus[index]

    def gpu_or_mig(self, address: int) -> FakeGpu | FakeMig:
        index, slot = self.decode(address)
        found = self.mig(index, slot)
        return found if isinstance(found, FakeMig) else self.machine.gpus[index]

    # -- the symbols --------------------------------------------------------------------------
    def _nvmlInitWithFlags(self, flags: int) -> int:  # noqa: N802
        if self.machine.init_error != SUCCESS:
            return self.machine.init_error
        self.initialised += 1
        return SUCCESS

    def _nvmlShutdown(self) -> None:  # noqa: N802
        self.initialised -= 1

    def _nvmlErrorString(self, code: int) -> bytes:  # noqa: N802
        return ERROR_TEXT.get(code, "Unknown Error").encode()

    def _nvmlSystemGetDriverVersion(self, buffer: ctypes.Array[ctypes.c_char], length: int) -> None:  # noqa: N802
        _write_text(buffer, length, self.machine.driver)

    def _nvmlSystemGetCudaDriverVersion(self, version: ctypes.c_int) -> None:  # noqa: N802
        version.value = self.machine.cuda

    def _nvmlDeviceGetCount_v2(self, count: ctypes.c_uint) -> None:  # noqa: N802
        count.value = len(self.machine.gpus)

    def _nvmlDeviceGetHandleByIndex_v2(self, index: int, device: Any) -> None:  # noqa: N802
        if index >= len(self.machine.gpus):
            raise _Return(ERROR_INVALID_ARGUMENT)
        _set_pointer(device, handle_address(index))

    def _nvmlDeviceGetHandleByUUID(self, uuid: bytes, device: Any) -> None:  # noqa: N802
        index = next((i for i, gpu in enumerate(self.machine.gpus) if gpu.uuid.encode() == uuid), None)
        if index is None:
            raise _Return(ERROR_NOT_FOUND)
        _set_pointer(device, handle_address(index))

    def _nvmlDeviceGetUUID(self, device: int, buffer: ctypes.Array[ctypes.c_char], length: int) -> None:  # noqa: N802
        _write_text(buffer, length, self.gpu_or_mig(device).uuid)

    def _nvmlDeviceGetName(self, device: int, buffer: ctypes.Array[ctypes.c_char], length: int) -> None:  # noqa: N802
        _write_text(buffer, length, self.gpu_or_mig(device).name)

    def _nvmlDeviceGetPciInfo_v3(self, device: int, pci: Any) -> None:  # noqa: N802
        _write_pci(pci, self.gpu(device)[1].bus_id)

    def _nvmlDeviceGetNumaNodeId(self, device: int, node: ctypes.c_int) -> None:  # noqa: N802
        numa = self.gpu(device)[1].numa
        if numa is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        node.value = numa

    def _nvmlDeviceGetCudaComputeCapability(self, device: int, major: ctypes.c_int, minor: ctypes.c_int) -> None:  # noqa: N802
        major.value, minor.value = self.gpu(device)[1].capability

    def _nvmlDeviceGetMemoryInfo(self, device: int, memory: Any) -> None:  # noqa: N802
        total = self.gpu_or_mig(device).memory_mib * 1024 * 1024
        memory.total, memory.used = total, 512 * 1024 * 1024
        memory.free = total - memory.used

    def _nvmlDeviceGetMigMode(self, device: int, current: ctypes.c_uint, pending: ctypes.c_uint) -> None:  # noqa: N802
        mig = self.gpu(device)[1].mig
        if mig is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        current.value, pending.value = mig

    def nvlink(self, device: int, link: int) -> NvLink:
        links = self.gpu(device)[1].nvlinks
        if links is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        if link >= len(links):
            raise _Return(ERROR_INVALID_ARGUMENT)
        return links[link]

    def active_nvlink(self, device: int, link: int) -> tuple[str, int]:
        far_end = self.nvlink(device, link)
        if far_end is None:
            raise _Return(ERROR_NOT_SUPPORTED)  # what NVML answers about the far end of a link that is down
        return far_end

    def _nvmlDeviceGetNvLinkState(self, device: int, link: int, active: ctypes.c_uint) -> None:  # noqa: N802
        active.value = FEATURE_DISABLED if self.nvlink(device, link) is None else FEATURE_ENABLED

    def _nvmlDeviceGetNvLinkRemotePciInfo_v2(self, device: int, link: int, pci: Any) -> None:  # noqa: N802
        _write_pci(pci, self.active_nvlink(device, link)[0])

    def _nvmlDeviceGetNvLinkRemoteDeviceType(self, device: int, link: int, kind: ctypes.c_uint) -> None:  # noqa: N802
        kind.value = self.active_nvlink(device, link)[1]

    def _nvmlDeviceGetTopologyCommonAncestor(self, device1: int, device2: int, level: ctypes.c_uint) -> None:  # noqa: N802
        level.value = self.machine.ancestors[self.gpu(device1)[0]][self.gpu(device2)[0]]

    def _nvmlDeviceGetP2PStatus(self, device1: int, device2: int, caps: int, status: ctypes.c_uint) -> None:  # noqa: N802
        statuses = self.machine.p2p[self.gpu(device1)[0]][self.gpu(device2)[0]]
        if caps >= len(statuses):
            raise _Return(ERROR_INVALID_ARGUMENT)
        status.value = statuses[caps]

    def _nvmlDeviceGetMaxMigDeviceCount(self, device: int, count: ctypes.c_uint) -> None:  # noqa: N802
        mig = self.gpu(device)[1].mig
        count.value = MAX_MIG_DEVICES if mig is not None and mig[0] == MIG_ENABLE else 0

    def _nvmlDeviceGetMigDeviceHandleByIndex(self, device: int, index: int, mig_device: Any) -> None:  # noqa: N802
        gpu_index, gpu = self.gpu(device)
        if gpu.mig is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        if gpu.mig[0] != MIG_ENABLE or index >= MAX_MIG_DEVICES:
            raise _Return(ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.migs) or gpu.migs[index] is None:
            raise _Return(ERROR_NOT_FOUND)
        _set_pointer(mig_device, handle_address(gpu_index, index))

    def _nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, mig_device: int, device: Any) -> None:  # noqa: N802
        gpu_index, slot = self.decode(mig_device)
        if slot is None:
            raise _Return(ERROR_INVALID_ARGUMENT)
        _set_pointer(device, handle_address(gpu_index))

    def _nvmlDeviceIsMigDeviceHandle(self, device: int, is_mig: ctypes.c_uint) -> None:  # noqa: N802
        is_mig.value = int(self.decode(device)[1] is not None)

    # -- health ------------------------------------------------------------------------------
    def pcie(self, device: int, part: int) -> int:
        pcie = self.gpu(device)[1].pcie
        if pcie is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        return pcie[part]

    def _nvmlDeviceGetCurrPcieLinkWidth(self, device: int, width: ctypes.c_uint) -> None:  # noqa: N802
        width.value = self.pcie(device, 0)

    def _nvmlDeviceGetMaxPcieLinkWidth(self, device: int, width: ctypes.c_uint) -> None:  # noqa: N802
        width.value = self.pcie(device, 1)

    def _nvmlDeviceGetCurrPcieLinkGeneration(self, device: int, gen: ctypes.c_uint) -> None:  # noqa: N802
        gen.value = self.pcie(device, 2)

    def _nvmlDeviceGetMaxPcieLinkGeneration(self, device: int, gen: ctypes.c_uint) -> None:  # noqa: N802
        gen.value = self.pcie(device, 3)

    def _nvmlDeviceGetTotalEccErrors(self, device: int, error_type: int, counter: int, count: Any) -> None:  # noqa: N802
        if (error_type, counter) != (MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC):
            raise FakeNvmlMisuse(f"this fake keeps volatile uncorrected counts only, got {error_type}, {counter}")
        errors = self.gpu(device)[1].ecc_uncorrected
        if errors is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        count.value = errors

    def _nvmlDeviceGetRemappedRows(self, device: int, *out: ctypes.c_uint) -> None:  # noqa: N802
        rows = self.gpu(device)[1].remapped_rows
        if rows is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        for target, value in zip(out, rows, strict=True):
            target.value = value

    def _nvmlDeviceGetRetiredPagesPendingStatus(self, device: int, pending: ctypes.c_uint) -> None:  # noqa: N802
        value = self.gpu(device)[1].retired_pages_pending
        if value is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        pending.value = value

    def _nvmlDeviceGetGpuFabricInfo(self, device: int, info: Any) -> None:  # noqa: N802
        fabric = self.gpu(device)[1].fabric
        if fabric is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        info.state, info.status = fabric

    def _nvmlDeviceGetPersistenceMode(self, device: int, mode: ctypes.c_uint) -> None:  # noqa: N802
        mode.value = self.gpu(device)[1].persistence

    def _nvmlDeviceGetComputeMode(self, device: int, mode: ctypes.c_uint) -> None:  # noqa: N802
        mode.value = self.gpu(device)[1].compute_mode

    def _nvmlDeviceGetNvLinkVersion(self, device: int, link: int, version: ctypes.c_uint) -> None:  # noqa: N802
        self.nvlink(device, link)  # NotSupported without NVLink, InvalidArgument past the last link
        version.value = self.gpu(device)[1].nvlink_version

    def _nvmlDeviceGetComputeRunningProcesses_v3(self, device: int, count: ctypes.c_uint, infos: Any) -> int:  # noqa: N802
        """NVML's two calls: the count first (Insufficient Size when there are any), then the array."""
        processes = self.gpu(device)[1].processes
        if infos is None or count.value < len(processes):
            count.value = len(processes)
            return ERROR_INSUFFICIENT_SIZE if processes else SUCCESS
        for slot, (pid, mib) in enumerate(processes):
            infos[slot].pid, infos[slot].usedGpuMemory = pid, mib * 1024 * 1024
        count.value = len(processes)
        return SUCCESS

    def _nvmlDeviceGetCurrentClocksEventReasons(self, device: int, reasons: ctypes.c_ulonglong) -> None:  # noqa: N802
        reasons.value = self.gpu(device)[1].clock_reasons

    def _nvmlDeviceGetNvLinkErrorCounter(self, device: int, link: int, counter: int, value: Any) -> None:  # noqa: N802
        self.nvlink(device, link)  # NotSupported without NVLink, InvalidArgument past the last link
        errors = self.gpu(device)[1].nvlink_errors
        if errors is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        if not 0 <= counter < len(errors[link]):
            raise _Return(ERROR_INVALID_ARGUMENT)  # past NVML_NVLINK_ERROR_COUNT
        count = errors[link][counter]
        if count is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        value.value = count

    def _nvmlDeviceGetPcieReplayCounter(self, device: int, value: ctypes.c_uint) -> None:  # noqa: N802
        replays = self.gpu(device)[1].pcie_replays
        if replays is None:
            raise _Return(ERROR_NOT_SUPPORTED)
        value.value = replays

    # -- events: one event set; Xid events delivered in order, to GPUs registered for them ------------
    def _nvmlEventSetCreate(self, event_set: Any) -> None:  # noqa: N802
        _set_pointer(event_set, EVENT_SET_ADDRESS)
        self.registered = set()

    def _nvmlDeviceRegisterEvents(self, device: int, types: int, event_set: int) -> None:  # noqa: N802
        if event_set != EVENT_SET_ADDRESS or types & ~EVENT_XID_CRITICAL_ERROR:
            raise FakeNvmlMisuse(f"this fake registers Xid events in its own event set, got {types:#x}, {event_set:#x}")
        self.registered.add(self.gpu(device)[0])

    def _nvmlEventSetWait_v2(self, event_set: int, data: Any, timeout_ms: int) -> None:  # noqa: N802
        if any(gpu in self.registered for gpu in self.machine.lost):
            raise _Return(ERROR_GPU_IS_LOST)  # nvml.h: "the target GPU has fallen off the bus"; it names none
        waiting = [e for e in self.machine.xid_events if e[0] in self.registered]
        if not waiting:
            time.sleep(min(timeout_ms, 50) / 1000)  # the real call blocks up to timeout_ms
            raise _Return(ERROR_TIMEOUT)
        self.machine.xid_events.remove(waiting[0])
        gpu, xid = waiting[0]
        _set_pointer(data.device, handle_address(gpu))
        data.eventType, data.eventData = EVENT_XID_CRITICAL_ERROR, xid

    def _nvmlEventSetFree(self, event_set: int) -> None:  # noqa: N802
        self.registered = set()


def _matches(failure: Failure, subjects: Sequence[int]) -> bool:
    wanted = (failure.gpu, failure.peer)
    return all(want is None or (k < len(subjects) and subjects[k] == want) for k, want in enumerate(wanted))


def _write_text(buffer: ctypes.Array[ctypes.c_char], length: int, text: str) -> None:
    data = text.encode()
    if length > len(buffer):
        raise FakeNvmlMisuse(f"length {length} is larger than the buffer ({len(buffer)} bytes)")
    if len(data) + 1 > length:
        raise _Return(ERROR_INSUFFICIENT_SIZE)
    buffer.value = data


def _write_pci(pci: Any, bus_id: str) -> None:
    domain, bus, device_function = bus_id.split(":")
    pci.busId = bus_id.encode()
    pci.busIdLegacy = bus_id[4:].encode()
    pci.domain, pci.bus, pci.device = int(domain, 16), int(bus, 16), int(device_function.split(".")[0], 16)


# --------------------------------------------------------------------------------------------
# installing it
# --------------------------------------------------------------------------------------------


def install(monkeypatch: pytest.MonkeyPatch, machine: FakeMachine) -> FakeNvmlLibrary:
    """The real pynvml calls a fake library describing ``machine`` until the test ends."""
    library = FakeNvmlLibrary(machine)
    monkeypatch.setattr(pynvml, "nvmlLib", library)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)
    return library


def install_no_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host without libnvidia-ml.so.1: pynvml's own loader fails (NVMLError_LibraryNotFound)."""

    def no_library(name: str, *args: object, **kwargs: object) -> None:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "CDLL", no_library)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """As a plugin (``-p fake_nvml``): the machine in FAKE_NVML_MACHINE, for this whole process."""
    text = os.environ.get(MACHINE_VARIABLE)
    if text:
        pynvml.nvmlLib = FakeNvmlLibrary(FakeMachine.from_json(text))
        pynvml._nvmlGetFunctionPointer_cache.clear()


# --------------------------------------------------------------------------------------------
# the machines
# --------------------------------------------------------------------------------------------

H100_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
NVSWITCH_BUSES = ["00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0"]


def nvswitch_box() -> FakeMachine:
    """An H100 SXM box: 8 GPUs, each with 18 active NVLinks to the NVSwitches."""
    gpus = [
        FakeGpu(uuid=f"GPU-a1b2c3d{i}-5e6f-7a8b-9c0d-1e2f3a4b5c6{i}", name="NVIDIA H100 80GB HBM3",
                bus_id=f"00000000:{bus}:00.0", memory_mib=81559, numa=i // 4,
                nvlinks=[(NVSWITCH_BUSES[link % 4], LINK_TO_SWITCH) for link in range(18)],
                pcie=(16, 16, 1, 5), fabric=(FABRIC_COMPLETED, SUCCESS))
        for i, bus in enumerate(H100_BUSES)
    ]  # fmt: skip
    return FakeMachine(
        gpus,
        ancestors=matrix(8, lambda i, j: TOPOLOGY_NODE if i // 4 == j // 4 else TOPOLOGY_SYSTEM),
        p2p=p2p_matrix(8, lambda i, j, cap: P2P_OK),
    )


PCIE_BUSES = ["1B", "1C", "3D", "3E", "9B", "9C", "B1", "DA"]
# Socket 0: gpu0+gpu1 on one PCIe switch, gpu2+gpu3 on another, both switches under a third.
# Socket 1: gpu4+gpu5 on one switch, gpu6 on another root port of that host bridge, gpu7 on a
# second host bridge.  Across the sockets: SYS.
PCIE_SWITCH = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c", 6: "d", 7: "e"}
PCIE_HOST_BRIDGE = {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 2}


def pcie_ancestor(i: int, j: int) -> int:
    if i // 4 != j // 4:
        return TOPOLOGY_SYSTEM
    if PCIE_SWITCH[i] == PCIE_SWITCH[j]:
        return TOPOLOGY_SINGLE
    if PCIE_HOST_BRIDGE[i] != PCIE_HOST_BRIDGE[j]:
        return TOPOLOGY_NODE
    return TOPOLOGY_MULTIPLE if i < 4 else TOPOLOGY_HOSTBRIDGE


def pcie_p2p(i: int, j: int, cap: int) -> int:
    if cap == CAPS_NVLINK:
        return P2P_NOT_SUPPORTED
    if i // 4 == j // 4:
        return P2P_OK
    if cap == CAPS_ATOMICS:
        return P2P_IOH_TOPOLOGY_NOT_SUPPORTED
    return P2P_CHIPSET_NOT_SUPPORTED


def pcie_box() -> FakeMachine:
    """Two sockets, 4 PCIe L40S on each, no NVLink, no MIG; P2P read/write only within a socket."""
    gpus = [
        FakeGpu(uuid=f"GPU-{i}{i}{i}{i}{i}{i}{i}{i}-0000-4000-8000-00000000000{i}", name="NVIDIA L40S",
                bus_id=f"00000000:{bus}:00.0", memory_mib=46068, numa=i // 4, mig=None)
        for i, bus in enumerate(PCIE_BUSES)
    ]  # fmt: skip
    return FakeMachine(gpus, matrix(8, pcie_ancestor), p2p_matrix(8, pcie_p2p), driver="535.183.01", cuda=12020)


def single_gpu() -> FakeMachine:
    """A workstation card; NVML reports NUMA node -1 (none)."""
    gpu = FakeGpu(uuid="GPU-5f1c9a2e-0b7d-4c3e-9a1f-2b3c4d5e6f70", name="NVIDIA RTX 6000 Ada Generation",
                  bus_id="00000000:01:00.0", memory_mib=49140, numa=-1, mig=None)  # fmt: skip
    return FakeMachine([gpu], [[TOPOLOGY_INTERNAL]], p2p_matrix(1, lambda i, j, cap: P2P_OK), "570.124.06", 12080)


BRIDGED_BUSES = ["00000000:17:00.0", "00000000:31:00.0", "00000000:B1:00.0", "00000000:CA:00.0"]
BRIDGED_MIGS = [
    FakeMig("MIG-4f1e2d3c-aaaa-4bbb-8ccc-ddddeeeeff00", "NVIDIA A100 80GB PCIe MIG 3g.40gb", 40192),
    FakeMig("MIG-4f1e2d3c-aaaa-4bbb-8ccc-ddddeeeeff01", "NVIDIA A100 80GB PCIe MIG 3g.40gb", 40192),
]


def bridged_box() -> FakeMachine:
    """Four A100 PCIe cards paired by NVLink bridges (0-1 and 2-3; one link of 2-3 down), MIG on gpu3.

    gpu3 has two MIG instances (slots 0 and 1).  The driver predates nvmlDeviceGetNumaNodeId
    support, so NUMA nodes come from sysfs.
    """

    def bridge(peer: int, down: frozenset[int] = frozenset()) -> list[NvLink]:
        far_end = (BRIDGED_BUSES[peer], LINK_TO_GPU)
        return [None if link in down else far_end for link in range(12)]

    links = [bridge(1), bridge(0), bridge(3, frozenset({3})), bridge(2, frozenset({3}))]
    modes = [(0, 0), (0, 0), (0, 1), (1, 1)]  # gpu2: enabled only after a reset, so not yet
    gpus = [
        FakeGpu(uuid=f"GPU-b00{i}e5a1-2c3d-4e5f-8a9b-0c1d2e3f4a5b", name="NVIDIA A100 80GB PCIe",
                bus_id=bus, memory_mib=81920, numa=None, nvlinks=links[i], mig=modes[i])
        for i, bus in enumerate(BRIDGED_BUSES)
    ]  # fmt: skip
    gpus[3].migs = list(BRIDGED_MIGS)
    return FakeMachine(
        gpus,
        ancestors=matrix(4, lambda i, j: TOPOLOGY_SYSTEM if i // 2 != j // 2 else TOPOLOGY_HOSTBRIDGE),
        # NVML's NVLINK capability answers OK only for the bridged pairs, as the real one does
        p2p=p2p_matrix(4, lambda i, j, cap: P2P_NOT_SUPPORTED if cap == CAPS_NVLINK and i // 2 != j // 2 else P2P_OK),
        driver="470.256.02",
        cuda=11040,
    )


def with_mig(machine: FakeMachine, gpu: int, migs: Sequence[FakeMig | None]) -> FakeMachine:
    """``machine`` with MIG on at ``gpu`` and these instances in its slots."""
    gpus = list(machine.gpus)
    gpus[gpu] = replace(gpus[gpu], mig=(MIG_ENABLE, MIG_ENABLE), migs=list(migs))
    return replace(machine, gpus=gpus)


H200_VM_UUID = "GPU-f55b565c-e4a9-c237-732b-3eaa5790a250"


def h200_vm() -> FakeMachine:
    """One H200 passed through to a VM, as NVML answered on 2026-11-27 (docs/gpu-runs/2026-11-27-h200/nvml-raw.json).

    No NVLink (every NVLink query NotSupported), no NUMA node, fabric state NOT_SUPPORTED (0), PCIe Gen5 x16 at rest.
    """
    gpu = FakeGpu(uuid=H200_VM_UUID, name="NVIDIA H200", bus_id="00000000:00:06.0", memory_mib=143771, numa=None,
                  pcie=(16, 16, 5, 5), fabric=(FABRIC_NOT_SUPPORTED, SUCCESS))  # fmt: skip
    return FakeMachine([gpu], [[TOPOLOGY_INTERNAL]], p2p_matrix(1, lambda i, j, cap: P2P_OK), "580.159.04", 13000)
