"""The trace store's errors: all are `TraceStoreError`, so callers catch one class.

    TraceStoreError (synth_deploy.errors)
     ├── TraceDbUrlError        the URL names no supported database (exit 2)
     ├── NotATraceDbError       the file is corrupt, not SQLite, or another app's database
     ├── SchemaTooNewError      written by a newer synth-deploy; left untouched
     ├── TraceDbMissingError    nothing at that path yet (a read asked for it)
     ├── TraceDbUnreachableError  a remote libSQL server did not answer in time (exit 3)
     ├── TraceDbAuthError       the remote server refused the token
     ├── SessionNotFoundError   no session with that id (or prefix) (exit 2)
     ├── SessionConflictError   a session id already stored with other content
     └── TraceFormatError       a returned trace that cannot be read as a session
"""

from __future__ import annotations

from synth_deploy.errors import TraceStoreError


class TraceDbUrlError(TraceStoreError):
    """``--trace-db`` / ``SYNTH_TRACES_DB`` is not a path or a supported URL."""

    exit_code = 2


class NotATraceDbError(TraceStoreError):
    """The file exists but is not a trace database we may write to."""


class SchemaTooNewError(TraceStoreError):
    """The database's schema version is newer than this code understands."""


class TraceDbMissingError(TraceStoreError):
    """A read was asked of a database that has not been created yet."""


class TraceDbUnreachableError(TraceStoreError):
    """A remote libSQL server could not be reached or did not answer within the timeout."""

    exit_code = 3


class TraceDbAuthError(TraceStoreError):
    """The remote libSQL server rejected the auth token."""


class SessionNotFoundError(TraceStoreError):
    """No session matches the given id or id prefix (or several do): a bad value (exit 2)."""

    exit_code = 2


class SessionConflictError(TraceStoreError):
    """A session with this id is already stored, with different content; nothing written."""


class TraceFormatError(TraceStoreError):
    """A trace (as a task app returned it) that cannot be read as a session."""


__all__ = [
    "NotATraceDbError",
    "SchemaTooNewError",
    "SessionConflictError",
    "SessionNotFoundError",
    "TraceDbAuthError",
    "TraceDbMissingError",
    "TraceDbUnreachableError",
    "TraceDbUrlError",
    "TraceFormatError",
]
