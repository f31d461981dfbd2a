"""MUNGE, SLURM's own credential service, handing the run's signing key to the nodes of one SLURM job.

A run under SLURM without a run token is signed all the same: node 0 draws a random key and gives
each other node a MUNGE credential holding it (``munge --restrict-uid``: only a process of the job's
user can decode it; MUNGE encrypts the payload, so the store's readers see no key), bound to the job
id, the run's nonce and the node it is for.  A node decodes its own credential with ``unmunge``,
which says who made it (``UID``); it takes the key only from a credential of its own user, for its
job, run and rank.  Each credential is decoded once (munged refuses a replay), hence one per node.

munged's socket is the one SLURM uses: ``AuthInfo=socket=PATH`` in slurm.conf (``$SLURM_CONF``,
else /etc/slurm/slurm.conf), else MUNGE's default.  SLURM's default ``AuthType`` is auth/munge.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from conformance.common.bounded_parse import json_value

MUNGE_SECONDS = 10.0  # a call of munge or unmunge
SLURM_CONF = Path("/etc/slurm/slurm.conf")
SLURM_BIN_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin", "/usr/local/sbin")
_AUTH_SOCKET = re.compile(r"^\s*AuthInfo\s*=\s*\S*?socket=([^,\s]+)", re.IGNORECASE | re.MULTILINE)


class MungeError(RuntimeError):
    """MUNGE could not make or check a credential; the message says why."""


@dataclass(frozen=True)
class Munge:
    """The job's MUNGE: its programs and munged's socket."""

    munge: str
    unmunge: str
    socket: str | None  # None: MUNGE's default

    @classmethod
    def find(cls, environ: Mapping[str, str]) -> Munge | None:
        """MUNGE where both programs are found (PATH, then SLURM's usual places) and munged answers; else None."""
        path = os.pathsep.join([environ.get("PATH", ""), *SLURM_BIN_DIRS])
        munge, unmunge = shutil.which("munge", path=path), shutil.which("unmunge", path=path)
        if munge is None or unmunge is None:
            return None
        found = cls(munge, unmunge, slurm_munge_socket(environ))
        try:  # munged answers here, as on every node of a job (each node decides alike, without the store)
            found._run(munge, ["--no-input"], b"")
        except MungeError:
            return None
        return found

    def _run(self, program: str, options: list[str], given: bytes) -> bytes:
        socket = ["--socket", self.socket] if self.socket else []
        try:
            done = subprocess.run([program, *socket, *options], input=given, capture_output=True,
                                  timeout=MUNGE_SECONDS, check=False)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MungeError(f"{Path(program).name}: {exc}") from None
        if done.returncode != 0:  # unmunge says why in its STATUS line, munge on stderr
            status = _metadata(done.stdout).get("STATUS")
            said = status or done.stderr.decode(errors="replace").strip() or f"exit status {done.returncode}"
            raise MungeError(f"{Path(program).name}: {said}")
        return done.stdout

    def credential(self, payload: Mapping[str, object], uid: int, ttl: int) -> str:
        """A credential of ``payload`` only ``uid`` can decode, valid for ``ttl`` seconds."""
        options = ["--restrict-uid", str(uid), "--ttl", str(ttl)]
        return self._run(self.munge, options, json.dumps(dict(payload)).encode()).decode().strip()

    def decoded(self, credential: str) -> tuple[int, dict[str, object]]:
        """(the uid that made it, its payload); MungeError where munged refuses it (forged, expired, replayed)."""
        out = self._run(self.unmunge, ["--keys", "STATUS,UID"], credential.encode())
        meta, payload = _metadata(out), out.partition(b"\n\n")[2]
        if meta.get("STATUS") != "Success (0)":
            raise MungeError(f"unmunge: {meta.get('STATUS', 'no status')}")
        uid = re.search(r"\((\d+)\)$", meta.get("UID", ""))  # "alice (1000)"
        try:
            if uid is None:
                raise ValueError("no UID")
            data = json_value(payload)  # the bounded reader: a credential's payload is outside data
        except ValueError as exc:
            raise MungeError(f"unmunge: not a credential of this suite ({exc})") from None
        if not isinstance(data, dict):
            raise MungeError("unmunge: not a credential of this suite (its payload is no object)")
        return int(uid.group(1)), data


def _metadata(out: bytes) -> dict[str, str]:
    """Unmunge's metadata lines ("STATUS:  Success (0)") before its blank line, by key."""
    head = out.partition(b"\n\n")[0].decode(errors="replace")
    return {
        key.strip(): value.strip() for key, _, value in (line.partition(":") for line in head.splitlines()) if value
    }


def slurm_munge_socket(environ: Mapping[str, str]) -> str | None:
    """Munged's socket as slurm.conf names it (``AuthInfo=socket=PATH``); None: MUNGE's default."""
    conf = Path(environ.get("SLURM_CONF") or SLURM_CONF)
    try:
        found = _AUTH_SOCKET.search(conf.read_text(errors="replace"))
    except OSError:
        return None
    return found.group(1) if found else None
