"""`AppIdentity`: which code of a task app made a rollout, said the same way everywhere.

A task app's identity is its declared ``version`` (`TaskApp(version=...)`) and a digest of
its code: what `synth-deploy serve`, `deploy` and Modal's container would run. What is
hashed, in this order (each file as its path relative to the app's folder, then its bytes):

- the app's file;
- the Python modules beside it (``*.py`` in its folder, not below): the siblings it
  imports as ``from math_problems import ...``, which Modal's image carries with it;
- the files it declares with ``TaskApp(code_files=("prompts/*.txt", "data/"))`` (globs
  relative to its folder; a folder counts every file below it): data and prompts that
  decide what an episode is.

Nothing else: not the kit, not the installed packages, not ``.env`` or trace files. So two
checkouts of the same app file give the same digest on any machine, and any edit of the
code changes it. The digest is the first 16 hex digits of a SHA-256 (64 bits: enough to
tell an app's versions apart, short enough to store in every session).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth_deploy.errors import TaskAppError

DIGEST_HEX = 16
_SKIPPED_PARTS = ("__pycache__", ".git", ".venv", "venv", "node_modules")


@dataclass(frozen=True)
class AppIdentity:
    """A task app's declared ``version`` and the ``digest`` of its code (None when the app
    has no file to hash: a config built in Python); ``files``: what was hashed."""

    version: str | None = None
    digest: str | None = None
    files: tuple[str, ...] = field(default=(), compare=False)

    @property
    def label(self) -> str:
        """``1+3f2a9c1d2e4b5a6f``: the version and the digest, as tables show it."""
        return "+".join(p for p in (self.version, self.digest) if p) or "-"

    def session_fields(self) -> dict[str, str]:
        """What every stored session of this app says of its code (the keys set only)."""
        from synth_deploy.tracing import SESSION_IDENTITY_KEYS  # the store owns the names

        version_key, digest_key = SESSION_IDENTITY_KEYS
        return {k: v for k, v in ((version_key, self.version), (digest_key, self.digest))
                if v is not None}

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "digest": self.digest, "label": self.label,
                "files": list(self.files)}


def app_identity(source: Path, *, version: str | None,
                 code_files: Sequence[str] = ()) -> AppIdentity:
    """The identity of the app whose file is ``source`` (see the module docstring).

    A ``code_files`` pattern that matches nothing is a `TaskAppError` naming it: a typo
    would otherwise leave its files out of the digest in silence."""
    source = source.resolve()
    folder = source.parent
    chosen = {source}
    chosen.update(p.resolve() for p in folder.glob("*.py") if p.is_file())
    for pattern in code_files:
        chosen.update(f.resolve() for f in _declared_files(source, folder, pattern))
    hasher = hashlib.sha256()
    names = []
    for path in sorted(chosen, key=lambda p: _relative(p, folder)):
        name = _relative(path, folder)
        data = _code_bytes(source, path)
        hasher.update(b"%s\0%d\0" % (name.encode(), len(data)))
        hasher.update(data)
        names.append(name)
    return AppIdentity(version=version, digest=hasher.hexdigest()[:DIGEST_HEX],
                       files=tuple(names))


def _declared_files(source: Path, folder: Path, pattern: str) -> list[Path]:
    """The files one ``code_files`` pattern names (a folder: every file below it, caches
    and environments left out); `TaskAppError` when it names none."""
    matched = [p for p in folder.glob(pattern.rstrip("/") or ".")]
    files = [f for p in matched for f in ([p] if p.is_file() else sorted(p.rglob("*")))
             if f.is_file() and not any(part in _SKIPPED_PARTS for part in f.parts)]
    if not files:
        raise TaskAppError(f"task app {source}: code_files pattern {pattern!r} matches no "
                           f"file under {folder}",
                           hint="give paths or globs relative to the app's folder, or "
                                "drop the pattern")
    return files


def _code_bytes(source: Path, path: Path) -> bytes:
    """A hashed file's bytes; `TaskAppError` naming it when it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TaskAppError(f"task app {source}: cannot read {path} for its code digest: "
                           f"{exc.strerror or exc}") from exc


def _relative(path: Path, folder: Path) -> str:
    # A declared file outside the folder is named from it (``../shared/rules.txt``).
    return Path(os.path.relpath(path, folder)).as_posix()


__all__ = ["AppIdentity", "app_identity"]
