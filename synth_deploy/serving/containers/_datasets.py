"""The app's datasets as the contract reads them: each split's seeds and true count, a page
of a split, and the split a seed belongs to.

A split's seeds are its dataset's ``split_seeds[split]`` (or, for a one-split dataset, its
``seeds``); a split no dataset declares seeds for has no count (``None``, never a guess) and
no pages, though rows of given seeds are still served.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from synth_deploy.errors import BadRequest
from synth_deploy.taskapp.config import TaskAppConfig

DEFAULT_PAGE = 100


class Splits:
    """The splits of ``config``'s datasets, each with its seeds per dataset."""

    def __init__(self, config: TaskAppConfig) -> None:
        self.seeds: dict[str, list[Sequence[int] | None]] = {}
        for ds in config.dataset_registry:
            for split in ds.splits:
                seeds = ds.split_seeds.get(split)
                if seeds is None and len(ds.splits) == 1:
                    seeds = ds.seeds
                self.seeds.setdefault(split, []).append(seeds)

    def __contains__(self, split: object) -> bool:
        return split in self.seeds

    def first(self) -> str | None:
        return next(iter(self.seeds), None)

    def count(self, split: str) -> int | None:
        parts = self.seeds.get(split) or [None]
        return None if None in parts else sum(len(s) for s in parts)  # type: ignore[arg-type]

    def counts(self) -> list[dict[str, Any]]:
        return [{"name": name, "count": self.count(name)} for name in self.seeds]

    def check(self, split: Any) -> None:
        """`BadRequest` (404, naming ``split``) for a split no dataset has."""
        if split is not None and split not in self.seeds:
            raise BadRequest(f"split {str(split)[:40]!r} is not one of this app's: "
                             f"{', '.join(self.seeds) or 'none'}", status=404,
                             code="unknown_split", field="split")

    def page(self, split: str | None, offset: int, limit: int) -> tuple[list[int], int]:
        """Seeds ``offset`` to ``offset + limit`` of ``split``, and its total."""
        total = None if split is None else self.count(split)
        if total is None:
            raise BadRequest(f"this app declares no seeds for split {split!r}: give seeds, "
                             "or declare the split's seeds (TaskDataset.split_seeds)",
                             field="split")
        found: list[int] = []
        skip = offset
        for seeds in self.seeds[split]:  # type: ignore[index]
            assert seeds is not None  # counted above
            if len(found) >= limit:
                break
            if skip >= len(seeds):
                skip -= len(seeds)
                continue
            found += list(seeds[skip:skip + limit - len(found)])
            skip = 0
        return found, total

    def split_of(self, seed: int, instance: dict[str, Any]) -> str | None:
        """The split holding ``seed``, else the one its task instance names."""
        for name, parts in self.seeds.items():
            if any(s is not None and seed in s for s in parts):
                return name
        said = (instance.get("task_metadata") or {}).get("split") or \
            (instance.get("dataset") or {}).get("default_split")
        return said if isinstance(said, str) else None


def seed_list(seeds: Any) -> list[int]:
    """``seeds`` (or ``task_ids``: whole numbers or ``"seed:N"``) as ints; `BadRequest`
    naming ``seeds`` otherwise."""
    def one(seed: Any) -> int | None:
        if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
            return seed
        if isinstance(seed, str):
            text = seed[5:] if seed.startswith("seed:") else seed
            return int(text) if text.isdigit() else None
        return None

    found = [one(s) for s in seeds] if isinstance(seeds, list) else [None]
    if any(s is None for s in found):
        raise BadRequest("seeds (or task_ids) must be a list of whole numbers (or "
                         "\"seed:N\")", field="seeds")
    return found  # type: ignore[return-value]


def whole_number(body: dict[str, Any], name: str, default: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"{name} must be a whole number", field=name)
    return value


__all__ = ["DEFAULT_PAGE", "Splits", "seed_list", "whole_number"]
