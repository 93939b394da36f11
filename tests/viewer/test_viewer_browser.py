"""The viewer page in a real headless Chromium: load a store of known sessions, filter, sort,
page, open a replay, compare, export; every number on the page checked against the store."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest
from chromium import chromium, find_chromium, wait_ready
from known_traces import (
    ACHIEVEMENTS,
    EPISODE,
    build_known_store,
    build_learning_run,
    mean,
)

from synth_deploy.tracing import SessionTracer, export_sft, open_trace_store
from synth_deploy.viewer import create_viewer_app

# Set to a folder to keep the screenshots: the README's docs/viewer.png is made by
# SYNTH_DEPLOY_VIEWER_SCREENSHOTS=docs pytest tests/viewer/test_viewer_browser.py -k learning
SCREENSHOTS_VAR = "SYNTH_DEPLOY_VIEWER_SCREENSHOTS"


def shown(x: float | None, digits: int = 4) -> str:
    """A number as the page prints it (app.js `num`): up to 4 decimals, no trailing zeros."""
    if x is None:
        return "–"
    text = f"{round(x, digits):.{digits}f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    find_chromium()  # skip (or fail under CI) before building anything
    folder = tmp_path_factory.mktemp("viewer-browser")
    return folder / "known.db", build_known_store(folder / "known.db")


@pytest.fixture
def page(known, serve, tmp_path):
    """(driver, base URL): Chromium on the viewer over the known store, opened read-only."""
    with open_trace_store(str(known[0]), read_only=True) as store:
        server = serve(create_viewer_app(store))
        with chromium(tmp_path / "profile", downloads=tmp_path / "downloads") as driver:
            yield driver, server.url


def screenshot(driver, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    assert driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    keep = os.environ.get(SCREENSHOTS_VAR)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
    return path


def text(driver, css: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css).text


def table(driver) -> list[tuple[str, str]]:
    """(session id, reward shown) for each row of the sessions table."""
    return [tuple(x) for x in driver.execute_script(
        "return [...document.querySelectorAll('#sessions tbody tr')].map(tr => "
        "[tr.dataset.sessionId, tr.querySelector('[data-field=reward]').textContent])")]


def choose(driver, name: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.CSS_SELECTOR, f"#filters [name={name}]")).select_by_value(value)


@pytest.mark.slow
def test_filter_then_replay_shows_the_stored_numbers(page, known, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver, url = page
    _, sessions = known
    driver.get(url + "/")
    wait_ready(driver)
    assert text(driver, "#glance-sessions") == "24"
    assert text(driver, "#glance-mean") == shown(mean(s.reward for s in sessions))
    assert text(driver, "#glance-errors") == "4.17%"  # 1 failed of 24
    assert text(driver, "#sessions-total") == "1–24 of 24 sessions"
    rewards = {s.session_id: shown(s.reward) for s in sessions}
    assert dict(table(driver)) == rewards
    screenshot(driver, tmp_path, "known-sessions")

    choose(driver, "app", "crafter")  # a select applies itself
    wait_ready(driver, "app=crafter")
    choose(driver, "model", "model-b")
    wait_ready(driver, "model=model-b")
    picked = [s for s in sessions if (s.app, s.model) == ("crafter", "model-b")]
    newest = sorted(picked, key=lambda s: -s.created_at)
    assert table(driver) == [(s.session_id, shown(s.reward)) for s in newest]
    assert text(driver, "#sessions-total") == "1–6 of 6 sessions"
    assert text(driver, "#glance-mean") == shown(mean(s.reward for s in picked))

    box = driver.find_element(By.CSS_SELECTOR, "#filters [name=min_reward]")
    box.send_keys("0.5", Keys.ENTER)
    wait_ready(driver, "min_reward=0.5")
    assert sorted(table(driver)) == sorted((s.session_id, shown(s.reward)) for s in picked
                                           if s.reward >= 0.5)
    box.clear()
    box.send_keys(Keys.ENTER)
    wait_ready(driver, "model=model-b")

    episode = next(s for s in sessions if (s.app, s.model, s.seed) == EPISODE)
    driver.find_element(By.CSS_SELECTOR, f"tr[data-session-id='{episode.session_id}'] a").click()
    wait_ready(driver, episode.session_id)
    assert text(driver, "#replay-id") == episode.session_id
    facts = dict(driver.execute_script(
        "return [...document.querySelectorAll('.fact')].map(f => "
        "[f.dataset.field, f.querySelector('.value').textContent])"))
    assert facts["reward"] == shown(episode.reward)
    assert facts["tokens"] == f"{episode.input_tokens:,} in / {episode.output_tokens} out"
    assert (facts["turns"], facts["lm_calls"], facts["seed"], facts["split"]) == (
        "3", "3", "1", "train")
    assert facts["event_reward"] == shown(sum(episode.event_rewards))
    assert facts["achievements"] == str(len(ACHIEVEMENTS))
    # Each turn's header: the environment's reward, and the event rewards when some were
    # recorded (turn 1 unlocked nothing: no event reward).
    env_rewards = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".turn-env-reward")]
    assert env_rewards == ["· env reward 0", "· env reward 1", "· env reward 1"]
    turn_rewards = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".turn-reward")]
    assert turn_rewards == ["· event rewards 1", "· event rewards 1"]
    frames = driver.execute_script(
        "return [...document.querySelectorAll('img.frame')].map(i => "
        "[i.complete, i.naturalWidth, i.naturalHeight])")
    assert frames == [[True, 4, 3]] * 3  # the recorded PNGs, decoded inline
    calls = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".msg .tool-call")]
    assert calls == ['tool call interact({"actions": ["move_left", "do"]})'] * 3
    tags = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".achievements .tag")]
    assert tags == ["collect_wood", "collect_wood", "place_table"]
    screenshot(driver, tmp_path, "known-replay")

    driver.find_element(By.ID, "back").click()
    wait_ready(driver, "model=model-b")
    assert len(table(driver)) == 6

    # Offline: everything the page loaded came from the viewer itself, without errors.
    loaded = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded and all(u.startswith(url) for u in loaded)
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_sort_and_page_through_the_table(page, known):
    from selenium.webdriver.common.by import By

    driver, url = page
    _, sessions = known
    driver.get(url + "/#/sessions?limit=10")
    wait_ready(driver, "limit=10")
    assert text(driver, "#sessions-total") == "1–10 of 24 sessions"
    assert not driver.find_element(By.ID, "next").get_attribute("disabled")
    driver.find_element(By.ID, "next").click()
    wait_ready(driver, "offset=10")
    newest = sorted(sessions, key=lambda s: -s.created_at)
    assert [sid for sid, _ in table(driver)] == [s.session_id for s in newest[10:20]]
    driver.find_element(By.CSS_SELECTOR, "th[data-sort=reward]").click()
    wait_ready(driver, "sort=reward")
    assert text(driver, "#sessions-total") == "1–10 of 24 sessions"  # sorting starts over
    top = sorted((s.reward for s in sessions if s.reward is not None), reverse=True)[:10]
    assert [r for _, r in table(driver)] == [shown(x) for x in top]
    driver.find_element(By.CSS_SELECTOR, "th[data-sort=reward]").click()
    wait_ready(driver, "order=asc")
    assert [r for _, r in table(driver)][:2] == ["–", "0"]  # the failed one has no reward


def test_compare_two_models_seed_by_seed(page, known):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver, url = page
    _, sessions = known
    driver.get(url + "/#/compare?app=math")
    wait_ready(driver, "compare")
    form = driver.find_element(By.ID, "compare-form")
    Select(form.find_element(By.NAME, "a")).select_by_value("model-a")
    Select(form.find_element(By.NAME, "b")).select_by_value("model-b")
    form.find_element(By.ID, "compare-go").click()
    wait_ready(driver, "b=model-b")
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#compare tbody tr')].map(tr => "
        "[tr.dataset.seed, tr.querySelector('[data-field=difference]').textContent])")
    expected, diffs = [], []
    for seed in range(6):
        a = mean(s.reward for s in sessions if (s.app, s.model, s.seed) == ("math", "model-a",
                                                                             seed))
        b = mean(s.reward for s in sessions if (s.app, s.model, s.seed) == ("math", "model-b",
                                                                             seed))
        diff = None if a is None or b is None else b - a
        expected.append([str(seed), shown(diff)])
        if diff is not None:
            diffs.append(diff)
    assert rows == expected
    assert text(driver, "#compare-diff") == shown(mean(diffs))
    assert text(driver, "#compare-shared") == "5"


def test_export_button_downloads_the_filtered_sft_jsonl(page, known, tmp_path):
    from selenium.webdriver.common.by import By

    driver, url = page
    driver.get(url + "/#/sessions?app=crafter&min_reward=0.5")
    wait_ready(driver, "min_reward=0.5")
    driver.find_element(By.ID, "export").click()
    target = tmp_path / "downloads" / "sft.jsonl"
    deadline = time.monotonic() + 30
    while not target.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    with open_trace_store(str(known[0]), read_only=True) as store:
        export_sft(store, tmp_path / "cli.jsonl", app="crafter", min_reward=0.5)
    assert target.read_text() == (tmp_path / "cli.jsonl").read_text() != ""


def test_a_learning_run_at_a_glance(tmp_path, serve):
    """What the README shows: an eval run's sessions, their distribution, each model's
    learning curve. The glance's numbers and the chart's parts are the store's."""
    from selenium.webdriver.common.by import By

    sessions = build_learning_run(tmp_path / "run.db")
    with open_trace_store(str(tmp_path / "run.db"), read_only=True) as store:
        server = serve(create_viewer_app(store))
        with chromium(tmp_path / "profile") as driver:
            driver.get(server.url + "/")
            wait_ready(driver)
            scored = [s.reward for s in sessions if s.reward is not None]
            assert text(driver, "#glance-sessions") == f"{len(sessions):,}"
            assert text(driver, "#glance-mean") == shown(mean(scored))
            errors = len(sessions) - len(scored)
            assert text(driver, "#glance-errors") == shown(100 * errors / len(sessions), 2) + "%"
            bars = [int(b.get_attribute("data-count"))
                    for b in driver.find_elements(By.CSS_SELECTOR, "#chart-histogram rect")]
            assert sum(bars) == len(scored) and len(bars) == len(set(scored))
            lines = driver.find_elements(By.CSS_SELECTOR, "#chart-curve polyline")
            assert len(lines) == 2  # one per model
            legend = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#chart-legend span")]
            assert legend == ["math · model-a (300)", "math · model-b (300)"]
            screenshot(driver, tmp_path, "viewer")


def test_a_replay_tells_the_environments_reward_from_event_rewards(tmp_path, serve):
    # A wrong answer in the right format, as the math app records it: the environment's
    # reward is 0, the format's event reward 1; the app has no achievements.
    tracer = SessionTracer(metadata={"app_id": "quiz", "model": "m", "seed": 3})
    tracer.start_timestep("turn-1", turn_number=1)
    tracer.record_message("user", "What is 3 + 4?")
    tracer.record_message("assistant", "Answer: 8")
    event = tracer.record_environment_event(reward=0.0, terminated=True)
    tracer.record_event_reward(1.0, reward_type="answer_format", event_id=event.id,
                               turn_number=1)
    tracer.record_outcome_reward(0.0)
    session = tracer.finish()
    db = tmp_path / "quiz.db"
    with open_trace_store(str(db)) as store:
        store.write_session_sync(session)
    with open_trace_store(str(db), read_only=True) as store:
        server = serve(create_viewer_app(store))
        with chromium(tmp_path / "profile") as driver:
            driver.get(f"{server.url}/#/session/{session.session_id}")
            wait_ready(driver, session.session_id)
            header = text(driver, ".turn h3")
            assert "· env reward 0 · event rewards 1" in header and "· reward" not in header
            fields = driver.execute_script(
                "return [...document.querySelectorAll('.fact')].map(f => f.dataset.field)")
            assert "reward" in fields and "achievements" not in fields


def test_the_time_axis_says_the_day_once_and_the_times_within_a_day(page, known):
    from selenium.webdriver.common.by import By

    driver, url = page
    _, sessions = known
    math = sorted(s.created_at for s in sessions if s.app == "math")
    driver.get(url + "/#/sessions?app=math")  # a dozen minutes of one day
    wait_ready(driver, "app=math")
    labels = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#chart-curve .axis-label")]
    # The curve's points are buckets of sessions: its ends are the buckets' times.
    day = time.strftime("%Y-%m-%d", time.gmtime(math[0]))
    assert len(labels) == 2 and labels[0].startswith(day + " ") and len(labels[0]) == 16
    assert len(labels[1]) == 5 and labels[1] != labels[0][11:], labels
    driver.get(url + "/#/sessions")  # math, then crafter a day later: the days
    wait_ready(driver, "#/sessions")
    labels = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#chart-curve .axis-label")]
    assert len(labels) == 2 and len(set(labels)) == 2 and all(len(x) == 10 for x in labels)


def test_headless_chromium_given_time_captures_the_drawn_page_as_the_readme_says(
        known, serve, tmp_path):
    # The README: at the load event the cards hold placeholders (the data come from /api
    # after), and --virtual-time-budget lets headless Chromium wait for them.
    import re
    import subprocess

    from chromium import FLAGS

    with open_trace_store(str(known[0]), read_only=True) as store:
        url = serve(create_viewer_app(store)).url
        served = httpx.get(url + "/", timeout=10).text
        assert re.search(r'id="glance-sessions" class="big">…<', served)
        browser, _ = find_chromium()
        dom = subprocess.run([browser, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                              "--virtual-time-budget=10000", "--dump-dom", url + "/"],
                             capture_output=True, text=True, timeout=60).stdout
    assert 'data-ready="#/sessions"' in dom
    assert re.search(r'id="glance-sessions" class="big">24<', dom), dom[-2000:]


def test_a_replay_shows_each_sandbox_command_and_the_limit_that_stopped_it(tmp_path, serve):
    tracer = SessionTracer(metadata={"app_id": "code", "model": "m", "seed": 1})
    tracer.start_timestep("turn-1", turn_number=1)
    for command, code, limit in (("python3 -m unittest", 1, None), ("sleep 10", None,
                                                                     "timeout")):
        tracer.record_runtime_event(system_instance_id="sandbox", latency_ms=300.0, metadata={
            "sandbox": {"id": "sb-1", "backend": "local", "command": command,
                        "exit_code": code, "duration_s": 0.3, "limit": limit,
                        "stdout": "", "stderr": "FAILED (failures=1)\n", "truncated": False}})
    session = tracer.finish()
    db = tmp_path / "code.db"
    with open_trace_store(str(db)) as store:
        store.write_session_sync(session)
    with open_trace_store(str(db), read_only=True) as store:
        server = serve(create_viewer_app(store))
        with chromium(tmp_path / "profile") as driver:
            driver.get(f"{server.url}/#/session/{session.session_id}")
            wait_ready(driver, session.session_id)
            shown = driver.execute_script(
                "return [...document.querySelectorAll('[data-field=sandbox]')]"
                ".map(e => e.textContent)")
    assert len(shown) == 2
    assert "python3 -m unittest" in shown[0] and "exit 1" in shown[0]
    assert "stopped by timeout" in shown[1] and "exit none" in shown[1]
