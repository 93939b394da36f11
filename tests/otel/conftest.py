"""A real OTLP receiver for the OpenTelemetry tests: an MLflow tracking server.

`mlflow server` accepts OTLP/HTTP (protobuf) at /v1/traces, stores the spans in SQLite, and
answers `mlflow.search_traces` with them: spans go in through the protocol and come back
through MLflow's own API. It takes tens of seconds to start on a busy machine, so one server
serves the whole test session; each test gets its own experiment (the
``x-mlflow-experiment-id`` header), so tests never see each other's traces.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from processes import clean_env, free_port

START_TIMEOUT_S = 240.0


class MlflowReceiver:
    """A running `mlflow server` child: its URL, and reads through MLflow's client."""

    def __init__(self, url: str) -> None:
        self.url = url
        import mlflow

        self._client = mlflow.MlflowClient(tracking_uri=url)

    def new_experiment(self) -> str:
        return self._client.create_experiment(f"test-{uuid.uuid4().hex[:12]}")

    def headers(self, experiment_id: str) -> list[str]:
        return [f"x-mlflow-experiment-id={experiment_id}"]

    def traces(self, experiment_id: str, *, expect: int | None = None,
               wait_s: float = 30.0) -> list:
        """The experiment's traces (full, with spans); with ``expect``, wait until that many
        are there (the server commits what it was sent before it answers, but be patient
        with a loaded machine)."""
        deadline = time.monotonic() + wait_s
        while True:
            found = self._client.search_traces(locations=[experiment_id], max_results=500)
            if expect is None or len(found) >= expect or time.monotonic() > deadline:
                return list(found)
            time.sleep(0.5)


@pytest.fixture(scope="session")
def mlflow_receiver(tmp_path_factory) -> Iterator[MlflowReceiver]:
    folder: Path = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
         "--default-artifact-root", str(folder / "artifacts")],
        cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=clean_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise AssertionError("mlflow server exited: "
                                     + (folder / "server.log").read_text()[-3000:])
            try:
                if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"mlflow server did not start in {START_TIMEOUT_S:g}s: "
                                     + (folder / "server.log").read_text()[-3000:])
            time.sleep(0.5)
        yield MlflowReceiver(url)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()
