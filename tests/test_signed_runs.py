"""Runs across nodes end to end (pytest processes as nodes, over loopback): signed, refused unsigned, always answering.

The unit-level attacks on every channel are ``test_signing.py``'s; here the whole run: nothing it
publishes or writes lets the token be tested offline, a run that cannot sign is refused unless asked
and then says UNSIGNED on every node, and node 0's store server killed mid-run still ends every node
with its answer.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import secrets
import signal
import threading
import time
from typing import Any

import psutil
import pytest
import torch.distributed as dist  # here, not in a test: pytester would unload it after

from conformance.launch.case import case_dir_name
from conftest import Node, copy_suites, free_port, scenario_text, start_node

pytestmark = [pytest.mark.usefixtures("isolated_env", "run_tag"), pytest.mark.slow]
FAST = ("--init-timeout=5", "--op-timeout=5", "--step-timeout=10", "--rendezvous-timeout=20")
ANSWER = "conformance: the answer"


def answer_block(output: str) -> list[str]:
    """The answer's lines, checked to be the last block on the screen."""
    lines = output.rstrip().splitlines()
    begins = max(i for i, line in enumerate(lines) if ANSWER in line)
    block = lines[begins + 1 :]
    assert block and not any(line.startswith("=") for line in block), output[-3000:]
    return block


def dump_the_store(port: int, seen: dict[str, bytes], stop: threading.Event) -> None:
    """A stranger who reads node 0's store: every key and value it ever holds (TCPStore lists its keys)."""
    while not stop.is_set():
        try:
            timeout = datetime.timedelta(seconds=2)
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)  # type: ignore[attr-defined]
            while not stop.is_set():
                for key in store.list_keys():
                    if store.check([key]):
                        seen[key] = store.get(key)
                time.sleep(0.05)
        except RuntimeError:
            time.sleep(0.1)  # not up yet, or gone


def derived_from(token: str, published: list[bytes]) -> dict[str, str]:
    """Every digest of the token, and every HMAC of it with a published value as key or message: hex -> what."""
    secret = token.encode()
    found = {}
    for name in ("sha256", "sha1", "md5", "blake2b", "blake2s", "sha512", "sha3_256"):
        digest = hashlib.new(name, secret).hexdigest()
        found[digest] = name
        found[digest[:16]] = f"{name} (its first 16)"  # how run token tags were shown
    pieces = {piece for value in published for piece in (value, *value.replace(b"\n#hmac-sha256:", b" ").split())}
    for piece in pieces:
        for name in ("sha256", "sha1", "md5"):
            found[hmac.new(secret, piece, name).hexdigest()] = f"HMAC-{name}(token, {piece[:20]!r})"
            found[hmac.new(piece, secret, name).hexdigest()] = f"HMAC-{name}({piece[:20]!r}, token)"
    return found


def test_nothing_a_run_publishes_or_writes_lets_its_token_be_tested_offline(pytester: pytest.Pytester) -> None:
    """Before: the store held sha256(token)[:16] and a nonce the key came from: `gpu7` fell offline in 1-3 s."""
    files = copy_suites(pytester, "test_multinode.py")
    port, token = free_port(), secrets.token_urlsafe(32)
    args = (*files, *FAST, "--virtual-devices=1", "-k", "barrier")
    seen: dict[str, bytes] = {}
    stop = threading.Event()
    dumper = threading.Thread(target=dump_the_store, args=(port, seen, stop), daemon=True)
    dumper.start()
    nodes = [
        start_node(pytester.path, 0, 2, port, *args, f"--run-token={token}", f"--junitxml={pytester.path / 'j0.xml'}"),
        start_node(pytester.path, 1, 2, port, *args, f"--run-token={token}"),
    ]
    for node in nodes:
        code, _ = node.wait()
        assert code == pytest.ExitCode.OK, node.output
    stop.set()
    dumper.join(10)
    derived = derived_from(token, list(seen.values()))
    written = [p for p in pytester.path.rglob("*") if p.is_file() and p.suffix != ".py"]
    texts = {**{f"store {k}": v.decode(errors="replace") for k, v in seen.items()},
             **{str(p): p.read_text(errors="replace") for p in written}}  # fmt: skip
    for where, text in texts.items():
        assert token not in text, where
        leaked = [what for digest, what in derived.items() if digest in text]
        assert not leaked, f"{where} holds {leaked}"
    assert {"challenge", "hello/1/1", "answer/1/1", "identity", "check", "results/1"} <= set(seen), sorted(seen)
    assert "WARNING the run token is on the command line" in nodes[0].output  # any local user reads it


def test_a_run_across_nodes_that_cannot_sign_is_refused_unless_asked_then_unsigned_on_every_node(
    pytester: pytest.Pytester,
) -> None:
    """By hand, no token, no MUNGE: one line, exit 4, nothing hosted; --unsigned: UNSIGNED opens every answer."""
    files = copy_suites(pytester, "test_multinode.py")
    port, args = free_port(), (*files, *FAST, "--virtual-devices=1", "-k", "barrier")
    refused = start_node(pytester.path, 0, 2, port, *args, run_token=None)
    code, _ = refused.wait()
    assert code == pytest.ExitCode.USAGE_ERROR, refused.output
    [line] = [t for t in refused.output.splitlines() if "cannot sign what its nodes exchange" in t]
    assert line.startswith("ERROR: conformance: a run across 2 nodes cannot sign what its nodes exchange: no run token")
    assert "python -m conformance token --file FILE" in line and "or say --unsigned" in line
    nodes = [start_node(pytester.path, rank, 2, port, *args, "--unsigned") for rank in (0, 1)]  # loopback included
    for node in nodes:
        code, _ = node.wait()
        assert code == pytest.ExitCode.OK, node.output
        assert answer_block(node.output)[0].startswith("UNSIGNED: the nodes' values were not signed (--unsigned: ")
    facts = json.loads(next(nodes[0].reports.glob("*/run.json")).read_text())
    assert facts["unsigned"].startswith("--unsigned: no run token")


def store_server_of(node: Node) -> psutil.Process:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process(node.process.pid).children(recursive=True):
            try:
                if "conformance.nodes.store_server" in " ".join(child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.1)
    raise AssertionError(f"node 0 started no store server: {node.output[-2000:]}")


def test_node_0s_store_server_killed_mid_run_every_node_still_answers(pytester: pytest.Pytester) -> None:
    """Before: a raw DistNetworkError traceback and no answer.  Now: every node's last block is its answer."""
    files = copy_suites(pytester, "test_multinode.py")
    hang = scenario_text('effect = "hang"\nphase = "probe"\nsets = ["across_nodes"]\nranks = [1]')
    pytester.makefile(".toml", hang=hang)
    port = free_port()
    args = (*files, *FAST, "--virtual-devices=1", "--scenario=hang.toml", "--matrix=inherited")
    nodes = [start_node(pytester.path, rank, 2, port, *args) for rank in (0, 1)]
    server = store_server_of(nodes[0])
    first_case = case_dir_name("suites/test_multinode.py::test_all_reduce_across_nodes[nodes2x1-inherited]")
    deadline = time.monotonic() + 90
    while not [d for d in nodes[1].reports.glob("*/cases") if (d / first_case / "rank0" / "phase.jsonl").exists()]:
        assert time.monotonic() < deadline and nodes[1].process.poll() is None, nodes[1].output
        time.sleep(0.1)
    os.kill(server.pid, signal.SIGKILL)
    for rank, node in enumerate(nodes):
        code, _ = node.wait()
        assert code not in (pytest.ExitCode.OK, pytest.ExitCode.INTERNAL_ERROR), node.output
        # torch's own C++ warning of the broken connection may stand above; no Python traceback, no INTERNALERROR
        assert "Traceback (most recent call last)" not in node.output and "INTERNALERROR" not in node.output
        block = answer_block(node.output)
        expected = "RUN FAILED: node 0's store server ended during the run (signal SIGKILL)" if rank == 0 else (
            "RUN FAILED on another node: node 0: no outcome of the run from it (node 0's store unreachable since "
        )  # fmt: skip
        assert any(line.startswith(expected) for line in block), block
        end = json.loads(next(node.reports.glob("*/run.json")).read_text())["end"]
        assert end["state"] != "started", end  # the run's end was written
        lost = end["store_problems"] if rank == 0 else end["failed_nodes"]
        assert lost and "store" in " ".join(lost) or "node 0" in " ".join(lost), end


def test_a_guessable_token_stops_the_run_in_one_line(pytester: pytest.Pytester) -> None:
    files = copy_suites(pytester, "test_multinode.py")
    result = pytester.runpytest_subprocess("-p", "conformance.plugin", "-p", "no:cacheprovider", *files,
                                           "--run-token=gpu7")  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors: list[Any] = [line for line in result.stderr.lines if line.strip()]
    assert len(errors) == 1 and "gpu7" not in errors[0], errors
    assert errors[0].startswith("ERROR: conformance: command-line option --run-token: the run token (4 characters, ")
    assert "python -m conformance token --file FILE" in errors[0]
