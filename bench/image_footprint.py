"""Image footprint: our task app image vs a synth-ai-style image, measured in one run.

    python bench/image_footprint.py [--runs 5]

1. Dependency count: the distributions our image's pip layer installs (its requirements
   and theirs, read from installed metadata) vs synth-ai 0.9.0's declared dependencies,
   which synth-ai bakes into every task app image (its whole SDK). Requirements not
   installed here cannot be expanded and are counted once; the baseline is therefore a
   lower bound.
2. Served-module import time: a fresh interpreter that does what our container does
   (import the container module, build the math app's FastAPI app) vs the same plus the
   top-level imports a synth-ai task app module pays (modal, uvicorn, rich, click, openai,
   numpy, ... whichever are installed here). Median of N runs each, interleaved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from synth_deploy.env import load_env  # noqa: E402
from synth_deploy.handoff import TASK_APP_VAR  # noqa: E402
from synth_deploy.modal import build_plan, dependency_closure  # noqa: E402
from synth_deploy.taskapp.registry import load_app  # noqa: E402

# synth-ai 0.9.0 pyproject.toml [project].dependencies (github.com/synth-laboratories/synth-ai).
SYNTH_AI_DEPENDENCIES = [
    "pydantic>=2.0.0", "requests>=2.32.3", "pynacl>=1.5.0", "tqdm>=4.66.4",
    "typing_extensions>=4.0.0", "rich>=13.9.0", "openai>=1.99.0", "fastapi>=0.115.12",
    "uvicorn>=0.34.2", "numpy>=2.2.3", "sqlalchemy>=2.0.42", "click>=8.1.7,<8.2",
    "aiohttp>=3.8.0", "nest_asyncio>=1.6.0", "httpx>=0.28.1", "datasets>=4.0.0",
    "jsonschema>=4.23.0", "Pillow>=10.0.0", "imageio>=2.34.0",
]
# What a synth-ai task app module imports at top level besides its own logic.
SYNTH_AI_STYLE_IMPORTS = ["modal", "uvicorn", "rich", "click", "requests", "openai", "numpy",
                          "sqlalchemy", "aiohttp", "datasets", "jsonschema", "PIL", "tqdm",
                          "nacl", "typer", "dotenv"]

SERVE = "from synth_deploy.modal import container_app; container_app()"


def _installed(requirement: str) -> bool:
    from importlib import metadata

    name = requirement.split(";")[0]
    for sep in "<>=!~[":
        name = name.split(sep)[0]
    try:
        metadata.version(name.strip())
        return True
    except metadata.PackageNotFoundError:
        return False


def _time_child(code: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs

    key = "sk_env_bench_0000000000000000"
    plan = build_plan(load_app("math"), load_env(environ={"ENVIRONMENT_API_KEY": key}))
    ours = plan.image.dependencies()
    theirs = dependency_closure(SYNTH_AI_DEPENDENCIES)
    missing = [r for r in SYNTH_AI_DEPENDENCIES if not _installed(r)]
    print("dependency count (distributions in the image)")
    print(f"  synth-deploy image : {len(ours):4d}  ({', '.join(plan.image.pip_packages)})")
    print(f"  synth-ai-style     : {len(theirs):4d}+ (19 declared; {len(missing)} not installed "
          f"here so not expanded: {', '.join(m.split('>')[0].split('<')[0] for m in missing)})")
    print(f"  ratio              : {len(theirs) / len(ours):.1f}x fewer in ours (lower bound)")

    env = {**os.environ, "ENVIRONMENT_API_KEY": key,
           TASK_APP_VAR: str(ROOT / "apps" / "math" / "task_app.py"),
           "PYTHONPATH": str(ROOT)}
    heavy = [m for m in SYNTH_AI_STYLE_IMPORTS if find_spec(m) is not None]
    baseline_code = "".join(f"import {m}; " for m in heavy) + SERVE
    _time_child(SERVE, env)  # warm the OS file cache for both
    _time_child(baseline_code, env)
    a, b = [], []
    for _ in range(runs):
        a.append(_time_child(SERVE, env))
        b.append(_time_child(baseline_code, env))
    ours_s, theirs_s = statistics.median(a), statistics.median(b)
    print(f"served-module start (fresh interpreter, median of {runs})")
    print(f"  synth-deploy       : {ours_s * 1000:7.0f} ms")
    print(f"  synth-ai-style     : {theirs_s * 1000:7.0f} ms  (+ import {', '.join(heavy)})")
    print(f"  ratio              : {theirs_s / ours_s:.2f}x slower for synth-ai-style")


if __name__ == "__main__":
    main()
