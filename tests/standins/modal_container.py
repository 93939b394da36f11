"""The stand-in's "container": serve a Modal web function from a materialized image root.

    python modal_container.py ROOT MODULE QUALNAME PORT_FILE ALLOWED_DISTS_JSON

Its Sandboxes are played by modal_sandbox.py (``STANDIN_MODAL_SANDBOXES``: its state dir).
Modal's Dicts are played by the service of modal_dict.py, a process of its own
(``STANDIN_MODAL_DICT_URL``). The Volumes the function mounts are played by modal_volume.py
(``STANDIN_MODAL_VOLUMES``:
JSON {name: [committed folder, this container's view]}): its client is the ``modal`` this
container imports, it commits in the background every ``STANDIN_VOLUME_BACKGROUND_S``, and
once more when the server has shut down (SIGTERM); SIGKILL loses what was not committed.

Like Modal's container entrypoint it imports MODULE by name with ROOT (the image's /root) first
on the path, looks up QUALNAME (a function decorated elsewhere, Modal's "case 2"), calls it
for the ASGI app and serves that — here with uvicorn on 127.0.0.1. The project's editable
install is taken off the import path, so only code the image mounts can be imported, and
site-packages is fenced to the distributions the image's pip layer installs (plus the
server runtime): importing anything else fails as it would in the real container.

ROOT/../imports.json says what the container asked for, kept current as it runs:
``{"refused": [...], "synth_deploy": [...]}`` — the site-packages modules refused (optional
imports may be refused harmlessly), and every ``synth_deploy`` module it tried to import,
found or not (an import caught by a ``try`` shows here too).
"""

from __future__ import annotations

import importlib
import importlib.abc
import json
import os
import re
import sys
from pathlib import Path


def _isolate(root: Path) -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path[:] = [p for p in sys.path
                   if not (Path(p or ".").resolve() / "synth_deploy").is_dir()]
    sys.path.insert(0, str(root))


class _InstalledOnly(importlib.abc.MetaPathFinder):
    """Refuse top-level modules whose distribution the image does not install; note every
    ``synth_deploy`` module asked for."""

    def __init__(self, allowed: set[str], root: Path, record_file: Path) -> None:
        from importlib import metadata

        norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()  # noqa: E731
        self.owner = {mod: {norm(d) for d in dists}
                      for mod, dists in metadata.packages_distributions().items()}
        self.allowed = {norm(a) for a in allowed}
        self.refused: list[str] = []
        self.requested: list[str] = []
        self.record_file = record_file
        self.root = root

    def _record(self) -> None:
        self.record_file.write_text(json.dumps({"refused": sorted(set(self.refused)),
                                                "synth_deploy": sorted(set(self.requested))}))

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top == "synth_deploy":
            self.requested.append(fullname)
            self._record()
            return None  # found (or not) in ROOT, like any mounted source
        owners = self.owner.get(top)
        mounted = (self.root / top).exists() or (self.root / f"{top}.py").exists()
        if path is None and not mounted and owners and not owners & self.allowed:
            self.refused.append(fullname)
            self._record()
            raise ModuleNotFoundError(f"No module named {fullname!r} (not in the image)",
                                      name=fullname)
        return None


def main() -> int:
    root, module_name, qualname, port_file, allowed = sys.argv[1:6]
    root_path = Path(root).resolve()
    import modal_volume

    modal_volume.install(json.loads(os.environ.pop("STANDIN_MODAL_VOLUMES", "{}")),
                         float(os.environ.pop("STANDIN_VOLUME_BACKGROUND_S", "5")))
    if sandboxes := os.environ.pop("STANDIN_MODAL_SANDBOXES", None):
        from modal_sandbox import ModalSandboxStandin

        ModalSandboxStandin(Path(sandboxes)).install(sys.modules["modal"])
    if dict_url := os.environ.pop("STANDIN_MODAL_DICT_URL", None):
        import modal_dict

        modal_dict.install(sys.modules["modal"], dict_url)  # the Dict service, elsewhere
    _isolate(root_path)
    sys.meta_path.insert(0, _InstalledOnly(set(json.loads(allowed)), root_path,
                                           root_path.parent / "imports.json"))
    module = importlib.import_module(module_name)
    import synth_deploy

    if not Path(synth_deploy.__file__).resolve().is_relative_to(root_path):
        raise SystemExit(f"synth_deploy imported from outside the image: {synth_deploy.__file__}")
    asgi_app = getattr(module, qualname)()

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(asgi_app, host="127.0.0.1", port=0,
                                           log_level="warning", lifespan="on"))
    original_startup = server.startup

    async def startup(sockets=None):
        await original_startup(sockets)
        port = server.servers[0].sockets[0].getsockname()[1]
        tmp = Path(port_file + ".tmp")
        tmp.write_text(str(port))
        tmp.rename(port_file)

    server.startup = startup
    server.run()
    modal_volume.commit_all()  # Modal commits a container's Volumes when it stops
    return 0


if __name__ == "__main__":
    sys.exit(main())
