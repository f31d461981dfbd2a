"""How fast the suite answers, measured side by side in one invocation on this machine.

    python benchmarks/speed.py [--old REV] [--before-health REV] [--growth 2,4,8,16]
                               [--skip-broken] [--suite-only] [--broken-only] [--scenarios[-only]]

Every figure is a real ``pytest suites/`` run with the default settings (no timeout options), in a
temporary reports folder, gloo ranks playing the GPUs of the simulated boxes.  Each figure is given
for this tree and for ``--old`` (a revision checked out into a temporary worktree, or a path;
default: the tree before the work on hangs confirmed from evidence), run one after the other so both
see the same load, with the ratio old/new:

* ``pytest suites/`` exactly as the README's quick start runs it, three times each, alternating:
  the median wall and the share of it before the first case starts (start-up, collection, the
  forkserver's ``import torch``);
* healthy 8-GPU boxes (``nvswitch-8gpu.json``, ``pcie-2socket-8gpu.json``), and the PCIe box three
  times paired against ``--before-health`` (the tree before the machine-health checks: 4912c35),
  with the CPU seconds each run used;
* ``-n 2`` against no xdist on the healthy NVSwitch box, with the CPU floor, the seconds outside any
  case and the busiest device's case seconds;
* growth: wall time for 2, 4, 8, 16 virtual devices and the exponent of a power-law fit (this tree's);
* the broken 8-GPU PCIe box (``scenarios/driver-p2p-hang.toml``): wall, hangs, how each hang was
  called (deadline paid, stuck in a small step, stuck where its class hung) with the case seconds
  each cost (run.json's ``end.spent``), false hangs and the recommended environment;
* with ``--scenarios`` (or ``--scenarios-only``): every shipped scenario, both trees, the wall, the
  hangs and whether the answer (less the stop reason a hang names) and the exit status are the same.

Ratios are what to compare on a shared machine; absolute seconds move with its load.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from conformance.record.records import HANG_ENDS, CaseRecord, time_spent
from conformance.record.runs import load_run

REPO = Path(__file__).resolve().parent.parent
TOPOLOGIES = Path("conformance") / "scenarios" / "topologies"  # each tree's own (a file's fields change)
SCENARIOS = Path("conformance") / "scenarios"
HEALTHY = ("nvswitch-8gpu.json", "pcie-2socket-8gpu.json")
BROKEN = REPO / "scenarios" / "driver-p2p-hang.toml"
HUNG_LINKS = {"PIX", "PXB"}  # the classes whose P2P hangs there
FIXED_ON = {"p2p_level_nvl", "p2p_off", "p2p_shm_off", "net_socket"}  # seed d: P2P over PCIe off
PAIR_PROBES = {"pair_exchange", "peer_copy"}
OLD = "0f4a199"  # the tree before hangs were confirmed from evidence (issue 43)
BEFORE_HEALTH = "4912c35"  # the last tree before the machine-health checks (2026-11-24)


@dataclass
class Timed:
    wall: float
    exit_code: int
    records: list[CaseRecord]
    output: str
    cpu: float  # CPU seconds of pytest and everything it started (ranks included)
    started: float = 0.0  # time.time() when pytest was started

    @property
    def cases(self) -> int:
        """Cases run: records less those whose collective ran in another test's case."""
        return len({r.case_dir for r in self.records})

    def _timed_cases(self) -> list[CaseRecord]:
        """One record per case that has a start and an end."""
        by_case = {r.case_dir: r for r in self.records if r.time and r.seconds is not None}
        return list(by_case.values())

    @property
    def outside_cases(self) -> float:
        """Wall seconds before the first case started and after the last one ended (start-up, collection, end)."""
        timed = self._timed_cases()
        if not timed:
            return self.wall
        span = max(r.time for r in timed) - min(r.time - (r.seconds or 0.0) for r in timed)
        return self.wall - span

    @property
    def before_first_case(self) -> float:
        """Wall seconds from pytest's start to the first case's start."""
        timed = self._timed_cases()
        if not timed:
            return self.wall
        return min((r.time or 0.0) - (r.seconds or 0.0) for r in timed) - self.started

    @property
    def busiest_device(self) -> float:
        """Case seconds on the busiest device: cases that share a device run in turn, so no overlap beats it."""
        busy: dict[str, float] = {}
        for r in self._timed_cases():
            for device in r.devices:
                busy[device] = busy.get(device, 0.0) + (r.seconds or 0.0)
        return max(busy.values(), default=0.0)


def run_suite(tree: Path, *options: str) -> Timed:
    """``pytest suites/`` of ``tree`` (its own package first on the path), timed."""
    with tempfile.TemporaryDirectory() as reports:
        command = [sys.executable, "-m", "pytest", "suites/", "-q", "-p", "no:cacheprovider",
                   f"--reports-dir={reports}", *options]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(tree)}
        cpu_before, begun, started = children_cpu(), time.monotonic(), time.time()
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
        wall, cpu = time.monotonic() - begun, children_cpu() - cpu_before
        latest = Path(reports) / "latest"
        records = list(load_run(latest).records) if latest.exists() else []
        if done.returncode not in (0, 1):
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        return Timed(wall, done.returncode, records, done.stdout, cpu, started)


def topology_of(tree: Path, name: str) -> str:
    return f"--topology-file={tree / TOPOLOGIES / name}"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def old_tree(old: str) -> Iterator[Path]:
    """The older tree: a path as given, or the revision checked out into a temporary worktree."""
    if Path(old).is_dir():
        yield Path(old)
        return
    with tempfile.TemporaryDirectory() as parent:
        path = Path(parent) / "old"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), old], cwd=REPO, check=True, capture_output=True
        )
        try:
            yield path
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, check=False)


def pair_share(records: Sequence[CaseRecord], wall: float) -> float:
    """The share of the wall during which at least one pair case was running."""
    spans = sorted(
        (r.time - r.seconds, r.time) for r in records if r.probe in PAIR_PROBES and r.time and r.seconds is not None
    )
    covered, reach = 0.0, -math.inf
    for start, end in spans:
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered / wall if wall else 0.0


def power_fit(points: Sequence[tuple[int, float]]) -> float:
    """The exponent k of wall ~ n^k, by least squares on the logarithms."""
    xs, ys = [math.log(n) for n, _ in points], [math.log(w) for _, w in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def quick_start(old: Path, runs: int = 3) -> None:
    print(f"## pytest suites/ as the quick start runs it (defaults, {runs} runs of each tree, alternating)")
    timed: dict[str, list[Timed]] = {"old": [], "new": []}
    for _ in range(runs):
        for name, tree in (("old", old), ("new", REPO)):
            run = run_suite(tree)
            timed[name].append(run)
            summary = run.output.strip().splitlines()[-1] if run.output.strip() else "(no output)"
            print(f"  {name} {run.wall:5.1f} s, exit {run.exit_code}, load {os.getloadavg()[0]:.1f}: {summary[:90]}")
    print(f"{'tree':5} {'median s':>9} {'before the first case s':>24} {'share':>6}")
    for name, runs_of in timed.items():
        wall, before = median([r.wall for r in runs_of]), median([r.before_first_case for r in runs_of])
        print(f"{name:5} {wall:9.1f} {before:24.1f} {before / wall:6.0%}")
    ratio = median([r.wall for r in timed["old"]]) / median([r.wall for r in timed["new"]])
    print(f"old/new (medians): {ratio:.2f}x")


def healthy(old: Path, before_health: Path, pairs: int = 3) -> Timed:
    print("\n## Healthy 8-GPU boxes, default settings: this tree against the old one (same invocation)")
    print(f"{'topology':28} {'old s':>8} {'new s':>8} {'old/new':>8}   cases old/new   CPU s old/new")
    plain = None
    for name in HEALTHY:
        before, after = run_suite(old, topology_of(old, name)), run_suite(REPO, topology_of(REPO, name))
        print(
            f"{name:28} {before.wall:8.1f} {after.wall:8.1f} {before.wall / after.wall:8.2f}x"
            f"   {before.cases:5d}/{after.cases:<5d}     {before.cpu:5.1f}/{after.cpu:.1f}"
        )
        plain = plain or after
    name = HEALTHY[1]
    print(f"\n{name} against the tree before the machine-health checks ({pairs} pairs, alternating)")
    print(f"{'pair':>4} {'before s':>9} {'new s':>8} {'before/new':>11} {'CPU s before/new':>17}")
    ratios = []
    for i in range(pairs):
        before, after = (
            run_suite(before_health, topology_of(before_health, name)),
            run_suite(REPO, topology_of(REPO, name)),
        )
        ratios.append(before.wall / after.wall)
        print(f"{i + 1:4d} {before.wall:9.1f} {after.wall:8.1f} {ratios[-1]:10.2f}x {before.cpu:8.1f}/{after.cpu:.1f}")
    print(f"median before/new: {median(ratios):.2f}x (1.00x: as fast as before the health checks)")
    assert plain is not None
    return plain


def xdist(plain: Timed, old: Path) -> None:
    print("\n## -n 2 on the healthy NVSwitch box (same invocation)")
    parallel = run_suite(REPO, topology_of(REPO, HEALTHY[0]), "-n", "2")
    old_plain = run_suite(old, topology_of(old, HEALTHY[0]))
    old_parallel = run_suite(old, topology_of(old, HEALTHY[0]), "-n", "2")
    cores = os.cpu_count() or 1
    print(
        f"{'tree':5} {'no xdist s':>10} {'-n 2 s':>8} {'ratio':>7} {'CPU s (-n 2)':>13} {'CPU floor s':>12}"
        f" {'outside cases s':>16} {'busiest device s':>17}"
    )
    for name, one, two in (("old", old_plain, old_parallel), ("new", plain, parallel)):
        outside = f"{one.outside_cases:.1f}/{two.outside_cases:.1f}"
        busiest = f"{one.busiest_device:.1f}/{two.busiest_device:.1f}"
        print(
            f"{name:5} {one.wall:10.1f} {two.wall:8.1f} {one.wall / two.wall:6.2f}x {two.cpu:13.1f}"
            f" {two.cpu / cores:12.1f} {outside:>16} {busiest:>17}"
        )
    print(f"-n 2, old/new: {old_parallel.wall / parallel.wall:.2f}x")
    print(f"CPU floor: the run's CPU seconds over this machine's {cores} cores, the least wall any overlap can reach")
    print("outside cases: start-up, collection and the end of the run; busiest device: the case seconds of the")
    print("device most in use (cases sharing a device run in turn); both no xdist / -n 2")


def growth(counts: Sequence[int], old: Path) -> None:
    print("\n## Growth with the device count (virtual CPU devices, default settings; same invocation)")
    print(f"{'devices':>8} {'old s':>7} {'new s':>7} {'old/new':>8} {'cases':>6} {'pairs running':>14}")
    points = []
    for n in counts:
        before, timed = run_suite(old, f"--virtual-devices={n}"), run_suite(REPO, f"--virtual-devices={n}")
        points.append((n, timed.wall))
        share = pair_share(timed.records, timed.wall)
        print(
            f"{n:8d} {before.wall:7.1f} {timed.wall:7.1f} {before.wall / timed.wall:7.2f}x"
            f" {timed.cases:6d} {share:13.0%}"
        )
    print(f"wall ~ n^{power_fit(points):.2f} over {counts[0]}..{counts[-1]} devices (this tree)")


def broken(old: Path) -> None:
    print("\n## Broken 8-GPU PCIe box (P2P through its PCIe switches hangs), default settings")
    runs = {"old": run_suite(old, f"--scenario={BROKEN}"), "new": run_suite(REPO, f"--scenario={BROKEN}")}
    for name, timed in runs.items():
        hangs = [r for r in timed.records if r.verdict == "hang"]
        false = [r.nodeid for r in hangs if r.link not in HUNG_LINKS or r.env_name in FIXED_ON]
        print(f"{name}: wall {timed.wall:.1f} s; cases {timed.cases}; hangs {len(hangs)}; false hangs {len(false)}")
        for nodeid in false:
            print(f"  false hang: {nodeid}")
        spent_by_outcome(timed.records)
    print(f"old/new: {runs['old'].wall / runs['new'].wall:.2f}x")
    lines = runs["new"].output.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if "conformance: the answer" in line), len(lines) - 5)
    end = next((i for i, line in enumerate(lines[start:], start) if line.startswith("=")), len(lines))
    print("the answer (new):")
    print("\n".join(f"  {line}" for line in lines[start:end]))


STOP_REASON = re.compile(r"\((?:stalled|small_step|confirm)\)")


def answer_of(output: str) -> list[str]:
    """The answer's lines, as the run printed them last, less the stop reason a hang names (how it was called)."""
    lines = output.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if "conformance: the answer" in line), len(lines))
    kept = [line for line in lines[start:] if not line.startswith(("=", "(written", "metrics for"))]
    return [STOP_REASON.sub("(stopped)", line) for line in kept]


def scenarios(old: Path) -> None:
    print("\n## Every shipped scenario, default settings: this tree against the old one (same invocation)")
    print(f"{'scenario':32} {'old s':>7} {'new s':>7} {'old/new':>8}  hangs old/new  same answer")
    for path in sorted((REPO / SCENARIOS).glob("*.toml")):
        if not (old / SCENARIOS / path.name).is_file():
            continue
        before = run_suite(old, f"--scenario={old / SCENARIOS / path.name}")
        after = run_suite(REPO, f"--scenario={REPO / SCENARIOS / path.name}")
        hangs = [sum(r.verdict == "hang" for r in t.records) for t in (before, after)]
        same = answer_of(before.output) == answer_of(after.output) and before.exit_code == after.exit_code
        print(
            f"{path.stem:32} {before.wall:7.1f} {after.wall:7.1f} {before.wall / after.wall:7.2f}x"
            f"  {hangs[0]:5d}/{hangs[1]:<5d}    {'yes' if same else 'NO'}"
        )


def spent_by_outcome(records: Sequence[CaseRecord]) -> None:
    """Case seconds by what ended each case (run.json's end.spent), and where each paid deadline stood."""
    for outcome, spent in time_spent(records).items():
        print(f"  {outcome:34} {spent['cases']:4.0f} cases {spent['seconds']:7.1f} case-seconds")
    for r in records:
        if r.verdict == "hang" and HANG_ENDS.get(r.stop_reason or "") == "hang: deadline paid":
            steps = sorted({rank.step or rank.phase for rank in r.ranks})
            print(f"  deadline paid: {r.nodeid.split('::')[-1]}, stopped in {', '.join(steps)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default=OLD, help=f"the tree to compare with: a revision or a path (default {OLD})")
    parser.add_argument(
        "--before-health", default=BEFORE_HEALTH, help=f"the tree before the health checks (default {BEFORE_HEALTH})"
    )
    parser.add_argument("--growth", default="2,4,8,16", help="virtual device counts (default 2,4,8,16)")
    parser.add_argument("--skip-broken", action="store_true", help="leave out the broken-box run")
    parser.add_argument("--suite-only", action="store_true", help="only the quick start's pytest suites/")
    parser.add_argument("--broken-only", action="store_true", help="only the broken-box run")
    parser.add_argument("--scenarios", action="store_true", help="also every shipped scenario, both trees")
    parser.add_argument("--scenarios-only", action="store_true", help="only every shipped scenario, both trees")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the start")
    with old_tree(args.old) as old:
        if args.scenarios_only:
            scenarios(old)
            return 0
        if not args.broken_only:
            quick_start(old)
        if not (args.suite_only or args.broken_only):
            with old_tree(args.before_health) as before_health:
                plain = healthy(old, before_health)
            xdist(plain, old)
            growth([int(n) for n in args.growth.split(",")], old)
        if args.broken_only or not (args.skip_broken or args.suite_only):
            broken(old)
        if args.scenarios:
            scenarios(old)
    print(f"\nload {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
