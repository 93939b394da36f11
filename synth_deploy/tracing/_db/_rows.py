"""Sessions ⇄ rows of the v3 tables.

Two ways to write a batch of sessions, both inserting parents before children:

- `insert_rows` (a local file): the writer holds the write lock, reads the next free ids
  once and gives every row its own id and its parents' ids. One statement a table, run
  with ``executemany``: the same SQL text every batch (the statement cache keeps it
  prepared) and no lookup per row.
- `insert_statements` (a remote libSQL server): multi-row INSERTs whose children look their
  parents up by natural key (``(session_id, step_id)``, ``event_uid``, ``message_uid``), so
  a batch is a fixed list of statements, run in a handful of round trips.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic_core import to_json

from synth_deploy.tracing import _tokens
from synth_deploy.tracing._db._columns import METADATA_PATHS, cost_usd
from synth_deploy.tracing._db._once import SHARED, CallChain, compact_steps, rebuilt_steps
from synth_deploy.tracing._db._schema import TOKENS_COLUMNS, TOKENS_TABLE
from synth_deploy.tracing._session import (
    Event,
    EventReward,
    Message,
    OutcomeReward,
    SessionTrace,
    Timestep,
    session_reward,
    usage_from_counts,
)
from synth_deploy.tracing._times import epoch, iso

Statement = tuple[str, tuple[Any, ...]]
_ROWS_PER_INSERT = 200
# In a message's metadata: its content was not text and is stored as JSON text.
JSON_CONTENT = "_content_json"

_TABLES = ("session_traces", "session_timesteps", "events", "messages", "outcome_rewards",
           "event_rewards", TOKENS_TABLE)
# The tables whose ids `insert_rows` assigns, in the order of its ``next_ids``.
ID_TABLES = ("session_timesteps", "events", "messages")
_STEP_ID = "(SELECT id FROM session_timesteps WHERE session_id = ? AND step_id = ?)"
_EVENT_ID = "(SELECT id FROM events WHERE event_uid = ?)"
_MESSAGE_ID = "(SELECT id FROM messages WHERE message_uid = ?)"

_SESSION_COLS = ("session_id", "created_at", "num_timesteps", "num_events", "num_messages",
                 "metadata", "experiment_id", "app_id", "run_id", "status", "model_name",
                 "seed", "total_reward", *METADATA_PATHS)
_STEP_COLS = ("session_id", "step_id", "step_index", "turn_number", "started_at",
              "completed_at", "num_events", "num_messages", "step_metadata")
_EVENT_COLS = ("session_id", "timestep_id", "event_uid", "event_type", "system_instance_id",
               "event_time", "message_time", "created_at", "model_name", "provider",
               "input_tokens", "output_tokens", "total_tokens", "cost_usd", "latency_ms",
               "call_records", "reward", "terminated", "truncated", "system_state_before",
               "system_state_after", "metadata", "event_metadata")
_MESSAGE_COLS = ("session_id", "timestep_id", "message_uid", "message_type", "content",
                 "timestamp", "event_time", "message_time", "metadata")
_OUTCOME_COLS = ("session_id", "total_reward", "achievements_count", "total_steps",
                 "created_at", "reward_metadata", "annotation")
_EVENT_REWARD_COLS = ("event_id", "session_id", "message_id", "turn_number", "reward_value",
                      "reward_type", '"key"', "annotation", "source", "created_at")


def _json(value: Any) -> str | None:
    # pydantic-core's encoder, much faster than the json module's on the writer's hot path.
    # What JSON has no type for is written as its str(), as json's default=str did; bytes as
    # URL-safe base64 (not always UTF-8).
    if value is None:
        return None
    if type(value) is dict and not value:  # most messages' and events' metadata
        return "{}"
    return to_json(value, fallback=str, bytes_mode="base64", inf_nan_mode="constants").decode()


def read_json(text: Any, default: Any = None) -> Any:
    """A stored JSON column's value; ``default`` where it is empty, or where it is not JSON
    (then the text itself when no default is given)."""
    if text is None or text == "":
        return default
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return default if default is not None else text


def _bool(value: bool | None) -> int | None:
    return None if value is None else int(bool(value))


def _json_value(value: Any) -> Any:
    # What SQLite's json_extract gives for the value once in the metadata text (the version
    # 3 triggers fill the columns of other writers' rows with it): objects and arrays as
    # JSON text, true as 1, an integer past 64 bits as a float.
    if value is None or isinstance(value, str | float):
        return value
    if isinstance(value, int):
        return int(value) if -2**63 <= value < 2**63 else float(value)
    if isinstance(value, dict | list):
        return _json(value)
    return _json_value(json.loads(_json(value)))  # a tuple, a datetime: as the text holds it


# The keys leading to each of `METADATA_PATHS` ("$.a.b": a, then b).
_METADATA_KEYS = tuple(tuple(path[2:].split(".")) for path in METADATA_PATHS.values())


def _metadata_value(metadata: dict[str, Any], keys: tuple[str, ...]) -> Any:
    value: Any = metadata
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return _json_value(value)


def _table_rows(sessions: list[SessionTrace], next_ids: tuple[int, int, int] | None
                ) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of ``sessions``, by table. With ``next_ids`` (of `ID_TABLES`) rows lead with
    their own id and children hold their parents' ids; without, children hold their parents'
    natural keys (in the places `insert_statements` looks them up)."""
    out: dict[str, list[tuple[Any, ...]]] = {t: [] for t in _TABLES}
    ids = None if next_ids is None else list(next_ids)  # the next free id, counted up
    for s in sessions:
        s.expand_exchanges()  # a served app's policy calls arrive as the bytes they were
        # Each message once: a timestep's rows are what its conversation adds (`_once`).
        stored = compact_steps([step.messages for step in s.timesteps], _message_key)
        out["session_traces"].append(_session_row(s, stored))
        event_ids, message_ids = _step_rows(out, s, stored, ids)
        for o in s.outcome_rewards:
            out["outcome_rewards"].append((
                s.session_id, o.total_reward, o.achievements_count, o.total_steps,
                iso(o.created_at), _json(o.reward_metadata), _json(o.annotation)))
        for r in s.event_rewards:
            out["event_rewards"].append(_event_reward_row(s.session_id, r, event_ids,
                                                          message_ids, ids is not None))
    return out


def _session_row(s: SessionTrace, stored: list[tuple[int, Sequence[Message]]]) -> tuple[Any, ...]:
    """The session's own row: its counts (messages as stored, once) and its indexed fields."""
    meta, seed = s.metadata, s.metadata.get("seed")
    num_events = sum(len(step.events) for step in s.timesteps)
    num_messages = sum(len(kept) for _, kept in stored)
    return (s.session_id, iso(s.created_at), len(s.timesteps), num_events, num_messages,
            _json(meta), s.experiment_id, meta.get("app_id"), meta.get("run_id"),
            meta.get("status"), _json_value(meta.get("model")),  # a client's, any JSON
            seed if isinstance(seed, int) and -2**63 <= seed < 2**63 else None,
            session_reward(s), *[_metadata_value(meta, keys) for keys in _METADATA_KEYS])


def _step_rows(out: dict[str, list[tuple[Any, ...]]], s: SessionTrace,
               stored: list[tuple[int, Sequence[Message]]], ids: list[int] | None
               ) -> tuple[dict[str, int], dict[str, int]]:
    """Each timestep's row, then its events' and messages' rows; returns the ids given to
    events and messages (by their uid), which the session's event rewards point to."""
    sid = s.session_id
    seen: set[str] = set()
    calls = CallChain()
    packed = iter(_tokens.pack_turns(s.turn_tokens))
    event_ids: dict[str, int] = {}
    message_ids: dict[str, int] = {}
    for step, (shared, kept) in zip(s.timesteps, stored, strict=True):
        step_id = step.step_id
        while step_id in seen:  # (session_id, step_id) is unique in the v3 schema
            step_id += "+"
        seen.add(step_id)
        row = (sid, step_id, step.step_index, step.turn_number, iso(step.timestamp),
               iso(step.completed_at), len(step.events), len(kept),
               _json(step.step_metadata))
        if ids is not None:
            parent: tuple[Any, ...] = (sid, ids[0])
            out["session_timesteps"].append((ids[0], *row))
            ids[0] += 1
        else:
            parent = (sid, sid, step_id)
            out["session_timesteps"].append(row)
        _event_rows(out, parent, step, calls, packed, ids, event_ids)
        _message_rows(out, parent, step, shared, kept, ids, message_ids)
    return event_ids, message_ids


def _event_rows(out: dict[str, list[tuple[Any, ...]]], parent: tuple[Any, ...], step: Timestep,
                calls: CallChain, packed: Any, ids: list[int] | None,
                event_ids: dict[str, int]) -> None:
    """A timestep's events' rows, and the token row of each event that has tokens."""
    for e in step.events:
        row = (*parent, e.id, e.event_type, e.system_instance_id, e.event_time,
               step.step_index, iso(e.event_time), e.model_name, e.provider,
               e.input_tokens, e.output_tokens, e.total_tokens, e.cost_usd,
               e.latency_ms, _json(calls.compact(e.id, e.call_records)), e.reward,
               _bool(e.terminated),
               _bool(e.truncated), _json(e.system_state_before),
               _json(e.system_state_after), _json(e.metadata), None)
        if e.tokens is not None:
            out[TOKENS_TABLE].append((e.id if ids is None else ids[1], *next(packed)))
        if ids is not None:
            event_ids[e.id] = ids[1]
            row = (ids[1], *row)
            ids[1] += 1
        out["events"].append(row)


def _message_rows(out: dict[str, list[tuple[Any, ...]]], parent: tuple[Any, ...],
                  step: Timestep, shared: int, kept: Sequence[Message], ids: list[int] | None,
                  message_ids: dict[str, int]) -> None:
    """The rows of the messages a timestep adds; the first says how many it shares."""
    for i, m in enumerate(kept):
        content, metadata = m.content, m.metadata
        if not isinstance(content, str) and content is not None:
            content, metadata = _json(content), {**metadata, JSON_CONTENT: True}
        if shared and not i:
            metadata = {**metadata, SHARED: shared}
        row = (*parent, m.id, m.message_type, content, iso(m.timestamp), m.timestamp,
               step.step_index, _json(metadata))
        if ids is not None:
            message_ids[m.id] = ids[2]
            row = (ids[2], *row)
            ids[2] += 1
        out["messages"].append(row)


def _event_reward_row(sid: str, r: EventReward, event_ids: dict[str, int],
                      message_ids: dict[str, int], explicit: bool) -> tuple[Any, ...]:
    """An event reward's row: with explicit ids, an id from this batch, else looked up
    (another session's event)."""
    rest = (sid, r.turn_number, r.reward_value, r.reward_type, r.key,
            _json(r.annotation), r.source, iso(r.created_at))
    if explicit:
        return (event_ids.get(r.event_id), r.event_id, rest[0],
                message_ids.get(r.message_id), r.message_id, *rest[1:])
    return (r.event_id, rest[0], r.message_id, *rest[1:])


def _insert_sql(table: str, columns: tuple[str, ...], values: str) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES {values}"


def _one_row(*parts: str) -> str:
    return "(" + ", ".join(parts) + ")"


def _looked_up(uid_column: str, table: str) -> str:
    return f"COALESCE(?, (SELECT id FROM {table} WHERE {uid_column} = ?))"


# One-row statements with explicit ids, for `insert_rows` (prepared once, run per row).
_ROW_SQL = {
    "session_traces": _insert_sql("session_traces", _SESSION_COLS,
                                  _one_row(*"?" * len(_SESSION_COLS))),
    "session_timesteps": _insert_sql("session_timesteps", ("id", *_STEP_COLS),
                                     _one_row(*"?" * (len(_STEP_COLS) + 1))),
    "events": _insert_sql("events", ("id", *_EVENT_COLS), _one_row(*"?" * (len(_EVENT_COLS) + 1))),
    "messages": _insert_sql("messages", ("id", *_MESSAGE_COLS),
                            _one_row(*"?" * (len(_MESSAGE_COLS) + 1))),
    "outcome_rewards": _insert_sql("outcome_rewards", _OUTCOME_COLS,
                                   _one_row(*"?" * len(_OUTCOME_COLS))),
    "event_rewards": _insert_sql("event_rewards", _EVENT_REWARD_COLS, _one_row(
        _looked_up("event_uid", "events"), "?", _looked_up("message_uid", "messages"),
        *"?" * (len(_EVENT_REWARD_COLS) - 3))),
    TOKENS_TABLE: _insert_sql(TOKENS_TABLE, TOKENS_COLUMNS, _one_row(*"?" * len(TOKENS_COLUMNS))),
}
# Placeholders of one row for `insert_statements`, children looking their parents up.
_LOOKUP_MARKS = {
    "session_traces": _one_row(*"?" * len(_SESSION_COLS)),
    "session_timesteps": _one_row(*"?" * len(_STEP_COLS)),
    "events": _one_row("?", _STEP_ID, *"?" * (len(_EVENT_COLS) - 2)),
    "messages": _one_row("?", _STEP_ID, *"?" * (len(_MESSAGE_COLS) - 2)),
    "outcome_rewards": _one_row(*"?" * len(_OUTCOME_COLS)),
    "event_rewards": _one_row(_EVENT_ID, "?", _MESSAGE_ID, *"?" * (len(_EVENT_REWARD_COLS) - 3)),
    TOKENS_TABLE: _one_row(_EVENT_ID, *"?" * (len(TOKENS_COLUMNS) - 1)),
}
_COLUMNS = dict(zip(_TABLES, (_SESSION_COLS, _STEP_COLS, _EVENT_COLS, _MESSAGE_COLS,
                               _OUTCOME_COLS, _EVENT_REWARD_COLS, TOKENS_COLUMNS), strict=True))


def insert_rows(sessions: list[SessionTrace], next_ids: tuple[int, int, int]
                ) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """``(sql, rows)`` per table for ``executemany``; ``next_ids``: the first free id of each
    of `ID_TABLES`, read inside the transaction that runs these."""
    rows = _table_rows(sessions, next_ids)
    return [(_ROW_SQL[table], rows[table]) for table in _TABLES if rows[table]]


def insert_statements(sessions: list[SessionTrace]) -> list[Statement]:
    """Every row of ``sessions`` as multi-row INSERT statements, parents before children."""
    statements: list[Statement] = []
    for table, rows in _table_rows(sessions, None).items():
        marks = _LOOKUP_MARKS[table]
        for start in range(0, len(rows), _ROWS_PER_INSERT):
            chunk = rows[start:start + _ROWS_PER_INSERT]
            sql = _insert_sql(table, _COLUMNS[table], ", ".join([marks] * len(chunk)))
            statements.append((sql, tuple(v for row in chunk for v in row)))
    return statements


def build_session(row: dict[str, Any], steps: list[dict[str, Any]],
                  events: list[dict[str, Any]], messages: list[dict[str, Any]],
                  outcomes: list[dict[str, Any]], rewards: list[dict[str, Any]],
                  tokens: list[dict[str, Any]] | None = None) -> SessionTrace:
    """A `SessionTrace` from its rows (dicts keyed by column name)."""
    turns = turn_tokens(tokens or [])
    by_step: dict[Any, Timestep] = {}
    timesteps = []
    for st in sorted(steps, key=lambda r: (r["step_index"], r["id"])):
        step = Timestep(step_id=st["step_id"], step_index=st["step_index"],
                        turn_number=st["turn_number"], timestamp=epoch(st["started_at"]) or 0.0,
                        completed_at=epoch(st["completed_at"]),
                        step_metadata=read_json(st["step_metadata"], {}))
        by_step[st["id"]] = step
        timesteps.append(step)
    orphan: Timestep | None = None
    event_uid: dict[Any, str] = {}
    calls = CallChain()
    for ev in sorted(events, key=lambda r: r["id"]):
        uid = ev.get("event_uid") or str(ev["id"])
        event_uid[ev["id"]] = uid
        event = _built_event(ev, uid, calls.rebuild(uid, read_json(ev["call_records"])), turns)
        orphan = _step_for(ev["timestep_id"], by_step, timesteps, orphan)
        (by_step.get(ev["timestep_id"]) or orphan).events.append(event)
    message_uid = _place_messages(messages, by_step, timesteps, orphan)
    return SessionTrace(
        session_id=row["session_id"], created_at=epoch(row["created_at"]) or 0.0,
        timesteps=timesteps, metadata=read_json(row["metadata"], {}),
        experiment_id=row["experiment_id"],
        outcome_rewards=[_built_outcome(o) for o in sorted(outcomes, key=lambda r: r["id"])],
        event_rewards=[_built_event_reward(r, event_uid, message_uid)
                       for r in sorted(rewards, key=lambda r: r["id"])])


def _place_messages(messages: list[dict[str, Any]], by_step: dict[Any, Timestep],
                    timesteps: list[Timestep], orphan: Timestep | None) -> dict[Any, str]:
    """Each message into its timestep, each timestep's shared ones put back; returns the
    message uids by row id."""
    message_uid: dict[Any, str] = {}
    shares: dict[int, int] = {}  # id(timestep): the messages it shares with the one before
    for ms in sorted(messages, key=lambda r: r["id"]):
        uid = ms.get("message_uid") or str(ms["id"])
        message_uid[ms["id"]] = uid
        message, shared = _built_message(ms, uid)
        orphan = _step_for(ms["timestep_id"], by_step, timesteps, orphan)
        step = by_step.get(ms["timestep_id"]) or orphan
        if isinstance(shared, int) and not step.messages:
            shares[id(step)] = shared
        step.messages.append(message)
    if shares:
        for step, conversation in zip(timesteps, rebuilt_steps(
                [(shares.get(id(step), 0), step.messages) for step in timesteps]), strict=True):
            step.messages = conversation
    return message_uid


def _built_event(ev: dict[str, Any], uid: str, call_records: Any,
                 turns: dict[Any, _tokens.TurnTokens]) -> Event:
    """An `Event` from its row, its call records already rebuilt."""
    return Event(
        event_type=ev["event_type"], system_instance_id=ev["system_instance_id"] or "",
        event_time=ev["event_time"] or 0.0, metadata=read_json(ev["metadata"], {}),
        model_name=ev["model_name"], provider=ev["provider"],
        input_tokens=ev["input_tokens"], output_tokens=ev["output_tokens"],
        total_tokens=ev["total_tokens"], cost_usd=cost_usd(ev),
        latency_ms=ev["latency_ms"], call_records=call_records,
        usage=_stored_usage(ev, call_records),
        reward=ev["reward"], terminated=_opt_bool(ev["terminated"]),
        truncated=_opt_bool(ev["truncated"]),
        system_state_before=read_json(ev["system_state_before"]),
        system_state_after=read_json(ev["system_state_after"]), id=uid,
        tokens=turns.get(ev["id"]))


def _built_message(ms: dict[str, Any], uid: str) -> tuple[Message, Any]:
    """A `Message` from its row, and how many messages its timestep shares (if it said)."""
    metadata = read_json(ms["metadata"], {})
    if not isinstance(metadata, dict):
        metadata = {}
    content = ms["content"]
    if metadata.pop(JSON_CONTENT, False):
        content = read_json(content)
    shared = metadata.pop(SHARED, None)
    return Message(message_type=ms["message_type"], content=content,
                   timestamp=ms["event_time"] or epoch(ms["timestamp"]) or 0.0,
                   metadata=metadata, id=uid), shared


def _built_outcome(o: dict[str, Any]) -> OutcomeReward:
    """An `OutcomeReward` from its row."""
    return OutcomeReward(
        total_reward=o["total_reward"], achievements_count=o["achievements_count"],
        total_steps=o["total_steps"], reward_metadata=read_json(o["reward_metadata"], {}),
        annotation=read_json(o.get("annotation")), created_at=epoch(o["created_at"]) or 0.0)


def _built_event_reward(r: dict[str, Any], event_uid: dict[Any, str],
                        message_uid: dict[Any, str]) -> EventReward:
    """An `EventReward` from its row, pointing to its event and message by their uids."""
    return EventReward(
        reward_value=r["reward_value"], reward_type=r["reward_type"] or "",
        source=r["source"] or "", turn_number=r["turn_number"],
        event_id=event_uid.get(r["event_id"]), message_id=message_uid.get(r["message_id"]),
        key=r["key"], annotation=read_json(r["annotation"]),
        created_at=epoch(r["created_at"]) or 0.0)


def _message_key(m: Message) -> tuple[Any, ...]:
    return m.message_type, m.content, m.metadata


def turn_tokens(rows: list[dict[str, Any]]) -> dict[Any, _tokens.TurnTokens]:
    """Each event's `TurnTokens`, from its `TOKENS_TABLE` row (prompts rebuilt in event
    order)."""
    rows = sorted(rows, key=lambda r: r["event_id"])
    turns = _tokens.unpack_turns([tuple(r[c] for c in TOKENS_COLUMNS[1:]) for r in rows])
    return {r["event_id"]: turn for r, turn in zip(rows, turns, strict=True)}


def _stored_usage(ev: dict[str, Any], call_records: Any) -> dict[str, Any] | None:
    # The usage `call_policy` kept in its one call record, as the policy answered it; else
    # (older rows, synth-ai's rows) one rebuilt from the token columns.
    if ev["event_type"] != "cais":
        return None
    if isinstance(call_records, list) and len(call_records) == 1 \
            and isinstance(call_records[0], dict) and isinstance(call_records[0].get("usage"),
                                                                  dict):
        usage = call_records[0]["usage"]
        if "prompt_tokens" in usage:  # synth-ai's records say input_tokens: not OpenAI's
            return dict(usage)
    return usage_from_counts(ev["input_tokens"], ev["output_tokens"], ev["total_tokens"])


def _step_for(timestep_id: Any, by_step: dict[Any, Timestep], timesteps: list[Timestep],
              orphan: Timestep | None) -> Timestep | None:
    # Rows written without a timestep (possible in synth-ai data) get one of their own.
    if timestep_id in by_step or orphan is not None:
        return orphan
    orphan = Timestep(step_id="(no timestep)", step_index=len(timesteps))
    timesteps.append(orphan)
    return orphan


def _opt_bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


__all__ = ["ID_TABLES", "build_session", "epoch", "insert_rows", "insert_statements", "iso",
           "session_reward", "turn_tokens"]
