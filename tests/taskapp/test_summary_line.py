"""The line `serve` prints every 10 s tells what clients got: a rollout answered 500 because
its trace could not be stored is an error, and its duration is the client's wait, the
commit included. Real uvicorn; the stores are what the kit's store would raise or take."""

from __future__ import annotations

import asyncio
import re

import httpx
from toy_apps import toy_config

from synth_deploy.errors import TraceStoreError
from synth_deploy.serving import create_app


class FullDisk:
    def start(self):  # a TraceSink: nothing to start
        pass

    async def write_session(self, session, rollout=None):
        raise TraceStoreError("trace database: cannot write: database or disk is full")


class SlowCommit:
    def start(self):
        pass

    async def write_session(self, session, rollout=None):
        await asyncio.sleep(0.4)  # a commit waiting for the disk


def rollouts(server, api_key, count: int) -> list[int]:
    return [httpx.post(server.url + "/rollout", headers={"X-API-Key": api_key}, timeout=30,
                       json={"run_id": f"r{i}", "env": {"seed": 1},
                             "policy": {"config": {"model": "m"}}}).status_code
            for i in range(count)]


def test_rollouts_whose_traces_were_not_stored_are_counted_as_errors(serve, api_key):
    app = create_app(toy_config(), api_keys=[api_key], trace_store=FullDisk())
    assert rollouts(serve(app), api_key, 3) == [500] * 3
    line = app.state.stats.summary(10.0)
    assert "3 rollouts in 10s" in line and "3 errors" in line, line


def test_the_percentiles_include_the_wait_for_the_commit(serve, api_key):
    app = create_app(toy_config(), api_keys=[api_key], trace_store=SlowCommit())
    assert rollouts(serve(app), api_key, 2) == [200] * 2
    line = app.state.stats.summary(10.0)
    p50, p99 = map(float, re.search(r"p50 ([\d.]+)s p99 ([\d.]+)s", line).groups())
    assert p50 >= 0.4 and p99 >= 0.4 and "0 errors" in line, line
