"""The cost ledger: per rollout tokens in/out as the policy reported them, LM, environment
and wall time; summed over a store by `traces stats`, priced by a price table, carried into
the SFT export's metadata."""

from __future__ import annotations

import json

import pytest
from processes import run_cli

from synth_deploy.env import Env
from synth_deploy.errors import UsageError
from synth_deploy.runs import run_suite
from synth_deploy.tracing import (
    CostLedger,
    SessionTracer,
    export_sft,
    ledger_of,
    load_price_table,
    open_trace_store,
    parse_trace_db,
    resolve_price_table,
    sft_examples,
)

PRICES = """
[models."gpt-4o-mini"]
input_per_million = 0.15
output_per_million = 0.60

[models."synth-deploy/*"]
input_per_million = 1.0
output_per_million = 4.0
"""


def test_tokens_come_from_the_counts_else_from_usage_read_defensively():
    tracer = SessionTracer(metadata={"duration_s": 2.0})
    tracer.record_lm_call(model_name="a", input_tokens=10, output_tokens=4, latency_ms=500)
    # Only a usage: OpenAI's names, then another API's, then junk that must count as nothing.
    tracer.record_lm_call(model_name="a", usage={"prompt_tokens": 7, "completion_tokens": 3},
                          latency_ms=250)
    event = tracer.record_lm_call(model_name="b", latency_ms=250)
    event.usage = {"input_tokens": 5, "output_tokens": 1}
    junk = tracer.record_lm_call(model_name="b", latency_ms="slow")  # type: ignore[arg-type]
    junk.usage = {"prompt_tokens": "many", "completion_tokens": True}
    tracer.record_environment_event(reward=1.0)

    ledger = ledger_of(tracer.finish())

    assert (ledger.lm_calls, ledger.input_tokens, ledger.output_tokens) == (4, 22, 8)
    assert (ledger.lm_s, ledger.wall_s, ledger.env_s) == (1.0, 2.0, 1.0)
    assert {m: (t.input_tokens, t.output_tokens) for m, t in ledger.by_model.items()} == {
        "a": (17, 7), "b": (5, 1)}


def test_environment_time_never_goes_below_zero_and_unknown_wall_time_is_zero():
    tracer = SessionTracer(metadata={"duration_s": 1.5})
    tracer.record_lm_call(model_name="a", latency_ms=5000)  # longer than the rollout
    ledger = ledger_of(tracer.finish())
    assert (ledger.wall_s, ledger.lm_s, ledger.env_s) == (1.5, 5.0, 0.0)

    # synth-ai's sessions carry no duration: the time is unknown, not guessed.
    tracer = SessionTracer()
    tracer.record_lm_call(model_name="a", latency_ms=200)
    ledger = ledger_of(tracer.finish())
    assert (ledger.wall_s, ledger.lm_s, ledger.env_s) == (0.0, 0.2, 0.0)


def test_ledgers_add_up_and_survive_a_round_trip_through_json():
    one = ledger_of(_session(10, 2, 100.0, 0.5))
    two = ledger_of(_session(20, 4, 300.0, 1.0))
    total = CostLedger.total([one, None, two])

    assert (total.rollouts, total.input_tokens, total.output_tokens) == (2, 30, 6)
    assert total.wall_s == pytest.approx(1.5) and total.lm_s == pytest.approx(0.4)
    again = CostLedger.from_dict(json.loads(json.dumps(total.to_dict())))
    assert again.to_dict() == total.to_dict()
    # Another server's ledger, or garbage: read as far as it goes, never an exception.
    assert CostLedger.from_dict("nope") is None
    assert CostLedger.from_dict({"input_tokens": "x", "lm_s": -3, "by_model": [1]}) == \
        CostLedger(rollouts=1)


def test_the_dict_form_keeps_times_to_the_microsecond_and_cost_to_the_nano_dollar():
    ledger = CostLedger(rollouts=1, lm_s=0.123456789, env_s=1 / 3, wall_s=3600.0000004,
                        cost_usd=0.0000123456789)
    assert ledger.to_dict() == {
        "rollouts": 1, "lm_calls": 0, "input_tokens": 0, "output_tokens": 0, "lm_s": 0.123457,
        "env_s": 0.333333, "wall_s": 3600.0, "by_model": {}, "cost_usd": 0.000012346}
    # Values no clock gives are passed through rather than failing the rollout.
    odd = CostLedger(lm_s=float("inf"), wall_s=1e300).to_dict()
    assert (odd["lm_s"], odd["wall_s"]) == (float("inf"), 1e300)


def test_a_price_table_estimates_what_it_can_and_names_the_rest(tmp_path):
    path = tmp_path / "prices.toml"
    path.write_text(PRICES)
    table = load_price_table(path)
    ledger = CostLedger.total([_ledger("gpt-4o-mini", 1_000_000, 1_000_000),
                               _ledger("synth-deploy/mock-policy", 500_000, 0),
                               _ledger("unpriced-model", 10, 10)])

    estimate = table.estimate(ledger)
    assert estimate.usd == pytest.approx(0.15 + 0.60 + 0.5)
    assert estimate.unpriced == ("unpriced-model",)
    assert resolve_price_table(None, Env({"SYNTH_PRICES": str(path)})).prices == table.prices
    assert resolve_price_table(None, Env()) is None


@pytest.mark.parametrize("text, said", [
    ('[models."m"]\ninput_per_million = 1\n', "m'.output_per_million must be a number"),
    ('[models."m"]\ninput_per_million = -1\noutput_per_million = 1\n', "must be a number ≥ 0"),
    ('[models."m"]\ninput = 1\n', "unknown field(s) input"),
    ('[models."m"\n', ":1: not valid TOML"),
    ('\n\n[prices]\nx = 1\n', 'no [models."NAME"] tables'),
])
def test_a_wrong_price_table_says_where_and_how_to_fix_it(tmp_path, text, said):
    path = tmp_path / "prices.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as bad:
        load_price_table(path)
    assert said in bad.value.message and str(path) in bad.value.message
    assert "per_million" in bad.value.hint or "models" in bad.value.hint
    with pytest.raises(UsageError, match="price file not found"):
        load_price_table(tmp_path / "missing.toml")


@pytest.fixture(scope="module")
def smoked_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("ledger") / "traces.db"
    report = run_suite("math", [0, 1, 2, 3], Env(), traces=parse_trace_db(str(path)))
    assert report.errors == 0
    return path, report


def test_stats_sum_the_ledgers_of_every_stored_rollout(smoked_db):
    path, _ = smoked_db
    with open_trace_store(str(path), read_only=True) as store:
        ledgers = [ledger_of(store.get_session(s.session_id))
                   for s in store.list_sessions(limit=None)]
        stats = store.stats()

    expected = CostLedger.total(ledgers)
    got = stats.ledger
    assert (got.rollouts, got.lm_calls, got.input_tokens, got.output_tokens) == (
        4, expected.lm_calls, expected.input_tokens, expected.output_tokens)
    assert got.lm_s == pytest.approx(expected.lm_s) and got.wall_s == pytest.approx(
        expected.wall_s)
    assert got.env_s == pytest.approx(expected.env_s)
    assert expected.input_tokens > 0 and expected.lm_s > 0


def test_traces_stats_shows_the_ledger_and_an_estimate(smoked_db, tmp_path):
    path, _ = smoked_db
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    human = run_cli(tmp_path, "traces", "stats", "--trace-db", str(path), "--prices",
                    str(prices))
    machine = run_cli(tmp_path, "traces", "stats", "--trace-db", str(path), "--json",
                      SYNTH_PRICES=str(prices))

    assert human.returncode == 0, human.stderr
    assert "cost: " in human.stdout and "LM calls" in human.stdout and "est. $" in human.stdout
    data = json.loads(machine.stdout)
    tokens = data["ledger"]["by_model"]["synth-deploy/mock-policy"]
    assert data["cost_estimate"]["usd"] == pytest.approx(
        (tokens["input_tokens"] * 1.0 + tokens["output_tokens"] * 4.0) / 1e6)
    bad = prices.with_name("bad.toml")
    bad.write_text('[models."m"]\ninput_per_million = "free"\n')
    wrong = run_cli(tmp_path, "traces", "stats", "--trace-db", str(path), "--prices", str(bad))
    assert wrong.returncode == 2 and f"{bad}:1" in wrong.stderr


def test_traces_stats_never_prices_an_unpriced_model_at_zero_and_fits_80_columns(smoked_db,
                                                                                 tmp_path):
    path, _ = smoked_db  # the mock model: no LM call records a cost
    other = tmp_path / "other.toml"
    other.write_text('[models."gpt-4o-mini"]\ninput_per_million = 0.15\n'
                     'output_per_million = 0.60\n')
    plain = run_cli(tmp_path, "traces", "stats", "--trace-db", str(path), COLUMNS="80")
    priced = run_cli(tmp_path, "traces", "stats", "--trace-db", str(path), "--prices",
                     other.name, COLUMNS="80")
    machine = run_cli(tmp_path, "traces", "stats", "--trace-db", str(path), "--json")

    for human in (plain, priced):
        assert human.returncode == 0, human.stderr
        assert "$0.0" not in human.stdout and "est. $" not in human.stdout
        cost = human.stdout[human.stdout.index("cost: "):]
        assert all(len(line) <= 80 for line in cost.splitlines()), cost
        assert "wall" in cost and "summed over 4 rollouts" in cost
    assert "no price for synth-deploy/mock-policy in other.toml" in priced.stdout
    assert json.loads(machine.stdout)["cost_usd"] is None


def test_each_sft_example_carries_its_rollouts_ledger(smoked_db, tmp_path):
    path, _ = smoked_db
    out = tmp_path / "sft.jsonl"
    with open_trace_store(str(path), read_only=True) as store:
        export_sft(store, out)
        expected = {s.session_id: ledger_of(store.get_session(s.session_id)).to_dict()
                    for s in store.list_sessions(limit=None)}
        in_memory = [e for sid in expected for e in sft_examples(store.get_session(sid))]

    streamed = [json.loads(line) for line in out.read_text().splitlines()]
    assert streamed and len(streamed) == len(in_memory)
    for example in streamed + in_memory:
        meta = example["metadata"]
        assert meta["ledger"] == expected[meta["session_id"]]


def _session(tokens_in: int, tokens_out: int, latency_ms: float, duration_s: float):
    tracer = SessionTracer(metadata={"duration_s": duration_s})
    tracer.record_lm_call(model_name="m", input_tokens=tokens_in, output_tokens=tokens_out,
                          latency_ms=latency_ms)
    return tracer.finish()


def _ledger(model: str, tokens_in: int, tokens_out: int) -> CostLedger:
    tracer = SessionTracer()
    tracer.record_lm_call(model_name=model, input_tokens=tokens_in, output_tokens=tokens_out)
    return ledger_of(tracer.finish())


def test_sandbox_time_is_the_sandboxes_commands_added_up():
    from synth_deploy.tracing import SessionTracer, ledger_of

    tracer = SessionTracer()
    tracer.record_runtime_event(system_instance_id="sandbox", latency_ms=250.0)
    tracer.record_runtime_event(system_instance_id="sandbox", latency_ms=500.0)
    tracer.record_runtime_event(system_instance_id="other", latency_ms=9000.0)
    ledger = ledger_of(tracer.finish(), wall_s=2.0)
    assert ledger.sandbox_s == pytest.approx(0.75) and ledger.env_s == pytest.approx(2.0)
    again = CostLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert again.sandbox_s == pytest.approx(0.75)
    assert (ledger + ledger).sandbox_s == pytest.approx(1.5)
    assert "sandbox_s" not in CostLedger(rollouts=1).to_dict()  # only where sandboxes ran
