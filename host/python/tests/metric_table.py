"""The metric table of docs/design.md §12, parsed, and the checks every
signals test holds an export to: each exported ``fencecheck_*`` series has
a name, a type and exactly the label names of a table row, and every label
value is one the row allows."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

DESIGN = Path(__file__).resolve().parents[3] / "docs" / "design.md"

_ROW = re.compile(r"^\| `(fencecheck_[a-z_]+)` \| ([a-z]+) \| (.*?) \| (.*?) \|$")
_LABEL = re.compile(r"`([a-z_]+)` \(([^()]*)\)")
_RANGE = re.compile(r"`(\d+)`\s*[–-]\s*`(\d+)`")


@dataclass(frozen=True)
class Label:
    values: frozenset[str]
    open: bool  # the table lists examples and an ellipsis ("…"): any value of the host's own set

    def allows(self, value: str) -> bool:
        return value in self.values or self.open


@dataclass(frozen=True)
class Row:
    name: str
    type: str
    labels: dict[str, Label]


def table() -> dict[str, Row]:
    """name → row, from the section's markdown table."""
    text = DESIGN.read_text("utf-8")
    section = text.split("## 12. Signals", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, Row] = {}
    for line in section.splitlines():
        m = _ROW.match(line.strip())
        if not m:
            continue
        name, kind, labels_cell = m.group(1), m.group(2), m.group(3)
        labels = {}
        for label, inner in _LABEL.findall(labels_cell):
            values = set(re.findall(r"`([^`]+)`", inner))
            for lo, hi in _RANGE.findall(inner):
                values.update(str(v) for v in range(int(lo), int(hi) + 1))
            labels[label] = Label(frozenset(values), "…" in inner)
        rows[name] = Row(name, kind, labels)
    assert len(rows) >= 8, f"only {sorted(rows)} parsed from {DESIGN} §12"
    return rows


@dataclass(frozen=True)
class Series:
    """One exported series: its name as scraped (``…_total`` for a counter),
    its type, its labels and its value."""

    name: str
    type: str
    labels: tuple[tuple[str, str], ...]
    value: float


def check(series: list[Series], rows: dict[str, Row], *, created_companions: bool = False) -> Counter:
    """Assert ``series`` (every ``fencecheck_*`` one an export holds) is the
    table's; return their values by name and labels. ``created_companions``:
    allow prometheus_client's ``<counter>_created`` gauge beside a table
    counter (its series' start time in the classic text format), with the
    counter's own labels."""
    counts: Counter = Counter()
    for s in series:
        labels = dict(s.labels)
        base = s.name.removesuffix("_created") + "_total"
        if created_companions and s.name.endswith("_created") and base in rows:
            row = rows[base]
            assert (s.type, row.type) == ("gauge", "counter"), s
        else:
            assert s.name in rows, f"{s.name} is not in docs/design.md §12 (it has {sorted(rows)})"
            row = rows[s.name]
            assert s.type == row.type, f"{s.name} is exported as a {s.type}, the table says {row.type}"
            counts[(s.name, s.labels)] += s.value
        assert set(labels) == set(row.labels), f"{s.name}: labels {sorted(labels)}, the table's {sorted(row.labels)}"
        for label, value in labels.items():
            assert row.labels[label].allows(value), (
                f"{s.name}: {label}={value!r} is not among the table's {sorted(row.labels[label].values)}"
            )
    return counts


def decisions(counts: Counter) -> dict[tuple[str, str, str], float]:
    """The ``fencecheck_decisions_total`` counts by (operation, outcome,
    epoch), zeros dropped."""
    out = {}
    for (name, labels), value in counts.items():
        if name == "fencecheck_decisions_total" and value:
            d = dict(labels)
            out[(d["operation"], d["outcome"], d["epoch"])] = value
    return out
