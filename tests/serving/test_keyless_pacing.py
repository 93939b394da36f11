"""A client without the key is refused before the app runs, and past a budget of failed
key checks a second its address's refusals wait: a keyless flood is paced by the server,
while a client with the key is served at once. Real uvicorn (`LocalRunner`'s protocol),
real sockets; bench/keyless_flood.py measures what a flood takes from a keyed client."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from toy_apps import toy_config

from synth_deploy.serving import create_app

BODY = json.dumps({"run_id": "r", "env": {"seed": 1}, "policy": {"config": {"model": "m"}}})


def test_a_keyless_flood_is_paced_and_a_keyed_client_is_not(serve, api_key):
    app = create_app(toy_config(), api_keys=[api_key])
    server = serve(app)

    async def keyless(client: httpx.AsyncClient) -> tuple[float, httpx.Response]:
        started = time.monotonic()
        resp = await client.post(server.url + "/rollout", content=BODY,
                                 headers={"content-type": "application/json"})
        return time.monotonic() - started, resp

    async def flood_beside_a_keyed_client():
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=10, limits=limits) as client:
            flood = [asyncio.create_task(keyless(client)) for _ in range(80)]
            await asyncio.sleep(0.2)  # the flood is in
            started = time.monotonic()
            keyed = await client.post(server.url + "/rollout", content=BODY, headers={
                "content-type": "application/json", "X-API-Key": api_key})
            return time.monotonic() - started, keyed, await asyncio.gather(*flood)

    keyed_s, keyed, refused = asyncio.run(flood_beside_a_keyed_client())
    assert keyed.status_code == 200 and keyed_s < 0.9
    assert {r.status_code for _, r in refused} == {401}
    assert {r.json()["detail"]["error"]["code"] for _, r in refused} == {"missing_api_key"}
    waited = [s for s, _ in refused if s >= 0.9]
    # 20 a second at once (two seconds' budgets if the flood straddles one): the rest wait.
    assert len(waited) >= 80 - 2 * 20, sorted(round(s, 2) for s, _ in refused)
