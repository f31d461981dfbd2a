"""A GPU box is never tested as a CPU box: the PCI bus and the driver's traces against NVML (issue 26, item 1).

The host is a folder of this test's own (sysfs's ``vendor`` and ``class`` files, the driver's
version file, ``/dev/nvidia0``, the NVML library's file name); NVML is the real nvidia-ml-py over
``tests/fake_nvml.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import fake_nvml as nv
from conformance.discover import inventory
from conformance.discover.inventory import (
    HostPaths,
    Inventory,
    InventoryError,
    broken_gpu_machine,
    cuda_count_problem,
    inventory_from_json,
    read_inventory,
)
from conformance.discover.nvml_topology import sysfs_bus_id
from conformance.discover.topology import BrokenGpuMachine
from conformance.discover.topology_source import discover
from conftest import copy_suites, read_records
from test_scenario_answers import answer_lines

RunSuite = Callable[..., pytest.RunResult]
TOPOLOGIES = Path(__file__).resolve().parent.parent / "conformance" / "scenarios" / "topologies"

PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
OPEN_MODULE = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16)\n"
PCIE_BUS_IDS = tuple(sysfs_bus_id(gpu.bus_id) for gpu in nv.pcie_box().gpus)
# (bus id, vendor, class): two NVIDIA GPUs (3D and VGA controllers), NVIDIA's audio function, an Intel NIC
PCI = (("0000:18:00.0", "0x10de", "0x030200"), ("0000:18:00.1", "0x10de", "0x040300"),
       ("0000:3b:00.0", "0x10de", "0x030000"), ("0000:5e:00.0", "0x8086", "0x020000"))  # fmt: skip


def host(root: Path, pci: tuple[tuple[str, str, str], ...] = (), module: str | None = None,
         libraries: tuple[str, ...] = (), device_node: bool = False) -> HostPaths:  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    paths = HostPaths(root / "pci", root / "version", root / "nvidia0", (root / "lib",), root / "cmdline",
                      (root / "dockerenv",))  # fmt: skip
    for bus_id, vendor, pci_class in pci:
        (paths.pci_devices / bus_id).mkdir(parents=True)
        (paths.pci_devices / bus_id / "vendor").write_text(vendor + "\n")
        (paths.pci_devices / bus_id / "class").write_text(pci_class + "\n")
    if module is not None:
        paths.driver_version.write_text(module)
    (root / "lib").mkdir()
    for name in ("libnvidia-ml.so", "libnvidia-ml.so.1", *(f"libnvidia-ml.so.{v}" for v in libraries)):
        (root / "lib" / name).touch()
    if device_node:
        paths.device_node.touch()
    return paths


def gpu_box(root: Path, bus_ids: tuple[str, ...] = PCIE_BUS_IDS, **driver: object) -> HostPaths:
    return host(root, tuple((bus, "0x10de", "0x030200") for bus in bus_ids), **driver)  # type: ignore[arg-type]


def test_the_pci_bus_and_the_drivers_traces_are_read_without_nvml(tmp_path: Path) -> None:
    paths = host(tmp_path, PCI, PROPRIETARY, ("535.104.05",), device_node=True)
    assert read_inventory(paths) == Inventory(
        pci_gpus=("0000:18:00.0", "0000:3b:00.0"), kernel_module="535.104.05", nvml_libraries=("535.104.05",),
        device_node=True,
    )  # fmt: skip
    open_module = host(tmp_path / "open", module=OPEN_MODULE)
    assert read_inventory(open_module).kernel_module == "550.54.15"
    no = tmp_path / "no"
    nothing = read_inventory(HostPaths(no, no, no, (no,), no, (no,)))
    assert nothing == Inventory() and not nothing.nvidia_present


@pytest.mark.parametrize(
    ("init_error", "meaning", "fix"),
    [
        (18, "the driver was upgraded and the old kernel module is still loaded (kernel module 535.104.05, NVML "
             "library 550.54.15)", "reboot, or reload the module"),
        (nv.ERROR_DRIVER_NOT_LOADED, "the NVIDIA kernel module is not loaded (a failed install or upgrade, or "
                                     "Secure Boot refusing it)", "load it (modprobe nvidia)"),
        (nv.ERROR_NO_PERMISSION, "this user may not open /dev/nvidia*", "run as a user allowed to use the GPUs"),
    ],
)  # fmt: skip
def test_nvml_failing_on_a_gpu_box_stops_the_run_naming_the_error_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, init_error: int, meaning: str, fix: str
) -> None:
    nv.install(monkeypatch, replace(nv.pcie_box(), init_error=init_error))
    paths = gpu_box(tmp_path, module=PROPRIETARY, libraries=("550.54.15",), device_node=True)
    for backend in ("auto", "nccl"):
        with pytest.raises(BrokenGpuMachine) as caught:
            discover(backend, 2, environ={}, paths=paths)
        line = str(caught.value)
        assert line.startswith(
            "this machine has NVIDIA GPUs (8 on the PCI bus: 0000:1b:00.0, 0000:1c:00.0, 0000:3d:00.0, "
            "0000:3e:00.0 and 4 more; kernel module 535.104.05) but NVML gives none (NVML unavailable: "
        )
        assert f"): {meaning}; {fix}" in line and line.endswith("; or test the CPU on purpose with --backend gloo")
        assert "\n" not in line
    cpu = discover("gloo", 2, environ={}, paths=paths)  # asked for: CPU ranks, saying so
    assert cpu.kind == "cpu" and cpu.note == (
        "backend gloo chosen: the NVIDIA GPUs here are not tested (8 on the PCI bus, NVML failed)"
    )


def test_a_container_without_the_nvml_library_but_with_the_device_files_is_a_gpu_box(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nv.install_no_library(monkeypatch)
    paths = host(tmp_path, device_node=True)  # a container sees /dev/nvidia0, not the PCI bus's class files
    expected = (r"^this machine has NVIDIA GPUs \(/dev/nvidia0\) but NVML gives none \(NVML unavailable: NVML "
                r"Shared Library Not Found\): .*NVIDIA_DRIVER_CAPABILITIES")  # fmt: skip
    with pytest.raises(BrokenGpuMachine, match=expected):
        discover("auto", 2, environ={}, paths=paths)


def test_nvidia_ml_py_missing_on_a_gpu_box(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(BrokenGpuMachine, match=r"is not importable.*; pip install nvidia-ml-py; "):
        discover("auto", 2, environ={}, paths=gpu_box(tmp_path))


def test_nvml_listing_none_of_the_pci_bus_gpus_is_a_broken_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nv.install(monkeypatch, nv.FakeMachine(gpus=[], ancestors=[], p2p=[]))
    with pytest.raises(BrokenGpuMachine, match=r"but NVML gives none \(NVML reports no GPU\): .*RmInitAdapter"):
        discover("auto", 2, environ={}, paths=gpu_box(tmp_path))


def test_a_machine_without_nvidia_traces_is_a_cpu_box(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nv.install(monkeypatch, replace(nv.pcie_box(), init_error=nv.ERROR_DRIVER_NOT_LOADED))
    found = discover("auto", 2, environ={}, paths=host(tmp_path, PCI[3:]))  # an Intel NIC only
    assert (found.kind, found.note) == ("cpu", "no GPU: NVML unavailable: Driver Not Loaded")
    assert broken_gpu_machine(found.inventory) is None


def test_gpus_hidden_on_purpose_are_no_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nv.install(monkeypatch, nv.pcie_box())
    found = discover("auto", 2, environ={"CUDA_VISIBLE_DEVICES": ""}, paths=gpu_box(tmp_path))
    assert (found.kind, found.inventory.nvml_error) == ("cpu", None)
    assert found.inventory.counts_text() == "8 on the PCI bus, 8 in NVML"


def test_a_working_gpu_box_counts_its_gpus_both_ways(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nv.install(monkeypatch, nv.pcie_box())
    found = discover("auto", 2, environ={"CUDA_VISIBLE_DEVICES": "0,1"}, paths=gpu_box(tmp_path, PCIE_BUS_IDS[:7]))
    assert found.kind == "gpu" and found.inventory.nvml_gpus == PCIE_BUS_IDS
    assert found.inventory.not_in_nvml() == ()
    lost = replace(found.inventory, nvml_gpus=PCIE_BUS_IDS[:7], pci_gpus=PCIE_BUS_IDS)
    assert lost.not_in_nvml() == (PCIE_BUS_IDS[7],)


def test_the_default_host_is_the_real_one() -> None:
    assert inventory.DEFAULT_HOST == HostPaths()
    assert HostPaths().pci_devices == Path("/sys/bus/pci/devices")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1], "inventory is [1], not an object"),
        ({"gpus": 8}, "inventory: unknown field 'gpus' (it has container, device_node, kernel_module, "
                      "nvml_error, nvml_gpus, nvml_libraries, pci_gpus)"),
        ({"pci_gpus": "0000:18:00.0"}, "inventory: pci_gpus is '0000:18:00.0', which is not a list"),
        ({"nvml_gpus": [18]}, "inventory: nvml_gpus[0] is 18, which is not a text"),
        ({"device_node": "yes"}, "inventory: device_node is 'yes', which is not true or false"),
    ],
)  # fmt: skip
def test_a_topology_files_inventory_of_the_wrong_shape_names_the_field(data: object, message: str) -> None:
    with pytest.raises(InventoryError) as caught:
        inventory_from_json(data)
    assert str(caught.value) == message


# --------------------------------------------------------------------------------------------
# the gpu_inventory host check, in runs of the suite
# --------------------------------------------------------------------------------------------

EIGHT_GPUS = TOPOLOGIES / "pcie-2socket-8gpu.json"


def inventory_record(reports_dir: Path) -> dict[str, Any]:
    (record,) = [r for r in read_records(reports_dir) if r["probe"] == "host:gpu_inventory"]
    return record


@pytest.mark.usefixtures("isolated_env")
def test_the_inventory_check_passes_a_whole_machine_and_fails_one_with_fewer_gpus_than_expected(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    files = copy_suites(pytester, "test_environment.py")
    whole = run_suite("--topology-file", str(EIGHT_GPUS), "--expect-gpus", "8", "-k", "gpu_inventory", *files)
    assert whole.ret == 0, whole.stdout.str()
    whole.stdout.fnmatch_lines(["conformance: GPUs: 8 on the PCI bus, 8 in NVML, 8 tested, 8 expected"])
    record = inventory_record(reports_dir)
    assert (record["verdict"], record["metrics"]) == (
        "pass",
        {"pci_gpus": 8, "nvml_gpus": 8, "tested_gpus": 8, "container": False},
    )

    junit = pytester.path / "short.xml"
    short = run_suite("--topology-file", str(EIGHT_GPUS), "--expect-gpus", "9", f"--junitxml={junit}",
                      "-k", "gpu_inventory", *files)  # fmt: skip
    assert short.ret == pytest.ExitCode.TESTS_FAILED
    line = (
        "host check host:gpu_inventory: ERROR: the machine has 8 GPU(s) (8 on the PCI bus, 8 in NVML) where "
        "command-line option --expect-gpus expects 9"
    )
    assert answer_lines(short)[0] == line
    assert inventory_record(reports_dir)["verdict"] == "error"
    assert 'failures="1"' in junit.read_text() and "conformance.answer.1" in junit.read_text()


@pytest.mark.usefixtures("isolated_env")
def test_the_inventory_check_skips_on_a_machine_without_nvidia_gpus_unless_some_are_expected(
    pytester: pytest.Pytester, run_suite: RunSuite, reports_dir: Path
) -> None:
    files = copy_suites(pytester, "test_environment.py")
    result = run_suite("-k", "gpu_inventory", "-rs", *files)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*no NVIDIA GPU on this machine, and none expected (--expect-gpus)"])
    assert inventory_record(reports_dir)["verdict"] == "skip"
    expected = run_suite("-k", "gpu_inventory", *files, "--expect-gpus", "1")
    assert expected.ret == pytest.ExitCode.TESTS_FAILED
    assert "CPU ONLY" in answer_lines(expected)[0] and "the machine has 0 GPU(s)" in answer_lines(expected)[1]


def test_in_a_container_only_the_device_nodes_it_was_given_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Docker shows the host's /sys: 8 GPUs on the PCI bus, of which the container was given 2 (NVML lists 2)."""
    nv.install(monkeypatch, nv.pcie_box())
    paths = gpu_box(tmp_path, device_node=True)
    (tmp_path / "dockerenv").touch()
    given = discover("auto", 2, environ={}, paths=paths)
    assert given.inventory.container and given.inventory.not_in_nvml() == ()  # the host's GPUs are not lost
    assert given.inventory.counts_text() == "8 on the PCI bus (the host's: in a container), 8 in NVML"
    # a container given no GPU on a GPU host: no device node, so a CPU box, not a broken GPU one
    nv.install(monkeypatch, replace(nv.pcie_box(), init_error=nv.ERROR_DRIVER_NOT_LOADED))
    paths.device_node.unlink()
    assert discover("auto", 2, environ={}, paths=paths).kind == "cpu"
    # given a GPU (its device node) without the driver's utility libraries: a broken GPU box
    paths.device_node.touch()
    nv.install_no_library(monkeypatch)
    with pytest.raises(BrokenGpuMachine, match=r"^this machine has NVIDIA GPUs \(/dev/nvidia0 in this container\)"):
        discover("auto", 2, environ={}, paths=paths)
    assert read_inventory(host(tmp_path / "pod"), {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}).container


def test_a_gpu_handed_to_virtual_machines_is_not_the_hosts_to_lose(tmp_path: Path) -> None:
    paths = gpu_box(tmp_path, PCIE_BUS_IDS[:3])
    drivers = tmp_path / "drivers"
    for name in ("vfio-pci", "nvidia"):
        (drivers / name).mkdir(parents=True)
    (paths.pci_devices / PCIE_BUS_IDS[0] / "driver").symlink_to(drivers / "vfio-pci")
    (paths.pci_devices / PCIE_BUS_IDS[1] / "driver").symlink_to(drivers / "nvidia")
    assert read_inventory(paths).pci_gpus == PCIE_BUS_IDS[1:3]  # bound to nvidia, and bound to none (failed probe)


def test_cuda_seeing_fewer_gpus_in_a_rank_than_nvml_lists_is_named() -> None:
    assert cuda_count_problem(8, 8) is None and cuda_count_problem(None, 8) is None  # gloo ranks report none
    assert cuda_count_problem(7, 8) == (
        "CUDA sees 7 GPU(s) in a rank where NVML lists 8 for this run: a GPU CUDA cannot initialise (`dmesg | grep -i "
        "-e NVRM -e Xid`; nvidia-smi shows it, CUDA does not)"
    )
