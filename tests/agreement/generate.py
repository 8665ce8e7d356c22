#!/usr/bin/env python3
"""Write a deterministic random agreement sequence (format: README.md here).

The same seed gives the same bytes on every machine and Python version: the
generator uses its own splitmix64, not the `random` module. The mix covers
valid and invalid requests, several scopes (non-ASCII, at and over the length
limits), both policies, op-ids, expected versions, foreign authorities, u64
extremes, batches (small ones over six home slots, and wide ones of 16-64
items over 70 slots, so that hosts whose batches cross as check-packed are
compared on real sizes), random damage, and the crafted states of tests/vectors
(`replace` steps), which reach the decoder paths that damage alone cannot.
"""

import argparse
import json
import sys
from pathlib import Path

U64 = 2**64 - 1
SLOTS = 6  # home slots: single checks, small batches, most damage
WIDE = 64  # more slots (6..69) for wide batches, so a batch can hold 16-64 items
HOME = ["report/july", "ledger/ü", "a", "x" * 1024, "日本/報告", "emoji/🦀"]
WIDE_HOME = [f"{['wide', 'straße', '日本', 'a'][i % 4]}/{i}" for i in range(WIDE)]
OTHER = ["", "y" * 1025, "é" * 512, "é" * 513, "report/july ", "Report/July"]


class Rng:
    """splitmix64: tiny, fully specified, identical everywhere."""

    def __init__(self, seed: int) -> None:
        self.x = seed & U64

    def next(self) -> int:
        self.x = (self.x + 0x9E3779B97F4A7C15) & U64
        z = self.x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return self.next() % n

    def chance(self, percent: int) -> bool:
        return self.below(100) < percent

    def pick(self, items):
        return items[self.below(len(items))]


def crafted_states(vectors: Path) -> list[tuple[str, str]]:
    """Every `replace` hex in the vector files with the scope of the check
    that follows it (so that checks reach past scope-mismatch), sorted."""
    found = set()
    for path in sorted(vectors.glob("*.json")):
        steps = json.loads(path.read_text(encoding="utf-8")).get("steps", [])
        for i, step in enumerate(steps):
            if step.get("damage") == "replace" and step.get("hex") and step.get("state", "fence") == "fence":
                after = [s["check"]["scope"] for s in steps[i + 1 :] if "check" in s]
                if after:
                    found.add((step["hex"], after[0]))
    return sorted(found)


class Generator:
    def __init__(self, seed: int, crafted: list[str]) -> None:
        self.r = Rng(seed)
        self.crafted = crafted
        # Per slot: a guess of the highest token and version (no check is run
        # here, so these only steer the mix towards interesting requests).
        self.home = HOME + WIDE_HOME
        self.high = [[0, 1 + self.r.below(50)] for _ in self.home]
        self.version = [0] * len(self.home)
        self.damaged = [False] * len(self.home)
        self.scope = list(self.home)
        self.ops = [f"op-{i}" for i in range(6)]

    def token(self, slot: int) -> list[int]:
        r, (e, c) = self.r, self.high[slot]
        roll = r.below(100)
        if roll < 45:  # advance
            if r.chance(10):
                e, c = e + 1, r.below(5)
            else:
                c += 1 + r.below(2)
            self.high[slot] = [e, c]
            self.version[slot] += 1
        elif roll < 65:  # equal
            pass
        elif roll < 82:  # older
            c = max(0, c - 1 - r.below(5))
            if e and r.chance(20):
                e -= 1
        elif roll < 86:
            e, c = 0, 0
        elif roll < 90:
            e, c = r.pick([(U64, U64), (U64, 0), (0, U64), (U64 - 1, U64)])
        else:
            e, c = r.below(4), r.below(100)
        return [e, c]

    def check(self, slot: int) -> dict:
        r = self.r
        if r.chance(93):
            scope = self.scope[slot]
        else:
            scope = r.pick(HOME + OTHER)  # the same pool for wide slots: keeps the sequence of home-only runs
        c = {"scope": scope, "token": self.token(slot)}
        roll = r.below(100)
        if roll < 4:
            c["authority"] = 1
        elif roll < 6:
            c["authority"] = U64
        if r.chance(50):
            c["policy"] = "allow-equal"
        elif r.chance(20):
            c["policy"] = "strict"
        roll = r.below(100)
        if roll < 50:
            c["op_id"] = r.pick(self.ops)
        elif roll < 53:
            c["op_id"] = ""
        elif roll < 56:
            c["op_id"] = r.pick(["o" * 256, "o" * 257, "ö" * 128, "ö" * 129])
        roll = r.below(100)
        if roll < 20:
            c["expected_version"] = max(0, self.version[slot] + r.below(3) - 1)
        elif roll < 25:
            c["expected_version"] = r.pick([0, U64, r.next()])
        return c

    def damage(self, slot: int) -> dict:
        r = self.r
        kind = r.pick(["flip-bit", "flip-bit", "truncate", "append", "replace", "replace", "clear"])
        self.damaged[slot] = kind != "clear"
        d = {"slot": slot, "damage": kind}
        if kind == "flip-bit":
            d["bit"] = r.pick([r.below(2400), r.next()])
        elif kind == "truncate":
            d["len"] = r.below(90)
        elif kind == "append":
            d["hex"] = "".join(f"{r.below(256):02x}" for _ in range(1 + r.below(4)))
        elif kind == "replace":
            roll = r.below(100)
            if roll < 60 and self.crafted:
                d["hex"], self.scope[slot] = r.pick(self.crafted)
            elif roll < 75:
                d["hex"] = ""
            else:
                d["hex"] = "".join(f"{r.below(256):02x}" for _ in range(r.below(80)))
        return d

    def batch(self, slots: list[int], size: int) -> dict:
        chosen = [slots.pop(self.r.below(len(slots))) for _ in range(size)]
        return {"batch": [{"slot": s, "check": self.check(s)} for s in chosen]}

    def start_over(self, slot: int) -> dict:
        """Clear a damaged slot, so that damage does not swamp the mix."""
        self.damaged[slot] = False
        self.high[slot], self.version[slot] = [0, 1 + self.r.below(50)], 0
        self.scope[slot] = self.home[slot]
        return {"slot": slot, "damage": "clear"}

    def line(self) -> dict:
        r = self.r
        roll = r.below(100)
        if roll < 4:
            return self.damage(r.below(SLOTS))
        if roll < 6:  # wide slots: damage one, or start a damaged one over
            damaged = [s for s in range(SLOTS, SLOTS + WIDE) if self.damaged[s]]
            if damaged and r.chance(50):
                return self.start_over(r.pick(damaged))
            return self.damage(SLOTS + r.below(WIDE))
        if roll < 14:
            return self.batch(list(range(SLOTS)), 2 + r.below(3))
        if roll < 17:  # a wide batch: home and wide slots, 16-64 items
            return self.batch(list(range(SLOTS + WIDE)), 16 + r.below(49))
        slot = r.below(SLOTS)
        if self.damaged[slot] and r.chance(30):
            return self.start_over(slot)
        return {"slot": slot, "check": self.check(slot)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--lines", type=int, default=6000)
    parser.add_argument("--vectors", type=Path, default=Path(__file__).resolve().parent.parent / "vectors")
    args = parser.parse_args()
    g = Generator(args.seed, crafted_states(args.vectors))
    out = sys.stdout
    for _ in range(args.lines):
        out.write(json.dumps(g.line(), ensure_ascii=False, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
