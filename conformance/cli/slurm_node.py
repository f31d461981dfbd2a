"""What the health check asks of SLURM about its node: state and reason (``sinfo``), drain and resume (``scontrol``).

The only module that runs ``sinfo`` or ``scontrol``, and the one place a drain reason is made: a
:class:`DrainReason` comes only from :meth:`DrainReason.of`, SLURM's escape for outside text, and
:func:`drain_node` takes nothing else.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from conformance.common.outside_text import shown

REASON_PREFIX = "gpu-conformance:"  # every drain reason this program writes
# slurmdbd keeps a node event's reason in a MySQL TINYTEXT (slurm's src/plugins/accounting_storage/mysql/
# accounting_storage_mysql.c, event_table_fields: "reason" "tinytext not null"): 255 bytes, the rest is lost.
REASON_BYTES = 255
CUT = "..."
SCONTROL_SECONDS = 5.0  # each sinfo or scontrol call
# slurmd gives a HealthCheckProgram no PATH at all; scontrol is looked for on PATH, then here.
SLURM_BIN_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin", "/usr/local/sbin")
# sinfo's state words of a node someone holds out of service (a "+drain" or "*" suffix included)
HELD_STATES = ("drain", "down", "fail", "maint", "reserved", "future", "inval", "reboot", "power_down")


@dataclass(frozen=True)
class DrainReason:
    """A drain reason SLURM keeps and prints back byte for byte: made only by :meth:`of`."""

    text: str  # printable ASCII, one line, no '"', at most REASON_BYTES bytes

    @classmethod
    def of(cls, outside: str) -> DrainReason:
        """``gpu-conformance: <outside>``, escaped for SLURM: the one escape of every text that reaches a reason.

        scontrol takes ``Reason=`` as one argument and strips one leading and one trailing ``"`` from
        it (slurm's src/scontrol/update_node.c, ``scontrol_update_node``); ``sinfo -o %E`` prints it
        back on the node's one line (src/sinfo/print.c ``_print_str``: the string as it is).  So white
        space of any kind (newlines included) becomes one space, every other control, format or
        separator character a visible ``\\xNN`` (``shown``), ``"`` a ``'``, anything not ASCII a
        ``\\xNN``/``\\uNNNN`` escape, and the whole is cut with ``...`` to 255 bytes (slurmdbd's TINYTEXT).
        """
        one_line = shown(" ".join(outside.split())).replace('"', "'")
        ascii_text = f"{REASON_PREFIX} {one_line}".strip().encode("ascii", "backslashreplace").decode("ascii")
        if len(ascii_text) > REASON_BYTES:
            ascii_text = ascii_text[: REASON_BYTES - len(CUT)].rstrip() + CUT
        return cls(ascii_text)

    @property
    def raw(self) -> bytes:
        return self.text.encode("ascii")


@dataclass(frozen=True)
class NodeState:
    """The node as ``sinfo -N -n NODE -o '%T|%E'`` names it: ``drained``, and the reason's bytes as SLURM keeps them."""

    state: str
    reason: bytes

    @property
    def shown_reason(self) -> str:
        return shown(self.reason.decode("utf-8", "replace"))

    @property
    def held(self) -> bool:
        """Drained, down, reserved or otherwise out of service, by anyone."""
        return any(word in self.state.lower() for word in HELD_STATES)

    def drained_with(self, ours: bytes) -> bool:
        """Drained (and nothing else holding it) with exactly the reason ``ours``, byte for byte."""
        others = [word for word in HELD_STATES if word != "drain" and word in self.state.lower()]
        return "drain" in self.state.lower() and not others and self.reason == ours


def scontrol(env: Mapping[str, str]) -> str | None:
    path = env.get("PATH") or ""
    return shutil.which("scontrol", path=os.pathsep.join([path, *SLURM_BIN_DIRS]))


def read_node_state(node: str, env: Mapping[str, str]) -> NodeState | str:
    """The node's state and reason, or why they could not be read."""
    program = scontrol(env)
    sinfo = Path(program).with_name("sinfo") if program else None
    if sinfo is None or not sinfo.exists():
        return f"sinfo not found (beside scontrol, on PATH and in {', '.join(SLURM_BIN_DIRS)})"
    try:
        done = subprocess.run(
            [str(sinfo), "-h", "-N", "-n", node, "-o", "%T|%E"],
            env=dict(env), capture_output=True, timeout=SCONTROL_SECONDS, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{sinfo}: {exc}"
    line = done.stdout.split(b"\n")[0] if done.returncode == 0 else b""
    state, bar, reason = line.partition(b"|")
    if not bar or not state.strip():
        why = done.stderr.decode("utf-8", "replace").strip() or f"exit status {done.returncode}, no state"
        return f"{sinfo}: {why}"
    return NodeState(state.decode("ascii", "replace").strip(), reason)


def drain_node(node: str, reason: DrainReason, env: Mapping[str, str]) -> str | None:
    """``scontrol update NodeName=NODE State=DRAIN Reason=...``; why it failed, or None."""
    return _update(env, f"NodeName={node}", "State=DRAIN", f"Reason={reason.text}")


def resume_node(node: str, env: Mapping[str, str]) -> str | None:
    """``scontrol update NodeName=NODE State=RESUME``; why it failed, or None."""
    return _update(env, f"NodeName={node}", "State=RESUME")


def _update(env: Mapping[str, str], *settings: str) -> str | None:
    program = scontrol(env)
    if program is None:
        return f"scontrol not found (PATH and {', '.join(SLURM_BIN_DIRS)})"
    try:
        done = subprocess.run(
            [program, "update", *settings], env=dict(env), capture_output=True, timeout=SCONTROL_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{program} update: {exc}"
    if done.returncode == 0:
        return None
    return (done.stderr or done.stdout).decode("utf-8", "replace").strip() or f"exit status {done.returncode}"
