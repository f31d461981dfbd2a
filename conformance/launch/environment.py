"""Each rank's environment, built here and nowhere else; the rank applies it verbatim (``rank.main``).

A rank starts from its forkserver's environment (the pytest process's), unsets the variables its
rung unsets, then sets every variable listed for it: the flight recorder's, the rung's (a rung that
sets a recorder variable keeps its value), and on NCCL the suite's logging and GPU selection.
"""

from __future__ import annotations

import os
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
LOG_LEVELS_KEPT = ("INFO", "TRACE")  # a user's TRACE logs all INFO does (NCCL's src/debug.cc): kept


def debug_subsystems(users: str | None, needed: str = NCCL_DEBUG_SUBSYS) -> str:
    """The user's NCCL_DEBUG_SUBSYS with the subsystems the suite reads added to it.

    NCCL's ``ncclDebugInit`` (src/debug.cc, v2.18.3-1 to v2.30.7-1): a comma-separated list, names
    compared case-insensitively, ``ALL`` for every subsystem; a leading ``^`` starts from every
    subsystem and removes those listed.  So the needed ones are added to a list, taken out of an
    exclusion, and ``ALL`` already holds them.
    """
    if not users or not users.strip():
        return needed
    want = needed.split(",")
    if users.startswith("^"):
        excluded = [name for name in users[1:].split(",") if name and name.upper() not in want]
        return "^" + ",".join(excluded) if excluded else "ALL"
    given = [name for name in users.split(",") if name]
    if any(name.upper() == "ALL" for name in given):
        return users
    have = {name.upper() for name in given}
    return ",".join(given + [name for name in want if name not in have])


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
        level = _users("NCCL_DEBUG", spec)
        case_wide["NCCL_DEBUG"] = level if level in LOG_LEVELS_KEPT else "INFO"
        case_wide["NCCL_DEBUG_SUBSYS"] = debug_subsystems(_users("NCCL_DEBUG_SUBSYS", spec))
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


def _users(name: str, spec: CaseSpec) -> str | None:
    """The value the case would give ``name`` without the suite: its rung's, else the run's environment's."""
    if name in spec.env_set:
        return spec.env_set[name]
    return None if name in spec.env_unset else os.environ.get(name)
