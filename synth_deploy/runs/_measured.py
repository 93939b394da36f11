"""What `rehearse` measured of an app's capacity, kept so that `deploy` can hold the app's
settings to it.

    record_capacity("math", report)             # after a capacity ramp of the app served here
    measured_capacity("math")                   # -> MeasuredCapacity, or None
    capacity_warnings(modal_settings, measured) # what the settings promise beyond it

The record lives in ``.synth-deploy/capacity.json`` under the working folder (beside
``.env``), one entry per app id; a record that cannot be read is ignored, never fatal.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MEASURED_CAPACITY_FILE = Path(".synth-deploy") / "capacity.json"
_MOST_ROLLOUTS = 1_000_000  # far beyond what one process holds: a larger count is not one


@dataclass(frozen=True)
class MeasuredCapacity:
    """One process's capacity for an app: ``sustained`` rollouts at once held (``limited``:
    the ramp found the limit, else it stopped at its last level first), ``knee`` the
    concurrency where throughput stopped growing."""

    app_id: str
    sustained: int
    knee: int
    rollouts_per_s: float
    limited: bool
    measured_at: str

    def describe(self) -> str:
        held = f"{self.sustained}" if self.limited else f"at least {self.sustained}"
        return f"one process held {held} rollouts at once (rehearse, {self.measured_at})"


def record_capacity(app_id: str, report: Any, path: Path = MEASURED_CAPACITY_FILE
                    ) -> MeasuredCapacity | None:
    """Keep ``report``'s (a `CapacityReport`) measurement for ``app_id``; None when it
    measured nothing."""
    knee = report.knee
    if knee is None or report.sustained < 1:
        return None
    measured = MeasuredCapacity(app_id, report.sustained, knee.concurrency,
                                round(knee.rollouts_per_s, 2), report.stopped_by is not None,
                                time.strftime("%Y-%m-%d %H:%M"))
    records = _read(path)
    records[app_id] = asdict(measured)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, indent=2) + "\n")
    return measured


def measured_capacity(app_id: str, path: Path = MEASURED_CAPACITY_FILE
                      ) -> MeasuredCapacity | None:
    """What was measured of ``app_id``; None when nothing was, or the record is not one
    `record_capacity` writes (another version's, a hand-edited one): as if never measured."""
    record = _read(path).get(app_id)
    try:
        measured = MeasuredCapacity(**record) if isinstance(record, dict) else None
    except TypeError:
        return None
    return measured if measured is not None and _plausible(measured) else None


def _plausible(m: MeasuredCapacity) -> bool:
    def count(value: Any) -> bool:
        return type(value) is int and 1 <= value <= _MOST_ROLLOUTS

    return (count(m.sustained) and count(m.knee) and m.knee <= m.sustained
            and type(m.rollouts_per_s) in (int, float) and 0 <= m.rollouts_per_s < math.inf
            and type(m.limited) is bool and isinstance(m.measured_at, str))


def capacity_warnings(settings: Any, measured: MeasuredCapacity | None) -> list[str]:
    """What ``settings`` (a `ModalSettings`) promise one container beyond ``measured``."""
    if measured is None or not measured.limited:
        return []
    found = []
    promised = {"concurrent_inputs": settings.concurrent_inputs,
                "max_rollouts": settings.max_rollouts}
    for name, value in promised.items():
        if value is not None and value > measured.sustained:
            found.append(f"ModalSettings.{name} = {value} promises more than "
                         f"{measured.describe()}: set it between {measured.knee} (where "
                         f"throughput stops growing) and {measured.sustained}, or rehearse "
                         "again")
    return found


def _read(path: Path) -> dict[str, Any]:
    try:
        records = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return records if isinstance(records, dict) else {}


__all__ = ["MEASURED_CAPACITY_FILE", "MeasuredCapacity", "capacity_warnings",
           "measured_capacity", "record_capacity"]
