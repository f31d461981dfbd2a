"""Unit tests of :mod:`conformance.verdict.nccl_log` on NCCL_DEBUG=INFO text written from NCCL's documented formats.

Each era gets one realistic per-process log (version, bootstrap, env, channel lines, init progress).
The line formats are those of NCCL's ``src/transport/{p2p,shm,net,coll_net}.cc``, ``src/init.cc`` and
``src/debug.cc`` and of logs quoted in NCCL issues; see the module docstring of ``nccl_log``.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from conformance.verdict.nccl_facts import RECORD_WARNINGS, CommInit, Connection, NcclLog
from conformance.verdict.nccl_log import parse, parse_files
from conformance.verdict.nccl_transport import TRANSPORTS, classify

P = "node-a:12345:12399 [0] NCCL INFO "  # the real INFO line prefix: host:pid:tid [cudaDev]


def conn(
    channel: int,
    conn_index: int | None,
    src: int,
    dst: int,
    src_dev: str | None,
    dst_dev: str | None,
    direction: str | None,
    transport: str,
    flags: tuple[str, ...],
    detail: str,
    relay_rank: int | None = None,
) -> Connection:
    return Connection(channel, conn_index, src, dst, src_dev, dst_dev, direction, transport, flags, detail, relay_rank)


# --------------------------------------------------------------------------------------------
# every documented transport line, one at a time
# --------------------------------------------------------------------------------------------

DOCUMENTED_LINES = [
    # <= 2.6
    ("Ring 00 : 0[0] -> 1[1] via P2P/IPC", conn(0, None, 0, 1, "0", "1", None, "P2P_IPC", (), "P2P/IPC")),
    (
        "Ring 00 : 15 -> 0 [send] via NET/Socket/0",
        conn(0, None, 15, 0, None, None, "send", "NET_SOCKET", (), "NET/Socket/0"),
    ),
    (
        "Ring 00 : 2[3d000] -> 3[3e000] via direct shared memory",
        conn(0, None, 2, 3, "3d000", "3e000", None, "SHM", (), "direct shared memory"),
    ),
    # the oldest logs print neither devices nor a direction
    (
        "Ring 00 : 0 -> 1 via direct shared memory",
        conn(0, None, 0, 1, None, None, None, "SHM", (), "direct shared memory"),
    ),
    ("Ring 00 : 1 -> 0 via NET/IB/0", conn(0, None, 1, 0, None, None, None, "NET_IB", (), "NET/IB/0")),
    # 2.7 - 2.11
    (
        "Channel 00 : 0[1a000] -> 1[1b000] via P2P/IPC/read",
        conn(0, None, 0, 1, "1a000", "1b000", None, "P2P_IPC", ("read",), "P2P/IPC/read"),
    ),
    (
        "Channel 01 : 3[3000] -> 0[2000] [receive] via NET/Socket/0",
        conn(1, None, 3, 0, "3000", "2000", "receive", "NET_SOCKET", (), "NET/Socket/0"),
    ),
    # 2.12 - 2.18
    (
        "Channel 00/0 : 8[0] -> 15[7] via P2P/IPC/read",
        conn(0, 0, 8, 15, "0", "7", None, "P2P_IPC", ("read",), "P2P/IPC/read"),
    ),
    (
        "Channel 00 : 1[1] -> 0[0] via SHM/direct/direct",
        conn(0, None, 1, 0, "1", "0", None, "SHM", (), "SHM/direct/direct"),
    ),
    # >= 2.19
    (
        "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        conn(0, 0, 0, 1, "0", "1", None, "P2P_CUMEM", ("read",), "P2P/CUMEM/read"),
    ),
    (
        "Channel 05/1 : 0[0] -> 1[1] via P2P/CUMEM/CE",
        conn(5, 1, 0, 1, "0", "1", None, "P2P_CUMEM", ("CE",), "P2P/CUMEM/CE"),
    ),
    (
        "Channel 02/0 : 3[3] -> 4[4] via P2P/CUMEM/read/CE",
        conn(2, 0, 3, 4, "3", "4", None, "P2P_CUMEM", ("CE", "read"), "P2P/CUMEM/read/CE"),
    ),
    ("Channel 00/0 : 0[0] -> 4[0] via P2P/MNNVL", conn(0, 0, 0, 4, "0", "0", None, "P2P_MNNVL", (), "P2P/MNNVL")),
    (
        "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/CE",
        conn(0, 0, 0, 1, "0", "1", None, "P2P_IPC", ("CE",), "P2P/IPC/CE"),
    ),
    (
        "Channel 03/0 : 0[0] -> 1[1] via P2P/direct pointer/read",
        conn(3, 0, 0, 1, "0", "1", None, "P2P_DIRECT", ("read",), "P2P/direct pointer/read"),
    ),
    (
        "Channel 00 : 0[1a000] -> 1[1b000] via P2P/direct pointer",
        conn(0, None, 0, 1, "1a000", "1b000", None, "P2P_DIRECT", (), "P2P/direct pointer"),
    ),
    (
        "Channel 01/0 : 0[0] -> 3[3] via P2P/indirect/2[2]/read",
        conn(1, 0, 0, 3, "0", "3", None, "P2P_INDIRECT", ("read",), "P2P/indirect/2[2]/read", 2),
    ),
    ("Channel 00 : 0[0] -> 1[1] via SHM/CE/CE", conn(0, None, 0, 1, "0", "1", None, "SHM", ("CE",), "SHM/CE/CE")),
    (
        "Channel 00 : 0[0] -> 1[1] via SHM/CE/direct",
        conn(0, None, 0, 1, "0", "1", None, "SHM", ("CE",), "SHM/CE/direct"),
    ),
    (
        "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
        conn(0, 0, 0, 8, "0", "0", "send", "NET_IB", ("GDRDMA",), "NET/IB/0/GDRDMA"),
    ),
    (
        "Channel 01/1 : 9[1] -> 1[1] [receive] via NET/IB/1(3)/GDRDMA/Shared",
        conn(1, 1, 9, 1, "1", "1", "receive", "NET_IB", ("GDRDMA", "PXN", "shared"), "NET/IB/1(3)/GDRDMA/Shared", 3),
    ),
    (
        "Channel 02/1 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA(PCI)/Shared",
        conn(2, 1, 0, 8, "0", "0", "send", "NET_IB", ("GDRDMA", "shared"), "NET/IB/0/GDRDMA(PCI)/Shared"),
    ),
    (
        "Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0",
        conn(0, 0, 1, 2, "1", "0", "send", "NET_SOCKET", (), "NET/Socket/0"),
    ),
    (
        "Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0",
        conn(0, 0, 0, 8, "0", "0", "send", "NET_PLUGIN", (), "NET/AWS Libfabric/0"),
    ),
    (
        "Channel 01/1 : 3[0] -> 0[1] [send] via NET/NCCL RDMA Plugin v6/0(2)/GDRDMA/Shared",
        conn(
            1,
            1,
            3,
            0,
            "0",
            "1",
            "send",
            "NET_PLUGIN",
            ("GDRDMA", "PXN", "shared"),
            "NET/NCCL RDMA Plugin v6/0(2)/GDRDMA/Shared",
            2,
        ),
    ),
    (
        "Channel 02/0 : 3[1] -> 4[0] [receive] via NET/IBext_v8/0/GDRDMA",
        conn(2, 0, 3, 4, "1", "0", "receive", "NET_PLUGIN", ("GDRDMA",), "NET/IBext_v8/0/GDRDMA"),
    ),
    # CollNet: one rank, no peer
    (
        "CollNet 00/0 : 3 [send] via COLLNET/SHARP/0/GDRDMA",
        conn(0, 0, 3, 3, None, None, "send", "COLLNET", ("GDRDMA",), "COLLNET/SHARP/0/GDRDMA"),
    ),
    (
        "Coll 01 : 2 [receive] via COLLNET/SHARP/1",
        conn(1, None, 2, 2, None, None, "receive", "COLLNET", (), "COLLNET/SHARP/1"),
    ),
]


@pytest.mark.parametrize(("message", "expected"), DOCUMENTED_LINES, ids=[line for line, _ in DOCUMENTED_LINES])
def test_each_documented_transport_line(message: str, expected: Connection) -> None:
    log = parse(P + message + "\n")
    assert log.connections == [expected]


def test_classify_names_every_form() -> None:
    assert classify("P2P/CUMEM/read") == ("P2P_CUMEM", ("read",), None)
    assert classify("P2P/MNNVL/read/CE") == ("P2P_MNNVL", ("CE", "read"), None)
    assert classify("NET/Socket/3") == ("NET_SOCKET", (), None)
    assert classify("NET/IB/1(3)/GDRDMA/Shared") == ("NET_IB", ("GDRDMA", "PXN", "shared"), 3)
    assert classify("NVLS") == ("NVLS", (), None)
    # a line torn by another process, and the same-device error path: kept, but as OTHER
    assert classify("P2P/IPCrank") == ("OTHER", (), None)
    assert classify("P2P/common device") == ("OTHER", (), None)
    assert classify("") == ("OTHER", (), None)


def test_a_torn_via_is_kept_as_other() -> None:
    log = parse(P + "Channel 00/0 : 0[0] -> 1[1] via P2P/Iproxy\n")
    assert log.connections == [conn(0, 0, 0, 1, "0", "1", None, "OTHER", (), "P2P/Iproxy")]
    assert log.transports() == {"OTHER": 1}


def test_ring_summaries_trees_and_trace_receive_lines_are_not_connections() -> None:
    text = "".join(
        P + message + "\n"
        for message in (
            "Channel 00/02 :    0   1   2   3",
            "Channel 00 :    0   1",
            "Ring 00 : 0 1 2 3",
            "Trees [0] 1/-1/-1->0->-1 [1] -1/-1/-1->0->1",
            "Ring 00 : 1[1] <- 0[0] via P2P/CUMEM",  # TRACE-only receive side
            "Connected all rings",
            "24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer",
        )
    )
    assert parse(text).connections == []


# --------------------------------------------------------------------------------------------
# one realistic log per era
# --------------------------------------------------------------------------------------------

# <= 2.6 (2.4.8): 4 ranks on 2 hosts, 2 GPUs each, sockets between the hosts.  Rank 0's file.
ERA_2_4 = """\
node-a:3384:3384 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0
node-a:3384:3384 [0] NCCL INFO Bootstrap : Using [0]eth0:10.0.0.1<0>
node-a:3384:3384 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).
node-a:3384:3384 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
node-a:3384:3384 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
NCCL version 2.4.8+cuda10.0
node-a:3384:3414 [0] NCCL INFO Setting affinity for GPU 0 to 03f03f
node-a:3384:3414 [0] NCCL INFO Channel 00 :    0   1   2   3
node-a:3384:3414 [0] NCCL INFO Channel 01 :    0   1   2   3
node-a:3384:3414 [0] NCCL INFO Ring 00 : 3 -> 0 [receive] via NET/Socket/0
node-a:3384:3414 [0] NCCL INFO Ring 00 : 0[0] -> 1[1] via P2P/IPC
node-a:3384:3414 [0] NCCL INFO Ring 01 : 3 -> 0 [receive] via NET/Socket/0
node-a:3384:3414 [0] NCCL INFO Ring 01 : 0[0] -> 1[1] via P2P/IPC
node-a:3384:3414 [0] NCCL INFO Trees [0] 2->0->1/-1/-1 [1] -1->0->1/2/-1
node-a:3384:3414 [0] NCCL INFO Ring 00 : 2 -> 0 [receive] via NET/Socket/0
node-a:3384:3414 [0] NCCL INFO Ring 00 : 0 -> 2 [send] via NET/Socket/0
node-a:3384:3414 [0] NCCL INFO Using 256 threads, Min Comp Cap 7, Trees enabled up to size 469999
node-a:3384:3414 [0] NCCL INFO comm 0x7fe3d4001980 rank 0 nranks 4 cudaDev 0 nvmlDev 0 - Init COMPLETE
node-a:3384:3384 [0] NCCL INFO Launch mode Parallel
"""


def test_era_2_4_ring_log() -> None:
    log = parse(ERA_2_4)
    assert log.version == "2.4.8"
    assert log.cuda == "10.0"
    assert log.cuda_driver is None
    assert log.bootstrap_interface == "eth0"
    assert log.net_interfaces == ["eth0"]
    assert log.network is None  # this log has no "Using network" line
    assert log.env_settings == {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"}
    assert log.connections == [
        conn(0, None, 3, 0, None, None, "receive", "NET_SOCKET", (), "NET/Socket/0"),
        conn(0, None, 0, 1, "0", "1", None, "P2P_IPC", (), "P2P/IPC"),
        conn(1, None, 3, 0, None, None, "receive", "NET_SOCKET", (), "NET/Socket/0"),
        conn(1, None, 0, 1, "0", "1", None, "P2P_IPC", (), "P2P/IPC"),
        conn(0, None, 2, 0, None, None, "receive", "NET_SOCKET", (), "NET/Socket/0"),
        conn(0, None, 0, 2, None, None, "send", "NET_SOCKET", (), "NET/Socket/0"),
    ]
    assert log.transports() == {"NET_SOCKET": 4, "P2P_IPC": 2}
    # 2.4 prints no "Init START": a COMPLETE alone is not an incomplete init
    assert log.inits == {
        "0x7fe3d4001980": CommInit(
            comm="0x7fe3d4001980",
            rank=0,
            nranks=4,
            cuda_dev=0,
            nvml_dev=0,
            host="node-a",
            pid=3384,
            started=False,
            completed=True,
        )
    }
    assert log.incomplete_inits == []
    assert log.warnings == []


# 2.7 - 2.11 (2.7.8): 4 GPUs in one container whose PCIe path forbids P2P, so SHM everywhere
# (the shape of the log in dmlc/xgboost#5963).  Rank 2's file.
ERA_2_7 = """\
4e9a7654171e:8641:8641 [2] NCCL INFO Bootstrap : Using [0]eth0:172.17.0.2<0>
4e9a7654171e:8641:8641 [2] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
4e9a7654171e:8641:8641 [2] NCCL INFO NET/IB : No device found.
4e9a7654171e:8641:8641 [2] NCCL INFO NET/Socket : Using [0]eth0:172.17.0.2<0>
4e9a7654171e:8641:8641 [2] NCCL INFO Using network Socket
NCCL version 2.7.8+cuda11.0
4e9a7654171e:8641:8784 [2] NCCL INFO Could not enable P2P between dev 2(=89000) and dev 3(=b2000)
4e9a7654171e:8641:8784 [2] NCCL INFO Could not enable P2P between dev 2(=89000) and dev 1(=3d000)
4e9a7654171e:8641:8784 [2] NCCL INFO Channel 00/02 :    0   1   2   3
4e9a7654171e:8641:8784 [2] NCCL INFO Channel 01/02 :    0   1   2   3
4e9a7654171e:8641:8784 [2] NCCL INFO Trees [0] 3/-1/-1->2->1|1->2->3/-1/-1 [1] 3/-1/-1->2->1|1->2->3/-1/-1
4e9a7654171e:8641:8784 [2] NCCL INFO Channel 00 : 2[89000] -> 3[b2000] via direct shared memory
4e9a7654171e:8641:8784 [2] NCCL INFO Channel 01 : 2[89000] -> 3[b2000] via direct shared memory
4e9a7654171e:8641:8784 [2] NCCL INFO Connected all rings
4e9a7654171e:8641:8784 [2] NCCL INFO Channel 00 : 2[89000] -> 1[3d000] via direct shared memory
4e9a7654171e:8641:8784 [2] NCCL INFO Channel 01 : 2[89000] -> 1[3d000] via direct shared memory
4e9a7654171e:8641:8784 [2] NCCL INFO Connected all trees
4e9a7654171e:8641:8784 [2] NCCL INFO comm 0x7f3c38002e10 rank 2 nranks 4 cudaDev 2 busId 89000 - Init COMPLETE
"""


def test_era_2_7_shared_memory_log() -> None:
    log = parse(ERA_2_7)
    assert (log.version, log.cuda, log.network) == ("2.7.8", "11.0", "Socket")
    assert log.bootstrap_interface == "eth0"
    assert log.ib_devices == []
    assert log.p2p_warnings == [
        "Could not enable P2P between dev 2(=89000) and dev 3(=b2000)",
        "Could not enable P2P between dev 2(=89000) and dev 1(=3d000)",
    ]
    shm = "direct shared memory"
    assert log.connections == [
        conn(0, None, 2, 3, "89000", "b2000", None, "SHM", (), shm),
        conn(1, None, 2, 3, "89000", "b2000", None, "SHM", (), shm),
        conn(0, None, 2, 1, "89000", "3d000", None, "SHM", (), shm),
        conn(1, None, 2, 1, "89000", "3d000", None, "SHM", (), shm),
    ]
    assert log.transports() == {"SHM": 4}
    assert log.inits["0x7f3c38002e10"] == CommInit(
        comm="0x7f3c38002e10",
        rank=2,
        nranks=4,
        cuda_dev=2,
        bus_id="89000",
        host="4e9a7654171e",
        pid=8641,
        completed=True,
    )


# 2.12 - 2.18 (2.18.5): 4 ranks on 2 hosts with 2 GPUs each, InfiniBand with GPUDirect RDMA.
# Rank 0's file (host a) and rank 2's file (host b, where P2P was switched off).  The two
# processes happen to hold their communicator at the same address.
ERA_2_18_RANK0 = """\
node-a:5001:5001 [0] NCCL INFO Bootstrap : Using ib0:10.1.0.1<0>
node-a:5001:5001 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file
node-a:5001:5001 [0] NCCL INFO cudaDriverVersion 12020
NCCL version 2.18.5+cuda12.2
node-a:5001:5040 [0] NCCL INFO NCCL_IB_HCA set by environment to mlx5_0,mlx5_1
node-a:5001:5040 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.1.0.1<0>
node-a:5001:5040 [0] NCCL INFO Using network IB
node-a:5001:5040 [0] NCCL INFO comm 0x55d3c3a0b8e0 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0x1f2e3d4c5b6a7988 - Init START
node-a:5001:5040 [0] NCCL INFO NCCL_NET_GDR_LEVEL set by environment to PHB
node-a:5001:5040 [0] NCCL INFO Channel 00/02 :    0   1   2   3
node-a:5001:5040 [0] NCCL INFO Channel 01/02 :    0   1   2   3
node-a:5001:5040 [0] NCCL INFO Trees [0] 1/2/-1->0->-1 [1] 1/-1/-1->0->2
node-a:5001:5040 [0] NCCL INFO P2P Chunksize set to 131072
node-a:5001:5040 [0] NCCL INFO Channel 00/0 : 3[1] -> 0[0] [receive] via NET/IB/0/GDRDMA
node-a:5001:5040 [0] NCCL INFO Channel 01/0 : 3[1] -> 0[0] [receive] via NET/IB/1/GDRDMA
node-a:5001:5040 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read
node-a:5001:5040 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/IPC/read
node-a:5001:5040 [0] NCCL INFO Connected all rings
node-a:5001:5040 [0] NCCL INFO Channel 00/0 : 2[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
node-a:5001:5040 [0] NCCL INFO Channel 00/0 : 0[0] -> 2[0] [send] via NET/IB/0/GDRDMA
node-a:5001:5040 [0] NCCL INFO Connected all trees
node-a:5001:5040 [0] NCCL INFO 2 coll channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer
node-a:5001:5040 [0] NCCL INFO comm 0x55d3c3a0b8e0 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0x1f2e3d4c5b6a7988 - Init COMPLETE
node-a:5001:5062 [0] NCCL INFO Channel 02/1 : 0[0] -> 2[0] [send] via NET/IB/0/GDRDMA/Shared
"""  # noqa: E501 -- log lines are quoted whole

ERA_2_18_RANK2 = """\
node-b:7001:7001 [0] NCCL INFO Bootstrap : Using ib0:10.1.0.2<0>
node-b:7001:7001 [0] NCCL INFO cudaDriverVersion 12020
NCCL version 2.18.5+cuda12.2
node-b:7001:7040 [0] NCCL INFO NCCL_IB_HCA set by environment to mlx5_0,mlx5_1
node-b:7001:7040 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1.
node-b:7001:7040 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.1.0.2<0>
node-b:7001:7040 [0] NCCL INFO Using network IB
node-b:7001:7040 [0] NCCL INFO comm 0x55d3c3a0b8e0 rank 2 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0x1f2e3d4c5b6a7988 - Init START
node-b:7001:7040 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [receive] via NET/IB/0/GDRDMA
node-b:7001:7040 [0] NCCL INFO Channel 00 : 2[0] -> 3[1] via SHM/direct/direct
node-b:7001:7040 [0] NCCL INFO Channel 01 : 2[0] -> 3[1] via SHM/direct/direct
node-b:7001:7040 [0] NCCL INFO Channel 00/0 : 0[0] -> 2[0] [receive] via NET/IB/0/GDRDMA
node-b:7001:7040 [0] NCCL INFO Channel 00/0 : 2[0] -> 0[0] [send] via NET/IB/0/GDRDMA
node-b:7001:7040 [0] NCCL INFO comm 0x55d3c3a0b8e0 rank 2 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0x1f2e3d4c5b6a7988 - Init COMPLETE
"""  # noqa: E501 -- log lines are quoted whole

ERA_2_18_RANK0_CONNECTIONS = [
    conn(0, 0, 3, 0, "1", "0", "receive", "NET_IB", ("GDRDMA",), "NET/IB/0/GDRDMA"),
    conn(1, 0, 3, 0, "1", "0", "receive", "NET_IB", ("GDRDMA",), "NET/IB/1/GDRDMA"),
    conn(0, 0, 0, 1, "0", "1", None, "P2P_IPC", ("read",), "P2P/IPC/read"),
    conn(1, 0, 0, 1, "0", "1", None, "P2P_IPC", ("read",), "P2P/IPC/read"),
    conn(0, 0, 2, 0, "0", "0", "receive", "NET_IB", ("GDRDMA",), "NET/IB/0/GDRDMA"),
    conn(0, 0, 0, 2, "0", "0", "send", "NET_IB", ("GDRDMA",), "NET/IB/0/GDRDMA"),
    conn(2, 1, 0, 2, "0", "0", "send", "NET_IB", ("GDRDMA", "shared"), "NET/IB/0/GDRDMA/Shared"),
]


def test_era_2_18_infiniband_log() -> None:
    log = parse(ERA_2_18_RANK0)
    assert (log.version, log.cuda, log.cuda_driver) == ("2.18.5", "12.2", 12020)
    assert log.bootstrap_interface == "ib0"
    assert log.ib_devices == ["mlx5_0:1/IB", "mlx5_1:1/IB"]
    assert log.net_interfaces == []
    assert log.network == "IB"
    assert log.env_settings == {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_NET_GDR_LEVEL": "PHB"}
    assert log.connections == ERA_2_18_RANK0_CONNECTIONS
    assert log.transports() == {"NET_IB/GDRDMA": 4, "NET_IB/GDRDMA/shared": 1, "P2P_IPC/read": 2}
    assert log.inits == {
        "0x55d3c3a0b8e0": CommInit(
            comm="0x55d3c3a0b8e0",
            rank=0,
            nranks=4,
            cuda_dev=0,
            nvml_dev=0,
            bus_id="18000",
            comm_id="0x1f2e3d4c5b6a7988",
            host="node-a",
            pid=5001,
            started=True,
            completed=True,
        )
    }
    assert log.incomplete_inits == []


# >= 2.19 (2.26.2, cuMem on): 4 ranks on 2 hosts with 2 GPUs each; PXN relays one NET channel
# through the local rank 0.  Rank 1's file.  A second communicator (a new_group split) starts and
# never completes: the hang-in-setup signature.
ERA_2_26 = """\
node-a:2001:2001 [1] NCCL INFO NCCL_SOCKET_IFNAME set by environment to ens1f0
node-a:2001:2001 [1] NCCL INFO Bootstrap: Using ens1f0:10.0.0.11<0>
node-a:2001:2001 [1] NCCL INFO cudaDriverVersion 12080
node-a:2001:2001 [1] NCCL INFO NCCL version 2.26.2+cuda12.8
node-a:2001:2001 [1] NCCL INFO Comm config Blocking set to 1
node-a:2001:2050 [1] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.
node-a:2001:2050 [1] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB ens1f0:10.0.0.11<0>
node-a:2001:2050 [1] NCCL INFO Initialized NET plugin IB
node-a:2001:2050 [1] NCCL INFO Assigned NET plugin IB to comm
node-a:2001:2050 [1] NCCL INFO Using network IB
node-a:2001:2050 [1] NCCL INFO ncclCommInitRankConfig comm 0x5632a9c0e510 rank 1 nranks 4 cudaDev 1 nvmlDev 1 busId 2a000 commId 0x8f1c2b3a4d5e6f70 - Init START
node-a:2001:2050 [1] NCCL INFO NCCL_P2P_LEVEL set by environment to NVL
node-a:2001:2050 [1] NCCL INFO NCCL_CUMEM_ENABLE set by environment to 1.
node-a:2001:2050 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/IB/1/GDRDMA
node-a:2001:2050 [1] NCCL INFO Channel 01/0 : 1[1] -> 2[0] [send] via NET/IB/0(0)/GDRDMA
node-a:2001:2050 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
node-a:2001:2050 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM/read
node-a:2001:2050 [1] NCCL INFO Connected all rings, use ring PXN 1 GDR 1
node-a:2001:2050 [1] NCCL INFO Channel 00/0 : 3[1] -> 1[1] [receive] via NET/IB/1/GDRDMA
node-a:2001:2050 [1] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer
node-a:2001:2050 [1] NCCL INFO ncclCommInitRankConfig comm 0x5632a9c0e510 rank 1 nranks 4 cudaDev 1 nvmlDev 1 busId 2a000 commId 0x8f1c2b3a4d5e6f70 - Init COMPLETE
node-a:2001:2050 [1] NCCL INFO Init timings - ncclCommInitRankConfig: rank 1 nranks 4 total 0.61 (kernels 0.12, alloc 0.05, bootstrap 0.20, allgathers 0.01, topo 0.10, graphs 0.01, connections 0.10, rest 0.02)
node-a:2001:2071 [1] NCCL INFO Channel 02/1 : 1[1] -> 3[1] [send] via NET/IB/1/GDRDMA/Shared
node-a:2001:2071 [1] NCCL INFO Channel 02/1 : 3[1] -> 1[1] [receive] via NET/IB/1/GDRDMA/Shared
node-a:2001:2071 [1] NCCL INFO Channel 03/1 : 1[1] -> 0[0] via P2P/CUMEM/CE
node-a:2001:2001 [1] NCCL INFO ncclCommSplit comm 0x5632b0001230 rank 0 nranks 2 cudaDev 1 nvmlDev 1 busId 2a000 parent 0x5632a9c0e510 splitCount 1 color 1 key 0- Init START
[2025-03-04 10:00:05] node-a:2001:2080 [1] transport/net_ib.cc:1012 NCCL WARN NET/IB : Got async event : port error
"""  # noqa: E501 -- log lines are quoted whole


def test_era_2_26_cumem_log() -> None:
    log = parse(ERA_2_26)
    assert (log.version, log.cuda, log.cuda_driver) == ("2.26.2", "12.8", 12080)
    assert log.bootstrap_interface == "ens1f0"
    assert log.ib_devices == ["mlx5_0:1/IB", "mlx5_1:1/IB"]
    assert log.network == "IB"
    assert log.env_settings == {
        "NCCL_SOCKET_IFNAME": "ens1f0",
        "NCCL_P2P_LEVEL": "NVL",
        "NCCL_CUMEM_ENABLE": "1",
    }
    assert log.connections == [
        conn(0, 0, 1, 2, "1", "0", "send", "NET_IB", ("GDRDMA",), "NET/IB/1/GDRDMA"),
        conn(1, 0, 1, 2, "1", "0", "send", "NET_IB", ("GDRDMA", "PXN"), "NET/IB/0(0)/GDRDMA", 0),
        conn(0, 0, 1, 0, "1", "0", None, "P2P_CUMEM", ("read",), "P2P/CUMEM/read"),
        conn(1, 0, 1, 0, "1", "0", None, "P2P_CUMEM", ("read",), "P2P/CUMEM/read"),
        conn(0, 0, 3, 1, "1", "1", "receive", "NET_IB", ("GDRDMA",), "NET/IB/1/GDRDMA"),
        conn(2, 1, 1, 3, "1", "1", "send", "NET_IB", ("GDRDMA", "shared"), "NET/IB/1/GDRDMA/Shared"),
        conn(2, 1, 3, 1, "1", "1", "receive", "NET_IB", ("GDRDMA", "shared"), "NET/IB/1/GDRDMA/Shared"),
        conn(3, 1, 1, 0, "1", "0", None, "P2P_CUMEM", ("CE",), "P2P/CUMEM/CE"),
    ]
    assert log.transports() == {
        "NET_IB/GDRDMA": 2,
        "NET_IB/GDRDMA/PXN": 1,
        "NET_IB/GDRDMA/shared": 2,
        "P2P_CUMEM/CE": 1,
        "P2P_CUMEM/read": 2,
    }
    assert list(log.transports()) == sorted(log.transports())  # a stable order for the results file
    assert log.inits == {
        "0x5632a9c0e510": CommInit(
            comm="0x5632a9c0e510",
            rank=1,
            nranks=4,
            cuda_dev=1,
            nvml_dev=1,
            bus_id="2a000",
            comm_id="0x8f1c2b3a4d5e6f70",
            host="node-a",
            pid=2001,
            started=True,
            completed=True,
        ),
        "0x5632b0001230": CommInit(
            comm="0x5632b0001230",
            rank=0,
            nranks=2,
            cuda_dev=1,
            nvml_dev=1,
            bus_id="2a000",
            host="node-a",
            pid=2001,
            started=True,
        ),
    }
    assert log.incomplete_inits == ["0x5632b0001230"]
    assert log.warnings == ["NET/IB : Got async event : port error"]


def test_bootstrap_forms() -> None:
    assert parse(P + "Bootstrap : Using eth0:10.0.0.1<0>").bootstrap_interface == "eth0"
    assert parse(P + "Bootstrap: Using enp25s0np0:10.99.91.63<0>").bootstrap_interface == "enp25s0np0"
    assert parse(P + "Bootstrap : Using [0]ens5:172.31.41.105<0>").bootstrap_interface == "ens5"
    two_nodes = parse(P + "Bootstrap : Using eth0:10.0.0.1<0>\n" + P + "Bootstrap : Using docker0:172.17.0.1<0>\n")
    assert (two_nodes.bootstrap_interface, two_nodes.bootstrap_interfaces) == ("eth0", ["eth0", "docker0"])
    sockets = parse(P + "NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:10.0.1.1<0>")
    assert sockets.net_interfaces == ["eth0", "eth1"]
    assert parse(P + "NET/IB : Using [RO]; OOB eth0:10.0.4.51<0>").ib_devices == []
    roce = parse(P + "NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB ens1f0np0:10.14.14.13<0>")
    assert roce.ib_devices == ["mlx5_0:1/RoCE", "mlx5_1:1/RoCE"]


def test_network_names() -> None:
    assert parse(P + "Using network Socket").network == "Socket"
    assert parse(P + "Using network AWS Libfabric").network == "AWS Libfabric"
    assert parse(P + "Using network IBext_v8\n" + P + "Using network Socket\n").network == "IBext_v8"


# --------------------------------------------------------------------------------------------
# env, warnings, P2P decisions, init progress
# --------------------------------------------------------------------------------------------


def test_env_settings_both_forms_first_value_wins() -> None:
    text = "".join(
        P + message + "\n"
        for message in (
            "NCCL_P2P_LEVEL set by environment to NVL",
            "NCCL_IB_DISABLE set by environment to 1.",
            "NCCL_SOCKET_IFNAME set by environment to ^docker0,lo",
            "NCCL_DEBUG_FILE set by environment to /tmp/nccl.%h.%p.log",
            "NCCL_COLLNET_ENABLE set by environment to 0.",
            "NCCL_P2P_LEVEL set by environment to SYS",  # a second process with another value
            "Comm config Blocking set to 1",
        )
    )
    assert parse(text).env_settings == {
        "NCCL_P2P_LEVEL": "NVL",
        "NCCL_IB_DISABLE": "1",
        "NCCL_SOCKET_IFNAME": "^docker0,lo",
        "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p.log",
        "NCCL_COLLNET_ENABLE": "0",
    }


def test_warnings_with_and_without_timestamp() -> None:
    text = (
        "node-a:1:2 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<43215> failed\n"
        "[2025-01-02 03:04:05] node-a:1:2 [0] transport/shm.cc:590 NCCL WARN Error while creating shared memory"
        " segment /dev/shm/nccl-AbCdEf (size 9637888)\n"
        "[2025-01-02 03:04:05.123456789] node-a:1:2 [0] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'\n"
        "node-a:1:2 [0] NCCL INFO misc/socket.cc:484 -> 6\n"
        "NCCL WARN Call to posix_fallocate failed : No space left on device\n"
    )
    assert parse(text).warnings == [
        "socketStartConnect: Connect to 10.0.0.2<43215> failed",
        "Error while creating shared memory segment /dev/shm/nccl-AbCdEf (size 9637888)",
        "Cuda failure 'out of memory'",
        "Call to posix_fallocate failed : No space left on device",
    ]


def test_p2p_warnings() -> None:
    nvlink = (
        "P2P is disabled between NVLINK connected GPUs 1 and 0. This should not be the case given their "
        "connectivity, and is probably due to a hardware issue. If you still want to proceed, you can set "
        "NCCL_IGNORE_DISABLED_P2P=1."
    )
    text = (
        P + "Could not enable P2P between dev 0(=1a000) and dev 1(=3d000)\n"
        + P + "peer query failed between dev 0(=1a000) and dev 1(=3d000)\n"
        + P + "P2P is disabled between connected GPUs 0 and 1. You can repress this message with"
        " NCCL_IGNORE_DISABLED_P2P=1.\n"
        + "node-a:12345:12399 [0] graph/paths.cc:330 NCCL WARN " + nvlink + "\n"
        + P + "Legacy IPC not supported\n"
        + P + "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
        + P + "P2P Chunksize set to 524288\n"
    )  # fmt: skip
    log = parse(text)
    assert log.p2p_warnings == [
        "Could not enable P2P between dev 0(=1a000) and dev 1(=3d000)",
        "peer query failed between dev 0(=1a000) and dev 1(=3d000)",
        "P2P is disabled between connected GPUs 0 and 1. You can repress this message with NCCL_IGNORE_DISABLED_P2P=1.",
        nvlink,
        "Legacy IPC not supported",
    ]
    assert log.warnings == [nvlink]


def test_init_that_starts_but_never_completes() -> None:
    text = (
        P + "ncclCommInitRank comm 0x5e303a52bd70 rank 1 nranks 2 cudaDev 1 nvmlDev 1 busId 57000"
        " commId 0xadcb40d61cc1bc4b - Init START\n"
        + P + "Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read\n"
    )  # fmt: skip
    log = parse(text)
    assert log.incomplete_inits == ["0x5e303a52bd70"]
    assert log.inits["0x5e303a52bd70"].started is True
    assert log.inits["0x5e303a52bd70"].completed is False
    assert log.to_record()["incomplete_inits"] == ["0x5e303a52bd70"]


def test_a_comm_pointer_reused_in_one_process_is_a_second_init() -> None:
    start = P + "ncclCommInitRank comm 0x5600 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x{} - Init START\n"
    done = (
        P + "ncclCommInitRank comm 0x5600 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x{} - Init COMPLETE\n"
    )
    log = parse(start.format("a1") + done.format("a1") + start.format("b2"))
    assert list(log.inits) == ["0x5600", "0x5600#2"]
    assert [(i.comm_id, i.started, i.completed) for i in log.inits.values()] == [
        ("0xa1", True, True),
        ("0xb2", True, False),
    ]
    assert log.incomplete_inits == ["0x5600#2"]


def test_abort_and_nvls_lines() -> None:
    text = (
        P + "comm 0x7f00 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 18000 commId 0x11 - Init START\n"
        + P + "NVLS multicast support is available on dev 0 (NVLS_NCHANNELS 16)\n"
        + P + "NVLS comm 0x7f00 headRank 0 nHeads 8 nvlsRanks 8 buffSize 1048576 nvlsPerRankSize 201326592\n"
        + P + "comm 0x7f00 rank 0 nRanks 8 cudaDev 0 busId 18000 - Abort COMPLETE\n"
    )  # fmt: skip
    log = parse(text)
    assert log.nvls_comms == ["0x7f00"]
    init = log.inits["0x7f00"]
    assert (init.started, init.completed, init.aborted) == (True, False, True)
    assert log.incomplete_inits == ["0x7f00"]


# --------------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------------


def test_merging_two_rank_files(tmp_path: Path) -> None:
    rank0 = tmp_path / "nccl.node-a.5001.log"
    rank2 = tmp_path / "nccl.node-b.7001.log"
    rank0.write_text(ERA_2_18_RANK0)
    rank2.write_text(ERA_2_18_RANK2)
    log = parse_files([rank0, str(rank2)])
    assert log.files == [str(rank0), str(rank2)]
    assert log.skipped_files == []
    assert (log.version, log.versions) == ("2.18.5", ["2.18.5"])
    assert log.bootstrap_interfaces == ["ib0"]
    assert log.env_settings == {
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_P2P_DISABLE": "1",
    }
    assert log.connections == [
        *ERA_2_18_RANK0_CONNECTIONS,
        conn(0, 0, 1, 2, "1", "0", "receive", "NET_IB", ("GDRDMA",), "NET/IB/0/GDRDMA"),
        conn(0, None, 2, 3, "0", "1", None, "SHM", (), "SHM/direct/direct"),
        conn(1, None, 2, 3, "0", "1", None, "SHM", (), "SHM/direct/direct"),
        conn(0, 0, 0, 2, "0", "0", "receive", "NET_IB", ("GDRDMA",), "NET/IB/0/GDRDMA"),
        conn(0, 0, 2, 0, "0", "0", "send", "NET_IB", ("GDRDMA",), "NET/IB/0/GDRDMA"),
    ]
    assert log.transports() == {"NET_IB/GDRDMA": 7, "NET_IB/GDRDMA/shared": 1, "P2P_IPC/read": 2, "SHM": 2}
    # the same comm pointer in two processes: each key names its process
    assert list(log.inits) == ["0x55d3c3a0b8e0@node-a:5001", "0x55d3c3a0b8e0@node-b:7001"]
    assert [(i.rank, i.host, i.comm_id) for i in log.inits.values()] == [
        (0, "node-a", "0x1f2e3d4c5b6a7988"),
        (2, "node-b", "0x1f2e3d4c5b6a7988"),
    ]
    assert log.incomplete_inits == []


def test_merged_files_show_mixed_versions_and_a_rank_stuck_in_init(tmp_path: Path) -> None:
    good = tmp_path / "a.log"
    stuck = tmp_path / "b.log"
    good.write_text(
        "h1:10:10 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
        "h1:10:11 [0] NCCL INFO comm 0xaa rank 0 nranks 2 cudaDev 0 busId 1000 - Init START\n"
        "h1:10:11 [0] NCCL INFO comm 0xaa rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
    )
    stuck.write_text(
        "h2:20:20 [0] NCCL INFO NCCL version 2.19.3+cuda12.3\n"
        "h2:20:21 [0] NCCL INFO comm 0xbb rank 1 nranks 2 cudaDev 0 busId 1000 - Init START\n"
    )
    log = parse_files([good, stuck])
    assert (log.version, log.cuda, log.versions) == ("2.21.5", "12.4", ["2.21.5", "2.19.3"])
    assert list(log.inits) == ["0xaa", "0xbb"]
    assert log.incomplete_inits == ["0xbb"]


def test_unreadable_paths_are_skipped(tmp_path: Path) -> None:
    readable = tmp_path / "rank0.log"
    readable.write_text(P + "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n")
    missing = tmp_path / "missing.log"
    folder = tmp_path / "a-folder"
    folder.mkdir()
    log = parse_files([missing, readable, folder, "bad\0path"])
    assert log.files == [str(readable)]
    assert log.skipped_files == [str(missing), str(folder), "bad\0path"]
    assert log.transports() == {"P2P_CUMEM/read": 1}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file without read permission")
def test_a_file_without_read_permission_is_skipped(tmp_path: Path) -> None:
    locked = tmp_path / "locked.log"
    locked.write_text(P + "NCCL version 2.21.5+cuda12.4\n")
    locked.chmod(0)
    try:
        log = parse_files([locked])
    finally:
        locked.chmod(0o600)
    assert (log.files, log.skipped_files, log.version) == ([], [str(locked)], None)


def test_parse_files_takes_one_path_and_non_utf8_bytes(tmp_path: Path) -> None:
    path = tmp_path / "rank0.log"
    path.write_bytes(b"\xff\xfe garbage\n" + (P + "Using network Socket\n").encode() + b"\x80\x00\n")
    log = parse_files(path)
    assert (log.files, log.network) == ([str(path)], "Socket")
    assert parse_files(str(path)).network == "Socket"
    assert parse_files([]) == NcclLog()


# --------------------------------------------------------------------------------------------
# the record and garbage
# --------------------------------------------------------------------------------------------


def test_to_record_is_json_and_exact() -> None:
    log = parse(ERA_2_26)
    record = log.to_record()
    assert json.loads(json.dumps(record)) == record
    assert record == {
        "version": "2.26.2",
        "versions": ["2.26.2"],
        "cuda": "12.8",
        "cuda_driver": 12080,
        "network": "IB",
        "bootstrap_interface": "ens1f0",
        "transports": {
            "NET_IB/GDRDMA": 2,
            "NET_IB/GDRDMA/PXN": 1,
            "NET_IB/GDRDMA/shared": 2,
            "P2P_CUMEM/CE": 1,
            "P2P_CUMEM/read": 2,
        },
        "env_settings": {"NCCL_SOCKET_IFNAME": "ens1f0", "NCCL_P2P_LEVEL": "NVL", "NCCL_CUMEM_ENABLE": "1"},
        "warnings": ["NET/IB : Got async event : port error"],
        "p2p_warnings": [],
        "incomplete_inits": ["0x5632b0001230"],
        "completed_inits": 1,
    }


def test_record_warnings_are_distinct_and_capped() -> None:
    text = "".join(f"h:1:1 [0] x.cc:1 NCCL WARN message {n % 80}\n" for n in range(400))
    log = parse(text)
    assert len(log.warnings) == 400
    assert log.to_record()["warnings"] == [f"message {n}" for n in range(RECORD_WARNINGS)]


def test_empty_input() -> None:
    log = parse("")
    assert log == NcclLog()
    assert log.transports() == {}
    assert log.incomplete_inits == []


FRAGMENTS = [
    "NCCL INFO ",
    "NCCL WARN ",
    "Channel ",
    "Ring ",
    "CollNet ",
    " : ",
    " -> ",
    " via ",
    "[send] ",
    "P2P/",
    "CUMEM",
    "/read",
    "NET/IB/",
    "(",
    ")",
    "[",
    "]",
    "/",
    "comm 0x",
    " rank ",
    " nranks ",
    " cudaDev ",
    "- Init START",
    "- Init COMPLETE",
    "NCCL version ",
    "+cuda",
    "cudaDriverVersion ",
    "Bootstrap : Using ",
    "NET/Socket : Using ",
    "Using network ",
    " set by environment to ",
    "NVLS comm 0x",
    "P2P is disabled between ",
    "9" * 5000,  # longer than Python's int() digit limit
    "00",
    "7",
    "ff",
    "\x00",
    "\u2028",
    "\U0001f600",
    "\r",
    " ",
]


def test_garbage_never_raises() -> None:
    rng = random.Random(20240531)
    for _ in range(300):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 2000)))
        log = parse(raw.decode("utf-8", errors="replace"))
        assert isinstance(log, NcclLog)
        json.dumps(log.to_record())
        assert isinstance(log.transports(), dict)
    for _ in range(2000):
        line = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randrange(1, 30)))
        log = parse(line)
        json.dumps(log.to_record())
        assert all(c.transport in TRANSPORTS for c in log.connections)


def test_huge_numbers_do_not_reach_int() -> None:
    digits = "9" * 5000
    text = (
        f"{P}Channel {digits} : 0[0] -> 1[1] via P2P/IPC\n"
        f"{P}Channel 00/0 : {digits}[0] -> 1[1] via P2P/IPC\n"
        f"{P}cudaDriverVersion {digits}\n"
        f"{P}comm 0x1 rank {digits} nranks 2 cudaDev 0 - Init START\n"
        f"{P}NCCL version {digits}.1.1+cuda12.4\n"
    )
    log = parse(text)
    assert (log.connections, log.cuda_driver, log.inits, log.version) == ([], None, {}, None)


def test_pathological_long_lines_stay_fast() -> None:
    partial = "comm 0x1 rank 1 nranks 2 cudaDev 0 Channel 00 : 0 -> 1 via NCCL WARN P2P "
    text = (partial * 20_000 + "\n") * 5
    started = time.monotonic()
    log = parse(text)
    assert time.monotonic() - started < 5
    assert log.inits == {}
    assert len(log.warnings) == 5
