"""Which sessions match: a `SessionFilter` as SQL, the one rule every reader uses.

`traces ls`, `traces export` (SFT and OTLP), `export_sft`, the viewer's pages, summaries,
comparisons and export all select sessions through `SessionSql.where`, so a filter finds
the same sessions wherever it is given. The rules:

- each given field must equal the session's own value (all given fields together);
- ``model`` is the session's model: the one its policy was given (``metadata.model``, as
  `traces ls` shows it). A session whose LM calls used other models too (a judge, a
  verifier) is not found by those: it is found by its policy's model;
- ``app_digest`` is the code digest the session's app stated (`IDENTITY_PATHS`), or a
  prefix of it of at least 4 hex digits (as `traces ls` prints it);
- ``min_reward``/``max_reward`` bound the session's reward (its last outcome reward, else
  the reward its metrics reported); with ``reward_version`` (a label `traces rescore`
  wrote), the reward that version gave it instead, and only the sessions it scored;
  ``since`` is inclusive, ``until`` exclusive, both stored timestamp text
  (`since_timestamp` makes it).

Fields the store keeps as trusted columns filter on indexes (from schema version 8 one index
holds all but the run: a filter reads at most that index once); an error message lives in
the session's metadata JSON. A file opened read-only at an older schema (a synth-ai file)
derives what its columns lack from the metadata: slower, the same answers.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from synth_deploy.errors import UsageError
from synth_deploy.tracing._db import _schema as schema
from synth_deploy.tracing._db._columns import IDENTITY_PATHS
from synth_deploy.tracing._db._database import TraceDatabase
from synth_deploy.tracing._times import iso

_HEX_PREFIX = re.compile(r"[0-9a-fA-F]{4,16}")
# A reward version's label: what `traces rescore --as` takes. Safe to spell inside SQL.
VERSION_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
# A filter's (and a page's) field names → the store's session fields.
FIELDS = {"app": "app_id", "run": "run_id", "model": "model_name", "status": "status",
          "seed": "seed", "reward": "total_reward", "mode": "mode", "split": "split",
          "duration_s": "duration_s"}


@dataclass(frozen=True)
class SessionFilter:
    """Which sessions a listing, page, summary, comparison or export covers (see the module
    docstring for the rules; all given fields together).

    ``since`` and ``until`` are stored timestamp text (`since_timestamp` makes it):
    ``since`` inclusive, ``until`` exclusive. ``status`` is ``"ok"`` or ``"error"``.
    """

    app: str | None = None
    model: str | None = None
    run_id: str | None = None
    split: str | None = None
    mode: str | None = None
    status: str | None = None
    seed: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    since: str | None = None
    until: str | None = None
    app_digest: str | None = None
    reward_version: str | None = None  # None: the reward the rollout recorded

    def __post_init__(self) -> None:
        if self.status not in (None, "ok", "error"):
            raise UsageError(f"status must be 'ok' or 'error', got {self.status!r}")
        if self.app_digest is not None and not _HEX_PREFIX.fullmatch(self.app_digest):
            raise UsageError(f"app digest {self.app_digest[:40]!r} is not 4 to 16 hex digits",
                             hint="give the digest `traces ls --group identity` prints, or "
                                  "its first digits")
        if self.reward_version == "original":  # the recorded reward, by name
            object.__setattr__(self, "reward_version", None)
        if self.reward_version is not None and not VERSION_LABEL.fullmatch(self.reward_version):
            raise UsageError(f"reward version {self.reward_version[:40]!r} is not a version "
                             "label (letters, digits, '.', '_', '+', '-'; up to 64)",
                             hint="give a label `traces rescore` printed (`traces show "
                                  "SESSION` lists a session's), or leave it out for the "
                                  "recorded reward")
        if (self.min_reward is not None and self.max_reward is not None
                and self.min_reward > self.max_reward):
            raise UsageError(f"the reward range is empty: min {self.min_reward:g} > max "
                             f"{self.max_reward:g}", hint="swap the two bounds")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


class SessionSql:
    """The session fields of one database as SQL over ``session_traces s``, and filters."""

    def __init__(self, db: TraceDatabase) -> None:
        self.query, self.rows = db.query, db.rows
        self.expr = {name: db.fields[column] for name, column in FIELDS.items()}
        self.indexed = {name for name, column in FIELDS.items()
                        if self.expr[name] == f"s.{column}"} | {"created"}
        # A failed rollout's message, after who failed (its kind) when the session says.
        kind = schema.metadata_field("$.error.kind", "s")
        self.expr.update(error=f"COALESCE('[' || {kind} || '] ', '') || "
                               f"{schema.metadata_field('$.error.message', 's')}",
                         created="s.created_at",
                         **{name: schema.metadata_field(path, "s")
                            for name, path in IDENTITY_PATHS.items()})
        # Before their columns (version 7), mode and split are indexed as expressions.
        if db.schema_version >= schema.INDEXED_METADATA_VERSION:
            self.indexed |= set(schema.FILTERED_METADATA)
        # The reward as a filtered query reads it. SQLite would seek or walk the reward
        # index for a reward range or order and read each row it finds to test the rest of
        # the filter; as `+reward` no index serves it, and the glance index, which holds it
        # with every filter's column, is read instead.
        glance = db.schema_version >= schema.GLANCE_INDEX_VERSION
        self.filtered_reward = f"+{self.expr['reward']}" if glance else self.expr["reward"]
        self.has_reward_versions = db.schema_version >= schema.REWARD_VERSIONS_VERSION
        self._recorded_reward = self.expr["reward"]

    def reward(self, version: str | None) -> str:
        """The session's reward as SQL: the recorded one (``version`` None), or the one
        that version gave it (NULL where it gave none)."""
        if version is None:
            return self._recorded_reward
        if not self.has_reward_versions:
            raise UsageError(f"reward version {version!r}: this store holds no reward versions "
                             "(its schema predates them)",
                             hint="`synth-deploy traces rescore APP` writes them")
        if not VERSION_LABEL.fullmatch(version):  # spelled as a literal below: checked
            raise UsageError(f"reward version {version[:40]!r} is not a version label")
        return (f"(SELECT r.reward FROM {schema.REWARD_VERSIONS_TABLE} r WHERE "
                f"r.session_id = s.session_id AND r.version = '{version}')")

    def judged_by(self, version: str | None) -> SessionSql:
        """These fields with ``expr["reward"]`` the reward ``version`` gave (None: the
        recorded one), for the readers that show, sort and sum it; returns itself."""
        if version is not None:
            self.expr["reward"] = self.filtered_reward = self.reward(version)
        return self

    def where(self, f: SessionFilter, *, extra: list[str] | None = None,
              params: list[Any] | None = None) -> tuple[str, list[Any], bool]:
        """(`` WHERE ...``, parameters, whether every clause is on an indexed column)."""
        e = self.expr
        clauses, values = list(extra or []), list(params or [])
        on_json = False
        for name, value in (("app", f.app), ("model", f.model), ("run", f.run_id),
                            ("split", f.split), ("mode", f.mode), ("status", f.status),
                            ("seed", f.seed)):
            if value is not None and value != "":
                clauses.append(f"{e[name]} = ?")
                values.append(value)
                on_json |= name not in self.indexed
        if f.app_digest:  # a prefix: the digest's hex digits need no LIKE escaping
            clauses.append(f"{e['app_digest']} LIKE ?")
            values.append(f"{f.app_digest}%")
            on_json = True
        reward = self.filtered_reward
        if f.reward_version is not None:  # that version's sessions, by its reward
            reward = self.reward(f.reward_version)
            clauses.append(f"{reward} IS NOT NULL")
            on_json = True
        for op, value in ((">=", f.min_reward), ("<=", f.max_reward)):
            if value is not None:
                clauses.append(f"{reward} {op} ?")
                values.append(float(value))
                on_json |= "reward" not in self.indexed
        # synth-ai writes times as ISO text with a "T" (ours has a space), which sorts after
        # ours on the same day: such rows are compared with the bound in their spelling.
        if f.since:
            clauses.append("s.created_at >= ? AND (substr(s.created_at, 11, 1) != 'T' OR "
                           "s.created_at >= ?)")
            values += [f.since, f.since.replace(" ", "T", 1)]
        if f.until:
            clauses.append("s.created_at < ? AND (substr(s.created_at, 11, 1) = 'T' OR "
                           "s.created_at < ?)")
            values += [f.until.replace(" ", "T", 1), f.until]
        sql = " WHERE " + " AND ".join(clauses) if clauses else ""
        return sql, values, not on_json


def since_timestamp(text: str, *, now: float | None = None) -> str:
    """``--since`` → stored timestamp text: ``30m``/``24h``/``7d`` ago, or an ISO date/time."""
    value = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    if value[-1:].lower() in units and value[:-1].replace(".", "", 1).isdigit():
        seconds = float(value[:-1]) * units[value[-1].lower()]
        return iso((now if now is not None else time.time()) - seconds) or ""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"cannot read --since {text!r}",
                         hint="use 30m, 24h, 7d, 2025-01-31 or 2025-01-31T12:00") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return iso(parsed.timestamp()) or ""


__all__ = ["FIELDS", "VERSION_LABEL", "SessionFilter", "SessionSql", "since_timestamp"]
