"""What the network between nodes really did, read back from NCCL's logs, against the node's ports.

Each cross-node case's record keeps the transports of NCCL's connection lines (``verdict/nccl_log.py``:
``NET_IB/GDRDMA``, ``NET_SOCKET``, a plugin's ``NET_PLUGIN``) and the node's ports its topology
(``discover/rdma.py``).  Two ways a run passes slower than its fabric allows are named:

* NCCL used sockets between nodes though InfiniBand or RoCE ports are ACTIVE: NCCL takes its IB
  transport whenever it finds an active port it may use (src/transport/net_ib.cc ``ncclIbInit``),
  so sockets mean it found none: ``NCCL_IB_DISABLE=1``, ``NCCL_IB_HCA`` naming no active port,
  ``NCCL_NET=Socket``, or a net plugin that failed to load (its ``NET/Plugin`` lines);
* NCCL used InfiniBand without GPUDirect RDMA (no ``/GDRDMA`` on the connection) though
  ``nvidia_peermem`` is loaded: NCCL uses GDR only where the GPU and the NIC are within
  ``NCCL_NET_GDR_LEVEL`` of each other (default: the same PCIe switch, src/graph/paths.cc
  ``ncclTopoCheckGdr``), so a GPU far from its NIC, or the level set lower, stages through host memory.

Each line gives the pair's bandwidth against the node's fastest active port (Gb/s / 8 = GB/s).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from conformance.common.verdicts import Verdict
from conformance.discover.rdma import ACTIVE, RdmaFacts
from conformance.record.records import CaseRecord
from conformance.verdict.nccl_transport import FLAG_GDRDMA, NET_IB, NET_PLUGIN, NET_SOCKET

SOCKETS_CAUSE = (
    "NCCL_IB_DISABLE=1, NCCL_IB_HCA naming no active port, NCCL_NET=Socket, or a net plugin that failed to load "
    "(the NET/Plugin lines of the ranks' nccl.log)"
)
NO_GDR_CAUSE = (
    "the GPU and its NIC are farther apart than NCCL_NET_GDR_LEVEL allows (default: the same PCIe switch), or it "
    "is set lower: traffic is staged through host memory"
)


def _used(record: CaseRecord) -> set[str]:
    """The transports with their flags, as ``NET_IB/GDRDMA`` (the record's connection-line labels)."""
    return {str(label) for label in record.transports}


def _kinds(labels: Iterable[str]) -> set[str]:
    return {label.split("/", 1)[0] for label in labels}


def _figure(record: CaseRecord, facts: RdmaFacts) -> str:
    rates = [p.rate_gbps for p in facts.ports if p.state == ACTIVE and p.rate_gbps]
    if record.bandwidth_gbps is None or not rates:
        return ""
    port = max(rate for rate in rates if rate is not None) / 8
    return f" ({record.bandwidth_gbps:.1f} GB/s; a port carries {port:g} GB/s)"


def network_warnings(records: Sequence[CaseRecord], facts: RdmaFacts) -> list[str]:
    """One WARNING per kind of shortfall, naming the first cross-node case it was seen in."""
    active = [p for p in facts.ports if p.state == ACTIVE]
    if not active:
        return []
    crossing = [r for r in records if r.nodes and r.backend == "nccl" and r.outcome is Verdict.PASS and r.transports]
    warnings = []
    sockets = next((r for r in crossing if _kinds(_used(r)) & {NET_SOCKET, NET_IB, NET_PLUGIN} == {NET_SOCKET}), None)
    if sockets is not None:
        ports = ", ".join(sorted({p.name for p in active}))
        warnings.append(
            f"WARNING network: {sockets.nodeid} crossed nodes over sockets though {ports} are ACTIVE"
            f"{_figure(sockets, facts)}: likely {SOCKETS_CAUSE}"
        )
    no_gdr = next(
        (r for r in crossing if NET_IB in _kinds(_used(r)) and not any(FLAG_GDRDMA in label for label in _used(r))),
        None,
    )
    if no_gdr is not None and facts.peermem:
        warnings.append(
            f"WARNING network: {no_gdr.nodeid} used InfiniBand without GPUDirect RDMA though nvidia_peermem is "
            f"loaded{_figure(no_gdr, facts)}: {NO_GDR_CAUSE}"
        )
    return warnings
