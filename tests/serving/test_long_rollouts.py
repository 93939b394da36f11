"""Real RL runs: rollouts that outlive proxy cutoffs, admission by rollouts in flight, clients
without a key that cannot starve those with one, and an async rollout that holds the loop.

The proxies are the stand-ins of tests/standins/cutoff_proxies.py with their limits scaled
down: Cloudflare's 100 s of silence becomes 2 s, Modal's 150 s becomes 3 s, and a rollout
of many minutes becomes 5 s.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import httpx
import pytest
from rollouts import runners_through, small_rl_config
from standins.cutoff_proxies import EdgeProxy, ModalFrontEnd
from toy_apps import sleeping, toy_config

from synth_deploy.runs import PolicyTarget, run_rollouts
from synth_deploy.serving import ConnectionLimits, RolloutLimits, answered_status, create_app
from synth_deploy.taskapp import RolloutContext, RolloutRequest
from synth_deploy.tracing import open_trace_store

SILENCE_S = 2.0  # Cloudflare's 100 s, scaled
REDIRECT_AFTER_S = 3.0  # Modal's 150 s, scaled
LONG_S = 5.0  # a rollout of many minutes, scaled: past both limits
EARLY = RolloutLimits(head_after_s=0.5, heartbeat_s=0.5)
LATE = RolloutLimits(head_after_s=60.0, heartbeat_s=60.0)  # as if there were no early head


def trainer_body(run_id: str, seed: int = 1, **env_config) -> dict:
    """A `/rollout` body as synth-ai's trainer sends it."""
    return {"run_id": run_id, "env": {"seed": seed, "config": env_config},
            "policy": {"policy_name": "p", "config": {"model": "m",
                                                      "inference_url": "http://127.0.0.1:9/v1"}},
            "mode": "rl", "record": {"return_trace": False}}


async def post_as_synth_ai(base_url: str, api_key: str, body: dict,
                           follow_redirects: bool = True) -> httpx.Response:
    # TaskAppClient's own settings: redirects followed, a 600 s timeout, the key twice.
    async with httpx.AsyncClient(base_url=base_url, timeout=600.0,
                                 follow_redirects=follow_redirects) as client:
        return await client.post("/rollout", json=body, headers={
            "X-API-Key": api_key, "Authorization": f"Bearer {api_key}"})


@pytest.mark.slow
def test_a_long_rollout_completes_through_both_proxies_with_its_trace(tmp_path, serve, api_key):
    with open_trace_store(str(tmp_path / "traces.db")) as store:
        app = serve(create_app(toy_config(sleeping(LONG_S)), api_keys=[api_key],
                               trace_store=store, limits=EARLY))
        with EdgeProxy(app.url, silence_s=SILENCE_S) as edge, \
                ModalFrontEnd(app.url, redirect_after_s=REDIRECT_AFTER_S) as modal:

            async def both():
                return await asyncio.gather(
                    post_as_synth_ai(edge.url, api_key, trainer_body("via-tunnel")),
                    post_as_synth_ai(modal.url, api_key, trainer_body("via-modal")))

            started = time.monotonic()
            answers = asyncio.run(both())
            assert time.monotonic() - started >= LONG_S
        for resp, run_id in zip(answers, ["via-tunnel", "via-modal"], strict=True):
            assert resp.status_code == 200 and resp.history == []  # no 303 was needed
            assert resp.json()["run_id"] == run_id
            assert resp.json()["metrics"]["outcome_reward"] == 1.0
            assert resp.text.startswith(" ")  # the head and the heartbeat came first
        assert edge.cut == 0 and modal.redirects == 0
        assert {s.run_id for s in store.list_sessions(limit=None)} == {"via-tunnel", "via-modal"}


def test_without_an_early_head_the_proxies_cut_what_they_cut(serve, api_key):
    # The stand-ins bite: the test above passes because of the early head, not by luck.
    app = serve(create_app(toy_config(sleeping(SILENCE_S + 1.5)), api_keys=[api_key],
                           limits=LATE))
    with EdgeProxy(app.url, silence_s=SILENCE_S) as edge, \
            ModalFrontEnd(app.url, redirect_after_s=SILENCE_S) as modal:

        async def all_three():
            return await asyncio.gather(
                post_as_synth_ai(edge.url, api_key, trainer_body("tunnel")),
                post_as_synth_ai(modal.url, api_key, trainer_body("modal-no-follow"),
                                 follow_redirects=False),
                post_as_synth_ai(modal.url, api_key, trainer_body("modal-follow")))

        tunnel, no_follow, follow = asyncio.run(all_three())
    assert tunnel.status_code == 524
    assert no_follow.status_code == 303
    assert "__modal_function_call_id=" in no_follow.headers["location"]
    # A client that follows the redirect (synth-ai's does) waits at the result URL.
    assert follow.status_code == 200 and [r.status_code for r in follow.history] == [303]


@pytest.mark.slow
def test_our_runners_finish_long_rollouts_through_both_proxies(serve, api_key):
    app = serve(create_app(toy_config(sleeping(LONG_S)), api_keys=[api_key], limits=EARLY))
    with EdgeProxy(app.url, silence_s=SILENCE_S) as edge, \
            ModalFrontEnd(app.url, redirect_after_s=REDIRECT_AFTER_S) as modal:
        outcomes, report = runners_through(edge.url, modal.url, api_key)
    assert [o.ok for o in outcomes] == [True, True, True]
    assert [o.reward for o in outcomes] == [1.0, 1.0, 1.0]
    rollout_check = next(r for r in report.checks if r.name == "rollout")
    assert rollout_check.verdict == "pass", rollout_check
    assert report.healthy, report.failure


def test_a_rollout_that_fails_after_its_head_says_its_status_in_the_body(serve, api_key):
    app = serve(create_app(toy_config(sleeping(1.0, fail=True)), api_keys=[api_key],
                           limits=RolloutLimits(head_after_s=0.2, heartbeat_s=0.2)))
    resp = httpx.post(app.url + "/rollout", json=trainer_body("late-failure"), timeout=30,
                      headers={"X-API-Key": api_key})
    assert resp.status_code == 200  # the head had left before the failure
    error = resp.json()["detail"]["error"]
    assert error["code"] == "rollout_failed" and error["status"] == 500
    assert answered_status(resp.status_code, resp.json()) == 500
    [outcome] = asyncio.run(run_rollouts(app.url, api_key, [1], PolicyTarget(
        "http://127.0.0.1:9/v1", "m")))
    assert not outcome.ok and outcome.status == 500 and "crashed" in outcome.error


def test_a_short_rollout_keeps_its_own_status(serve, api_key):
    app = serve(create_app(toy_config(sleeping(0.0, fail=True)), api_keys=[api_key], limits=EARLY))
    resp = httpx.post(app.url + "/rollout", json=trainer_body("quick-failure"), timeout=30,
                      headers={"X-API-Key": api_key})
    assert resp.status_code == 500 and not resp.text.startswith(" ")


# -- admission ----------------------------------------------------------------------------

def test_rollouts_beyond_the_limit_get_503_with_retry_after_and_health_says_why(serve, api_key):
    app = serve(create_app(toy_config(sleeping(1.5)), api_keys=[api_key],
                           limits=RolloutLimits(max_in_flight=2)))
    headers = {"X-API-Key": api_key}

    async def crowd():
        async with httpx.AsyncClient(base_url=app.url, timeout=30, headers=headers) as client:
            running = [asyncio.create_task(client.post("/rollout", json=trainer_body(f"r{i}")))
                       for i in range(2)]
            await asyncio.sleep(0.5)
            health = (await client.get("/health")).json()
            refused = await client.post("/rollout", json=trainer_body("one-too-many"))
            return health, refused, await asyncio.gather(*running)

    health, refused, admitted = asyncio.run(crowd())
    assert health["rollouts"] == {"in_flight": 2, "max_in_flight": 2, "head_after_s": 20.0}
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["detail"]["error"]["code"] == "at_capacity"
    assert [r.status_code for r in admitted] == [200, 200]
    after = httpx.get(app.url + "/health", headers=headers).json()["rollouts"]
    assert after["in_flight"] == 0


def test_the_limit_comes_from_the_flag_else_the_environment(monkeypatch):
    from synth_deploy.env import load_env
    from synth_deploy.errors import UsageError
    from synth_deploy.serving import DEFAULT_MAX_ROLLOUTS, MAX_ROLLOUTS_VAR, rollout_limits

    assert rollout_limits(load_env(environ={})).max_in_flight == DEFAULT_MAX_ROLLOUTS
    env = load_env(environ={MAX_ROLLOUTS_VAR: "64"})
    assert rollout_limits(env).max_in_flight == 64
    assert rollout_limits(env, 8).max_in_flight == 8
    with pytest.raises(UsageError, match=MAX_ROLLOUTS_VAR):
        rollout_limits(load_env(environ={MAX_ROLLOUTS_VAR: "lots"}))
    with pytest.raises(UsageError, match=">= 1"):
        RolloutLimits(max_in_flight=0)


def test_the_head_and_heartbeat_are_settings_flag_environment_and_modal():
    # To rehearse against a proxy shorter than Cloudflare's 100 s, both must come earlier.
    from synth_deploy.env import load_env
    from synth_deploy.errors import UsageError
    from synth_deploy.modal import ModalSettings
    from synth_deploy.serving import HEAD_AFTER_VAR, HEARTBEAT_VAR, rollout_limits

    default = rollout_limits(load_env(environ={}))
    assert (default.head_after_s, default.heartbeat_s) == (20.0, 15.0)
    env = load_env(environ={HEAD_AFTER_VAR: "2", HEARTBEAT_VAR: "1.5"})
    assert (rollout_limits(env).head_after_s, rollout_limits(env).heartbeat_s) == (2.0, 1.5)
    flagged = rollout_limits(env, head_after_s=0.5, heartbeat_s=0.25)
    assert (flagged.head_after_s, flagged.heartbeat_s) == (0.5, 0.25)
    with pytest.raises(UsageError, match=HEAD_AFTER_VAR) as bad:
        rollout_limits(load_env(environ={HEAD_AFTER_VAR: "soon"}))
    assert "seconds" in bad.value.hint
    settings = ModalSettings(head_after_s=3, heartbeat_s=2)
    assert settings.resources()["head_after_s"] == 3
    with pytest.raises(Exception, match="head_after_s"):
        ModalSettings(head_after_s=0)


def test_the_drains_bound_is_a_setting_and_a_bad_one_is_refused():
    from synth_deploy.env import load_env
    from synth_deploy.errors import UsageError
    from synth_deploy.serving import DRAIN_VAR, ServeSettings

    def resolved(**environ: str) -> float:
        return ServeSettings.resolve("math", load_env(environ=environ), key_rule="open",
                                     traces=None).graceful_timeout_s

    assert resolved() == 30.0 and resolved(**{DRAIN_VAR: "120"}) == 120.0
    with pytest.raises(UsageError, match=DRAIN_VAR) as bad:
        resolved(**{DRAIN_VAR: "a while"})
    assert "seconds SIGTERM waits" in bad.value.hint


def _keyless_request(port: int) -> socket.socket:
    # Well under uvicorn's 5 s keep-alive: an answer the server did not close times out.
    sock = socket.create_connection(("127.0.0.1", port), timeout=2)
    sock.sendall(b"POST /rollout HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: 2\r\n\r\n{}")
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_request_without_the_key_is_answered_and_its_connection_closed(serve, api_key):
    app = serve(create_app(toy_config(), api_keys=[api_key]))
    sock = _keyless_request(int(app.url.rsplit(":", 1)[1]))
    with sock:
        answer = _read_until_closed(sock)  # returns only once the server closed
    assert answer.startswith(b"HTTP/1.1 401") and b"connection: close" in answer.lower()


def test_clients_without_a_key_cannot_starve_clients_with_one(api_key):
    from synth_deploy.serving import BackgroundServer

    # The connection cap is small here so that a crowd would reach it: 48 keyless clients
    # come in waves of 12 and never hang up themselves. Each is answered and closed by the
    # server, so none holds a slot a keyed client needs.
    with BackgroundServer(create_app(toy_config(), api_keys=[api_key]),
                          limits=ConnectionLimits(max_connections=16)) as app:
        port = int(app.url.rsplit(":", 1)[1])
        crowd = []
        try:
            for _ in range(4):
                wave = [_keyless_request(port) for _ in range(12)]
                crowd += wave
                assert all(_read_until_closed(s).startswith(b"HTTP/1.1 401") for s in wave)
            statuses = [httpx.post(app.url + "/rollout", json=trainer_body(f"keyed-{i}"),
                                   headers={"X-API-Key": api_key}, timeout=10).status_code
                        for i in range(16)]
        finally:
            for s in crowd:
                s.close()
    assert statuses == [200] * 16


# -- a loop nobody blocks unseen -----------------------------------------------------------

async def cpu_bound_rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
    started = time.thread_time()  # 0.3 s of computing, however long the machine makes it
    while time.thread_time() - started < 0.3:  # computes without awaiting
        pass
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}


async def polite_rollout(request: RolloutRequest, ctx: RolloutContext) -> dict:
    for _ in range(5):
        await asyncio.sleep(0.05)
    return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}


def test_an_async_rollout_that_holds_the_loop_is_named_once_with_the_fix(serve, api_key,
                                                                          caplog):
    blocking = serve(create_app(toy_config(cpu_bound_rollout), api_keys=[api_key]))
    polite = serve(create_app(toy_config(polite_rollout), api_keys=[api_key]))
    caplog.set_level(logging.WARNING, logger="synth_deploy.taskapp")
    for server in (blocking, polite, blocking):
        assert httpx.post(server.url + "/rollout", json=trainer_body("r"), timeout=30,
                          headers={"X-API-Key": api_key}).status_code == 200
    warnings = [r.getMessage() for r in caplog.records if "held the event loop" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"cpu_bound_rollout ({__file__}:" in warnings[0]
    assert "worker_object" in warnings[0] and "def" in warnings[0]


@pytest.mark.slow
def test_rehearse_runs_a_training_step_of_long_rollouts_through_both_proxies(tmp_path, serve,
                                                                           api_key):
    import threading

    from synth_deploy.env import load_env
    from synth_deploy.runs import RehearsalOptions, rehearse

    config = small_rl_config(tmp_path)
    app = serve(create_app(toy_config(sleeping(LONG_S)), api_keys=[api_key], limits=EARLY))
    env = load_env(environ={"ENVIRONMENT_API_KEY": api_key})
    options = RehearsalOptions(skip=frozenset({"capacity", "idle"}), budget_s=60)
    reports = {}
    with EdgeProxy(app.url, silence_s=SILENCE_S) as edge, \
            ModalFrontEnd(app.url, redirect_after_s=REDIRECT_AFTER_S) as modal:

        def rehearse_through(name: str, url: str) -> None:
            reports[name] = rehearse(config, url, env, options)

        threads = [threading.Thread(target=rehearse_through, args=pair)
                   for pair in (("tunnel", edge.url), ("modal", modal.url))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    for name in ("tunnel", "modal"):
        found = {c.name: c for c in reports[name].checks}
        assert found["training step"].verdict == "pass", (name, found["training step"])
        assert found["determinism"].verdict == "pass", (name, found["determinism"])
        assert found["training step"].data["failures"] == 0


def test_the_summary_line_says_what_happened_since_the_last_one(serve, api_key):
    app = create_app(toy_config(sleeping(0.0)), api_keys=[api_key],
                     limits=RolloutLimits(max_in_flight=64))
    server = serve(app)
    stats = app.state.stats
    assert stats.summary(10) is None  # nothing happened: no line
    for i in range(20):
        httpx.post(server.url + "/rollout", json=trainer_body(f"s{i}"), timeout=10,
                   headers={"X-API-Key": api_key})
    line = stats.summary(10)
    assert line.startswith("20 rollouts in 10s (2.0/s) · p50 ") and " p99 " in line
    assert line.endswith("0 errors · 0/64 in flight"), line
    assert stats.summary(10) is None  # said once
