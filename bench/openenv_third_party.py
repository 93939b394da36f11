"""Other people's OpenEnv environments, served by the kit exactly as the README says, played by
OpenEnv's own clients and by `smoke`. Needs a throwaway venv with openenv and the kit, and an
OpenEnv checkout; never run in CI (openenv brings gradio, fastmcp, smolagents...):

    git clone https://github.com/meta-pytorch/OpenEnv /tmp/OpenEnv     # envs/ is read as is
    python -m venv /tmp/oe10 && /tmp/oe10/bin/pip install openenv==0.10.0 numpy smolagents
    /tmp/oe10/bin/pip install -e .                                     # the kit, beside it
    python -m venv /tmp/oe03 && /tmp/oe03/bin/pip install 'openenv-core[core]==0.3.0'
    /tmp/oe10/bin/python bench/openenv_third_party.py --repo /tmp/OpenEnv \
        [--core03 /tmp/oe03/bin/python]

For each of envs/echo_env, maze_env, grid_world_env and coding_env an app file is written
(`task_app.openenv(EnvClass, ActionClass)`, nothing else), served with `synth-deploy serve`
(with a key), and then:

  clients   OpenEnv's own client (0.10, the key in its `headers`) plays three episodes over
            /openenv: `GenericEnvClient`, or for echo_env (MCP) `MCPToolClient`
  core03    (--core03) the same with openenv-core 0.3's client, which sends no headers:
            the key in its base URL, {app URL}/openenv/key/{KEY}
  smoke     `synth-deploy smoke APP_URL --seeds 0-2` through the mock policy: three ok

One line per check (ok or FAIL, with what failed), exit 1 on any FAIL. No figures: this
bench says whether other people's environments run, not how fast.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

KEY = "sk_env_openenv_third_party"
failures: list[str] = []

# Each environment: its package under envs/, its Environment and Action classes, and what
# a client sends (a script of client calls; each must return a result, the last may end it).
ENVS = {
    "grid_world_env": ("grid_world_env.server.grid_world_environment:GridWorldEnvironment",
                       "grid_world_env.models:GridWorldAction"),
    "maze_env": ("maze_env.server.maze_env_environment:MazeEnvironment",
                 "maze_env.models:MazeAction"),
    "coding_env": ("coding_env.server.python_codeact_env:PythonCodeActEnv",
                   "coding_env.models:CodeAction"),
    "echo_env": ("echo_env.server.echo_environment:EchoEnvironment",
                 "openenv.core.env_server.mcp_types:CallToolAction"),
}

APP = '''from {env_module} import {env_name}
from {action_module} import {action_name}

from synth_deploy.taskapp import TaskApp

task_app = TaskApp("{app_id}", name="{app_id}", description="OpenEnv's {package}, as is.")
task_app.openenv({env_name}, {action_name}, max_turns=6)
'''

# The client half: runs in the venv given (openenv 0.10 or openenv-core 0.3), prints JSON.
CLIENT = r'''
import asyncio, inspect, json, sys
package, url, key = sys.argv[1], sys.argv[2], sys.argv[3] or None

def headers(cls):
    ok = key and "headers" in inspect.signature(cls.__init__).parameters
    return {"headers": {"X-API-Key": key}} if ok else {}

async def play():
    played = []
    for episode in range(3):
        if package == "echo_env":
            from openenv.core.mcp_client import MCPToolClient
            client = MCPToolClient(base_url=url, **headers(MCPToolClient))
            async with client:
                await client.reset()
                tools = [t.name for t in await client.list_tools()]
                echoed = await client.call_tool("echo_message", message=f"hi {episode}")
                played.append({"tools": tools, "echoed": str(echoed)})
            continue
        from openenv.core.generic_client import GenericEnvClient
        client = GenericEnvClient  # grid_world's own client.py is broken on 0.10 (StepResult)
        actions = {"grid_world_env": [{"action": "DOWN"}] * 6,
                   "maze_env": [{"action": a} for a in (1, 3, 1, 3, 1, 3)],
                   "coding_env": [{"code": f"print({episode} + 1)"}] * 2}[package]
        env = client(base_url=url, **headers(client))
        async with env:
            result = await env.reset()
            steps = 0
            for action in actions:
                if result.done:
                    break
                result = await env.step(action)
                steps += 1
            state = await env.state()
        played.append({"steps": steps, "done": result.done, "reward": result.reward,
                       "state_steps": (state or {}).get("step_count")})
    return played

print(json.dumps(asyncio.run(play()), default=str))
'''


def report(name: str, ok: bool, detail: object = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' if detail else ''}{detail}", flush=True)
    if not ok:
        failures.append(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(app_file: Path, envs_dir: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "ENVIRONMENT_API_KEY": KEY, "PYTHONPATH": str(envs_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "synth_deploy.cli", "serve", str(app_file),
                             "--port", str(port), "--no-trace", *flags], env=env,
                            cwd=app_file.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            httpx.get(url + "/openenv/health", timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"serve {app_file.name} did not start: {proc.stdout.read()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def play(python: str, package: str, base_url: str, key: str, envs_dir: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(envs_dir)}
    result = subprocess.run([python, "-c", CLIENT, package, base_url, key], env=env,
                            capture_output=True, text=True, timeout=180)
    if result.returncode != 0:
        raise RuntimeError(result.stderr.strip().splitlines()[-1] if result.stderr.strip()
                           else f"exit {result.returncode}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def smoke(url: str) -> dict:
    env = {**os.environ, "ENVIRONMENT_API_KEY": KEY}
    result = subprocess.run([sys.executable, "-m", "synth_deploy.cli", "smoke", url, "--seeds",
                             "0-2", "--json", "--no-trace"], env=env, capture_output=True,
                            text=True, timeout=300)
    return json.loads(result.stdout) if result.stdout.strip() else {"error": result.stderr}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", required=True, type=Path, help="an OpenEnv checkout")
    parser.add_argument("--core03", help="a python with openenv-core 0.3")
    parser.add_argument("--only", nargs="*", choices=sorted(ENVS), help="these envs only")
    args = parser.parse_args()
    envs_dir = args.repo / "envs"
    with tempfile.TemporaryDirectory(prefix="openenv-third-party-") as tmp:
        for package in args.only or list(ENVS):
            (env_path, action_path) = ENVS[package]
            env_module, env_name = env_path.split(":")
            action_module, action_name = action_path.split(":")
            app_file = Path(tmp) / f"{package}_app.py"
            app_file.write_text(APP.format(env_module=env_module, env_name=env_name,
                                           action_module=action_module,
                                           action_name=action_name, package=package,
                                           app_id=package.replace("_", "-")))
            try:
                proc, url = serve(app_file, envs_dir)
            except RuntimeError as exc:
                report(f"{package} serve", False, exc)
                continue
            try:
                try:
                    played = play(sys.executable, package, url + "/openenv", KEY, envs_dir)
                    report(f"{package} clients", len(played) == 3, played)
                except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                    report(f"{package} clients", False, exc)
                ran = smoke(url)
                rollouts = ran.get("rollouts") or []
                ok = len(rollouts) == 3 and all(r.get("ok") for r in rollouts)
                report(f"{package} smoke", ok, [
                    {k: r.get(k) for k in ("seed", "ok", "reward", "error", "details")}
                    for r in rollouts] or ran.get("error", "")[-500:])
                if args.core03:  # no headers: the key in the base URL
                    try:
                        played = play(args.core03, package, f"{url}/openenv/key/{KEY}", "",
                                      envs_dir)
                        report(f"{package} core03", len(played) == 3, played)
                    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                        report(f"{package} core03", False, exc)
            finally:
                stop(proc)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
