"""How a case runs: on this node's devices, or across nodes; both behind one Protocol.

``CaseRequest`` is what a test asked for; ``case_spec`` turns it into the ``CaseSpec`` the launcher
runs, the one place a rung becomes the environment its ranks get.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest

from conformance.common.suite import record_nodeid
from conformance.discover.nccl_config import CONF_FILE_VARIABLE, NO_FILE, neutralised, not_removable, user_files
from conformance.harness.context import RunContext
from conformance.harness.planned import PlannedCase
from conformance.harness.side_by_side import CaseCall, case_call
from conformance.launch.case import CaseResult, CaseSpec
from conformance.plan.matrix import DeviceSet, Rung

# How bandwidth is timed: the send/recv message, then warm-up and timed iterations (probes.py);
# on CPU, collectives larger than chunk_bytes move in parts, each reported as progress.
# On GPU 512 MiB: bandwidth-bound on the fastest link (H100's 18 NVLinks, 450 GB/s a direction:
# 1.2 ms a message, so a launch's ~10 us is under 1% of the figure; nccl-tests judges all-reduce at
# 1 GiB, whose bus bandwidth needs more bytes per rank than a two-rank copy), and its two buffers
# (1 GiB a GPU) fit beside any training job's leftovers on a 16 GiB data-centre GPU.
MEASUREMENT = {
    "cpu": {"bandwidth_bytes": 4 << 20, "bandwidth_warmup": 1, "bandwidth_iterations": 5, "chunk_bytes": 4 << 20},
    "gpu": {"bandwidth_bytes": 512 << 20, "bandwidth_warmup": 5, "bandwidth_iterations": 20},
}


@dataclass(frozen=True)
class CaseRequest:
    """What a test asked for: a probe on a device set, its parameters, and a verdict it expects (controls)."""

    item: pytest.Item
    probe: str
    device_set: DeviceSet
    expect: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def call(self) -> CaseCall:
        return case_call(self.probe, self.expect, dict(self.params))


class CaseStrategy(Protocol):
    """Takes a planned case to its result."""

    def place(self, request: CaseRequest, planned: PlannedCase) -> CaseRequest:
        """The request as it will run (a re-check's node pair chosen), or a skip saying why it will not."""
        ...

    def run(self, request: CaseRequest, planned: PlannedCase) -> CaseResult: ...

    def ran(self, planned: PlannedCase, result: CaseResult) -> None:
        """What others must learn of the result (a node pair's first pass)."""
        ...


def case_spec(
    run: RunContext, item: pytest.Item, probe: str, device_set: DeviceSet, params: Mapping[str, Any]
) -> CaseSpec:
    """The case the launcher runs for a test's request."""
    params = dict(params)
    rung = device_set.rung
    pair = device_set.devices if len(device_set.devices) == 2 else None
    single_process = bool(params.pop("single_process", False))
    grace = params.pop("grace", None)
    environ = run.nccl_environ  # what NCCL sees: the run's environment and its configuration files
    unset = rung.unset(environ)
    return CaseSpec(
        nodeid=record_nodeid(item.path, item.nodeid),
        probe=probe,
        devices=device_set.devices,
        backend=run.backend,
        link=device_set.link,
        env_name=rung.name,
        env_set={**rung.set, **config_overrides(run, rung)},
        env_unset=tuple(name for name in unset if name in os.environ),
        params={**MEASUREMENT["gpu" if run.backend == "nccl" else "cpu"], **params},
        set_kind=device_set.kind,
        links=device_set.links,
        predicted=run.nccl_host.summary(run.plan.paths(device_set), len(device_set.devices), rung.effective(environ)),
        isolate=device_set.isolate,
        visible=run.topology.devices,
        p2p_status=run.topology.p2p_status(*pair) if pair else None,
        single_process=single_process,
        nodes=device_set.nodes,
        grace=None if grace is None else float(grace),
    )


def config_overrides(run: RunContext, rung: Rung) -> dict[str, str]:
    """What a rung that removes variables must set for NCCL's configuration files not to give them back.

    ``NCCL_CONF_FILE=/dev/null`` where the rung removes every NCCL variable (the user's file stays out;
    /etc/nccl.conf is read whatever it says), and an empty value for each a file still read sets where
    NCCL reads an empty value as unset (``discover/nccl_config.py``).
    """
    overrides = neutralised(
        list(rung.unset(run.nccl_environ)), run.nccl_config, os.environ, conf_files_kept_out(run, rung)
    )
    if rung_drops_conf_file(run, rung):
        overrides.setdefault(CONF_FILE_VARIABLE, NO_FILE)
    return overrides


def rung_drops_conf_file(run: RunContext, rung: Rung) -> bool:
    """Whether the rung removes every NCCL variable (NCCL_CONF_FILE too) of a run that reads configuration files."""
    return bool(run.nccl_config.files and rung.unset_families and CONF_FILE_VARIABLE.startswith(rung.unset_families))


def conf_files_kept_out(run: RunContext, rung: Rung) -> frozenset[str]:
    """The files the rung's ``NCCL_CONF_FILE=/dev/null`` keeps out (none where it does not set it)."""
    return user_files(run.nccl_config) if rung_drops_conf_file(run, rung) else frozenset()


def config_left(run: RunContext, rung: Rung) -> list[str]:
    """What the rung removes but a file NCCL still reads gives back whatever the environment says (nccl_config.py)."""
    names = list(rung.unset(run.nccl_environ))
    return not_removable(names, run.nccl_config, os.environ, conf_files_kept_out(run, rung))
