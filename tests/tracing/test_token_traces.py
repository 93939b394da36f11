"""Token-level traces: what a policy server's reply gives (`call_policy` asking as vLLM
reads it), kept packed in a real SQLite trace store, checked for continuity, shown, and
exported one row per episode; the vLLM-shaped and re-rendering stand-ins are real servers
(tests/standins/token_policies.py) and the crafter app plays through them over HTTP."""

from __future__ import annotations

import json
import math
import sqlite3
import struct
import sys
from pathlib import Path

import httpx
import pytest
from standins.scripted_policy import interact, scripted_policy
from standins.token_policies import vllm_policy
from typer.testing import CliRunner

from synth_deploy.cli import app as cli_app
from synth_deploy.runs import ToyTokenizer
from synth_deploy.serving import create_app
from synth_deploy.taskapp.registry import load_app
from synth_deploy.tracing import (
    SCHEMA_VERSION,
    SessionTracer,
    TurnTokens,
    continuity_breaks,
    open_trace_store,
    parse_trace_db,
    session_from_trace,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "apps" / "crafter"))

# Seed 0 (easy), five turns of tool calls.
FIVE_TURNS = [interact("move_up", "move_left"), interact("do"), interact("move_left", "do"),
              interact("move_up", "do"), interact("move_right", "noop")]


def turns_of(*pairs: tuple[list[int], list[int]]) -> list[TurnTokens]:
    return [TurnTokens(p, c, [-0.5] * len(c), model="m") for p, c in pairs]


def test_continuity_names_the_turn_the_position_and_the_ids_lost():
    kept = turns_of(([1, 2], [3]), ([1, 2, 3, 4], [5]), ([1, 2, 3, 4, 5, 6], [7]))
    assert continuity_breaks(kept) == []
    # Turn 3's prompt re-renders turn 2's completion: 2 of the 5 context ids differ.
    broken = turns_of(([1, 2], [3]), ([1, 2, 3, 4], [5]), ([1, 2, 3, 9, 9, 6], [7]))
    [brk] = continuity_breaks(broken)
    assert (brk.turn, brk.position, brk.ids) == (3, 3, 2)
    assert "turn 3" in brk.describe() and "from id 3" in brk.describe()
    # A turn without data is skipped; the next one breaks where its text was.
    gap = [*turns_of(([1, 2], [3])), TurnTokens.absent("no ids"),
           *turns_of(([1, 2, 3, 4, 8, 8], [5]))]
    assert [(b.turn, b.position) for b in continuity_breaks(gap)] == []
    gap[2].prompt_ids = [1, 2, 8]
    assert [(b.turn, b.position, b.ids) for b in continuity_breaks(gap)] == [(2, 2, 1)]


def _session(turns: list[TurnTokens], **meta) -> object:
    tracer = SessionTracer(metadata={"app_id": "toy", "status": "ok", **meta})
    for i, turn in enumerate(turns):
        tracer.start_timestep(f"turn-{i}", turn_number=i)
        tracer.record_lm_call(model_name="m", tokens=turn)
        tracer.record_environment_event(reward=float(i))
    tracer.record_outcome_reward(3.0)
    return tracer.finish()


def test_the_store_keeps_each_prompt_as_what_it_adds_and_reads_it_back_whole(tmp_path):
    turns = turns_of(([1, 2, 3], [10, 11]), ([1, 2, 3, 10, 11, 4], [12]),
                     ([1, 2, 3, 10, 11, 4, 12, 5, 6], [13, 14]))
    turns[0].completion_logprobs = [-0.1, -2.5]  # -0.1 is not a float32: kept as one
    absent = TurnTokens.absent("the policy server returned no prompt_token_ids", model="m")
    session = _session([*turns, absent])
    path = tmp_path / "t.db"
    with open_trace_store(parse_trace_db(str(path))) as store:
        store.write_sessions_sync([session])
        store.write_sessions_sync([session])  # the same session again: stored once, no conflict
        back = store.get_session(session.session_id).turn_tokens
    assert [t.prompt_ids for t in back[:3]] == [t.prompt_ids for t in turns]
    assert [t.completion_ids for t in back[:3]] == [t.completion_ids for t in turns]
    assert back[0].completion_logprobs == pytest.approx([-0.1, -2.5], rel=1e-7)
    assert back[0].completion_logprobs[0] != -0.1 and back[1].completion_logprobs == [-0.5]
    assert back[3] == absent
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT prompt_shared, length(prompt_rest), length(completion_ids), "
                          "length(completion_logprobs), diverged_at FROM lm_call_tokens "
                          "ORDER BY event_id").fetchall()
    # Each prompt stored as the ids it shares with the turn before (a count) and the rest.
    assert rows == [(0, 12, 8, 8, None), (5, 4, 4, 4, None), (7, 8, 8, 8, None),
                    (0, None, None, None, None)]


def test_the_writer_child_stores_what_it_is_sent_and_a_rewrite_is_no_conflict(tmp_path):
    import asyncio

    from trace_files import ready_writer_child

    sessions = [_session(turns_of(([1, 2, 3], [10 + i, 11]), ([1, 2, 3, 10 + i, 11, 4], [12]),
                                  ([1, 2, 7], [13])), run_id=f"r{i}") for i in range(20)]
    with open_trace_store(parse_trace_db(str(tmp_path / "t.db"))) as store:
        async def main():
            await ready_writer_child(store)  # the child commits, not the store's thread
            await asyncio.gather(*(store.write_session(s) for s in sessions))
            await store.write_session(sessions[3])  # the same again: stored once

        asyncio.run(main())
        for s in sessions:
            back = store.get_session(s.session_id).turn_tokens
            assert [t.prompt_ids for t in back] == [t.prompt_ids for t in s.turn_tokens]
            assert [t.completion_logprobs for t in back] == [[-0.5] * 2, [-0.5], [-0.5]]
            assert [(b.turn, b.position) for b in continuity_breaks(back)] == [(3, 2)]


def test_a_divergence_is_stored_where_sql_can_count_it(tmp_path):
    session = _session(turns_of(([1, 2], [3]), ([1, 2, 9, 4], [5])))
    path = tmp_path / "t.db"
    with open_trace_store(parse_trace_db(str(path))) as store:
        store.write_sessions_sync([session])
        assert continuity_breaks(store.get_session(session.session_id).turn_tokens)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT diverged_at, diverged_ids FROM lm_call_tokens WHERE "
                          "diverged_at IS NOT NULL").fetchall() == [(2, 1)]


def test_a_version_8_store_gains_the_token_table_when_opened(tmp_path):
    path = tmp_path / "old.db"
    with open_trace_store(parse_trace_db(str(path))) as store:
        store.write_sessions_sync([_session([])])
    with sqlite3.connect(path) as db:  # as version 8 left it
        db.execute("DROP TABLE lm_call_tokens")
        db.execute("DELETE FROM synth_deploy_schema WHERE version >= 9")
    with open_trace_store(parse_trace_db(str(path))) as store:
        assert store.schema_version == SCHEMA_VERSION
        session = _session(turns_of(([1], [2])))
        store.write_sessions_sync([session])
        assert store.get_session(session.session_id).turn_tokens[0].completion_ids == [2]


def test_a_returned_trace_with_bad_token_ids_is_refused_with_the_field(tmp_path):
    trace = _session(turns_of(([1, 2], [3]))).to_dict()
    assert session_from_trace(trace).turn_tokens[0].prompt_ids == [1, 2]
    trace["event_history"][0]["tokens"]["prompt_ids"] = [1, -2]
    for step in trace["session_time_steps"]:
        for event in step["events"]:
            if event.get("tokens"):
                event["tokens"]["prompt_ids"] = [1, -2]
    from synth_deploy.tracing import TraceFormatError

    with pytest.raises(TraceFormatError, match="prompt_ids is not an array of token ids"):
        session_from_trace(trace)


# -- through a served app ------------------------------------------------------------------

@pytest.fixture
def crafter_traced(serve, api_key, tmp_path):
    db = tmp_path / "traces.db"
    store = open_trace_store(parse_trace_db(str(db)))
    server = serve(create_app(load_app("crafter").build_config(), api_keys=[api_key],
                              trace_store=store))
    yield server, db
    store.close()


def play(server, api_key, inference_url, *, capture=True, turns=5, **env):
    config = {"model": "Qwen/Qwen3-0.6B", "inference_url": inference_url}
    if capture is not None:
        config["capture_tokens"] = capture
    resp = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=120,
                      json={"run_id": "tokens-0", "env": {"seed": 0, "config": {
                          "max_turns": turns, "history_turns": turns, **env}},
                            "policy": {"policy_name": "t", "config": config},
                            "record": {"return_trace": True}})
    assert resp.status_code == 200, resp.text
    return resp.json()


def export(db: Path, out: Path, *args: str) -> dict:
    result = CliRunner().invoke(cli_app, ["traces", "export", "--format", "tokens", "--out",
                                          str(out), "--trace-db", str(db), "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_five_crafter_turns_through_vllm_export_the_ids_it_sent_and_load_in_datasets(
        serve, crafter_traced, api_key, tmp_path):
    policy = serve(vllm_policy(FIVE_TURNS))
    server, db = crafter_traced
    body = play(server, api_key, policy.url + "/v1")
    asked = policy.app.state.requests
    assert len(asked) == 5 and all(b["return_token_ids"] and b["logprobs"] for b in asked)
    sent = policy.app.state.sent
    out = tmp_path / "tokens.jsonl"
    result = export(db, out)
    assert result["episodes"] == 1 and result["skipped"] == {}
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    # The ids are exactly those the server returned: its prompts and its completions.
    expected: list[int] = []
    for prompt, completion, _ in sent:
        assert prompt[:len(expected)] == expected
        expected = prompt + completion
    assert row["input_ids"] == expected  # 0 re-tokenized ids
    sampled = [i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
    assert sampled == [i for _, completion, _ in sent for i in completion]
    logprobs = [lp for lp, m in zip(row["logprobs"], row["loss_mask"], strict=True) if m]
    assert logprobs == [lp for _, _, lps in sent for lp in lps]  # as many as sampled
    assert len(row["turns"]) == 5 and row["turns"][-1][2] == len(row["input_ids"])
    assert row["session_id"] == body["trace"]["session_id"] and row["seed"] == 0
    assert len(row["turn_rewards"]) == 5 and row["reward"] is not None
    # The trace the rollout returned carries the same token data.
    returned = session_from_trace(body["trace"]).turn_tokens
    assert [t.completion_ids for t in returned] == [c for _, c, _ in sent]

    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset("json", data_files=str(out), split="train")
    assert loaded.num_rows == 1
    for r in loaded:
        assert len(r["input_ids"]) == len(r["loss_mask"]) == len(r["logprobs"]) > 0
        assert r["input_ids"] == expected


def test_a_template_that_re_renders_history_is_flagged_with_the_turn(
        serve, crafter_traced, api_key, tmp_path):
    policy = serve(vllm_policy(FIVE_TURNS, re_render=True))
    server, db = crafter_traced
    body = play(server, api_key, policy.url + "/v1")
    sid = body["trace"]["session_id"]
    shown = CliRunner().invoke(cli_app, ["traces", "show", sid, "--trace-db", str(db)],
                               terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "continuity broke at turn 2" in shown.stdout
    assert "turn 2: its prompt re-tokenizes the conversation" in shown.stdout
    as_json = json.loads(CliRunner().invoke(cli_app, ["traces", "show", sid, "--trace-db",
                                                      str(db), "--json"]).stdout)
    summary = as_json["token_summary"]
    first_prompt, first_completion, _ = policy.app.state.sent[0]
    assert summary["breaks"][0] == {"turn": 2, "position": len(first_prompt),
                                    "ids": len(first_completion)}
    assert len(summary["breaks"]) == 4 and not summary["continuous"]
    # Exported all the same: each break starts a new sample with its own mask.
    out = tmp_path / "tokens.jsonl"
    result = export(db, out)
    assert result["episodes"] == 1 and result["rows"] == 5 and result["skipped"] == {}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["segment"], r["segments"]) for r in rows] == [(i, 5) for i in range(5)]
    for row, (prompt, completion, logprobs) in zip(rows, policy.app.state.sent, strict=True):
        assert row["input_ids"] == prompt + completion  # each sample as the policy saw it
        assert row["loss_mask"] == [0] * len(prompt) + [1] * len(completion)
        assert row["logprobs"][len(prompt):] == logprobs and len(row["turn_rewards"]) == 1
    assert {r["session_id"] for r in rows} == {sid}


def test_a_server_that_ignores_the_fields_still_plays_and_says_why_there_are_no_ids(
        serve, crafter_traced, api_key, tmp_path):
    policy = serve(scripted_policy(FIVE_TURNS))
    server, db = crafter_traced
    body = play(server, api_key, policy.url + "/v1", turns=2)
    turns = session_from_trace(body["trace"]).turn_tokens
    assert len(turns) == 2 and not any(t.observed for t in turns)
    assert "returned no prompt_token_ids or choices[0].token_ids" in turns[0].absent_reason
    shown = CliRunner().invoke(cli_app, ["traces", "show", body["trace"]["session_id"],
                                         "--trace-db", str(db)], terminal_width=200)
    assert "0 of 2 LM call(s) with token ids" in shown.stdout
    assert "no token data: the policy server returned no" in shown.stdout
    result = export(db, tmp_path / "t.jsonl")
    assert result["skipped"] == {"no token data": 1}


def test_without_capture_asked_nothing_is_requested_or_kept(serve, crafter_traced, api_key,
                                                            tmp_path):
    policy = serve(vllm_policy(FIVE_TURNS))
    server, db = crafter_traced
    body = play(server, api_key, policy.url + "/v1", capture=None, turns=1)
    [asked] = policy.app.state.requests
    assert "return_token_ids" not in asked and "logprobs" not in asked
    assert session_from_trace(body["trace"]).turn_tokens == []
    # The export names why it wrote nothing: no ids were asked for, not the filters.
    result = export(db, tmp_path / "t.jsonl")
    assert result["episodes"] == 0 and result["skipped"] == {"no token ids asked for": 1}
    assert "capture_tokens" in result["note"] and "filters" not in result["note"]
    assert "passes the filters" in export(db, tmp_path / "u.jsonl", "--app", "nope")["note"]


def test_the_mock_policy_answers_in_vllms_shape_with_continuity_kept(
        serve, mock_policy, crafter_traced, api_key, tmp_path):
    server, db = crafter_traced
    play(server, api_key, mock_policy.url + "/v1", turns=4)
    result = export(db, tmp_path / "mock.jsonl")
    assert result["episodes"] == 1 and result["sampled_tokens"] > 0
    [row] = [json.loads(line) for line in (tmp_path / "mock.jsonl").read_text().splitlines()]
    assert all(0 <= i < ToyTokenizer.VOCAB_SIZE for i in row["input_ids"])
    sampled = [lp for lp, m in zip(row["logprobs"], row["loss_mask"], strict=True) if m]
    assert len(sampled) == result["sampled_tokens"] and all(-1 <= lp < 0 for lp in sampled)
    # Deterministic: the same episode again gives the same ids and logprobs.
    play(server, api_key, mock_policy.url + "/v1", turns=4)
    export(db, tmp_path / "again.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "again.jsonl").read_text().splitlines()]
    assert [r["input_ids"] for r in rows] == [row["input_ids"]] * 2
    assert [r["logprobs"] for r in rows] == [row["logprobs"]] * 2


def test_smoke_crafter_then_the_token_export_writes_continuous_samples(tmp_path):
    """Crafter's history window makes later prompts drop early turns (by design): its
    episodes export as samples cut where a prompt stops extending the last."""
    from processes import run_cli

    from synth_deploy.tracing import TurnTokens, continuity_breaks

    smoked = run_cli(tmp_path, "smoke", "crafter", "--seeds", "0-1", "--json", timeout=300)
    assert smoked.returncode == 0, smoked.stderr
    db = tmp_path / "traces" / "v3" / "synth_ai.db"
    out = tmp_path / "crafter.jsonl"
    result = export(db, out)
    assert result["episodes"] == 2 and result["skipped"] == {}, result
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == result["rows"] > 2  # the window broke continuity: several samples
    for row in rows:
        turns = [TurnTokens(row["input_ids"][:start_c], row["input_ids"][start_c:end],
                            row["logprobs"][start_c:end]) for _, start_c, end in row["turns"]]
        assert turns and continuity_breaks(turns) == [], (row["session_id"], row["segment"])
        assert len(row["input_ids"]) == len(row["loss_mask"]) == len(row["logprobs"])
        assert row["turns"][-1][2] == len(row["input_ids"])
    by_session: dict[str, list[int]] = {}
    for row in rows:
        by_session.setdefault(row["session_id"], []).append(row["segment"])
    assert all(s == list(range(len(s))) for s in by_session.values())
    import sqlite3

    with sqlite3.connect(db) as conn:  # every LM call of both episodes is in some sample
        calls = conn.execute("SELECT COUNT(*) FROM lm_call_tokens").fetchone()[0]
    assert sum(len(r["turns"]) for r in rows) == calls >= 80


# -- rehearse ------------------------------------------------------------------------------

CRAFTER_RL = Path(__file__).resolve().parents[2] / "apps" / "crafter" / "configs" / "rl.toml"


def crafter_config(tmp_path: Path) -> Path:
    """The crafter RL config: 4 rollouts of 5 turns a step, asking for token ids."""
    text = CRAFTER_RL.read_text()
    for old, new in (("episodes_per_batch = 32", "episodes_per_batch = 4"),
                     ("max_concurrent_rollouts = 8", "max_concurrent_rollouts = 4"),
                     ("group_size = 4", "group_size = 2"),
                     ("max_turns = 10, max_actions_per_turn = 5, history_turns = 3",
                      "max_turns = 5, max_actions_per_turn = 5, history_turns = 5")):
        assert old in text, old
        text = text.replace(old, new)
    text = text.replace("[rollout]\n", "[rollout]\npolicy_config = { capture_tokens = true }\n")
    path = tmp_path / "rl.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("re_render", [False, True])
def test_rehearse_flags_a_template_that_breaks_continuity(serve, tmp_path, re_render):
    from synth_deploy.env import Env
    from synth_deploy.runs import PolicyTarget, RehearsalOptions, rehearse
    from synth_deploy.train import load_config

    policy = serve(vllm_policy(FIVE_TURNS, re_render=re_render))
    report = rehearse(load_config(crafter_config(tmp_path)), "crafter", Env(),
                      RehearsalOptions(skip=frozenset({"determinism", "capacity", "idle"})),
                      policy=PolicyTarget(policy.url + "/v1", "Qwen/Qwen3-0.6B", None))
    check = {c.name: c for c in report.checks}["token continuity"]
    assert check.data["rollouts"] == 4 and check.data["sampled"] > 0
    if not re_render:
        assert check.verdict == "pass" and check.data["broken"] == 0, check
        return
    assert check.verdict == "warn" and check.data["broken"] == 4
    assert all(b["turn"] == 2 for b in check.data["breaks"])
    assert "turn 2: its prompt re-tokenizes" in check.details[0]
    assert "re-renders history" in check.fix and "new sample" in check.fix


def _ids_as_text(answer):
    answer["prompt_token_ids"] = [str(i) for i in answer["prompt_token_ids"]]


def _one_logprob_short(answer):
    answer["choices"][0]["logprobs"]["content"].pop()


def _no_logprobs(answer):
    answer["choices"][0]["logprobs"] = None


@pytest.mark.parametrize(("alter", "observed", "reason", "skipped"), [
    (_ids_as_text, False, "prompt_token_ids is not an array of token ids", "no token data"),
    (_one_logprob_short, True, "logprobs not kept: the policy server's completion_logprobs "
                               "has", "no logprobs"),
    (_no_logprobs, True, "returned no choices[0].logprobs.content", "no logprobs"),
])
def test_token_data_of_the_wrong_shape_is_recorded_as_missing_and_the_rollout_plays(
        serve, crafter_traced, api_key, tmp_path, alter, observed, reason, skipped):
    policy = serve(vllm_policy(FIVE_TURNS, alter=alter))
    server, db = crafter_traced
    body = play(server, api_key, policy.url + "/v1", turns=2)
    turns = session_from_trace(body["trace"]).turn_tokens
    assert [t.observed for t in turns] == [observed] * 2
    assert reason in turns[0].absent_reason and not turns[0].completion_logprobs
    result = export(db, tmp_path / "t.jsonl")
    assert result["episodes"] == 0 and result["skipped"] == {skipped: 1}


@pytest.mark.parametrize(("stored", "kept"), [
    ([-0.5, -2.0], True), ([0.0, -0.0], True), ([-0.5, float("nan")], False),
    ([-0.5, float("-inf")], False), ([-0.5, float("inf")], False), ([-0.5, 1e-30], False),
    ([-0.5, 3.0], False), ([-0.5, -1e300], False)])
def test_stored_logprobs_are_read_back_only_as_log_probabilities(tmp_path, stored, kept):
    # What an older kit stored unchecked (a TurnTokens made in Python is not checked either)
    # is read back as "no logprobs", with the reason.
    session = _session([TurnTokens([1, 2], [3, 4], stored, model="m")])
    with open_trace_store(parse_trace_db(str(tmp_path / "t.db"))) as store:
        store.write_sessions_sync([session])
        [turn] = store.get_session(session.session_id).turn_tokens
    assert turn.observed and turn.completion_ids == [3, 4]
    if kept:
        assert turn.completion_logprobs == pytest.approx(stored) and not turn.absent_reason
    else:
        assert turn.completion_logprobs == []
        assert turn.absent_reason.startswith(
            "logprobs not kept: the stored completion_logprobs[1] is ")


HOSTILE = "@hostile-logprob@"


def _first_session(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT e.session_id FROM events e JOIN lm_call_tokens t ON "
                            "t.event_id = e.id ORDER BY t.event_id").fetchone()[0]


def _strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


# What a broken or hostile policy server may write for a logprob, as its JSON's own text:
# beyond a double (1e400 reads as infinity; as an integer, no float holds it), not numbers,
# positive, beyond a float32.
@pytest.mark.parametrize("text", ["1e400", "-1e400", "1" + "0" * 400, "-1" + "0" * 400, "NaN",
                                  "Infinity", "-Infinity", "1e6", "1e308", "0.5", "-1e300"])
def test_a_logprob_that_is_not_a_finite_number_at_most_zero_is_no_token_data(
        serve, crafter_traced, api_key, tmp_path, text):
    def alter(answer):
        answer["choices"][0]["logprobs"]["content"][1]["logprob"] = HOSTILE

    def encode(answer):
        return json.dumps(answer).replace(f'"{HOSTILE}"', text).encode()

    policy = serve(vllm_policy(FIVE_TURNS, alter=alter, encode=encode))
    server, db = crafter_traced
    body = play(server, api_key, policy.url + "/v1", turns=2)  # 200, not 500
    turns = session_from_trace(body["trace"]).turn_tokens
    assert [t.observed for t in turns] == [True, True]
    assert all(not t.completion_logprobs for t in turns)
    assert "logprobs not kept: the policy server's completion_logprobs[1] is" in \
        turns[0].absent_reason
    play(server, api_key, serve(vllm_policy(FIVE_TURNS)).url + "/v1", turns=2)  # a good one
    out = tmp_path / "t.jsonl"
    result = export(db, out)
    assert result["episodes"] == 1 and result["skipped"] == {"no logprobs": 1}
    [row] = [_strict_json(line) for line in out.read_text().splitlines()]
    assert all(math.isfinite(lp) and lp <= 0 for lp in row["logprobs"])


@pytest.mark.parametrize("text", ["1" + "0" * 400, "1e400", "NaN", "-5"])
def test_a_usage_count_that_is_no_count_is_recorded_as_none(
        serve, crafter_traced, api_key, tmp_path, text):
    # Once a 500: int() of infinity or NaN, or an integer SQLite cannot hold.
    def alter(answer):
        answer["usage"]["prompt_tokens"] = HOSTILE

    def encode(answer):
        return json.dumps(answer).replace(f'"{HOSTILE}"', text).encode()

    policy = serve(vllm_policy(FIVE_TURNS, alter=alter, encode=encode))
    server, db = crafter_traced
    body = play(server, api_key, policy.url + "/v1", turns=2)  # 200, not 500
    calls = [e for e in session_from_trace(body["trace"]).events if e.event_type == "cais"]
    assert len(calls) == 2 and all(e.input_tokens is None for e in calls)
    assert all(e.output_tokens and e.usage["prompt_tokens"] is None for e in calls)
    stats = CliRunner().invoke(cli_app, ["traces", "stats", "--trace-db", str(db), "--json"])
    assert stats.exit_code == 0, stats.output
    assert _strict_json(stats.stdout)["sessions"] == 1


def test_the_token_export_is_strict_json_even_from_a_store_written_before_the_check(
        serve, crafter_traced, api_key, tmp_path):
    policy = serve(vllm_policy(FIVE_TURNS))
    server, db = crafter_traced
    play(server, api_key, policy.url + "/v1", turns=2)
    play(server, api_key, policy.url + "/v1", turns=2)
    # An older kit stored whatever the server sent: one session's logprob is infinite.
    with sqlite3.connect(db) as conn:
        (event_id, packed), *_ = conn.execute(
            "SELECT event_id, completion_logprobs FROM lm_call_tokens ORDER BY event_id")
        conn.execute("UPDATE lm_call_tokens SET completion_logprobs = ? WHERE event_id = ?",
                     (struct.pack("<f", float("inf")) + packed[4:], event_id))
        conn.execute("UPDATE session_traces SET total_reward = 9e999")  # reads as infinity
    out = tmp_path / "t.jsonl"
    result = export(db, out)
    assert result["episodes"] == 1 and result["skipped"] == {"no logprobs": 1}
    [row] = [_strict_json(line) for line in out.read_text().splitlines()]
    assert all(math.isfinite(lp) and lp <= 0 for lp in row["logprobs"])
    assert row["reward"] is None  # JSON has no spelling for it
    shown = CliRunner().invoke(cli_app, ["traces", "show", "--trace-db", str(db), "--json",
                                         _first_session(db)])
    assert "logprobs not kept: the stored completion_logprobs[0] is inf" in shown.stdout


def test_the_viewer_shows_each_calls_ids_and_logprobs_and_where_continuity_broke(
        serve, crafter_traced, api_key):
    from synth_deploy.viewer import create_viewer_app

    policy = serve(vllm_policy(FIVE_TURNS[:3], re_render=True))
    server, db = crafter_traced
    sid = play(server, api_key, policy.url + "/v1", turns=3)["trace"]["session_id"]
    with open_trace_store(str(db), read_only=True) as store:
        viewer = serve(create_viewer_app(store))
        data = httpx.get(f"{viewer.url}/api/sessions/{sid}", timeout=30).json()
    assert data["token_summary"]["breaks"][0]["turn"] == 2
    calls = [c["tokens"] for t in data["turns"] for c in t["lm_calls"]]
    sent = policy.app.state.sent
    assert [c["completion_ids"] for c in calls] == [c for _, c, _ in sent]
    assert [c["completion_logprobs"] for c in calls] == [lp for _, _, lp in sent]
    assert [c["break"] is not None for c in calls] == [False, True, True]
    first_prompt = sent[0][0]
    assert calls[1]["break"]["position"] == len(first_prompt)
    # The ids shown start a few before the break, as the prompt holds them.
    start = calls[1]["prompt_from"]
    assert calls[1]["prompt_ids"] == sent[1][0][start:]


def test_an_app_may_default_capture_on_and_a_rollout_turn_it_off(serve, api_key):
    import dataclasses

    config = dataclasses.replace(load_app("crafter").build_config(), capture_tokens=True)
    server = serve(create_app(config, api_keys=[api_key]))
    policy = serve(vllm_policy(FIVE_TURNS))
    on = play(server, api_key, policy.url + "/v1", capture=None, turns=1)
    off = play(server, api_key, policy.url + "/v1", capture=False, turns=1)
    first, second = policy.app.state.requests
    assert first["return_token_ids"] is True and "return_token_ids" not in second
    assert session_from_trace(on["trace"]).turn_tokens[0].observed
    assert session_from_trace(off["trace"]).turn_tokens == []


def test_a_server_that_refuses_the_fields_is_asked_again_without_them(
        serve, crafter_traced, api_key):
    policy = serve(vllm_policy(FIVE_TURNS, strict=True))
    server, _ = crafter_traced
    body = play(server, api_key, policy.url + "/v1", turns=2)
    asked = policy.app.state.requests
    assert len(asked) == 4 and [("return_token_ids" in b) for b in asked] == [True, False] * 2
    turns = session_from_trace(body["trace"]).turn_tokens
    assert [t.observed for t in turns] == [False, False]
    assert "refused logprobs and return_token_ids (HTTP 400)" in turns[0].absent_reason


def test_a_remote_libsql_store_keeps_token_data_too(tmp_path):
    pytest.importorskip("libsql")
    from standins.libsql_hrana import start_hrana_process

    from synth_deploy.env import Env

    token = "turso-test-token-" + "y" * 24
    proc, url = start_hrana_process(str(tmp_path / "remote.db"), token=token)
    try:
        turns = turns_of(([1, 2, 3], [10, 11]), ([1, 2, 3, 10, 11, 4], [12]),
                         ([1, 2, 9], [13]))
        session = _session(turns)
        env = Env({"TURSO_AUTH_TOKEN": token}, {"TURSO_AUTH_TOKEN": "environment"})
        with open_trace_store(parse_trace_db(url, env=env)) as store:
            assert store.setting.is_remote
            store.write_sessions_sync([session])
            back = store.get_session(session.session_id).turn_tokens
        assert [t.prompt_ids for t in back] == [t.prompt_ids for t in turns]
        assert [(b.turn, b.position) for b in continuity_breaks(back)] == [(3, 2)]
    finally:
        proc.kill()
        proc.wait(10)


def test_a_capture_setting_that_is_not_a_boolean_is_refused_naming_the_field(
        serve, crafter_traced, api_key):
    policy = serve(vllm_policy(FIVE_TURNS))
    server, _ = crafter_traced
    resp = httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=60,
                      json={"run_id": "bad", "env": {"seed": 0, "config": {"max_turns": 1}},
                            "policy": {"policy_name": "t", "config": {
                                "model": "m", "inference_url": policy.url + "/v1",
                                "capture_tokens": "yes"}}})
    assert resp.status_code == 422, resp.text  # as every invalid_policy_config
    assert "policy.config.capture_tokens must be true or false, got 'yes'" in resp.text
    assert policy.app.state.requests == []


def test_crafters_history_window_breaks_continuity_where_it_drops_the_oldest_turn(
        serve, crafter_traced, api_key):
    policy = serve(vllm_policy(FIVE_TURNS))
    server, _ = crafter_traced
    body = play(server, api_key, policy.url + "/v1", turns=4, history_turns=2)
    breaks = continuity_breaks(session_from_trace(body["trace"]).turn_tokens)
    # Turns 2 and 3 see every earlier turn; turn 4 sees turns 2 and 3 only.
    assert [b.turn for b in breaks] == [4]
