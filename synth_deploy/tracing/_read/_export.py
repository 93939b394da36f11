"""Stored rollouts → SFT JSONL: one example per policy call (what makes one: `_sft`).

Failed rollouts are never exported; the filters select sessions by the rule every reader
shares (`SessionFilter`), ``min_reward`` keeping those whose reward is at least that value.

`export_sft` streams: a page of sessions at a time (keyset paging in creation order), with
one query for their messages, one for the tools their policy calls offered and one for
their LM calls, so memory stays flat from ten thousand sessions to millions and a remote
store costs a few round trips a page.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from synth_deploy.errors import UsageError
from synth_deploy.tracing._db._columns import cost_usd_sql
from synth_deploy.tracing._db._once import SHARED, rebuilt_steps
from synth_deploy.tracing._db._rows import JSON_CONTENT, read_json
from synth_deploy.tracing._db._select import SessionFilter, SessionSql, since_timestamp
from synth_deploy.tracing._ledger import ledger_from_calls
from synth_deploy.tracing._read._sft import (
    ROLES,
    TEXT_FOR_TOOLS,
    Rollout,
    Turn,
    chat_message,
    examples,
    flat_tools,
)
from synth_deploy.tracing._store import TraceStore

PAGE_SESSIONS = 500
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(..., ensure_ascii=False)
_ORPHAN_STEP = "(no timestep)"  # where `build_session` puts rows without a timestep
# Most messages have no metadata: one shared (never written) dict instead of one each, which
# also spares the garbage collector a container per message.
_NO_METADATA: dict[str, Any] = {}
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ExportResult:
    """What `export_sft` wrote: ``examples`` from ``sessions``; ``skipped_sessions`` passed
    the filters but made none; ``skipped_turns`` counts the policy calls that made none, by
    reason (`_sft.NO_REPLY`, `_sft.TEXT_FOR_TOOLS`)."""

    path: str
    examples: int
    sessions: int
    skipped_sessions: int
    seconds: float
    skipped_turns: dict[str, int] = field(default_factory=dict)

    @property
    def note(self) -> str | None:
        """What a user should know of what was left out: why nothing was exported, or how
        many turns answered a tool offer with text; None when there is nothing to say."""
        text = self.skipped_turns.get(TEXT_FOR_TOOLS, 0)
        left_out = (f"{text} turn(s) that answered the tools offered with text, calling none, "
                    "were left out") if text else ""
        if self.examples:
            return left_out or None
        matched = self.sessions + self.skipped_sessions
        if not matched:
            return ("no stored session passes the filters (failed rollouts are never "
                    "exported): see them with `synth-deploy traces ls`")
        return (f"{matched} session(s) pass the filters but hold no example: "
                + (left_out + "; the others" if left_out else "they")
                + " recorded no policy reply (their rollouts made no LM call through the "
                  "policy, or recorded no chat)")

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "skipped_turns": dict(self.skipped_turns),
                "note": self.note}


@contextlib.contextmanager
def replaced_whole(path: Path) -> Iterator[TextIO]:
    """A text file written beside ``path`` and renamed onto it once complete (and on disk):
    a failed export never leaves half a file. A file that cannot be written is a usage error
    naming it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("w", encoding="utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}",
                         hint="choose a writable --out") from exc
    finally:
        if tmp.exists():
            tmp.unlink()


def export_target(out: str | Path, *, limit: int | None, overwrite: bool,
                  where: SessionFilter | None, app: str | None, model: str | None,
                  min_reward: float | None, since: str | None,
                  reward_version: str | None = None) -> tuple[Path, SessionFilter]:
    """An export's checked target file and its filter (``where``, else the keyword filters):
    a limit below 1 or a file already there (unless ``overwrite``) is a usage error."""
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}")
    path = Path(out)
    if path.exists() and not overwrite:
        raise UsageError(f"{path} already exists; it was left as is",
                         hint="choose another --out or pass --force to replace it")
    if where is None:
        where = SessionFilter(app=app, model=model, min_reward=min_reward,
                              since=since_timestamp(since) if since else None,
                              reward_version=reward_version)
    return path, where


def export_sft(store: TraceStore, out: str | Path, *, min_reward: float | None = None,
               app: str | None = None, model: str | None = None, since: str | None = None,
               limit: int | None = None, overwrite: bool = False,
               where: SessionFilter | None = None, reward_version: str | None = None,
               progress: Progress | None = None) -> ExportResult:
    """Write SFT JSONL from the sessions that pass the filters; ``limit`` caps examples.

    ``reward_version``: the reward each example carries, and ``min_reward`` bounds, is the
    one that version (`traces rescore`) gave its session; only the sessions it scored.

    ``where`` (the viewer's filter) selects the sessions instead of the keyword filters.
    ``progress(done, total)`` is called after each page of sessions.

    The file is written beside its target and renamed into place, so a failed export never
    leaves half a file; an existing file is kept unless ``overwrite``.
    """
    started = time.perf_counter()
    path, where = export_target(out, limit=limit, overwrite=overwrite, where=where, app=app,
                                model=model, min_reward=min_reward, since=since,
                                reward_version=reward_version)
    # Failed rollouts are never exported.
    sql = SessionSql(store.database)
    selection = None if where.status == "error" else \
        sql.where(dataclasses.replace(where, status="ok"))[:2]
    total = _selected_count(store, selection) if progress is not None else 0
    written = sessions = skipped = 0
    skipped_turns: Counter[str] = Counter()
    with replaced_whole(path) as fh:
        for page in _pages(store, selection, sql.reward(where.reward_version),
                           where.reward_version):
            room = None if limit is None else limit - written
            page_written, page_sessions, page_skipped = _write_page(fh, page, room,
                                                                    skipped_turns)
            written += page_written
            sessions += page_sessions
            skipped += page_skipped
            if progress is not None:
                progress(sessions + skipped, total)
            if limit is not None and written >= limit:
                break
    return ExportResult(path=str(path), examples=written, sessions=sessions,
                        skipped_sessions=skipped, seconds=time.perf_counter() - started,
                        skipped_turns=dict(skipped_turns))


Page = list[tuple[Rollout, list[Turn]]]


def _selected_count(store: TraceStore, selection: tuple[str, list[Any]] | None) -> int:
    """How many sessions the export selects (the total its progress counts to)."""
    if selection is None:
        return 0
    return int(store.database.query(
        f"SELECT COUNT(*) AS n FROM session_traces s{selection[0]}", selection[1])[0]["n"])


def _write_page(fh: Any, page: Page, room: int | None, skipped_turns: Counter[str]
                ) -> tuple[int, int, int]:
    """A page's examples as JSONL lines, at most ``room`` of them; returns the examples
    written, the sessions that gave some and the sessions that gave none."""
    written = sessions = skipped = 0
    for rollout, turns in page:
        if room is not None and written >= room:
            break
        wrote = 0
        for example in examples(rollout, turns, skipped_turns):
            fh.write(_ENCODE(example) + "\n")
            wrote += 1
            written += 1
            if room is not None and written >= room:
                break
        sessions += bool(wrote)
        skipped += not wrote
    return written, sessions, skipped


def _pages(store: TraceStore, selection: tuple[str, list[Any]] | None, reward: str,
           reward_version: str | None) -> Iterator[Page]:
    """The selected sessions, a page at a time, each with its turns; ``reward``: the
    session's reward as SQL (the recorded one, or ``reward_version``'s)."""
    if selection is None:
        return
    clause, params = selection
    rows_of = store.database.rows
    after: list[Any] = []
    while True:
        keyset = "(s.created_at, s.rowid) > (?, ?)" if after else ""
        where = clause + (" AND " if clause and keyset else " WHERE " if keyset else "") + keyset
        # The metadata JSON is read once, in SQL, for the fields an example names.
        rows = rows_of(
            "SELECT s.rowid AS rid, s.session_id, s.created_at, CASE WHEN "
            "json_valid(s.metadata) THEN json_extract(s.metadata, '$.app_id', '$.run_id', "
            "'$.seed', '$.model', '$.duration_s') END AS fields, "
            f"{reward} AS reward FROM session_traces s{where} "
            f"ORDER BY s.created_at, s.rowid LIMIT {PAGE_SESSIONS}", params + after)
        if not rows:
            return
        yield _page(store.database, rows, cost_usd_sql(None, store.schema_version),
                    reward_version)
        after = [rows[-1][2], rows[-1][0]]  # created_at, rowid


def _page(db: Any, rows: list[tuple[Any, ...]], cost_sql: str,
          reward_version: str | None = None) -> Page:
    """``rows``: the page's sessions as (rowid, session id, created at, fields, reward)."""
    ids = [r[1] for r in rows]
    marks = ", ".join("?" * len(ids))
    steps = _page_steps(db.rows, ids, marks)
    tools = _page_tools(db.query, ids, marks)
    lm_calls: dict[str, list[tuple[Any, ...]]] = {sid: [] for sid in ids}
    for sid, *by_model in db.rows(
            "SELECT session_id, model_name, COUNT(*), SUM(input_tokens), SUM(output_tokens), "
            f"SUM(latency_ms), SUM({cost_sql}) FROM events WHERE session_id IN ({marks}) AND "
            "event_type = 'cais' GROUP BY session_id, model_name", ids):
        lm_calls[sid].append(by_model)
    return [_page_entry(sid, fields, reward, steps[sid], tools, lm_calls[sid], reward_version)
            for _, sid, _, fields, reward in rows]


def _page_steps(rows_of: Any, ids: list[str], marks: str
                ) -> dict[str, dict[Any, tuple[Any, ...]]]:
    """Each session's steps by timestep id, as (order, step id, turn, stored messages,
    [messages shared with the step before])."""
    steps: dict[str, dict[Any, tuple[Any, ...]]] = {sid: {} for sid in ids}
    # Every message type: a timestep's stored rows extend the conversation of the one before
    # (`_once`), which is rebuilt before the chat roles are picked out.
    for sid, step_key, step_id, step_index, turn, kind, content, meta in rows_of(
            "SELECT m.session_id, t.id, t.step_id, t.step_index, t.turn_number, "
            "m.message_type, m.content, m.metadata FROM messages m LEFT JOIN "
            f"session_timesteps t ON t.id = m.timestep_id WHERE m.session_id IN ({marks}) "
            "ORDER BY m.id", ids):
        content, metadata, shared = _stored_message(content, meta)
        step = steps[sid].get(step_key)
        if step is None:  # rows without a timestep: one step of their own, after the others
            order = (0, step_index, step_key) if step_key is not None else (1, 0, 0)
            step = steps[sid][step_key] = (
                order, step_id if step_key is not None else _ORPHAN_STEP, turn, [], [0])
        if not step[3] and isinstance(shared, int):
            step[4][0] = shared
        step[3].append((kind, content, metadata))
    return steps


def _stored_message(content: Any, meta: str | None) -> tuple[Any, dict[str, Any], Any]:
    """A message row's content and metadata as written, and how many messages its step
    shares with the one before (0 unless it says)."""
    metadata = _NO_METADATA if meta in ("{}", None) else read_json(meta, _NO_METADATA)
    if not isinstance(metadata, dict):  # not what the kit writes: read as none
        metadata = _NO_METADATA
    if metadata and metadata.pop(JSON_CONTENT, False):
        content = read_json(content)
    shared = metadata.pop(SHARED, 0) if metadata else 0
    return content, metadata, shared


def _page_tools(query: Any, ids: list[str], marks: str) -> dict[tuple[str, Any], Any]:
    """The tools each step's policy call offered, as JSON text by (session, timestep id)."""
    tools: dict[tuple[str, Any], Any] = {}
    # Only events whose call records mention tools are parsed, and by SQLite: the records
    # hold whole requests. The last record of the last event that offered tools wins.
    for e in query(
            "SELECT e.session_id, t.id AS step, json_extract(r.value, '$.request.tools') AS "
            "tools FROM events e LEFT JOIN session_timesteps t ON t.id = e.timestep_id, "
            "json_each(CASE WHEN json_valid(e.call_records) THEN e.call_records ELSE '[]' END)"
            f" r WHERE e.session_id IN ({marks}) AND e.call_records LIKE '%\"tools\"%' AND "
            "json_type(r.value, '$.request.tools') = 'array' ORDER BY e.id, r.key", ids):
        tools[e["session_id"], e["step"]] = e["tools"]
    return tools


def _page_entry(sid: str, fields: Any, reward: Any, found: dict[Any, tuple[Any, ...]],
                tools: dict[tuple[str, Any], Any], lm_calls: list[tuple[Any, ...]],
                reward_version: str | None) -> tuple[Rollout, list[Turn]]:
    """One session's rollout (its fields, reward and cost ledger) and its chat turns."""
    values = read_json(fields, None) if fields else None
    app_id, run_id, seed, model, wall_s = values if isinstance(values, list) \
        else (None,) * 5
    ordered = sorted(found.items(), key=lambda item: item[1][0]) if len(found) > 1 \
        else list(found.items())
    conversations = rebuilt_steps([(shared[0], kept)
                                   for _, (_, _, _, kept, shared) in ordered])
    return (Rollout(sid, app_id, run_id, seed, model, reward,
                    ledger_from_calls(lm_calls, wall_s=wall_s).to_dict(), reward_version),
            [Turn(step_id, turn, [chat_message(*m) for m in conversation if m[0] in ROLES],
                  _offered(tools, sid, key))
             for (key, (_, step_id, turn, _, _)), conversation
             in zip(ordered, conversations, strict=True)])


def _offered(tools: dict[tuple[str, Any], Any], session_id: str, step_key: Any
             ) -> list[Any] | None:
    """The tools a stored step's policy call offered (``tools``: JSON text by session and
    step), flat; None where it offered none."""
    if not tools or (text := tools.get((session_id, step_key))) is None:
        return None
    return flat_tools(json.loads(text))


__all__ = ["ExportResult", "export_sft", "export_target", "replaced_whole"]
