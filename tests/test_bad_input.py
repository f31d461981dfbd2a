"""Bad input is refused before any case starts, and nothing recorded earlier is touched.

Every run here is a real pytest subprocess with the conformance plugin over a test file that would
start real ranks.  A bad setting or scenario must give a usage error (exit code 4) whose message
names the bad value and where it came from (option, environment variable, ini key and file, or the
scenario file and rule), must start no rank (no run folder, no ``latest``, no ``results.jsonl``),
and must leave an earlier run's records byte for byte as they were.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import COLLECTIVE_TEST, scenario_text

OLD_RECORDS = b'{"run_id": "old-run", "verdict": "pass"}\n{"run_id": "old-run", "verdict": "hang"}\n'


@dataclass
class Existing:
    """The reports dir as an earlier run left it."""

    reports_dir: Path
    file: Path
    content: bytes

    def assert_untouched(self) -> None:
        assert self.file.read_bytes() == self.content
        names = sorted(p.name for p in self.reports_dir.iterdir())
        assert names == ["old-run"], f"the refused run left {names} in {self.reports_dir}"
        assert sorted(p.name for p in (self.reports_dir / "old-run").iterdir()) == ["results.jsonl"]
        found = sorted(self.reports_dir.rglob("results.jsonl"))
        assert found == [self.file]


pytestmark = pytest.mark.usefixtures("isolated_env")


@pytest.fixture
def existing(reports_dir: Path) -> Existing:
    old = reports_dir / "old-run" / "results.jsonl"
    old.parent.mkdir(parents=True)
    old.write_bytes(OLD_RECORDS)
    return Existing(reports_dir, old, OLD_RECORDS)


@pytest.fixture
def collective_file(pytester: pytest.Pytester) -> Path:
    return pytester.makepyfile(test_case=COLLECTIVE_TEST.format(probe="all_reduce"))


def assert_refused(result: pytest.RunResult, pattern: str, existing: Existing) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR == 4, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines([pattern])
    out = result.stdout.str()
    assert "collected" not in out and "passed" not in out and "failed" not in out, out
    existing.assert_untouched()


@dataclass
class Case:
    """One bad input.  ``pattern`` may use {here} (the run's folder) and {ini} (its ini file)."""

    args: tuple[str, ...] = ()
    pattern: str = ""
    env: dict[str, str] = field(default_factory=dict)
    ini: str | None = None
    scenario: str | None = None
    setup: Callable[[Path], None] | None = None


def make_regular_file(here: Path) -> None:
    (here / "plain-file").write_text("not a folder\n")


SCENARIO = "--scenario=scenario.toml"
SC = "ERROR: conformance: {here}/scenario.toml rule"

BAD_INPUTS = {
    # backend, from each source
    "backend-cli": Case(
        ("--backend=mpi",),
        "ERROR: conformance: command-line option --backend: unknown backend 'mpi'; choose one of auto, gloo, nccl",
    ),
    "backend-env": Case(
        env={"CONFORMANCE_BACKEND": "mpi"},
        pattern="ERROR: conformance: environment variable CONFORMANCE_BACKEND: unknown backend 'mpi'*",
    ),
    "backend-ini": Case(
        ini="conformance_backend = mpi",
        pattern="ERROR: conformance: ini key conformance_backend in {ini}: unknown backend 'mpi'*",
    ),
    "backend-nccl-without-gpu": Case(
        ("--backend=nccl",),
        "ERROR: conformance: command-line option --backend: the nccl backend needs GPUs, and none was found (*)",
    ),
    # timeouts
    "case-timeout-abc": Case(
        ("--case-timeout=abc",), "ERROR: conformance: command-line option --case-timeout: 'abc' is not a number"
    ),
    "op-timeout-zero": Case(
        ("--op-timeout=0",),
        "ERROR: conformance: command-line option --op-timeout: '0' must be a positive, finite number of seconds",
    ),
    "init-timeout-negative": Case(
        ("--init-timeout=-3",),
        "ERROR: conformance: command-line option --init-timeout: '-3' must be a positive, finite number of seconds",
    ),
    "grace-nan": Case(
        ("--grace=nan",),
        "ERROR: conformance: command-line option --grace: 'nan' must be a positive, finite number of seconds",
    ),
    "grace-inf-env": Case(
        env={"CONFORMANCE_GRACE": "inf"},
        pattern="ERROR: conformance: environment variable CONFORMANCE_GRACE: 'inf' must be a positive, finite*",
    ),
    "case-timeout-ini": Case(
        ini="conformance_case_timeout = soon",
        pattern="ERROR: conformance: ini key conformance_case_timeout in {ini}: 'soon' is not a number",
    ),
    # device counts
    "virtual-devices-zero": Case(
        ("--virtual-devices=0",),
        "ERROR: conformance: command-line option --virtual-devices: '0' must be a positive whole number",
    ),
    "virtual-devices-two": Case(
        ("--virtual-devices=two",),
        "ERROR: conformance: command-line option --virtual-devices: 'two' is not a whole number",
    ),
    "virtual-devices-too-many": Case(
        ("--virtual-devices=100000",),
        "ERROR: conformance: command-line option --virtual-devices: '100000' devices is more than the 32 one "
        "node's plan takes",
    ),
    "virtual-devices-env-fraction": Case(
        env={"CONFORMANCE_VIRTUAL_DEVICES": "2.5"},
        pattern="ERROR: conformance: environment variable CONFORMANCE_VIRTUAL_DEVICES: '2.5' is not a whole number",
    ),
    # deadline layers: in-rank timeouts must be shorter than the watchdog's
    "init-timeout-equals-step-timeout": Case(
        ("--init-timeout=30",),
        "ERROR: conformance: command-line option --init-timeout: init-timeout 30s must be shorter than "
        "step-timeout 30s (default), so the in-rank timeout fires before the watchdog",
    ),
    "init-timeout-above-step-timeout-ini": Case(
        ini="conformance_step_timeout = 10",
        pattern="ERROR: conformance: default: init-timeout 20s must be shorter than "
        "step-timeout 10s (ini key conformance_step_timeout in {ini})*",
    ),
    "op-timeout-above-case-timeout": Case(
        ("--case-timeout=10", "--init-timeout=5", "--op-timeout=20"),
        "ERROR: conformance: command-line option --op-timeout: op-timeout 20s must be shorter than "
        "case-timeout 10s (command-line option --case-timeout)*",
    ),
    "case-timeout-env-below-default-init": Case(
        env={"CONFORMANCE_CASE_TIMEOUT": "15"},
        pattern="ERROR: conformance: default: init-timeout 20s must be shorter than "
        "case-timeout 15s (environment variable CONFORMANCE_CASE_TIMEOUT)*",
    ),
    # scenario files
    "scenario-missing": Case(
        ("--scenario=missing.toml",),
        "ERROR: conformance: command-line option --scenario: scenario file '{here}/missing.toml' "
        "cannot be read: No such file or directory",
    ),
    "scenario-missing-env": Case(
        env={"CONFORMANCE_SCENARIO": "gone.toml"},
        pattern="ERROR: conformance: environment variable CONFORMANCE_SCENARIO: scenario file "
        "'{here}/gone.toml' cannot be read: No such file or directory",
    ),
    "scenario-missing-ini": Case(
        ini="conformance_scenario = nowhere.toml",
        pattern="ERROR: conformance: ini key conformance_scenario in {ini}: scenario file "
        "'{here}/nowhere.toml' cannot be read: No such file or directory",
    ),
    "scenario-not-toml": Case(
        (SCENARIO,),
        "ERROR: conformance: command-line option --scenario: scenario file '{here}/scenario.toml' is not valid TOML: *",
        scenario="effect = hang\nthis is not toml",
    ),
    "scenario-unknown-effect": Case(
        (SCENARIO,),
        SC + " 1: unknown effect 'explode'; choose one of hang, device_hang, crash, error, wrong_data, oom, slow",
        scenario=scenario_text('effect = "explode"'),
    ),
    "scenario-unknown-phase": Case(
        (SCENARIO,),
        SC + " 2: unknown phase 'lunch'; choose one of start, control, init, probe, verify, teardown",
        scenario=scenario_text('effect = "hang"', 'effect = "error"\nphase = "lunch"'),
    ),
    "scenario-unknown-field": Case(
        (SCENARIO,),
        SC + " 1: unknown field 'colour' (known fields: *)",
        scenario=scenario_text('effect = "hang"\ncolour = "red"'),
    ),
    "scenario-field-not-for-effect": Case(
        (SCENARIO,),
        SC + " 1: field 'signal' does not apply to effect 'hang'",
        scenario=scenario_text('effect = "hang"\nsignal = "SIGKILL"'),
    ),
    "scenario-unknown-signal": Case(
        (SCENARIO,),
        SC + " 1: unknown signal 'SIGFOO'",
        scenario=scenario_text('effect = "crash"\nsignal = "SIGFOO"'),
    ),
    "scenario-wrong-data-not-at-verify": Case(
        (SCENARIO,),
        SC + " 1: *wrong_data*'probe'*",  # names the effect and the phase it was given
        scenario=scenario_text('effect = "wrong_data"\nphase = "probe"'),
    ),
    # reports dir
    "reports-dir-under-regular-file": Case(
        ("--reports-dir=plain-file/reports",),
        "ERROR: conformance: command-line option --reports-dir: reports dir '{here}/plain-file/reports' "
        "cannot be written: Not a directory",
        setup=make_regular_file,
    ),
    "reports-dir-is-regular-file": Case(
        ("--reports-dir=plain-file",),
        "ERROR: conformance: command-line option --reports-dir: reports dir '{here}/plain-file' "
        "cannot be written: File exists",
        setup=make_regular_file,
    ),
    "backend-override-ini": Case(
        ("-o", "conformance_backend=mpi"),
        "ERROR: conformance: command-line option -o conformance_backend: unknown backend 'mpi'*",
    ),
    "reports-dir-empty": Case(
        ("--reports-dir=",),
        "ERROR: conformance: command-line option --reports-dir: an empty path is not allowed",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_refused_before_any_case(
    case: Case,
    pytester: pytest.Pytester,
    run_suite: Callable[..., pytest.RunResult],
    monkeypatch: pytest.MonkeyPatch,
    existing: Existing,
    collective_file: Path,
) -> None:
    here = pytester.path.resolve()
    ini = pytester.makeini(f"[pytest]\n{case.ini}\n").resolve() if case.ini else None
    if case.scenario is not None:
        (here / "scenario.toml").write_text(case.scenario)
    if case.setup is not None:
        case.setup(here)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    result = run_suite(*case.args, collective_file.name, timeout=60)
    assert_refused(result, case.pattern.format(here=here, ini=ini), existing)
    if case.setup is make_regular_file:
        assert (here / "plain-file").read_text() == "not a folder\n"


def test_good_input_runs_and_records(
    run_suite: Callable[..., pytest.RunResult], existing: Existing, collective_file: Path
) -> None:
    """The control for the checks above: the same file with good settings runs ranks and records."""
    result = run_suite("--virtual-devices=2", collective_file.name, timeout=90)
    result.assert_outcomes(passed=1)
    assert existing.file.read_bytes() == existing.content
    latest = existing.reports_dir / "latest"
    assert latest.is_symlink()
    records = (latest / "results.jsonl").read_text().splitlines()
    assert len(records) == 1
    assert '"verdict": "pass"' in records[0]
    assert sorted(p.name for p in existing.reports_dir.iterdir()) == sorted(
        ["old-run", "latest", str(latest.readlink())]
    )


HEADER = "conformance: run *, backend gloo, {n} devices: {names}"


def header(n: int) -> str:
    return HEADER.format(n=n, names=", ".join(f"cpu{i}" for i in range(n)))


def test_priority_command_line_over_env_over_ini_over_default(
    pytester: pytest.Pytester,
    run_suite: Callable[..., pytest.RunResult],
    monkeypatch: pytest.MonkeyPatch,
    collective_file: Path,
) -> None:
    def devices_line(*args: str) -> pytest.RunResult:
        result = run_suite("--collect-only", *args, collective_file.name, timeout=60)
        assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
        return result

    # default
    devices_line().stdout.fnmatch_lines([header(4)])
    # ini beats default
    pytester.makeini("[pytest]\nconformance_virtual_devices = 2\n")
    devices_line().stdout.fnmatch_lines([header(2)])
    # env beats ini
    monkeypatch.setenv("CONFORMANCE_VIRTUAL_DEVICES", "3")
    devices_line().stdout.fnmatch_lines([header(3)])
    # command line beats env
    result = devices_line("--virtual-devices=4")
    result.stdout.fnmatch_lines([header(4)])
    result.stdout.no_fnmatch_line("*backend gloo, 3 devices*")
    # and back down: drop the command line -> env, drop env -> ini
    devices_line().stdout.fnmatch_lines([header(3)])
    monkeypatch.delenv("CONFORMANCE_VIRTUAL_DEVICES")
    devices_line().stdout.fnmatch_lines([header(2)])


def test_priority_bad_lower_value_is_named_by_the_winner(
    pytester: pytest.Pytester,
    run_suite: Callable[..., pytest.RunResult],
    monkeypatch: pytest.MonkeyPatch,
    existing: Existing,
    collective_file: Path,
) -> None:
    """A bad value is reported with the source that actually won, not a lower one."""
    ini = pytester.makeini("[pytest]\nconformance_backend = gloo\n").resolve()
    monkeypatch.setenv("CONFORMANCE_BACKEND", "tcp")
    result = run_suite(collective_file.name, timeout=60)
    assert_refused(
        result, "ERROR: conformance: environment variable CONFORMANCE_BACKEND: unknown backend 'tcp'*", existing
    )
    result = run_suite("--backend=ucc", collective_file.name, timeout=60)
    assert_refused(result, "ERROR: conformance: command-line option --backend: unknown backend 'ucc'*", existing)
    monkeypatch.delenv("CONFORMANCE_BACKEND")
    pytester.makeini("[pytest]\nconformance_backend = smoke-signals\n")
    result = run_suite(collective_file.name, timeout=60)
    assert_refused(
        result, f"ERROR: conformance: ini key conformance_backend in {ini}: unknown backend 'smoke-signals'*", existing
    )


# --------------------------------------------------------------------------------------------
# a fake GPU machine (tests/fake_nvml.py under the real nvidia-ml-py): CUDA_VISIBLE_DEVICES, NVML
# --------------------------------------------------------------------------------------------

H100_MIG_UUID = "MIG-c0ffee00-1111-4222-8333-444455556666"


def on_fake_gpus(monkeypatch: pytest.MonkeyPatch, visible: str, lost_while_listing: int | None = None) -> list[str]:
    """The next run sees the 8-GPU NVSwitch box with MIG instances on GPU 3; returns the ``-p`` option to pass."""
    import os

    import fake_nvml as nv

    migs = [nv.FakeMig(f"{H100_MIG_UUID[:-1]}{slot}", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40448) for slot in "56"]
    machine = nv.with_mig(nv.nvswitch_box(), 3, migs)
    if lost_while_listing is not None:
        machine.failures.append(nv.Failure("nvmlDeviceGetUUID", nv.ERROR_GPU_IS_LOST, gpu=lost_while_listing))
    tests = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv(nv.MACHINE_VARIABLE, machine.to_json())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    return ["-p", "fake_nvml"]


GPU3_H100 = "GPU 3 (NVIDIA H100 80GB HBM3, GPU-a1b2c3d3-5e6f-7a8b-9c0d-1e2f3a4b5c63)"
H100_GPUS = "8 GPUs (NVIDIA H100 80GB HBM3): " + ", ".join(f"{i} GPU-a1b2c3d{i}-..." for i in range(8))


@pytest.mark.parametrize(
    ("visible", "reason"),
    [(f"0,{H100_MIG_UUID}",
      f"CUDA_VISIBLE_DEVICES='0,{H100_MIG_UUID}': entry '{H100_MIG_UUID}' is a MIG instance of {GPU3_H100}; "
      "this suite tests whole GPUs (NCCL has no P2P between MIG instances): list GPUs by index or GPU- UUID"),
     ("0,8", f"CUDA_VISIBLE_DEVICES='0,8': entry '8' matches no GPU; this machine has {H100_GPUS}")],
    ids=["mig-instance", "unknown-index"],
)  # fmt: skip
def test_bad_cuda_visible_devices_on_a_gpu_machine_is_refused(
    visible: str,
    reason: str,
    run_suite: Callable[..., pytest.RunResult],
    monkeypatch: pytest.MonkeyPatch,
    existing: Existing,
    collective_file: Path,
) -> None:
    """Not a green CPU run: exit status 4 and one line naming the entry and what the machine has."""
    plugins = on_fake_gpus(monkeypatch, visible)
    result = run_suite(*plugins, "--collect-only", collective_file.name, timeout=60)
    assert_refused(result, f"ERROR: conformance: *{reason}", existing)
    errors = [line for line in result.stderr.lines if line.strip()]
    assert len(errors) == 1 and errors[0].endswith(reason), result.stderr.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_nvml_that_cannot_list_its_gpus_is_refused(
    run_suite: Callable[..., pytest.RunResult],
    monkeypatch: pytest.MonkeyPatch,
    existing: Existing,
    collective_file: Path,
) -> None:
    plugins = on_fake_gpus(monkeypatch, "0,1", lost_while_listing=5)
    result = run_suite(*plugins, "--collect-only", collective_file.name, timeout=60)
    assert_refused(
        result,
        "ERROR: conformance: *NVML is loaded but listing the GPUs failed: GPU is lost (nvmlDeviceGetUUID of GPU 5); "
        "fix the driver, or run on CPU with --backend gloo",
        existing,
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_good_cuda_visible_devices_on_a_gpu_machine(
    run_suite: Callable[..., pytest.RunResult], monkeypatch: pytest.MonkeyPatch, collective_file: Path
) -> None:
    """The control for the two above: the same fake machine, whole GPUs listed, collects."""
    plugins = on_fake_gpus(monkeypatch, "GPU-a1b2c3d3, 6")
    result = run_suite(*plugins, "--collect-only", collective_file.name, timeout=60)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["conformance: run *, backend nccl, 2 devices: gpu0, gpu1 (NVIDIA H100 80GB HBM3)"])
