"""A trace database URL with credentials in it (issue 12): `libsql://user:PASSWORD@host` never
shows the password, in any error, human or JSON. The real CLI in-process; the servers it
fails to reach are closed loopback ports."""

from __future__ import annotations

import json

import pytest
from processes import free_port, refused_port
from typer.testing import CliRunner

from synth_deploy.cli import app
from synth_deploy.env import redact_userinfo

PASSWORD = "PASSWORD-hunter2-xyz"


def traces(*args: str):
    return CliRunner().invoke(app, ["traces", *args], env={"TURSO_AUTH_TOKEN": "",
                                                           "SYNTH_TRACES_DB": ""})


@pytest.mark.parametrize("url, says", [
    (f"libsql://user:{PASSWORD}@127.0.0.1:{{port}}", "no auth token was found"),
    (f"http://user:{PASSWORD}@127.0.0.1:{{port}}", "cannot reach libSQL server"),
    (f"https://{PASSWORD}@127.0.0.1:{{port}}", "no auth token was found"),
    (f"ftp://user:{PASSWORD}@127.0.0.1:{{port}}/x.db", "unsupported trace database URL"),
])
@pytest.mark.parametrize("json_output", [False, True])
def test_traces_ls_never_prints_the_urls_password(url, says, json_output):
    with refused_port() as port:
        result = traces("ls", "--trace-db", url.format(port=port),
                        *(["--json"] if json_output else []))
    assert result.exit_code in (2, 3), result.output
    assert PASSWORD not in result.output and "user:" not in result.output
    assert says in result.output and "127.0.0.1" in result.output
    if json_output:
        assert json.loads(result.stdout.strip().splitlines()[-1])["ok"] is False


@pytest.mark.parametrize("url", [f"sqlite+aiosqlite://user:{PASSWORD}@//data/t.db",
                                 f"sqlite://user:{PASSWORD}@/t.db", f"file://{PASSWORD}@/t.db"])
@pytest.mark.parametrize("command", ["where", "ls", "stats", "init"])
def test_a_sqlite_url_with_credentials_is_refused_not_taken_for_a_path(tmp_path, monkeypatch,
                                                                       url, command):
    # It was read as the relative path "user:PASSWORD@//data/t.db": printed by every command,
    # and `init` made a folder named after the password (issue 38).
    monkeypatch.chdir(tmp_path)
    result = traces(command, "--trace-db", url)
    assert result.exit_code == 2, result.output
    assert "a SQLite file takes no user or password" in result.output
    assert PASSWORD not in result.output
    assert list(tmp_path.iterdir()) == []


def test_traces_where_shows_the_url_without_its_credentials():
    url = f"libsql://user:{PASSWORD}@127.0.0.1:{free_port()}?authToken=tok-{PASSWORD}"
    result = traces("where", "--trace-db", url)
    assert PASSWORD not in result.output
    assert "libsql://****@127.0.0.1" in result.output


@pytest.mark.parametrize("text, shown", [
    ("cannot reach libsql://u:p@h:1/db", "cannot reach libsql://****@h:1/db"),
    ("a https://tok@h/x and http://a:b@c?d=e", "a https://****@h/x and http://****@c?d=e"),
    ("libsql://u:p@ss@host", "libsql://****@host"),  # an unescaped @ in the password
    ("http://host/path@not-userinfo", "http://host/path@not-userinfo"),
    ("mail me at a@b.c", "mail me at a@b.c"),
])
def test_redact_userinfo(text, shown):
    assert redact_userinfo(text) == shown
