"""What one trace Volume snapshot costs as a container ages: a copy of what is new in its
session log against a copy of a whole store (SQLite's backup API, what the kit wrote before
segments), in one run.

    python bench/volume_segments.py [--sizes 1000,10000,40000] [--new 100] [--repeat 3]

For each size a container's store has recorded that many sessions (five-turn rollouts,
appended to its session log, `TraceDbSetting.session_log`), and a store in rows holds the
same; then ``--new`` more are written to both and one snapshot is taken: its time, CPU and
bytes (`VolumeSnapshots`, its commit a no-op: Modal's upload is outside the container), and
the whole copy's of the store in rows, each the best of ``--repeat``. A snapshot's cost
should stay flat as the container ages; the whole copy's grows with it.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from synth_deploy.modal import VolumeSnapshots
from synth_deploy.tracing import SessionTracer, open_trace_store, parse_trace_db


def five_turn_session(i: int):
    tracer = SessionTracer(metadata={"app_id": "bench", "run_id": f"r{i}", "seed": i})
    messages = [{"role": "user", "content": f"seed {i}"}]
    for turn in range(1, 6):
        tracer.start_timestep(f"turn-{turn}", turn_number=turn)
        tracer.record_chat(messages)
        tracer.record_lm_call(model_name="mock", provider="127.0.0.1", input_tokens=10 * turn,
                              output_tokens=8, latency_ms=1.0)
        messages = [*messages, {"role": "assistant", "content": f"reply {turn} to {i}"}]
        tracer.record_chat(messages)
    tracer.record_outcome_reward(1.0)
    return tracer.finish()


def timed(work) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def whole_copy(source: Path, target: Path) -> None:
    target.unlink(missing_ok=True)
    with sqlite3.connect(source) as conn, sqlite3.connect(target) as out:
        conn.backup(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,40000")
    parser.add_argument("--new", type=int, default=100, help="sessions new since the last copy")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"one snapshot of {args.new} new sessions, the store holding: best of {args.repeat}")
    print(f"  {'sessions':>9} {'copy ms':>11} {'cpu ms':>7} {'KiB':>8}   "
          f"{'whole ms':>9} {'cpu ms':>7} {'KiB':>9}   whole/copy")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        local, folder, in_rows = tmp / "local.db", tmp / "volume", tmp / "rows.db"
        written = 0
        with open_trace_store(replace(parse_trace_db(str(local)), session_log=True)) as \
                container, open_trace_store(in_rows) as rows:
            def write(sessions) -> None:
                container.write_sessions_sync(sessions)
                rows.write_sessions_sync(sessions)

            for size in sizes:
                while written < size:
                    batch = min(500, size - written)
                    write([five_turn_session(written + k) for k in range(batch)])
                    written += batch
                segment, whole = [], []
                for n in range(args.repeat):
                    snapshots = VolumeSnapshots(local, folder, f"c{size}-{n}", lambda: None,
                                                3600)
                    snapshots.snapshot()  # everything so far: the container's first copy
                    write([five_turn_session(written + k) for k in range(args.new)])
                    written += args.new
                    segment.append(timed(snapshots.snapshot))
                    snapshots.stop()
                    whole.append(timed(lambda: whole_copy(in_rows, tmp / "whole.db")))
                newest = max(folder.glob(f"c{size}-0.*.*"),
                             key=lambda p: int(p.name.split(".")[1]))
                seg_kib = newest.stat().st_size / 1024
                whole_kib = (tmp / "whole.db").stat().st_size / 1024
                (seg_wall, seg_cpu), (whole_wall, whole_cpu) = min(segment), min(whole)
                print(f"  {size:>9,} {seg_wall * 1e3:>11.1f} {seg_cpu * 1e3:>7.1f} "
                      f"{seg_kib:>8,.0f}   {whole_wall * 1e3:>9.1f} {whole_cpu * 1e3:>7.1f} "
                      f"{whole_kib:>9,.0f}   {whole_wall / seg_wall:>6.1f}x")


if __name__ == "__main__":
    sys.exit(main())
