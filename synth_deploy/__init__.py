"""synth-deploy: take an RL task app from a laptop to production.

Import what you need from the capability packages: ``synth_deploy.taskapp`` (the SDK),
``synth_deploy.serving`` (its engine), ``synth_deploy.health``, ``synth_deploy.tracing``,
``synth_deploy.tunnel``, ``synth_deploy.modal``, ``synth_deploy.runs``, ``synth_deploy.train``.
This top level stays import-light.
"""

__version__ = "0.1.0"
