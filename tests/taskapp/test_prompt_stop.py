"""`PromptStopServer` rewrites two of uvicorn's methods to stop sooner: it must still take
every step uvicorn's own take, whatever uvicorn release is installed."""

from __future__ import annotations

import ast
import inspect
import textwrap

import uvicorn

from synth_deploy.taskapp._prompt_stop import PromptStopServer

# uvicorn's steps that ours take otherwise, and why.
REPLACED = {
    "_wait_tasks_to_complete": "PromptStopServer._drained: the same waits, at 10 ms",
    "sleep": "uvicorn's fixed 0.1-s pauses, which are what the class removes",
    "info": "uvicorn's 'Shutting down' and 'Waiting for ...' log lines",
    "TimeoutError": "asyncio.TimeoutError is the builtin TimeoutError ours catches (3.11+)",
}


def steps(*functions) -> set[str]:
    """The names of the methods and attributes the functions call or read."""
    names = set()
    for function in functions:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
        names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    return names


def test_the_shutdown_takes_every_step_of_uvicorns():
    theirs = steps(uvicorn.Server.shutdown, uvicorn.Server._wait_tasks_to_complete)
    ours = steps(PromptStopServer.shutdown, PromptStopServer._drained)
    assert theirs - ours - REPLACED.keys() == set(), \
        "uvicorn's shutdown does something PromptStopServer.shutdown does not: read both"


def test_the_main_loop_takes_every_step_of_uvicorns():
    theirs = steps(uvicorn.Server.main_loop)
    ours = steps(PromptStopServer.main_loop)
    assert theirs - ours - REPLACED.keys() == set(), \
        "uvicorn's main loop does something PromptStopServer.main_loop does not: read both"
