"""Stored rollouts → token JSONL for on-policy training: one row per sample (segment).

Each row holds the ids the policy saw and sampled, as its server returned them (never
re-tokenized). An episode is one sample while each turn's prompt begins with the previous
prompt and completion; where one does not (`continuity_breaks`: a history window that drops
old turns, a template that re-renders them), a new sample starts there with its own mask, as
prime-rl starts one, so every row is continuous and no episode is dropped for it. Sessions
whose LM calls did not all capture token data (with a logprob per sampled id) are left out and
counted by reason.

Fields of a row (`datasets.load_dataset("json", data_files=...)` reads them):

- ``session_id``, ``run_id``, ``app_id``, ``seed``, ``model``: the session's ids;
- ``segment``, ``segments``: this sample's index in its episode, and how many it has;
- ``input_ids``: the segment's first prompt, then each completion, each later prompt's new
  ids, ...;
- ``loss_mask``: 1 where the policy sampled the id (completions), 0 elsewhere;
- ``logprobs``: the sampled log-probability of each id where ``loss_mask`` is 1 (float32,
  as the store keeps it), 0.0 elsewhere; the three arrays have the same length;
- ``turns``: per LM call of the segment, ``[prompt_start, completion_start, completion_end]``
  into the arrays (``input_ids[:completion_start]`` is that call's whole prompt);
- ``turn_rewards``: per LM call of the segment, the environment reward recorded in its
  timestep (null where none was), and ``reward``: the episode's outcome reward.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth_deploy.tracing._db._rows import read_json, turn_tokens
from synth_deploy.tracing._db._schema import TOKENS_TABLE, TOKENS_VERSION
from synth_deploy.tracing._db._select import SessionFilter, SessionSql
from synth_deploy.tracing._read._export import export_target, replaced_whole
from synth_deploy.tracing._store import TraceStore
from synth_deploy.tracing._tokens import TurnTokens

PAGE_SESSIONS = 200
NOT_ASKED = "no token ids asked for"
NO_TOKENS = "no token data"
NO_LOGPROBS = "no logprobs"


@dataclass(frozen=True)
class TokenExportResult:
    """What `export_tokens` wrote: ``episodes`` sessions as ``rows`` samples (more rows than
    episodes where prompts broke continuity); ``skipped`` sessions by reason."""

    path: str
    episodes: int
    tokens: int
    sampled_tokens: int
    seconds: float
    skipped: dict[str, int] = field(default_factory=dict)
    rows: int = 0

    @property
    def note(self) -> str | None:
        parts = []
        if n := self.skipped.get(NOT_ASKED):
            parts.append(f"{n} session(s) left out: no policy call asked for token ids (set "
                         "capture_tokens = true in policy.config, [rollout] policy_config of "
                         "an RL config, with a server that returns them)")
        if n := self.skipped.get(NO_TOKENS):
            parts.append(f"{n} session(s) left out: a policy call has no token data (ask "
                         "with policy.config.capture_tokens and a server that returns them, "
                         "such as vLLM >= 0.10.2)")
        if n := self.skipped.get(NO_LOGPROBS):
            parts.append(f"{n} session(s) left out: a policy call returned ids without one "
                         "logprob each (see `synth-deploy traces show` for why)")
        if not self.episodes and not parts:
            parts.append("no stored session passes the filters (failed rollouts are never "
                         "exported)")
        return "; ".join(parts) or None

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "skipped": dict(self.skipped), "note": self.note}


def segments(turns: list[TurnTokens]) -> list[list[TurnTokens]]:
    """``turns`` cut where a prompt does not begin with the previous turn's prompt and
    completion: each part is continuous."""
    parts: list[list[TurnTokens]] = []
    context: list[int] | None = None
    for turn in turns:
        if context is None or turn.prompt_ids[:len(context)] != context:
            parts.append([])
        parts[-1].append(turn)
        context = turn.prompt_ids + turn.completion_ids
    return parts


def episode_row(turns: list[TurnTokens]) -> dict[str, Any]:
    """``input_ids``, ``loss_mask``, ``logprobs`` and ``turns`` of continuous ``turns``."""
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    bounds = []
    for turn in turns:
        start = len(ids)
        new = turn.prompt_ids[len(ids):]
        ids += new
        mask += [0] * len(new)
        logprobs += [0.0] * len(new)
        middle = len(ids)
        ids += turn.completion_ids
        mask += [1] * len(turn.completion_ids)
        logprobs += turn.completion_logprobs
        bounds.append([start, middle, len(ids)])
    return {"input_ids": ids, "loss_mask": mask, "logprobs": logprobs, "turns": bounds}


def export_tokens(store: TraceStore, out: str | Path, *, min_reward: float | None = None,
                  app: str | None = None, model: str | None = None, since: str | None = None,
                  limit: int | None = None, overwrite: bool = False,
                  where: SessionFilter | None = None,
                  reward_version: str | None = None) -> TokenExportResult:
    """Write one JSONL row per sample (see the module docstring); ``limit`` caps episodes.
    Written beside its target and renamed into place; an existing file is kept unless
    ``overwrite``. ``reward_version``: each row's reward is that version's (`traces
    rescore`), and only the sessions it scored are written."""
    started = time.perf_counter()
    path, where = export_target(out, limit=limit, overwrite=overwrite, where=where, app=app,
                                model=model, min_reward=min_reward, since=since,
                                reward_version=reward_version)
    db = store.database
    sql = SessionSql(db)
    selection = None if where.status == "error" or store.schema_version < TOKENS_VERSION \
        else sql.where(dataclasses.replace(where, status="ok"))[:2]
    reward = sql.reward(where.reward_version)
    skipped: Counter[str] = Counter()
    episodes = rows = tokens = sampled = 0
    with replaced_whole(path) as fh:
        for samples in _episodes(db, selection, skipped, reward):
            if limit is not None and episodes >= limit:
                break
            for row in samples:
                if where.reward_version is not None:  # whose reward the row's is
                    row["reward_version"] = where.reward_version
                fh.write(_json_line(row) + "\n")
                tokens += len(row["input_ids"])
                sampled += sum(row["loss_mask"])
            episodes += 1
            rows += len(samples)
    return TokenExportResult(str(path), episodes, tokens, sampled,
                             time.perf_counter() - started, dict(skipped), rows)


def _json_line(row: dict[str, Any]) -> str:
    """``row`` as strict JSON, which has no NaN or infinity (Python's reader takes them, a
    trainer's may not): a reward the store holds as one is written null. Logprobs never are
    (`valid_logprobs` keeps them finite)."""
    try:
        return json.dumps(row, ensure_ascii=False, allow_nan=False)
    except ValueError:
        finite = {"reward": _finite(row["reward"]),
                  "turn_rewards": [_finite(r) for r in row["turn_rewards"]]}
        return json.dumps({**row, **finite}, ensure_ascii=False, allow_nan=False)


def _finite(value: Any) -> Any:
    return value if not isinstance(value, float) or math.isfinite(value) else None


def _episodes(db: Any, selection: tuple[str, list[Any]] | None, skipped: Counter[str],
              reward: str = "s.total_reward") -> Any:
    """Each exported session's rows (its samples); ``reward``: the SQL of its reward."""
    if selection is None:
        return
    clause, params = selection
    after: list[Any] = []
    while True:
        sessions = _session_page(db, clause, params, after, reward)
        if not sessions:
            return
        ids = [s["session_id"] for s in sessions]
        calls, step_rewards = _page_calls(db, ids)
        for s in sessions:
            samples = _samples(s, calls[s["session_id"]], step_rewards, skipped)
            if samples is not None:
                yield samples
        after = [sessions[-1]["created_at"], sessions[-1]["rid"]]


def _session_page(db: Any, clause: str, params: list[Any], after: list[Any], reward: str
                  ) -> list[dict[str, Any]]:
    """The next page of selected sessions, oldest first, after ``after`` (created_at,
    rowid) when given."""
    keyset = "(s.created_at, s.rowid) > (?, ?)" if after else ""
    where = clause + (" AND " if clause and keyset else " WHERE " if keyset else "") + keyset
    return db.query(
        "SELECT s.rowid AS rid, s.session_id, s.created_at, s.metadata, "
        f"{reward} AS total_reward FROM session_traces s{where} "
        "ORDER BY s.created_at, s.rowid "
        f"LIMIT {PAGE_SESSIONS}", params + after)


def _page_calls(db: Any, ids: list[str]) -> tuple[dict[str, list[dict[str, Any]]],
                                                  dict[tuple[Any, Any], Any]]:
    """The page's LM calls with tokens (rows by session) and each step's environment
    reward (by session and timestep)."""
    marks = ", ".join("?" * len(ids))
    calls: dict[str, list[dict[str, Any]]] = {sid: [] for sid in ids}
    for r in db.query(f"SELECT e.session_id, e.timestep_id, t.* FROM events e JOIN "
                      f"{TOKENS_TABLE} t ON t.event_id = e.id WHERE e.session_id IN "
                      f"({marks}) ORDER BY e.id", ids):
        calls[r["session_id"]].append(r)
    step_rewards = {(r["session_id"], r["timestep_id"]): r["reward"] for r in db.query(
        "SELECT session_id, timestep_id, SUM(reward) AS reward FROM events WHERE "
        f"session_id IN ({marks}) AND event_type = 'environment' AND reward IS NOT NULL "
        "GROUP BY session_id, timestep_id", ids)}
    return calls, step_rewards


def _skip_reason(rows: list[dict[str, Any]], turns: list[Any] | None) -> str | None:
    """Why a session is no episode to train on (None: it is one)."""
    if not rows:  # no LM call asked for tokens
        return NOT_ASKED
    if not all(t.observed for t in turns or ()):
        return NO_TOKENS
    if any(t.completion_ids and not t.completion_logprobs for t in turns or ()):
        return NO_LOGPROBS
    return None


def _samples(s: dict[str, Any], rows: list[dict[str, Any]],
             step_rewards: dict[tuple[Any, Any], Any], skipped: Counter[str]
             ) -> list[dict[str, Any]] | None:
    """One session's rows, a segment each; None (counted in ``skipped``) when it has none."""
    turns = None
    if rows:
        decoded = turn_tokens(rows)
        turns = [decoded[r["event_id"]] for r in rows]
    reason = _skip_reason(rows, turns)
    if reason is not None:
        skipped[reason] += 1
        return None
    meta = read_json(s["metadata"], {})
    meta = meta if isinstance(meta, dict) else {}
    rewards = [step_rewards.get((s["session_id"], r["timestep_id"])) for r in rows]
    parts = segments(turns)
    samples, first = [], 0
    for index, part in enumerate(parts):
        samples.append({
            "session_id": s["session_id"], "run_id": meta.get("run_id"),
            "app_id": meta.get("app_id"), "seed": meta.get("seed"),
            "model": part[-1].model or meta.get("model"),
            "segment": index, "segments": len(parts), **episode_row(part),
            "turn_rewards": rewards[first:first + len(part)],
            "reward": s["total_reward"]})
        first += len(part)
    return samples


__all__ = ["TokenExportResult", "episode_row", "export_tokens", "segments"]
