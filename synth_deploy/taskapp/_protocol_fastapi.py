"""A task app with its own FastAPI routers is served as FastAPI (imported only for it)."""

from __future__ import annotations

from fastapi import FastAPI

from synth_deploy.taskapp._protocol_app import LeanProtocolPaths


class ProtocolFastAPI(LeanProtocolPaths, FastAPI):
    """FastAPI, the protocol's endpoints on the lean path."""


__all__ = ["ProtocolFastAPI"]
