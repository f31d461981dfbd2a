"""What the network between nodes really did (NCCL's connection lines) against the node's RDMA ports."""

from __future__ import annotations

from conformance.common.verdicts import Verdict
from conformance.discover.rdma import RdmaFacts, RdmaPort
from conformance.record.records import CaseRecord, RunEnd, RunFacts
from conformance.record.runs import Run
from conformance.summarise.answer import answer
from conformance.summarise.recommend import recommend

NODE_PAIR = "suites/test_multinode.py::test_node_pair[node0-node1-inherited]"


def port(device: str, state: str = "ACTIVE") -> RdmaPort:
    return RdmaPort(device, 1, state, "LinkUp" if state == "ACTIVE" else "Polling", 200.0, "InfiniBand")


def run_with(transports: dict[str, int], rdma: RdmaFacts) -> Run:
    record = CaseRecord(
        nodeid=NODE_PAIR, probe="pair_exchange", verdict=Verdict.PASS, env_name="inherited", backend="nccl",
        set_kind="node_pair", link="NET", nodes=[0, 1], node_rank=0, devices=["gpu0"], transports=transports,
        bandwidth_gbps=3.1, ladder_key="test_node_pair[node0-node1]",
    )  # fmt: skip
    facts = RunFacts(run_id="r", backend="nccl", topology={"rdma": rdma.to_json()}, end=RunEnd("complete"))
    return Run("by hand", facts, [record])


def warnings(run: Run) -> list[str]:
    return [w for w in answer(run, recommend(run)).warnings if w.startswith("WARNING network")]


def test_sockets_between_nodes_with_active_ib_ports_are_named() -> None:
    (line,) = warnings(run_with({"NET_SOCKET": 4}, RdmaFacts((port("mlx5_0"), port("mlx5_1")), peermem=True)))
    assert line.startswith(
        f"WARNING network: {NODE_PAIR} crossed nodes over sockets though mlx5_0 port 1, mlx5_1 port 1"
    )
    assert "(3.1 GB/s; a port carries 25 GB/s)" in line and "NCCL_IB_HCA" in line and "net plugin" in line


def test_ib_without_gpudirect_where_peermem_is_loaded_is_named() -> None:
    (line,) = warnings(run_with({"NET_IB": 4}, RdmaFacts((port("mlx5_0"),), peermem=True)))
    assert "used InfiniBand without GPUDirect RDMA though nvidia_peermem is loaded" in line
    assert "NCCL_NET_GDR_LEVEL" in line


def test_what_the_fabric_allows_is_not_named() -> None:
    assert warnings(run_with({"NET_IB/GDRDMA": 4}, RdmaFacts((port("mlx5_0"),), peermem=True))) == []
    assert warnings(run_with({"NET_IB": 4}, RdmaFacts((port("mlx5_0"),), peermem=False))) == []  # no GDR to have
    assert warnings(run_with({"NET_SOCKET": 4}, RdmaFacts((port("mlx5_0", "DOWN"),)))) == []  # no active port
    assert warnings(run_with({"NET_SOCKET": 4}, RdmaFacts())) == []  # an Ethernet-only cluster
