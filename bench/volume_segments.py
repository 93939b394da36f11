"""What one trace Volume snapshot costs as a container ages: a segment of what is new against
a copy of the whole store (SQLite's backup API, what the kit wrote before segments), on the
same store, in one run.

    python bench/volume_segments.py [--sizes 1000,10000,40000] [--new 100] [--repeat 3]

For each size the store holds that many sessions (five-turn rollouts, recorded as a
container records them: through a writer child that journals every session,
`TraceDbSetting.journal_all`), then ``--new`` more are written and one snapshot is taken:
the segment's time, CPU and bytes (`VolumeSnapshots`, its commit a no-op: Modal's upload is
outside the container), and the whole copy's, each the best of ``--repeat``. A segment's
cost should stay flat as the store grows; the whole copy's grows with it.
"""

from __future__ import annotations

import argparse
import asyncio
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


class ContainerRecorder:
    """Writes sessions to ``store`` as a served container does: from one event loop,
    through its writer child."""

    def __init__(self, store) -> None:
        self.store, self.loop = store, asyncio.new_event_loop()

    def write(self, sessions) -> None:
        async def write_all() -> None:
            child = self.store.use_writer_process()
            while not child.ready:
                await asyncio.sleep(0.01)
            await asyncio.gather(*(self.store.write_session(s) for s in sessions))

        self.loop.run_until_complete(write_all())

    def close(self) -> None:
        self.store.close()
        self.loop.close()


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
    print(f"  {'sessions':>9} {'segment ms':>11} {'cpu ms':>7} {'KiB':>8}   "
          f"{'whole ms':>9} {'cpu ms':>7} {'KiB':>9}   whole/segment")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        local, folder = tmp / "local.db", tmp / "volume"
        written = 0
        setting = parse_trace_db(str(local))
        recorder = ContainerRecorder(open_trace_store(replace(setting, journal_all=True)))
        try:
            for size in sizes:
                while written < size:
                    batch = min(500, size - written)
                    recorder.write([five_turn_session(written + k) for k in range(batch)])
                    written += batch
                segment, whole = [], []
                for _ in range(args.repeat):
                    snapshots = VolumeSnapshots(local, folder, f"c{size}", lambda: None, 3600)
                    snapshots.snapshot()  # everything so far: the container's first segment
                    recorder.write([five_turn_session(written + k) for k in range(args.new)])
                    written += args.new
                    segment.append(timed(snapshots.snapshot))
                    snapshots.stop()
                    whole.append(timed(lambda: whole_copy(local, tmp / "whole.db")))
                newest = max(folder.glob(f"c{size}.*.db"), key=lambda p: int(p.name.split(".")[1]))
                seg_kib = newest.stat().st_size / 1024
                whole_kib = (tmp / "whole.db").stat().st_size / 1024
                (seg_wall, seg_cpu), (whole_wall, whole_cpu) = min(segment), min(whole)
                print(f"  {size:>9,} {seg_wall * 1e3:>11.1f} {seg_cpu * 1e3:>7.1f} "
                      f"{seg_kib:>8,.0f}   {whole_wall * 1e3:>9.1f} {whole_cpu * 1e3:>7.1f} "
                      f"{whole_kib:>9,.0f}   {whole_wall / seg_wall:>6.1f}x")
        finally:
            recorder.close()


if __name__ == "__main__":
    sys.exit(main())
