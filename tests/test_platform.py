"""What runs under the GPUs (conformance/discover/platform.py): a VM, WSL, the stack limit, libcuda."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.discover.iommu import IOMMU_FIX
from conformance.discover.platform import UNLIMITED, VM_FIX, WSL_NOTE, PlatformFacts, virtual_machine
from conftest import copy_suites

TOPOLOGIES = Path(__file__).resolve().parent.parent / "conformance" / "scenarios" / "topologies"
FLAGS = "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr"


def dmi(tmp_path: Path, **files: str) -> Path:
    folder = tmp_path / "dmi"
    folder.mkdir()
    for name, value in files.items():
        (folder / name).write_text(value + "\n")
    return folder


@pytest.mark.parametrize(
    ("flags", "files", "said"),
    [
        (FLAGS + " hypervisor lahf_lm", {}, "hypervisor CPU flag"),
        (FLAGS, {"product_name": "KVM", "sys_vendor": "Red Hat"}, "DMI product_name 'KVM'"),
        (FLAGS, {"product_name": "c5.xlarge", "sys_vendor": "Amazon EC2"}, "DMI sys_vendor 'Amazon EC2'"),
        (FLAGS, {"product_name": "Surface Laptop 4", "sys_vendor": "Microsoft Corporation"}, ""),  # systemd#21468
        (
            FLAGS,
            {"sys_vendor": "Microsoft Corporation", "product_version": "Hyper-V UEFI Release v4.1"},
            "DMI product_version 'Hyper-V UEFI Release v4.1'",
        ),
        (FLAGS, {"product_name": "PowerEdge XE9680", "sys_vendor": "Dell Inc."}, ""),  # bare metal
        (
            FLAGS + " hypervisor",
            {"product_name": "Google Compute Engine"},
            "hypervisor CPU flag; DMI product_name 'Google Compute Engine'",
        ),
    ],
)
def test_a_virtual_machine_is_known_by_its_cpu_flag_or_dmi_vendor(
    tmp_path: Path, flags: str, files: dict[str, str], said: str
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\n{flags}\n")
    assert virtual_machine(cpuinfo, dmi(tmp_path, **files)) == said
    assert virtual_machine(tmp_path / "none", tmp_path / "none") == ""  # nothing readable: nothing said


def test_the_p2p_fix_in_a_virtual_machine_is_the_hosts() -> None:
    assert PlatformFacts(virtual_machine="", wsl="").p2p_fix(IOMMU_FIX) == IOMMU_FIX
    assert PlatformFacts(virtual_machine="hypervisor CPU flag").p2p_fix(IOMMU_FIX) == VM_FIX
    assert PlatformFacts(wsl="5.15.153.1-microsoft-standard-WSL2").p2p_fix(IOMMU_FIX) == WSL_NOTE
    assert "iommu=pt" not in VM_FIX and "setpci" not in VM_FIX  # a guest cannot apply the bare-metal fix


def test_an_unlimited_stack_is_a_warning_that_says_what_it_means_for_this_nccl() -> None:
    unlimited = PlatformFacts(stack_kb=UNLIMITED)
    assert unlimited.stack_warning("2.21.5").startswith(
        "ulimit -s is unlimited, so glibc gives new threads only 2 MB of stack (pthread_create(3)): NCCL before 2.28 "
        "has crashed creating communicators with it -> `ulimit -s 8192`"
    )
    assert "NCCL 2.28.3 (nvidia-nccl-cu12) sets its threads' stack itself" in unlimited.stack_warning(
        "2.28.3 (nvidia-nccl-cu12)"
    )
    assert "NCCL before 2.28" in unlimited.stack_warning(None)  # unknown: the risk stands
    assert PlatformFacts(stack_kb=8192).stack_warning("2.21.5") == ""


@pytest.mark.usefixtures("isolated_env")
def test_the_header_names_a_virtual_machine_and_wsl(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult]
) -> None:
    files = copy_suites(pytester, "test_machine_health.py")
    vm = run_suite("--topology-file", str(TOPOLOGIES / "vm-slow-p2p-8gpu.json"), "-k", "what_runs_under", *files)
    vm.stdout.fnmatch_lines(["conformance: a virtual machine (hypervisor CPU flag; DMI product_name 'KVM'): ACS and "
                             "the IOMMU are the host's"])  # fmt: skip
    wsl = run_suite("--topology-file", str(TOPOLOGIES / "wsl-2gpu.json"), "-k", "what_runs_under", *files)
    wsl.stdout.fnmatch_lines(["conformance: WSL (kernel 5.15.153.1-microsoft-standard-WSL2): NCCL runs without P2P*"])
    bare = run_suite("--topology-file", str(TOPOLOGIES / "nvswitch-8gpu.json"), "-k", "what_runs_under", "-rs", *files)
    assert "virtual machine" not in bare.stdout.str()
    bare.stdout.fnmatch_lines(['*what runs under the GPUs was not read (a topology file without "platform")'])
