"""A trace store with known sessions, for the browse queries and the viewer's tests.

24 sessions: apps math and crafter × models model-a and model-b × seeds 0-5, written through
the kit's own writer with the metadata the task app server records. Every number the viewer
shows can be computed from `KnownSession`s here. One of them (crafter, model-b, seed 1) is a
three-turn episode with image observations (PNG data URLs), tool calls, achievements and
per-step event rewards; one (math, model-a, seed 5) failed.
"""

from __future__ import annotations

import base64
import struct
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from synth_deploy.tracing import SessionTracer, open_trace_store

APPS = ("math", "crafter")
MODELS = ("model-a", "model-b")
SEEDS = range(6)
BASE = datetime(2025, 3, 1, tzinfo=UTC).timestamp()
ERROR = ("math", "model-a", 5)
EPISODE = ("crafter", "model-b", 1)
ACHIEVEMENTS = ("collect_wood", "place_table")


def tiny_png(width: int = 4, height: int = 3, rgb: tuple[int, int, int] = (40, 160, 60)) -> bytes:
    """A real PNG (what a Crafter frame is, smaller)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                             0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


FRAME_URL = "data:image/png;base64," + base64.b64encode(tiny_png()).decode()


@dataclass
class KnownSession:
    session_id: str
    app: str
    model: str
    seed: int
    created_at: float
    reward: float | None  # None: the rollout failed
    mode: str
    split: str
    run_id: str
    input_tokens: int
    output_tokens: int
    event_rewards: list[float] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "error" if self.reward is None else "ok"

    @property
    def day(self) -> str:
        return datetime.fromtimestamp(self.created_at, UTC).date().isoformat()


def reward_of(app: str, model: str, seed: int) -> float | None:
    if (app, model, seed) == ERROR:
        return None
    return ((seed * 7 + (3 if model == "model-b" else 0) + (1 if app == "crafter" else 0)) % 5) / 4


def build_known_store(path: Path) -> list[KnownSession]:
    """Write the known sessions to a new trace file at ``path``; returns them, oldest first."""
    known = []
    with open_trace_store(str(path)) as store:
        index = 0
        for app in APPS:
            for model in MODELS:
                for seed in SEEDS:
                    session, facts = _session(app, model, seed, index)
                    store.write_session_sync(session)
                    known.append(facts)
                    index += 1
    return known


def _session(app: str, model: str, seed: int, index: int):
    reward = reward_of(app, model, seed)
    # crafter ran a day after math, so a date filter splits them
    created = BASE + (86400 if app == "crafter" else 0) + index * 60
    mode = "eval" if model == "model-b" else "train"
    split = "test" if seed >= 4 else "train"
    run_id = f"run-{model[-1]}"
    tracer = SessionTracer(metadata={"app_id": app, "run_id": run_id, "mode": mode,
                                     "seed": seed, "model": model, "env_name": app})
    tracer.session.created_at = created
    facts = KnownSession(session_id=tracer.session_id, app=app, model=model, seed=seed,
                         created_at=created, reward=reward, mode=mode, split=split,
                         run_id=run_id, input_tokens=0, output_tokens=0)
    if (app, model, seed) == EPISODE:
        _episode(tracer, model, facts)
    else:
        tracer.start_timestep("turn-1", turn_number=1)
        tracer.record_message("system", "Answer with a number.")
        tracer.record_message("user", f"What is {seed} + 7?")
        tracer.record_lm_call(model_name=model, input_tokens=10 + seed, output_tokens=3,
                              latency_ms=100.0 + seed)
        facts.input_tokens, facts.output_tokens = 10 + seed, 3
        tracer.record_message("assistant", str(seed + 7))
        if reward is not None:
            event = tracer.record_environment_event(reward=reward, terminated=True)
            tracer.record_event_reward(reward, reward_type="answer_correct", event_id=event.id)
            facts.event_rewards.append(reward)
    if reward is not None:
        tracer.record_outcome_reward(reward, achievements_count=len(ACHIEVEMENTS)
                                     if (app, model, seed) == EPISODE else 0)
    session = tracer.finish()
    session.metadata.update({
        "duration_s": 0.5 + seed / 10,
        "request": {"run_id": run_id, "mode": mode,
                    "env": {"seed": seed, "env_name": app, "config": {"split": split}},
                    "policy": {"config": {"model": model}}},
        "status": facts.status})
    if reward is None:
        session.metadata["error"] = {"code": "rollout_failed",
                                     "message": "rollout run-a failed: policy timed out"}
    else:
        session.metadata["metrics"] = {"outcome_reward": reward, "outcome_score": reward}
    return session, facts


def _episode(tracer: SessionTracer, model: str, facts: KnownSession) -> None:
    """Three turns of a Crafter-like episode: an image each turn, an `interact` tool call,
    an environment step whose event reward is the achievements it unlocked."""
    unlocked: list[str] = []
    for turn in (1, 2, 3):
        tracer.start_timestep(f"turn-{turn}", turn_number=turn)
        if turn == 1:
            tracer.record_message("system", "You play Crafter. Call interact.")
        tracer.record_message("user", [
            {"type": "text", "text": f"Turn {turn}: a tree is to your left."},
            {"type": "image_url", "image_url": {"url": FRAME_URL}}])
        call = {"id": f"call_{turn}", "type": "function",
                "function": {"name": "interact", "arguments": '{"actions": ["move_left", "do"]}'}}
        tracer.record_lm_call(model_name=model, input_tokens=100 * turn, output_tokens=7,
                              latency_ms=50.0 * turn,
                              call_records=[{"request": {"model": model},
                                             "response": {"role": "assistant", "content": "",
                                                          "tool_calls": [call]}}])
        facts.input_tokens += 100 * turn
        facts.output_tokens += 7
        tracer.record_message("assistant", "", metadata={"tool_calls": [call]})
        new = [ACHIEVEMENTS[turn - 2]] if turn >= 2 else []
        unlocked += new
        event = tracer.record_environment_event(
            reward=float(len(new)), terminated=turn == 3,
            state_after={"achievements": {a: int(a in unlocked) for a in ACHIEVEMENTS},
                         "health": 9})
        if new:
            tracer.record_event_reward(1.0, reward_type="achievement_delta", event_id=event.id,
                                       turn_number=turn)
            facts.event_rewards.append(1.0)


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def build_learning_run(path: Path, per_model: int = 300, days: int = 14) -> list[KnownSession]:
    """An eval run as it accumulates: two models on the math app, ``per_model`` sessions each
    over ``days`` days, model-b learning faster, a few failures. Rewards are fractions of 8."""
    import random

    rnd = random.Random(17)
    known = []
    with open_trace_store(str(path)) as store:
        for i in range(per_model * 2):
            model = MODELS[i % 2]
            progress = i / (per_model * 2)
            skill = 0.25 + progress * (0.6 if model == "model-b" else 0.3)
            failed = rnd.random() < 0.03
            reward = None if failed else sum(rnd.random() < skill for _ in range(8)) / 8
            seed = i // 2 % 50
            tracer = SessionTracer(metadata={"app_id": "math", "run_id": f"eval-{model}",
                                             "mode": "eval", "seed": seed, "model": model})
            created = BASE + progress * days * 86400
            tracer.session.created_at = created
            tracer.start_timestep("turn-1", turn_number=1)
            tracer.record_message("user", f"What is {seed} + 7?")
            tracer.record_lm_call(model_name=model, input_tokens=12, output_tokens=4)
            tracer.record_message("assistant", str(seed + 7))
            facts = KnownSession(session_id=tracer.session_id, app="math", model=model,
                                 seed=seed, created_at=created, reward=reward, mode="eval",
                                 split="test", run_id=f"eval-{model}", input_tokens=12,
                                 output_tokens=4)
            if reward is not None:
                event = tracer.record_environment_event(reward=reward, terminated=True)
                tracer.record_event_reward(reward, reward_type="steps_correct",
                                           event_id=event.id)
                tracer.record_outcome_reward(reward)
                facts.event_rewards.append(reward)
            session = tracer.finish()
            session.metadata.update({"status": facts.status, "request": {
                "env": {"seed": seed, "config": {"split": "test"}}}})
            if failed:
                session.metadata["error"] = {"message": "policy timed out"}
            store.write_session_sync(session)
            known.append(facts)
    return known
