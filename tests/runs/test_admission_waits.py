"""The kit's clients wait for a slot on a full app: a 503 with Retry-After is asked again
after it (growing, bounded), never failed, and the reports say how long rollouts waited.
A real server on loopback with two slots, the real CLI."""

from __future__ import annotations

import asyncio
import json

from processes import run_cli
from toy_apps import toy_config

from synth_deploy.serving import RolloutLimits, create_app
from synth_deploy.serving.containers import ADMISSION_MAX_DELAY_S, AdmissionWaits
from synth_deploy.taskapp import RolloutContext, RolloutRequest


async def _slow(request: RolloutRequest, ctx: RolloutContext) -> dict:
    await asyncio.sleep(0.4)
    ctx.tracer.record_outcome_reward(1.0)
    return {"run_id": request.run_id, "metrics": {}}


def test_smoke_at_concurrency_8_against_two_slots_has_every_seed_ok_and_says_it_waited(
        tmp_path, serve, api_key):
    app = serve(create_app(toy_config(_slow), api_keys=[api_key],
                           limits=RolloutLimits(max_in_flight=2)))
    result = run_cli(tmp_path, "smoke", app.url, "--seeds", "0-7", "--concurrency", "8",
                     "--json", "--no-trace", ENVIRONMENT_API_KEY=api_key)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["summary"]["ok"] == 8
    waited = [r for r in report["rollouts"] if r["refusals"]]
    assert waited and all(r["waited_s"] > 0 for r in waited)
    assert any("waited for a slot" in note for note in report["notes"])


def test_waits_follow_retry_after_grow_and_end():
    waits = AdmissionWaits()
    assert waits.after(200, {}) is None and waits.after(503, {}) is None  # not a refusal
    pauses = []
    while (pause := waits.after(503, {"retry-after": "1"})) is not None:
        pauses.append(pause)
    assert 0.8 <= pauses[0] <= 1.2 and max(pauses) <= ADMISSION_MAX_DELAY_S * 1.2
    assert pauses[5] > pauses[0]  # backing off
    assert waits.refusals == len(pauses) and abs(waits.waited_s - sum(pauses)) < 1e-9
