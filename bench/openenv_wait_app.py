"""The environment of OpenEnv's scaling benchmark (bench/openenv_wait_env.py) as a task app, in
one declaration: what bench/openenv_sessions.py serves with `synth-deploy serve`."""

from openenv_wait_env import WaitAction, WaitEnvironment

from synth_deploy.taskapp import TaskApp

task_app = TaskApp("openenv-wait", name="Wait (OpenEnv's scaling benchmark)",
                   description="A step that sleeps for the action's wait_seconds.")
task_app.openenv(WaitEnvironment, WaitAction, max_turns=1000)
