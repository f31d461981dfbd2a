"""The facts read from NCCL_DEBUG=INFO output, and their summary for the results file.

:class:`NcclLog` holds everything :func:`conformance.verdict.nccl_log.parse` understood: versions,
the :class:`Connection` of every channel, env settings, each communicator's :class:`CommInit`,
warnings.  The transport names and flags of a connection are :mod:`conformance.verdict.nccl_transport`'s.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

RECORD_WARNINGS = 50  # distinct warning messages kept in to_record(); NcclLog.warnings keeps them all


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Connection:
    """One ``via`` line: the connection ``src_rank -> dst_rank`` on one channel.

    ``src_dev``/``dst_dev`` are the bracketed numbers as printed: cudaDev (<= 2.6), busId in hex
    (2.7-2.18) or nvmlDev (>= 2.19).  A NET connection is printed by both ends, once ``[send]`` and
    once ``[receive]``; P2P and SHM lines only by the sender.  ``relay_rank`` is the PXN proxy rank
    of a NET line or the intermediate rank of ``P2P/indirect``.
    """

    channel: int
    conn_index: int | None
    src_rank: int
    dst_rank: int
    src_dev: str | None
    dst_dev: str | None
    direction: str | None  # "send", "receive" or None (P2P, SHM and <= 2.6 lines without it)
    transport: str  # one of TRANSPORTS
    flags: tuple[str, ...] = ()  # sorted; among "read", "CE", "GDRDMA", "PXN", "shared"
    detail: str = ""  # the via text as printed
    relay_rank: int | None = None

    @property
    def label(self) -> str:
        """The transport with its flags, as counted by :meth:`NcclLog.transports`: ``P2P_IPC/read``."""
        return "/".join((self.transport, *self.flags))


@dataclass(frozen=True)
class CommInit:
    """What the log says about one communicator's ``ncclCommInit*``."""

    comm: str  # the comm pointer, 0x...
    rank: int | None = None
    nranks: int | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    bus_id: str | None = None
    comm_id: str | None = None  # the same for every rank of one communicator (>= 2.18)
    host: str | None = None
    pid: int | None = None
    started: bool = False  # "- Init START" seen (>= 2.9 prints it)
    completed: bool = False  # "- Init COMPLETE" seen
    aborted: bool = False  # "- Abort COMPLETE" seen


@dataclass(frozen=True)
class NcclLog:
    """Everything :func:`parse` understood, in the order the lines came."""

    version: str | None = None  # the first "NCCL version" seen
    cuda: str | None = None  # the CUDA of that build, "12.4" from "+cuda12.4"
    cuda_driver: int | None = None  # "cudaDriverVersion 12080"
    versions: list[str] = field(default_factory=list)  # every distinct version (more than one: mixed libraries)
    connections: list[Connection] = field(default_factory=list)
    bootstrap_interface: str | None = None  # the first "Bootstrap : Using <if>:..."
    bootstrap_interfaces: list[str] = field(default_factory=list)  # every distinct one
    net_interfaces: list[str] = field(default_factory=list)  # from "NET/Socket : Using [0]eth0:..."
    ib_devices: list[str] = field(default_factory=list)  # from "NET/IB : Using [0]mlx5_0:1/IB ..."
    network: str | None = None  # "IB", "Socket" or the plugin's name, from "Using network ..."
    env_settings: dict[str, str] = field(default_factory=dict)  # first value seen per variable
    p2p_warnings: list[str] = field(default_factory=list)
    inits: dict[str, CommInit] = field(default_factory=dict)
    nvls_comms: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # every NCCL WARN line's message
    files: list[str] = field(default_factory=list)  # files read by parse_files
    skipped_files: list[str] = field(default_factory=list)  # files parse_files could not read

    @property
    def incomplete_inits(self) -> list[str]:
        """Communicators whose init STARTed but never COMPLETEd: the hang-in-setup signature."""
        return [key for key, init in self.inits.items() if init.started and not init.completed]

    def transports(self) -> dict[str, int]:
        """How many connection lines used each transport, flags appended: ``{"P2P_IPC/read": 4}``."""
        return dict(sorted(Counter(c.label for c in self.connections).items()))

    def to_record(self) -> dict[str, Any]:
        """A JSON-serialisable summary for the results file (warnings: distinct, at most RECORD_WARNINGS)."""
        return {
            "version": self.version,
            "versions": list(self.versions),
            "cuda": self.cuda,
            "cuda_driver": self.cuda_driver,
            "network": self.network,
            "bootstrap_interface": self.bootstrap_interface,
            "transports": self.transports(),
            "env_settings": dict(self.env_settings),
            "warnings": list(dict.fromkeys(self.warnings))[:RECORD_WARNINGS],
            "p2p_warnings": list(dict.fromkeys(self.p2p_warnings)),
            "incomplete_inits": self.incomplete_inits,
            "completed_inits": sum(init.completed for init in self.inits.values()),
        }
