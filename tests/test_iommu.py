"""IOMMU and ACS above the GPUs: read from sysfs as the kernel lays it out, judged beside P2P failures (issue 26).

The host is a folder of this test's own: ``devices/pci0000:00/<root port>/<switch ports>/<gpu>``
with ``bus/pci/devices/<bdf>`` links to them, as Linux has them, each bridge's ``config`` holding
the ACS extended capability at 0x100 (``include/uapi/linux/pci_regs.h``'s layout).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.discover import iommu as iommu_module
from conformance.discover.iommu import (
    Bridge,
    IommuError,
    IommuFacts,
    acs_control,
    iommu_from_json,
    read_iommu,
)
from conftest import copy_suites, read_records
from test_scenario_answers import answer_lines

TOPOLOGIES = Path(__file__).resolve().parent.parent / "conformance" / "scenarios" / "topologies"
ROOT_PORT, SWITCH_UP, SWITCH_DOWN = "0000:00:01.0", "0000:01:00.0", "0000:02:08.0"
GPUS = ("0000:03:00.0", "0000:04:00.0")


def config_space(acs_control_bits: int | None, size: int = 4096) -> bytes:
    """A config space with an AER capability at 0x100 pointing on to ACS at 0x140 (or no ACS)."""
    data = bytearray(size)
    if size > 0x100:
        next_cap = 0x140 if acs_control_bits is not None else 0
        data[0x100:0x104] = (0x0001 | 1 << 16 | next_cap << 20).to_bytes(4, "little")  # AER, version 1
        if acs_control_bits is not None:
            data[0x140:0x144] = (0x000D | 1 << 16).to_bytes(4, "little")  # ACS, version 1, last
            data[0x146:0x148] = acs_control_bits.to_bytes(2, "little")
    return bytes(data)


def sysfs(root: Path, acs: dict[str, int | None], group: str | None = "DMA", config_size: int = 4096) -> Path:
    """Two GPUs under one switch (its downstream ports) under a root port; returns bus/pci/devices."""
    devices = root / "devices" / "pci0000:00"
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    down = {GPUS[0]: SWITCH_DOWN, GPUS[1]: "0000:02:10.0"}
    for gpu, port in down.items():
        path = devices / ROOT_PORT / SWITCH_UP / port / gpu
        path.mkdir(parents=True)
        if group is not None:
            (path / "iommu_group").mkdir()
            (path / "iommu_group" / "type").write_text(group + "\n")
    for bridge in (ROOT_PORT, SWITCH_UP, *down.values()):
        path = next(devices.rglob(bridge))
        (path / "config").write_bytes(config_space(acs.get(bridge, 0x1D), config_size))  # SV+RR+CR+UF by default
    for path in devices.rglob("0000:*"):
        (links / path.name).symlink_to(path)
    return links


def test_acs_redirect_on_the_bridges_above_the_gpus_and_the_iommus_mode(tmp_path: Path) -> None:
    cmdline = tmp_path / "cmdline"
    cmdline.write_text("BOOT_IMAGE=/vmlinuz ro quiet intel_iommu=on iommu=pt splash\n")
    quiet = {ROOT_PORT: 0x0001, SWITCH_UP: None, "0000:02:10.0": 0x0000}  # source validation only; no ACS; off
    facts = read_iommu(GPUS, sysfs(tmp_path, quiet, group="identity"), cmdline)
    assert (facts.mode, facts.cmdline) == ("passthrough", ("intel_iommu=on", "iommu=pt"))
    assert (
        facts.bridges
        == (  # kinds by their place on the path: these config spaces hold no PCIe capability
            Bridge(ROOT_PORT, "root_port", GPUS, 0x0001),
            Bridge(SWITCH_UP, "switch_upstream", GPUS, 0),
            Bridge(SWITCH_DOWN, "switch_downstream", GPUS[:1], 0x1D),
            Bridge("0000:02:10.0", "switch_downstream", GPUS[1:], 0),
        )
    )
    assert facts.acs_redirect == (SWITCH_DOWN,) and facts.acs_unreadable == ()
    assert facts.redirects_p2p and facts.cause_text() == f"ACS redirects P2P on bridge(s) {SWITCH_DOWN}"


def test_a_bridges_kind_comes_from_its_pcie_capability_where_readable(tmp_path: Path) -> None:
    """PCI_EXP_FLAGS_TYPE (pci_regs.h) in the PCIe capability (ID 0x10) found from the capability list at 0x34."""
    data = bytearray(config_space(0x1D))
    data[0x34] = 0x40  # the capability list starts at 0x40: power management, then PCI Express at 0x60
    data[0x40:0x42] = bytes([0x01, 0x60])
    data[0x60:0x64] = bytes([0x10, 0x00]) + (0x0042).to_bytes(2, "little")  # version 2, type 4: a root port
    config = tmp_path / "config"
    config.write_bytes(bytes(data))

    assert iommu_module._kind(config, "switch_downstream") == "root_port"
    config.write_bytes(bytes(data[:64]))  # not root: only the header is readable
    assert iommu_module._kind(config, "switch_downstream") == "switch_downstream"


def test_translation_off_and_an_unreadable_config_space(tmp_path: Path) -> None:
    none = {b: 0 for b in (ROOT_PORT, SWITCH_UP, SWITCH_DOWN, "0000:02:10.0")}
    translated = read_iommu(GPUS, sysfs(tmp_path / "a", none, group="DMA-FQ"), tmp_path / "no-cmdline")
    assert (translated.mode, translated.acs_redirect, translated.redirects_p2p) == ("translated", (), True)
    off = read_iommu(GPUS, sysfs(tmp_path / "b", none, group=None), tmp_path / "no-cmdline")
    assert (off.mode, off.redirects_p2p) == ("off", False)
    not_root = read_iommu(GPUS, sysfs(tmp_path / "c", {}, config_size=64), tmp_path / "no-cmdline")
    assert not_root.acs_unreadable == (ROOT_PORT, SWITCH_UP, SWITCH_DOWN, "0000:02:10.0")
    assert [b.kind for b in not_root.bridges] == ["root_port", "switch_upstream", "switch_downstream"] * 1 + [
        "switch_downstream"
    ]
    assert read_iommu((), tmp_path, tmp_path) == IommuFacts()


def test_a_capability_list_that_loops_ends(tmp_path: Path) -> None:
    data = bytearray(config_space(None))
    data[0x100:0x104] = (0x0001 | 1 << 16 | 0x100 << 20).to_bytes(4, "little")  # points at itself
    (tmp_path / "config").write_bytes(bytes(data))
    assert acs_control(tmp_path / "config") == 0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("on", "iommu is 'on', not an object"),
        ({"groups": 3}, "iommu: unknown field 'groups' (it has bridges, cmdline, mode)"),
        ({"mode": "strict"}, "iommu: mode is 'strict', not passthrough, translated or off"),
        (
            {"acs_redirect": "0000:00:01.0"},
            "iommu: acs_redirect is '0000:00:01.0', which is not a list of bridges' bus ids",
        ),
        (
            {"bridges": [{"bus_id": "0000:00:01.0", "kind": "hub"}]},
            "iommu: bridge 0: kind is 'hub', not one of "
            "root_port, switch_upstream, switch_downstream, pcie_to_pci_bridge, unknown",
        ),
        (
            {"bridges": [{"bus_id": "0000:00:01.0", "acs": -1}]},
            "iommu: bridge 0: acs is -1, not a 16-bit register value or null",
        ),
    ],
)
def test_a_topology_files_iommu_of_the_wrong_shape_is_named(data: object, message: str) -> None:
    with pytest.raises(IommuError) as caught:
        iommu_from_json(data)
    assert str(caught.value) == message


@pytest.mark.usefixtures("isolated_env")
def test_a_p2p_hang_on_a_box_whose_acs_redirects_names_the_likely_cause(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult], reports_dir: Path
) -> None:
    box = json.loads((TOPOLOGIES / "pcie-switch-8gpu.json").read_text())
    box["iommu"] = {
        "mode": "translated",
        "cmdline": ["intel_iommu=on"],
        "bridges": [
            {"bus_id": "0000:15:01.0", "kind": "root_port", "gpus": ["0000:18:00.0", "0000:28:00.0"], "acs": 0x1D},
            {"bus_id": "0000:16:02.0", "kind": "switch_downstream", "gpus": ["0000:18:00.0"], "acs": 0x1D},
        ],
    }
    topology = pytester.path / "acs-box.json"
    topology.write_text(json.dumps(box))
    files = copy_suites(pytester, "test_pairs.py", "test_machine_health.py")
    result = run_suite("--topology-file", str(topology), "--scenario", "driver-p2p-hang", "-k",
                       "pair_exchange or acs_redirect", "--step-timeout=4", "--op-timeout=3", "--init-timeout=3",
                       *files, timeout=240)  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    lines = answer_lines(result)
    assert lines[0].startswith(
        "host check host:p2p_path: ERROR: switch downstream port 0000:16:02.0 redirects P2P (ACS control 0x001d) for "
        "gpu0-gpu1 (PIX), gpu0-gpu2 (PXB), gpu0-gpu3 (PXB): their P2P goes through the root complex (slow, or a "
        "hang); boot with the IOMMU in passthrough (iommu=pt) or off"
    )
    assert lines[1].startswith("PIX pairs: HANG on inherited (pair_exchange 4/4); passes with NCCL_P2P_LEVEL=NVL")
    assert lines[2] == (
        "  LIKELY CAUSE: P2P THROUGH THE ROOT COMPLEX: the IOMMU translates the GPUs' DMA (intel_iommu=on); ACS "
        "redirects P2P on bridge(s) 0000:16:02.0 -> fix: boot with the IOMMU in passthrough (iommu=pt) or off, and "
        "disable ACS redirect on the bridges (kernel pci=disable_acs_redir=<bridges>, or `setpci -s <bridge> "
        "ECAP_ACS+0x6.w=0000` as root at each boot) (the NCCL setting only avoids P2P)"
    )
    (check,) = [r for r in read_records(reports_dir) if r["probe"] == "host:p2p_path"]
    assert check["metrics"]["acs_redirect"] == ["0000:15:01.0", "0000:16:02.0"]
    assert check["metrics"]["mode"] == "translated"
    assert check["metrics"]["not_judged"] == [
        "0000:15:01.0 redirects (ACS 0x001d), not judged: a root port: PIX and PXB pairs never cross it"
    ]
