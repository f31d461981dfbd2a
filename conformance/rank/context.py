"""What a probe sees inside a rank: its identity, its group, phase reporting, faults and checks."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.common import casefiles
from conformance.common.casefiles import CaseFile, PhaseLine, RankDevice
from conformance.rank.link_gen import LinkGenerations
from conformance.rank.scenario import Placement, Rule

TURN_POLL = 0.005  # seconds between looks for the parent's grant of the measurement turn

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist


class WrongData(AssertionError):
    """Received data differs from the independently computed reference."""


class RankSkip(Exception):
    """The probe does not apply here; the message is the reason."""


class SimulatedError(RuntimeError):
    """An ``error`` effect from the scenario."""


def describe_mismatch(label: str, got: torch.Tensor, expected: torch.Tensor) -> str:
    import torch

    if got.shape != expected.shape:
        return f"{label}: shape {tuple(got.shape)} instead of {tuple(expected.shape)}"
    bad = torch.nonzero(got.reshape(-1) != expected.reshape(-1)).reshape(-1)
    first = int(bad[0])
    return (
        f"{label}: {bad.numel()} of {got.numel()} elements wrong; first at index {first}: "
        f"got {got.reshape(-1)[first].item()!r}, expected {expected.reshape(-1)[first].item()!r}"
    )


def uuid_digits(uuid: str) -> str:
    """A GPU UUID's 32 hex digits, however it is spelt (NVML: GPU-5f1c..., torch: 5f1c...)."""
    return re.sub(r"[^0-9a-f]", "", uuid.lower().removeprefix("gpu-"))


def identity_problem(ordinal: int | None, found: str, expected: str, visible: str | None) -> str | None:
    """Why the GPU at ``cuda:<ordinal>`` (torch's UUID ``found``) is not NVML's ``expected``; None when it is.

    A UUID that is not 32 hex digits cannot be compared: that fails too, rather than passing unchecked.
    """
    for whose, uuid in ((f"torch's UUID for cuda:{ordinal}", found), ("the suite's UUID", expected)):
        if len(uuid_digits(uuid)) != 32:
            return f"{whose} is {uuid!r}, not 32 hex digits: the rank cannot check that it runs on the GPU chosen"
    if uuid_digits(found) != uuid_digits(expected):
        return f"cuda:{ordinal} is {found}, not {expected} (CUDA_VISIBLE_DEVICES={visible!r})"
    return None


class RankContext:
    def __init__(self, case: CaseFile, rank: int, rank_path: Path) -> None:
        self.case = case
        self.local_rank = rank  # this node's ranks count from 0; across nodes ``rank`` is global
        self.rank: int = case.rank_offset + rank
        self.world_size: int = case.world_size
        self.device: RankDevice = case.devices[rank]
        self.backend: str = case.backend
        self.probe: str = case.probe
        self.params: Mapping[str, Any] = case.params
        self.rules = [Rule.from_dict(r) for r in case.rules]
        self.placement = Placement(
            self.rank,
            self.device.name,
            self.probe,
            case.set_kind,
            case.links,
            case.p2p_links,
            case.net_links,
            refused=case.refused,
        )
        self.fired: set[int] = set()
        self.metrics: dict[str, Any] = {}
        self.group: dist.ProcessGroup | None = None
        self.store: Any = None  # the case's store, once the rank reached it
        self.bound_device: int | None = None  # the ordinal given to init_process_group(device_id=...)
        self.device_stuck = False  # a simulated kernel that never finishes: the next device wait blocks
        self.turn: str | None = None  # the measurement turn, once the parent gave it: "alone" or "beside"
        self.phase_name = "start"
        self.step = ""
        self.link_generations = LinkGenerations()
        self.rank_path = rank_path
        self._phase_log = (rank_path / casefiles.PHASES).open("a", encoding="utf-8", buffering=1)

    @property
    def torch_device(self) -> torch.device:
        return self.device_of(self.device)

    def device_of(self, device: RankDevice) -> torch.device:
        import torch

        if self.backend == "nccl":
            return torch.device("cuda", device.index)
        return torch.device("cpu")

    @property
    def visible_count(self) -> int:
        """How many GPUs this rank sees (CUDA's count on a GPU; the simulated machine's otherwise)."""
        if self.backend == "nccl":
            import torch

            return int(torch.cuda.device_count())
        return len(self.case.visible) or 1

    def check_device_identity(self) -> None:
        """The GPU at this rank's ordinal is the one the parent chose (compared by UUID)."""
        if self.backend != "nccl" or not self.device.uuid:
            return
        import torch

        properties = torch.cuda.get_device_properties(self.torch_device)
        found = str(getattr(properties, "uuid", "") or "")
        self.metrics["cuda_device"] = {"ordinal": self.torch_device.index, "uuid": found or None}
        problem = identity_problem(
            self.torch_device.index, found, self.device.uuid, os.environ.get("CUDA_VISIBLE_DEVICES")
        )
        if problem:
            raise RuntimeError(problem)
        self.metrics["cuda_device"]["compared"] = True  # the smoke run checks that the check compared

    def phase(
        self, name: str, step: str = "", facts: Mapping[str, Any] | None = None, nbytes: int | None = None
    ) -> None:
        """Report entering a phase (the parent reads this file) and apply the scenario's faults.

        ``facts`` go into the rank's metrics and into the phase line too, so the parent has them
        even when the rank is killed in this phase.  ``nbytes``: what the step moves (PhaseLine).
        """
        self.phase_name, self.step = name, step
        if facts:
            self.metrics.update(facts)
        self._write(PhaseLine.now(name, step, facts, nbytes=nbytes))
        self._apply_faults(name)

    def stamp(self, step: str) -> None:
        """A line within the current phase, for timing alone: no fault applies, the phase stays."""
        self._write(PhaseLine.now(self.phase_name, step))

    def _write(self, line: PhaseLine) -> None:
        self._phase_log.write(json.dumps(line.to_json()) + "\n")

    def wait_for_turn(self) -> None:
        """Before the first timed transfer: wait until the parent says no other case runs (``measure_gate``).

        The case keeps its turn to the end, so later timed transfers (of this probe or the next one
        of a shared case) go at once; each probe's metrics say how its figures were timed.
        """
        if self.turn is None:
            self.phase_name, self.step = "probe", casefiles.TURN_STEP  # no scenario faults: the harness's wait
            self._write(PhaseLine.now(self.phase_name, self.step))
            case_dir = self.rank_path.parent
            while (turn := casefiles.read_turn(case_dir)) is None:
                time.sleep(TURN_POLL)
            self.turn = turn
        self.metrics["measured_alone"] = self.turn == "alone"

    def take_up(self, probe: str, params: Mapping[str, Any]) -> None:
        """Go on to the next probe of a shared case: its own name (scenario rules match it), parameters, metrics."""
        self.probe, self.params, self.metrics = probe, params, {}
        self.placement = replace(self.placement, probe=probe)

    def note(self, facts: Mapping[str, Any]) -> None:
        """Put facts where the parent reads them even if the rank is killed later (no step, no faults)."""
        self._write(PhaseLine.now(self.phase_name, self.step, facts))

    def advance(self, part: str) -> None:
        """Report a finished part of the current step (progress inside a long one; no faults applied)."""
        self._write(PhaseLine.now(self.phase_name, self.step, part=part))

    def _matching_rules(self, phase: str, effect: str | None = None) -> list[tuple[int, Rule]]:
        return [
            (i, rule)
            for i, rule in enumerate(self.rules)
            if i not in self.fired
            and (effect is None or rule.effect == effect)
            and rule.applies(self.placement, phase, os.environ)
        ]

    def _apply_faults(self, phase: str) -> None:
        for i, rule in self._matching_rules(phase):
            if rule.effect in ("wrong_data", "slow_link"):
                continue  # applied to received data in verify(); a simulated link rate, in the parent
            if rule.effect != "slow":  # a slow machine is slow at every step; other faults happen once
                self.fired.add(i)
            if rule.effect == "device_hang":
                self.device_stuck = True  # the host call returns; the kernel never finishes
                continue
            apply_effect(rule)

    def barrier_device_is(self, wrong: bool | None) -> None:
        """Tell scenario rules whether torch's barrier is about to run on another GPU than the rank's."""
        self.placement = replace(self.placement, wrong_barrier_device=wrong)

    def read_link_generations(self, devices: tuple[torch.device, ...]) -> None:
        """While ``devices`` move data: each GPU's PCIe generation, the highest kept (``pcie_gen_in_transfer``)."""
        if self.backend != "nccl":
            return
        known = {d.index: d for d in (self.device, *self.case.peers) if d.uuid}
        moving = [known[d.index] for d in devices if d.type == "cuda" and d.index in known]
        found = self.link_generations.read(d.uuid for d in moving if d.uuid)
        highest: dict[str, int] = self.metrics.setdefault(casefiles.TRANSFER_GENERATIONS, {})
        for device in moving:
            if device.uuid in found:
                highest[device.name] = max(highest.get(device.name, 0), found[device.uuid])

    def synchronize(self, *others: torch.device) -> None:
        """End a step: wait until the device (and ``others``) finished its work, inside the step's phase.

        NCCL collectives return to the host at once; without this a hung kernel would first block
        the copy back in ``verify`` and the hang would be placed in the wrong phase.
        """
        self._wait_for_device()
        import torch

        for device in {self.torch_device, *others}:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

    def _wait_for_device(self) -> None:
        while self.device_stuck:  # what a spinning kernel looks like from the host
            time.sleep(3600)

    def verify(self, label: str, got: torch.Tensor, reference: Callable[[], torch.Tensor]) -> None:
        """Check received data exactly against a reference built here, on the same device."""
        import torch

        self.phase("verify", label)
        self._wait_for_device()  # the copy back to the host would block on a stuck kernel
        for i, _rule in self._matching_rules("verify", "wrong_data"):
            self.fired.add(i)
            got = got.clone()
            got.reshape(-1)[0] += 1
        expected = reference()
        if got.shape != expected.shape or not torch.equal(got, expected.to(got.dtype)):
            raise WrongData(describe_mismatch(label, got.detach().to("cpu"), expected.to("cpu")))

    def skip(self, reason: str) -> None:
        raise RankSkip(reason)


def apply_effect(rule: Rule) -> None:
    """Carry out one simulated fault in this rank."""
    if rule.effect == "hang":
        if rule.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(3600)
    elif rule.effect == "crash":
        os.kill(os.getpid(), getattr(signal, rule.signal))
        time.sleep(5)  # a signal whose default action is not to die (SIGCHLD, ...) must not pass quietly
        raise SimulatedError(f"signal {rule.signal} did not end the rank")
    elif rule.effect == "error":
        raise SimulatedError(rule.message)
    elif rule.effect == "oom":
        import torch

        raise torch.OutOfMemoryError(rule.message)
    elif rule.effect == "slow":
        time.sleep(rule.seconds)
