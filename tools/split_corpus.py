"""Set a third of the real-log corpus aside, at random, before any rule is written from it.

    python tools/split_corpus.py [--seed N] [--write]    the first split
    python tools/split_corpus.py --add [--write]         cases added since: drawn, the split kept

The cases of ``tests/data/diagnose/real/`` collected before the corpus's first split (the 19 that
``conformance diagnose`` was first built from, listed in ``DEVELOPED_BEFORE``) were read while
writing its rules, so they stay on the "developed on" side.  From the others, per class, as many
as make a third of the class's cases (rounded) are drawn at random with the seed, so every class
is judged on cases nobody looked at when the rules were written.  ``--write`` writes the draw to
``split.toml``, which the benchmark and the tests read; without it the draw is printed.

Cases added later (not in ``split.toml``'s ``drawn_from``) are drawn with ``--add`` before any rule
is written from them: per class, as many of the new ones are set aside as bring the class's share
set aside back to a third; the cases already split keep their side.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import defaultdict
from pathlib import Path

import tomllib

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "diagnose" / "real"
SPLIT = DATA / "split.toml"
SEED = 20261127  # the day the corpus was split
DEVELOPED_BEFORE = (
    "cdial-gpt-103-port-in-use", "ci-infra-490-devshm-full", "dfine-289-hardcoded-device",
    "glm130b-31-sigkill-host-ram", "lightning-10471-working-2gpu", "mleng-1-a6000-iommu-hang",
    "ms-swift-6301-rank11-cuda-oom", "ms-swift-9443-text-only-batch-mismatch", "nccl-1488-nvls-fm-restart",
    "nccl-1634-net-plugin-on-some-nodes", "nccl-328-shm-permission", "nccl-342-docker-shm",
    "nccl-444-invalid-device-function", "nccl-697-many-bridge-ifaces", "nccl-tests-276-nvls-fm-unknown-error",
    "pytorch-177472-nvls-fabricmanager", "speechbrain-2401-ckpt-broadcast-mismatch", "torchtitan-853-ci-shm-16mb",
    "xdit-147-heartbeat-stuck",
)  # fmt: skip


def cases() -> dict[str, str]:
    """Every case folder's name and its class."""
    return {
        folder.name: tomllib.loads((folder / "case.toml").read_text())["class"]
        for folder in sorted(DATA.iterdir())
        if (folder / "case.toml").is_file()
    }


def draw(seed: int, aside: set[str], known: set[str]) -> list[str]:
    """The cases set aside: per class, a third of its cases (rounded), drawn from those nobody has read.

    ``aside`` and ``known``: an earlier split's cases set aside and every case it was drawn from; only
    cases outside ``known`` (and never the first 19) are drawn now.
    """
    by_class: dict[str, list[str]] = defaultdict(list)
    for name, label in cases().items():
        by_class[label].append(name)
    rng = random.Random(seed)
    drawn = set(aside)
    for label in sorted(by_class):
        names = by_class[label]
        fresh = [name for name in names if name not in DEVELOPED_BEFORE and name not in known]
        wanted = round(len(names) / 3) - sum(name in aside for name in names)
        drawn |= set(rng.sample(fresh, max(0, min(len(fresh), wanted))))
    return sorted(drawn)


def split_text(seed: int, aside: list[str], drawn_from: list[str]) -> str:
    listed = "".join  # one name a line, for diffs that show what moved
    return (
        "# Written by tools/split_corpus.py before any rule was written from the cases it drew.\n"
        "# held_out: judged only; no rule may be written from them (docs/diagnose.md). drawn_from: every case\n"
        "# the draws were made from; a case not listed was added later (tools/split_corpus.py --add).\n"
        f"seed = {seed}\nheld_out = [\n" + listed(f'    "{name}",\n' for name in aside) + "]\n"
        "drawn_from = [\n" + listed(f'    "{name}",\n' for name in drawn_from) + "]\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--add", action="store_true", help="draw only the cases added since the split")
    parser.add_argument("--write", action="store_true", help=f"write the draw to {SPLIT.name}")
    args = parser.parse_args()
    every = sorted(cases())
    if args.add:
        earlier = tomllib.loads(SPLIT.read_text())
        known = set(earlier.get("drawn_from", every))
        seed = earlier["seed"] + len(known)  # another draw than the first, repeatable
        aside = draw(seed, set(earlier["held_out"]), known)
    else:
        aside = draw(args.seed, set(), set())
    text = split_text(args.seed, aside, every)
    if args.write:
        SPLIT.write_text(text)
    print(text, end="")
    print(f"# {len(aside)} of {len(cases())} cases set aside", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
