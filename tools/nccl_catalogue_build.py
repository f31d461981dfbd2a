"""The NCCL catalogue ``conformance diagnose`` ships, built from the pinned raw inputs: pure Python, no mirror.

    python tools/nccl_catalogue_build.py            writes conformance/diagnose/catalogues/nccl_*.json
    python tools/nccl_catalogue_build.py --check    exits 1 when what it would write differs

Reads ``tools/catalogue_inputs/nccl_warnings_raw.json`` and ``nccl_results_raw.json`` (written from NVIDIA/nccl's
sources by ``tools/nccl_catalogue_extract.py``) and gives every WARN format and every ``ncclResult_t`` code:

* a regex for the WARN text (what ``conformance.verdict.nccl_log.warning_text`` returns): each printf conversion
  a pattern of what it prints, the literal text escaped, anchored at the start only (a format's text past its
  first ``\\n`` is on the log's next line, and the text NCCL cuts at its buffer's end stays a match);
* a class and a fix, from ONE table of rules (:data:`RULES`), keyed on the source file the WARN is in and,
  where the file is not enough, on words of the format.  The first rule that fits wins; the last fits all.

Prints the entries per class.  The output is sorted and written with ``\\n`` line ends: a rerun is byte-identical,
and ``tests/test_catalogues.py`` checks the committed catalogue is this script's output.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from catalogue_files import write_or_check  # tools/ is the script's folder, and the tests put it on the path

REPO = Path(__file__).resolve().parent.parent
INPUTS = REPO / "tools" / "catalogue_inputs"
OUT = REPO / "conformance" / "diagnose" / "catalogues"

# The classes: those of conformance/verdict/job_causes.py (FailureClass.key) where one fits, and four the
# catalogue adds where none does; the titles as the answer would show them.
CLASSES = {
    "ib_network": "INFINIBAND/ROCE NETWORK ERROR",
    "network_interface": "TCP NETWORK OR BOOTSTRAP",
    "host_limit": "HOST LIMIT (/dev/shm, host memory)",
    "transport": "P2P OR TOPOLOGY",
    "machine_fault": "MACHINE FAULT (NVLS, Fabric Manager, IMEX, NVML)",
    "oom": "OUT OF MEMORY",
    "barrier_device": "TWO RANKS ON ONE GPU",
    "rendezvous": "PROCESSES DISAGREE BEFORE NCCL",
    "desync": "RANKS TOOK DIFFERENT CODE PATHS",
    "version_mismatch": "NCCL OR CUDA VERSION MISMATCH",
    "rank_error": "A PEER EXITED FIRST",
    "nccl_error": "NCCL ERROR",
    "hang": "HANG",
    # the catalogue's own
    "cuda_error": "CUDA ERROR",  # refined by the CUDA error's own meaning when the text names it
    "invalid_usage": "PROGRAM ERROR (INVALID USAGE)",
    "nccl_setting": "NCCL SETTING REFUSED",
    "net_plugin": "NCCL NETWORK PLUGIN",
    "proxy_network": "NCCL PROXY",
    "nccl_internal": "NCCL INTERNAL",
}

# --------------------------------------------------------------------------------------------
# The fixes: each an action (what to run, set or check).
# --------------------------------------------------------------------------------------------

FIX_IB_LINK = (
    "check the InfiniBand/RoCE ports of both hosts: `ibstat` or `ibv_devinfo` (State: PORT_ACTIVE at the expected "
    "rate), link errors with `perfquery -x`; on RoCE the GID index (`show_gids`, NCCL_IB_GID_INDEX) and the MTU "
    "along the path; leave a bad NIC out with NCCL_IB_HCA=^mlx5_N; a completion status 12 (retry exceeded) or 5 "
    "(flushed) is a peer or link that stopped answering: look for the peer's own first error too"
)
FIX_IB_VERBS = (
    "check the verbs call the line names: for ibv_reg_mr 'Cannot allocate memory' raise the locked-memory limit "
    "(`ulimit -l` unlimited; docker --ulimit memlock=-1; SLURM PropagateResourceLimits) and load nvidia-peermem "
    "(`lsmod | grep peermem`); for ibv_modify_qp, the GID index and route to the peer (`show_gids`, "
    "NCCL_IB_GID_INDEX); otherwise check the NIC is up and usable in this container (`ibv_devinfo`, "
    "/dev/infiniband mounted) and rdma-core matches the driver"
)
FIX_IB_SELECT = (
    "select NICs of one link type that every node reaches: NCCL_IB_HCA=<the NICs> (compare `ibv_devinfo -l` and "
    "`ibstat` on every node; a NIC down on one node gives it fewer devices than the others), and unset "
    "NCCL_IB_MERGE_NICS / NCCL_NET_FORCE_MERGE unless every node has the same NICs"
)
FIX_TCP = (
    "set NCCL_SOCKET_IFNAME to the interface every node reaches (`ip -br addr`; never lo or docker0), check no "
    "firewall blocks the ports between the nodes (`nc -zv <peer> <port>`) and that the process at the address the "
    "line names is still running (its own log says why it stopped)"
)
FIX_INTERFACE = (
    "name an interface that exists on every node and reaches the others: NCCL_SOCKET_IFNAME (and "
    "NCCL_OOB_NET_IFNAME, GLOO_SOCKET_IFNAME) = <interface> from `ip -br addr`; a container needs --network host "
    "or an interface of the node's network"
)
FIX_PEER_GONE = (
    "find the rank that failed first (its own log: an out-of-memory, a signal, an exception) and fix that: the "
    "peer at the address the line names closed its connection, this rank only lost it"
)
FIX_RENDEZVOUS = (
    "start every rank of one job once, with the same world size and one unique id: give each job its own "
    "MASTER_ADDR:MASTER_PORT (or NCCL_COMM_ID), and restart all ranks together rather than one alone"
)
FIX_SHM = (
    "check /dev/shm: `df -h /dev/shm` (Docker's default is 64 MB: run with --shm-size=16g or --ipc=host; "
    "Kubernetes: an emptyDir with medium: Memory mounted at /dev/shm) and that it is writable; NCCL_SHM_DISABLE=1 "
    "avoids it at a speed cost"
)
FIX_HOST_MEMORY = (
    "check the host's memory: `free -g`, the job's or container's memory limit (`--mem`, the pod's limits) and "
    "the pinned-memory limit (`ulimit -l`); run fewer ranks or smaller buffers per node"
)
FIX_P2P = (
    "test every GPU pair: `nvidia-smi topo -p2p r` and `pytest suites/ -k pair_exchange`; on PCIe with the IOMMU "
    "or ACS on, turn them off in the BIOS/kernel (iommu=pt) or set NCCL_P2P_DISABLE=1 (or NCCL_P2P_LEVEL=NVL)"
)
FIX_NVLINK = (
    "check the NVLinks: `nvidia-smi nvlink --status` and `nvidia-smi topo -m` (a link down or a GPU in a bad "
    "state: reset it or have the machine serviced); NCCL_P2P_LEVEL=NVL or NCCL_P2P_DISABLE=1 runs around it"
)
FIX_NVLS = (
    "check Fabric Manager on this NVSwitch system: `systemctl status nvidia-fabricmanager` (running, the same "
    "version as the driver), `nvidia-smi -q | grep -i -A3 fabric`; NCCL_NVLS_ENABLE=0 runs without NVLink SHARP"
)
FIX_IMEX = (
    "check the IMEX service multi-node NVLink needs: `nvidia-imex-ctl -N`, and the IMEX channel "
    "(/dev/nvidia-caps-imex-channels) mounted in the container; NCCL_MNNVL_ENABLE=0 runs without it"
)
FIX_NVML = (
    "check NVML works where the rank runs: `nvidia-smi` in the same container (the NVIDIA container toolkit "
    "mounts libnvidia-ml.so.1) and a driver that matches its kernel module (`cat /proc/driver/nvidia/version`)"
)
FIX_GDRCOPY = (
    "unset NCCL_GDRCOPY_ENABLE, or load the gdrdrv module that matches libgdrapi (`lsmod | grep gdrdrv`, "
    "GDRCopy >= 2.5 for gdr_pin_buffer_v2)"
)
FIX_CUDA = (
    "look up the CUDA error the line names: for 'out of memory' free the GPU or allocate less "
    "(`nvidia-smi --query-compute-apps=pid,used_memory --format=csv`); for others check the GPU's health "
    "(`nvidia-smi`, `dmesg | grep -i xid`) and that the driver supports this CUDA"
)
FIX_GPU_MEMORY = (
    "free GPU memory for NCCL: a process left on the GPU? (`nvidia-smi --query-compute-apps=pid,used_memory "
    "--format=csv`); allocate less in the job (batch size, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True); "
    "NCCL_NVLS_ENABLE=0 and a lower NCCL_MAX_NCHANNELS make NCCL's own buffers smaller"
)
FIX_ONE_GPU_PER_RANK = (
    "give each rank its own GPU: torch.cuda.set_device(local_rank) before init_process_group (and device_id=), "
    "no more ranks per node than GPUs; where sharing a GPU is meant, set what the line names "
    "(NCCL_MULTI_RANK_GPU_ENABLE=1)"
)
FIX_VERSION = (
    "load one NCCL on every rank, new enough for the GPU, the driver and the program: compare "
    "`python -c 'import torch; print(torch.cuda.nccl.version())'` on every node; one container image for all; "
    "no LD_LIBRARY_PATH or LD_PRELOAD bringing another libnccl.so"
)
FIX_DRIVER = (
    "check the CUDA driver NCCL loads: `nvidia-smi` (driver version), the driver must be new enough for the "
    "CUDA NCCL was built with; NCCL_CUDA_PATH, if set, must name the driver's libcuda.so"
)
FIX_DESYNC = (
    "set the same NCCL_* variables (NCCL_PROTO, NCCL_ALGO, ...) on every rank and find the rank whose collective "
    "differs in size or order: TORCH_DISTRIBUTED_DEBUG=DETAIL names the shapes, the flight recorder the sequence"
)
FIX_USAGE = (
    "fix the call in the job's code or in the library that makes it (the line names the argument): every rank on "
    "its own GPU, valid ranks, counts and pointers, a communicator used by one thread at a time and not after it "
    "was destroyed; NCCL_DEBUG=WARN on every rank shows which call"
)
FIX_SETTING = (
    "correct or unset the variable the line names (`env | grep ^NCCL_`, and /etc/nccl.conf or ~/.nccl.conf, "
    "which NCCL also reads)"
)
FIX_NET_PLUGIN = (
    "check NCCL_NET and NCCL_NET_PLUGIN name a plugin installed on every node (`ldconfig -p | grep nccl-net`), "
    "or unset them to let NCCL choose IB or sockets; rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET to see "
    "why each network was refused"
)
FIX_PLUGIN = (
    "unset the plugin variable (NCCL_TUNER_PLUGIN, NCCL_PROFILER_PLUGIN, NCCL_GIN_PLUGIN, ...) or install a "
    "plugin of the version this NCCL loads; NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT names the one it tried"
)
FIX_PROXY = (
    "find a rank on the same host that exited first (its log) and fix that; local ranks must share one network "
    "namespace and /tmp (docker --network host --ipc host, one pod); rerun with NCCL_DEBUG=INFO "
    "NCCL_DEBUG_SUBSYS=INIT,PROXY,NET to see the step that failed"
)
FIX_COLLNET = (
    "unset NCCL_COLLNET_ENABLE (and NCCL_ALGO=COLLNET*), or install the CollNet (SHARP) plugin on every node "
    "and check its service (`sharp_hello` / `ibdiagnet`)"
)
FIX_UNKNOWN = (
    "rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET (add the subsystem of the file the line names), and "
    "report it at https://github.com/NVIDIA/nccl/issues with every rank's log and `nvidia-smi topo -m`; "
    "upgrade NCCL if a later release notes it fixed"
)


@dataclass(frozen=True)
class Rule:
    """Files (globs over the path in NVIDIA/nccl) and words (a regex searched in the format) to a class and fix."""

    name: str
    cls: str
    fix: str
    paths: tuple[str, ...] = ()  # empty: any file
    words: str = ""  # empty: any format

    def fits(self, path: str, fmt: str) -> bool:
        in_path = not self.paths or any(fnmatch.fnmatchcase(path, glob) for glob in self.paths)
        return in_path and (not self.words or re.search(self.words, fmt) is not None)


_IB_PATHS = (
    "src/transport/net_ib*", "src/transport/net_ib/*", "src/transport/gdaki/*", "src/misc/ibvwrap.cc",
    "src/misc/ibvsymbols.cc", "src/misc/mlx5dvwrap.cc", "src/include/ibvwrap.h", "src/include/mlx5/*",
    "*/ib_plugin.c*",  # an IB net plugin's (nccl-rdma-sharp-plugins src/ib_plugin.c), should one be catalogued
)  # fmt: skip
# fnmatch's "*" matches "/" too: "src/transport/net_ib*" is net_ib.cc (<= 2.22) and all of net_ib/ (>= 2.23).
_ARGUMENT_CHECKS = (
    "src/enqueue.cc", "src/init.cc", "src/group.cc", "src/collectives.cc", "src/collectives/*", "src/misc/argcheck.cc",
    "src/include/argcheck.h",
)  # fmt: skip
_NCCL_VARIABLE_REFUSED = (
    r"NCCL_[A-Z0-9_]+.*(?:ignor|[Ii]nvalid|out of range|too (?:big|small)|greater than|power of 2|must |unknown value"
    r"|[Pp]lease|[Ll]imiting|cap it|not a valid|verify|is set)|(?:ignor|[Ii]nvalid|out of range).*NCCL_[A-Z0-9_]+"
)

# ONE table: the first rule that fits a WARN (its file, then its words) gives its class and fix.
RULES: tuple[Rule, ...] = (
    # init.cc (initTransportsRank) and topo.cc (ncclCheckMultiRank): two ranks found on one GPU (busId), "Duplicate
    # GPU detected", "Multiple ranks detected using the same GPU"; nvls.cc refuses NVLS for ranks sharing a device.
    Rule("two ranks, one GPU", "barrier_device", FIX_ONE_GPU_PER_RANK,
         words=r"Duplicate GPU detected|[Mm]ultiple [Rr]anks (?:detected )?(?:are )?using the same|same NVML device"),
    # init.cc (bootstrap allgather of versions), ras.cc (RAS peers), dev_runtime.cc and devcomm (the device API's
    # ABI check), plugin/net.cc (device unpack plugin): NCCL versions that differ between ranks or from the build.
    Rule("versions differ", "version_mismatch", FIX_VERSION,
         words=r"Mismatched NCCL version|version mismatch|NCCL library (?:version )?is too old|compiled with "
               r"(?:too old version of )?NCCL version|not backwards compatible|has incompatible version"),
    # misc/socket.cc socketProgress: recv() returned 0, the peer's end was closed (returns ncclRemoteError).
    Rule("peer closed", "rank_error", FIX_PEER_GONE, words=r"Connection closed by remote peer"),
    # transport/nvls.cc: NVLink SHARP multicast objects, made through the Fabric Manager on NVSwitch systems.
    Rule("NVLS", "machine_fault", FIX_NVLS, paths=("src/transport/nvls.cc",)),
    # mnnvl.cc: multi-node NVLink (GB200 NVL), whose cross-node memory sharing needs the IMEX service.
    Rule("MNNVL / IMEX", "machine_fault", FIX_IMEX, paths=("src/mnnvl.cc",)),
    Rule("MNNVL / IMEX", "machine_fault", FIX_IMEX, words=r"\bMNNVL\b|IMEX"),
    # include/checks.h CUDACHECK (runtime API) and include/cudawrap.h CUCHECK (driver API, used by alloc.h's cuMem
    # allocations): "Cuda failure [<n>] '<cudaGetErrorString>'"; the error's own meaning is the class.
    Rule("CUDA call", "cuda_error", FIX_CUDA, words=r"^Cuda failure|CUDA error|CUDA failure"),
    # include/alloc.h ncclCudaMalloc / ncclCudaCalloc: cudaMalloc or cuMemCreate of GPU memory failed.
    Rule("GPU memory", "oom", FIX_GPU_MEMORY, words=r"^Failed to CUDA (?:malloc|calloc)"),
    # include/alloc.h ncclCudaHostCalloc / ncclCalloc, include/checks.h (NCCLCHECK of a malloc), misc/utils.cc:
    # host (pinned) memory.
    Rule("host memory", "host_limit", FIX_HOST_MEMORY,
         words=r"^Failed to (?:CUDA host alloc|malloc)|malloc\(size=|^Allocation failed(?: at %s:%d)?$"),
    # bootstrap.cc's root: what each rank sends at check-in (nranks, its rank) disagrees, or a rank checks in twice.
    Rule("bootstrap root", "rendezvous", FIX_RENDEZVOUS,
         words=r"^Bootstrap Root|^Message truncated|improper usage of ncclCommInitRank"),
    # transport/net_socket.cc, net_ib (tag matching): a message longer than the receive posted for it, which NCCL's
    # own text puts down to collective sizes or NCCL_PROTO/NCCL_ALGO differing between ranks.
    Rule("sizes differ", "desync", FIX_DESYNC,
         words=r"message truncated|collective mismatch error|posted incorrect receive info"),
    # bootstrap.cc / misc/socket.cc ncclFindInterfaces: no interface matches NCCL_SOCKET_IFNAME/NCCL_OOB_NET_IFNAME.
    Rule("no interface", "network_interface", FIX_INTERFACE,
         words=r"IFNAME|no socket interface|[Nn]o usable listening interface|[Nn]o (?:IP )?interface found"),
    # init.cc (after the all-gather of each rank's NICs): nodes see different numbers of network devices.
    Rule("NICs differ between nodes", "ib_network", FIX_IB_SELECT, words=r"mixed local (?:Net|CollNet) device counts"),
    # The program's own calls: ncclConfig_t / ncclSimInfo_t / device-API structs not made by their initializers.
    Rule("struct not initialised", "invalid_usage", FIX_USAGE, words=r"(?:not|must be) initiali[sz]ed via NCCL_"),
    # enqueue.cc (ncclEnqueueCheck, ncclRedOp*), init.cc (ncclCommInitRank*, config), group.cc, misc/argcheck.cc
    # (CudaPtrCheck, ArgsCheck): the checks of what the program passed; they return ncclInvalidArgument/Usage.
    Rule("argument checks", "invalid_usage", FIX_USAGE, paths=("src/misc/argcheck.cc", "src/include/argcheck.h")),
    Rule("argument checks", "invalid_usage", FIX_USAGE, paths=_ARGUMENT_CHECKS,
         words=r"[Ii]nvali[dg]|argument|NULL|not allowed|without a matching|not in a group|exceeds ndev|already "
               r"been destroyed|before the previous operation|revoked|must either|[Ee]ither none or all|within a NCCL "
               r"group"),
    # enqueue.cc topoGetAlgoInfo: NCCL_ALGO / NCCL_PROTO leave no algorithm for this collective and type.
    Rule("no algorithm", "nccl_setting", "unset NCCL_ALGO and NCCL_PROTO, or allow one that supports this collective "
         "and data type (the line names both)", words=r"algorithm/protocol available"),
    # param.cc, init.cc, graph/*.cc, transport/*.cc: a value of an NCCL_* variable refused, limited or ignored.
    Rule("NCCL variable", "nccl_setting", FIX_SETTING, words=_NCCL_VARIABLE_REFUSED),
    # graph/xml.cc: the files NCCL_TOPO_FILE and NCCL_GRAPH_FILE name.
    Rule("topology file", "nccl_setting", "check the file NCCL_TOPO_FILE or NCCL_GRAPH_FILE names exists, is readable "
         "and is NCCL's XML of this NCCL version (or unset the variable)", words=r"XML (?:graph|topology) file|XML "
         r"(?:Graph|Topology) has wrong version"),
    # transport/coll_net.cc, transport.cc: CollNet (SHARP) through its plugin.
    Rule("CollNet", "nccl_setting", FIX_COLLNET, paths=("src/transport/coll_net.cc",)),
    Rule("CollNet", "nccl_setting", FIX_COLLNET, words=r"CollNet"),
    # strongstream.cc, alloc.h, proxy.cc, enqueue.cc: features that need a newer CUDA driver than the one loaded.
    Rule("CUDA driver", "version_mismatch", FIX_DRIVER,
         words=r"old driver|driver < R|requires CUDA driver|prior to CUDA|CUDA runtime >="),
    # The verbs library NCCL opens with dlopen (misc/ibvwrap.cc, ibvsymbols.cc, mlx5dvwrap.cc: "Call to <verb>
    # failed with error <strerror>") and the IB transport's device opening and queries (transport/net_ib).
    Rule("IB verbs call", "ib_network", FIX_IB_VERBS, paths=_IB_PATHS,
         words=r"Call to|ibv_|mlx5dv_|dlvsym|lib wrapper|Unable to (?:open|query)|DMA-BUF|[Pp]eermem"),
    # transport/net_ib (merged and virtual NICs, link layers of both ends).
    Rule("IB NIC selection", "ib_network", FIX_IB_SELECT, paths=_IB_PATHS,
         words=r"merge|link_layer|link type|incompatible devices|virtual (?:device|NIC)|vNic|different number of dev"),
    # transport/net_ib.cc (<= 2.22), transport/net_ib/*.cc (>= 2.23), gdaki: the InfiniBand/RoCE transport: its
    # completions, async events, queue pairs; and the IB net plugins (nccl-rdma-sharp-plugins' ib_plugin.c).
    Rule("IB network", "ib_network", FIX_IB_LINK, paths=_IB_PATHS),
    # misc/ipcsocket.cc, os/*ipcsocket.cc: the Unix sockets local ranks pass cuMem handles over (the proxy's).
    Rule("local IPC sockets", "proxy_network", FIX_PROXY, paths=("src/misc/ipcsocket.cc", "src/os/*ipcsocket.cc")),
    # misc/socket.cc (every TCP socket NCCL opens), transport/net_socket.cc (the socket network transport),
    # bootstrap.cc (the ring of ranks made at init over sockets), os/*socket*: the TCP network between ranks.
    Rule("TCP network", "network_interface", FIX_TCP,
         paths=("src/misc/socket.cc", "src/transport/net_socket.cc", "src/bootstrap.cc", "src/os/*socket_pair.cc")),
    Rule("TCP network", "network_interface", FIX_TCP, paths=("src/os/*.cc",),
         words=r"[Ss]ocket|[Cc]onnect|[Aa]ccept|WSA|[Aa]dapter"),
    # transport/shm.cc's argument checks are of NCCL's own calls (its proxy's SHM registrations), not the program's.
    Rule("SHM argument", "nccl_internal", FIX_UNKNOWN, paths=("src/transport/shm.cc",), words=r"^Invalid argument"),
    # transport/shm.cc (the SHM transport's buffers), misc/shmutils.cc and os/*.cc ncclShmOpen: files in /dev/shm.
    Rule("/dev/shm", "host_limit", FIX_SHM, paths=("src/transport/shm.cc", "src/misc/shmutils.cc")),
    Rule("/dev/shm", "host_limit", FIX_SHM, paths=("src/os/*.cc",),
         words=r"shared memory|failed to extend|Could not map|munmap|[Uu]nmapViewOfFile"),
    # graph/paths.cc (NVLink P2P refused by the driver): a link or GPU fault.
    Rule("NVLink P2P", "transport", FIX_NVLINK, words=r"P2P is disabled between NVLINK"),
    # transport/p2p.cc (cudaIpc/cuMem handles, peer access), graph/paths.cc (P2P between GPUs and to NICs),
    # transport/net.cc's peer access for PXN.
    Rule("P2P", "transport", FIX_P2P, paths=("src/transport/p2p.cc", "src/graph/paths.cc")),
    Rule("P2P", "transport", FIX_P2P, words=r"failed to peer with device"),
    # proxy.cc: the proxy thread that progresses network and cuMem transfers and serves local ranks' requests.
    Rule("proxy", "proxy_network", FIX_PROXY, paths=("src/proxy.cc",)),
    # plugin/net.cc, net.cc: loading the network plugins (external libnccl-net*.so, then IB, then sockets).
    Rule("net plugin", "net_plugin", FIX_NET_PLUGIN, paths=("src/plugin/net.cc", "src/plugin/net/*", "src/net.cc")),
    # plugin/*: the tuner, profiler, env, GIN and RMA plugins NCCL_*_PLUGIN names.
    Rule("other plugin", "nccl_setting", FIX_PLUGIN, paths=("src/plugin/*", "src/misc/tuner.cc")),
    # misc/nvmlwrap.cc: NVML (libnvidia-ml.so.1), which NCCL opens to read the GPUs' topology and NVLinks.
    Rule("NVML", "machine_fault", FIX_NVML, paths=("src/misc/nvmlwrap.cc",)),
    Rule("NVML", "machine_fault", FIX_NVML, words=r"libnvidia-ml|nvml\.dll|NVML device"),
    # misc/gdrwrap.cc, include/gdrwrap.h: GDRCopy (NCCL_GDRCOPY_ENABLE=1), through libgdrapi and the gdrdrv module.
    Rule("GDRCopy", "machine_fault", FIX_GDRCOPY, paths=("src/misc/gdrwrap.cc", "src/include/gdrwrap.h")),
    # misc/cudawrap.cc: loading libcuda.so and its entry points (cuGetProcAddress) at init.
    Rule("CUDA driver", "version_mismatch", FIX_DRIVER, paths=("src/misc/cudawrap.cc",)),
    # Everything else: NCCL's own consistency checks (graph search, proxy ops, registration, GIN/RMA state).
    Rule("NCCL internal", "nccl_internal", FIX_UNKNOWN),
)  # fmt: skip


def rule_for(path: str, fmt: str) -> Rule:
    return next(rule for rule in RULES if rule.fits(path, fmt))


# --------------------------------------------------------------------------------------------
# Format string to regex
# --------------------------------------------------------------------------------------------

# printf's conversion specification (C11 7.21.6.1): flags, width, precision, length, conversion; glibc's %m.
_SPEC = re.compile(
    r"%(?P<flags>[-+ #0']*)(?P<width>\d+|\*)?(?:\.(?P<precision>\d+|\*)?)?(?P<length>hh|h|ll|l|L|q|j|z|Z|t)?"
    r"(?P<conversion>[diouxXeEfFgGaAcspnm%])"
)
_PARAM = re.compile(r"\$\{(?P<name>\w+)\}")  # a #define's parameter, as the extractor writes it
_NUMBERS = {
    "d": r"[-+ ]?\d+", "i": r"[-+ ]?\d+", "u": r"\d+", "o": r"[0-7]+", "x": r"(?:0x)?[0-9a-f]+",
    "X": r"(?:0X)?[0-9A-F]+", "p": r"(?:0x[0-9a-fA-F]+|\(nil\))", "c": r".",
}  # fmt: skip
_FLOAT = r"[-+ ]?(?:[0-9.]+(?:[eE][-+]?\d+)?|0x[0-9a-fA-F.]+(?:p[-+]?\d+)?|inf|nan|INF|NAN)"
MIN_LITERAL = 6  # a format with less literal text than this ("%s") would match any line: kept, never matched


def conversion_pattern(m: re.Match[str]) -> str:
    """What one conversion prints, as a regex: text non-greedy, numbers as digits (padded to a width)."""
    conversion = m["conversion"]
    if conversion == "%":
        return "%"
    if conversion == "n":
        return ""
    if conversion in "sm":
        return ".*?"
    body = _NUMBERS.get(conversion, _FLOAT)
    return r" *" + body if m["width"] else body


def message_part(fmt: str) -> str:
    """The part of a format the WARN line holds: up to its first newline, stripped as warning_text strips it."""
    return fmt.strip().split("\n", 1)[0].strip()


@dataclass(frozen=True)
class Pattern:
    """A format's regex, how many literal characters it has, and what a matcher indexes it by."""

    regex: str
    literal: int
    word: str  # its first word when all literal (the text's first word must be it), else ""
    needle: str  # its longest literal piece (a text without it cannot match)


def pattern_of(fmt: str, params: list[str]) -> Pattern:
    """The regex of a format's WARN text, anchored at its start only, and what indexes it."""
    text = message_part(fmt)
    out, literals, at = [r"\A"], [], 0
    pieces = [(m.start(), m.end(), conversion_pattern(m)) for m in _SPEC.finditer(text)]
    pieces += [(m.start(), m.end(), r"\S+?") for m in _PARAM.finditer(text) if m["name"] in params]
    for start, end, pattern in sorted(pieces):
        if start < at:
            continue  # a "${" inside a conversion cannot be; kept safe all the same
        literals.append(text[at:start])
        out += [re.escape(text[at:start]), pattern]
        at = end
    literals.append(text[at:])
    out.append(re.escape(text[at:]))
    word = text.split(None, 1)[0] if text.strip() else ""
    word = "" if not literals[0].startswith(word) or not word else word
    return Pattern("".join(out), sum(map(len, literals)), word, max(literals, key=len))


# --------------------------------------------------------------------------------------------
# ncclResult_t
# --------------------------------------------------------------------------------------------

# Each code's class and fix, with torch's wording of it in mind: ProcessGroupNCCL raises "NCCL error in: <file>:<line>,
# <ncclGetErrorString>, NCCL version <v>" then getNcclErrorDetailStr's line (torch/csrc/distributed/c10d/NCCLUtils.cpp):
# "ncclUnhandledCudaError: Call to CUDA function failed.", "ncclSystemError: System call (e.g. socket, malloc) or
# external library call failed or device error.", "ncclInternalError: Internal check failed.", "ncclInvalidArgument:
# Invalid value for an argument.", "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
# "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.", and
# "Last error:" with ncclGetLastError (the last WARN's text).  ncclSuccess and ncclNumResults are no failures.
RESULT_RULES: dict[str, tuple[str, str]] = {
    "ncclUnhandledCudaError": ("cuda_error", "read the CUDA error in the WARN before it (torch's \"Last error:\" "
                               "line, or rerun with NCCL_DEBUG=WARN): " + FIX_CUDA),
    "ncclSystemError": ("nccl_error", "read the failed system call in the WARN before it (torch's \"Last error:\" "
                        "line, or rerun with NCCL_DEBUG=WARN); the usual ones: /dev/shm too small (`df -h /dev/shm`), "
                        "the locked-memory limit (`ulimit -l`), a socket to a peer that exited or is unreachable"),
    "ncclInternalError": ("nccl_internal", FIX_UNKNOWN),
    "ncclInvalidArgument": ("invalid_usage", FIX_USAGE),
    "ncclInvalidUsage": ("invalid_usage", FIX_USAGE + "; a setting that leaves no algorithm or network (NCCL_ALGO, "
                         "NCCL_PROTO, NCCL_NET) returns it too: unset those"),
    "ncclRemoteError": ("rank_error", "find the rank or node that failed first (its own log: out of memory, a signal, "
                        "an exception, a node that went down) and fix that; if every rank was still running, check "
                        "the network between the nodes (`ibstat`, `ip -br addr`, the suite's across_nodes run)"),
    "ncclInProgress": ("nccl_error", "wait for a nonblocking communicator before using it: poll "
                       "ncclCommGetAsyncError until it is no longer ncclInProgress (torch: unset "
                       "TORCH_NCCL_USE_COMM_NONBLOCKING to initialise blocking)"),
    "ncclTimeout": ("hang", "find the rank that did not reach the operation (the flight recorder: "
                    "TORCH_NCCL_TRACE_BUFFER_SIZE=2000, TORCH_NCCL_DUMP_ON_TIMEOUT=1) and test every GPU pair and "
                    "node pair with the suite; raise the timeout only for a job known to pause that long"),
    "default": ("version_mismatch", "load one NCCL in the whole process: a result code this NCCL does not know comes "
                "from a newer NCCL or plugin than the library that printed it (compare "
                "`python -c 'import torch; print(torch.cuda.nccl.version())'` with the plugin's NCCL)"),
}  # fmt: skip
_NOT_FAILURES = ("ncclSuccess", "ncclNumResults")


def results(raw: dict[str, object]) -> list[dict[str, object]]:
    out = []
    for record in raw["records"]:  # type: ignore[attr-defined]
        name = str(record["name"])
        if name in _NOT_FAILURES:
            continue
        cls, fix = RESULT_RULES.get(name, ("nccl_internal", FIX_UNKNOWN))
        provenance = {k: record[k] for k in ("enum_at", "string_at", "first_version", "last_version")}
        out.append({"name": name, "value": record["value"], "string": record["string"], "class": cls, "fix": fix,
                    "provenance": provenance})  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------
# The catalogue
# --------------------------------------------------------------------------------------------


def warnings(raw: dict[str, object]) -> list[dict[str, object]]:
    out = []
    for record in raw["records"]:  # type: ignore[attr-defined]
        fmt, path = str(record["format"]), str(record["file"])
        pattern = pattern_of(fmt, list(record["macro_params"]))
        re.compile(pattern.regex)  # every regex compiles, here rather than in a user's run
        rule = rule_for(path, fmt)
        provenance = {k: record[k] for k in ("file", "line", "first_version", "last_version", "missing_between")}
        out.append({"format": fmt, "regex": pattern.regex, "literal": pattern.literal, "word": pattern.word,
                    "needle": pattern.needle, "matchable": pattern.literal >= MIN_LITERAL, "class": rule.cls,
                    "fix": rule.fix, "rule": rule.name, "provenance": provenance})  # fmt: skip
    return out


def _source(raw: dict[str, object]) -> dict[str, object]:
    source = dict(raw["source"])  # type: ignore[call-overload]
    source.pop("commits", None)  # in the raw input, pinned there
    return {**source, "builder": "tools/nccl_catalogue_build.py"}


def built() -> dict[Path, str]:
    """What the build writes: each file's text."""
    warnings_raw = json.loads((INPUTS / "nccl_warnings_raw.json").read_text())
    results_raw = json.loads((INPUTS / "nccl_results_raw.json").read_text())
    catalogue = {"source": _source(warnings_raw), "classes": CLASSES, "entries": warnings(warnings_raw)}
    codes = {"source": _source(results_raw), "classes": CLASSES, "entries": results(results_raw)}
    return {OUT / "nccl_warnings.json": _dumps(catalogue), OUT / "nccl_results.json": _dumps(codes)}


def _dumps(value: object) -> str:
    return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def counts(texts: dict[Path, str]) -> str:
    """Entries per class, one line each, as the build prints them."""
    entries = json.loads(texts[OUT / "nccl_warnings.json"])["entries"]
    per_class = Counter(e["class"] for e in entries)
    lines = [f"{len(entries)} NCCL WARN formats ({sum(not e['matchable'] for e in entries)} too short to match):"]
    lines += [f"  {cls:18} {n:4}  {CLASSES.get(cls, cls)}" for cls, n in sorted(per_class.items(), key=lambda c: -c[1])]
    codes = json.loads(texts[OUT / "nccl_results.json"])["entries"]
    lines.append(f"{len(codes)} ncclResult_t entries: " + ", ".join(f"{c['name']}={c['class']}" for c in codes))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    args = parser.parse_args(argv)
    texts = built()
    print(counts(texts))
    return write_or_check(texts, args.check)


if __name__ == "__main__":
    sys.exit(main())
