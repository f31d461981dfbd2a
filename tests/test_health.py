"""The GPUs' health facts: read through the real nvidia-ml-py over the fake NVML, judged by the rules (issue 26).

Each rule's source is beside it in ``conformance/discover/health.py``; here each is shown to fail
the machine it describes and to leave alone the machines that only look like it (an idle GPU's
lower PCIe generation, a PCIe card without its NVLink bridge, a GPU without a fabric).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

import fake_nvml as nv
from conformance.discover import health as rules
from conformance.discover.health import GpuHealth, HealthError, health_from_json
from conformance.discover.inventory import HostPaths
from conformance.discover.topology import Topology
from conformance.discover.topology_source import discover
from conformance.verdict.cuda_errors import nccl_too_old
from conftest import copy_suites, read_records
from fake_nvml import Failure, FakeMachine
from test_scenario_answers import answer_lines

TOPOLOGIES = Path(__file__).resolve().parent.parent / "conformance" / "scenarios" / "topologies"

HEALTHY_H100 = GpuHealth(
    pcie_width=16, pcie_max_width=16, pcie_gen=1, pcie_max_gen=5, nvlinks=(True,) * 18, nvlink_version=6,
    ecc_uncorrected=0,
    remap_pending=False, remap_failed=False, retired_pages_pending=None, fabric_state="completed",
    fabric_status="Success", persistence=True, compute_mode="default", slowdowns=(), processes=(), kernel_xids=(),
    kernel_xids_before_load=(),
)  # fmt: skip
QUIET_KERNEL_LOG = HostPaths(kmsg=Path("/dev/null"))  # a kernel log with no message


def read(monkeypatch: pytest.MonkeyPatch, machine: FakeMachine) -> Topology:
    nv.install(monkeypatch, machine)
    return discover("auto", 1, environ={}, paths=QUIET_KERNEL_LOG)


def with_gpu(machine: FakeMachine, index: int, **changes: object) -> FakeMachine:
    gpus = list(machine.gpus)
    gpus[index] = replace(gpus[index], **changes)  # type: ignore[arg-type]
    return replace(machine, gpus=gpus)


def test_nvml_facts_are_read_for_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    topology = read(monkeypatch, nv.nvswitch_box())
    assert set(topology.health) == {f"gpu{i}" for i in range(8)}
    assert topology.health["gpu0"] == HEALTHY_H100
    assert Topology.from_json(topology.to_json()).health == topology.health  # run.json keeps them


def test_a_fact_nvml_refuses_stays_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = replace(
        nv.pcie_box(),
        failures=[Failure("nvmlDeviceGetRemappedRows", nv.ERROR_NO_PERMISSION, gpu=1)],
        missing=["nvmlDeviceGetGpuFabricInfo"],  # an older driver's NVML lacks it: FunctionNotFound
    )
    health = read(monkeypatch, with_gpu(machine, 2, ecc_uncorrected=None, pcie=None)).health
    assert (health["gpu1"].remap_pending, health["gpu1"].remap_failed) == (None, None)
    assert health["gpu0"].remap_pending is False
    assert (health["gpu2"].ecc_uncorrected, health["gpu2"].pcie_width) == (None, None)
    assert all(h.fabric_state is None and h.nvlinks is None for h in health.values())


def test_the_constants_are_nvml_hs() -> None:
    assert rules.FABRIC_STATES == {
        pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: "not_supported", pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED:
        "not_started", pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in_progress",
        pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "completed",
    }  # fmt: skip
    assert rules.COMPUTE_MODES == {
        pynvml.NVML_COMPUTEMODE_DEFAULT: "default", pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "exclusive_thread",
        pynvml.NVML_COMPUTEMODE_PROHIBITED: "prohibited", pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS:
        "exclusive_process",
    }  # fmt: skip


def test_a_downtrained_pcie_link_fails_an_idle_generation_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    health = read(monkeypatch, with_gpu(nv.pcie_box(), 5, pcie=(8, 16, 1, 4))).health
    assert rules.pcie_problems(health) == {
        "gpu5": "PCIe link x8, the GPU and slot allow x16: a downtrained link (reseat the card or its riser, clean "
        "the contacts; `nvidia-smi -q -d PCIE`)"
    }
    assert rules.pcie_problems({"gpu0": replace(HEALTHY_H100, pcie_gen=1)}) == {}  # idle: Gen1 of Gen5


def test_nvlinks_are_judged_against_the_siblings(monkeypatch: pytest.MonkeyPatch) -> None:
    topology = read(monkeypatch, nv.bridged_box())  # the 2-3 bridge has link 3 down on both ends
    models = {d.name: d.model for d in topology.devices}
    problems = rules.nvlink_problems(topology.health, models)
    assert sorted(problems) == ["gpu2", "gpu3"]
    assert problems["gpu2"].startswith("11 of 12 NVLinks up where its siblings have 12 (link 3 down): reset")
    without_bridges = {f"gpu{i}": replace(HEALTHY_H100, nvlinks=(False,) * 12) for i in range(2)}
    assert rules.nvlink_problems(without_bridges, dict.fromkeys(without_bridges, "A100 PCIe")) == {}
    one_bridge = {f"gpu{i}": replace(HEALTHY_H100, nvlinks=(True,) * 4 + (False,) * 8) for i in range(2)}
    assert rules.nvlink_problems(one_bridge, dict.fromkeys(one_bridge, "A100 PCIe")) == {}
    alone = {"gpu0": replace(HEALTHY_H100, nvlinks=(True,) * 17 + (False,))}
    assert rules.nvlink_problems(alone, {"gpu0": "H100"}) == {}  # no sibling to judge it by


def test_memory_errors_name_the_reset_or_the_replacement(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = with_gpu(nv.nvswitch_box(), 1, ecc_uncorrected=2, remapped_rows=(0, 1, 1, 0))
    machine = with_gpu(machine, 3, remapped_rows=(0, 1, 1, 1))
    problems = rules.memory_problems(read(monkeypatch, machine).health)
    assert problems == {
        "gpu1": "2 uncorrectable ECC error(s) since the driver loaded (reset the GPU); row remapping pending (reset "
        "the GPU: `nvidia-smi -r`, or reboot) (`nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT`)",
        "gpu3": "a row remapping failed (the GPU needs replacing: RMA) (`nvidia-smi -q -d "
        "ECC,ROW_REMAPPER,PAGE_RETIREMENT`)",
    }
    old = {"gpu0": GpuHealth(retired_pages_pending=True)}
    assert rules.memory_problems(old)["gpu0"].startswith("page retirement pending (reboot or reset the GPU)")


def test_fabric_manager_not_running_fails_every_gpu_it_left(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = with_gpu(nv.nvswitch_box(), 0, fabric=(nv.FABRIC_NOT_STARTED, nv.SUCCESS))
    machine = with_gpu(machine, 1, fabric=(nv.FABRIC_COMPLETED, nv.ERROR_UNKNOWN))
    problems = rules.fabric_problems(read(monkeypatch, machine).health)
    assert sorted(problems) == ["gpu0", "gpu1"]
    assert problems["gpu0"].startswith("Fabric Manager state not_started, status Success: start nvidia-fabricmanager")
    assert problems["gpu1"].startswith("Fabric Manager state completed, status Unknown Error: start")
    assert rules.fabric_problems(read(monkeypatch, nv.pcie_box()).health) == {}  # no fabric: nothing to judge


def test_clocks_held_down_by_the_hardware_fail_an_idle_gpu_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = with_gpu(nv.nvswitch_box(), 6, clock_reasons=nv.CLOCKS_GPU_IDLE | nv.CLOCKS_HW_POWER_BRAKE | 0x4)
    health = read(monkeypatch, machine).health
    assert health["gpu0"].slowdowns == ()  # idle: how a healthy GPU waits
    assert rules.clock_problems(health) == {
        "gpu6": "clocks held down (hw_power_brake): check cooling, power and the power-brake signal (`nvidia-smi -q "
        "-d PERFORMANCE,TEMPERATURE,POWER`)"
    }
    assert pynvml.nvmlClocksEventReasonSwThermalSlowdown in rules.SLOWDOWN_REASONS
    assert (
        pynvml.nvmlClocksEventReasonSwPowerCap not in rules.SLOWDOWN_REASONS
    )  # a power cap is configured, not a fault


def test_other_users_processes_are_named_with_their_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = with_gpu(nv.nvswitch_box(), 3, processes=[(4242, 30000), (777, 512)])
    health = read(monkeypatch, machine).health
    assert health["gpu3"].processes == ((4242, 30000), (777, 512))
    owners = {4242: rules.ProcessOwner("alice", "python train.py"), 777: rules.ProcessOwner("me", "pytest", True)}
    assert rules.foreign_processes(health, owners.__getitem__, "me") == {"gpu3": "pid 4242 (alice) 30000 MiB"}
    assert rules.foreign_processes(health, lambda pid: rules.ProcessOwner(None), "me") == {
        "gpu3": "pid 4242 (another container or user) 30000 MiB, pid 777 (another container or user) 512 MiB"
    }


def test_this_users_leftover_process_is_named_by_its_command_the_run_s_own_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = with_gpu(nv.nvswitch_box(), 0, processes=[(4711, 143000), (815, 1024)])
    health = read(monkeypatch, machine).health
    owners = {4711: rules.ProcessOwner("me", "python3 hold.py"), 815: rules.ProcessOwner("me", "python3 -c rank", True)}
    assert rules.foreign_processes(health, owners.__getitem__, "me") == {
        "gpu0": "pid 4711 (python3 hold.py: this user's, not of this run) 143000 MiB"
    }


def test_a_prohibited_gpu_fails_exclusive_mode_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = with_gpu(nv.pcie_box(), 4, compute_mode=nv.COMPUTE_PROHIBITED)
    machine = with_gpu(machine, 5, compute_mode=nv.COMPUTE_EXCLUSIVE_PROCESS, persistence=nv.FEATURE_DISABLED)
    health = read(monkeypatch, machine).health
    assert list(rules.mode_problems(health)) == ["gpu4"]
    assert (health["gpu5"].compute_mode, health["gpu5"].persistence) == ("exclusive_process", False)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "health is [], not an object keyed by GPU name"),
        ({"gpu0": 5}, "health of gpu0 is 5, not an object"),
        ({"gpu0": {"ecc": 1}}, "health of gpu0: unknown field 'ecc' (it has compute_mode, ecc_uncorrected, *"),
        ({"gpu0": {"pcie_width": "x16"}}, "health of gpu0: pcie_width is 'x16', which is not *"),
        ({"gpu0": {"nvlinks": [1]}}, "health of gpu0: nvlinks[0] is 1, which is not true or false"),
    ],
)
def test_a_topology_files_health_of_the_wrong_shape_names_the_gpu_and_field(data: object, message: str) -> None:
    with pytest.raises(HealthError) as caught:
        health_from_json(data)
    text = str(caught.value)
    assert text == message or (message.endswith("*") and text.startswith(message[:-1])), text


@pytest.mark.usefixtures("isolated_env")
def test_the_health_checks_pass_a_healthy_simulated_box_and_skip_what_they_cannot_read(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult], reports_dir: Path
) -> None:
    files = copy_suites(pytester, "test_machine_health.py")
    healthy = run_suite("--topology-file", str(TOPOLOGIES / "nvswitch-8gpu.json"), "-rs", *files)
    # skipped: p2p_path, and rdma_ports (no RDMA port on this box)
    assert healthy.parseoutcomes() == {"passed": 10, "skipped": 3}, healthy.stdout.str()
    healthy.stdout.fnmatch_lines(['*: NCCL\'s version is not known: the simulated machine names no "nccl"'])
    records = {r["probe"]: r for r in read_records(reports_dir)}
    assert records["host:nvlink"]["metrics"]["gpu3"] == {"nvlinks": [True] * 18}
    assert records["host:fabric_manager"]["metrics"]["gpu0"] == {
        "fabric_state": "completed",
        "fabric_status": "Success",
    }

    pcie = run_suite("--topology-file", str(TOPOLOGIES / "pcie-2socket-8gpu.json"), "-rs", *files)
    assert pcie.parseoutcomes() == {"passed": 6, "skipped": 7}  # no NVLink, fabric, iommu, capability, platform, RDMA
    pcie.stdout.fnmatch_lines(["*: no NVLink: NVML reports none on these GPUs", "*: no NVSwitch fabric: NVML *"])

    bare = pytester.path / "bare.json"  # a topology file from before health facts: nothing to judge, said
    bare.write_text(json.dumps({k: v for k, v in json.loads((TOPOLOGIES / "pcie-2gpu.json").read_text()).items()
                                if k != "health"}))  # fmt: skip
    unknown = run_suite("--topology-file", str(bare), "-rs", *files)
    assert unknown.parseoutcomes() == {"skipped": 13}
    unknown.stdout.fnmatch_lines(["*no GPU's health says pcie_width, pcie_max_width, pcie_gen, pcie_max_gen*"])
    cpu = run_suite("-rs", *files)
    assert cpu.parseoutcomes() == {"skipped": 13}
    cpu.stdout.fnmatch_lines(["*GPU-only check: no GPU: *"])


@pytest.mark.usefixtures("isolated_env")
def test_another_users_process_on_a_gpu_is_a_warning_line_not_a_failure(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult]
) -> None:
    box = json.loads((TOPOLOGIES / "nvswitch-8gpu.json").read_text())
    box["health"]["gpu3"]["processes"] = [[999999999, 30000]]  # a pid this host cannot see: another container's
    topology = pytester.path / "busy.json"
    topology.write_text(json.dumps(box))
    files = copy_suites(pytester, "test_machine_health.py")
    result = run_suite("--topology-file", str(topology), "-k", "processes", *files)
    assert result.ret == 0
    assert answer_lines(result) == [
        "WARNING host check host:gpu_processes: gpu3: pid 999999999 (another container or user) 30000 MiB",
        "everything passed: 0 cases in 0 classes; nothing to set",
    ]


def test_the_first_nccl_release_for_each_gpu_generation() -> None:
    """NCCL's release history (verdict/cuda_errors.py): the GPU's generation, not its exact capability."""
    blackwell = nccl_too_old("2.21.5", "10.0")
    assert blackwell is not None and (blackwell.sm, blackwell.nccl) == (100, "2.25.1")
    assert nccl_too_old("2.21.5", "10.3") == blackwell  # B300: the sm_100 family
    assert nccl_too_old("2.25.1", "10.0") is None
    consumer = nccl_too_old("2.25.1 (nvidia-nccl-cu12)", "12.0")  # pip's spelling of the version
    assert consumer is not None and consumer.nccl == "2.26.2"
    assert nccl_too_old("2.26.2", "12.0") is None
    hopper = nccl_too_old("2.14.3", "9.0")
    assert hopper is not None and hopper.nccl == "2.15.1"
    assert nccl_too_old("2.14.3", "8.9") is None  # Ada runs Ampere's kernels
    assert nccl_too_old("2.3.7", "7.0") is None  # older than every generation in the table: not judged
    assert nccl_too_old("", "10.0") is None and nccl_too_old("2.21.5", "ten") is None  # unknown: never a fault
