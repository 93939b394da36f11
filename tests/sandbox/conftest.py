"""Fixtures for the sandbox tests: each backend on a root (or stand-in) of the test's own."""

from __future__ import annotations

import pytest
from sandbox_processes import local_leftovers

from synth_deploy.sandbox import LocalBackend


@pytest.fixture
def local_backend(sandbox_root) -> LocalBackend:
    return LocalBackend(sandbox_root)


@pytest.fixture(params=["local"])
def any_backend(request, sandbox_root):
    """Every backend, each run by the same tests; ``backend.leftovers(box)`` names the
    processes of ``box`` still running, as the test sees them from outside."""
    if request.param == "local":
        backend = LocalBackend(sandbox_root)
        backend.leftovers = local_leftovers
        return backend
    raise AssertionError(request.param)
