"""Which trace database is in force, and why: ``--trace-db`` > ``SYNTH_TRACES_DB`` > default.

Accepted forms:

- a path (``traces/v3/synth_ai.db``, ``~/t.db``), ``file:PATH``, ``sqlite:///PATH`` (what
  synth-ai wrote) or ``:memory:`` → an embedded SQLite file;
- ``libsql://HOST`` or ``https://HOST`` → Turso, token from ``?authToken=`` or
  ``TURSO_AUTH_TOKEN``;
- ``http://HOST:PORT`` → a self-hosted sqld (token optional, same sources).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from synth_deploy.env import Env, mask, redact_userinfo
from synth_deploy.tracing._errors import TraceDbUrlError

DEFAULT_TRACE_DB = "traces/v3/synth_ai.db"
TRACES_DB_VAR = "SYNTH_TRACES_DB"
TOKEN_VAR = "TURSO_AUTH_TOKEN"
_REMOTE_SCHEMES = ("libsql", "https", "http")
_TOKEN_PARAMS = ("authToken", "auth_token")
_SQLITE_SCHEMES = ("sqlite", "sqlite+aiosqlite", "sqlite+libsql", "file")


@dataclass(frozen=True)
class TraceDbSetting:
    """A resolved trace database: ``url`` as given, where it came from, and how to reach it.

    ``session_log``: every session goes whole to the store's log (`_write._log`), held in
    memory with no writer child and no rows, for a copier that takes it from there: a Modal
    container's store, whose sessions `traces pull` builds at home from the files its
    `VolumeSnapshots` writes. A reader of the file itself does not see them.
    ``session_log_limit``: the bytes that log may hold (`pending_limit`; None: its default).
    """

    url: str
    source: str
    is_remote: bool
    path: Path | None = None
    remote_url: str | None = None
    auth_token: str | None = field(default=None, repr=False)
    token_source: str | None = None
    session_log: bool = False
    session_log_limit: int | None = None

    @property
    def display(self) -> str:
        """The URL with any token masked: safe to print and log."""
        if not self.is_remote:
            return str(self.path) if self.path is not None else self.url
        shown = redact_userinfo(self.remote_url or self.url)
        return shown + (f" (token {mask(self.auth_token)})" if self.auth_token else "")

    def __repr__(self) -> str:
        return f"TraceDbSetting(url={self.display!r}, source={self.source!r})"


def parse_trace_db(url: str, *, source: str = "argument", env: Env | None = None
                   ) -> TraceDbSetting:
    """Classify ``url`` (see the module docstring); the token comes from the URL or ``env``."""
    text = (url or "").strip()
    if not text:
        raise TraceDbUrlError(f"empty trace database URL (from {source})",
                              hint=f"give a file path or a libsql:// URL, or unset {source}")
    if text == ":memory:":
        return TraceDbSetting(url=text, source=source, is_remote=False, path=Path(text))
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme in _REMOTE_SCHEMES and parts.netloc:
        return _remote_setting(text, source, env)
    if scheme in _SQLITE_SCHEMES:
        return _sqlite_setting(text, source)
    if scheme and len(scheme) > 1 and "://" in text:
        raise TraceDbUrlError(
            f"unsupported trace database URL scheme {scheme!r} in {_redacted(text)}",
            hint="use a file path, libsql:// or https:// (Turso), or http:// (sqld)")
    return TraceDbSetting(url=text, source=source, is_remote=False, path=Path(text).expanduser())


def _remote_setting(text: str, source: str, env: Env | None) -> TraceDbSetting:
    """A database server: the token leaves the URL, so the URL can be shown; Turso needs one."""
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    query = parse_qsl(parts.query, keep_blank_values=True)
    token, token_source = _token(query, env)
    rest = urlencode([(k, v) for k, v in query if k not in _TOKEN_PARAMS])
    remote = urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), rest, ""))
    if scheme != "http" and not token:
        raise TraceDbUrlError(
            f"{redact_userinfo(remote)} is a Turso URL but no auth token was found",
            hint=f"set {TOKEN_VAR} (turso db tokens create <db>) or append ?authToken=...")
    return TraceDbSetting(url=text, source=source, is_remote=True, remote_url=remote,
                          auth_token=token, token_source=token_source)


def _token(query: list[tuple[str, str]], env: Env | None) -> tuple[str | None, str | None]:
    """The token and where it came from: the URL's own wins over the environment's."""
    token = next((v for k, v in query if k in _TOKEN_PARAMS and v), None)
    if token:
        return token, "?authToken= in the URL"
    if env is not None and env.get(TOKEN_VAR):
        return env.get(TOKEN_VAR), f"{TOKEN_VAR} from {env.source(TOKEN_VAR)}"
    return None, None


def _sqlite_setting(text: str, source: str) -> TraceDbSetting:
    """A SQLite URL names a file: ``sqlite:///rel``, ``sqlite:////abs``, ``file:path``."""
    raw = text.split(":", 1)[1]
    if raw.startswith("//") and "@" in raw[2:].split("/", 1)[0]:
        raise TraceDbUrlError(
            f"{redact_userinfo(text)}: a SQLite file takes no user or password",
            hint="name the file: sqlite:///relative/t.db, sqlite:////absolute/t.db or a "
                 "plain path; a libsql:// or http:// URL for a database server")
    if raw.startswith("//"):
        raw = raw[2:]
    if not raw:
        raise TraceDbUrlError(f"{text!r} names no file", hint="use sqlite:///path/to/file.db")
    return TraceDbSetting(url=text, source=source, is_remote=False, path=Path(raw).expanduser())


def resolve_trace_db(flag: str | None, env: Env) -> TraceDbSetting:
    """The trace database in force: ``--trace-db`` > ``SYNTH_TRACES_DB`` > the default file."""
    if flag:
        return parse_trace_db(flag, source="--trace-db", env=env)
    value = env.get(TRACES_DB_VAR)
    if value:
        return parse_trace_db(value, source=f"{TRACES_DB_VAR} from {env.source(TRACES_DB_VAR)}",
                              env=env)
    return parse_trace_db(DEFAULT_TRACE_DB, source="default", env=env)


def _redacted(text: str) -> str:
    parts = urlsplit(text)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


__all__ = [
    "DEFAULT_TRACE_DB",
    "TOKEN_VAR",
    "TRACES_DB_VAR",
    "TraceDbSetting",
    "parse_trace_db",
    "resolve_trace_db",
]
