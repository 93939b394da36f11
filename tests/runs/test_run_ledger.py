"""The cost ledger of a run: each rollout's tokens and time, as the server counted them (or as
read off a returned trace), summed in the smoke/eval/rehearse summaries, priced when a price
table is given."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from processes import run_cli

from synth_deploy.env import Env
from synth_deploy.runs import (
    PolicyTarget,
    rollout_ledger,
    rollout_request,
    run_ledger,
    run_suite,
)
from synth_deploy.tracing import (
    CostLedger,
    SessionTracer,
    ledger_of,
    open_trace_store,
    parse_trace_db,
    session_from_trace,
)

MATH_RL = Path(__file__).resolve().parents[2] / "apps" / "math" / "configs" / "rl.toml"
PRICES = '[models."synth-deploy/*"]\ninput_per_million = 2.0\noutput_per_million = 8.0\n'


def test_the_server_reports_each_rollouts_ledger(math_server, mock_policy, api_key):
    body = rollout_request(3, PolicyTarget(mock_policy.url + "/v1", "mock"), return_trace=True)
    data = httpx.post(math_server.url + "/rollout", json=body, headers={"X-API-Key": api_key},
                      timeout=30).json()

    stated = CostLedger.from_dict(data["metrics"]["details"]["ledger"])
    from_trace = ledger_of(session_from_trace(data["trace"]))
    assert stated.to_dict() == from_trace.to_dict()
    assert stated.lm_calls == 1 and stated.input_tokens > 0 and stated.output_tokens > 0
    assert stated.wall_s >= stated.lm_s > 0
    assert data["metrics"]["details"]["tokens"] == stated.total_tokens


def test_a_run_sums_the_ledgers_the_store_holds(tmp_path):
    db = tmp_path / "t.db"
    report = run_suite("math", [0, 1, 2, 3, 4], Env(), traces=parse_trace_db(str(db)))

    with open_trace_store(str(db), read_only=True) as store:
        stored = {s.run_id: ledger_of(store.get_session(s.session_id))
                  for s in store.list_sessions(limit=None)}
    for outcome in report.outcomes:
        assert "ledger" not in outcome.details  # the ledger has its own field
        mine, theirs = outcome.ledger, stored[outcome.run_id]
        assert (mine.input_tokens, mine.output_tokens, mine.lm_calls) == (
            theirs.input_tokens, theirs.output_tokens, theirs.lm_calls)
        assert mine.lm_s == pytest.approx(theirs.lm_s)
    summary = report.summary()["ledger"]
    total = CostLedger.total(stored.values())
    assert (summary["rollouts"], summary["input_tokens"], summary["output_tokens"]) == (
        5, total.input_tokens, total.output_tokens)


def test_a_trace_without_a_ledger_still_gives_one():
    # A synth-ai app states no ledger; the trace it returns (any shape) is read instead.
    tracer = SessionTracer(metadata={"duration_s": 0.5})
    tracer.record_lm_call(model_name="m", usage={"prompt_tokens": 9, "completion_tokens": 4},
                          latency_ms=100.0)
    ledger = rollout_ledger(None, tracer.finish().to_dict())
    assert (ledger.input_tokens, ledger.output_tokens, ledger.lm_s, ledger.wall_s) == (
        9, 4, 0.1, 0.5)
    assert rollout_ledger(None, None) is None
    assert run_ledger([]) is None


def test_smoke_prints_the_ledger_and_prices_it(tmp_path):
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    human = run_cli(tmp_path, "smoke", "math", "--seeds", "0-2", "--prices", str(prices))
    machine = run_cli(tmp_path, "smoke", "math", "--seeds", "0-2", "--json", "--no-trace",
                      SYNTH_PRICES=str(prices))

    assert human.returncode == 0, human.stderr
    assert "cost: " in human.stdout and "summed over 3 rollouts" in human.stdout
    assert "est. $" in human.stdout and str(prices) in human.stdout
    data = json.loads(machine.stdout)
    ledger = data["summary"]["ledger"]
    assert ledger["rollouts"] == 3 and ledger["input_tokens"] > 0
    assert data["cost_estimate"]["usd"] == pytest.approx(
        (ledger["input_tokens"] * 2.0 + ledger["output_tokens"] * 8.0) / 1e6)
    assert all(r["ledger"]["lm_calls"] == 1 for r in data["rollouts"])


def test_rehearse_shows_the_training_steps_ledger(tmp_path):
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    done = run_cli(tmp_path, "rehearse", "--config", str(MATH_RL), "--app", "math", "--json",
                   "--skip", "determinism", "--skip", "capacity", "--skip", "idle",
                   "--prices", str(prices), timeout=180)

    report = json.loads(done.stdout)
    step = next(c for c in report["checks"] if c["name"] == "training step")
    ledger = step["data"]["ledger"]
    assert ledger["rollouts"] == step["data"]["rollouts"] and ledger["input_tokens"] > 0
    assert report["cost_estimate"]["usd"] > 0
