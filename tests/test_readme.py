"""The README's task app example works as printed: it serves, and scores with the mock."""

from __future__ import annotations

import json
import re
from pathlib import Path

from processes import run_cli

from synth_deploy.tracing import open_trace_store

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example(heading: str = "## Writing a task app") -> str:
    section = README.read_text().split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


MOCK_SECTION = "## The mock policy: what it plays, and an app it plays well"


def test_the_writing_a_task_app_example_scores_above_zero_with_the_mock(tmp_path):
    (tmp_path / "tiny.py").write_text(readme_example())
    result = run_cli(tmp_path, "smoke", "tiny.py", "--seeds", "0-9", "--json", "--no-trace",
                     timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)["summary"]
    assert summary["errors"] == 0 and summary["mean_reward"] > 0.5, summary
    assert summary["mean_outcome_score"] == summary["mean_reward"]  # filled in by the kit


def test_the_example_lists_without_being_imported(tmp_path):
    (tmp_path / "apps" / "tiny").mkdir(parents=True)
    (tmp_path / "apps" / "tiny" / "tiny.py").write_text(readme_example())
    result = run_cli(tmp_path, "apps", "--json")
    apps = {a["app_id"]: a for a in json.loads(result.stdout)["apps"]}
    assert apps["tiny"]["description"] == "Add two numbers."


def test_the_mock_policy_sections_game_is_won_on_some_seeds_and_lost_on_others(tmp_path):
    (tmp_path / "guess.py").write_text(readme_example(MOCK_SECTION))
    db = tmp_path / "t.db"
    result = run_cli(tmp_path, "smoke", "guess.py", "--seeds", "0-19", "--json",
                     "--trace-db", str(db), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    rewards = [r["reward"] for r in json.loads(result.stdout)["rollouts"]]
    assert set(rewards) == {0.0, 1.0}, rewards
    # As the section says: the prompt every seed shares gets a call on every seed's first
    # turn (never the text reply), and the same first call.
    with open_trace_store(str(db), read_only=True) as store:
        firsts = [min((e for e in store.get_session(s.session_id).events
                       if e.event_type == "cais"), key=lambda e: e.event_time)
                  for s in store.list_sessions(limit=None)]
    calls = {json.dumps(lm.call_records[0]["response"]["tool_calls"][0]["function"])
             for lm in firsts}
    assert len(firsts) == 20 and len(calls) == 1, calls


def test_the_environment_interface_is_documented_whole():
    section = README.read_text().split("The environment interface, all of it", 1)[1][:4000]
    for member in ("`tool`", "`reset(seed, *, episode_id, config)`", "`step(action)`",
                   "`prompt(observation)`", "`system_prompt()`", "`state()`", "`outcome(steps)`",
                   "`close()`", "`noop`", "`no_call_message`", "`Reward(kind, value)`",
                   "`max_sessions`", "details.ended", "second reply is refused too"):
        assert member in section, member


def test_openenv_clients_without_headers_and_mcp_are_documented():
    text = README.read_text()
    for words in ("`{app URL}/openenv/key/{KEY}`", "never in a log", "`MCPToolClient`",
                  "`openenv/session/create`", "bench/openenv_third_party.py"):
        assert words in text, words


def test_the_head_and_heartbeat_settings_and_worker_object_costs_are_documented():
    text = README.read_text()
    for words in ("--head-after S --heartbeat S", "SYNTH_DEPLOY_HEAD_AFTER_S",
                  "ModalSettings(head_after_s=, heartbeat_s=)", "affinity=KEY",
                  "one round trip per call"):
        assert words in text, words
    modal_doc = (README.parent / "infra" / "modal.md").read_text()
    assert "check --url" not in modal_doc


def test_the_new_commands_are_in_the_command_table():
    text = README.read_text()
    for command in ("`synth-deploy init NAME`", "`synth-deploy logs APP [-f] [--tail N]`",
                    "`synth-deploy mock-policy [--port 8002]`"):
        assert command in text, command
