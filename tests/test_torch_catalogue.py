"""The torch catalogue: generated from torch's sources, every entry classed with an action, real lines found.

The build (pure Python) on the pinned raw input gives the shipped catalogue byte for byte; the Python and header
extraction, rerun on the venv's torch, gives the raw input's 2.13.0 records; the whole extraction, where a folder of
release wheels is named (``$TORCH_WHEELS``), gives the raw input.  The known lines are torch's texts as its format
strings print them, each test naming the file and function it comes from.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from conformance.diagnose.torch_catalogue import (
    CATALOGUE_FILE,
    class_titles,
    torch_entries,
    torch_match,
    torch_message,
)
from conformance.verdict.job_causes import CLASSES
from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))

import torch_catalogue_build as build  # noqa: E402
import torch_catalogue_extract as extract  # noqa: E402
from torch_catalogue_rules import ROLES, RULES  # noqa: E402
from torch_catalogue_sources import cpp_messages, python_messages  # noqa: E402

CATALOGUE_ONLY = {"invalid_usage", "ending", "state", "torch_internal"}
ACTIONS = (
    "check", "set", "unset", "run", "rerun", "free", "raise", "give", "find", "fix", "read", "compare", "correct",
    "call", "name", "test",
)  # fmt: skip
RAW = json.loads(extract.RAW.read_text())


def test_every_entry_has_a_class_a_role_an_action_and_its_provenance() -> None:
    known = {c.key for c in CLASSES} | CATALOGUE_ONLY
    entries = torch_entries()
    assert len(entries) > 800, len(entries)
    for entry in entries:
        assert entry.failure_class in known and entry.title == class_titles()[entry.failure_class], entry
        assert entry.role in ROLES and entry.fix.split(None, 1)[0] in ACTIONS, entry
        p = entry.provenance
        assert p.file.startswith("torch/") and (p.line > 0 or p.function), entry
        assert extract.VERSIONS.index(p.first_version) <= extract.VERSIONS.index(p.last_version), entry
        assert p.source in ("python", "header", "cpp"), entry
        for refinement in entry.refine:
            assert refinement.failure_class in known and refinement.fix.split(None, 1)[0] in ACTIONS, entry


def test_every_rule_cites_what_it_reads() -> None:
    source = (REPO / "tools" / "torch_catalogue_rules.py").read_text()
    table = source[source.index("RULES: tuple[Rule, ...] = (") :]
    for rule in RULES[:-1]:
        before = table[: table.index(f'Rule("{rule.name}"')]
        assert re.search(r"#[^\n]*\n(?:[^\n]*\n){0,12}\s*$", before) or rule.paths or rule.kinds, rule.name


def test_the_build_on_the_pinned_input_gives_the_shipped_catalogue_byte_for_byte() -> None:
    texts = build.built()
    assert set(texts) == {CATALOGUE_FILE}
    assert CATALOGUE_FILE.read_text() == texts[CATALOGUE_FILE], "stale: run python tools/torch_catalogue_build.py"


def test_the_build_prints_the_entries_per_class(capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["--check"]) == 0
    printed = capsys.readouterr().out
    counts: dict[str, int] = {}
    for entry in json.loads(CATALOGUE_FILE.read_text())["entries"]:
        counts[entry["class"]] = counts.get(entry["class"], 0) + 1
    for cls, n in counts.items():
        assert re.search(rf"^  {cls} +{n} ", printed, re.M), (cls, n, printed)
    assert "up to date" in printed


def test_every_transcribed_cpp_format_names_what_was_read_and_most_are_in_a_release() -> None:
    reads = RAW["source"]["cpp_read"]
    dated = [r for r in RAW["cpp_records"] if r["first_version"]]
    for record in RAW["cpp_records"]:
        assert record["read"] and all(read in reads for read in record["read"]), record
        assert record["function"] and record["file"].endswith(".cpp"), record
    assert len(dated) >= 0.85 * len(RAW["cpp_records"]), len(dated)


def _installed_torch() -> Path | None:
    try:
        import torch
    except ImportError:
        return None
    return Path(torch.__file__).parent


def _version_of(torch_dir: Path) -> str:
    m = re.search(r"__version__ = '([^'+]+)", (torch_dir / "version.py").read_text())
    return m.group(1) if m else ""


def test_the_venvs_torch_gives_the_pinned_2_13_records() -> None:
    torch_dir = _installed_torch()
    if torch_dir is None or _version_of(torch_dir) != extract.VERSIONS[-1]:
        pytest.skip(f"the venv's torch is not {extract.VERSIONS[-1]} (the pinned records' last release)")
    lines: dict[tuple[str, str, str, str], set[int]] = {}
    for m in extract.tree_messages(extract.installed_files(torch_dir)):
        lines.setdefault((m.path, m.kind, m.style, json.dumps(m.pieces)), set()).add(m.line)
    pinned = {
        (r["file"], r["kind"], r["style"], json.dumps(r["pieces"])): r["line"]
        for r in RAW["records"]
        if r["last_version"] == extract.VERSIONS[-1]
    }
    assert set(lines) == set(pinned), (sorted(set(lines) - set(pinned))[:5], sorted(set(pinned) - set(lines))[:5])
    assert all(line in lines[key] for key, line in pinned.items())  # a format twice in a file: one line is kept


WHEELS = os.environ.get("TORCH_WHEELS", "")


@pytest.mark.slow
@pytest.mark.skipif(not WHEELS or not Path(WHEELS).is_dir(), reason="no folder of torch wheels named ($TORCH_WHEELS)")
def test_the_extraction_from_the_wheels_gives_the_pinned_input() -> None:
    assert extract.extracted(Path(WHEELS)) == extract.RAW.read_text(), "run python tools/torch_catalogue_extract.py"


def test_the_extractors_read_what_the_sources_write() -> None:
    python = (
        'def f(rank):\n    raise RuntimeError(f"rank {rank} failed: " + str(rank))\n    logger.info("%s done", rank)\n'
    )
    got = [(m.kind, m.style, m.key()) for m in python_messages("torch/x.py", python)]
    assert got == [
        ("raise:RuntimeError", "plain", "rank {=rank} failed: {=str(rank)}"),
        ("log:info", "printf", "%s done"),
    ]
    cpp = (
        'void f() {\n  LOG(ERROR) << logPrefix() << "Work " << seq_ << " timed out.";\n'
        '  TORCH_CHECK(ok, "Invalid rank ", rank_);\n  auto m = fmt::format("a {} b", x);\n}\n'
    )
    got = [(m.kind, m.style, m.key()) for m in cpp_messages("x.cpp", cpp)]
    assert got == [("LOG(ERROR)", "plain", "{=logPrefix ( )}Work {=seq_} timed out."),
                   ("TORCH_CHECK", "plain", "Invalid rank {=rank_}"), ("fmt::format", "fmt", "a {} b")]  # fmt: skip


# (a line as a job's log shows it, the text of its format's line, the file, the class, the role); each line is
# written from the format the comment names.
KNOWN_LINES = (
    # ProcessGroupNCCL.cpp WorkNCCL::checkTimeout with operator<<(WorkNCCL), as glog and torchrun prefix it
    ("[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective operation "
     "timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran "
     "for 600081 milliseconds before timing out.", "Watchdog caught collective operation timeout",
     "ProcessGroupNCCL.cpp", "hang", "first"),
    # ProcessGroupNCCL.cpp WorkNCCL::handleException
    ("[rank1]:[E1111 17:01:37.1 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 1] Some NCCL "
     "operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations "
     "might run on corrupted/incomplete data.", "Some NCCL operations have failed", "ProcessGroupNCCL.cpp",
     "nccl_error", "consequence"),
    # ProcessGroupNCCL.cpp HeartbeatMonitor::runLoop (2.5 and later)
    ("[rank1]:[E1111 17:10:53.2 ProcessGroupNCCL.cpp:1400] [PG ID 0 PG GUID 0(default_pg) Rank 1] ProcessGroupNCCL's "
     "watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives. This typically "
     "indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, ", "watchdog got stuck for",
     "ProcessGroupNCCL.cpp", "watchdog_stuck", "root"),
    # ProcessGroupNCCL.cpp heartbeatMonitor (2.3, 2.4)
    ("[PG 0 Rank 3] Heartbeat monitor timed out! Process will be terminated after dumping debug info. "
     "workMetaList_.size()=2", "Heartbeat monitor timed out!", "ProcessGroupNCCL.cpp", "watchdog_stuck", "root"),
    # ProcessGroupWrapper.cpp CollectiveFingerPrint::verify (TORCH_DISTRIBUTED_DEBUG=DETAIL)
    ("RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: "
     "CollectiveFingerPrint(SequenceNumber=18, OpType=ALLGATHER), but Rank 2 is running collective: "
     "CollectiveFingerPrint(SequenceNumber=22, OpType=ALLGATHER).", "Detected mismatch between collectives",
     "ProcessGroupWrapper.cpp", "desync", "root"),
    # NCCLUtils.cpp NCCLComm::getNcclComm, the reason a watchdog timeout
    ("torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3.  Original reason for failure "
     "was: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5",
     "NCCL communicator was aborted on rank", "NCCLUtils.cpp", "rank_error", "victim"),
    # ... and when the reason quoted is the watchdog's timeout, that format (more of the line) is the answer
    ("torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3.  Original reason for failure "
     "was: [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, "
     "NumelOut=1, Timeout(ms)=1800000) ran for 1800314 milliseconds before timing out.",
     "Watchdog caught collective operation timeout", "ProcessGroupNCCL.cpp", "hang", "first"),
    # NCCLUtils.cpp getNcclErrorDetailStr
    ("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
     "ncclRemoteError: A call failed", "NCCLUtils.cpp", "rank_error", "victim"),
    # Utils.hpp recvBytes (a c10d header)
    ("torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did the remote "
     "server shutdown or crash?", "Failed to recv, got 0 bytes", "Utils.hpp", "rank_error", "victim"),
    # socket.cpp SocketConnectOp::run and tryConnect
    ("torch.distributed.DistNetworkError: The client socket has failed to connect to any network address of "
     "(node0, 29500). The client socket has failed to connect to node0:29500 (errno: 113 - No route to host).",
     "The client socket has failed to connect to any network address", "socket.cpp", "network_interface", "root"),
    # TCPStore.cpp TCPStore::waitForWorkers
    ("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
     "waiting for clients", "TCPStore.cpp", "rendezvous", "victim"),
    # elastic/multiprocessing/errors/__init__.py _MSG_FORMAT_TEMPLATE and _FAILURE_FORMAT_TEMPLATE
    ("Root Cause (first observed failure):", "Root Cause (first observed failure):", "errors/__init__.py",
     "rank_error", "report"),
    ("  exitcode  : -9 (pid: 4242) (SIGKILL)", "exitcode  : ", "errors/__init__.py", "killed", "root"),
    ("  exitcode  : 1 (pid: 4242)", "exitcode  : ", "errors/__init__.py", "rank_error", "report"),
    # elastic/multiprocessing/errors/__init__.py ProcessFailure.__post_init__
    ("  traceback : Signal 9 (SIGKILL) received by PID 4242", "received by PID", "errors/__init__.py", "killed",
     "root"),
    # elastic/agent/server/api.py SimpleElasticAgent._exit_barrier
    ("INFO:torch.distributed.elastic.agent.server.api:Local worker group finished (WorkerState.SUCCEEDED). Waiting "
     "300 seconds for other agents to finish", "Local worker group finished", "agent/server/api.py", "ending",
     "state"),
    ("Local worker group finished (WorkerState.FAILED). Waiting 300 seconds for other agents to finish",
     "Local worker group finished", "agent/server/api.py", "rank_error", "consequence"),
    # elastic/rendezvous/api.py: the exception a traceback ends with
    ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", "RendezvousTimeoutError",
     "rendezvous/api.py", "rendezvous", "root"),
)  # fmt: skip


@pytest.mark.parametrize(("line", "text", "file", "cls", "role"), KNOWN_LINES, ids=lambda v: str(v)[:40])
def test_known_lines_find_their_format(line: str, text: str, file: str, cls: str, role: str) -> None:
    entry = torch_message(line)
    assert entry is not None, line
    assert text in entry.text and entry.provenance.file.endswith(file), entry
    assert (entry.failure_class, entry.role) == (cls, role), entry
    assert entry.fix.split(None, 1)[0] in ACTIONS, entry.fix


def test_a_line_holds_the_values_its_format_names() -> None:
    found = torch_match("[Rank 5] Timeout at NCCL work: 14863, last enqueued NCCL work: 14863, last completed NCCL "
                        "work: 14862.")  # fmt: skip
    assert found is not None and found.entry.failure_class == "hang"
    assert (found.fields["seq"], found.fields["lastcompletedseq"]) == ("14863", "14862"), found.fields


@pytest.mark.parametrize("line", ["", "   ", "epoch 3 step 120 loss 0.4213", "NCCL INFO Channel 00/02 : 0 1",
                                  "Traceback (most recent call last):"])  # fmt: skip
def test_a_line_no_format_prints_finds_nothing(line: str) -> None:
    assert torch_message(line) is None


def _rendered(regex: str) -> str:
    """A line the entry's regex matches: each group filled with what its format prints (a number, or words)."""
    filled = re.sub(r"\((?:\?P<\w+>)?-\?\\d\+\)", "7", regex)
    filled = re.sub(r"\((?:\?P<\w+>)?\.\*\??\)", "x y", filled)
    filled = filled.replace("(?:", "").replace(")?", "")  # the optional tail, all of it
    return re.sub(r"\\(.)", r"\1", filled)


def test_every_entry_finds_its_own_line_or_a_more_specific_one() -> None:
    lost = []
    for entry in torch_entries():
        found = torch_message(_rendered(entry.regex))
        if found is None or found.literal < entry.literal:
            lost.append((entry.text, found and found.text))
    assert not lost, lost[:10]
