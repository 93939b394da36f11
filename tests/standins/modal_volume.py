"""A stand-in for Modal Volumes: the committed store, the containers' views, and the
``modal`` client a stand-in container imports.

Modal's documented rules, played on local folders:

- The committed state of Volume NAME is ``$STANDIN_MODAL_STATE_DIR/volumes/NAME``; the
  laptop's calls (`modal volume ls/get`, in modal_cli.py) read only it.
- Each container works on a view of its own (a copy of the committed state taken when it
  starts): what it writes there is visible elsewhere only after a commit.
- ``Volume.commit()`` copies the files the container changed (or deleted) since its last
  commit into the committed state, each file replaced whole (last writer wins), then
  reloads; ``reload()`` refuses while the container has a file of the view open, and
  otherwise takes the committed state into the view.
- Modal also commits in the background every few seconds (``background_s``) and when the
  container shuts down; a container killed with SIGKILL loses what it had not committed.

`install(views, background_s)` puts this module's client in ``sys.modules["modal"]`` (as
Modal's runtime has its client in every container) and starts the background commits.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

_LOCK = threading.RLock()  # commits of one container happen one at a time
_VIEWS: dict[str, tuple[Path, Path]] = {}  # name -> (committed store, this container's view)


def committed_dir(state: Path, name: str) -> Path:
    return state / "volumes" / name


def _files(folder: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for path in folder.rglob("*"):
        try:
            if path.is_file():
                st = path.stat()
                out[path.relative_to(folder).as_posix()] = (st.st_ino, st.st_mtime_ns,
                                                            st.st_size)
        except FileNotFoundError:
            continue  # renamed or removed while listed: the next commit sees what is there
    return out


class Volume:
    """What `modal.Volume` offers a container that mounts it (commit, reload)."""

    _seen: dict[str, dict[str, tuple[int, int, int]]] = {}

    def __init__(self, name: str) -> None:
        if name not in _VIEWS:
            raise RuntimeError(f"Volume {name!r} is not mounted in this container")
        self.name = name
        self.store, self.view = _VIEWS[name]

    @classmethod
    def from_name(cls, name: str, **_: object) -> Volume:
        return cls(name)

    def _persist(self) -> None:
        with _LOCK:
            seen = Volume._seen.setdefault(self.name, {})
            now = _files(self.view)
            for rel, stamp in now.items():
                if seen.get(rel) == stamp:
                    continue
                target = self.store / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f".{target.name}.{os.getpid()}.upload")
                try:
                    shutil.copy2(self.view / rel, tmp)  # its time kept: reload can skip it
                except FileNotFoundError:
                    now.pop(rel)  # gone since it was listed (renamed into place)
                    continue
                os.replace(tmp, target)  # whole, and the last writer wins
            for rel in set(seen) - set(now):
                (self.store / rel).unlink(missing_ok=True)
            Volume._seen[self.name] = now

    def commit(self) -> None:
        self._persist()
        self.reload()

    def reload(self) -> None:
        with _LOCK:
            self._persist()  # uncommitted changes are committed by a reload
            fd_dir = Path("/proc/self/fd")
            for fd in fd_dir.iterdir():
                try:
                    target = Path(os.readlink(fd))
                except OSError:
                    continue
                if target.is_relative_to(self.view) and target.is_file():
                    raise RuntimeError("there are open files preventing the operation: "
                                       f"{target}")
            seen = Volume._seen.setdefault(self.name, {})
            view = _files(self.view)
            for rel, (_, mtime, size) in _files(self.store).items():
                if view.get(rel, (0, 0, 0))[1:] == (mtime, size):
                    continue  # the view holds this version already
                dest = self.view / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(f".{dest.name}.reload")
                shutil.copy2(self.store / rel, tmp)
                os.replace(tmp, dest)
            Volume._seen[self.name] = {**seen, **{
                rel: stamp for rel, stamp in _files(self.view).items()
                if (self.store / rel).exists()}}


def commit_all() -> None:
    """What Modal does in the background and at shutdown: persist every view's changes."""
    for name in _VIEWS:
        Volume(name)._persist()


def install(views: dict[str, tuple[str, str]], background_s: float) -> None:
    import types

    for name, (store, view) in views.items():
        _VIEWS[name] = (Path(store), Path(view))
        Volume._seen[name] = _files(Path(view))  # the committed state it started from
    client = types.ModuleType("modal")
    client.Volume = Volume  # type: ignore[attr-defined]
    client.is_local = lambda: False  # type: ignore[attr-defined]
    sys.modules["modal"] = client

    def background() -> None:
        while not stop.wait(background_s):
            commit_all()

    stop = threading.Event()
    if views:
        threading.Thread(target=background, name="volume-background", daemon=True).start()
