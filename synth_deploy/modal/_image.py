"""`ImageRecipe`: what goes into a task app's container image, and nothing more.

The image holds the minimal serving set (no uvicorn: Modal's ``asgi_app`` runs the ASGI app
itself; no typer/rich/modal: the CLI never runs in the container), the parts of the
``synth_deploy`` source that serving imports, and the app's own folder — never ``.env`` files,
trace databases, caches or ``.git``. Source files are mounted at container start
(``copy=False``), so a code change does not rebuild the image.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any

from synth_deploy.errors import UsageError
from synth_deploy.modal._settings import DEFAULT_APP_REMOTE_PATH, ModalSettings

# What `create_app(config)` imports at serving time: starlette (fastapi brings it, and an app
# with its own routers needs fastapi itself), pydantic, anyio; aiohttp calls the policy, and
# httpx is ctx.http's API on top of it.
SERVING_PACKAGES = ("fastapi", "pydantic", "httpx", "aiohttp", "msgspec")
# A remote trace store (libsql://) needs the libSQL client in the container.
REMOTE_TRACING_PACKAGES = ("libsql",)

# synth_deploy subpackages that serving never imports: the CLI, tunnels, runs, training,
# health probes, and the bundled example apps of an installed kit (an app's own folder is
# added on its own).
SOURCE_EXCLUDED_PACKAGES = ("cli", "tunnel", "runs", "train", "health", "_apps")

# Kept out of the app folder: secrets, trace databases, VCS data, caches and environments.
APP_DIR_IGNORE = (
    "**/.env", "**/.env.*", "**/*.env",
    "**/*.db", "**/*.db-*", "**/*.sqlite", "**/*.sqlite3", "**/traces",
    "**/.git", "**/.hg", "**/.svn",
    "**/__pycache__", "**/*.pyc", "**/.pytest_cache", "**/.ruff_cache", "**/.mypy_cache",
    "**/.venv", "**/venv", "**/node_modules", "**/.DS_Store", "**/*.log",
)


_BARE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def pinned(package: str) -> str:
    """``package==<installed version>`` so the container runs what local validation ran."""
    try:
        return f"{package}=={metadata.version(package)}"
    except metadata.PackageNotFoundError:
        return package


def dependency_closure(requirements: Sequence[str]) -> list[str]:
    """Every distribution ``requirements`` pull in, read from the installed packages' metadata.

    Extras are not followed; environment markers are evaluated for this interpreter. Packages
    not installed here are counted by name but not expanded.
    """
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - packaging ships with pip/setuptools
        Requirement = None  # noqa: N806

    def parse(text: str) -> str | None:
        if Requirement is None:
            name = re.split(r"[\s;<>=!~\[(]", text.strip(), maxsplit=1)[0]
            return None if "extra ==" in text else name
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            return None
        return req.name

    seen: dict[str, None] = {}
    todo = [n for n in (parse(r) for r in requirements) if n]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in seen:
            continue
        seen[key] = None
        try:
            todo += [n for n in (parse(r) for r in metadata.requires(key) or []) if n]
        except metadata.PackageNotFoundError:
            continue
    return sorted(seen)


class SourceFilter:
    """Ignore predicate for the ``synth_deploy`` source: .py files of the serving packages only.

    Modal calls it with paths relative to the package folder.
    """

    def __init__(self, excluded: Sequence[str] = SOURCE_EXCLUDED_PACKAGES) -> None:
        self.excluded = tuple(excluded)

    def __call__(self, path: Path) -> bool:
        parts = Path(path).parts  # Modal passes files only (callables get no dir pruning)
        if not parts or not parts[-1].endswith(".py"):
            return True
        return parts[0] in self.excluded or any(p.startswith(".") or p == "__pycache__"
                                                for p in parts)

    def __repr__(self) -> str:
        return f"SourceFilter(excluded={list(self.excluded)})"


@dataclass(frozen=True)
class LocalDir:
    """A local folder added to the container at ``remote`` (mounted, not baked in)."""

    local: Path
    remote: str
    ignore: tuple[str, ...] = APP_DIR_IGNORE


@dataclass(frozen=True)
class ImageRecipe:
    """The image, as data: shown by the plan, turned into a ``modal.Image`` by `to_modal`."""

    python_version: str
    pip_packages: tuple[str, ...]
    apt_packages: tuple[str, ...] = ()
    python_sources: tuple[str, ...] = ("synth_deploy",)
    local_dirs: tuple[LocalDir, ...] = field(default_factory=tuple)

    @classmethod
    def for_app(cls, app_dir: Path, settings: ModalSettings, *,
                remote_tracing: bool = False) -> ImageRecipe:
        packages = [pinned(p) for p in SERVING_PACKAGES]
        if remote_tracing:
            packages += [pinned(p) for p in REMOTE_TRACING_PACKAGES]
        # A bare name is pinned like the serving set: the container runs the version the
        # local validation ran (a crafter world, say, is only the same world on one version).
        packages += [pinned(p) if _BARE_NAME.fullmatch(p) else p
                     for p in settings.pip_packages if p not in packages]
        ignore = APP_DIR_IGNORE + tuple(settings.ignore)
        dirs = [LocalDir(app_dir, DEFAULT_APP_REMOTE_PATH, ignore)]
        for local, remote in settings.local_dirs.items():
            path = (app_dir / local).resolve()
            if not path.is_dir():
                raise UsageError(f"ModalSettings.local_dirs.{local}: {path} is not a folder",
                                 hint="paths are relative to the task app's folder")
            dirs.append(LocalDir(path, remote, ignore))
        return cls(python_version=settings.python_version, pip_packages=tuple(packages),
                   apt_packages=tuple(settings.apt_packages), local_dirs=tuple(dirs))

    def steps(self) -> list[str]:
        """The recipe, one human-readable line a layer."""
        lines = [f"debian_slim(python_version={self.python_version!r})"]
        if self.apt_packages:
            lines.append("apt_install " + " ".join(self.apt_packages))
        lines.append("pip_install " + " ".join(self.pip_packages))
        for module in self.python_sources:
            lines.append(f"add_local_python_source {module} (.py only; without "
                         f"{', '.join(SOURCE_EXCLUDED_PACKAGES)})")
        for d in self.local_dirs:
            lines.append(f"add_local_dir {d.local} -> {d.remote} (ignoring .env*, *.db, "
                         f"traces, .git, caches, venvs)")
        return lines

    def dependencies(self) -> list[str]:
        """The distributions the pip layer installs (its requirements and theirs)."""
        return dependency_closure(self.pip_packages)

    def to_dict(self) -> dict[str, Any]:
        dependencies = self.dependencies()
        return {"python_version": self.python_version, "pip_packages": list(self.pip_packages),
                "dependency_count": len(dependencies), "dependencies": dependencies,
                "apt_packages": list(self.apt_packages),
                "python_sources": list(self.python_sources),
                "local_dirs": [{"local": str(d.local), "remote": d.remote,
                                "ignore": list(d.ignore)} for d in self.local_dirs],
                "steps": self.steps()}

    def to_modal(self) -> Any:
        """The ``modal.Image`` (built lazily by Modal; nothing is sent here)."""
        import modal

        image = modal.Image.debian_slim(python_version=self.python_version)
        if self.apt_packages:
            image = image.apt_install(*self.apt_packages)
        image = image.pip_install(*self.pip_packages)
        # add_local_* come last: they are mounted at start, so later layers would rebuild.
        image = image.add_local_python_source(*self.python_sources, ignore=SourceFilter())
        for d in self.local_dirs:
            image = image.add_local_dir(d.local, d.remote, ignore=list(d.ignore))
        return image


def app_remote_file(source: Path) -> str:
    """Where the app file lives in the container, relative to the root holding synth_deploy."""
    relative = PurePosixPath(DEFAULT_APP_REMOTE_PATH).relative_to("/root")
    return str(relative / source.name)


__all__ = ["APP_DIR_IGNORE", "SERVING_PACKAGES", "SOURCE_EXCLUDED_PACKAGES", "ImageRecipe",
           "LocalDir", "SourceFilter", "app_remote_file", "dependency_closure", "pinned"]
