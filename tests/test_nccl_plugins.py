"""The NCCL plugins a node would load, found as NCCL (src/net.cc, src/misc/tuner.cc) and dlopen(3) find them."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.discover import nccl_plugins
from conformance.discover.nccl_plugins import find_library, net_names, tuner_names
from conformance.discover.versions import nccl_version_text


def test_the_names_nccl_tries() -> None:
    assert net_names({}) == ["libnccl-net.so"]
    assert net_names({"NCCL_NET_PLUGIN": "aws-ofi"}) == ["aws-ofi", "libnccl-net-aws-ofi.so"]
    assert tuner_names({}) == ["libnccl-tuner.so", "libnccl-net.so"]  # a net plugin may carry the tuner
    assert tuner_names({"NCCL_TUNER_PLUGIN": "t", "NCCL_NET_PLUGIN": ""}) == [
        "t", "libnccl-tuner-t.so", "libnccl-net.so",
    ]  # fmt: skip


def test_ld_library_path_comes_before_the_loader_cache(tmp_path: Path) -> None:
    first, cached = tmp_path / "first", tmp_path / "cached"
    for folder in (first, cached):
        folder.mkdir()
        (folder / "libnccl-net.so").write_bytes(folder.name.encode())
    cache = {"libnccl-net.so": str(cached / "libnccl-net.so")}
    assert find_library("libnccl-net.so", {"LD_LIBRARY_PATH": f"/nowhere:{first}"}, cache) == first / "libnccl-net.so"
    assert find_library("libnccl-net.so", {}, cache) == cached / "libnccl-net.so"
    assert find_library(str(first / "libnccl-net.so"), {}, {}) == first / "libnccl-net.so"  # a path: as given
    assert find_library("libnccl-net-missing.so", {"LD_LIBRARY_PATH": str(first)}, {}) is None


def test_two_nodes_agree_only_on_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl_plugins, "loader_cache", dict)
    monkeypatch.setattr(nccl_plugins, "DEFAULT_DIRS", ())
    (tmp_path / "libnccl-net-ofi.so").write_bytes(b"plugin v1")
    environ = {"LD_LIBRARY_PATH": str(tmp_path), "NCCL_NET_PLUGIN": "ofi"}
    one = nccl_plugins.nccl_plugins(environ)
    assert one["net"].startswith(f"{tmp_path / 'libnccl-net-ofi.so'} sha256:")
    assert one["tuner"] == one["net"]  # no tuner of its own: NCCL takes the net plugin's library
    (tmp_path / "libnccl-net-ofi.so").write_bytes(b"plugin v2")
    assert nccl_plugins.nccl_plugins(environ)["net"] != one["net"]
    assert nccl_plugins.nccl_plugins({"LD_LIBRARY_PATH": str(tmp_path)}) == {"net": "none", "tuner": "none"}


def test_the_loaded_nccl_keeps_its_suffix() -> None:
    assert nccl_version_text((2, 21, 5)) == "2.21.5"
    assert nccl_version_text((2, 21, 5, "+cuda12.4")) == "2.21.5+cuda12.4"
