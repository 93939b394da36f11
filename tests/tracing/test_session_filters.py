"""One rule for which sessions a filter finds, the same wherever it is given: `traces ls`,
`traces export` (SFT; OTLP in tests/otel), `export_sft` with keywords or a `SessionFilter`,
and the viewer's pages and export. The case that told two readers apart: a session whose
policy model is "policy-a" and whose judge call used "judge-b"."""

from __future__ import annotations

import json

import httpx
import pytest
from sessions import judged_session
from typer.testing import CliRunner

from synth_deploy.cli import app as cli_app
from synth_deploy.tracing import (
    SessionFilter,
    export_sft,
    matching_session_ids,
    open_trace_store,
)
from synth_deploy.viewer import create_viewer_app


@pytest.fixture
def store_path(tmp_path):
    path = tmp_path / "t.db"
    with open_trace_store(path) as store:
        store.write_session_sync(judged_session("policy-a", "judge-b"))
        store.write_session_sync(judged_session("judge-b", "judge-c"))  # judge-b as a policy
    return path


@pytest.fixture
def ids(store_path):
    with open_trace_store(store_path, read_only=True) as store:
        return {s.model: s.session_id for s in store.list_sessions(limit=None)}


# model asked for -> the policies whose sessions it finds
CASES = [("policy-a", ["policy-a"]), ("judge-b", ["judge-b"]), ("judge-c", [])]


@pytest.mark.parametrize(("model", "policies"), CASES)
def test_the_store_and_the_library_find_a_session_by_its_policy_model(store_path, ids, model,
                                                                      policies, tmp_path):
    wanted = sorted(ids[p] for p in policies)
    with open_trace_store(store_path, read_only=True) as store:
        assert sorted(s.session_id for s in store.list_sessions(model=model)) == wanted
        assert store.count_sessions(model=model) == len(wanted)
        # what `traces export --format otlp` sends
        assert sorted(matching_session_ids(store, SessionFilter(model=model))) == wanted
        for keyword in (True, False):
            out = tmp_path / f"{model}-{keyword}.jsonl"
            if keyword:
                export_sft(store, out, model=model)
            else:
                export_sft(store, out, where=SessionFilter(model=model))
            exported = {json.loads(line)["metadata"]["session_id"]
                        for line in out.read_text().splitlines()}
            assert sorted(exported) == wanted, ("keywords" if keyword else "where")


@pytest.mark.parametrize(("model", "policies"), CASES)
def test_the_cli_finds_a_session_by_its_policy_model(store_path, ids, model, policies,
                                                     tmp_path):
    wanted = sorted(ids[p] for p in policies)
    runner = CliRunner()
    listed = runner.invoke(cli_app, ["traces", "ls", "--trace-db", str(store_path),
                                     "--model", model, "--json"])
    assert listed.exit_code == 0, listed.output
    assert sorted(r["session_id"] for r in json.loads(listed.stdout)) == wanted
    out = tmp_path / "sft.jsonl"
    exported = runner.invoke(cli_app, ["traces", "export", "--trace-db", str(store_path),
                                       "--model", model, "--out", str(out), "--json"])
    assert exported.exit_code == 0, exported.output
    assert sorted({json.loads(line)["metadata"]["session_id"]
                   for line in out.read_text().splitlines()}) == wanted


@pytest.mark.parametrize(("model", "policies"), CASES)
def test_the_viewer_finds_a_session_by_its_policy_model(store_path, ids, model, policies,
                                                        serve):
    wanted = sorted(ids[p] for p in policies)
    with open_trace_store(store_path, read_only=True) as store:
        server = serve(create_viewer_app(store))
        with httpx.Client(base_url=server.url, timeout=30) as client:
            page = client.get("/api/sessions", params={"model": model}).json()
            assert sorted(r["session_id"] for r in page["rows"]) == wanted
            assert page["total"] == len(wanted)
            summary = client.get("/api/summary", params={"model": model}).json()
            assert summary["sessions"] == len(wanted)
            exported = client.get("/api/export.jsonl", params={"model": model})
            assert sorted({json.loads(line)["metadata"]["session_id"]
                           for line in exported.text.splitlines()}) == wanted
