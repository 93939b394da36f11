"""The viewer's read queries (browse, summary, compare, choices, filtered export) on real
SQLite files with known sessions: each number checked against what was written."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from known_traces import APPS, EPISODE, MODELS, build_known_store, mean
from sessions import make_session
from trace_files import make_synth_ai_db, statements_run

from synth_deploy.errors import UsageError
from synth_deploy.tracing import (
    SessionFilter,
    browse_sessions,
    compare_by_seed,
    export_sft,
    filter_choices,
    open_trace_store,
    reward_summary,
    since_timestamp,
)


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    path = tmp_path_factory.mktemp("browse") / "known.db"
    sessions = build_known_store(path)
    return path, sessions


@pytest.fixture
def store(known):
    with open_trace_store(str(known[0]), read_only=True) as store:
        yield store


def ids(rows) -> list[str]:
    return [r.session_id for r in rows]


def test_default_page_is_newest_first_with_an_exact_total(store, known):
    _, sessions = known
    page = browse_sessions(store, limit=5)
    newest = sorted(sessions, key=lambda s: -s.created_at)
    assert ids(page.rows) == [s.session_id for s in newest[:5]]
    assert (page.total, page.total_is_lower_bound) == (24, False)
    second = browse_sessions(store, offset=5, limit=5)
    assert ids(second.rows) == [s.session_id for s in newest[5:10]]


@pytest.mark.parametrize("where, keep", [
    (SessionFilter(app="crafter"), lambda s: s.app == "crafter"),
    (SessionFilter(app="crafter", model="model-b"),
     lambda s: (s.app, s.model) == ("crafter", "model-b")),
    (SessionFilter(split="test"), lambda s: s.split == "test"),
    (SessionFilter(mode="eval", seed=3), lambda s: s.mode == "eval" and s.seed == 3),
    (SessionFilter(run_id="run-a"), lambda s: s.run_id == "run-a"),
    (SessionFilter(status="error"), lambda s: s.reward is None),
    (SessionFilter(min_reward=0.5, max_reward=0.75),
     lambda s: s.reward is not None and 0.5 <= s.reward <= 0.75),
    (SessionFilter(since=since_timestamp("2025-03-02")), lambda s: s.day >= "2025-03-02"),
    (SessionFilter(until=since_timestamp("2025-03-02")), lambda s: s.day < "2025-03-02"),
    (SessionFilter(split="nowhere"), lambda s: False),
])
def test_filters_select_exactly_the_matching_sessions(store, known, where, keep):
    _, sessions = known
    page = browse_sessions(store, where, limit=100)
    expected = sorted((s for s in sessions if keep(s)), key=lambda s: -s.created_at)
    assert ids(page.rows) == [s.session_id for s in expected]
    assert page.total == len(expected)


def table_scans(path: Path, statements: list[str]) -> list[str]:
    """The statements among ``statements`` whose plan reads every row of a table."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return [sql for sql in statements if any(
            detail in ("SCAN s", "SCAN session_traces")
            for *_, detail in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))]
    finally:
        conn.close()


@pytest.mark.parametrize("sort", ["created", "app", "model", "run", "reward"])
@pytest.mark.parametrize("where", [
    SessionFilter(), SessionFilter(app="crafter"), SessionFilter(model="model-b"),
    SessionFilter(status="error"), SessionFilter(mode="eval", split="test"),
    SessionFilter(seed=3, min_reward=0.5), SessionFilter(run_id="run-a"),
    SessionFilter(since=since_timestamp("2025-03-02"))])
def test_a_filtered_sorted_page_reads_indexes_and_its_own_rows_only(store, known, where,
                                                                      sort):
    # What keeps a page fast at a million sessions: whatever the filter and the order, the
    # sessions are picked from an index (the glance index holds every filter's column) and
    # only the page's rows are read.
    seen = statements_run(store)
    page = browse_sessions(store, where, sort=sort, limit=5)
    assert page.rows or page.total == 0
    assert len(seen) == 2  # the page, and its count
    assert table_scans(known[0], seen) == []


def test_choices_glance_comparison_and_listing_read_indexes_only(store, known):
    seen = statements_run(store)
    filter_choices(store)
    reward_summary(store, SessionFilter(app="math", mode="eval"))
    reward_summary(store)
    compare_by_seed(store, "model-a", "model-b", where=SessionFilter(app="math"))
    store.list_sessions(app="crafter", model="model-b", status="ok")
    assert len(seen) > 10 and table_scans(known[0], seen) == []


def test_rows_carry_what_the_table_shows(store, known):
    _, sessions = known
    by_id = {r.session_id: r for r in browse_sessions(store, limit=100).rows}
    for s in sessions:
        row = by_id[s.session_id]
        assert (row.app_id, row.model, row.seed, row.run_id, row.mode, row.split, row.status,
                row.total_reward) == (s.app, s.model, s.seed, s.run_id, s.mode, s.split,
                                      s.status, s.reward)
    failed = next(r for r in by_id.values() if r.status == "error")
    assert failed.error == "rollout run-a failed: policy timed out"


@pytest.mark.parametrize("sort", ["reward", "app", "model", "run", "created"])
@pytest.mark.parametrize("descending", [True, False])
def test_sorting_orders_the_whole_set_before_paging(store, known, sort, descending):
    _, sessions = known
    attr = {"reward": "reward", "app": "app", "model": "model", "run": "run_id",
            "created": "created_at"}[sort]
    rows = browse_sessions(store, sort=sort, descending=descending, limit=100).rows
    by_id = {s.session_id: s for s in sessions}
    keys = [getattr(by_id[r.session_id], attr) for r in rows]
    present = [k for k in keys if k is not None]
    assert present == sorted(present, reverse=descending)
    first = browse_sessions(store, sort=sort, descending=descending, limit=7).rows
    assert ids(first) == ids(rows[:7])


def test_every_filter_is_counted_exactly_on_an_indexed_store(store):
    for where in (SessionFilter(split="train"), SessionFilter(mode="eval", status="ok"),
                  SessionFilter(app="math", model="model-b")):
        page = browse_sessions(store, where, limit=2, count_cap=5)
        assert page.total > 5 and not page.total_is_lower_bound


def test_counting_stops_at_the_cap_where_filters_read_the_metadata(tmp_path):
    path = tmp_path / "old.db"
    make_synth_ai_db(path)
    conn = sqlite3.connect(path)  # five more sessions as synth-ai writes them
    conn.executemany("INSERT INTO session_traces SELECT ?, created_at, num_timesteps, "
                     "num_events, num_messages, metadata, experiment_id, NULL FROM "
                     "session_traces WHERE session_id = 'old-session'",
                     [(f"old-{i}",) for i in range(5)])
    conn.commit()
    conn.close()
    with open_trace_store(str(path), read_only=True) as store:
        page = browse_sessions(store, SessionFilter(app="crafter"), limit=2, count_cap=3)
    assert (page.total, page.total_is_lower_bound, len(page.rows)) == (3, True, 2)


def test_bad_requests_say_what_is_wrong(store):
    with pytest.raises(UsageError, match="cannot sort by 'seed'"):
        browse_sessions(store, sort="seed")
    with pytest.raises(UsageError, match="bad page"):
        browse_sessions(store, limit=0)
    with pytest.raises(UsageError, match="status must be 'ok' or 'error'"):
        SessionFilter(status="failed")
    with pytest.raises(UsageError, match="reward range is empty") as err:
        SessionFilter(min_reward=1, max_reward=0)
    assert err.value.hint == "swap the two bounds"


def test_summary_matches_the_sessions(store, known):
    _, sessions = known
    crafter = [s for s in sessions if s.app == "crafter"]
    summary = reward_summary(store, SessionFilter(app="crafter"))
    assert summary.sessions == 12 and summary.errors == 0
    assert summary.mean_reward == pytest.approx(mean(s.reward for s in crafter))
    assert {b["lo"]: b["count"] for b in summary.histogram} == Counter(s.reward for s in crafter)
    everything = reward_summary(store)
    assert (everything.sessions, everything.errors) == (24, 1)
    assert everything.error_rate == pytest.approx(1 / 24)
    assert everything.scored == 23
    series = {(s["app"], s["model"]): s for s in everything.series}
    assert set(series) == {(a, m) for a in APPS for m in MODELS}
    for (app, model), line in series.items():
        mine = [s for s in sessions if (s.app, s.model) == (app, model)]
        assert line["sessions"] == len(mine) == sum(p["sessions"] for p in line["points"])
        weighted = sum(p["mean_reward"] * p["scored"] for p in line["points"]
                       if p["mean_reward"] is not None)
        assert weighted == pytest.approx(sum(s.reward or 0 for s in mine))
    scores = {e["reward_type"]: e for e in everything.event_scores}
    answers = [r for s in sessions if (s.app, s.model, s.seed) != EPISODE
               for r in s.event_rewards]
    assert scores["answer_correct"]["events"] == len(answers)
    assert scores["answer_correct"]["mean"] == pytest.approx(mean(answers))
    assert scores["achievement_delta"] == {"reward_type": "achievement_delta", "events": 2,
                                           "mean": 1.0}


def test_many_distinct_rewards_are_binned(tmp_path):
    from synth_deploy.tracing import SessionTracer

    with open_trace_store(str(tmp_path / "t.db")) as store:
        for i in range(50):
            tracer = SessionTracer(metadata={"app_id": "x", "status": "ok"})
            tracer.record_outcome_reward(i / 49)
            store.write_session_sync(tracer.finish())
        summary = reward_summary(store)
    assert len(summary.histogram) == 20
    assert sum(b["count"] for b in summary.histogram) == 50
    assert summary.histogram[0]["lo"] == 0 and summary.histogram[-1]["hi"] == pytest.approx(1)


def test_compare_by_model_and_by_run_per_seed(store, known):
    _, sessions = known
    for by, a, b in (("model", "model-a", "model-b"), ("run", "run-a", "run-b")):
        result = compare_by_seed(store, a, b, by=by, where=SessionFilter(app="math"))
        key = "model" if by == "model" else "run_id"
        expected = {}
        for seed in range(6):
            side = {v: [s.reward for s in sessions if s.app == "math" and s.seed == seed
                        and getattr(s, key) == v] for v in (a, b)}
            expected[seed] = (mean(side[a]), mean(side[b]))
        got = {r["seed"]: (r["a"], r["b"]) for r in result.seeds}
        assert got == expected  # quarters: exact in binary
        both = [(x, y) for x, y in expected.values() if x is not None and y is not None]
        assert result.shared_seeds == len(both) == 5  # seed 5 of model-a failed
        assert result.mean_difference == pytest.approx(mean(y - x for x, y in both))
        assert result.b_better + result.a_better + result.ties == 5
    with pytest.raises(UsageError, match="cannot compare by 'app'"):
        compare_by_seed(store, "math", "crafter", by="app")  # type: ignore[arg-type]


def test_choices_list_every_value(store):
    choices = filter_choices(store)
    assert choices["app"] == sorted(APPS) and choices["model"] == list(MODELS)
    assert (choices["run"], choices["mode"], choices["split"]) == (
        ["run-a", "run-b"], ["eval", "train"], ["test", "train"])
    assert choices["sessions"] == 24


def test_export_of_a_filter_is_the_cli_export_of_the_same_sessions(store, known, tmp_path):
    viewer = export_sft(store, tmp_path / "viewer.jsonl",
                        where=SessionFilter(app="crafter", min_reward=0.5))
    cli = export_sft(store, tmp_path / "cli.jsonl", app="crafter", min_reward=0.5)
    assert viewer.examples == cli.examples > 0
    assert (tmp_path / "viewer.jsonl").read_text() == (tmp_path / "cli.jsonl").read_text()
    split = export_sft(store, tmp_path / "split.jsonl", where=SessionFilter(split="test"))
    lines = [json.loads(x) for x in (tmp_path / "split.jsonl").read_text().splitlines()]
    assert {x["metadata"]["seed"] for x in lines} == {4, 5}  # failed sessions never exported
    assert split.sessions == 7
    failed = export_sft(store, tmp_path / "err.jsonl", where=SessionFilter(status="error"))
    assert failed.examples == 0


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_synth_ai_file_is_browsed_read_only_from_its_metadata(tmp_path):
    path = tmp_path / "old.db"
    make_synth_ai_db(path)
    before = digest(tmp_path)
    with open_trace_store(str(path), read_only=True) as store:
        page = browse_sessions(store, SessionFilter(app="crafter", min_reward=0.25))
        [row] = page.rows
        assert (row.session_id, row.run_id, row.seed, row.model, row.total_reward,
                row.status) == ("old-session", "old-1", 4, "qwen", 0.25, "ok")
        assert reward_summary(store).mean_reward == 0.25
        assert filter_choices(store)["app"] == ["crafter"]
    assert digest(tmp_path) == before


def test_large_sets_sample_the_curve_and_event_scores_but_count_exactly(tmp_path):
    from known_traces import build_learning_run

    sessions = build_learning_run(tmp_path / "run.db")  # models take turns, session by session
    with open_trace_store(str(tmp_path / "run.db"), read_only=True) as store:
        exact = reward_summary(store)
        sampled = reward_summary(store, sample_above=100)
    assert (exact.sampled_every, sampled.sampled_every) == (1, 6)
    assert sampled.events_sampled_every == 30
    for figure in ("sessions", "errors", "scored", "mean_reward", "histogram"):
        assert getattr(sampled, figure) == getattr(exact, figure)
    assert exact.sessions == len(sessions)
    per_model = {s["model"]: s["sessions"] for s in sampled.series}
    # a hash of the rowid, not rowid % 6, which would pick one model only
    assert set(per_model) == {"model-a", "model-b"}
    assert all(30 <= n <= 70 for n in per_model.values()), per_model
    [score] = sampled.event_scores
    assert 5 <= score["events"] <= 40
    assert score["mean"] == pytest.approx(exact.event_scores[0]["mean"], abs=0.15)


def test_every_time_read_from_the_store_has_its_zone(tmp_path):
    # The store keeps synth-ai's UTC text without a zone (with or without a fraction); every
    # reader gives it as live answers give times: ISO 8601, +00:00.
    from typer.testing import CliRunner

    from synth_deploy.cli import app as cli_app
    from synth_deploy.tracing import utc_text

    path = tmp_path / "t.db"
    sessions = [make_session(i) for i in range(3)]
    with open_trace_store(str(path)) as store:
        store.write_sessions_sync(sessions)
    with sqlite3.connect(path) as conn:  # as synth-ai wrote it: whole seconds
        conn.execute("UPDATE session_traces SET created_at = '2026-12-07 03:19:51' WHERE "
                     "session_id = ?", (sessions[0].session_id,))
    expected = {s.session_id: utc_text(s.created_at) for s in sessions[1:]}
    expected[sessions[0].session_id] = "2026-12-07T03:19:51+00:00"

    def run(*args: str):
        result = CliRunner().invoke(cli_app, ["traces", *args, "--trace-db", str(path),
                                              "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    assert {r["session_id"]: r["created_at"] for r in run("ls")} == expected
    stats = run("stats")
    assert (stats["first_at"], stats["last_at"]) == (min(expected.values()),
                                                     max(expected.values()))
    with open_trace_store(str(path), read_only=True) as store:
        page = browse_sessions(store, limit=10)
        assert {r.session_id: r.created_at for r in page.rows} == expected
        choices = filter_choices(store)
        assert choices["first_at"].endswith("+00:00") and choices["last_at"].endswith("+00:00")
