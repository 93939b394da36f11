"""`rehearse` and `check --load` against real task apps built to fail one check each (under
tests/runs/rehearsal_apps/), and the healthy math app: real child processes, real servers,
the real mock policy, real SQLite traces."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from pathlib import Path

import httpx
import pytest
from processes import refused_in_process, run_cli
from standins.idle_proxy import IdleDroppingProxy

from synth_deploy.runs import idle_probe

APPS = Path(__file__).parent / "rehearsal_apps"
MATH_RL = Path(__file__).resolve().parents[2] / "apps" / "math" / "configs" / "rl.toml"


def rl_config(tmp_path: Path, **numbers: int) -> Path:
    """The math RL config with some numbers changed (episodes_per_batch=8, ...)."""
    text = MATH_RL.read_text()
    for name, value in numbers.items():
        text, found = re.subn(rf"^{name} = \d+", f"{name} = {value}", text, flags=re.M)
        assert found == 1, name
    path = tmp_path / "rl.toml"
    path.write_text(text)
    return path


def rehearse(tmp_path: Path, *args: str, **env: str) -> tuple[int, dict]:
    result = run_cli(tmp_path, "rehearse", *args, "--json", timeout=180, **env)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def checks(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


@pytest.mark.slow
def test_the_math_app_is_ready_to_train_and_its_rollouts_are_traced(tmp_path):
    db = tmp_path / "traces.db"
    code, report = rehearse(tmp_path, "--config", str(MATH_RL), "--app", "math",
                            "--trace-db", str(db))
    found = checks(report)
    assert code == 0 and report["ready"], found
    assert set(found) == {"health", "training step", "reward signal", "token continuity",
                          "sandboxes", "determinism", "capacity", "timeouts",
                          "idle connection"}
    assert found.pop("sandboxes")["verdict"] == "skip"  # math runs no code
    assert found.pop("token continuity")["verdict"] == "skip"  # the config asks for no ids
    assert all(c["verdict"] in ("pass", "warn") for c in found.values())
    step = found["training step"]["data"]
    assert step["rollouts"] == 32 and step["failures"] == 0 and step["concurrency"] == 8
    assert step["tokens"] > 0 and step["steps"] == 20
    # The projection is shown to a tenth of a second, from a wall time shown to a millisecond.
    assert step["projected_run_s"] == pytest.approx(step["wall_s"] * 20, abs=0.05 + 20 * 0.0005)
    groups = found["reward signal"]["data"]["groups"]
    assert [g["seed"] for g in groups] == list(range(8))
    assert all(len(g["rewards"]) == 4 for g in groups)
    # The headline number is the count of groups whose four rewards are all the same.
    zero = sum(len(set(g["rewards"])) == 1 for g in groups)
    assert found["reward signal"]["data"]["zero_variance_groups"] == zero < 8
    assert found["reward signal"]["finding"].startswith(f"{zero} of 8 groups")
    assert found["determinism"]["verdict"] == "pass"
    capacity = found["capacity"]["data"]
    assert capacity["sustained"] == 16 and capacity["wanted"] == 8
    assert [lv["concurrency"] for lv in capacity["levels"]] == [1, 2, 4, 8, 16]
    assert capacity["recommended"]["max_concurrent_rollouts"] == 8
    # Settings to paste, and the measurement kept for `deploy` (the ramp never found the
    # limit here: a lower bound).
    assert any(d.startswith("app file:   ModalSettings(concurrent_inputs=")
               for d in found["capacity"]["details"])
    # Nothing gave way up to 16: a lower bound, said so; no limit to paste, no knee claimed;
    # and the figures came from the mock policy's millisecond replies.
    assert found["capacity"]["finding"] == "held 16 concurrent rollouts, not measured above"
    assert not any("max_rollouts=" in d or "--max-rollouts" in d
                   for d in found["capacity"]["details"])
    assert any("mock policy" in d for d in found["capacity"]["details"])
    kept = json.loads((tmp_path / ".synth-deploy" / "capacity.json").read_text())["math"]
    assert kept["sustained"] == 16 and kept["limited"] is False
    layers = [layer["name"] for layer in found["timeouts"]["data"]["layers"]]
    assert layers[0] == "rollout budget" and "Modal function timeout" in layers
    assert found["timeouts"]["data"]["budget_s"] == 120  # the math app's declared limit
    assert found["idle connection"]["data"]["survived"] is True
    with sqlite3.connect(db) as conn:
        run_ids = [json.loads(m)["run_id"] for (m,) in
                   conn.execute("SELECT metadata FROM session_traces")]
    assert sum(r.startswith("rehearse-") and "-step-" in r for r in run_ids) == 32


def test_rehearsing_the_code_app_says_its_sandboxes_start_and_what_they_cost(tmp_path):
    config = rl_config(tmp_path, episodes_per_batch=4, group_size=2, max_concurrent_rollouts=4)
    code, report = rehearse(tmp_path, "--config", str(config), "--app", "code", "--no-trace",
                            "--skip", "capacity", "--skip", "idle", "--skip", "determinism")
    found = checks(report)
    # The mock's answers to two groups of two may all score alike: the reward signal's
    # verdict is that check's to pin, not this one's.
    failed = {name for name, check in found.items() if check["verdict"] == "fail"}
    assert failed <= {"reward signal"} and code == (1 if failed else 0), found
    sandboxes = found["sandboxes"]
    assert sandboxes["verdict"] == "pass", sandboxes
    assert sandboxes["data"]["started"] == 4 and sandboxes["data"]["commands"] == 12
    assert sandboxes["finding"].startswith("4 sandboxes started (local) in ")
    assert len(sandboxes["data"]["start_ms"]) == 4


@pytest.mark.slow
def test_a_running_app_rehearsed_by_url_has_its_returned_traces_stored(tmp_path, math_server,
                                                                       api_key):
    db = tmp_path / "remote.db"
    code, report = rehearse(tmp_path, "--config", str(MATH_RL), "--task-url", math_server.url,
                            "--trace-db", str(db), "--skip", "idle", "--max-concurrency", "8",
                            ENVIRONMENT_API_KEY=api_key)
    found = checks(report)
    assert code == 0 and report["target"] == math_server.url
    assert found["training step"]["data"]["failures"] == 0
    # A URL may be many containers: no per-container Modal advice, and no ModalSettings.
    assert any("measured across the whole deployment" in d
               for d in found["capacity"]["details"])
    assert "Modal function timeout" not in [
        layer["name"] for layer in found["timeouts"]["data"]["layers"]]
    with sqlite3.connect(db) as conn:
        run_ids = [json.loads(m)["run_id"] for (m,) in
                   conn.execute("SELECT metadata FROM session_traces")]
    assert sum("-step-" in r for r in run_ids) == 32
    assert sum("-load-" in r for r in run_ids) == 4 + 4 + 8 + 16  # levels 1, 2, 4, 8


def test_a_synth_ai_style_app_is_rehearsed(tmp_path, serve, math_config, api_key):
    # Its /health answers anyone with {"status": "healthy", "authorized": true}, its /rollout
    # wants the key (issue 38): rehearse must run, as synth-ai's own health checks let a
    # trainer run against it.
    from standins.health_servers import synth_ai_style

    from synth_deploy.serving import create_app

    app = serve(synth_ai_style(create_app(math_config, api_keys=[api_key]), api_key))
    code, report = rehearse(tmp_path, "--config", str(MATH_RL),
                            "--task-url", app.url, "--skip", "idle", "--max-concurrency", "8",
                            "--no-trace", ENVIRONMENT_API_KEY=api_key)
    found = checks(report)
    assert found["health"]["verdict"] in ("pass", "warn"), found["health"]
    assert found["training step"]["verdict"] != "skip" and \
        found["training step"]["data"]["failures"] == 0
    assert code == 0 and report["ready"], found


def test_a_constant_reward_has_no_learning_signal(tmp_path):
    config = rl_config(tmp_path, episodes_per_batch=12, max_concurrent_rollouts=4)
    code, report = rehearse(tmp_path, "--config", str(config), "--app",
                            str(APPS / "constant_reward.py"), "--idle", "0.5", "--no-trace")
    signal = checks(report)["reward signal"]
    assert code == 1 and not report["ready"]
    assert signal["verdict"] == "fail"
    assert signal["data"]["zero_variance_groups"] == 3  # 12 episodes in groups of 4
    assert signal["finding"].startswith("3 of 3 groups have zero reward variance")
    assert signal["details"] == ["every rollout scored 1"]
    assert checks(report)["training step"]["verdict"] == "pass"


def test_an_app_that_ignores_its_seed_fails_determinism(tmp_path):
    config = rl_config(tmp_path, episodes_per_batch=8, max_concurrent_rollouts=4)
    code, report = rehearse(tmp_path, "--config", str(config), "--app",
                            str(APPS / "ignores_seed.py"), "--idle", "0.5", "--no-trace")
    determinism = checks(report)["determinism"]
    assert code == 1
    assert determinism["verdict"] == "fail"
    assert determinism["data"]["seed"] == 0
    assert determinism["data"]["task_info_difference"].startswith("task_metadata.question: ")
    assert "random.Random(seed)" in determinism["fix"]


@pytest.mark.slow
def test_an_app_that_gives_way_past_four_rollouts_is_caught_by_the_ramp(tmp_path):
    config = rl_config(tmp_path, episodes_per_batch=8, max_concurrent_rollouts=8)
    code, report = rehearse(tmp_path, "--config", str(config), "--app",
                            str(APPS / "overloaded.py"), "--skip", "idle", "--no-trace")
    found = checks(report)
    capacity = found["capacity"]
    assert code == 1
    assert capacity["verdict"] == "fail"
    assert capacity["data"]["sustained"] == 4
    assert [lv["concurrency"] for lv in capacity["data"]["levels"]] == [1, 2, 4, 8]
    assert "overloaded" in capacity["data"]["stopped_by"]
    assert capacity["data"]["recommended"]["max_concurrent_rollouts"] == 4
    assert capacity["finding"].endswith("the config asks for 8")
    assert "max_concurrent_rollouts = 4" in capacity["fix"]
    # The training step at the config's concurrency loses rollouts to the same cause.
    assert found["training step"]["verdict"] == "fail"
    assert "overloaded" in found["training step"]["details"][0]
    assert found["idle connection"]["verdict"] == "skip"


@pytest.mark.slow
def test_a_rollout_that_outlives_the_modal_timeout_fails_the_timeouts(tmp_path):
    config = rl_config(tmp_path, episodes_per_batch=4, max_concurrent_rollouts=2)
    code, report = rehearse(tmp_path, "--config", str(config), "--app",
                            str(APPS / "slow_rollout.py"), "--max-concurrency", "2",
                            "--skip", "idle", "--skip", "determinism", "--no-trace")
    timeouts = checks(report)["timeouts"]
    assert code == 1
    assert timeouts["verdict"] == "fail"
    assert timeouts["data"]["observed_max_s"] >= 1.2  # the app sleeps 1.2 s per rollout
    assert "longer than the Modal function timeout (1s" in timeouts["finding"]
    assert "ModalSettings(timeout=...)" in timeouts["fix"]
    # Modal's 150-s redirect is no limit: the app sends a long rollout's head early.
    assert any("Modal web request limit (150s) never see it silent" in d
               for d in timeouts["details"])
    assert "Modal web request limit" not in [
        layer["name"] for layer in timeouts["data"]["layers"]]
    assert checks(report)["capacity"]["verdict"] == "pass"


def test_a_trainer_timeout_shorter_than_the_budget_is_out_of_order(tmp_path):
    code, report = rehearse(tmp_path, "--config", str(MATH_RL), "--app", "math",
                            "--trainer-timeout", "60", "--skip", "capacity", "--skip", "idle",
                            "--no-trace")
    timeouts = checks(report)["timeouts"]
    assert code == 0  # a warning: nothing measured comes near either
    assert timeouts["verdict"] == "warn"
    assert timeouts["finding"].startswith("1 out of order: the trainer's per-rollout timeout "
                                          "(60s) is shorter than the rollout budget (120s)")


def test_unreachable_usage_and_sft_configs_have_their_exit_codes(tmp_path):
    def refused(*args: str, **env: str) -> tuple[int, dict]:
        # each refused before anything is served or run: in this process
        result = refused_in_process(tmp_path, "rehearse", *args, "--json", **env)
        assert isinstance(result.exception, SystemExit), result.output
        return result.exit_code, json.loads(result.stdout)

    code, report = refused("--config", str(MATH_RL), "--task-url", "http://127.0.0.1:9",
                           ENVIRONMENT_API_KEY="k" * 20)
    assert code == 3 and report["error"]["type"] == "UnreachableError"
    code, report = refused("--config", str(MATH_RL.with_name("sft.toml")), "--app", "math")
    assert code == 2 and "is an SFT config" in report["error"]["message"]
    no_groups = tmp_path / "no_groups.toml"
    no_groups.write_text(re.sub(r"^group_size = \d+\n", "", MATH_RL.read_text(), flags=re.M))
    code, report = refused("--config", str(no_groups), "--app", "math")
    assert code == 2 and "[training] group_size is not set" in report["error"]["message"]
    code, report = refused("--config", str(MATH_RL), "--task-url", "127.0.0.1:9")
    assert code == 2 and "no scheme" in report["error"]["message"]
    code, report = refused("--config", str(MATH_RL), "--app", "math", "--skip", "everything")
    assert code == 2 and "cannot skip everything" in report["error"]["message"]


def test_the_summary_reads_at_80_columns(tmp_path):
    config = rl_config(tmp_path, episodes_per_batch=8, max_concurrent_rollouts=8)
    result = run_cli(tmp_path, "rehearse", "--config", str(config), "--app",
                     str(APPS / "overloaded.py"), "--skip", "idle", "--no-trace",
                     COLUMNS="80", timeout=180)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    text = " ".join(line.strip() for line in lines)
    for words in ("training step", "capacity", "✗ fail", "concurrency", "rollouts/s",
                  "set [rollout] max_concurrent_rollouts = 4", "not ready: training step"):
        assert words in text
    # A failure's cause is printed whole, wrapped rather than cut.
    assert "overloaded: 5 rollouts in flight, capacity 4" in text


def test_an_idle_connection_dropped_on_the_path_is_reported(math_server, mock_policy, api_key):
    def body(seed: int) -> dict:
        return {"run_id": f"idle-{seed}", "env": {"seed": seed},
                "policy": {"config": {"model": "m", "inference_url": mock_policy.url + "/v1"}},
                "mode": "rl"}

    bodies = (body(1), body(2))
    port = httpx.URL(math_server.url).port
    with IdleDroppingProxy("127.0.0.1", port, forget_after_s=1.0) as proxy:
        dropped = asyncio.run(idle_probe(proxy.url, api_key, bodies, 2.0, timeout_s=30))
        assert proxy.resets == 1
    assert dropped.survived is False and dropped.statuses == [200]
    assert "the second rollout failed" in dropped.error
    # The same wait straight to the app: uvicorn keeps the connection (5 s keep-alive).
    direct = asyncio.run(idle_probe(math_server.url, api_key, bodies, 2.0, timeout_s=30))
    assert direct.survived is True and direct.reconnected is False
    assert direct.statuses == [200, 200] and direct.idle_s >= 2.0


@pytest.mark.slow
def test_the_idle_time_held_is_the_one_asked_however_long_the_other_checks_take(
        math_server, mock_policy, api_key):
    # rehearse releases the probe's second rollout only once its measurements are done; they
    # took 17 s and 65 s for two apps, and the probe reported those as its idle time.
    def body(seed: int) -> dict:
        return {"run_id": f"idle-late-{seed}", "env": {"seed": seed},
                "policy": {"config": {"model": "m", "inference_url": mock_policy.url + "/v1"}},
                "mode": "rl"}

    async def probe(url: str, release_after_s: float):
        release = asyncio.Event()
        asyncio.get_running_loop().call_later(release_after_s, release.set)
        return await idle_probe(url, api_key, (body(1), body(2)), 1.0, timeout_s=30,
                                release=release)

    held = asyncio.run(probe(math_server.url, 3.5))
    assert held.survived is True and held.statuses == [200, 200]
    assert 1.0 <= held.idle_s < 1.5, held
    port = httpx.URL(math_server.url).port
    with IdleDroppingProxy("127.0.0.1", port, forget_after_s=0.5) as proxy:
        dropped = asyncio.run(probe(proxy.url, 3.5))
    assert dropped.survived is False and 1.0 <= dropped.idle_s < 1.5, dropped
    assert dropped.error.startswith("after 1s idle, a request on the kept connection failed")


def test_check_load_ramps_a_running_app(tmp_path, math_server, api_key):
    result = run_cli(tmp_path, "check", math_server.url, "--load", "--max-concurrency", "4",
                     "--json", ENVIRONMENT_API_KEY=api_key)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["healthy"] and report["load"]["sustained"] == 4
    assert [lv["concurrency"] for lv in report["load"]["levels"]] == [1, 2, 4]
    assert all(lv["errors"] == 0 for lv in report["load"]["levels"])


def test_the_mock_policy_samples_per_correlation_id_when_asked_to(mock_policy):
    def answer(cid: str | None, temperature: float | None) -> str:
        body = {"messages": [{"role": "user", "content": "What is 48 + 37?"}]}
        if temperature is not None:
            body["temperature"] = temperature
        url = mock_policy.url + "/v1/chat/completions" + (f"?cid={cid}" if cid else "")
        return httpx.post(url, json=body, timeout=10).json()["choices"][0]["message"]["content"]

    assert answer(None, None) == answer(None, None) == answer("a", 0.0)
    sampled = {cid: answer(cid, 1.0) for cid in (f"c{i}" for i in range(40))}
    assert all(answer(cid, 1.0) == text for cid, text in list(sampled.items())[:5])
    assert len(set(sampled.values())) > 1  # group members disagree on some prompts


@pytest.mark.parametrize(("flags", "said"), [
    (("--no-trace",), "records no traces"),
    (("--trace-db", ":memory:"), "they die with the machine"),
    (("--trace-db", "{tmp}/kept.db"), None),
])
def test_rehearse_warns_when_the_runs_traces_would_be_kept_nowhere(tmp_path, flags, said):
    flags = tuple(f.replace("{tmp}", str(tmp_path)) for f in flags)
    code, report = rehearse(tmp_path, "--config", str(rl_config(tmp_path, episodes_per_batch=4)),
                            "--app", "math", "--skip", "determinism", "--skip", "capacity",
                            "--skip", "idle", *flags)
    assert code in (0, 1) and checks(report)["health"]["verdict"] == "pass"
    lost = [n for n in report["notes"] if "training run's rollouts" in n]
    assert [said in n for n in lost] == ([True] if said else [])


@pytest.mark.slow
def test_an_idle_probe_answered_524_and_closed_is_reported_not_a_crash(tmp_path, serve,
                                                                       math_server, api_key):
    # Cloudflare's edge answers a silent origin 524 and closes the connection: the probe
    # read the closed socket's port and rehearse crashed (EBADF). Here an edge in front of the
    # math app answers the idle probe's rollouts so; everything else passes through.
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def forward(request):
        body = await request.body()
        if request.url.path == "/rollout" and b"-idle-" in body:
            return Response("error code: 524", status_code=524, media_type="text/plain",
                            headers={"connection": "close"})
        async with httpx.AsyncClient(base_url=math_server.url, timeout=60) as client:
            upstream = await client.request(request.method, request.url.path, content=body,
                                            params=request.query_params,
                                            headers={k: v for k, v in request.headers.items()
                                                     if k in ("x-api-key", "authorization",
                                                              "content-type")})
        return Response(upstream.content, status_code=upstream.status_code,
                        media_type=upstream.headers.get("content-type"))

    edge = serve(Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])]))
    code, report = rehearse(tmp_path, "--config", str(MATH_RL), "--task-url", edge.url,
                            "--skip", "determinism", "--skip", "capacity",
                            ENVIRONMENT_API_KEY=api_key)
    idle = checks(report)["idle connection"]
    assert idle["verdict"] == "fail" and idle["finding"].startswith("closed (524)"), idle
    assert "connection closed" in idle["finding"] and "proxy" in idle["fix"]
    assert code != 0 and checks(report)["training step"]["verdict"] == "pass"


def test_a_ramp_capped_without_a_failure_is_not_called_a_limit(tmp_path):
    code, report = rehearse(tmp_path, "--config", str(MATH_RL), "--app", "math",
                            "--max-concurrency", "2", "--skip", "determinism", "--skip", "idle")
    capacity = checks(report)["capacity"]
    assert capacity["data"]["stopped_by"] is None and capacity["data"]["sustained"] == 2
    assert capacity["finding"].startswith("held 2 concurrent rollouts, not measured above")
    assert "knee" not in capacity["finding"]
    assert capacity["fix"].startswith("nothing failed up to 2: measure up to 8")


def test_when_every_rollout_failed_the_reward_signal_is_not_blamed(tmp_path):
    code, report = rehearse(tmp_path, "--config", str(MATH_RL), "--app", "math",
                            "--inference-url", "http://127.0.0.1:9/v1", "--model", "m",
                            "--skip", "determinism", "--skip", "capacity", "--skip", "idle")
    found = checks(report)
    assert code != 0 and found["training step"]["verdict"] == "fail"
    signal = found["reward signal"]
    assert signal["verdict"] == "skip" and "every rollout failed" in signal["finding"]
    assert signal["fix"] is None


def test_groups_without_rewards_fail_the_reward_signal_and_progress_is_printed(tmp_path):
    config = rl_config(tmp_path, episodes_per_batch=8, max_concurrent_rollouts=4)
    result = run_cli(tmp_path, "rehearse", "--config", str(config), "--app",
                     str(APPS / "unrewarded.py"), "--no-trace", "--skip", "determinism",
                     "--skip", "capacity", "--skip", "idle", timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert "1 of 2 groups have no reward to compare (1 recorded no reward)" in out, out
    assert "4 of 8 recorded no reward" in out and "no reward recorded" in out
    # Lines a log keeps, as `check --load` prints them: the stage, then its count.
    assert "rehearse: training step, 8 to run…" in result.stderr, result.stderr
    assert re.search(r"rehearse: training step 8 of 8 done", result.stderr), result.stderr


def test_rollouts_that_run_past_the_configs_max_turns_are_flagged(tmp_path):
    config = rl_config(tmp_path, episodes_per_batch=4, max_concurrent_rollouts=4)
    code, report = rehearse(tmp_path, "--config", str(config), "--app",
                            str(APPS / "long_turns.py"), "--no-trace", "--skip", "determinism",
                            "--skip", "capacity", "--skip", "idle")
    step = checks(report)["training step"]
    assert step["verdict"] == "warn" and "4 of 4 ran past max_turns" in step["finding"], step
    assert any("ran past [rollout] max_turns = 1 (up to 12 steps)" in d
               for d in step["details"]), step["details"]
