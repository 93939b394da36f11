"""Reading a lazily-built ``modal.App`` offline, the way Modal's own deploy would see it.

Modal keeps an image's layers and a secret's values in the loader closures it runs at deploy
time; these helpers call the same Dockerfile functions and walk the same mount entries, so
tests (and the stand-in `modal` CLI) inspect exactly what a real deploy would send. Nothing
here talks to the network.
"""

from __future__ import annotations

import inspect
import shlex
import shutil
import warnings
from pathlib import Path, PurePosixPath
from typing import Any

BUILDER_VERSION = "2025.06"


def _raw(obj: Any) -> Any:
    from modal._utils.async_utils import synchronizer

    return synchronizer._translate_in(obj)


def image_layers(image: Any) -> list[dict[str, Any]]:
    """Base first: {"commands": [...]} for build layers, {"mount": [(local, remote)...]}."""
    layers: list[dict[str, Any]] = []
    img = _raw(image)
    while img is not None:
        nonlocals = inspect.getclosurevars(img._load).nonlocals
        base = None
        if "mount" in nonlocals:  # add_local_* layer: a mount attached at container start
            files = [(Path(local), str(remote)) for entry in nonlocals["mount"].entries
                     for local, remote in entry.get_files_to_upload()]
            layers.append({"mount": files})
            base = nonlocals["base_image"]
        else:
            fn = nonlocals.get("dockerfile_function")
            layers.append({"commands": fn(BUILDER_VERSION).commands if fn else []})
            bases = list((nonlocals.get("base_images") or {}).values())
            base = bases[0] if bases else None
        img = base
    return list(reversed(layers))


def image_commands(image: Any) -> list[str]:
    return [c for layer in image_layers(image) for c in layer.get("commands", [])
            if c != "FROM base"]


def pip_requirements(image: Any) -> list[str]:
    """The requirements of the image's ``pip_install`` layers (not the base image's tools)."""
    reqs: list[str] = []
    for command in image_commands(image):
        words = shlex.split(command)
        if words[:5] == ["RUN", "python", "-m", "pip", "install"]:
            reqs += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
    return reqs


def image_files(image: Any) -> list[tuple[Path, str]]:
    return [f for layer in image_layers(image) for f in layer.get("mount", [])]


def function_spec(function: Any) -> Any:
    return _raw(function)._spec


def secret_env(secret: Any) -> dict[str, str] | None:
    """The variables of a ``Secret.from_dict`` (None for a named secret)."""
    raw = _raw(secret)
    loader = getattr(raw, "_load_env_dict", None)
    return dict(loader()) if loader else None


def secret_name(secret: Any) -> str | None:
    nonlocals = inspect.getclosurevars(_raw(secret)._load).nonlocals
    return nonlocals.get("name")


def volume_name(volume: Any) -> str:
    """The name a ``Volume.from_name`` was given."""
    return inspect.getclosurevars(_raw(volume)._load).nonlocals["name"]


def web_functions(app: Any) -> dict[str, Any]:
    """The App's web functions by name (as `modal deploy` enumerates them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        functions = dict(app.registered_functions)
    return {name: fn for name, fn in functions.items()
            if getattr(_raw(fn), "_webhook_config", None) is not None}


def materialize(image: Any, root: Path) -> Path:
    """Copy every file the image mounts into ``root``, at its container path under it."""
    for local, remote in image_files(image):
        target = root / PurePosixPath(remote).relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, target)
    return root
