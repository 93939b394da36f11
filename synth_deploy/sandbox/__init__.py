"""Sandboxes for environments that run the model's code.

    from synth_deploy.sandbox import SandboxSettings

    task_app = TaskApp("code", ..., sandbox=SandboxSettings(memory_mb=256, timeout_s=120))

    @task_app.rollout
    async def rollout(request, ctx):
        box = await ctx.sandbox()                 # ended with the rollout, whatever happens
        await box.write_file("solution.py", code)
        result = await box.run("python3 test.py", timeout_s=10)   # traced, time in the ledger

Two backends behind one interface (`SandboxBackend`): `LocalBackend` for `serve`, `smoke`
and tests (a process group in a temp folder with resource limits; its docstring says what it
does not isolate) and `ModalBackend` over ``modal.Sandbox`` when the app runs on Modal.
"""

from synth_deploy._lazy import lazy_attributes
from synth_deploy.errors import SandboxError
from synth_deploy.sandbox._backend import (
    CommandResult,
    SandboxBackend,
    SandboxTags,
    event_summary,
)
from synth_deploy.sandbox._sandbox import (
    Sandbox,
    close_sandboxes,
    current_backend,
    end_all,
    lifecycle_hooks,
    live_sandboxes,
    open_sandbox,
    use_backend,
)
from synth_deploy.sandbox._settings import SandboxSettings

__getattr__ = lazy_attributes(__name__, {"LocalBackend": "_local", "ModalBackend": "_modal",
                                         "SandboxSummary": "_probe",
                                         "summarize_traces": "_probe"})

__all__ = [
    "CommandResult",
    "LocalBackend",
    "ModalBackend",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "SandboxSettings",
    "SandboxSummary",
    "SandboxTags",
    "close_sandboxes",
    "current_backend",
    "end_all",
    "event_summary",
    "lifecycle_hooks",
    "live_sandboxes",
    "open_sandbox",
    "summarize_traces",
    "use_backend",
]
