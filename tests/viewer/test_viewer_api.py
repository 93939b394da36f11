"""The JSON endpoints behind the viewer page, served by real uvicorn over a read-only store of
known sessions; every number checked against what was written."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import httpx
import pytest
from known_traces import EPISODE, FRAME_URL, build_known_store, mean

from synth_deploy.tracing import SessionTracer, export_sft, open_trace_store
from synth_deploy.viewer import content_parts, create_viewer_app


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    folder = tmp_path_factory.mktemp("viewer")
    sessions = build_known_store(folder / "known.db")
    return folder / "known.db", sessions


@pytest.fixture
def viewer(known, serve):
    with open_trace_store(str(known[0]), read_only=True) as store:
        server = serve(create_viewer_app(store))
        with httpx.Client(base_url=server.url, timeout=30) as client:
            yield client


def test_choices_name_every_app_model_run_mode_and_split(viewer, known):
    data = viewer.get("/api/choices").json()
    assert data["app"] == ["crafter", "math"] and data["model"] == ["model-a", "model-b"]
    assert (data["run"], data["mode"], data["split"]) == (["run-a", "run-b"], ["eval", "train"],
                                                          ["test", "train"])
    assert data["sessions"] == 24 and data["store"] == str(known[0])


def test_sessions_page_filter_and_sort(viewer, known):
    _, sessions = known
    page = viewer.get("/api/sessions", params={"limit": 4, "offset": 2}).json()
    newest = sorted(sessions, key=lambda s: -s.created_at)
    assert [r["session_id"] for r in page["rows"]] == [s.session_id for s in newest[2:6]]
    assert (page["total"], page["offset"], page["limit"]) == (24, 2, 4)
    picked = viewer.get("/api/sessions", params={
        "app": "crafter", "split": "train", "min_reward": "0.25", "max_reward": "0.75",
        "sort": "reward", "order": "asc"}).json()
    expected = [s for s in sessions if s.app == "crafter" and s.split == "train"
                and 0.25 <= s.reward <= 0.75]
    assert sorted(r["session_id"] for r in picked["rows"]) == sorted(
        s.session_id for s in expected)
    rewards = [r["total_reward"] for r in picked["rows"]]
    assert rewards == sorted(rewards) and picked["total"] == len(expected)
    day = viewer.get("/api/sessions", params={"since": "2025-03-01", "until": "2025-03-01"})
    assert {r["app_id"] for r in day.json()["rows"]} == {"math"}  # "until" a day: all of it


@pytest.mark.parametrize("params, says", [
    ({"min_reward": "lots"}, "min_reward='lots' is not a number"),
    ({"seed": "1.5"}, "seed='1.5' is not an integer"),
    ({"sort": "seed"}, "sort='seed' is not a column the table sorts by"),
    ({"order": "up"}, "order='up' must be asc or desc"),
    ({"limit": "0"}, "limit 1 to 500"),
    ({"limit": "100000"}, "limit 1 to 500"),
    ({"status": "broken"}, "status must be 'ok' or 'error'"),
    ({"since": "last tuesday"}, "since='last tuesday'"),
    ({"min_reward": "1", "max_reward": "0"}, "reward range is empty"),
    ({"min_reward": "nan"}, "not a finite number"),
])
def test_bad_parameters_are_400_naming_the_parameter(viewer, params, says):
    resp = viewer.get("/api/sessions", params=params)
    assert resp.status_code == 400
    assert says in resp.json()["error"]["message"]


BIG = str(2**63)  # one past the largest integer SQLite stores


@pytest.mark.parametrize("path, params", [
    ("/api/sessions", {"seed": BIG}), ("/api/sessions", {"seed": "-" + BIG + "1"}),
    ("/api/sessions", {"offset": BIG}), ("/api/summary", {"seed": BIG}),
    ("/api/compare", {"seed": BIG, "a": "model-a", "b": "model-b"}),
    ("/api/export.jsonl", {"seed": BIG}), ("/api/sessions", {"min_reward": "1e400"}),
])
def test_a_number_past_64_bits_is_400_not_a_server_error(viewer, path, params):
    resp = viewer.get(path, params=params)
    assert resp.status_code == 400, resp.text
    name = next(iter(params))
    assert resp.json()["error"]["message"].startswith(f"{name}=")


def test_the_openapi_document_names_every_json_endpoint_and_parameter(viewer, known):
    from starlette.routing import Route

    with open_trace_store(str(known[0]), read_only=True) as store:
        routes = {re.sub(r":\w+}", "}", r.path) for r in create_viewer_app(store).routes
                  if isinstance(r, Route)}  # "{session_id:str}" -> "{session_id}"
    doc = viewer.get("/api/openapi.json").json()
    assert set(doc["paths"]) == {p for p in routes if p.startswith("/api/")} - {
        "/api/openapi.json"}
    names = {p["name"] for p in doc["paths"]["/api/sessions"]["get"]["parameters"]}
    assert names == {"app", "app_digest", "model", "run", "split", "mode", "status", "seed",
                     "min_reward", "max_reward", "since", "until", "reward_version", "sort",
                     "order", "offset", "limit"}


def test_summary_endpoint(viewer, known):
    _, sessions = known
    data = viewer.get("/api/summary", params={"model": "model-a"}).json()
    mine = [s for s in sessions if s.model == "model-a"]
    assert (data["sessions"], data["errors"]) == (12, 1)
    assert data["error_rate"] == pytest.approx(1 / 12)
    assert data["mean_reward"] == pytest.approx(mean(s.reward for s in mine))
    assert sum(b["count"] for b in data["histogram"]) == 11
    assert {(s["app"], s["model"]) for s in data["series"]} == {("math", "model-a"),
                                                                ("crafter", "model-a")}
    empty = viewer.get("/api/summary", params={"app": "nothing"}).json()
    assert (empty["sessions"], empty["mean_reward"], empty["error_rate"]) == (0, None, None)


def test_replay_of_a_multi_turn_episode(viewer, known):
    _, sessions = known
    episode = next(s for s in sessions if (s.app, s.model, s.seed) == EPISODE)
    # A prefix will do: past the 8 digits of the second the id was made, 8 random ones (with
    # only 2, two sessions made in the same second shared the prefix 1 time in 256).
    data = viewer.get(f"/api/sessions/{episode.session_id[:16]}").json()
    assert data["session_id"] == episode.session_id
    assert (data["app_id"], data["model"], data["seed"], data["split"], data["mode"]) == (
        "crafter", "model-b", 1, "train", "eval")
    assert data["outcome_rewards"][-1]["total_reward"] == episode.reward
    totals = data["totals"]
    assert (totals["turns"], totals["lm_calls"], totals["images"]) == (3, 3, 3)
    assert (totals["input_tokens"], totals["output_tokens"]) == (episode.input_tokens,
                                                                 episode.output_tokens)
    assert totals["event_reward"] == sum(episode.event_rewards) == 2.0
    first, second, third = data["turns"]
    image = first["messages"][1]["parts"][1]
    assert image == {"type": "image", "src": FRAME_URL}
    assert first["lm_calls"][0]["tool_calls"][0]["name"] == "interact"
    assert first["messages"][-1]["tool_calls"][0]["arguments"] == '{"actions": ["move_left", "do"]}'
    assert (first["reward"], second["reward"], third["reward"]) == (0, 1.0, 1.0)
    assert [t["env_reward"] for t in data["turns"]] == [0.0, 1.0, 1.0]
    assert [t["event_rewards"] for t in data["turns"]] == [0, 1, 1]
    assert data["has_achievements"] is True and first["env_events"][0]["achievements"] == []
    plain = next(s for s in sessions if s.app == "math" and s.reward is not None)
    assert viewer.get(f"/api/sessions/{plain.session_id}").json()["has_achievements"] is False
    assert third["env_events"][0]["achievements"] == ["collect_wood", "place_table"]
    assert third["env_events"][0]["terminated"] is True
    assert second["env_events"][0]["rewards"][0]["type"] == "achievement_delta"


def test_unknown_session_is_404_with_a_hint(viewer):
    resp = viewer.get("/api/sessions/nope")
    assert resp.status_code == 404
    assert resp.json()["error"]["hint"]


def test_compare_endpoint(viewer, known):
    _, sessions = known
    data = viewer.get("/api/compare", params={"by": "run", "a": "run-a", "b": "run-b",
                                              "app": "crafter"}).json()
    for row in data["seeds"]:
        a = [s.reward for s in sessions if s.app == "crafter" and s.seed == row["seed"]
             and s.run_id == "run-a"]
        b = [s.reward for s in sessions if s.app == "crafter" and s.seed == row["seed"]
             and s.run_id == "run-b"]
        assert (row["a"], row["b"], row["difference"]) == (mean(a), mean(b), mean(b) - mean(a))
    assert data["shared_seeds"] == 6
    assert viewer.get("/api/compare", params={"by": "app", "a": "x", "b": "y"}).status_code == 400


def test_export_downloads_what_the_cli_exports(viewer, known, tmp_path):
    resp = viewer.get("/api/export.jsonl", params={"app": "crafter", "min_reward": "0.5"})
    assert resp.status_code == 200
    assert "attachment" in resp.headers["content-disposition"]
    with open_trace_store(str(known[0]), read_only=True) as store:
        result = export_sft(store, tmp_path / "cli.jsonl", app="crafter", min_reward=0.5)
    assert resp.text == (tmp_path / "cli.jsonl").read_text()
    assert int(resp.headers["x-examples"]) == result.examples > 0
    assert viewer.get("/api/export.jsonl", params={"seed": "x"}).status_code == 400


def test_page_and_assets_ship_in_the_package_and_load_nothing_else(viewer):
    page = viewer.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "default-src 'none'" in page.headers["content-security-policy"]
    for asset in ("/static/app.js", "/static/style.css", "/static/favicon.svg"):
        resp = viewer.get(asset)
        assert resp.status_code == 200 and resp.headers["x-content-type-options"] == "nosniff"
        assert "http://" not in resp.text.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in resp.text


def test_other_host_names_are_refused(viewer):
    # A site that points its DNS name at 127.0.0.1 must not read the traces.
    resp = viewer.get("/api/choices", headers={"Host": "attacker.example:8765"})
    assert resp.status_code == 400
    assert viewer.get("/api/choices", headers={"Host": "localhost:8765"}).status_code == 200


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_viewing_never_changes_a_byte_of_the_store(tmp_path, serve):
    build_known_store(tmp_path / "t.db")
    before = digest(tmp_path)
    with open_trace_store(str(tmp_path / "t.db"), read_only=True) as store:
        server = serve(create_viewer_app(store))
        for path in ("/", "/api/choices", "/api/sessions", "/api/summary",
                     "/api/compare?a=model-a&b=model-b", "/api/export.jsonl"):
            assert httpx.get(server.url + path, timeout=30).status_code == 200
        server.stop()
    assert digest(tmp_path) == before


def test_an_infinite_reward_does_not_break_the_json(tmp_path, serve):
    with open_trace_store(str(tmp_path / "t.db")) as store:
        tracer = SessionTracer(metadata={"app_id": "x", "status": "ok"})
        # As another writer may have stored it (the kit's tracer refuses such a reward);
        # SQLite keeps inf (NaN becomes NULL).
        tracer.record_outcome_reward(1.0).total_reward = float("inf")
        store.write_session_sync(tracer.finish())
    with open_trace_store(str(tmp_path / "t.db"), read_only=True) as store:
        server = serve(create_viewer_app(store))
        resp = httpx.get(server.url + "/api/sessions", timeout=30)
    assert resp.status_code == 200
    # strict JSON (no Infinity token), the reward shown as missing
    assert json.loads(resp.text, parse_constant=lambda c: 1 / 0)["rows"][0]["total_reward"] is None


@pytest.mark.parametrize("content, expected", [
    ("plain", [{"type": "text", "text": "plain"}]),
    ([{"type": "image_url", "image_url": {"url": FRAME_URL}}],
     [{"type": "image", "src": FRAME_URL}]),
    ([{"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}],
     [{"type": "image_ref", "url": "https://example.com/x.png"}]),
    ([{"type": "image_url", "image_url": "data:image/svg+xml;base64,PHN2Zz4="}],
     [{"type": "image_ref", "url": "(inline data)"}]),
    ({"type": "input_image", "image_url": FRAME_URL}, [{"type": "image", "src": FRAME_URL}]),
    ([{"type": "tool_result", "ok": True}], [{"type": "json", "value": {"type": "tool_result",
                                                                         "ok": True}}]),
])
def test_only_raster_data_urls_become_images(content, expected):
    # Nothing in a trace can make the page fetch from elsewhere or run script.
    assert content_parts(content) == expected


def test_a_turn_shows_what_it_added_to_the_conversation():
    from synth_deploy.viewer import session_replay

    # call_policy records the whole conversation each turn, as a multi-turn app sends it
    tracer = SessionTracer()
    sent: list[dict] = [{"role": "system", "content": "Play."}]
    for turn in (1, 2):
        tracer.start_timestep(f"turn-{turn}", turn_number=turn)
        sent.append({"role": "user", "content": [
            {"type": "text", "text": f"obs {turn}"},
            {"type": "image_url", "image_url": {"url": FRAME_URL}}]})
        for m in sent:
            tracer.record_message(m["role"], m["content"])
        tracer.record_message("assistant", f"move {turn}")
        sent.append({"role": "assistant", "content": f"move {turn}"})
    first, second = session_replay(tracer.finish())["turns"]
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant"]
    assert [(m["role"], m["parts"][0]["text"]) for m in second["messages"]] == [
        ("user", "obs 2"), ("assistant", "move 2")]
    assert second["repeated_messages"] == 3


def test_the_viewer_reads_a_remote_libsql_store(tmp_path, serve):
    """Turso/sqld through the real `libsql` client, against the Hrana stand-in."""
    pytest.importorskip("libsql")
    from standins.libsql_hrana import start_hrana_process

    from synth_deploy.env import Env
    from synth_deploy.tracing import parse_trace_db

    sessions = build_known_store(tmp_path / "remote.db")
    token = "turso-test-token-" + "v" * 24
    proc, url = start_hrana_process(str(tmp_path / "remote.db"), token=token)
    try:
        setting = parse_trace_db(url, env=Env({"TURSO_AUTH_TOKEN": token},
                                              {"TURSO_AUTH_TOKEN": "environment"}))
        with open_trace_store(setting, read_only=True) as store:
            server = serve(create_viewer_app(store))
            page = httpx.get(server.url + "/api/sessions", params={"app": "crafter"},
                             timeout=60).json()
            summary = httpx.get(server.url + "/api/summary", timeout=60).json()
            episode = next(s for s in sessions if (s.app, s.model, s.seed) == EPISODE)
            replay = httpx.get(server.url + f"/api/sessions/{episode.session_id}",
                               timeout=60).json()
    finally:
        proc.kill()
        proc.wait(10)
    assert page["total"] == 12 and {r["app_id"] for r in page["rows"]} == {"crafter"}
    assert (summary["sessions"], summary["errors"]) == (24, 1)
    assert summary["mean_reward"] == pytest.approx(mean(s.reward for s in sessions))
    assert (replay["totals"]["turns"], replay["totals"]["images"]) == (3, 3)
