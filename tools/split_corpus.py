"""Set a third of the real-log corpus aside, at random, before any rule is written from it.

    python tools/split_corpus.py [--seed N] [--write]

The cases of ``tests/data/diagnose/real/`` collected before the corpus's first split (the 19 that
``conformance diagnose`` was first built from, listed in ``DEVELOPED_BEFORE``) were read while
writing its rules, so they stay on the "developed on" side.  From the others, per class, as many
as make a third of the class's cases (rounded) are drawn at random with the seed, so every class
is judged on cases nobody looked at when the rules were written.  ``--write`` writes the draw to
``split.toml``, which the benchmark and the tests read; without it the draw is printed.
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


def draw(seed: int) -> list[str]:
    """The cases set aside: per class, a third of its cases (rounded), drawn from those not developed on."""
    by_class: dict[str, list[str]] = defaultdict(list)
    for name, label in cases().items():
        by_class[label].append(name)
    rng = random.Random(seed)
    aside: list[str] = []
    for label in sorted(by_class):
        names = by_class[label]
        fresh = [name for name in names if name not in DEVELOPED_BEFORE]
        aside += rng.sample(fresh, min(len(fresh), round(len(names) / 3)))
    return sorted(aside)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--write", action="store_true", help=f"write the draw to {SPLIT.name}")
    args = parser.parse_args()
    aside = draw(args.seed)
    text = (
        f"# Written by tools/split_corpus.py --seed {args.seed} before any rule was written from these cases.\n"
        "# held_out: judged only; no rule may be written from them (see docs/diagnose.md).\n"
        f"seed = {args.seed}\nheld_out = [\n" + "".join(f'    "{name}",\n' for name in aside) + "]\n"
    )
    if args.write:
        SPLIT.write_text(text)
    print(text, end="")
    print(f"# {len(aside)} of {len(cases())} cases set aside", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
