"""Fixtures for the sandbox tests: each backend on a root (or stand-in) of the test's own."""

from __future__ import annotations

import pytest
from sandbox_processes import local_leftovers
from standins.modal_sandbox import ModalSandboxStandin

from synth_deploy.sandbox import LocalBackend, ModalBackend


@pytest.fixture
def local_backend(sandbox_root) -> LocalBackend:
    return LocalBackend(sandbox_root)


@pytest.fixture
def modal_standin(tmp_path) -> ModalSandboxStandin:
    return ModalSandboxStandin(tmp_path / "modal-state")


@pytest.fixture
def modal_backend(modal_standin) -> ModalBackend:
    return ModalBackend("synth-test", modal=modal_standin, lease_s=3.0)


@pytest.fixture(params=["local", "modal-standin"])
def any_backend(request, sandbox_root, tmp_path):
    """Every backend, each run by the same tests; ``backend.leftovers(box)`` names the
    processes of ``box`` still running, as the test sees them from outside."""
    if request.param == "local":
        backend = LocalBackend(sandbox_root)
        backend.leftovers = local_leftovers
        return backend
    standin = ModalSandboxStandin(tmp_path / "modal-state")
    backend = ModalBackend("synth-test", modal=standin, lease_s=3.0)
    backend.leftovers = lambda box: standin.processes(box.id)
    return backend
