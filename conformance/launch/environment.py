"""Each rank's environment, built here and nowhere else; the rank applies it verbatim (``rank.main``).

A rank starts from its forkserver's environment (the pytest process's), unsets the variables its
rung unsets, then sets every variable listed for it: the flight recorder's, the rung's (a rung that
sets a recorder variable keeps its value), and on NCCL the suite's logging and GPU selection.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from conformance.common import casefiles
from conformance.common.deadlines import Deadlines
from conformance.discover.topology import Device
from conformance.rank import flight_recorder

if TYPE_CHECKING:
    from conformance.launch.case import CaseSpec

# What NCCL logs at INFO to each rank's file: enough to read the transports and set-up back.
NCCL_DEBUG_SUBSYS = "INIT,BOOTSTRAP,ENV,P2P,SHM,NET"


def device_id(device: Device) -> str:
    """How the ranks are told a GPU: its UUID (the NVML index only where no UUID is known)."""
    return device.uuid or str(device.nvml_index if device.nvml_index is not None else device.index)


@dataclass(frozen=True)
class RankEnvironments:
    per_rank: tuple[Mapping[str, str], ...]  # every variable each of this node's ranks sets, by local rank
    unset: tuple[str, ...]  # the variables every rank unsets first


def rank_environments(spec: CaseSpec, case_dir: Path, deadlines: Deadlines | None = None) -> RankEnvironments:
    """The case's rung plus what every rank needs.

    NCCL cases log at INFO to a file per rank, so the transports can be read back.  The ranks are
    given their GPUs by UUID in CUDA_VISIBLE_DEVICES, in the run's order, so cuda:<k> is the k-th
    of them whatever CUDA's device order; an isolated set lists only its own GPUs, as a job given a
    subset does.
    """
    case_wide = dict(spec.env_set)
    if spec.backend == "nccl":
        case_wide["NCCL_DEBUG"] = "INFO"
        case_wide.setdefault("NCCL_DEBUG_SUBSYS", NCCL_DEBUG_SUBSYS)
        case_wide["CUDA_VISIBLE_DEVICES"] = ",".join(device_id(d) for d in spec.seen)
        heartbeat = deadlines.heartbeat_timeout if deadlines else None
        if heartbeat is not None:
            case_wide.setdefault("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", str(int(heartbeat)))
    per_rank = []
    for rank in range(spec.world_size):
        rank_path = casefiles.rank_dir(case_dir, rank)
        env = {**flight_recorder.environment(spec.backend, rank_path), **case_wide}
        if spec.backend == "nccl":
            env["NCCL_DEBUG_FILE"] = str(rank_path / casefiles.NCCL_LOG)
        per_rank.append(env)
    return RankEnvironments(tuple(per_rank), tuple(spec.env_unset))
