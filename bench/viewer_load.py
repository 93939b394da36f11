"""`traces view` on a million-session store: the page's first load and its filters, each as a
ratio to bare SQL answering the same question in the same run.

    python bench/viewer_load.py [--sessions 1000000] [--store PATH] [--rounds 3] [--no-browser]

The store is generated once through the kit's own writer (sessions shaped like the task app
server's: one turn, three messages, an LM call, an environment event with its event reward,
an outcome reward; three apps, four models, train/test splits, 2% failures, 30 days) and
kept at --store for the next run: writing a million sessions takes a while here. It is then
opened read-only, like `traces view` opens it.

Printed per step: the viewer's time (median of the rounds, over HTTP from real uvicorn, JSON
included), the bare SQL baseline (sqlite3 on the same file: the table's page and count, or
one aggregate pass for the glance), and the ratio. The first load is also timed in headless
Chromium when it is installed: navigation until the table and the glance are drawn.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from synth_deploy.serving import BackgroundServer
from synth_deploy.tracing import SessionTrace, SessionTracer, open_trace_store
from synth_deploy.viewer import create_viewer_app

APPS = ("math", "crafter", "wordle")
MODELS = ("qwen-0.5b", "qwen-1.5b", "llama-8b", "gpt-mini")
START = 1_750_000_000.0
META = "json_extract(CASE WHEN json_valid(metadata) THEN metadata END, '$.{}')"


def make_session(i: int, n: int) -> SessionTrace:
    rnd = random.Random(i)
    app, model = APPS[i % 3], MODELS[(i // 3) % 4]
    mode = "eval" if i % 5 == 0 else "train"
    split = "test" if i % 7 == 0 else "train"
    seed = rnd.randrange(1000)
    reward = float(rnd.random() < 0.2 + 0.5 * (i / n) * (1 + MODELS.index(model)) / 4)
    failed = rnd.random() < 0.02
    tracer = SessionTracer(metadata={"app_id": app, "run_id": f"run-{i // 10_000}",
                                     "mode": mode, "seed": seed, "model": model,
                                     "env_name": app})
    tracer.session.created_at = START + (i / n) * 30 * 86400
    tracer.start_timestep("turn-1", turn_number=1)
    tracer.record_message("system", "You are solving a task. Answer with a number.")
    tracer.record_message("user", f"What is {seed} + 7?")
    tracer.record_lm_call(model_name=model, input_tokens=30, output_tokens=5,
                          latency_ms=100 + rnd.random() * 300)
    tracer.record_message("assistant", str(seed + 7 if reward else seed))
    event = tracer.record_environment_event(reward=reward, terminated=True)
    tracer.record_event_reward(reward, reward_type="answer_correct", event_id=event.id)
    if not failed:
        tracer.record_outcome_reward(reward, total_steps=1)
    session = tracer.finish()
    session.metadata.update({
        "duration_s": 0.2, "status": "error" if failed else "ok",
        "request": {"run_id": f"r{i}", "mode": mode,
                    "env": {"seed": seed, "env_name": app, "config": {"split": split}},
                    "policy": {"config": {"model": model}}}})
    if failed:
        session.metadata["error"] = {"code": "rollout_failed", "message": "policy timed out"}
    else:
        session.metadata["metrics"] = {"outcome_reward": reward, "outcome_score": reward}
    return session


def ensure_store(path: Path, sessions: int) -> None:
    """Write sessions through the kit's writer until ``path`` holds ``sessions``."""
    async def fill() -> None:
        with open_trace_store(str(path)) as store:
            have = store.count_sessions()
            if have >= sessions:
                return
            print(f"writing {sessions - have:,} sessions to {path} through the kit's writer "
                  "(kept for the next run)...", flush=True)
            started = time.perf_counter()
            batch = 2000
            for first in range(have, sessions, batch):
                await asyncio.gather(*(store.write_session(make_session(i, sessions))
                                       for i in range(first, min(sessions, first + batch))))
                if (first // batch) % 50 == 0:
                    rate = (first - have) / (time.perf_counter() - started + 1e-9)
                    print(f"  {first:>9,} sessions ({rate:,.0f}/s)", flush=True)

    asyncio.run(fill())


def median_ms(fn: Callable[[], object], rounds: int) -> float:
    fn()  # warm: the first call pays for the page cache, every later one does not
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


# Filters as the page sends them, and the bare SQL WHERE that answers the same question.
FILTERS = [
    ("app", {"app": "math"}, "app_id = 'math'"),
    ("app + model", {"app": "math", "model": "llama-8b"},
     "app_id = 'math' AND model_name = 'llama-8b'"),
    ("split (metadata)", {"split": "test"}, f"{META.format('request.env.config.split')} = 'test'"),
    ("mode + reward ≥ 1", {"mode": "eval", "min_reward": "1"},
     f"{META.format('mode')} = 'eval' AND total_reward >= 1"),
    ("errors", {"status": "error"}, "status = 'error'"),
    ("date range", {"since": "2025-06-20", "until": "2025-06-25"},
     "created_at >= '2025-06-20' AND created_at < '2025-06-26'"),
    ("no match", {"split": "nowhere"}, f"{META.format('request.env.config.split')} = 'nowhere'"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--store", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()
    store_path = args.store or (Path(tempfile.gettempdir()) / "synth-deploy-bench"
                                / f"viewer-{args.sessions}.db")
    store_path.parent.mkdir(parents=True, exist_ok=True)
    ensure_store(store_path, args.sessions)

    bare = sqlite3.connect(f"{store_path.resolve().as_uri()}?mode=ro", uri=True,
                           check_same_thread=False)

    def sql(query: str) -> Callable[[], object]:
        return lambda: bare.execute(query).fetchall()

    page_sql = ("SELECT session_id, created_at, app_id, model_name, seed, status, total_reward "
                "FROM session_traces{} ORDER BY created_at DESC LIMIT 50")

    def table_sql(where: str = "") -> Callable[[], object]:
        # what the table needs: its page, and how many sessions match
        clause = f" WHERE {where}" if where else ""
        return lambda: (bare.execute(page_sql.format(clause)).fetchall(),
                        bare.execute(f"SELECT COUNT(*) FROM session_traces{clause}").fetchall())
    rows: list[tuple[str, float, float]] = []
    with open_trace_store(str(store_path), read_only=True) as store, \
            BackgroundServer(create_viewer_app(store)) as server, \
            httpx.Client(base_url=server.url, timeout=120) as client:
        total = store.count_sessions()

        def get(path: str, params: dict | None = None) -> object:
            resp = client.get(path, params=params)
            resp.raise_for_status()
            return resp.content

        def first_load() -> None:  # what the page fetches, in its order
            for path in ("/", "/static/app.js", "/static/style.css", "/static/favicon.svg",
                         "/api/choices"):
                get(path)
            get("/api/sessions", {"limit": 50})  # the table is drawn here
            get("/api/summary")                  # then the glance

        baseline_page = median_ms(table_sql(), args.rounds)
        baseline_scan = median_ms(sql("SELECT COUNT(*), AVG(total_reward) FROM session_traces"),
                                  args.rounds)
        rows.append(("first load: table (sessions page)",
                     median_ms(lambda: get("/api/sessions", {"limit": 50}), args.rounds),
                     baseline_page))
        rows.append(("first load: glance (summary)",
                     median_ms(lambda: get("/api/summary"), args.rounds), baseline_scan))
        rows.append(("first load: page + assets + choices + table + glance",
                     median_ms(first_load, args.rounds), baseline_page + baseline_scan))
        for name, params, where in FILTERS:
            base = median_ms(table_sql(where), args.rounds)
            rows.append((f"filter {name}: table",
                         median_ms(lambda p=params: get("/api/sessions", p), args.rounds), base))
            scan = median_ms(sql(f"SELECT COUNT(*), AVG(total_reward) FROM session_traces "
                                 f"WHERE {where}"), args.rounds)
            rows.append((f"filter {name}: glance",
                         median_ms(lambda p=params: get("/api/summary", p), args.rounds), scan))
        rows.append(("sort by reward: table",
                     median_ms(lambda: get("/api/sessions", {"sort": "reward"}), args.rounds),
                     median_ms(sql("SELECT session_id, total_reward FROM session_traces "
                                   "ORDER BY total_reward DESC LIMIT 50"), args.rounds)))
        session_id = bare.execute("SELECT session_id FROM session_traces ORDER BY created_at "
                                  "DESC LIMIT 1").fetchone()[0]
        rows.append(("replay one session",
                     median_ms(lambda: get(f"/api/sessions/{session_id}"), args.rounds),
                     median_ms(sql(f"SELECT * FROM messages WHERE session_id = '{session_id}'"),
                               args.rounds)))
        rows.append(("compare two models within an app",
                     median_ms(lambda: get("/api/compare", {"a": "qwen-0.5b", "b": "llama-8b",
                                                            "app": "math"}), args.rounds),
                     median_ms(sql("SELECT seed, model_name, AVG(total_reward) FROM "
                                   "session_traces WHERE app_id = 'math' AND model_name IN "
                                   "('qwen-0.5b', 'llama-8b') GROUP BY seed, model_name"),
                               args.rounds)))
        browser = None if args.no_browser else browser_first_load(server.url, args.rounds)

    print(f"traces view over {total:,} sessions ({store_path}, "
          f"{store_path.stat().st_size / 2**30:.1f} GiB), median of {args.rounds} rounds")
    print(f"  {'step':<52}{'viewer ms':>11}{'bare SQL ms':>13}{'ratio':>9}")
    for name, viewer, base in rows:
        print(f"  {name:<52}{viewer:>11.1f}{base:>13.1f}{viewer / max(base, 1e-3):>8.1f}×")
    if browser is not None:
        print(f"  first load in headless Chromium (navigation → table and glance drawn): "
              f"{browser:.0f} ms = {browser / (baseline_page + baseline_scan):.1f}× bare SQL")


def browser_first_load(url: str, rounds: int) -> float | None:
    import shutil

    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        print("(no chromium/chromedriver: browser first load not measured)")
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    times = []
    with tempfile.TemporaryDirectory() as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or ""
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                     "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync",
                     f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        try:
            for _ in range(rounds + 1):
                driver.get("about:blank")
                started = time.perf_counter()
                driver.get(url + "/#/sessions")
                WebDriverWait(driver, 120).until(lambda d: d.execute_script(
                    "return document.body.dataset.ready === '#/sessions'"))
                times.append((time.perf_counter() - started) * 1000)
        finally:
            driver.quit()
    return statistics.median(times[1:])


if __name__ == "__main__":
    main()
