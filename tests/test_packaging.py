"""What `pip install` gives a user (issue 14): modal as a dependency, the bundled example apps
inside the package, and a non-editable install that serves and deploys `math` as is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from processes import clean_env

from synth_deploy.modal import MODAL_REQUIREMENT, SERVING_PACKAGES

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Local state that never ships (pyproject's exclude-package-data).
LOCAL_STATE = ("__pycache__", ".pyc", ".env", ".db", "traces")


def test_modal_is_a_dependency_and_never_in_the_image():
    assert MODAL_REQUIREMENT in PYPROJECT["project"]["dependencies"]
    assert "modal" not in PYPROJECT["project"].get("optional-dependencies", {})
    assert "modal" not in SERVING_PACKAGES


def shipped_folders(top: Path, package: str) -> set[str]:
    """``top`` and every folder under it that ships, as the packages setuptools sees."""
    return {".".join((package, *d.relative_to(top).parts))
            for d in [top, *top.rglob("*")] if d.is_dir()
            and not any(part in ("__pycache__", "traces") for part in d.relative_to(top).parts)}


def test_pyproject_lists_every_package_in_the_tree():
    # Every folder that ships, data folders too: setuptools warns about any left out.
    tree = shipped_folders(ROOT / "synth_deploy", "synth_deploy") | \
        shipped_folders(ROOT / "apps", "synth_deploy._apps")
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert listed == tree, (
        "pyproject.toml [tool.setuptools].packages must list exactly the folders under "
        f"synth_deploy/ and apps/: missing {sorted(tree - listed)}, "
        f"not in the tree {sorted(listed - tree)}")
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"synth_deploy._apps": "apps"}


def test_a_missing_modal_says_install_modal_not_the_kit_from_pypi(tmp_path):
    # The import system's own way to make `import modal` fail in this child process.
    code = ("import sys; sys.modules['modal'] = None; sys.modules['modal.config'] = None\n"
            "from synth_deploy.env import Env\n"
            "from synth_deploy.modal import has_modal_token\n"
            "try:\n    has_modal_token(Env())\n"
            "except Exception as exc:\n    print(exc.message); print(exc.hint)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=clean_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "modal package cannot be imported" in result.stdout
    assert f"pip install '{MODAL_REQUIREMENT}'" in result.stdout
    assert "synth-deploy[" not in result.stdout


def _copy_project(dest: Path) -> None:
    """The files a build reads, copied so that the build leaves nothing in the checkout."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".env", "*.db", "traces")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    for name in ("synth_deploy", "apps"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)


def _shipped(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and not any(part.endswith(LOCAL_STATE) for part in p.parts)}


@pytest.mark.slow
def test_a_wheel_install_serves_and_plans_the_bundled_math_app(tmp_path):
    """`pip install .` (not editable) into a new virtualenv: `apps`, `smoke math` and `deploy
    math --dry-run` work from any folder. Offline: the wheel is built with the build backend
    already installed (dev extras), and the new venv borrows this one's dependencies."""
    source = tmp_path / "src"
    source.mkdir()
    _copy_project(source)
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-w", str(dist), str(source)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [wheel] = dist.glob("synth_deploy-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run([*pip, "--python", str(python), "install", "--no-deps",
                                "--no-index", str(wheel)], capture_output=True, text=True,
                               timeout=300)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True, timeout=60).stdout.strip())
    # The dependencies (fastapi, modal...) come from this environment, listed after the new
    # venv's own site-packages; its .pth files (our editable install) are not processed.
    borrowed = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_borrowed_dependencies.pth").write_text("\n".join(sorted(borrowed)) + "\n")

    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env = {k: v for k, v in clean_env().items() if k != "PYTHONPATH"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / "synth-deploy"), *args], cwd=workdir,
                              env=env, capture_output=True, text=True, timeout=timeout)

    where = subprocess.run([str(python), "-c", "import importlib.metadata, json, synth_deploy; "
                            "print(json.dumps([synth_deploy.__file__, "
                            "importlib.metadata.requires('synth-deploy')]))"],
                           cwd=workdir, env=env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    package_file, requires = json.loads(where.stdout)
    assert Path(package_file).is_relative_to(site)
    # modal is a plain requirement of the installed kit, under no extra.
    wanted = Requirement(MODAL_REQUIREMENT)
    assert any(r.name == "modal" and r.marker is None and r.specifier == wanted.specifier
               for r in map(Requirement, requires)), requires
    # Everything in the package folders and the bundled apps is in the install.
    package = site / "synth_deploy"
    assert _shipped(ROOT / "synth_deploy") <= _shipped(package)
    assert _shipped(ROOT / "apps") == _shipped(package / "_apps")

    listing = run("apps", "--json")
    assert listing.returncode == 0, listing.stderr
    math = next(a for a in json.loads(listing.stdout)["apps"] if a["app_id"] == "math")
    assert Path(math["path"]) == package / "_apps" / "math" / "task_app.py"

    smoke = run("smoke", "math", "--seeds", "0-2", "--json")
    assert smoke.returncode == 0, smoke.stderr
    assert json.loads(smoke.stdout)["summary"]["ok"] == 3
    assert (workdir / "traces" / "v3" / "synth_ai.db").is_file()

    assert run("setup").returncode == 0  # the README's first step: a key in ./.env
    plan = run("deploy", "math", "--dry-run", "--json")
    assert plan.returncode == 0, plan.stderr
    doc = json.loads(plan.stdout)["plan"]
    assert Path(doc["source"]) == package / "_apps" / "math" / "task_app.py"
    steps = "\n".join(doc["image"]["steps"])
    assert "without cli, tunnel, runs, train, health, _apps" in steps
    assert "modal" not in {p.split("==")[0] for p in doc["image"]["pip_packages"]}
