"""OpenEnv's own environments, served unchanged by OpenEnv's server and by the kit's one-liner,
played by the same script: are the answers the same, and is a step as fast? Needs a throwaway
venv with openenv, the environments' packages and the kit, and an OpenEnv checkout; never run
in CI:

    git clone https://github.com/meta-pytorch/OpenEnv /tmp/OpenEnv     # envs/ is read as is
    python -m venv /tmp/oe && /tmp/oe/bin/pip install openenv==0.10.0 numpy python-chess \
        moonfish reasoning-gym websockets
    /tmp/oe/bin/pip install -e .                                       # the kit, beside it
    /tmp/oe/bin/python bench/openenv_fidelity.py --repo /tmp/OpenEnv [--rounds 8 --steps 300]

For connect4, chess, wildfire and reasoning_gym, the kit's app is the environment's own
`server/app.py` call with `create_app` renamed `task_app.openenv` (wildfire's factory builds
its 16x16 grid), served by `synth-deploy serve`; OpenEnv's server is that `app.py` under
uvicorn. Each pinned to core 0, the client on core 1. Then:

  same      one script (two episodes in one WebSocket session: resets with the same
            arguments, steps chosen from the last observation, the state after each) played
            against both; every answer compared whole (observation with its metadata, reward,
            done, state). An `episode_id` the environment draws at random (a uuid) on both
            sides is the only field set aside. chess draws the agent's side and its
            opponent's moves at random: both servers start with the same seeds, and its
            games are played on fresh pairs of servers until a pair drew alike.
  schema    `/schema` of both: action, observation, reset_observation, state
  http      (connect4: one session at a time) an HTTP client's /reset, then a WebSocket
            client: it plays, never `CAPACITY_REACHED`
  latency   connect4 over WebSocket, `--steps` steps a round, rounds alternating between the
            servers: step p50 and p99, and the kit's over OpenEnv's (target p50 <= 1.1x)

One line per check (ok or FAIL with the first difference), exit 1 on any FAIL.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

KEY = "sk_env_openenv_fidelity"
failures: list[str] = []
UUID = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$")

# Each environment: its app.py module, and that app.py's create_app call (imports, arguments).
ENVS = {
    "connect4": ("connect4_env.server.app", """
from connect4_env.models import Connect4Action, Connect4Observation
from connect4_env.server.connect4_environment import Connect4Environment
""", 'Connect4Environment, Connect4Action, Connect4Observation, env_name="connect4_env"'),
    "chess": ("chess_env.server.app", """
from chess_env.models import ChessAction, ChessObservation
from chess_env.server.chess_environment import ChessEnvironment
""", 'ChessEnvironment, ChessAction, ChessObservation, env_name="chess_env"'),
    "wildfire": ("wildfire_env.server.app", """
from wildfire_env.models import WildfireAction, WildfireObservation
from wildfire_env.server.app import create_wildfire_environment
""", 'create_wildfire_environment, WildfireAction, WildfireObservation, '
     'env_name="wildfire_env"'),
    "reasoning_gym": ("reasoning_gym_env.server.app", """
from reasoning_gym_env.models import ReasoningGymAction, ReasoningGymObservation
from reasoning_gym_env.server.reasoning_gym_environment import ReasoningGymEnvironment
""", 'ReasoningGymEnvironment, ReasoningGymAction, ReasoningGymObservation, '
     'env_name="reasoning_gym", max_concurrent_envs=1'),
}

APP = '''{imports}
from synth_deploy.taskapp import TaskApp

task_app = TaskApp("{name}", name="{name}", description="OpenEnv's {name}, as its app.py has it.")
task_app.openenv({call})
'''

# -- the scripts: messages chosen from the answers so far ------------------------------------


def _connect4(answers: list[dict]) -> Iterator[dict]:
    for episode, columns in enumerate(([3, 2, 3, 2, 3, 2, 3], [0, 0, 0, 0, 0, 0, 0, 1])):
        yield {"type": "reset", "data": {"episode_id": f"fidelity-{episode}"}}
        for column in columns:
            yield {"type": "step", "data": {"column": column}}
            yield {"type": "state"}
            if answers[-2]["data"]["done"]:
                break


def _chess(answers: list[dict]) -> Iterator[dict]:
    for episode in range(2):
        yield {"type": "reset", "data": {"episode_id": f"fidelity-{episode}"}}
        yield {"type": "step", "data": {"move": "a1a1"}}  # refused by the game, in play
        for _ in range(3):
            legal = answers[-1]["data"]["observation"]["legal_moves"]
            yield {"type": "step", "data": {"move": sorted(legal)[0]}}
            yield {"type": "state"}
            yield {"type": "step", "data": {"move": "0000"}}  # a null move: refused, in play


def _wildfire(answers: list[dict]) -> Iterator[dict]:
    for episode in range(2):
        yield {"type": "reset", "data": {"episode_id": f"fidelity-{episode}"}}
        for action in ({"action": "water", "x": 8, "y": 8}, {"action": "break", "x": 3, "y": 4},
                       {"action": "wait"}, {"action": "water", "x": 99, "y": 0},
                       {"action": "wait"}):
            yield {"type": "step", "data": action}
            yield {"type": "state"}


def _reasoning_gym(answers: list[dict]) -> Iterator[dict]:
    yield {"type": "reset", "data": {"dataset_name": "leg_counting", "seed": 42, "size": 10,
                                     "dataset_config": {"min_animals": 2, "max_animals": 4},
                                     "episode_id": "fidelity-0"}}
    yield {"type": "step", "data": {"answer": "8"}}
    yield {"type": "state"}
    yield {"type": "reset", "data": {"episode_id": "fidelity-1"}}  # the dataset's next question
    yield {"type": "state"}
    yield {"type": "step", "data": {"answer": "not a number"}}
    yield {"type": "state"}


# chess draws the agent's side at each reset (a uuid's hash), and its opponent shuffles the
# moves it searches (`random`): both servers start with the same seeds (a sitecustomize), and
# its games are compared from fresh servers whose resets drew the same sides.
DRAWN_AT_RANDOM = {"chess"}
SAME_HASHES = {"PYTHONHASHSEED": "0"}
SEEDED = "import random\nrandom.seed(0)\n"
SCRIPTS: dict[str, Callable[[list[dict]], Iterator[dict]]] = {
    "connect4": _connect4, "chess": _chess, "wildfire": _wildfire,
    "reasoning_gym": _reasoning_gym}

# -- servers ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A child process serving on a port (pinned to ``cpu``) until the block ends."""

    def __init__(self, command: list[str], port: int, health: str, env: dict, cwd: str,
                 cpu: str) -> None:
        self.command = ["taskset", "-c", cpu, *command]
        self.port, self.health, self.env, self.cwd = port, health, env, cwd

    def __enter__(self) -> str:
        self.log = tempfile.TemporaryFile("w+")  # a pipe nobody reads would fill
        self.proc = subprocess.Popen(self.command, env={**os.environ, **self.env}, cwd=self.cwd,
                                     stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{self.command} exited: {self.log.read()[-2000:]}")
            try:
                if httpx.get(url + self.health, timeout=2).status_code < 500:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"{self.command} did not start")

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.log.close()


def seeded(envs: Path, tmp: Path) -> str:
    """A PYTHONPATH whose sitecustomize seeds `random` as the process starts, then envs."""
    folder = tmp / "seeded"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(SEEDED)
    return f"{folder}{os.pathsep}{envs}"


def openenv_server(name: str, envs: Path, tmp: Path) -> Served:
    port = free_port()
    code = (f"import uvicorn; from {ENVS[name][0]} import app; "
            f"uvicorn.run(app, host='127.0.0.1', port={port}, log_level='warning')")
    return Served([sys.executable, "-c", code], port, "/health",
                  {"PYTHONPATH": seeded(envs, tmp), **SAME_HASHES}, str(envs), cpu="0")


def kit_server(name: str, envs: Path, tmp: Path) -> Served:
    _, imports, call = ENVS[name]
    app = tmp / f"{name}_app.py"
    app.write_text(APP.format(imports=imports.strip(), name=name, call=call))
    port = free_port()
    cli = str(Path(sys.executable).parent / "synth-deploy")
    return Served([cli, "serve", str(app), "--port", str(port), "--trace-db",
                   str(tmp / f"{name}.db")], port, "/openenv/health",
                  {"PYTHONPATH": seeded(envs, tmp), "ENVIRONMENT_API_KEY": KEY, **SAME_HASHES},
                  str(tmp), cpu="0")


# -- the client ---------------------------------------------------------------------------------


def ws_url(base: str) -> str:
    return "ws" + base.removeprefix("http") + "/ws"


def idle(base: str) -> None:
    """Until the kit holds no session: a single-session environment frees its slot when the
    last client's close has run on the server, a moment after the client's end."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and httpx.get(
            base + "/health", timeout=5).json()["capacity"]["active_sessions"]:
        time.sleep(0.05)


def play(base: str, script: Callable[[list[dict]], Iterator[dict]], key: str | None
         ) -> list[tuple[dict, dict]]:
    """Every message the script sends, with the answer it got."""
    from websockets.sync.client import connect

    if key:
        idle(base)
    answers: list[dict] = []
    sent: list[dict] = []
    with connect(ws_url(base), additional_headers={"X-API-Key": key} if key else None,
                 open_timeout=30, max_size=None) as ws:
        for message in script(answers):
            ws.send(json.dumps(message))
            answers.append(json.loads(ws.recv(timeout=60)))
            sent.append(message)
    return list(zip(sent, answers, strict=True))


def _set_aside(value: Any) -> Any:
    """The answer with an episode_id drawn at random set aside."""
    if isinstance(value, dict):
        return {k: ("<random uuid>" if k == "episode_id" and isinstance(v, str)
                    and UUID.match(v) else _set_aside(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_set_aside(v) for v in value]
    return value


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key}: only in {'OpenEnv' if key in a else 'the kit'}"
            if (found := first_difference(a[key], b[key], f"{path}.{key}")) is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if (found := first_difference(x, y, f"{path}[{i}]")) is not None:
                return found
        return None
    if a != b or type(a) is not type(b) and not (isinstance(a, float | int)
                                                 and isinstance(b, float | int)):
        return f"{path}: OpenEnv {json.dumps(a)[:160]} vs kit {json.dumps(b)[:160]}"
    return None


def report(name: str, ok: bool, detail: Any = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' if detail else ''}{detail}", flush=True)
    if not ok:
        failures.append(name)


def starts(played: list[tuple[dict, dict]]) -> str:
    return json.dumps([_set_aside(x) for m, x in played if m["type"] == "reset"])


def judge_same(name: str, envs: Path, tmp: Path) -> None:
    """The script against both. An environment that draws at random (chess) is played on
    fresh servers until a pair drew alike: the sides its resets show, and the draws they hide
    (the side of the reset its constructor runs, which decides whether the opponent's first
    search shuffles), so a pair whose visible sides match may still differ; it is counted."""
    unlike = pairs = 0
    while pairs < 12:
        pairs += 1
        with openenv_server(name, envs, tmp) as theirs, kit_server(name, envs, tmp) as ours:
            a = play(theirs, SCRIPTS[name], None)
            b = play(ours + "/openenv", SCRIPTS[name], KEY)
        differences = [f"message {i} ({sent['type']}){found}"
                       for i, ((sent, x), (_, y)) in enumerate(zip(a, b, strict=True))
                       if (found := first_difference(_set_aside(x), _set_aside(y)))]
        if name not in DRAWN_AT_RANDOM or (starts(a) == starts(b) and not differences):
            break
        unlike += starts(a) == starts(b)
    kinds = [m["type"] for m, _ in a]
    metadata = sum(1 for _, x in a if x.get("data", {}).get("metadata"))
    drawn = (f"; pair {pairs} drew alike, {unlike} pair(s) alike in their resets' sides "
             "differed" if name in DRAWN_AT_RANDOM else "")
    report(f"same {name}", not differences and len(a) == len(b),
           differences[0] if differences else
           f"{len(a)} answers identical ({kinds.count('reset')} resets, "
           f"{kinds.count('step')} steps, {kinds.count('state')} states; "
           f"{metadata} with metadata; errors: "
           f"{sum(1 for _, x in a if x['type'] == 'error')}{drawn})")


def judge_schema(name: str, theirs: str, ours: str) -> None:
    a = httpx.get(theirs + "/schema", timeout=30).json()
    b = httpx.get(ours + "/openenv/schema", timeout=30).json()
    differences = [f"{part}{found}" for part in ("action", "observation", "reset_observation",
                                                 "state")
                   if (found := first_difference(a.get(part), b.get(part)))]
    report(f"schema {name}", not differences, differences[0] if differences else
           "action, observation, reset_observation, state identical")


def judge_http_lockout(ours: str) -> None:
    base = ours + "/openenv"
    reset = httpx.post(base + "/reset", json={}, headers={"X-API-Key": KEY}, timeout=30)
    try:
        played = play(base, lambda answers: iter([{"type": "reset", "data": {}},
                                                  {"type": "step", "data": {"column": 0}}]), KEY)
        ok = reset.status_code == 200 and all(x["type"] == "observation" for _, x in played)
        detail = [x["type"] for _, x in played]
    except Exception as exc:  # counted: the WebSocket client was refused
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    report("http connect4", ok, f"HTTP /reset {reset.status_code}, then a WebSocket client: "
                                f"{detail}")


def step_times(base: str, key: str | None, steps: int) -> list[float]:
    """``steps`` connect4 steps over one WebSocket, each timed (a reset when a game ends)."""
    from websockets.sync.client import connect

    times = []
    if key:
        idle(base)
    with connect(ws_url(base), additional_headers={"X-API-Key": key} if key else None,
                 open_timeout=30) as ws:
        ws.send(json.dumps({"type": "reset", "data": {}}))
        ws.recv(timeout=30)
        column = 0
        for _ in range(steps):
            message = json.dumps({"type": "step", "data": {"column": column % 7}})
            t0 = time.perf_counter()
            ws.send(message)
            answer = json.loads(ws.recv(timeout=30))
            times.append(time.perf_counter() - t0)
            column += 1
            if answer["data"]["done"]:
                ws.send(json.dumps({"type": "reset", "data": {}}))
                ws.recv(timeout=30)
    return times


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def judge_latency(theirs: str, ours: str, rounds: int, steps: int) -> None:
    step_times(theirs, None, 50)  # warm both
    step_times(ours + "/openenv", KEY, 50)
    a: list[float] = []
    b: list[float] = []
    for i in range(rounds):
        for times, url, key in ((a, theirs, None), (b, ours + "/openenv", KEY))[::1 - 2 * (i % 2)]:
            times.extend(step_times(url, key, steps))
    a50, a99, b50, b99 = (percentile(a, 0.5), percentile(a, 0.99), percentile(b, 0.5),
                          percentile(b, 0.99))
    report("latency connect4", b50 <= 1.1 * a50,
           f"{rounds} rounds x {steps} steps: kit p50 {1000 * b50:.3f} ms vs OpenEnv "
           f"{1000 * a50:.3f} ms ({b50 / a50:.2f}x, target <= 1.10x); p99 {1000 * b99:.3f} vs "
           f"{1000 * a99:.3f} ms ({b99 / a99:.2f}x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", required=True, type=Path, help="an OpenEnv checkout")
    parser.add_argument("--only", nargs="*", choices=sorted(ENVS), help="these envs only")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    envs = args.repo.resolve() / "envs"
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})  # the client apart from the servers (core 0)
    with tempfile.TemporaryDirectory(prefix="openenv-fidelity-") as tmp:
        for name in args.only or list(ENVS):
            try:
                judge_same(name, envs, Path(tmp))
                with openenv_server(name, envs, Path(tmp)) as theirs, \
                        kit_server(name, envs, Path(tmp)) as ours:
                    judge_schema(name, theirs, ours)
                    if name == "connect4":
                        judge_http_lockout(ours)
                        judge_latency(theirs, ours, args.rounds, args.steps)
            except Exception as exc:  # one environment failing says so and the rest go on
                report(f"serve {name}", False, f"{type(exc).__name__}: {str(exc)[-600:]}")
    print(f"{len(failures)} failed" if failures else "all ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
