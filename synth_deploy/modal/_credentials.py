"""Is there a Modal token? Answered locally, in well under a second, before anything is sent."""

from __future__ import annotations

from synth_deploy.env import Env
from synth_deploy.errors import DeployError
from synth_deploy.modal._modal_cli import TOKEN_FIX, modal_missing


def has_modal_token(env: Env) -> bool:
    """True when Modal will find credentials: env vars/env files, or a ~/.modal.toml profile."""
    if env.get("MODAL_TOKEN_ID") and env.get("MODAL_TOKEN_SECRET"):
        return True
    if env.get("MODAL_OAUTH_REFRESH_TOKEN"):
        return True
    try:
        from modal.config import config
    except ImportError as exc:
        raise modal_missing(exc) from exc
    except Exception as exc:  # a malformed ~/.modal.toml fails at import
        raise DeployError(f"cannot read Modal's configuration: {exc}",
                          hint="fix ~/.modal.toml, or run `modal token new`") from exc
    try:
        return bool(config.get("token_id") and config.get("token_secret")) or bool(
            config.get("oauth_refresh_token"))
    except Exception as exc:
        raise DeployError(f"cannot read Modal's configuration: {exc}",
                          hint="fix ~/.modal.toml, or run `modal token new`") from exc


def require_modal_token(env: Env) -> None:
    """Raise `DeployError` with the exact fix when no Modal token is configured."""
    if not has_modal_token(env):
        raise DeployError("no Modal token found (looked at MODAL_TOKEN_ID/MODAL_TOKEN_SECRET, "
                          "the env files and ~/.modal.toml)", hint=TOKEN_FIX)


__all__ = ["has_modal_token", "require_modal_token"]
