"""Each rank's last collectives, from torch's own flight recorder.

torch records every collective a process group issues (name, sequence number, sizes, state) in a
ring buffer: ProcessGroupNCCL's, switched on by TORCH_NCCL_TRACE_BUFFER_SIZE, and the
backend-neutral one gloo uses (torch >= 2.8), by TORCH_FR_BUFFER_SIZE.  A rank dumps it as JSON

* when the watchdog asks (SIGUSR2, at the deadline, before the stop ladder kills anything): a
  thread of the rank waits for the signal with sigwait, so the dump works while the main thread
  is blocked in a collective or a device synchronize;
* when the rank itself fails with an exception (gloo's in-rank timeouts, errors).

On NCCL, torch's own dump on timeout (TORCH_NCCL_DUMP_ON_TIMEOUT) is pointed into the rank's
folder as well, for the case where torch's watchdog acts despite the deadline order
(``deadlines.py``).
"""

from __future__ import annotations

import io
import pickle
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conformance.common import casefiles
from conformance.common.bounded_parse import MAX_DEPTH, NotParsed, json_value
from conformance.common.inputs import read_bounded

DUMP_SIGNAL = signal.SIGUSR2
BUFFER_ENTRIES = "2000"  # the buffer size torch's flight-recorder tutorial recommends
LAST_ENTRIES = 4  # collectives per rank kept in the record
TORCH_DUMP_PREFIX = "torch_flight_recorder_"  # torch's own dump on timeout: this, then the rank


def environment(backend: str, rank_path: Path) -> dict[str, str]:
    """Variables that switch the recorder on for a rank (set in the rank, before torch reads them)."""
    env = {"TORCH_FR_BUFFER_SIZE": BUFFER_ENTRIES}
    if backend == "nccl":
        prefix = str(rank_path / TORCH_DUMP_PREFIX)
        env.update(
            TORCH_NCCL_TRACE_BUFFER_SIZE=BUFFER_ENTRIES,
            TORCH_NCCL_DUMP_ON_TIMEOUT="1",
            TORCH_NCCL_DEBUG_INFO_TEMP_FILE=prefix,
            TORCH_FR_DUMP_TEMP_FILE=prefix,
        )
    return env


def _dump_json(backend: str) -> bytes:
    from torch._C import _distributed_c10d as c10d

    # ProcessGroupNCCL keeps its own recorder; gloo's is the backend-neutral one.
    name = "_dump_nccl_trace_json" if backend == "nccl" and hasattr(c10d, "_dump_nccl_trace_json") else None
    dump = getattr(c10d, name or "_dump_fr_trace_json")
    return bytes(dump(True, False))  # every entry, not only the active ones


def dump(backend: str, rank_path: Path) -> None:
    """Write the recorder's JSON to the rank's folder; a failure is written there instead."""
    try:
        data: Any = json_value(_dump_json(backend))
    except Exception as exc:  # noqa: BLE001 - a missing dump must not hide the rank's own failure
        data = {"error": f"{type(exc).__name__}: {exc}"}
    casefiles.write_json_atomic(rank_path / casefiles.FLIGHT_RECORDER, data)


def block_dump_signal() -> None:
    """Block the signal in this thread; threads started later inherit the mask."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {DUMP_SIGNAL})


def serve_dumps(backend: str, rank_path: Path) -> None:
    """Dump on every DUMP_SIGNAL, from a thread of its own (the main thread may be stuck)."""
    block_dump_signal()

    def wait_and_dump() -> None:
        while True:
            signal.sigwait({DUMP_SIGNAL})
            dump(backend, rank_path)

    threading.Thread(target=wait_and_dump, name="conformance-flight-recorder", daemon=True).start()


def _entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One recorded collective, in torch's terms: ``retired`` means it ended (done, failed or timed out)."""
    p2p = bool(entry.get("is_p2p"))
    return {
        "op": entry.get("profiling_name", "?"),
        "seq": entry.get("p2p_seq_id" if p2p else "collective_seq_id"),
        "state": entry.get("state"),
        "retired": bool(entry.get("retired")),
        "sizes": entry.get("input_sizes"),
    }


def last_collectives(rank_path: Path) -> dict[str, Any] | None:
    """The rank's last few recorded collectives and its groups' progress; None without a dump."""
    return _summary(casefiles.read_json(rank_path / casefiles.FLIGHT_RECORDER))


def torch_dumps(rank_path: Path) -> dict[str, dict[str, Any] | None]:
    """The dumps torch writes on its own timeout in the rank folder, by file name, summarised (None: not a dump).

    torch writes them to its dump prefix followed by the rank (DebugInfoWriter: TORCH_NCCL_DEBUG_INFO_TEMP_FILE
    in torch/csrc/distributed/c10d/TraceUtils.h; TORCH_FR_DUMP_TEMP_FILE first in later FlightRecorder
    sources: ``environment`` sets both), pickled, with no JSON choice for that dump: torch 2.13's own
    reader, torch/distributed/flight_recorder/components/loader.py, unpickles it.  Read here through
    :class:`_DumpUnpickler`, which builds plain values only, so a file put in the rank folder by anyone
    else can refuse to load but cannot run code; and at most :data:`DUMP_BYTES` of it, nested at most
    ``bounded_parse.MAX_DEPTH`` deep.
    """
    found: dict[str, dict[str, Any] | None] = {}
    for path in sorted(rank_path.glob(TORCH_DUMP_PREFIX + "*")):
        try:
            found[path.name] = _summary(_read_dump(path))
        except (OSError, ValueError, pickle.UnpicklingError, EOFError) as exc:
            found[path.name] = {"error": f"{type(exc).__name__}: {exc}", "last": [], "groups": {}}
    return found


DUMP_BYTES = 256 << 20  # 2000 entries with their stack frames: a few MiB in the dumps seen


def _read_dump(path: Path) -> Any:
    raw = read_bounded(path, DUMP_BYTES)
    if raw.lstrip()[:1] == b"{":
        return json_value(raw)
    try:
        data = _DumpUnpickler(io.BytesIO(raw)).load()
    except (RecursionError, MemoryError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise pickle.UnpicklingError(f"not a dump: {type(exc).__name__}") from None
    _refuse_shape(data)
    return data


def _refuse_shape(data: object) -> None:
    """NotParsed for a value nested too deep, or one whose lists and objects share one another.

    JSON cannot share, a pickle can: a cycle, or a list holding one list twice, 64 times over, which a
    walk (and ``json.dumps`` of the record it would reach) takes 2**64 steps through.  torch builds every
    list and object of a dump anew (FlightRecorder's dump_entry), so a shared one is no dump of torch's.
    Walked without recursion, each value once.
    """
    stack, seen = [(data, 1)], set()
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list | tuple) else None
        if not children:  # a scalar, or an empty list (Python shares its one empty tuple)
            continue
        if level > MAX_DEPTH:
            raise NotParsed(f"nested deeper than {MAX_DEPTH} levels")
        if id(item) in seen:
            raise NotParsed("a list or object in it is shared (or holds itself): not a dump of torch's")
        seen.add(id(item))
        stack.extend((child, level + 1) for child in children)


def _same(value: object, *_: object) -> object:
    return value


class _DumpUnpickler(pickle.Unpickler):
    """Plain values only: the one kind of global a dump names is torch's list builders, which return their list.

    torch's pickler (torch/csrc/jit/serialization/pickler.cpp) writes specialised lists as a call of
    ``torch.jit._pickle.build_intlist`` and its kin, each of which returns its argument
    (torch/jit/_pickle.py); any other global is refused, so nothing in the file is ever called.
    """

    SAME = frozenset({"build_intlist", "build_doublelist", "build_boollist", "build_tensorlist", "restore_type_tag"})

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.jit._pickle" and name in self.SAME:
            return _same
        raise pickle.UnpicklingError(f"names {module}.{name}, which a flight-recorder dump does not")


def _summary(data: Any) -> dict[str, Any] | None:
    if not isinstance(data, dict):
        return None
    if "error" in data:
        return {"error": str(data["error"]), "last": [], "groups": {}}
    listed = data.get("entries")
    entries = [e for e in listed if isinstance(e, dict)] if isinstance(listed, list) else []
    entries.sort(key=_record_id)
    groups = data.get("pg_status", {})
    return {
        "last": [_entry(e) for e in entries[-LAST_ENTRIES:]],
        "groups": groups if isinstance(groups, dict) else {},
        "issued": _record_id(entries[-1]) + 1 if entries else 0,
    }


def issued(collectives: Mapping[str, Any] | None) -> int | None:
    """How many operations the rank handed NCCL (torch's ``record_id`` counts them from 0); None: no dump to say.

    Ranks of one case issue the same operations in the same order, so a rank that issued fewer than
    its peers never joined the one they wait in: torch's own analyser of these dumps names such a
    rank as missing from the collective (torch/distributed/flight_recorder/components/builder.py,
    torch 2.13: "a rank didn't schedule the coalesced collective").
    """
    if not collectives or collectives.get("error"):
        return None
    found = collectives.get("issued")
    return found if type(found) is int and found >= 0 else None


def _record_id(entry: Mapping[str, Any]) -> int:
    """Where torch recorded the entry (a whole number; anything else first)."""
    found = entry.get("record_id")
    return found if type(found) is int else -1


def describe(collectives: Mapping[str, Any] | None) -> str:
    """One line: the rank's last collective and whether it has ended."""
    if not collectives:
        return "no flight-recorder dump"
    if collectives.get("error"):
        return f"flight-recorder dump failed: {collectives['error']}"
    last = collectives.get("last") or []
    if not last:
        return "no collective recorded"
    e = last[-1]
    ended = "ended" if e["retired"] or e["state"] == "completed" else "still in flight"
    return f"last collective {e['op']} #{e['seq']} {e['sizes']} {ended} (state {e['state']})"
