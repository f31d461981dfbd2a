"""The one hostile string the sink tests send through every outside text that reaches a sink.

Each part attacks a sink: NUL, VT and ESC make XML not XML (1.0 §2.2 Char); ``ESC [2K`` and ``\\r``
erase and overwrite a terminal line; a newline ends a shell comment or a Prometheus sample; quotes,
a backslash, ``$(...)`` and backticks break out of shell quoting or run a command; ``]]>`` ends a
CDATA section; ``</script><script>`` and ``<!--`` are markup; U+202E reorders what is read; U+2028
is a line break in one line; a lone surrogate is no UTF-8 (``\\udcff``: the one ``os.fsdecode``
makes of the byte 0xff, as a host name or a variable that is not UTF-8 reads); ``"} 1`` and a
newline then ``fake_metric 1`` forge a Prometheus sample.

Some carriers cannot hold every character: no environment variable or command-line argument holds
a NUL (``execve`` takes C strings), a TOML file no surrogate (its strings are Unicode scalar
values).  :func:`carried` drops exactly those, and nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PWNED = "PWNED"  # the file a command smuggled in would create
HOSTILE = (
    'h\x00\x0b\x1b[2K\r\n\'"\\$(touch PWNED)`touch PWNED`]]></script><script><!--\u202e\u2028\udcff"} 1\nfake_metric 1'
)
NUL = "\x00"
SURROGATE = "\udcff"
NEWLINES = "\n"


def carried(text: str, cannot_hold: str) -> str:
    """``text`` without the characters a carrier cannot hold (``NUL``, ``SURROGATE``, ``NEWLINES``)."""
    return "".join(char for char in text if char not in cannot_hold)


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string, every character outside printable ASCII as its ``\\u`` escape."""
    if SURROGATE in text:
        raise ValueError("a TOML string holds no surrogate: use carried(text, SURROGATE)")

    def escaped(char: str) -> str:
        if " " <= char < "\x7f" and char not in '"\\':
            return char
        return f"\\u{ord(char):04x}" if ord(char) < 0x10000 else f"\\U{ord(char):08x}"

    return '"' + "".join(escaped(char) for char in text) + '"'


# -- a finished run whose every outside text is hostile --------------------------------------------

IN_ENVIRONMENT = carried(HOSTILE, NUL)  # what a variable's value can hold of it
EVIL_RUNG = "evil"  # the rung that fixes the single GPU; its values are hostile
SETTABLE = "NCCL_ALGO"  # set to IN_ENVIRONMENT by the evil rung: a shell reads back exactly that
UNSETTABLE_VALUE = "NCCL_PROTO"  # set to HOSTILE (a NUL): no shell variable can hold it
UNSETTABLE_NAME = "NCCL_" + carried(HOSTILE, NUL + "=")  # no shell variable name
CONFIG_NAME = "NCCL_SOCKET_IFNAME"  # set by NCCL's configuration file (to HOSTILE): a clean rung removes it


def _record(nodeid: str, rung: str, verdict: str, **fields: Any) -> dict[str, Any]:
    return {
        "schema": 1, "run_id": HOSTILE, "nodeid": f"suites/test_{HOSTILE}.py::test_x[{HOSTILE}-{nodeid}-{rung}]",
        "probe": "pair_exchange", "devices": ["gpu0", "gpu1"], "device_ids": ["gpu0", "gpu1"], "link": HOSTILE,
        "set_kind": "pair", "ladder_key": f"test_x[{HOSTILE}-{nodeid}]", "backend": "nccl", "env_name": rung,
        "env": {}, "verdict": verdict, "summary": f"{verdict}: {HOSTILE}", "root_cause": None, "victims": [],
        "ranks": [], "bandwidth_gbps": 5.0 if verdict == "pass" else None, "metrics": {},
        "nccl_warnings": [HOSTILE], "seconds": 0.1, "simulated": True, "case_dir": HOSTILE, "time": 0.0,
        **fields,
    }  # fmt: skip


def hostile_records() -> list[dict[str, Any]]:
    """A pair class (link HOSTILE) fixed by ``clean``; a single GPU fixed by the evil rung; a collective, a check."""
    single = {"devices": ["gpu0"], "device_ids": ["gpu0"], "link": None, "set_kind": "single"}
    collective = {"probe": "all_reduce", "set_kind": "all", "link": "all", "ladder_key": f"all[{HOSTILE}]",
                  "metrics": {"busbw_gbps": {HOSTILE: 1.0}, "algbw_gbps": {HOSTILE: 1.0}}}  # fmt: skip
    return [
        _record(
            "pair",
            "inherited",
            "error",
            root_cause={"rank": 0, "kind": HOSTILE, "message": HOSTILE, "phase": HOSTILE, "step": HOSTILE},
        ),
        _record("pair", "clean", "pass"),
        _record("single", "inherited", "hang", **single),
        _record("single", "clean", "crash", **single),
        _record("single", EVIL_RUNG, "pass", **single),
        _record("all", "inherited", "pass", **collective),
        _record("check", "inherited", "error", probe=f"host:{HOSTILE}", set_kind="host", link=None),
    ]


def hostile_facts() -> dict[str, Any]:
    evil = {"name": EVIL_RUNG, "set": {SETTABLE: IN_ENVIRONMENT, UNSETTABLE_VALUE: HOSTILE, UNSETTABLE_NAME: "1"}}
    config = {CONFIG_NAME: {"value": HOSTILE, "file": HOSTILE}, UNSETTABLE_NAME: {"value": HOSTILE, "file": HOSTILE}}
    return {
        "schema": 1, "run_id": HOSTILE, "host": HOSTILE, "backend": "nccl", "torch": HOSTILE, "nccl": HOSTILE,
        "inherited_env": {UNSETTABLE_NAME: HOSTILE, "NCCL_DEBUG": HOSTILE}, "simulated": True, "scenario": HOSTILE,
        "nccl_config": {"values": config, "files": [HOSTILE], "unreadable": [HOSTILE]},
        "ladder": [{"name": "inherited"}, {"name": "clean", "unset_families": ["NCCL_", "TORCH_NCCL_"]}, evil],
        "end": {"state": "complete"},
    }  # fmt: skip


def hostile_run_folder(parent: Path) -> Path:
    """A finished run's folder (named HOSTILE, as a path can be) whose run.json and records say HOSTILE."""
    folder = parent / carried(HOSTILE, NUL + "/")
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps(hostile_facts()))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in hostile_records()))
    return folder
