"""The OpenEnv half of bench/openenv_wire.py: runs in a venv with openenv (0.10, or openenv-core
0.3) and reports JSON on stdout. Never imported by the kit or its tests.

    python _openenv_side.py episodes URL --episodes N --action JSON [--key K]
    python _openenv_side.py validate URL
    python _openenv_side.py serve-echo PORT ECHO_DIR     OpenEnv's own server, the same env
    python _openenv_side.py latency URL --sessions N --steps S [--key K]
    python _openenv_side.py serve-wait PORT --sessions N  OpenEnv's own server, openenv_wait_env
    python _openenv_side.py sessions URL --sessions N --wait W [--steps S] [--key K]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import statistics
import sys
import time


def _client(url: str, key: str | None):
    from openenv.core.generic_client import GenericEnvClient

    kwargs = {}
    if key and "headers" in inspect.signature(GenericEnvClient.__init__).parameters:
        kwargs["headers"] = {"X-API-Key": key}
    return GenericEnvClient(base_url=url, **kwargs)


async def _episodes(url: str, n: int, action: dict, key: str | None, max_steps: int) -> dict:
    played = []
    for seed in range(n):
        env = _client(url, key)
        await env.connect()
        try:
            result = await env.reset(seed=seed, episode_id=f"openenv-bench-{seed}")
            steps, total = 0, 0.0
            while not result.done and steps < max_steps:
                result = await env.step(action)
                steps += 1
                total += result.reward or 0.0
            state = await env.state()
        finally:
            await env.close()
        played.append({"seed": seed, "steps": steps, "reward": total, "done": result.done,
                       "state": state})
    return {"episodes": played}


def _http_episodes(url: str, n: int, action: dict, key: str | None, max_steps: int,
                   legacy_path: str) -> dict:
    """openenv-core 0.1's HTTPEnvClient (a requests.Session: POST /reset, /step, GET /state);
    no later release has an HTTP client for sessions."""
    sys.path.insert(0, legacy_path)
    from openenv_core.client_types import StepResult
    from openenv_core.http_env_client import HTTPEnvClient

    class Client(HTTPEnvClient):
        def _step_payload(self, action):
            return action

        def _parse_result(self, payload):
            return StepResult(observation=payload.get("observation", {}),
                              reward=payload.get("reward"), done=payload.get("done", False))

        def _parse_state(self, payload):
            return payload

    env = Client(url, default_headers={"X-API-Key": key} if key else None)
    played = []
    for _ in range(n):
        result = env.reset()  # 0.1 sends no seed: an episode of the default seed
        steps, total = 0, 0.0
        while not result.done and steps < max_steps:
            result = env.step(action)
            steps += 1
            total += result.reward or 0.0
        played.append({"steps": steps, "reward": total, "done": result.done,
                       "state": env.state()})
    env.close()
    return {"episodes": played}


async def _latency(url: str, sessions: int, steps: int, key: str | None) -> dict:
    """``sessions`` clients at once, each a reset then ``steps`` steps; every step timed."""
    times: list[float] = []
    failures: list[str] = []

    async def one(i: int) -> None:
        env = _client(url, key)
        try:
            await env.connect()
            await env.reset(seed=i)
            for _ in range(steps):
                t0 = time.perf_counter()
                await env.step({"message": "hello"})
                times.append(time.perf_counter() - t0)
        except Exception as exc:  # counted: a refused or dropped session
            failures.append(f"{type(exc).__name__}: {str(exc)[:120]}")
        finally:
            try:
                await env.close()
            except Exception:
                pass

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(sessions)))
    wall = time.perf_counter() - started
    times.sort()
    return {"steps": len(times), "wall_s": wall, "failures": failures[:5],
            "failed": len(failures),
            "p50_ms": 1000 * times[len(times) // 2] if times else None,
            "p99_ms": 1000 * times[min(len(times) - 1, int(len(times) * 0.99))]
            if times else None,
            "mean_ms": 1000 * statistics.fmean(times) if times else None}


def _percentile(values: list[float], p: float) -> float | None:
    """openenv-scaling's percentile (linear between the two nearest ranks)."""
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    f = int(k)
    c = min(f + 1, len(values) - 1)
    return values[f] + (k - f) * (values[c] - values[f])


async def _sessions(url: str, sessions: int, wait: float, steps: int, key: str | None,
                    timeout: float) -> dict:
    """openenv-scaling's WebSocket test (tests/test_scaling.py, ``ws_session``), mirrored:
    ``sessions`` raw WebSocket clients at once, each connects, resets, takes ``steps`` steps
    of ``wait`` seconds and closes; each operation bounded by ``timeout``; a session fails on
    any exception or an error message. Times in seconds."""
    import websockets

    ws_url = "ws" + url.removeprefix("http") + "/ws"
    headers = {"X-API-Key": key} if key else None
    rows: list[dict] = []

    async def answer(ws) -> dict:
        message = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if message.get("type") == "error":
            raise RuntimeError(f"error: {message.get('data')}")
        return message

    async def one() -> None:
        row: dict = {"ok": False, "steps": []}
        t0 = time.perf_counter()
        phase = "connect"
        try:
            ws = await asyncio.wait_for(websockets.connect(
                ws_url, additional_headers=headers, open_timeout=timeout), timeout)
            row["connect"] = time.perf_counter() - t0
            async with ws:
                t, phase = time.perf_counter(), "reset"
                await ws.send(json.dumps({"type": "reset", "data": {}}))
                await answer(ws)
                row["reset"] = time.perf_counter() - t
                for _ in range(steps):
                    t, phase = time.perf_counter(), "step"
                    await ws.send(json.dumps({"type": "step",
                                              "data": {"wait_seconds": wait}}))
                    await answer(ws)
                    row["steps"].append(time.perf_counter() - t)
                t, phase = time.perf_counter(), "close"
                await ws.send(json.dumps({"type": "close"}))
            row["close"] = time.perf_counter() - t  # the message, then the closing handshake
            row["total"], row["ok"] = time.perf_counter() - t0, True
        except Exception as exc:  # counted: a refused, dropped or timed-out session
            row["error"] = f"{phase}: {type(exc).__name__}: {str(exc)[:160]}"
        rows.append(row)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(sessions)))
    wall = time.perf_counter() - started
    ok = [r for r in rows if r["ok"]]
    figures = {"sessions": sessions, "ok": len(ok), "failed": len(rows) - len(ok),
               "wall_s": wall, "errors": sorted({r["error"] for r in rows if "error" in r})[:5]}
    for name, values in (("connect", [r["connect"] for r in ok]),
                         ("reset", [r["reset"] for r in ok]),
                         ("step", [s for r in ok for s in r["steps"]]),
                         ("close", [r["close"] for r in ok]),
                         ("total", [r["total"] for r in ok])):
        figures[f"{name}_p50"] = _percentile(values, 50)
        figures[f"{name}_p99"] = _percentile(values, 99)
    return figures


def _serve(app, port: int) -> None:
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def _serve_echo(port: int, echo_dir: str, sessions: int) -> None:
    sys.path.insert(0, echo_dir)
    from models import EchoAction, EchoObservation  # the `openenv init` template
    from openenv.core.env_server.http_server import create_fastapi_app
    from server.echo_env_environment import EchoEnvironment

    _serve(create_fastapi_app(EchoEnvironment, EchoAction, EchoObservation,
                              max_concurrent_envs=sessions), port)


def _serve_wait(port: int, sessions: int) -> None:
    """openenv-scaling's server (benchmark/server/app.py): ``create_app`` over the wait
    environment, ``max_concurrent_envs`` sessions, one uvicorn worker."""
    from openenv.core.env_server.http_server import create_app
    from openenv_wait_env import WaitAction, WaitEnvironment, WaitObservation

    _serve(create_app(WaitEnvironment, WaitAction, WaitObservation, env_name="wait",
                      max_concurrent_envs=sessions), port)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what")
    parser.add_argument("target")
    parser.add_argument("extra", nargs="?")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--action", default="{}")
    parser.add_argument("--key")
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--wait", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    if args.what == "episodes":
        out = asyncio.run(_episodes(args.target, args.episodes, json.loads(args.action),
                                    args.key, args.max_steps))
    elif args.what == "http-episodes":
        out = _http_episodes(args.target, args.episodes, json.loads(args.action), args.key,
                             args.max_steps, args.extra)
    elif args.what == "validate":
        from openenv.cli._validation import validate_running_environment

        out = validate_running_environment(args.target)
    elif args.what == "latency":
        out = asyncio.run(_latency(args.target, args.sessions, args.steps, args.key))
    elif args.what == "sessions":
        out = asyncio.run(_sessions(args.target, args.sessions, args.wait, args.steps,
                                    args.key, args.timeout))
    elif args.what == "serve-wait":
        _serve_wait(int(args.target), args.sessions)
        return
    elif args.what == "serve-echo":
        _serve_echo(int(args.target), args.extra, args.sessions)
        return
    else:
        raise SystemExit(f"unknown: {args.what}")
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
