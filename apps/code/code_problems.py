"""Seeded "write this function" problems, their hidden test cases, and the checker that runs
the model's code on them inside a sandbox.

A seed fully determines its problem: the function's name and signature, a docstring saying
what it returns (``Return `EXPR`.``, sometimes with an edge case: ``When xs is empty, return
`0`.``), and test cases computed by a reference implementation that never leaves the server.
Seeds 0–8999 form the train split, 9000–9999 the test split.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TRAIN_SEEDS = range(0, 9000)
TEST_SEEDS = range(9000, 10000)
SOLUTION_FILE = "solution.py"
CHECKER_FILE = "check.py"


@dataclass(frozen=True)
class Problem:
    seed: int
    split: str
    difficulty: str
    name: str
    params: str
    doc: str
    cases: tuple[tuple[tuple[Any, ...], Any], ...]  # (arguments, expected result) each

    @property
    def prompt(self) -> str:
        return (f"Write this Python function:\n\ndef {self.name}({self.params}):\n"
                f'    """{self.doc}"""\n\n'
                "Answer with the whole function in one ```python block.")


def _ints(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(-20, 40) for _ in range(n)]


def _affine(rng: random.Random) -> tuple[str, str, str, Callable[..., Any], list[tuple]]:
    a, b = rng.randint(2, 9), rng.randint(-15, 15)
    sign = "+" if b >= 0 else "-"
    return ("easy", f"scale_{a}", "x", f"Return `{a} * x {sign} {abs(b)}`.",
            lambda x: a * x + b, [(rng.randint(-50, 50),) for _ in range(5)])


def _count_multiples(rng: random.Random):
    k = rng.randint(2, 5)
    return ("easy", f"count_multiples_of_{k}", "xs",
            f"Return `sum(1 for x in xs if x % {k} == 0)`.",
            lambda xs: sum(1 for x in xs if x % k == 0),
            [(_ints(rng, rng.randint(1, 8)),) for _ in range(5)])


def _spread(rng: random.Random):
    c = rng.randint(0, 9)
    lists = [(_ints(rng, rng.randint(1, 8)),) for _ in range(4)] + [([],)]
    return ("medium", "spread_plus", "xs",
            f"Return `max(xs) - min(xs) + {c}`. When xs is empty, return `{c}`.",
            lambda xs: max(xs) - min(xs) + c if xs else c, lists)


def _mean_floor(rng: random.Random):
    k = rng.randint(1, 4)
    lists = [(_ints(rng, rng.randint(1, 8)),) for _ in range(3)] + [([],), ([],)]
    return ("hard", "scaled_floor_mean", "xs",
            f"Return `{k} * sum(xs) // len(xs)`. When xs is empty, return `0`.",
            lambda xs: k * sum(xs) // len(xs) if xs else 0, lists)


def _shout(rng: random.Random):
    words = ["code", "sandbox", "reward", "policy", "rollout", "", "trace"]
    tag = rng.choice(["!", "?", "-ok", "_v2", "..."])
    return ("medium", "shout_reversed", "s", f"Return `s[::-1].upper() + '{tag}'`.",
            lambda s: s[::-1].upper() + tag, [(rng.choice(words),) for _ in range(5)])


_TEMPLATES = (_affine, _count_multiples, _spread, _mean_floor, _shout)


def split_of(seed: int) -> str:
    if seed in TRAIN_SEEDS:
        return "train"
    if seed in TEST_SEEDS:
        return "test"
    raise LookupError(f"seed {seed} is outside 0-9999 (train 0-8999, test 9000-9999)")


def make_problem(seed: int) -> Problem:
    split = split_of(seed)
    rng = random.Random(f"code-v1:{seed}")
    difficulty, name, params, doc, reference, args = _TEMPLATES[seed % len(_TEMPLATES)](rng)
    cases = tuple((tuple(a), reference(*a)) for a in args)
    return Problem(seed, split, difficulty, name, params, doc, cases)


_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def extract_code(reply: str | None) -> str | None:
    """The last fenced code block of ``reply`` (None when there is none)."""
    blocks = _CODE_BLOCK.findall(reply or "")
    return blocks[-1] if blocks else None


# Runs in the sandbox: imports the model's file, calls the function on each case's arguments
# and prints one line of results, after a token only the server knows, so whatever the
# model's code prints cannot pass for them. Expected values never enter the sandbox.
CHECKER = '''
import json, sys
token = sys.stdin.readline().strip()
cases = json.loads(sys.stdin.readline())
name = sys.argv[1]
results = []
try:
    namespace = {"__name__": "solution"}
    exec(compile(open("solution.py").read(), "solution.py", "exec"), namespace)
    function = namespace[name]
except BaseException as exc:
    function, failure = None, type(exc).__name__
for args in cases:
    if function is None:
        results.append({"error": failure})
        continue
    try:
        results.append({"value": function(*args)})
    except BaseException as exc:
        results.append({"error": type(exc).__name__})
sys.stdout.write("\\n" + token + json.dumps(results, default=repr) + "\\n")
sys.stdout.flush()
'''


def checker_input(token: str, problem: Problem) -> str:
    return token + "\n" + json.dumps([list(args) for args, _ in problem.cases]) + "\n"


def score(stdout: str, token: str, problem: Problem) -> tuple[int, list[bool]]:
    """(cases passed, which passed) from the checker's line in ``stdout`` (none passed when
    the line is missing: the code crashed the interpreter, or ran out of time)."""
    line = next((ln[len(token):] for ln in reversed(stdout.splitlines())
                 if ln.startswith(token)), None)
    try:
        results = json.loads(line) if line is not None else None
    except ValueError:
        results = None
    if not isinstance(results, list) or len(results) != len(problem.cases):
        return 0, [False] * len(problem.cases)
    passed = [isinstance(r, dict) and "value" in r and r["value"] == _json(expected)
              for r, (_, expected) in zip(results, problem.cases, strict=True)]
    return sum(passed), passed


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value))
