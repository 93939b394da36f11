"""Traces of rollouts: what a rollout records (`SessionTracer`) and where it is stored."""

from synth_deploy.tracing.session import (
    Event,
    EventReward,
    Message,
    OutcomeReward,
    SessionTrace,
    SessionTracer,
    Timestep,
)

__all__ = [
    "Event",
    "EventReward",
    "Message",
    "OutcomeReward",
    "SessionTrace",
    "SessionTracer",
    "Timestep",
]
