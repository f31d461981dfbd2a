"""Each shipped scenario, run as its header says (the whole suite, the scenario by name), gives its answer.

The answer is what a user acts on, so its lines are asserted whole: the same for a class whatever
other tests of the suite run beside it (a test that runs on one rung only never vetoes its class's
rung), and naming the cause and its fix where no environment variable is the fix.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.common.suite import SCENARIOS_DIR, shipped_scenarios
from conftest import WHOLE_SUITE, copy_suites, scenario_text

RunSuite = Callable[..., pytest.RunResult]
SUITE_FILES = WHOLE_SUITE
pytestmark = [pytest.mark.usefixtures("isolated_env"), pytest.mark.slow]

NO_SETTING = "no setting fixes it"
PERSISTENCE_OFF_2GPU = "WARNING host check host:gpu_modes: gpu0, gpu1: persistence mode off: *"
PCIE_8GPU_PASSED = (
    "passed as they are: NODE pairs, PIX pairs, SYS pairs, all sets, every_other sets, last_half sets, "
    "last_half_all_visible sets, reversed sets, single sets"
)
NO_CUDA = "NO CUDA DEVICE IN THE RANK"
UNKNOWN_ERROR = "CUDA UNKNOWN ERROR (a GPU lost after Xid 79 answers so)"
LOST_FIX = "look for Xid 79 (`dmesg | grep -i xid`: the GPU fell off the bus) and other Xids; reset the GPU or reboot"
TOO_OLD = "NCCL OR TORCH TOO OLD FOR THIS GPU (built without its architecture)"
NVLINK_P2P = "NVLINK P2P DISABLED BY THE HARDWARE (NCCL: 'probably due to a hardware issue')"
NVLS_FIXED = "passes with NCCL_NVLS_ENABLE=0 -> export NCCL_NVLS_ENABLE=0"  # not NCCL_CUMEM_ENABLE=0: narrowest first
NVLS_CAUSE = "NVLink SHARP (NVLS) multicast failed: "
NVLS_FIX = "-> fix: Fabric Manager or the NVSwitches are misconfigured; `export NCCL_NVLS_ENABLE=0` avoids NVLS"
SHM_FIXED = "passes with NCCL_SHM_DISABLE=1 -> export NCCL_SHM_DISABLE=1"
SHM_FULL = "  /dev/shm is full: rank 0 (gpu0) in init of "
SHM_FIX = "free it or enlarge it: docker `--shm-size` or `--ipc=host`"
ALL_COLLECTIVES = "all_gather, all_reduce, all_to_all, barrier, barrier_no_device_ids, broadcast, reduce_scatter"
ALL_COLLECTIVES_FAILED = ", ".join(f"{probe} 1/1" for probe in ALL_COLLECTIVES.split(", "))
CUMEM_HOST_FIXED = "passes with NCCL_CUMEM_HOST_ENABLE=0 -> export NCCL_CUMEM_HOST_ENABLE=0"
CUMEM_HOST_CAUSE = "  cuMem host memory for SHM failed: rank 0 "
CLEAN_FIXED = "passes with unset every NCCL_*/TORCH_NCCL_* variable -> unset every NCCL_*/TORCH_NCCL_* variable"
SHM_FULL_LOC = "  /dev/shm is full: rank 0 (gpu* in init of *: SimulatedError: NCCL Error 2: * -> fix: " + SHM_FIX


def iommu_slow_lines(then: str) -> list[str]:
    """The SLOW lines of the PIX and PXB pairs whose IOMMU translates their DMA (0.04 of the link), then ``then``."""
    return [
        f"SLOW: {link} pairs' {probe} on inherited, below the floor for their link: {first} 1.26 GB/s (0.04 of its "
        f"link's 31.5, below the floor {floor}); * -> likely cause: the IOMMU translates the GPUs' DMA (intel_iommu=on)"
        + then
        for probe, floor in (("pair_exchange", "0.15"), ("peer_copy", "0.25"))
        for link, first in (("PIX", "gpu0-gpu1"), ("PXB", "gpu0-gpu2"))
    ]


IB_FIXED = "passes with NCCL_IB_DISABLE=1 -> export NCCL_IB_DISABLE=1"
IB_CAUSE = "  NET/IB : Got completion from peer * in probe of *"
ANSWERS = {
    "net-intra-gdr-broken": [  # the pairs across the sockets use the NIC (ncclTopoCheckNet): only ib_off passes
        f"SYS pairs: ERROR on inherited (pair_exchange 16/16); {IB_FIXED}",
        IB_CAUSE,
        "all sets: ERROR on inherited (all_gather 1/1, all_reduce 1/1, all_to_all 1/1, barrier 1/1, "
        f"barrier_no_device_ids 1/1, broadcast 1/1, reduce_scatter 1/1); {IB_FIXED}",
        IB_CAUSE,
        f"every_other sets: ERROR on inherited (barrier 1/1, barrier_no_device_ids 1/1); {IB_FIXED}",
        IB_CAUSE,
        f"reversed sets: ERROR on inherited (barrier 1/1, barrier_no_device_ids 1/1); {IB_FIXED}",
        IB_CAUSE,
        "  FIRST BARRIER ON ANOTHER RANK'S GPU: *",
        "passed as they are: PIX pairs, PXB pairs, last_half sets, last_half_all_visible sets, single sets",
        "for every class together: export NCCL_IB_DISABLE=1",
    ],
    "nccl-conf-p2p-loc": [  # /etc/nccl.conf's LOC puts every pair on SHM; clean's empty value brings NVLink P2P back
        f"NV18 pairs: ERROR on inherited (pair_exchange 28/28); {CLEAN_FIXED}",
        SHM_FULL_LOC,
        f"all sets: ERROR on inherited (all_gather 1/1, all_reduce 1/1, all_to_all 1/1, barrier 1/1, "
        f"barrier_no_device_ids 1/1, broadcast 1/1, reduce_scatter 1/1); {CLEAN_FIXED}",
        SHM_FULL_LOC,
        *(
            line
            for name in ("every_other", "last_half", "last_half_all_visible", "reversed")
            for line in (
                f"{name} sets: ERROR on inherited (barrier 1/1, barrier_no_device_ids 1/1); {CLEAN_FIXED}",
                SHM_FULL_LOC,
            )  # fmt: skip
        ),
        "passed as they are: single sets",
        "for every class together: unset every NCCL_*/TORCH_NCCL_* variable; export NCCL_P2P_LEVEL=",
    ],
    "container-dev-shm": [  # NCCL's SHM transport joins the two GPUs; a world of one has no SHM and passes
        PERSISTENCE_OFF_2GPU,  # two workstation GPUs without persistence mode: a WARNING, as in DCGM
        f"PHB pairs: ERROR on inherited (pair_exchange 1/1); {SHM_FIXED}",
        f"{SHM_FULL}pair_exchange: SimulatedError: NCCL Error 2: unhandled system error * -> fix: {SHM_FIX}",
        f"all sets: ERROR on inherited ({ALL_COLLECTIVES_FAILED}); {SHM_FIXED}",
        f"{SHM_FULL}{ALL_COLLECTIVES}: * -> fix: {SHM_FIX}",
        f"reversed sets: ERROR on inherited (barrier 1/1, barrier_no_device_ids 1/1); {SHM_FIXED}",
        "  /dev/shm is full: rank 0 (gpu1) in init of barrier, barrier_no_device_ids: * -> fix: " + SHM_FIX,
        "passed as they are: single sets",
        "for every class together: export NCCL_SHM_DISABLE=1",
    ],
    "cumem-host-shm": [
        f"NODE pairs: ERROR on inherited (pair_exchange 4/4); {CUMEM_HOST_FIXED}",
        f"{CUMEM_HOST_CAUSE}(gpu0), rank 0 (gpu1) in probe of pair_exchange: *Cuda failure 217 *",  # one line a cause
        f"PIX pairs: ERROR on inherited (pair_exchange 2/2); {CUMEM_HOST_FIXED}",
        f"{CUMEM_HOST_CAUSE}(gpu0), rank 0 (gpu2) in probe of pair_exchange: *Cuda failure 217 *",
        f"all sets: ERROR on inherited ({ALL_COLLECTIVES_FAILED}); {CUMEM_HOST_FIXED}",
        f"{CUMEM_HOST_CAUSE}(gpu0) in probe of {ALL_COLLECTIVES}: *",
        *(
            line
            for name, gpu, probes, wrong_barrier in (
                ("every_other", 1, "barrier, barrier_no_device_ids", False),
                ("last_half", 2, "barrier, barrier_no_device_ids", False),
                ("last_half_all_visible", 2, "barrier", True),
                ("reversed", 3, "barrier", True),
            )
            for line in (
                f"{name} sets: ERROR on inherited (barrier 1/1, barrier_no_device_ids 1/1); {CUMEM_HOST_FIXED}",
                f"{CUMEM_HOST_CAUSE}(gpu{gpu}) in probe of {probes}: *",
                *(["  FIRST BARRIER ON ANOTHER RANK'S GPU: *"] if wrong_barrier else []),
            )
        ),
        "passed as they are: single sets",
        "for every class together: export NCCL_CUMEM_HOST_ENABLE=0",
    ],
    "fabric-manager-down": [  # one line for one machine fault: its classes named in it, no line each
        "host check host:fabric_manager: ERROR: gpu0, gpu1, gpu2, gpu3, gpu4, gpu5, gpu6, gpu7: Fabric Manager state "
        "not_started, status Success: start nvidia-fabricmanager (the driver's exact version): *",
        "MACHINE FAULT: FABRIC MANAGER NOT RUNNING (CUDA error 802: system not yet initialized) in 7 classes (NV18 "
        "pairs, all sets, every_other sets, last_half sets, last_half_all_visible sets, reversed sets, single sets) "
        "-> fix: start nvidia-fabricmanager, the driver's exact version *",
    ],
    "nccl-too-old-b200": [  # no NCCL kernel for the GPU: upgrade, no ladder, no export
        "host check host:nccl_gpu: ERROR: gpu0, gpu1, gpu2, gpu3, gpu4, gpu5, gpu6, gpu7: NCCL 2.21.5 is too old for "
        "NVIDIA B200 (compute capability 10.0): upgrade NCCL or torch to one with NCCL >= 2.25.1 (NCCL 2.25.1-1 "
        "release: Add Blackwell/SM100 support)",
        f"MACHINE FAULT: {TOO_OLD} in 7 classes (NV18 pairs, all sets, every_other sets, last_half sets, "
        "last_half_all_visible sets, reversed sets, single sets) -> fix: upgrade NCCL or torch to a release built for "
        "this GPU's compute capability *",
    ],
    "nvls-broken": [
        f"all sets: ERROR on inherited (all_gather 1/1, all_reduce 1/1, barrier 1/1, barrier_no_device_ids 1/1, "
        f"broadcast 1/1, reduce_scatter 1/1); {NVLS_FIXED}",
        f"  {NVLS_CAUSE}rank 0 (gpu0) in init of all_gather, all_reduce, barrier, barrier_no_device_ids, broadcast, "
        f"reduce_scatter: *{NVLS_FIX}",
        *(
            line
            for name, gpu in (("every_other", 1), ("last_half", 4), ("last_half_all_visible", 4), ("reversed", 7))
            for line in (
                f"{name} sets: ERROR on inherited (barrier 1/1, barrier_no_device_ids 1/1); {NVLS_FIXED}",
                f"  {NVLS_CAUSE}rank 0 (gpu{gpu}) in init of barrier, barrier_no_device_ids: *{NVLS_FIX}",
            )
        ),
        "passed as they are: NV18 pairs, single sets",
        "for every class together: export NCCL_NVLS_ENABLE=0",
    ],
    "pcie-gen3-under-load": [  # the generation as the ranks read it while their transfers moved data
        "DURING THE RUN: gpu6: PCIe gen3 at most while its cases ran, where the GPU and slot allow gen4: a link "
        "trained down *",
        PCIE_8GPU_PASSED,
    ],
    "pcie-link-downtrained": [
        "host check host:pcie_link: ERROR: gpu5: PCIe link x8, the GPU and slot allow x16: a downtrained link "
        "(reseat the card or its riser, clean the contacts; `nvidia-smi -q -d PCIE`)",
        *(
            f"SLOW: {link} pairs' {probe} on inherited, below 0.6 of their class's median or its floor: {pairs} -> "
            "likely cause: gpu5 PCIe link x8, the GPU and slot allow x16; check the pair's path: *"
            for probe in ("pair_exchange", "peer_copy")
            for link, pairs in (
                ("PIX", "gpu4-gpu5 12.6 GB/s (0.50 of the median 25.2, 0.80 of its link's 15.75)"),
                ("NODE", "gpu5-gpu* 12.6 GB/s (0.50 of the median 25.2, 0.80 of its link's 15.75); gpu5-gpu* *"),
                ("SYS", "gpu*-gpu5 12.6 GB/s (0.50 of the median 25.2, 0.80 of its link's 15.75); *"),
            )
        ),
        PCIE_8GPU_PASSED,
    ],
    "slow-pair": [
        *(
            f"SLOW: SYS pairs' {probe} on inherited, below 0.6 of their class's median or its floor: gpu1-gpu5 7.56 "
            "GB/s (0.30 of the median 25.2, 0.24 of its link's 31.5) -> check the pair's path: both GPUs' PCIe links "
            "(`nvidia-smi -q -d PCIE`) and NVLinks (`nvidia-smi nvlink -s`)"
            for probe in ("pair_exchange", "peer_copy")
        ),
        PCIE_8GPU_PASSED,
    ],
    "row-remap-pending": [
        "host check host:gpu_memory: ERROR: gpu6: row remapping pending (reset the GPU: `nvidia-smi -r`, or "
        "reboot) (`nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT`)",
        "passed as they are: NV18 pairs, all sets, every_other sets, last_half sets, last_half_all_visible sets, "
        "reversed sets, single sets",
    ],
    "nvlink-down": [
        "host check host:nvlink: ERROR: gpu2: 17 of 18 NVLinks up where its siblings have 18 (link 11 down): *",
        "passed as they are: NV17 pairs, NV18 pairs, all sets, every_other sets, last_half sets, "
        "last_half_all_visible sets, reversed sets, single sets",
    ],
    "gpu-lost": [
        "host check host:gpu_inventory: ERROR: 1 GPU(s) on the PCI bus that NVML does not list: 0000:48:00.0 "
        "(8 on the PCI bus, 7 in NVML); they failed to initialise or fell off the bus: *",
        PCIE_8GPU_PASSED,
    ],
    "hang-ignores-sigterm": [
        f"all sets: HANG on inherited (all_reduce 1/1); no rung passed (tried inherited, *): {NO_SETTING}",
        "passed as they are: CPU pairs, every_other sets, last_half sets, single sets",
    ],
    "gpu-lost-during-run": [  # NVML's GPU_IS_LOST names no GPU: the watch's next sample does, with its case
        "MACHINE FAULT: peer_copy uses no NCCL and did not pass on NV18 pairs: ERROR in 2 (rank 0 (gpu5) in probe *"
        f"no NCCL setting changes it -> fix: {LOST_FIX}",
        "DURING THE RUN: gpu5: NVML lost the GPU during suites/test_pairs.py::test_pair_exchange[gpu4-gpu5-NV18-"
        "inherited] (its verdict: error) (NVML_ERROR_GPU_IS_LOST: fallen off the bus or otherwise inaccessible) -> "
        "reboot; *",
        f"MACHINE FAULT: {UNKNOWN_ERROR} in 7 classes (NV18 pairs, all sets, every_other sets, last_half sets, "
        f"last_half_all_visible sets, reversed sets, single sets) -> fix: {LOST_FIX}",
    ],
    "iommu-slow-p2p": [  # a whole class slow alike: judged against its link, not its peers
        *iommu_slow_lines("; the bridges' ACS control could not be read here (read it as root: *"),
        "passed as they are: PIX pairs, PXB pairs, SYS pairs, all sets, every_other sets, last_half sets, "
        "last_half_all_visible sets, reversed sets, single sets",
    ],
    "libcuda-missing": [  # NVML works, CUDA cannot: the host check names the container's missing capability
        "host check host:platform: ERROR: libcuda.so.1 does not load (libcuda.so.1: cannot open shared object file: "
        "No such file or directory) though NVML works: no CUDA call can run here -> in a container, give it the "
        "compute capability (NVIDIA_DRIVER_CAPABILITIES=compute,utility, *",
        "MACHINE FAULT: peer_copy uses no NCCL and did not pass on NV18 pairs: ERROR in 28 *",
        f"MACHINE FAULT: {NO_CUDA} in 7 classes (NV18 pairs, all sets, every_other sets, last_half sets, "
        "last_half_all_visible sets, reversed sets, single sets) -> fix: *",
    ],
    "nvlink-errors": [  # DCGM's limits: a replay fails, Hopper's ECC data below 100 a second warns
        "WARNING during the run: gpu1: link error counters grew during the run, below DCGM's failure rates (nvlink2 "
        "ecc_data +25): watch them *",
        "DURING THE RUN: gpu6: link error counters grew during the run (nvlink9 replay +1): reset the GPU; *",
        "passed as they are: NV18 pairs, all sets, every_other sets, last_half sets, last_half_all_visible sets, "
        "reversed sets, single sets",
    ],
    "nvlink-p2p-disabled": [  # NCCL's own word on a broken NVLink: the GPUs' fault, never NCCL_P2P_DISABLE=1
        "host check host:nvlink_p2p: ERROR: gpu2-gpu5 (NV18): NVML reports P2P read NOT_SUPPORTED, write "
        "NOT_SUPPORTED, so NCCL refuses every communicator with both GPUs (*) -> the GPUs it names have NVLink but "
        "NVML reports no P2P between them: reset them *",
        "DURING THE RUN: gpu2: link error counters grew during the run (nvlink4 recovery +3, nvlink4 replay +12): *",
        f"MACHINE FAULT: {NVLINK_P2P} in 3 classes (NV18 pairs, all sets, reversed sets) -> fix: *never P2P "
        "turned off for the class, which slows every pair of it to hide one",
        "passed as they are: every_other sets, last_half sets, last_half_all_visible sets, single sets",
    ],
    "noncontiguous-barrier": [
        "last_half_all_visible sets: HANG on inherited (barrier_no_device_ids 1/1); no rung passed (tried "
        f"inherited, *): {NO_SETTING}",
        "  FIRST BARRIER ON ANOTHER RANK'S GPU: rank 0, 1, 2, 3 in barrier_no_device_ids: rank 0 uses GPU 4 but ran "
        "its first barrier on GPU 0 (a guess: global rank 0 % 8 devices) -> fix: in the job's code, each rank on its "
        "own GPU: torch.cuda.set_device(local_rank) before any CUDA or NCCL call, and "
        "init_process_group(..., device_id=torch.device('cuda', local_rank)) or "
        "dist.barrier(device_ids=[local_rank])*",
        "reversed sets: HANG on inherited (barrier_no_device_ids 1/1); no rung passed (tried inherited, *): "
        + NO_SETTING,
        "  FIRST BARRIER ON ANOTHER RANK'S GPU: rank 0, 1, 2, 3, 4, 5, 6, 7 in barrier_no_device_ids: rank 0 uses "
        "GPU 7 but ran its first barrier on GPU 0 * -> fix: in the job's code, *device_id=*",
        "passed as they are: NV18 pairs, all sets, every_other sets, last_half sets, single sets",
    ],
    "oom-at-checkpoint": [
        PERSISTENCE_OFF_2GPU,  # two workstation GPUs without persistence mode: a WARNING, as in DCGM
        "all sets: ERROR on inherited (all_gather 1/1, all_reduce 1/1); no rung passed (tried inherited, *): "
        + NO_SETTING,
        "  OUT OF MEMORY: rank 0 (gpu0) in probe of all_gather, all_reduce: CUDA out of memory. Tried to allocate "
        "20.00 GiB.*; rank 1 only waited for it (victims) -> fix: free that GPU *",
        "passed as they are: PHB pairs, reversed sets, single sets",
    ],
    "driver-p2p-hang": [
        "PIX pairs: HANG on inherited (pair_exchange 4/4); passes with NCCL_P2P_LEVEL=NVL -> export NCCL_P2P_LEVEL=NVL",
        "PXB pairs: HANG on inherited (pair_exchange 8/8); passes with NCCL_P2P_LEVEL=NVL -> export NCCL_P2P_LEVEL=NVL",
        "passed as they are: SYS pairs, all sets, every_other sets, last_half sets, "
        "last_half_all_visible sets, reversed sets, single sets",
        "for every class together: export NCCL_P2P_LEVEL=NVL",
    ],
    "peer-copy-hang": [  # the copy uses no NCCL: a machine fault, and the PIX pairs' NCCL answer stands
        "MACHINE FAULT: peer_copy uses no NCCL and did not pass on PIX pairs: HANG in 4 (rank 0 (gpu0) in probe "
        "(copy gpu0->gpu1 8B): *); no NCCL setting changes it -> fix: CUDA's own P2P between these GPUs: *",
        "passed as they are: PIX pairs, PXB pairs, SYS pairs, all sets, every_other sets, last_half sets, "
        "last_half_all_visible sets, reversed sets, single sets",
    ],
    "vm-slow-p2p": [  # in a virtual machine ACS and the IOMMU are the host's: no bare-metal advice
        "WARNING host check host:gpu_modes: gpu0, gpu1, gpu2, gpu3, gpu4, gpu5, gpu6, gpu7: persistence mode off: * "
        "-> `nvidia-smi -pm 1` as root, or run nvidia-persistenced *",
        "WARNING host check host:platform: ulimit -s is unlimited, so glibc gives new threads only 2 MB of stack "
        "(pthread_create(3)): NCCL before 2.28 has crashed creating communicators with it -> `ulimit -s 8192` *",
        *iommu_slow_lines(" -> in a virtual machine ACS and the IOMMU are the host's, not this system's *"),
        "passed as they are: PIX pairs, PXB pairs, SYS pairs, all sets, every_other sets, last_half sets, "
        "last_half_all_visible sets, reversed sets, single sets",
    ],
    "wrong-data-p2p": [
        "PIX pairs: FAIL on inherited (pair_exchange 4/4); passes with NCCL_P2P_LEVEL=NVL, but wrong data makes the "
        "machine NOT FIT: no export",
        "passed as they are: NODE pairs, SYS pairs, all sets, every_other sets, last_half sets, "
        "last_half_all_visible sets, reversed sets, single sets",
    ],
}


# Lines beyond the answer a scenario's run must print (its comparison with the baseline its header names).
ALSO = {
    "net-intra-gdr-broken": [
        "conformance: NIC mlx5_0 (200 Gb/s, PCIe Gen4 x16): gpu0 PIX, gpu1 PIX, gpu2 PXB, gpu3 PXB, gpu4 SYS, *",
        "conformance: NCCL's transports as the run starts (its rules, predicted): PIX P2P, PXB P2P, SYS NET",
    ],
    "nccl-conf-p2p-loc": [  # the header names the file's setting and how clean overrides it; recommend names the file
        "conformance: NCCL config /etc/nccl.conf: NCCL_P2P_LEVEL=LOC",
        "conformance: rung clean: NCCL_CONF_FILE=/dev/null and NCCL_P2P_LEVEL= (empty: NCCL reads an empty value as "
        "unset, and reads /etc/nccl.conf whatever NCCL_CONF_FILE says)",
        "note: NCCL_P2P_LEVEL=LOC is set in /etc/nccl.conf: unset cannot remove it (NCCL reads the file again); "
        "remove it there, or give it an empty value, which NCCL reads as unset",
    ],
    "gpu-lost": [
        "  GPU lost  gpu3 (GPU-nvid0003-0000-0000-0000-000000000003, 0000:48:00.0)  present*missing  NVML lists 7 "
        "GPU(s) now, 8 in the baseline",
        "REGRESSED: 2 regression(s) (1 GPU lost, 1 verdict, 0 bandwidth below 0.8x)*",
    ],
}

# Healthy machines the suite must not call broken: every test passes, exit 0, one green line.
PASSES = {
    "nvswitch-iommu-passthrough": ["everything passed: 80 cases in 7 classes; nothing to set"],
    "mig-enabled": [  # what cannot run is said, and the answer is not "everything passed"
        "NOT TESTED: every GPU pair and multi-GPU set (MIG is enabled on gpu0, gpu1, gpu2, gpu3, gpu4, gpu5, gpu6, "
        "gpu7: NCCL does not run across MIG instances (NVIDIA's MIG User Guide); to test them, disable MIG "
        "(`nvidia-smi -i <gpu> -mig 0`, then reset the GPU))",
        "what could run passed: 9 cases in 1 class; not tested above",
    ],
    "wsl-2gpu": [
        "WARNING host check host:platform: WSL: NCCL runs without its P2P transport here ('Legacy IPC not supported', "
        "src/transport/p2p.cc) and NVML cannot report the GPUs' modes (NVIDIA's CUDA on WSL guide); pairs move data "
        "through host memory",
        "everything passed: 14 cases in 4 classes; nothing to set",
    ],
    "xids-after-reset": [  # a GPU reset leaves its Xids in the kernel log: NVML's state says they are cleared
        "WARNING host check host:xid_log: gpu3: Xid 48 (double-bit ECC error) 1x in the kernel log since the driver's "
        "last load, cleared since: NVML's volatile uncorrectable ECC count is 0 now (it restarts when the GPU is "
        "initialised afresh); Xid 63 (row remapping pending) 1x in the kernel log since the driver's last load, "
        "cleared since: NVML reports no row remapping pending now (a reset applied it); Xid 154 (GPU recovery action "
        "changed) 1x in the kernel log since the driver's last load -> informational: the action it names is for "
        "this GPU's other Xids; gpu5: Xid 79 (GPU has fallen off the bus) 1x before the driver's last load, which "
        "reset the GPU ('NVRM: loading NVIDIA' in the kernel log)",
        "everything passed: 80 cases in 7 classes; nothing to set",
    ],
}

# Machines no case may run on: the run stops before any case, exit 4, with one line.
STOPS = {
    "nvml-driver-mismatch": "ERROR: conformance: simulated (*nvml-driver-mismatch-8gpu.json): this machine has NVIDIA "
    "GPUs (8 on the PCI bus: 0000:18:00.0, 0000:28:00.0, 0000:38:00.0, 0000:48:00.0 and 4 more; kernel module "
    "535.104.05) but NVML gives none (NVML unavailable: RM has detected an NVML/RM version mismatch): the driver was "
    "upgraded and the old kernel module is still loaded (kernel module 535.104.05, NVML library 550.54.15); reboot, "
    "or reload the module (*); or test the CPU on purpose with --backend gloo",
}


def header_command(name: str) -> list[str]:
    """The command a scenario's header ends with (its last comment line before ``[scenario]``)."""
    text = (SCENARIOS_DIR / f"{name}.toml").read_text()
    header = [line for line in text.partition("[scenario]")[0].splitlines() if line.startswith("#")]
    command = shlex.split(header[-1].removeprefix("#"))
    assert command[:4] == ["pytest", "suites/", "--scenario", name], header[-1]
    return command[2:]


def matches(line: str, pattern: str) -> bool:
    """``*`` stands for anything; every other character, brackets included, for itself."""
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.split("*")), line) is not None


def answer_lines(result: pytest.RunResult) -> list[str]:
    lines = result.outlines
    (start,) = [i for i, line in enumerate(lines) if "= conformance: the answer" in line]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("=")), len(lines))  # last: to the end
    return lines[start + 1 : end]


def test_every_shipped_scenario_has_its_expected_answer() -> None:
    assert sorted([*ANSWERS, *STOPS, *PASSES]) == shipped_scenarios()


@pytest.mark.parametrize("name", sorted(PASSES))
def test_a_shipped_healthy_machine_passes(pytester: pytest.Pytester, run_suite: RunSuite, name: str) -> None:
    files = copy_suites(pytester, *SUITE_FILES)
    result = run_suite(*header_command(name), *files, timeout=240)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert answer_lines(result) == PASSES[name]


@pytest.mark.parametrize("name", sorted(STOPS))
def test_a_shipped_machine_no_case_may_run_on_stops_the_run(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path, name: str
) -> None:
    files = copy_suites(pytester, *SUITE_FILES)
    result = run_suite(*header_command(name), *files, timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1 and matches(errors[0], STOPS[name]), result.stderr.str()
    assert "conformance: the answer" not in result.stdout.str()
    assert not reports_dir.exists() or not any(reports_dir.iterdir())  # no case ran: no run folder


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_the_whole_suite_on_a_shipped_scenario_gives_its_answer(
    pytester: pytest.Pytester, run_suite: RunSuite, name: str
) -> None:
    files = copy_suites(pytester, *SUITE_FILES)
    result = run_suite(*header_command(name), *files, timeout=240)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    got = answer_lines(result)
    assert len(got) == len(ANSWERS[name]), "\n".join(got)
    for line, pattern in zip(got, ANSWERS[name], strict=True):
        assert matches(line, pattern), f"{line!r} is not {pattern!r}"
    if name in ALSO:
        result.stdout.fnmatch_lines(ALSO[name])


def test_a_scenario_named_that_is_neither_a_file_nor_shipped_is_refused(
    pytester: pytest.Pytester, run_suite: RunSuite
) -> None:
    files = copy_suites(pytester, "test_environment.py")
    result = run_suite("--scenario", "no-such-machine", *files)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    here = Path(str(pytester.path))
    result.stderr.fnmatch_lines(
        [
            f"ERROR: conformance: command-line option --scenario: scenario file '{here}/no-such-machine' cannot be "
            f"read: No such file or directory (nor is it a shipped scenario: {', '.join(shipped_scenarios())})"
        ]
    )


def test_a_one_gpu_class_that_fails_as_it_is_passes_on_clean_whatever_runs_on_one_rung_beside_it(
    pytester: pytest.Pytester, run_suite: RunSuite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-GPU machine of the second real-GPU run, NCCL_NET naming no network: its one class passes on clean.

    NCCL 2.28.9's ncclNetInit (src/plugin/net.cc) fails every communicator when no plugin has the
    name NCCL_NET gives ("Failed to initialize any NET plugin"). test_torch_distributed_and_backend
    runs on inherited only and fails there too: it decides nothing for the class, whose other cases
    climb (docs/gpu-runs/2026-11-28-h200: the answer said "no setting fixes it").
    """
    monkeypatch.setenv("NCCL_NET", "Bogus")
    rule = 'effect = "error"\nphase = "init"\nmessage = "Failed to initialize any NET plugin"\n'
    rule += 'when_env = { NCCL_NET = "Bogus" }'
    scenario = pytester.makefile(".toml", bogus=scenario_text(rule, name="NCCL_NET names no network"))
    files = copy_suites(pytester, "test_collectives.py", "test_environment.py")
    topology = SCENARIOS_DIR / "topologies" / "single-gpu.json"
    result = run_suite(f"--topology-file={topology}", f"--scenario={scenario}", *files, timeout=240)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()  # inherited failed: the run says so
    assert answer_lines(result) == [
        f"single sets: ERROR on inherited (all_reduce 1/1, environment 1/1); {CLEAN_FIXED}",
        "for every class together: unset every NCCL_*/TORCH_NCCL_* variable",
    ]
