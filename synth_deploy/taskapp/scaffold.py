"""`synth-deploy init NAME`: a new task app that serves, smokes and trains as written.

    NAME/task_app.py     an environment (reset with a seed, step with the tool's arguments)
    NAME/rl.toml         a training run over it, every field explained where it stands
    NAME/README.md       the next commands
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from synth_deploy.errors import UsageError
from synth_deploy.taskapp.registry import SCAFFOLD_FILE

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")

TASK_APP = '''"""{title}: guess a number from 1 to 10 (replace with your own environment).

Serve it: synth-deploy serve {path}      Try it: synth-deploy smoke {path}
"""

from synth_deploy.modal import modal_app
from synth_deploy.taskapp import InvalidAction, Step, TaskApp, function_tool

task_app = TaskApp("{app_id}", name="{title}", description="Guess the number from 1 to 10.")


@task_app.environment
class Guess:
    # The action is a call of this tool; its arguments are the step's action.
    tool = function_tool("guess", "Guess the number.", {{
        "type": "object", "properties": {{"number": {{"type": "integer", "minimum": 1,
                                                      "maximum": 10}}}},
        "required": ["number"], "additionalProperties": False}})
    noop = {{"number": 1}}  # what a turn plays after two replies without a valid call

    def reset(self, seed, *, episode_id, config):
        self.secret, self.tries = (seed or 0) % 10 + 1, 0
        return {{"text": "I picked a number from 1 to 10. Guess it."}}

    def step(self, action):
        number = action["number"]
        if not 1 <= number <= 10:
            raise InvalidAction("number must be 1-10")  # nothing changed; the policy is told
        self.tries += 1
        if number == self.secret:
            return Step({{"text": "Right!"}}, reward=1.0, done=True)
        hint = "higher" if number < self.secret else "lower"
        return Step({{"text": f"No, {{hint}}."}}, done=self.tries >= 5, truncated=self.tries >= 5)


app = modal_app(__file__)  # `synth-deploy deploy {path}` (or `modal deploy`) deploys this
'''

RL_TOML = '''# A training run over the {app_id} task app, in synth-ai's RL schema.
# Try it first:   synth-deploy rehearse --config {path} --app {app_id}
# Then submit it: synth-deploy train --config {path}

[algorithm]
type = "online"                 # online RL: rollouts are played while training
method = "policy_gradient"
variety = "gspo"                # the group-relative policy optimisation variant

[services]
task_url = "http://127.0.0.1:8001"  # where the trainer reaches the app (--task-url or
                                    # TASK_APP_URL, from `tunnel` or `deploy`, win)

[compute]
gpu_type = "H100"               # the backend's GPU type
gpu_count = 2                   # split below between inference and training

[compute.topology]
type = "single_node_split"
gpus_for_vllm = 1               # serving the policy the rollouts call
gpus_for_training = 1
gpus_for_ref = 0                # a reference model for KL; 0: none
tensor_parallel = 1

[model]
base = "Qwen/Qwen3-4B"          # the model trained
trainer_mode = "lora"           # LoRA adapters (see [training.lora]) rather than full weights
label = "{app_id}-rl"           # the name the trained model is listed under

[rollout]
env_name = "{app_id}"           # the task app's id
policy_name = "{app_id}-policy"
max_turns = 5                   # turns an episode may take: sent with each rollout as
                                # env.config.max_turns, where the environment cuts it
episodes_per_batch = 32
max_concurrent_rollouts = 8     # rollouts in flight at once: at most what the app holds
                                # (rehearse measures it)
batches_per_step = 1

[training]
num_epochs = 1
iterations_per_epoch = 20       # training steps; each plays episodes_per_batch rollouts
max_turns = 5
batch_size = 16
group_size = 4                  # rollouts per seed compared with each other (GSPO's group):
                                # at least 2, or no seed teaches anything
learning_rate = 5e-5
log_interval = 1
weight_sync_interval = 1        # steps between pushing new weights to the policy server

[training.weight_sync]
enable = true
targets = ["policy"]

[training.lora]
r = 16                          # adapter rank
alpha = 32
dropout = 0.05
target_modules = ["all-linear"]

[evaluation]
instances = 16                  # episodes per evaluation
every_n_iters = 5
seeds = [0, 1, 2, 3, 4, 5, 6, 7]

[tags]
app = "{app_id}"
'''

README = '''# {title}

From the folder that holds `{app_id}/` (the app's id finds it there):

    # 10 episodes with the mock policy
    synth-deploy smoke {app_id}
    # serve it (the key: synth-deploy setup)
    synth-deploy serve {app_id}
    # one training step as the trainer runs it, before renting GPUs
    synth-deploy rehearse --config {rl} --app {app_id}
    # to Modal
    synth-deploy deploy {app_id}

`task_app.py` holds the environment (`reset`, `step`, the `tool` its actions call);
`rl.toml` the training run, each field explained.
'''
_COMMENTED = re.compile(r"^(?P<code>[^#\s].*?)\s{2,}(?P<comment>#.*)$")
_CONTINUED = re.compile(r"^\s+(?P<comment>#.*)$")


def _aligned(text: str) -> str:
    """``text`` with its end-of-line comments (and the comment lines that continue them)
    in one column, whatever length the app's name gave the lines."""
    lines = text.splitlines()
    codes = [m["code"] for line in lines if (m := _COMMENTED.match(line))]
    if not codes:
        return text
    column = max(len(code) for code in codes) + 2
    out, continuing = [], False
    for line in lines:
        if m := _COMMENTED.match(line):
            line, continuing = m["code"].ljust(column) + m["comment"], True
        elif continuing and (m := _CONTINUED.match(line)):
            line = " " * column + m["comment"]
        else:
            continuing = False
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def scaffold_app(name: str, parent: Path | str = ".") -> list[Path]:
    """Write a new task app ``name`` under ``parent``: its files, or `UsageError` (nothing
    written) for a bad name or a folder that exists."""
    if not _NAME.match(name) or keyword.iskeyword(name):
        raise UsageError(f"{name!r} is not a task app name",
                         hint="use lower-case letters, digits, - and _ (up to 40), starting "
                              "with a letter, e.g. synth-deploy init guess")
    folder = Path(parent) / name
    if folder.exists():
        raise UsageError(f"{folder} exists already: nothing was written",
                         hint="choose another name, or remove the folder first")
    title = name.replace("-", " ").replace("_", " ").title()
    path, rl = f"{name}/{SCAFFOLD_FILE}", f"{name}/rl.toml"
    files = {folder / SCAFFOLD_FILE: TASK_APP.format(title=title, app_id=name, path=path),
             folder / "rl.toml": _aligned(RL_TOML.format(app_id=name, path=rl)),
             folder / "README.md": README.format(title=title, app_id=name, rl=rl)}
    folder.mkdir(parents=True)
    for file, text in files.items():
        file.write_text(text)
    return list(files)


__all__ = ["scaffold_app"]
