"""A long rollout through the proxies under their strictest reading (tests/standins/
cutoff_proxies.py, limits scaled: Modal's 150 s is 3 s, Cloudflare's 125 s is 2 s, a rollout
of ten minutes is 8 s): the early head does not survive a front end that buffers; the
asynchronous path of synth-containers' contract does, through every one of them.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from rollouts import runners_through, small_rl_config
from standins.cutoff_proxies import EdgeProxy, QuickTunnel, StrictModalFrontEnd
from toy_apps import sleeping, toy_config

from synth_deploy.proxy_limits import URLLIB_MAX_REPEATS
from synth_deploy.serving import RolloutLimits, create_app
from synth_deploy.tracing import RolloutRecords, open_trace_store

SILENCE_S = 2.0  # Cloudflare's 125 s, scaled
REDIRECT_AFTER_S = 3.0  # Modal's 150 s, scaled
LONG_S = 5.0  # a ten-minute rollout, scaled: past both limits
EARLY = RolloutLimits(head_after_s=0.5, heartbeat_s=0.5)


def trainer_body(run_id: str) -> dict:
    return {"run_id": run_id, "env": {"seed": 1},
            "policy": {"config": {"model": "m", "inference_url": "http://127.0.0.1:9/v1"}}}


def async_body(rollout_id: str) -> dict:
    return {"rollout_id": rollout_id, "seed": 1, "submission_mode": "async",
            "policy": {"model": "m", "inference_url": "http://127.0.0.1:9/v1"}}


async def submit_and_poll(base_url: str, api_key: str, rollout_id: str) -> tuple[int, dict]:
    async with httpx.AsyncClient(base_url=base_url + "/containers", timeout=30,
                                 headers={"X-API-Key": api_key}) as client:
        submitted = await client.post("/rollouts", json=async_body(rollout_id))
        assert submitted.status_code == 202, submitted.text
        polls = 0
        while True:
            polls += 1
            doc = (await client.get(f"/rollouts/{rollout_id}")).json()
            if doc["status"] != "running":
                return polls, doc
            await asyncio.sleep(0.5)


@pytest.mark.slow
def test_the_strict_front_end_redirects_an_early_head_and_urllib_gives_up(serve, api_key):
    # The stand-in bites: under the strict reading, heartbeats do not stop the 303s. The
    # rollout outlasts every hop urllib takes.
    app = serve(create_app(toy_config(sleeping(URLLIB_MAX_REPEATS * 1.5 + 2)),
                           api_keys=[api_key], limits=EARLY))
    with StrictModalFrontEnd(app.url, redirect_after_s=1.5) as modal:
        no_follow = httpx.post(modal.url + "/rollout", json=trainer_body("no-follow"),
                               headers={"X-API-Key": api_key}, timeout=30)
        request = urllib.request.Request(
            modal.url + "/rollout", data=httpx.Request(
                "POST", "http://x", json=trainer_body("urllib")).read(),
            headers={"X-API-Key": api_key, "Content-Type": "application/json"})
        started = time.monotonic()
        try:
            urllib.request.urlopen(request, timeout=30)
            raise AssertionError("urllib finished a rollout that needs more hops than it takes")
        except urllib.error.HTTPError as exc:
            failure = exc
    assert no_follow.status_code == 303
    assert failure.code == 303 and "redirect" in str(failure.reason).lower()
    assert time.monotonic() - started >= URLLIB_MAX_REPEATS * 1.5


@pytest.mark.slow
def test_a_long_rollout_completes_asynchronously_through_strict_modal_and_cloudflare(
        tmp_path, serve, api_key):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        app = serve(create_app(toy_config(sleeping(LONG_S)), api_keys=[api_key],
                               trace_store=store,
                               rollout_records=RolloutRecords(store), limits=EARLY))
        with StrictModalFrontEnd(app.url, redirect_after_s=REDIRECT_AFTER_S) as modal, \
                EdgeProxy(app.url, silence_s=SILENCE_S) as edge:

            async def both():
                return await asyncio.gather(submit_and_poll(modal.url, api_key, "via-modal"),
                                            submit_and_poll(edge.url, api_key, "via-edge"))

            started = time.monotonic()
            (modal_polls, via_modal), (edge_polls, via_edge) = asyncio.run(both())
            assert time.monotonic() - started >= LONG_S
            assert modal.redirects == 0 and edge.cut == 0  # no request was ever held long
        for doc in (via_modal, via_edge):
            assert doc["status"] == "completed" and doc["reward_info"]["outcome_reward"] == 1.0
        assert modal_polls >= 10 and edge_polls >= 10  # a few short requests, each quick
        assert {s.run_id for s in store.list_sessions(limit=None)} == {"via-modal", "via-edge"}


@pytest.mark.slow
def test_the_event_stream_passes_modal_and_cloudflare_but_not_a_quick_tunnel(serve, api_key):
    # Long enough that the quick tunnel, holding the stream whole, still hears nothing for
    # its 2 s once the head has come (up to 2 s late on a loaded machine).
    app = serve(create_app(toy_config(sleeping(6.0)), api_keys=[api_key], limits=EARLY))
    headers = {"X-API-Key": api_key}
    with StrictModalFrontEnd(app.url, redirect_after_s=REDIRECT_AFTER_S) as modal, \
            EdgeProxy(app.url, silence_s=SILENCE_S) as edge, \
            QuickTunnel(app.url, silence_s=SILENCE_S) as quick:
        proxies = {"modal": modal, "edge": edge, "quick": quick}
        for name in proxies:
            httpx.post(app.url + "/containers/rollouts", json=async_body(f"sse-{name}"),
                       headers=headers)

        def stream(name: str) -> httpx.Response:
            return httpx.get(f"{proxies[name].url}/containers/rollouts/sse-{name}/stream",
                             headers=headers, timeout=30)

        with ThreadPoolExecutor(len(proxies)) as pool:  # the three streams at once
            answers = dict(zip(proxies, pool.map(stream, proxies), strict=True))
    for name in ("modal", "edge"):
        assert answers[name].status_code == 200
        assert "event: rollout.completed" in answers[name].text
        assert ": heartbeat" in answers[name].text
    # A quick tunnel holds the stream to its end: the edge hears nothing and cuts it.
    assert answers["quick"].status_code == 524, answers["quick"].text[-700:]


def test_a_quick_tunnel_refuses_requests_past_its_limit(serve, api_key):
    app = serve(create_app(toy_config(sleeping(1.0)), api_keys=[api_key]))
    with QuickTunnel(app.url, max_in_flight=2) as quick:

        async def crowd():
            async with httpx.AsyncClient(base_url=quick.url, timeout=30,
                                         headers={"X-API-Key": api_key}) as client:
                return await asyncio.gather(*(client.post("/rollout", json=trainer_body(
                    f"q{i}")) for i in range(4)))

        statuses = sorted(r.status_code for r in asyncio.run(crowd()))
    assert statuses == [200, 200, 429, 429]


@pytest.mark.slow
def test_our_runners_and_check_go_async_through_strict_modal_and_cloudflare(
        tmp_path, serve, api_key):

    with open_trace_store(str(tmp_path / "t.db")) as store:
        app = serve(create_app(toy_config(sleeping(LONG_S)), api_keys=[api_key],
                               trace_store=store,
                               rollout_records=RolloutRecords(store), limits=EARLY))
        with StrictModalFrontEnd(app.url, redirect_after_s=REDIRECT_AFTER_S) as modal, \
                EdgeProxy(app.url, silence_s=SILENCE_S) as edge:
            outcomes, report = runners_through(edge.url, modal.url, api_key)
            assert modal.redirects == 0 and edge.cut == 0
        assert [o.ok for o in outcomes] == [True, True, True]
        assert {o.path.name for o in outcomes} == {"async"}
        assert all(o.latency_s >= LONG_S for o in outcomes)
        rollout_check = next(r for r in report.checks if r.name == "rollout")
        assert rollout_check.verdict == "pass", rollout_check
        assert "async: submitted and polled" in rollout_check.actual
        assert len(store.list_sessions(limit=None)) == 4


def test_runners_fall_back_to_rollout_for_an_app_without_async(serve, api_key):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from synth_deploy.runs import PolicyTarget, path_notes, run_rollouts

    async def rollout(request):  # a synth-ai 0.4.4 app: /rollout only
        body = await request.json()
        return JSONResponse({"run_id": body["run_id"], "metrics": {"outcome_reward": 0.5}})

    app = serve(Starlette(routes=[Route("/rollout", rollout, methods=["POST"])]))
    [outcome] = asyncio.run(run_rollouts(app.url, api_key, [1], PolicyTarget(
        "http://127.0.0.1:9/v1", "m")))
    assert outcome.ok and outcome.reward == 0.5 and outcome.path.name == "sync"
    [note] = path_notes([outcome])
    assert "POST /rollout" in note and "404" in note


@pytest.mark.slow
def test_rehearse_runs_its_training_step_async_through_strict_modal_and_cloudflare(
        tmp_path, serve, api_key):
    # The trainer's view of a ten-minute rollout (scaled) behind each proxy read strictly:
    # rehearse's training step submits and polls, so neither the 303 nor the silence cutoff
    # touches it, and its report says which path the rollouts took.
    import threading

    from synth_deploy.env import load_env
    from synth_deploy.runs import RehearsalOptions, rehearse

    config = small_rl_config(tmp_path)
    store = open_trace_store(str(tmp_path / "t.db"))
    app = serve(create_app(toy_config(sleeping(LONG_S)), api_keys=[api_key], limits=EARLY,
                           trace_store=store, rollout_records=RolloutRecords(store)))
    env = load_env(environ={"ENVIRONMENT_API_KEY": api_key})
    options = RehearsalOptions(skip=frozenset({"capacity", "idle", "determinism"}),
                               budget_s=60)
    reports = {}
    with EdgeProxy(app.url, silence_s=SILENCE_S) as edge, \
            StrictModalFrontEnd(app.url, redirect_after_s=REDIRECT_AFTER_S) as modal:
        threads = [threading.Thread(target=lambda n=name, u=url: reports.__setitem__(
                       n, rehearse(config, u, env, options)))
                   for name, url in (("cloudflare", edge.url), ("modal", modal.url))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    for name in ("cloudflare", "modal"):
        step = {c.name: c for c in reports[name].checks}["training step"]
        assert step.verdict == "pass" and step.data["failures"] == 0, (name, step)
        assert any("async" in note and "rollouts" in note for note in reports[name].notes), \
            (name, reports[name].notes)
    assert store.count_sessions() == 2 * 2  # both rehearsals' rollouts (a batch of 2), traced
    store.close()
