"""A node's RDMA ports read from sysfs trees shaped after the kernel's (sysfs-class-infiniband ABI).

The reading code runs on real files and symlinks laid out as drivers/infiniband/core/sysfs.c writes
them; the judgement runs on what it read, and a whole run turns a bad port into the rdma_ports host
check's ERROR naming the port, in the answer, the record and the exit status.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from xml.etree import ElementTree

import pytest

from conformance.discover.rdma import RdmaFacts, port_problems, rdma_from_json, rdma_warnings, read_rdma
from conftest import copy_suites

TOPOLOGIES = Path(__file__).resolve().parent.parent / "conformance" / "scenarios" / "topologies"
HDR, HDR_HALF = "200 Gb/sec (4X HDR)", "100 Gb/sec (2X HDR)"


def add_port(
    root: Path, device: str, port: int = 1, state: str = "4: ACTIVE", phys: str = "5: LinkUp", rate: str = HDR,
    layer: str = "InfiniBand", gids: dict[int, tuple[str, str]] | None = None, pci: str = "0000:18:00.0",
) -> None:  # fmt: skip
    """One port of one device, as the kernel lays it out (the device's ``device`` a link to its PCI function)."""
    folder = root / "infiniband" / device
    port_dir = folder / "ports" / str(port)
    port_dir.mkdir(parents=True)
    functions = root / "pci"
    (functions / pci).mkdir(parents=True, exist_ok=True)
    if not (folder / "device").exists():
        (folder / "device").symlink_to(functions / pci)
    for name, text in (("state", state), ("phys_state", phys), ("rate", rate), ("link_layer", layer)):
        (port_dir / name).write_text(text + "\n")
    for index, (kind, address) in (gids or {}).items():
        for sub, text in ((port_dir / "gid_attrs" / "types", kind), (port_dir / "gids", address)):
            sub.mkdir(parents=True, exist_ok=True)
            (sub / str(index)).write_text(text + "\n")


def eight_hdr_nics(root: Path, **one: str) -> None:
    """A GPU server's eight single-port HDR NICs; ``one`` changes mlx5_3's port."""
    for i in range(8):
        add_port(root, f"mlx5_{i}", pci=f"0000:{0x18 + i:02x}:00.0", **(one if i == 3 else {}))


def test_a_healthy_fabric_reads_whole_and_passes(tmp_path: Path) -> None:
    eight_hdr_nics(tmp_path)
    (tmp_path / "peermem").mkdir()
    facts = read_rdma(tmp_path / "infiniband", tmp_path / "peermem")
    assert len(facts.ports) == 8 and facts.peermem is True
    first = facts.ports[0]
    assert (first.device, first.port, first.state, first.phys_state, first.rate_gbps, first.link_layer, first.pci) == (
        "mlx5_0",
        1,
        "ACTIVE",
        "LinkUp",
        200.0,
        "InfiniBand",
        "0000:18:00.0",
    )
    assert port_problems(facts, {}) == [] and rdma_warnings(facts, 8) == []
    assert rdma_from_json(json.loads(json.dumps(facts.to_json()))) == facts


def test_an_ib_port_down_among_active_siblings_is_named(tmp_path: Path) -> None:
    eight_hdr_nics(tmp_path, state="1: DOWN", phys="2: Polling")
    (problem,) = port_problems(read_rdma(tmp_path / "infiniband", tmp_path / "none"), {})
    assert problem.startswith("mlx5_3 port 1 (InfiniBand, DOWN/Polling, 200 Gb/s): down while 7 other InfiniBand")
    assert "cable" in problem


def test_a_roce_port_at_half_rate_is_named(tmp_path: Path) -> None:
    v2 = {3: ("RoCE v2", "0000:0000:0000:0000:0000:ffff:0a00:0001")}
    for i in range(4):
        add_port(tmp_path, f"mlx5_{i}", layer="Ethernet", gids=v2, rate=HDR_HALF if i == 2 else HDR,
                 pci=f"0000:{0x18 + i:02x}:00.0")  # fmt: skip
    facts = read_rdma(tmp_path / "infiniband", tmp_path / "none")
    assert {p.roce_v2_gids for p in facts.ports} == {(3,)}
    (problem,) = port_problems(facts, {})
    assert problem.startswith("mlx5_2 port 1 (Ethernet, ACTIVE/LinkUp, 100 Gb/s): below its siblings' 200 Gb/s")


def test_what_is_not_judged_and_what_is_judged_by_name(tmp_path: Path) -> None:
    add_port(tmp_path, "mlx5_0")
    add_port(tmp_path, "mlx5_0", port=2, state="1: DOWN", phys="3: Disabled")  # a dual port card's spare port
    add_port(tmp_path, "mlx5_1", layer="Ethernet", state="1: DOWN", phys="3: Disabled", pci="0000:19:00.0")
    facts = read_rdma(tmp_path / "infiniband", tmp_path / "none")
    assert port_problems(facts, {}) == []  # a spare port, and the only port of its link layer: not judged
    (named,) = port_problems(facts, {"NCCL_IB_HCA": "mlx5_1:1"})
    assert named.startswith("mlx5_1 port 1 (Ethernet, DOWN/Disabled, 200 Gb/s): down while NCCL_IB_HCA names it")


def test_a_link_up_port_that_is_not_active_has_no_subnet_manager(tmp_path: Path) -> None:
    add_port(tmp_path, "mlx5_0", state="2: INIT")
    (problem,) = port_problems(read_rdma(tmp_path / "infiniband", tmp_path / "none"), {})
    assert "the link is up but the port is not ACTIVE" in problem


def test_no_gpudirect_module_and_no_roce_v2_gid_warn(tmp_path: Path) -> None:
    add_port(tmp_path, "mlx5_0", layer="Ethernet", gids={0: ("IB/RoCE v1", "fe80:0000:0000:0000:0000:0000:0000:0001")})
    facts = read_rdma(tmp_path / "infiniband", tmp_path / "no-peermem")
    first, second = rdma_warnings(facts, gpus=8)
    assert first.startswith("nvidia_peermem is not loaded") and second.startswith("mlx5_0 port 1: RoCE without")
    assert rdma_warnings(facts, gpus=0)[0].startswith("mlx5_0 port 1")  # no GPU: GPUDirect is not a question


def test_no_rdma_device_reads_as_none(tmp_path: Path) -> None:
    assert read_rdma(tmp_path / "absent") == RdmaFacts()


@pytest.mark.usefixtures("isolated_env")
def test_a_machine_with_a_port_down_fails_the_host_check_naming_it(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult], reports_dir: Path, tmp_path: Path
) -> None:
    eight_hdr_nics(tmp_path, state="1: DOWN", phys="2: Polling")
    (tmp_path / "peermem").mkdir()
    machine = json.loads((TOPOLOGIES / "pcie-2gpu.json").read_text())
    machine["rdma"] = read_rdma(tmp_path / "infiniband", tmp_path / "peermem").to_json()
    (pytester.path / "box.json").write_text(json.dumps(machine))
    files = copy_suites(pytester, "test_machine_health.py")
    junit = pytester.path / "junit.xml"
    result = run_suite(
        f"--topology-file={pytester.path / 'box.json'}", "-k", "rdma_ports", f"--junitxml={junit}", *files
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    down = "mlx5_3 port 1 (InfiniBand, DOWN/Polling, 200 Gb/s): down while"
    answer = result.outlines[[i for i, line in enumerate(result.outlines) if "conformance: the answer" in line][0] + 1]
    assert answer.startswith("host check host:rdma_ports: ERROR: ") and down in answer, answer  # the answer opens so
    (record,) = [json.loads(line) for line in (reports_dir / "latest" / "results.jsonl").read_text().splitlines()]
    assert (record["probe"], record["verdict"]) == ("host:rdma_ports", "error")
    assert len(record["metrics"]["ports"]) == 8
    (failure,) = ElementTree.parse(junit).getroot().iter("failure")
    assert down in (failure.get("message") or "") + (failure.text or "")
    run_json = json.loads((reports_dir / "latest" / "run.json").read_text())
    assert run_json["end"]["state"] == "complete" and run_json["topology"]["rdma"]["ports"][3]["state"] == "DOWN"
