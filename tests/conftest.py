"""Shared fixtures: real uvicorn servers on free loopback ports, stopped by the test."""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from synth_deploy.runs import create_mock_policy_app
from synth_deploy.serving import BackgroundServer, create_app
from synth_deploy.taskapp.config import TaskAppConfig
from synth_deploy.taskapp.registry import load_app

# Tests press Ctrl-C on the CLIs they start (SIGINT). A shell without job control runs a
# background command with SIGINT ignored, every child inherits that, and those tests would
# hang until their timeout: a suite started that way gets Python's own handler back, which
# each child's exec resets to the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    # Every test process (each xdist worker starts after this) and every child a test starts
    # (a CLI, a served app, a writer child) imports the kit. Where the environment says
    # PYTHONDONTWRITEBYTECODE, each of them compiled it (and pytest rewrote each test
    # module) from source again: the suite's largest single cost. Bytecode goes under
    # .pytest_cache instead (the source tree stays clean), compiled once and reused.
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        os.environ.setdefault("PYTHONPYCACHEPREFIX",
                              str(config.rootpath / ".pytest_cache" / "pycache"))


@pytest.fixture
def api_key() -> str:
    return "sk_env_test_" + secrets.token_hex(16)


@pytest.fixture
def math_config() -> TaskAppConfig:
    return load_app("math").build_config()


@pytest.fixture
def serve() -> Iterator[Callable[..., BackgroundServer]]:
    """serve(asgi_app) -> a started BackgroundServer; all are stopped at teardown."""
    started: list[BackgroundServer] = []

    def _serve(app) -> BackgroundServer:
        server = BackgroundServer(app).start()
        started.append(server)
        return server

    yield _serve
    for server in reversed(started):
        server.stop()


class BareServer:
    """Plain uvicorn (h11, none of the kit's protocol) serving an ASGI app on a thread: the
    app as Modal serves it (`@modal.asgi_app`: Modal's own front end, then the app itself),
    so what the kit's protocol answers before the app does not answer here."""

    def __init__(self, app) -> None:
        import threading

        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0,
                                                     http="h11", log_level="warning",
                                                     lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self.url = ""

    def start(self) -> BareServer:
        import time

        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            assert self._thread.is_alive() and time.monotonic() < deadline, "did not start"
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)


@pytest.fixture
def serve_bare() -> Iterator[Callable[..., BareServer]]:
    """serve_bare(asgi_app) -> a started `BareServer`; all are stopped at teardown."""
    started: list[BareServer] = []

    def _serve(app) -> BareServer:
        server = BareServer(app).start()
        started.append(server)
        return server

    yield _serve
    for server in reversed(started):
        server.stop()


@pytest.fixture
def mock_policy(serve) -> BackgroundServer:
    """The kit's mock policy served on a free port; its URL + "/v1" is an inference_url."""
    return serve(create_mock_policy_app())


@pytest.fixture
def synth_key() -> str:
    return "sk_synth_test_" + secrets.token_hex(12)


@pytest.fixture
def backend(serve, synth_key, api_key):
    """The stand-in training backend (tests/standins/backend.py) on a free port."""
    from standins.backend import StandinBackend

    standin = StandinBackend(synth_key, env_keys=[api_key])
    standin.url = serve(standin.app).url
    return standin


@pytest.fixture
def math_server(serve, math_config, api_key) -> BackgroundServer:
    """The math task app served with ``api_key``."""
    return serve(create_app(math_config, api_keys=[api_key]))


@pytest.fixture
def sandbox_root() -> Iterator[Path]:
    """A folder for local sandboxes that their own users can reach (pytest's tmp_path is
    closed to other users), removed with what is left in it."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="synth-deploy-test-sandboxes-"))
    root.chmod(0o711)
    yield root / "sandboxes"
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def writes_nothing_into_the_working_directory(request):
    """A test writes under its tmp_path only: what it leaves in the working directory (the
    checkout, for a plain `pytest` run) fails it, named."""
    cwd = Path.cwd()
    before = set(os.listdir(cwd))
    yield
    if Path.cwd() != cwd:  # a test that chdir'd into its tmp_path has it back by now
        return
    # pytest's own cache (where the fuzz test keeps what Hypothesis learned) is pytest's.
    left = sorted(set(os.listdir(cwd)) - before - {".pytest_cache"})
    assert not left, f"{request.node.nodeid} left {left} in {cwd}"
