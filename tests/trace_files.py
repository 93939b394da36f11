"""Trace database files in states the store must refuse, for the tracing tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from synth_deploy.tracing import SCHEMA_VERSION, open_trace_store


def make_schema_too_new(path: Path) -> None:
    """A trace file whose schema version is one past what this code knows, checkpointed so
    its bytes on disk are final (tests compare hashes before and after)."""
    with open_trace_store(str(path)):
        pass
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO synth_deploy_schema VALUES (?, 'x', 'from the future')",
                 (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
