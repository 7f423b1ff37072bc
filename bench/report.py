"""One table for every hot-path benchmark: a row per measured path, the bare baseline measured beside it
in the same run, the ratio, and whether the target of issue 10 is met.

Each benchmark script takes ``--json FILE`` and appends its rows there (a JSON list); ``python -m bench all``
runs the scripts one after another and prints every row in one table with :func:`table`.
"""

from __future__ import annotations

import json
import operator
from dataclasses import asdict, dataclass, field
from pathlib import Path

_COMPARE = {"<=": operator.le, ">=": operator.ge}


@dataclass
class Row:
    """One measured path. ``value`` is what the target judges (a p99 in ms, a ratio, a median ...)."""

    path: str  # what was measured, e.g. "hook starts -> phone shows question"
    config: str  # "embedded" or "pg+redis, 2 daphne"
    measured: str  # human figure, e.g. "p50 12.1 / p99 40.3 ms" or "312 MiB/s"
    baseline: str  # the bare baseline beside it, e.g. "echo p50 0.3 / p99 0.7 ms" or "direct 640 MiB/s"
    ratio: float | None  # measured / baseline where that means something, else None
    value: float  # the figure the target compares
    target: str  # e.g. "<= 60" (same unit as value)
    unit: str = ""  # unit of value and target, e.g. "ms p99", "x echo p99", "x direct"
    notes: list[str] = field(default_factory=list)
    # The same path without the product, measured in the same run and in the target's unit (for a time the least
    # it takes, for a rate the most it reaches), with what it is ("" and None where a row has none).
    floor: str = ""  # e.g. "the stack alone", "bare relay"
    floor_value: float | None = None

    @property
    def met(self) -> bool:
        return self._meets(self.value)

    @property
    def floor_met(self) -> bool | None:
        """Whether the floor itself meets the target (where it does not, the path without the product missed it
        too in that run)."""
        return None if self.floor_value is None else self._meets(self.floor_value)

    def _meets(self, value: float) -> bool:
        op, limit = self.target.split()
        return _COMPARE[op](value, float(limit))

    def shown(self, value: float) -> str:
        """``value`` to two decimals, or three where two would round it across the target (0.4994 is not 0.50)."""
        two = f"{value:.2f}"
        return two if self._meets(float(two)) == self._meets(value) else f"{value:.3f}"


def pct(values: list[float], q: float) -> float:
    """The q-quantile of values (nearest rank), as every benchmark reports its p50 and p99."""
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def p50_p99(values: list[float]) -> str:
    return f"p50 {pct(values, .5):.2f} / p99 {pct(values, .99):.2f} ms"


def append(path: str | Path | None, rows: list[Row]) -> None:
    """Add rows to the JSON list in ``path`` (created if missing); no-op without a path."""
    if not path:
        return
    target = Path(path)
    existing = json.loads(target.read_text()) if target.exists() and target.stat().st_size else []
    existing.extend(asdict(row) for row in rows)
    target.write_text(json.dumps(existing, indent=1))


def load(path: str | Path) -> list[Row]:
    target = Path(path)
    if not target.exists() or not target.stat().st_size:
        return []
    return [Row(**item) for item in json.loads(target.read_text())]


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table (README's Performance section quotes it as printed)."""
    head = ["path", "config", "measured", "baseline (same run)", "ratio", "target", "met", "floor (same run)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        ratio = "" if row.ratio is None else row.shown(row.ratio) if row.ratio == row.value else f"{row.ratio:.2f}"
        target = f"{row.target} {row.unit}".strip()
        floor = "" if row.floor_value is None else (
            f"{row.floor} {row.shown(row.floor_value)}: {'meets' if row.floor_met else 'misses'} the target")
        lines.append(f"| {row.path} | {row.config} | {row.measured} | {row.baseline} | {ratio} | {target} | "
                     f"{'yes' if row.met else 'NO'} | {floor} |")
    unmet = [row for row in rows if not row.met]
    misses, meets, none = (sum(row.floor_met is state for row in unmet) for state in (False, True, None))
    summary = (f"{len(rows) - len(unmet)} of {len(rows)} rows met; of the {len(unmet)} unmet, {misses} with a floor "
               f"that misses the target too, {meets} with a floor that meets it, {none} without a floor")
    notes = [f"- {row.path} ({row.config}): {note}" for row in rows for note in row.notes]
    return "\n".join(lines + ["", summary] + ([""] + notes if notes else []))
