"""Environment variables, .env files and secrets: resolved here and nowhere else.

Precedence, highest first:
1. files passed explicitly (``--env-file``), later files over earlier ones;
2. the process environment;
3. ``./.env`` in the working directory, read only when no file was passed explicitly.

An explicit file wins over the process environment because naming it is the user saying
"use these"; the implicit ``.env`` is a convenience that must not override what the shell set.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import secrets
from base64 import b64encode
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from synth_deploy.errors import EnvFileError

ENVIRONMENT_API_KEY = "ENVIRONMENT_API_KEY"
ENVIRONMENT_API_KEY_ALIASES = "ENVIRONMENT_API_KEY_ALIASES"
TASK_APP_URL = "TASK_APP_URL"  # written by `deploy` and `tunnel`, read by `train` and `check`
DEFAULT_ENV_FILE = ".env"

# The words of a name (snake, kebab, dotted or camel case) that say it holds a credential.
_NAME_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_SECRET_WORDS = frozenset({
    "key", "keys", "apikey", "apikeys", "token", "secret", "secrets", "password", "passwords",
    "passwd", "auth", "authorization", "credential", "credentials", "cookie", "signature"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_LEADING_NAME = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]{0,63})(?![A-Za-z0-9_.-])")


# Cached: a traced rollout asks it of every key of its policy config, the same few names each
# time, and the case-blind search costs many times a cache hit.
@functools.lru_cache(maxsize=1024)
def is_secret_name(name: str) -> bool:
    """True for names that hold credentials: a word of the name is key, token, secret,
    password, auth… (``OPENAI_API_KEY``, ``MODAL_TOKEN_ID``, ``Authorization``, ``authToken``,
    ``x-api-key``), not merely contains one (``max_tokens``, ``keyboard``, ``author``)."""
    return any(word.lower() in _SECRET_WORDS for word in _NAME_WORDS.findall(name))


def fingerprint(secret: str) -> str:
    """A short, one-way fingerprint that tells two keys apart without revealing either."""
    return hashlib.sha256(secret.encode()).hexdigest()[:8]


def mask(secret: str | None) -> str:
    """How a secret is shown anywhere: no prefix, no length, only a fingerprint."""
    if not secret:
        return "(not set)"
    return f"**** (sha256:{fingerprint(secret)})"


def redact(text: str, secret_values: Iterable[str]) -> str:
    """Replace every occurrence of each secret value in ``text`` by its mask."""
    for value in sorted({v for v in secret_values if v and len(v) >= 4}, key=len, reverse=True):
        text = text.replace(value, mask(value))
    return text


# scheme://userinfo@ : the userinfo (a user and password, or a token) is never shown.
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s]*@")
# ?name=value / &name=value: a query parameter, masked when its name is a secret's.
_QUERY_PARAM = re.compile(r"([?&;])([^=&#\s]+)=([^&#\s]*)")


def redact_userinfo(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced: the userinfo
    (``libsql://****@host``) and the value of each secret-named query parameter
    (``/v1?api_key=****``)."""
    if "@" in text:  # the searches are skipped when they cannot match: a traced rollout
        text = _URL_USERINFO.sub(_masked_userinfo, text)  # masks its inference_url
    return _QUERY_PARAM.sub(_masked_param, text) if "=" in text else text


def _masked_userinfo(match: re.Match[str]) -> str:
    return f"{match.group(1)}****@"


def _masked_param(match: re.Match[str]) -> str:
    sep, name, value = match.groups()
    return f"{sep}{name}=****" if value and is_secret_name(name) else match.group(0)


def mask_secrets(data: Any) -> Any:
    """JSON data (dicts, lists, scalars) with every secret in it masked, at any depth: the
    value of a secret-named key (``api_key``, ``headers.Authorization``, ``openai_api_key``…)
    as `mask` shows it, and the credentials of every URL in a string (`redact_userinfo`).

    For what is kept of a request a client sent, which may carry keys anywhere. Dicts and
    lists are changed in place; the result is ``data`` (a string comes back masked)."""
    if isinstance(data, dict):
        for name, value in data.items():
            if _is_secret_key(name):
                data[name] = _masked_all(value)
            elif _may_hold_secrets(value):
                data[name] = mask_secrets(value)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            if _may_hold_secrets(value):
                data[i] = mask_secrets(value)
    elif isinstance(data, str):
        return redact_userinfo(data)
    return data


def _is_secret_key(name: Any) -> bool:
    """A JSON key naming a secret (keys of parsed JSON may be other than strings)."""
    return type(name) is str and is_secret_name(name)


def _may_hold_secrets(value: Any) -> bool:
    """Worth a look by `mask_secrets`: a container, or a string holding a URL."""
    return isinstance(value, _CONTAINERS) or (type(value) is str and "://" in value)


_CONTAINERS = (dict, list)
_USERINFO = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://([^/?#\s]*)@")


def known_secrets(data: Any) -> list[str]:
    """Every secret value JSON ``data`` carries (a request's policy config), for `redact` to
    mask wherever text that quotes one leaves (an exception's message, an upstream's error
    body): the values under secret-named keys at any depth, and of each URL in a string its
    userinfo (the password, ``user:password`` and that pair as HTTP Basic credentials) and the
    values of its secret-named query parameters."""
    found: list[str] = []
    _collect_secrets(data, found, under_secret=False)
    return found


def _collect_secrets(data: Any, found: list[str], *, under_secret: bool) -> None:
    if isinstance(data, dict):
        for name, value in data.items():
            _collect_secrets(value, found,
                             under_secret=under_secret or _is_secret_key(name))
    elif isinstance(data, list):
        for value in data:
            _collect_secrets(value, found, under_secret=under_secret)
    elif under_secret:
        _collect_value(data, found)
    if isinstance(data, str) and "://" in data:
        _collect_url_secrets(data, found)


def _collect_value(data: Any, found: list[str]) -> None:
    """A value held under a secret's name, and its token alone when it has a scheme word."""
    if data is None or isinstance(data, bool):
        return
    found.append(str(data))
    if isinstance(data, str) and " " in data:  # "Bearer TOKEN", "Basic QUJD"
        found.append(data.split(" ", 1)[1].strip())


def _collect_url_secrets(text: str, found: list[str]) -> None:
    """Each URL's userinfo in every form it may be quoted in, and its secret query values."""
    for userinfo in _USERINFO.findall(text):
        user, _, password = userinfo.partition(":")
        found += [userinfo, unquote(password or user)]
        if password:
            pair = f"{unquote(user)}:{unquote(password)}"
            found += [pair, b64encode(pair.encode()).decode()]
    for _, name, value in _QUERY_PARAM.findall(text):
        if value and is_secret_name(name):
            found += [value, unquote(value)]


def _masked_all(value: Any) -> Any:
    """Everything held under a secret's name, masked: ``api_keys: [...]`` holds keys too."""
    if isinstance(value, dict):
        return {k: _masked_all(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked_all(v) for v in value]
    if value is None or isinstance(value, bool) or value == "":
        return value
    return mask(str(value))


def missing_key_hint(*, flag: str | None = None) -> str:
    """How a client of a task app (check, smoke/eval against a URL, tunnel --url, train)
    supplies the app's key when none was found: the one hint wherever one is missing.
    ``flag``: the command's own option for the key, offered first."""
    how = (f"put the app's {ENVIRONMENT_API_KEY} in .env or the environment, or pass "
           "--env-file FILE (`synth-deploy setup` mints one for an app you serve)")
    return f"pass {flag}, or {how}" if flag else how


def mint_key() -> str:
    """A new ENVIRONMENT_API_KEY: 256 bits from the OS's CSPRNG."""
    return "sk_env_" + secrets.token_urlsafe(32)


def parse_env_file(path: str | Path) -> dict[str, str]:
    """Read a .env file strictly: a line that is not an assignment is an error with file:line."""
    from dotenv.main import DotEnv

    path = Path(path)
    text = _read_text(path)
    _check_lines(path, text)
    values = DotEnv(path, interpolate=True).dict()
    return {k: v for k, v in values.items() if v is not None}


def _read_text(path: Path) -> str:
    """The file as text; an unreadable, non-UTF-8 or NUL-holding one is an `EnvFileError`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise EnvFileError(
            f"env file not found: {path}",
            hint="check the path, or run `synth-deploy setup` to create .env",
        ) from None
    except OSError as exc:
        raise EnvFileError(f"cannot read env file {path}: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise EnvFileError(
            f"{path}:{line}: {_line_of(raw, exc.start)} is not "
            f"UTF-8 text (byte 0x{raw[exc.start]:02x}; its value is not shown)",
            hint="save the file as UTF-8") from None
    if "\0" in text:
        at = text.index("\0")
        line = text.count("\n", 0, at) + 1
        raise EnvFileError(
            f"{path}:{line}: {_line_of(text, at)} holds a NUL byte, "
            "which no environment variable can (its value is not shown)",
            hint="delete the NUL: a paste or an editor's encoding put it there")
    return text


def _check_lines(path: Path, text: str) -> None:
    """`EnvFileError` with file:line for a line that is not an assignment to a valid name."""
    import io

    from dotenv.parser import parse_stream

    for binding in parse_stream(io.StringIO(text)):
        # Errors name the file, the line and the variable, never anything after the name: a
        # line gone wrong ("OPENAI_API_KEY sk-...", no "=") may hold a secret anywhere else.
        if binding.error:
            line = binding.original.line
            name = _LEADING_NAME.match(binding.original.string)
            what = f"the line for {name.group(1)}" if name else "the line"
            raise EnvFileError(
                f"{path}:{line}: cannot parse {what} (its value is not shown)",
                hint="each line must be NAME=value (quote values with spaces or #)",
            )
        if binding.key is not None and not _NAME.match(binding.key):
            raise EnvFileError(
                f"{path}:{binding.original.line}: the name before '=' is not a valid variable "
                f"name (it is not shown: it may be a pasted value)",
                hint="names are letters, digits and underscores, not starting with a digit",
            )


def _line_of(text: str | bytes, at: int) -> str:
    """How an error names the line holding offset ``at``: by its variable when it has one
    (never by anything after the name, which may be a secret)."""
    start = text.rfind(b"\n" if isinstance(text, bytes) else "\n", 0, at) + 1
    head = text[start:start + 80]
    head = head.decode("utf-8", "replace") if isinstance(head, bytes) else head
    name = _LEADING_NAME.match(head)
    return f"the line for {name.group(1)}" if name else "the line"


@dataclass(frozen=True)
class Env:
    """Resolved variables, each remembering where it came from (for `traces where`, `check`)."""

    values: Mapping[str, str] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)

    def get(self, name: str, default: str | None = None) -> str | None:
        value = self.values.get(name)
        return value if value not in (None, "") else default

    def source(self, name: str) -> str | None:
        """Where ``name`` came from: "environment", or the env file's path."""
        return self.sources.get(name) if self.get(name) is not None else None

    def __repr__(self) -> str:
        shown = {k: (mask(v) if is_secret_name(k) else v) for k, v in self.values.items()}
        return f"Env({shown!r})"

    def api_keys(self) -> list[str]:
        """ENVIRONMENT_API_KEY followed by the comma-separated aliases, empty ones dropped."""
        keys = [self.get(ENVIRONMENT_API_KEY) or ""]
        keys += (self.get(ENVIRONMENT_API_KEY_ALIASES) or "").split(",")
        return [k.strip() for k in keys if k.strip()]


def load_env(
    env_files: Iterable[str | Path] = (),
    *,
    environ: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> Env:
    """Resolve variables from env files and the process (see the module docstring)."""
    environ = os.environ if environ is None else environ
    explicit = [Path(p) for p in env_files]
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    if not explicit:
        implicit = Path(cwd or ".") / DEFAULT_ENV_FILE
        if implicit.is_file():
            for k, v in parse_env_file(implicit).items():
                values[k], sources[k] = v, str(implicit)
    for k, v in environ.items():
        values[k], sources[k] = v, "environment"
    for path in explicit:
        for k, v in parse_env_file(path).items():
            values[k], sources[k] = v, str(path)
    return Env(values, sources)


def apply_env(env: Env, names: Iterable[str] | None = None) -> None:
    """Export resolved variables into ``os.environ`` (for servers that read it)."""
    for name in names if names is not None else env.values:
        value = env.get(name)
        if value is not None:
            os.environ[name] = value


@contextmanager
def applied_env(env: Env) -> Iterator[None]:
    """`apply_env` for the length of a block: what ``os.environ`` held is put back after.

    A task app served in-process reads vendor keys and its settings from ``os.environ``, as
    it will in its container; a library caller's process is left as it was.
    """
    saved = {name: os.environ.get(name) for name in env.values}
    apply_env(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def write_env_var(path: str | Path, name: str, value: str) -> Path:
    """Set ``name=value`` in a .env file, keeping every other line; create it (0600) if absent."""
    path = Path(path)
    new_line = f"{name}={_quote(value)}"
    if path.exists():
        lines = path.read_text(encoding="utf-8").splitlines()
        pattern = re.compile(rf"^\s*(export\s+)?{re.escape(name)}\s*=")
        for i, line in enumerate(lines):
            if pattern.match(line):
                lines[i] = new_line
                break
        else:
            lines.append(new_line)
        _write_private(path, "\n".join(lines) + "\n")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_private(path, new_line + "\n")
    return path


def _quote(value: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_./:@+=,-]*", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _write_private(path: Path, text: str) -> None:
    # Write beside, then rename: a crash mid-write never leaves a truncated .env.
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    if path.exists():
        os.chmod(tmp, path.stat().st_mode & 0o777)
    os.replace(tmp, path)


__all__ = [
    "DEFAULT_ENV_FILE",
    "ENVIRONMENT_API_KEY",
    "ENVIRONMENT_API_KEY_ALIASES",
    "Env",
    "TASK_APP_URL",
    "applied_env",
    "apply_env",
    "fingerprint",
    "is_secret_name",
    "known_secrets",
    "load_env",
    "mask",
    "mask_secrets",
    "mint_key",
    "missing_key_hint",
    "parse_env_file",
    "redact",
    "redact_userinfo",
    "write_env_var",
]
