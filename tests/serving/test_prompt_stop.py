"""The kit's uvicorn server (serving/_prompt_stop.py) rewrites two of uvicorn's methods to
stop sooner: it must still take every step uvicorn's own take, whatever uvicorn release is
installed. Read from the source, as the architecture tests read the package."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest
import uvicorn

import synth_deploy

# Reads uvicorn's or aiohttp's internals the kit relies on: CI runs it on the newest releases too.
pytestmark = pytest.mark.upstream

SOURCE = Path(synth_deploy.__file__).parent / "serving" / "_prompt_stop.py"

# uvicorn's steps that ours take otherwise, and why.
REPLACED = {
    "_wait_tasks_to_complete": "PromptStopServer._drained: the same waits, at 10 ms",
    "sleep": "uvicorn's fixed 0.1-s pauses, which are what the class removes",
    "info": "uvicorn's 'Shutting down' and 'Waiting for ...' log lines",
    "TimeoutError": "asyncio.TimeoutError is the builtin TimeoutError ours catches (3.11+)",
}


def attributes(tree: ast.AST) -> set[str]:
    """The names of the methods and attributes ``tree`` calls or reads."""
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}


def theirs(*methods: str) -> set[str]:
    return set().union(*(attributes(ast.parse(textwrap.dedent(inspect.getsource(
        getattr(uvicorn.Server, name))))) for name in methods))


def ours(*methods: str) -> set[str]:
    server = next(node for node in ast.walk(ast.parse(SOURCE.read_text()))
                  if isinstance(node, ast.ClassDef) and node.name == "PromptStopServer")
    return set().union(*(attributes(node) for node in server.body
                         if isinstance(node, ast.AsyncFunctionDef) and node.name in methods))


def test_the_shutdown_takes_every_step_of_uvicorns():
    missing = theirs("shutdown", "_wait_tasks_to_complete") - ours("shutdown", "_drained")
    assert missing - REPLACED.keys() == set(), \
        "uvicorn's shutdown does something PromptStopServer.shutdown does not: read both"


def test_the_main_loop_takes_every_step_of_uvicorns():
    missing = theirs("main_loop") - ours("main_loop")
    assert missing - REPLACED.keys() == set(), \
        "uvicorn's main loop does something PromptStopServer.main_loop does not: read both"
