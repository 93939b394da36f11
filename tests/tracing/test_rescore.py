"""`traces rescore`: an app's current scorer applied to stored rollouts, each result a new
reward version beside the original, which the exports, `traces show` and the viewer choose."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import textwrap
from pathlib import Path

import httpx
import pytest
from processes import refused_in_process, run_cli
from rollouts import fire, rollout_body

from synth_deploy.errors import UsageError
from synth_deploy.serving import create_app
from synth_deploy.taskapp import TaskApp
from synth_deploy.tracing import SCHEMA_VERSION, open_trace_store

MATH = Path(__file__).resolve().parents[2] / "apps" / "math"
# Math's scorer changed: a tagged answer earns a quarter even when it is wrong.
OLD_RULE = "    return float(parse_answer(str(replies[-1])).value == problem.answer)\n"
NEW_RULE = ("    parsed = parse_answer(str(replies[-1]))\n"
            "    return 0.75 * (parsed.value == problem.answer) + 0.25 * parsed.well_formatted\n")


def recorded(db: Path) -> tuple[list, list]:
    """Every session's recorded reward and every outcome reward row, as stored."""
    with sqlite3.connect(db) as conn:
        sessions = conn.execute("SELECT session_id, total_reward, metadata FROM session_traces "
                                "ORDER BY session_id").fetchall()
        outcomes = conn.execute("SELECT * FROM outcome_rewards ORDER BY id").fetchall()
    return sessions, outcomes


def changed_math(folder: Path) -> Path:
    """A copy of the math app under ``folder``/apps (found before the bundled one) whose
    scorer follows the new rule."""
    copy = folder / "apps" / "math"
    shutil.copytree(MATH, copy, ignore=shutil.ignore_patterns("__pycache__"))
    source = (copy / "task_app.py").read_text()
    assert OLD_RULE in source
    (copy / "task_app.py").write_text(source.replace(OLD_RULE, NEW_RULE))
    return copy


def test_a_changed_scorer_gives_a_hundred_stored_rollouts_a_new_version(
        tmp_path, serve, math_config, api_key, mock_policy):
    db = tmp_path / "traces.db"
    with open_trace_store(str(db)) as store:
        server = serve(create_app(math_config, api_keys=[api_key], trace_store=store))
        bodies = [rollout_body(f"run-{seed}", seed, mock_policy.url + "/v1")
                  for seed in range(100)]
        for body in bodies:  # token ids too, for the token export
            body["policy"]["config"]["capture_tokens"] = True
        assert {status for _, status in asyncio.run(fire(server.url, api_key, bodies))} \
            == {200}
    before = recorded(db)
    assert len(before[0]) == 100
    original = {sid: reward for sid, reward, _ in before[0]}
    assert set(original.values()) == {0.0, 1.0}  # the mock is wrong now and then

    app = changed_math(tmp_path)
    done = run_cli(tmp_path, "traces", "rescore", "math", "--trace-db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # The version is named by the changed code, and says which scorer gave it.
    from synth_deploy.taskapp.registry import app_identity

    digest = app_identity(app / "task_app.py", version="1").digest
    assert digest != math_config.identity.digest
    assert result["version"] == digest
    assert result["scorer"] == {"app_id": "math", "app_version": "1", "app_digest": digest,
                                "function": "task_app.py:score", "stateless": True}
    assert (result["matched"], result["rescored"], result["unscored_count"],
            result["replaced"]) == (100, 100, 0, 0)

    # The originals are as they were, byte for byte.
    assert recorded(db) == before
    # Each new reward is what the new rule gives: every mock reply is tagged, so a quarter
    # more than the recorded correctness, three quarters of it.
    with sqlite3.connect(db) as conn:
        versions = dict(conn.execute("SELECT session_id, reward FROM reward_versions WHERE "
                                     "version = ?", (digest,)).fetchall())
    assert versions == {sid: 0.75 * reward + 0.25 for sid, reward in original.items()}
    wrong = sum(reward == 0.0 for reward in original.values())  # right stays 1.0
    assert result["changed"] == wrong and result["unchanged"] == 100 - wrong
    assert result["mean_before"] == sum(original.values()) / 100
    assert abs(result["mean_after"] - sum(versions.values()) / 100) < 1e-9

    # The SFT export with the new version keeps exactly the sessions whose new reward passes.
    out = tmp_path / "sft.jsonl"
    exported = run_cli(tmp_path, "traces", "export", "--trace-db", str(db), "--out", str(out),
                       "--reward-version", digest, "--min-reward", "0.25", "--json")
    assert exported.returncode == 0, exported.stderr
    examples = [json.loads(line) for line in out.read_text().splitlines()]
    kept = {e["metadata"]["session_id"] for e in examples}
    assert kept == {sid for sid, reward in versions.items() if reward >= 0.25}
    assert kept != {sid for sid, reward in original.items() if reward >= 0.25}  # it tells
    assert all(e["metadata"]["reward"] == versions[e["metadata"]["session_id"]]
               and e["metadata"]["reward_version"] == digest for e in examples)
    strict = tmp_path / "strict.jsonl"
    assert run_cli(tmp_path, "traces", "export", "--trace-db", str(db), "--out", str(strict),
                   "--reward-version", digest, "--min-reward", "1").returncode == 0
    assert {json.loads(line)["metadata"]["session_id"] for line in
            strict.read_text().splitlines()} == {s for s, r in versions.items() if r >= 1}

    tokens = tmp_path / "tokens.jsonl"
    assert run_cli(tmp_path, "traces", "export", "--format", "tokens", "--trace-db", str(db),
                   "--out", str(tokens), "--reward-version", digest, "--min-reward",
                   "0.25").returncode == 0
    rows = [json.loads(line) for line in tokens.read_text().splitlines()]
    assert {r["session_id"]: (r["reward"], r["reward_version"]) for r in rows} == {
        s: (r, digest) for s, r in versions.items() if r >= 0.25}
    otlp = run_cli(tmp_path, "traces", "export", "--format", "otlp", "--trace-db", str(db),
                   "--endpoint", "http://127.0.0.1:9", "--reward-version", digest)
    assert otlp.returncode == 2 and "spans carry the reward each rollout recorded" in \
        otlp.stderr

    # `traces show` lists the versions and shows the one chosen.
    sid = next(s for s, r in original.items() if r == 0.0)
    shown = refused_in_process(tmp_path, "traces", "show", sid, "--trace-db", str(db),
                               "--reward-version", digest, "--json")
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert data["reward"] == {"version": digest, "reward": 0.25}
    assert [(v["version"], v["reward"]) for v in data["reward_versions"]] == [(digest, 0.25)]
    text = refused_in_process(tmp_path, "traces", "show", sid, "--trace-db", str(db))
    assert "reward shown: 0 (original)" in text.stdout and f"version {digest}" in text.stdout
    missing = refused_in_process(tmp_path, "traces", "show", sid, "--trace-db", str(db),
                                 "--reward-version", "nope")
    assert missing.exit_code == 2 and f"it has: {digest}" in missing.output

    # The viewer chooses a version too: its rows, filter and export read that reward.
    with open_trace_store(str(db), read_only=True) as store:
        from synth_deploy.viewer import create_viewer_app

        viewer = serve(create_viewer_app(store))
        page = httpx.get(viewer.url + "/api/sessions", timeout=30, params={
            "reward_version": digest, "min_reward": "0.25", "limit": "500"}).json()
        assert {r["session_id"]: r["total_reward"] for r in page["rows"]} == {
            s: r for s, r in versions.items() if r >= 0.25}
        assert {r["reward_version"] for r in page["rows"]} == {digest}
        choices = httpx.get(viewer.url + "/api/choices", timeout=30).json()
        assert choices["reward_version"] == ["original", digest]
        replay = httpx.get(viewer.url + f"/api/sessions/{sid}", timeout=30).json()
        assert [v["version"] for v in replay["reward_versions"]] == [digest]

    # Rescoring with the same code again replaces that version; the originals still stand.
    again = json.loads(run_cli(tmp_path, "traces", "rescore", "math", "--trace-db", str(db),
                               "--json").stdout)
    assert (again["rescored"], again["replaced"], again["changed"]) == (100, 100, wrong)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM reward_versions").fetchone() == (100,)
    assert recorded(db) == before


STATEFUL_APP = '''
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("stateful", name="Stateful", description="Scores from a world it keeps.")


@task_app.rollout
async def rollout(request, ctx):
    ctx.tracer.record_outcome_reward(1.0)


@task_app.scorer(stateless=False, reason="the reward reads the final board, not traced")
def score(session):
    return 0.5 if session.metadata.get("seed", 0) % 2 else None
'''


def test_a_stateful_scorer_is_refused_unless_forced_and_unscored_sessions_say_why(
        tmp_path, serve, api_key):
    from synth_deploy.taskapp.registry import load_app

    app = tmp_path / "stateful" / "task_app.py"
    app.parent.mkdir()
    app.write_text(textwrap.dedent(STATEFUL_APP))
    db = tmp_path / "traces.db"
    with open_trace_store(str(db)) as store:
        server = serve(create_app(load_app(str(app)).build_config(), api_keys=[api_key],
                                  trace_store=store))
        for seed in range(4):
            assert httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key},
                              json={"run_id": f"r{seed}", "env": {"seed": seed},
                                    "policy": {"config": {}}}, timeout=30).status_code == 200
    refused = refused_in_process(tmp_path, "traces", "rescore", str(app), "--trace-db",
                                 str(db))
    assert refused.exit_code == 2
    assert "the reward reads the final board, not traced" in refused.output
    assert "--force" in refused.output
    with sqlite3.connect(db) as conn:  # nothing written
        assert conn.execute("SELECT COUNT(*) FROM reward_versions").fetchone() == (0,)
    forced = refused_in_process(tmp_path, "traces", "rescore", str(app), "--trace-db",
                                str(db), "--force", "--as", "board-v2", "--json")
    assert forced.exit_code == 0, forced.output
    result = json.loads(forced.stdout)
    assert (result["version"], result["rescored"], result["unscored_count"]) == ("board-v2",
                                                                                 2, 2)
    assert result["scorer"]["forced"] is True
    assert result["unscored_reasons"] == {"no reward": 2}
    assert {u["reason"] for u in result["unscored"]} == {"no reward: the scorer returned None"}
    assert result["mean_before"] == 1.0 and result["mean_after"] == 0.5


def test_an_app_without_a_scorer_is_refused_with_the_fix(tmp_path):
    app = tmp_path / "plain" / "task_app.py"
    app.parent.mkdir()
    app.write_text(textwrap.dedent(STATEFUL_APP).split("@task_app.scorer")[0]
                   .replace('"stateful"', '"plain"'))
    missing = refused_in_process(tmp_path, "traces", "rescore", str(app), "--trace-db",
                                 str(tmp_path / "t.db"))
    assert missing.exit_code != 0 and not (tmp_path / "t.db").exists()  # never created
    open_trace_store(str(tmp_path / "t.db")).close()
    refused = refused_in_process(tmp_path, "traces", "rescore", str(app), "--trace-db",
                                 str(tmp_path / "t.db"))
    assert refused.exit_code == 2 and "declares no scorer" in refused.output
    assert "@task_app.scorer" in refused.output


def test_a_store_from_before_versions_is_migrated_by_a_rescore_and_read_as_it_was(tmp_path):
    # An older store: the reads never change it, and a version filter says why it finds none.
    from sessions import make_session

    db = tmp_path / "old.db"
    with open_trace_store(str(db)) as store:
        store.write_session_sync(make_session(1))
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE reward_versions")
        conn.execute("DELETE FROM synth_deploy_schema WHERE version >= 12")
    said = refused_in_process(tmp_path, "traces", "export", "--trace-db", str(db), "--out",
                              str(tmp_path / "x.jsonl"), "--reward-version", "v2")
    assert said.exit_code == 2 and "predates" in said.output
    with open_trace_store(str(db)) as store:  # a writer opens it: migrated, additively
        assert store.schema_version == SCHEMA_VERSION
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM reward_versions").fetchone() == (0,)


def test_a_scorer_is_declared_as_a_plain_function_and_a_stateful_one_says_why():
    app = TaskApp("scorer-shapes", name="Shapes", description="Declares scorers.")
    with pytest.raises(UsageError, match="is async"):
        @app.scorer
        async def later(session):
            return 1.0
    with pytest.raises(UsageError, match="needs its reason"):
        app.scorer(stateless=False)
    with pytest.raises(UsageError, match="decorates a function"):
        app.scorer(stateless=True)(3)
