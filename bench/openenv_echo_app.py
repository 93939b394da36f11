"""OpenEnv's echo environment (what `openenv init echo_env` generates) as a task app, in one
declaration. bench/openenv_wire.py copies this file into the generated package's folder as
task_app.py, then serves, smoke-tests and dry-run deploys it with the kit."""

from models import EchoAction
from server.echo_env_environment import EchoEnvironment

from synth_deploy.modal import ModalSettings, modal_app
from synth_deploy.taskapp import TaskApp

task_app = TaskApp(
    "openenv-echo", name="Echo (OpenEnv)",
    description="OpenEnv's echo environment, served by synth-deploy.",
    modal=ModalSettings(name="synth-openenv-echo", pip_packages=["openenv==0.10.0"]))
task_app.openenv(EchoEnvironment, EchoAction, max_turns=5)

app = modal_app(__file__)
