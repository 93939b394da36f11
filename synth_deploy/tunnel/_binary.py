"""Finding the cloudflared binary, and telling the user how to install it when it is missing.

This module imports nothing of the runtime: `synth-deploy tunnel` fails here, in milliseconds,
before it serves anything.
"""

from __future__ import annotations

import os
import platform as _platform
import shutil
from collections.abc import Mapping
from pathlib import Path

from synth_deploy.tunnel._errors import CloudflaredNotFoundError

CLOUDFLARED_PATH = "CLOUDFLARED_PATH"
RELEASES_URL = "https://github.com/cloudflare/cloudflared/releases/latest"

# No square brackets: the CLI renders hints with rich markup. (Cloudflare's apt repo line
# needs "[signed-by=…]", so Debian gets the release .deb and a pointer to the repo.)
_DEB_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
             "armv7l": "armhf", "i686": "386", "i386": "386"}
_INSTALL = {
    "debian": ("curl -fsSLo cloudflared.deb {releases}/download/cloudflared-linux-{arch}.deb "
               "&& sudo dpkg -i cloudflared.deb  (or apt-get install cloudflared from "
               "Cloudflare's apt repository, https://pkg.cloudflare.com)"),
    "rhel": ("curl -fsSL https://pkg.cloudflare.com/cloudflared-ascii.repo | sudo tee "
             "/etc/yum.repos.d/cloudflared.repo && sudo yum install cloudflared"),
    "linux": "download cloudflared-linux-{arch} from {releases} onto your PATH",
    "darwin": "brew install cloudflared",
    "windows": "winget install --id Cloudflare.cloudflared",
}


def install_hint(system: str | None = None, os_release: Mapping[str, str] | None = None,
                 machine: str | None = None) -> str:
    """The install command for this machine (or for ``system``: "Linux", "Darwin", "Windows")."""
    system = (system or _platform.system()).lower()
    arch = _DEB_ARCH.get((machine or _platform.machine()).lower(), "amd64")
    if system == "linux":
        release = _os_release() if os_release is None else os_release
        family = " ".join([release.get("ID", ""), release.get("ID_LIKE", "")]).lower()
        if "debian" in family or "ubuntu" in family:
            command = _INSTALL["debian"]
        elif any(name in family for name in ("rhel", "fedora", "centos")):
            command = _INSTALL["rhel"]
        else:
            command = _INSTALL["linux"]
    else:
        command = _INSTALL.get(system, f"download cloudflared from {RELEASES_URL}")
    command = command.format(releases=RELEASES_URL, arch=arch)
    return f"install cloudflared: {command}; or set {CLOUDFLARED_PATH} to the binary's path"


def find_cloudflared(env: Mapping[str, str] | None = None) -> str:
    """The path of the cloudflared executable: ``CLOUDFLARED_PATH`` if set, else PATH.

    ``env`` holds resolved settings (an :class:`synth_deploy.env.Env`'s values, resolved by
    the caller); without it, cloudflared is looked for on this process's PATH.
    """
    env = env or {}
    explicit = (env.get(CLOUDFLARED_PATH) or "").strip()
    if explicit:
        path = Path(explicit).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        problem = "does not exist" if not path.exists() else "is not an executable file"
        raise CloudflaredNotFoundError(f"{CLOUDFLARED_PATH}={explicit} {problem}",
                                       hint=install_hint())
    found = shutil.which("cloudflared", path=env.get("PATH"))
    if found:
        return found
    raise CloudflaredNotFoundError("cloudflared was not found on PATH", hint=install_hint())


def _os_release() -> dict[str, str]:
    try:
        return dict(_platform.freedesktop_os_release())
    except OSError:
        return {}


__all__ = ["CLOUDFLARED_PATH", "find_cloudflared", "install_hint"]
