"""Functions of cyclomatic complexity C or worse (radon's rank: above 10) per thousand lines of
the package, nested functions counted: radon's own `cc` command scores a closure as part of
the function around it, so a handler defined inside `create_app` would go unscored. Here
every block radon finds is walked with its closures, each scored on its own.

    pip install radon && python bench/complexity.py [--list N]

Not a timing: a count, the same on every run (the house issue's target: at most 2.5 per kLOC;
uvicorn has 2.81, Starlette 3.11, httpx 0.91 by the same count)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1] / "synth_deploy"
WORST_FINE = 10  # radon's rank B ends here


def blocks(found: Iterable[Any]) -> Iterator[Any]:
    """Every function and method in ``found``, and every closure inside them."""
    for block in found:
        if type(block).__name__ != "Class":  # its methods are listed on their own
            yield block
        yield from blocks(getattr(block, "closures", None) or ())


def main() -> None:
    try:
        from radon.complexity import cc_visit
        from radon.raw import analyze
    except ImportError:
        raise SystemExit("needs radon: pip install radon") from None
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", type=int, default=10, help="show the N worst (default 10)")
    parser.add_argument("root", nargs="?", type=Path, default=PACKAGE)
    args = parser.parse_args()
    worst: list[tuple[int, str]] = []
    lines = 0
    for path in sorted(args.root.rglob("*.py")):
        code = path.read_text()
        lines += analyze(code).loc
        worst += [(b.complexity, f"{path.relative_to(args.root.parent)}:{b.lineno} {b.name}")
                  for b in blocks(cc_visit(code)) if b.complexity > WORST_FINE]
    worst.sort(reverse=True)
    print(f"{len(worst)} functions of complexity > {WORST_FINE} in {lines:,} lines: "
          f"{len(worst) / (lines / 1000):.2f} per kLOC (target <= 2.5)")
    for complexity, where in worst[:args.list]:
        print(f"  {complexity:3d}  {where}")


if __name__ == "__main__":
    main()
