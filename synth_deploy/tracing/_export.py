"""Stored rollouts → SFT JSONL (the format in shared/spec/configs.md).

An example is one policy call: the messages `call_policy` recorded in a timestep (the system
and user prompts, any earlier turns it was shown) up to and including the assistant's reply.
Failed rollouts are never exported; ``min_reward`` keeps sessions whose outcome reward is at
least that value.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synth_deploy.errors import UsageError
from synth_deploy.tracing._session import SessionTrace
from synth_deploy.tracing._store import TraceStore, since_timestamp

_ROLES = {"system": "system", "user": "user", "assistant": "assistant",
          "tool_result": "tool", "tool": "tool"}


@dataclass(frozen=True)
class ExportResult:
    """What `export_sft` wrote."""

    path: str
    examples: int
    sessions: int
    skipped_sessions: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def sft_examples(session: SessionTrace) -> Iterator[dict[str, Any]]:
    """The SFT examples in one session (see the module docstring)."""
    reward = _reward(session)
    meta = session.metadata
    for step in session.timesteps:
        messages = [m for m in step.messages if m.message_type in _ROLES]
        last = max((i for i, m in enumerate(messages) if m.message_type == "assistant"),
                   default=None)
        if last is None or not any(m.message_type != "assistant" for m in messages[:last]):
            continue
        yield {
            "messages": [{"role": _ROLES[m.message_type], "content": _content(m.content)}
                         for m in messages[:last + 1]],
            "metadata": {"session_id": session.session_id, "app_id": meta.get("app_id"),
                         "run_id": meta.get("run_id"), "seed": meta.get("seed"),
                         "model": meta.get("model"), "turn": step.turn_number,
                         "step_id": step.step_id, "reward": reward},
        }


def export_sft(store: TraceStore, out: str | Path, *, min_reward: float | None = None,
               app: str | None = None, model: str | None = None, since: str | None = None,
               limit: int | None = None, overwrite: bool = False) -> ExportResult:
    """Write SFT JSONL from the sessions that pass the filters; ``limit`` caps examples.

    The file is written beside its target and renamed into place, so a failed export never
    leaves half a file; an existing file is kept unless ``overwrite``.
    """
    started = time.perf_counter()
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}")
    path = Path(out)
    if path.exists() and not overwrite:
        raise UsageError(f"{path} already exists; it was left as is",
                         hint="choose another --out or pass --force to replace it")
    summaries = store.list_sessions(limit=None, app=app, status="ok", min_reward=min_reward,
                                    model=model, newest_first=False,
                                    since=since_timestamp(since) if since else None)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    examples = sessions = skipped = 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("w", encoding="utf-8") as fh:
            for summary in summaries:
                if limit is not None and examples >= limit:
                    break
                wrote = 0
                for example in sft_examples(store.get_session(summary.session_id)):
                    fh.write(json.dumps(example, ensure_ascii=False) + "\n")
                    wrote += 1
                    examples += 1
                    if limit is not None and examples >= limit:
                        break
                sessions += bool(wrote)
                skipped += not wrote
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}",
                         hint="choose a writable --out") from exc
    finally:
        if tmp.exists():
            tmp.unlink()
    return ExportResult(path=str(path), examples=examples, sessions=sessions,
                        skipped_sessions=skipped, seconds=time.perf_counter() - started)


def _reward(session: SessionTrace) -> float | None:
    from synth_deploy.tracing._rows import session_reward

    return session_reward(session)


def _content(content: Any) -> Any:
    return content if isinstance(content, str | list | dict) or content is None else str(content)


__all__ = ["ExportResult", "export_sft", "sft_examples"]
