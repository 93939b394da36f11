"""Registering task apps and finding them again by id or by file path.

Discovery reads ``./apps/``, the folders `synth-deploy init` makes here (``./NAME/task_app.py``)
and the kit's bundled examples without importing anything: it parses each file and looks for
``TaskApp("...")`` and ``register_task_app(app_id="...")`` calls, so `synth-deploy apps` stays
fast and a broken app cannot break the listing. A file that cannot be read (a
syntax error, bad encoding) is reported with file:line and the error, never skipped in
silence: the apps it declares are unknown until it is fixed. Loading imports only the one
file asked for.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib.machinery
import importlib.util
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synth_deploy.errors import AppNotFoundError, TaskAppError, UsageError
from synth_deploy.taskapp._identity import AppIdentity, app_identity
from synth_deploy.taskapp.config import TaskAppConfig


def _bundled_apps_dir() -> Path:
    """The kit's example apps: inside the package when installed from a wheel (pyproject maps
    the checkout's apps/ to synth_deploy/_apps), the checkout's apps/ folder otherwise."""
    package = Path(__file__).resolve().parents[1]
    installed, checkout = package / "_apps", package.parent / "apps"
    if not installed.is_dir() and (package.parent / "pyproject.toml").is_file():
        return checkout
    return installed


BUNDLED_APPS_DIR = _bundled_apps_dir()


@dataclass(frozen=True)
class TaskAppEntry:
    """A registered task app: its id, how to build its config, and its deployment settings."""

    app_id: str
    config_factory: Callable[[], TaskAppConfig]
    description: str = ""
    modal: Any = None  # synth_deploy.modal.ModalSettings, kept untyped to avoid importing it
    source: Path | None = None

    def build_config(self) -> TaskAppConfig:
        try:
            config = self.config_factory()
        except Exception as exc:
            where = _user_frame(exc, self.source)
            raise TaskAppError(f"task app {self.app_id!r} failed to build its config{where}: "
                               f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(config, TaskAppConfig):
            raise TaskAppError(f"task app {self.app_id!r}: config_factory returned "
                               f"{type(config).__name__}, expected TaskAppConfig")
        if self.source is not None and config.identity.digest is None:
            # Worked out here, once per config: the server, the store and `check` read it.
            config.identity = app_identity(self.source, version=config.version,
                                           code_files=config.code_files)
        return config


@dataclass(frozen=True)
class AppInfo:
    """A task app found on disk (not imported)."""

    app_id: str
    path: Path
    description: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"app_id": self.app_id, "path": str(self.path), "description": self.description}


@dataclass(frozen=True)
class AppFileProblem:
    """A file under an apps folder that discovery could not read: where, and why."""

    path: Path
    error: str  # "SyntaxError: '(' was never closed"
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = "".join(f":{n}" for n in (self.line, self.column) if n)
        return f"{self.path}{where}: {self.error}"

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "line": self.line, "column": self.column,
                "error": self.error}


@dataclass(frozen=True)
class Discovery:
    """What the apps folders hold: the apps found, and the files that could not be read."""

    apps: list[AppInfo]
    problems: list[AppFileProblem]


_REGISTRY: dict[str, TaskAppEntry] = {}
_LOADED_FILES: dict[Path, Any] = {}


def register_task_app(
    *,
    app_id: str,
    config_factory: Callable[[], TaskAppConfig],
    description: str = "",
    modal: Any = None,
) -> TaskAppEntry:
    """Register a task app under ``app_id``; call it at module level in the app's file.

    (`TaskApp(...)` declares and registers in one step; this is the lower-level form.)
    """
    return add_entry(TaskAppEntry(app_id, config_factory, description, modal,
                                  caller_file(1)))


def add_entry(entry: TaskAppEntry) -> TaskAppEntry:
    existing = _REGISTRY.get(entry.app_id)
    if existing is not None and existing.source != entry.source:
        raise TaskAppError(f"task app id {entry.app_id!r} is registered twice: in "
                           f"{existing.source} and {entry.source}",
                           hint="give one of them another app_id")
    _REGISTRY[entry.app_id] = entry
    return entry


def registered_apps() -> list[TaskAppEntry]:
    return sorted(_REGISTRY.values(), key=lambda e: e.app_id)


SCAFFOLD_FILE = "task_app.py"  # what `synth-deploy init NAME` writes: NAME/task_app.py


def app_files(search_paths: Iterable[Path] | None = None, *,
              cwd: Path | None = None) -> list[Path]:
    """The files discovery reads, in the order their apps win: each search path's
    ``*/*.py`` and ``*.py``. Without search paths: ``./apps``, then the folders `init`
    makes in the current folder (``./NAME/task_app.py``), then the kit's bundled examples."""
    if search_paths is not None:
        return [f for root in search_paths for f in _files_under(Path(root))]
    here = cwd or Path.cwd()
    files = [*_files_under(here / "apps"), *sorted(here.glob(f"*/{SCAFFOLD_FILE}")),
             *_files_under(BUNDLED_APPS_DIR)]
    unique: dict[Path, Path] = {}
    for file in files:  # run from inside apps/, its folders are init folders too
        unique.setdefault(file.resolve(), file)
    return list(unique.values())


def _files_under(root: Path) -> list[Path]:
    return sorted(root.glob("*/*.py")) + sorted(root.glob("*.py"))


def scan_apps(search_paths: Iterable[Path] | None = None, *,
              mentioning: str | None = None) -> Discovery:
    """Apps in `app_files`, found by reading (not importing) them, and every file that
    could not be read. ``mentioning``: parse only the files that hold this app id as a
    string (looking one app up need not parse every file)."""
    found: dict[str, AppInfo] = {}
    problems: list[AppFileProblem] = []
    quoted = (f'"{mentioning}"', f"'{mentioning}'") if mentioning is not None else ()
    for path in app_files(search_paths):
        if quoted and not _mentions(path, quoted):
            continue
        apps, problem = _scan_file(path)
        for info in apps:
            found.setdefault(info.app_id, info)  # earlier files win
        if problem is not None:
            problems.append(problem)
    return Discovery(sorted(found.values(), key=lambda i: i.app_id), problems)


def discover_apps(search_paths: Iterable[Path] | None = None) -> list[AppInfo]:
    """Apps under the search paths (`scan_apps` also says which files could not be read)."""
    return scan_apps(search_paths).apps


def load_app(ref: str, search_paths: Iterable[Path] | None = None) -> TaskAppEntry:
    """The registered entry for an app id, or for the task app file at a path."""
    candidate = Path(ref)
    if ref.endswith(".py") or candidate.is_file() or "/" in ref:
        return _load_file(ref, candidate)
    if ref in _REGISTRY:
        return _REGISTRY[ref]
    search_paths = list(search_paths) if search_paths is not None else None
    match = next((a for a in scan_apps(search_paths, mentioning=ref).apps if a.app_id == ref),
                 None)
    if match is None:
        raise _unknown_app(ref, search_paths)
    _import_file(match.path.resolve())
    if ref not in _REGISTRY:
        raise TaskAppError(f"{match.path} mentions app id {ref!r} but did not register it "
                           "when imported", hint="call register_task_app(...) at module level")
    return _REGISTRY[ref]


def _load_file(ref: str, candidate: Path) -> TaskAppEntry:
    """The one app the task app file at ``candidate`` registers."""
    if not candidate.is_file():
        raise AppNotFoundError(f"no task app file at {ref}",
                               hint="pass an app id (see `synth-deploy apps`) or a .py path")
    entries = _import_file(candidate.resolve())
    if len(entries) != 1:
        ids = ", ".join(e.app_id for e in entries) or "none"
        raise AppNotFoundError(
            f"{ref} registers {len(entries)} task apps ({ids})",
            hint="a task app file calls register_task_app(...) exactly once; "
                 "or pass the app id instead")
    return entries[0]


def _unknown_app(ref: str, search_paths: list[Path] | None) -> AppNotFoundError:
    """The error for an app id no file declares: every file read for it (close ids, and the
    files that could not be read, where the app may be declared)."""
    scan = scan_apps(search_paths)
    ids = [a.app_id for a in scan.apps]
    close = difflib.get_close_matches(ref, ids, n=1)
    hint = f"did you mean {close[0]!r}?" if close else (
        f"known apps: {', '.join(ids)}" if ids else
        f"no apps found under ./apps or ./*/{SCAFFOLD_FILE}")
    message = f"no task app with id {ref!r}"
    if scan.problems:
        # The app may be declared in a file that cannot be read: say which, and why.
        listing = "\n".join(f"  {p}" for p in scan.problems)
        message += (f"; {len(scan.problems)} app file(s) could not be read, so the apps "
                    f"they declare are unknown:\n{listing}")
        hint = "fix the file(s) above" + (f"; or {hint}" if close else "")
    return AppNotFoundError(message, hint=hint)


class _AppFileLoader(importlib.machinery.SourceFileLoader):
    """An app file compiled from its source on every import, no bytecode cache read or
    written: the cache trusts a file's size and its time to the second, so an edit of the
    same size within a second (a reload, an agent's rewrite) would serve the old code."""

    def get_code(self, fullname: str) -> Any:
        return self.source_to_code(self.get_data(self.path), self.path)


def _import_file(path: Path) -> list[TaskAppEntry]:
    if path not in _LOADED_FILES:
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
        name = f"synth_deploy_apps.{path.stem}_{digest}"
        spec = importlib.util.spec_from_file_location(
            name, path, loader=_AppFileLoader(name, str(path)))
        if spec is None or spec.loader is None:
            raise TaskAppError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        # The app's folder goes on sys.path so it can import its sibling modules, as it
        # would under `modal deploy`.
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except SyntaxError as exc:  # a file to fix, as when the app is named by its id
            sys.modules.pop(name, None)
            problem = AppFileProblem(Path(exc.filename or path), f"{type(exc).__name__}: "
                                     f"{exc.msg}", exc.lineno, exc.offset)
            raise UsageError(f"cannot import {problem}", hint="fix the file") from exc
        except Exception as exc:
            sys.modules.pop(name, None)
            raise TaskAppError(f"importing {path} failed{_user_frame(exc, path)}: "
                               f"{type(exc).__name__}: {exc}") from exc
        _LOADED_FILES[path] = module
    return [e for e in _REGISTRY.values() if e.source == path]


def _mentions(path: Path, texts: tuple[str, ...]) -> bool:
    try:
        content = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True  # let the scan say why it cannot be read
    return any(text in content for text in texts)


def _scan_file(path: Path) -> tuple[list[AppInfo], AppFileProblem | None]:
    tree = _parsed(path)
    if isinstance(tree, AppFileProblem):
        return [], tree
    constants = _string_constants(tree)
    apps = []
    for node in ast.walk(tree):
        kw = _registration(node)
        if kw is None:
            continue
        app_id = _literal(kw.get("app_id") or (node.args[0] if node.args else None), constants)
        if app_id:
            apps.append(AppInfo(app_id, path, _literal(kw.get("description"), constants) or ""))
    return apps, None


def _parsed(path: Path) -> ast.Module | AppFileProblem:
    """The file's syntax tree, or why it cannot be read."""
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as exc:  # IndentationError and TabError included
        return AppFileProblem(path, f"{type(exc).__name__}: {exc.msg}", exc.lineno, exc.offset)
    except UnicodeDecodeError as exc:
        return AppFileProblem(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})")
    except OSError as exc:
        return AppFileProblem(path, f"cannot be read: {exc.strerror or exc}")


def _string_constants(tree: ast.Module) -> dict[str, str]:
    """Module-level string constants, so `app_id=APP_ID` resolves too."""
    return {
        target.id: node.value.value
        for node in tree.body if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets if isinstance(target, ast.Name)
    }


def _registration(node: ast.AST) -> dict[str | None, ast.expr] | None:
    """The keywords of a ``register_task_app(...)`` or ``TaskApp(...)`` call; None for any
    other node."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if name not in ("register_task_app", "TaskApp"):
        return None
    return {k.arg: k.value for k in node.keywords}


def _literal(value: ast.expr | None, constants: dict[str, str]) -> str | None:
    """A string literal's value, or a module constant's it names."""
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value.value
    if isinstance(value, ast.Name):
        return constants.get(value.id)
    return None


def caller_file(depth: int) -> Path | None:
    """The file of the code ``depth`` frames above the caller (the task app's module)."""
    frame = sys._getframe(depth + 1)
    filename = frame.f_globals.get("__file__") or frame.f_code.co_filename
    return Path(filename).resolve() if filename else None


def _user_frame(exc: BaseException, source: Path | None) -> str:
    """' at file:line' for the deepest frame inside the app's folder, if any."""
    frames = traceback.extract_tb(exc.__traceback__)
    folder = str(source.parent) if source else None
    for frame in reversed(frames):
        if folder is None or frame.filename.startswith(folder):
            return f" at {frame.filename}:{frame.lineno}"
    return ""


__all__ = [
    "AppFileProblem",
    "AppIdentity",
    "AppInfo",
    "BUNDLED_APPS_DIR",
    "Discovery",
    "TaskAppEntry",
    "SCAFFOLD_FILE",
    "app_files",
    "app_identity",
    "discover_apps",
    "load_app",
    "register_task_app",
    "registered_apps",
    "scan_apps",
]
