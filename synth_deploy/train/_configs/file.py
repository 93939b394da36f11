"""`TrainConfig`: one training TOML, read and checked (syntax, schema, deprecated
spellings, paths, RL or SFT), and the walk that discovers config files.

Every problem is reported before any network call, as ``file: section.key: problem`` with a
did-you-mean for misspelt keys, so one run shows everything to fix.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ValidationError

from synth_deploy.errors import UsageError
from synth_deploy.train._configs.compat import compat_warnings
from synth_deploy.train._configs.ranges import range_warnings
from synth_deploy.train._configs.rl import RLConfig
from synth_deploy.train._configs.sft import SFTConfig

JobKind = Literal["rl", "sft"]
KINDS = ("auto", "rl", "sft")
SKIP_DIRS = frozenset({".git", ".venv", "venv", "node_modules", "__pycache__", ".mirror",
                       ".tox", ".mypy_cache", ".pytest_cache", ".ruff_cache", "site-packages",
                       # A test suite's fixture configs are not configs anyone trains with.
                       "tests", "test"})
DISCOVERY_MAX_DEPTH = 4
DISCOVERY_MAX_DIRS = 2000
_MOST_NESTED = 16  # levels of tables and arrays; synth-ai's configs use three or four

# Old spelling -> (new spelling, note). Renamed ones are moved before validation.
_RENAMED_SECTIONS = {"judge": "verifier"}
_DEPRECATED_SECTIONS = {
    "lora": "use [training.lora]",
    "topology": "use [compute.topology]",
    "reference": "use [compute.topology] reference_placement",
    "rubric": "use [verifier] enabled / reward_blend",
}
_BOUNDS = {"greater_than": "greater than", "greater_than_equal": "at least",
           "less_than": "less than", "less_than_equal": "at most"}
_TYPE_WORDS = {
    "int": "an integer", "float": "a number", "bool": "true or false", "string": "a string",
    "str": "a string", "dict": "a table", "model": "a table", "list": "an array",
}


@dataclass
class TrainConfig:
    """A validated config file: its kind, the parsed schema and the TOML as a dict."""

    path: Path
    kind: JobKind
    model: RLConfig | SFTConfig
    raw: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def resolve_path(self, value: str | os.PathLike[str] | None) -> Path | None:
        """A path from the config, relative to the config's folder (``~`` expanded)."""
        if value in (None, ""):
            return None
        p = Path(os.path.expanduser(os.fspath(value)))
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    @property
    def dataset_path(self) -> Path | None:
        return self.resolve_path(self.model.job.dataset) if self.kind == "sft" else None

    @property
    def validation_path(self) -> Path | None:
        data = getattr(self.model, "data", None) if self.kind == "sft" else None
        return self.resolve_path(data.validation_path) if data is not None else None

    @property
    def task_url(self) -> str | None:
        if self.kind != "rl" or self.model.services is None:
            return None
        return self.model.services.task_url

    def backend_dict(self) -> dict[str, Any]:
        """The TOML as the backend receives it: ``[smoke]`` removed (it is CLI-only)."""
        data = copy.deepcopy(self.raw)
        data.pop("smoke", None)
        return data


def infer_kind(raw: dict[str, Any]) -> JobKind | None:
    """RL or SFT from a top-level ``type``, ``[algorithm]``, else from the sections present;
    None if unclear."""
    if raw.get("type") in ("rl", "sft"):  # synth-ai's shipped examples say so at the top
        return raw["type"]
    by_algorithm = _algorithm_kind(raw.get("algorithm"))
    if by_algorithm is not None:
        return by_algorithm
    if isinstance(raw.get("job"), dict) or isinstance(raw.get("hyperparameters"), dict):
        return "sft"
    if any(isinstance(raw.get(k), dict) for k in ("services", "rollout")):
        return "rl"
    return None


def _algorithm_kind(algorithm: Any) -> JobKind | None:
    """What ``[algorithm]`` says: online or policy-gradient is RL, offline or SFT is SFT."""
    if not isinstance(algorithm, dict):
        return None
    if algorithm.get("type") == "online" or algorithm.get("method") == "policy_gradient":
        return "rl"
    if algorithm.get("type") == "offline" or algorithm.get("method") in (
            "sft", "supervised_finetune"):
        return "sft"
    return None


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a TOML file; a syntax error becomes ``file:line: message``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"config not found: {p}", hint="check the --config path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read config {p}: {exc}") from exc
    try:
        raw = tomllib.loads(text)
    except RecursionError:
        raise UsageError(f"{p}: arrays or tables nested too deeply to read",
                         hint=f"a training config nests at most {_MOST_NESTED} levels") from None
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        where = f"{p}:{m.group(1)}" if m else str(p)
        reason = re.sub(r"\s*\(at line \d+, column \d+\)", "", msg) or "invalid TOML"
        col = f" (column {m.group(2)})" if m else ""
        raise UsageError(f"{where}: TOML syntax error: {reason}{col}",
                         hint="fix the line shown; strings need quotes, tables [name]") from None
    if problems := _implausible(raw):
        raise UsageError(f"{p}: {len(problems)} problem(s):\n"
                         + "\n".join(f"  {p.name}: {line}" for line in problems),
                         hint="a trainer takes finite numbers; configs nest a few levels")
    return raw


def _implausible(raw: dict[str, Any]) -> list[str]:
    """What no training config holds, anywhere (in free-form tables too, which are sent on
    as they are and printed as JSON): inf or nan, and nesting deeper than `_MOST_NESTED`."""
    problems: list[str] = []
    pending: list[tuple[tuple[str, ...], Any]] = [((), raw)]
    while pending:  # not recursive: the depth is what is being checked
        path, value = pending.pop()
        where = ".".join(path) or "(top level)"
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{where}: expected a finite number, got {value}")
        elif isinstance(value, (dict, list)):
            if len(path) >= _MOST_NESTED:
                problems.append(f"{where}: nested more than {_MOST_NESTED} levels deep")
                continue
            items = value.items() if isinstance(value, dict) else enumerate(value)
            pending += [((*path, str(key)), item) for key, item in items]
    return sorted(problems)


def load_config(path: str | os.PathLike[str], kind: str = "auto") -> TrainConfig:
    """Read, check and classify one config file. Raises UsageError listing every problem."""
    if kind not in KINDS:
        raise UsageError(f"--type must be one of {', '.join(KINDS)}, got {kind!r}")
    p = Path(path).expanduser().resolve()
    raw = read_toml(p)
    kind = _kind_of(raw, kind, p)
    raw, warnings = _upgrade(raw, p)
    warnings += [f"{p.name}: {note}" for note in compat_warnings(raw, kind)]
    schema = RLConfig if kind == "rl" else SFTConfig
    try:
        model = schema.model_validate(raw)
    except ValidationError as exc:
        problems = format_validation_error(exc, schema)
        raise UsageError(
            f"{p}: {len(problems)} problem(s) in the {kind.upper()} config:\n"
            + "\n".join(f"  {p.name}: {line}" for line in problems),
            hint="fix the keys listed; see the example configs in apps/math/configs/",
        ) from None
    warnings += [f"{p.name}: {note}" for note in range_warnings(model)]
    return TrainConfig(path=p, kind=kind, model=model, raw=raw, warnings=warnings)


def _kind_of(raw: dict[str, Any], kind: str, p: Path) -> str:
    """The config's kind: ``kind`` as given, checked against what the file says it is, or
    (``auto``) what it says."""
    inferred = infer_kind(raw)
    if kind == "auto":
        if inferred is None:
            raise UsageError(
                f"{p}: cannot tell whether this is an RL or an SFT config",
                hint='add [algorithm] type = "online" (RL) or "offline" (SFT), or pass --type',
            )
        return inferred
    if inferred is not None and inferred != kind:
        raise UsageError(f"{p}: --type {kind} given, but the config is an {inferred} config",
                         hint=f"drop --type or pass --type {inferred}")
    return kind


def _upgrade(raw: dict[str, Any], path: Path) -> tuple[dict[str, Any], list[str]]:
    """Move renamed spellings to their new place; warn about the deprecated ones."""
    data = copy.deepcopy(raw)
    warnings: list[str] = []
    for old, new in _RENAMED_SECTIONS.items():
        if old in data:
            if new in data:
                raise UsageError(f"{path}: both [{old}] and [{new}] are set",
                                 hint=f"[{old}] was renamed [{new}]: keep only [{new}]")
            data[new] = data.pop(old)
            warnings.append(f"{path.name}: [{old}] is deprecated, read as [{new}]")
    services = data.get("services")
    if isinstance(services, dict) and "judge_url" in services:
        if "verifier_url" not in services:
            services["verifier_url"] = services.pop("judge_url")
        else:
            services.pop("judge_url")
        warnings.append(f"{path.name}: services.judge_url is deprecated, read as verifier_url")
    for old, advice in _DEPRECATED_SECTIONS.items():
        if old in data:
            warnings.append(f"{path.name}: [{old}] is deprecated ({advice})")
    return data, warnings


def format_validation_error(exc: ValidationError, schema: type[BaseModel]) -> list[str]:
    """One ``section.key: problem`` line per pydantic error, with a did-you-mean for typos."""
    lines = []
    for err in exc.errors():
        loc = [str(x) for x in err["loc"] if not str(x).startswith(("function-after", "literal"))]
        lines.append(_problem(err, loc, schema))
    return lines


def _problem(err: Any, loc: list[str], schema: type[BaseModel]) -> str:
    """One pydantic error in the config's own words: its key path, then what is wrong."""
    where = ".".join(loc) or "(top level)"
    etype, value = err["type"], err.get("input")
    if etype == "extra_forbidden":
        return f"{where}: unknown key{_did_you_mean(schema, loc)}"
    if etype == "missing":
        return f"{where}: required"
    if etype == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return f"{where}: expected one of {expected}, got {value!r}"
    if etype in _BOUNDS:
        return f"{where}: must be {_BOUNDS[etype]} {_limit(err)}, got {value!r}"
    word = _type_word(etype)
    if word is not None:
        return f"{where}: expected {word}, got {_show(value)}"
    if etype == "value_error":
        reason = str(err.get("ctx", {}).get("error", err["msg"]))
        return f"{where}: {reason}" if loc else reason
    return f"{where}: {err['msg']}"


def _did_you_mean(schema: type[BaseModel], loc: list[str]) -> str:
    """`` (did you mean a.b?)`` for an unknown key close to a field of its section, else ''."""
    close = difflib.get_close_matches(loc[-1], _fields_at(schema, loc[:-1]), n=1, cutoff=0.6)
    return f" (did you mean {'.'.join([*loc[:-1], close[0]])}?)" if close else ""


def _limit(err: Any) -> Any:
    """The bound a number broke; a float in its short form (``:g``)."""
    limit = next(iter(err.get("ctx", {}).values()), "?")
    return f"{limit:g}" if isinstance(limit, float) else limit


def _type_word(etype: str) -> str | None:
    """The kind of value a ``*_type``/``*_parsing`` error wanted, in words; None for others."""
    word = _TYPE_WORDS.get(etype.split("_")[0])
    return word if word is not None and etype.endswith(("_type", "_parsing")) else None


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return repr(value)


def _fields_at(schema: type[BaseModel], loc: list[str]) -> list[str]:
    """Field names of the section at ``loc`` (for did-you-mean), [] when not a model."""
    current: Any = schema
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        info = current.model_fields.get(part)
        if info is None:
            return []
        current = _model_in(info.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation) if get_origin(annotation) is not None else ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def looks_like_config(path: Path) -> JobKind | None:
    """The kind of a TOML file that reads as a training config, else None."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    return infer_kind(raw)


def discover_configs(root: str | os.PathLike[str] = ".", *, limit: int = 200,
                     max_depth: int = DISCOVERY_MAX_DEPTH,
                     max_dirs: int = DISCOVERY_MAX_DIRS) -> list[Path]:
    """RL/SFT configs under ``root``, sorted by walk order.

    The walk is bounded so that running from a home directory stays quick: at most
    ``max_depth`` folder levels below ``root`` and ``max_dirs`` folders in all, skipping
    hidden folders, virtualenvs, caches, node_modules and test suites (``tests/``,
    ``test/``).
    """
    found: list[Path] = []
    base_depth = len(Path(root).parts)
    for visited, (dirpath, dirnames, filenames) in enumerate(os.walk(root), 1):
        depth = len(Path(dirpath).parts) - base_depth
        dirnames[:] = _folders_to_walk(dirnames) if depth < max_depth else []
        for path in _configs_in(dirpath, filenames):
            found.append(path)
            if len(found) >= limit:
                return found
        if visited >= max_dirs:
            break
    return found


def _folders_to_walk(dirnames: list[str]) -> list[str]:
    """Subfolders worth a look, in order: no hidden ones, virtualenvs, caches or tests."""
    return sorted(d for d in dirnames if d not in SKIP_DIRS
                  and not d.startswith(".") and not d.endswith(".egg-info"))


def _configs_in(dirpath: str, filenames: list[str]) -> Iterator[Path]:
    """The training configs among one folder's files, read only as they are asked for."""
    for name in sorted(filenames):
        if name.endswith(".toml") and name != "pyproject.toml":
            path = Path(dirpath) / name
            if looks_like_config(path):
                yield path


__all__ = [
    "KINDS",
    "JobKind",
    "TrainConfig",
    "discover_configs",
    "format_validation_error",
    "infer_kind",
    "load_config",
    "looks_like_config",
    "read_toml",
]
