"""Fidelity with synth-ai 0.4.4, judged by synth-ai's own code. Needs a synth-ai venv; never
run in CI (synth-ai resolves only with versions as of its release):

    python -m venv /tmp/sai && /tmp/sai/bin/pip install uv
    /tmp/sai/bin/uv pip install --python /tmp/sai/bin/python \\
        --exclude-newer 2025-12-31T12:00:00Z synth-ai==0.4.4
    python bench/synth_ai_fidelity.py /tmp/sai/bin/python [--only configs]

Prints one line per check, ok or FAIL with what differs, and exits 1 on any FAIL:

  rollout   our math app, asked by a trainer (``?cid=``, trace requested), passes
            `validate_rollout_response_for_rl` and `verify_trace_correlation_id_in_response`,
            and synth-ai's eval runner counts its tokens
  configs   our apps' TOMLs (and what `init` writes) pass `validate_rl_config` /
            `validate_sft_config`
  payloads  on every TOML of ours (apps, `init`, test fixtures) and every TOML synth-ai
            ships (its package's files, its config models' docstring examples):
            `rl_payload` / `sft_payload` equal `build_rl_payload` / `build_sft_payload`
            (``tags.source`` aside: README, deliberate differences), or both refuse; one
            synth-ai builds and we refuse is a FAIL, one only we build is a note
  ranges    the same, on the math app's configs with each number of our schemas set to
            0, -1 and 2**31 (1.5 for a float): we load what synth-ai builds
  traces    a file synth-ai's SessionTracer wrote: `traces where/ls/stats/show/export` leave it
            byte for byte; after `traces init`, what synth-ai writes is listed and exported;
            and what the kit writes (each message once) synth-ai's trace manager, its
            `load_session_trace` and `synth-ai filter`'s reading of the messages read whole
  sft       our SFT export and upload copy (OpenAI tools included) pass synth-ai's validator
  long      synth-ai's own TaskAppClient gets a long rollout's answer through the stand-ins of
            Cloudflare's edge and Modal's front end (tests/standins/cutoff_proxies.py, limits
            scaled: 2 s of silence, a 303 after 3 s, an 8-s rollout); and, said as found, what
            it makes of an app without the early head and of a failure after the head

The synth-ai half runs in that venv (bench/_synth_ai_side.py) and reports JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from synth_deploy.runs import create_mock_policy_app
from synth_deploy.serving import BackgroundServer, RolloutLimits, create_app
from synth_deploy.taskapp import TaskDescriptor, TaskInfo
from synth_deploy.taskapp.config import TaskAppConfig
from synth_deploy.taskapp.registry import load_app
from synth_deploy.tracing import SessionTracer, export_sft, open_trace_store
from synth_deploy.train import load_config, rl_payload, sft_payload, upload_copy

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk_env_fidelity_bench"
failures: list[str] = []


def report(name: str, ok: bool, detail: Any = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' if detail else ''}{detail}")
    if not ok:
        failures.append(name)


def synth_ai(python: str, *ops: dict[str, Any]) -> list[Any]:
    proc = subprocess.run([python, str(ROOT / "bench" / "_synth_ai_side.py")],
                          input=json.dumps(list(ops)), capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"the synth-ai side failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def differences(ours: Any, theirs: Any, path: str = "") -> list[str]:
    if not (isinstance(ours, dict) and isinstance(theirs, dict)):
        return [] if ours == theirs else [f"{path}: ours {ours!r}, theirs {theirs!r}"]
    found = []
    for key in sorted(set(ours) | set(theirs)):
        if key in ours and key in theirs:
            found += differences(ours[key], theirs[key], f"{path}.{key}")
        else:
            found.append(f"{path}.{key} only in {'ours' if key in ours else 'theirs'}")
    return found


def check_rollout(python: str) -> None:
    with BackgroundServer(create_mock_policy_app()) as policy, \
            BackgroundServer(create_app(load_app("math").build_config(), api_keys=[KEY])) as app:
        url = f"{policy.url}/v1/chat/completions?cid=trace_fidelity_1"
        (result,) = synth_ai(python, {"op": "rollout", "args": {
            "url": app.url, "api_key": KEY, "inference_url": url, "seed": 3}})
    if "error" in result:
        report("rollout", False, result["error"])
        return
    report("rollout: HTTP 200", result["status"] == 200, result["status"])
    report("rollout: validate_rollout_response_for_rl", not result["rl_issues"],
           "; ".join(result["rl_issues"]))
    report("rollout: trace_correlation_id everywhere synth-ai looks", result["correlated"])
    report("rollout: eval runner counts tokens", bool(result["tokens"]), result["tokens"])


def _sleeping_app(seconds: float, limits: RolloutLimits, fail: bool = False) -> Any:
    async def rollout(request: Any, ctx: Any) -> dict[str, Any]:
        await asyncio.sleep(seconds)
        if fail:
            raise RuntimeError("the environment crashed after a long while")
        return {"run_id": request.run_id, "metrics": {"episode_rewards": [1.0]}}

    info = TaskInfo(task=TaskDescriptor(id="sleepy", name="Sleepy"))
    config = TaskAppConfig(app_id="sleepy", name="Sleepy", description="sleeps",
                           base_task_info=info, provide_task_instances=lambda seeds: [info],
                           rollout=rollout)
    return create_app(config, api_keys=[KEY], limits=limits)


def check_long_rollouts(python: str) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from standins.cutoff_proxies import EdgeProxy, ModalFrontEnd

    early = RolloutLimits(head_after_s=0.5, heartbeat_s=0.5)
    late = RolloutLimits(head_after_s=600, heartbeat_s=600)
    with BackgroundServer(_sleeping_app(8.0, early)) as ours, \
            BackgroundServer(_sleeping_app(5.0, late)) as silent, \
            BackgroundServer(_sleeping_app(1.0, RolloutLimits(head_after_s=0.3), True)) as bad, \
            EdgeProxy(ours.url, silence_s=2) as edge, \
            ModalFrontEnd(ours.url, redirect_after_s=3) as modal, \
            EdgeProxy(silent.url, silence_s=2) as silent_edge, \
            ModalFrontEnd(silent.url, redirect_after_s=3) as silent_modal:
        calls = [("edge", edge.url), ("modal", modal.url), ("silent-edge", silent_edge.url),
                 ("silent-modal", silent_modal.url), ("late-failure", bad.url)]
        (results,) = synth_ai(python, {"op": "client_rollouts", "args": {"calls": [
            {"run_id": name, "url": url, "api_key": KEY} for name, url in calls]}})
    if isinstance(results, dict):
        report("long: TaskAppClient", False, results.get("error"))
        return
    by_name = dict(zip([name for name, _ in calls], results, strict=True))
    for name, where in (("edge", "Cloudflare's edge"), ("modal", "Modal's front end")):
        got = by_name[name]
        report(f"long: an 8-s rollout through {where}, TaskAppClient gets its answer",
               got.get("reward") == 1.0 and got.get("run_id") == name, got)
    # As found, not judged: what synth-ai's client does where the kit's early head is absent.
    for name in ("silent-edge", "silent-modal", "late-failure"):
        print(f"info {name}: {by_name[name]}")


def check_configs_and_payloads(python: str, folder: Path) -> None:
    ours = _our_tomls(folder / "ours")
    examples = synth_ai(python, {"op": "example_tomls", "args": {
        "folder": str(folder / "synth-ai")}})[0]
    apps = [p for p in ours if "tests" not in p.parts]
    for path, verdict in zip(apps, synth_ai(python, *(
            {"op": "validate_config", "args": {"path": str(p), "kind": _kind(p)}}
            for p in apps)), strict=True):
        report(f"configs: synth-ai validates {_shown(path)}", "error" not in verdict,
               verdict.get("error", ""))
    _compare_builders("payloads", [*ours, *map(Path, examples)], python)
    _compare_builders("ranges", _range_probes(python, folder / "probes"), python)


def _our_tomls(folder: Path) -> list[Path]:
    """Every training TOML of ours: the apps' configs, what `init` writes, the test
    fixtures."""
    from synth_deploy.taskapp.scaffold import scaffold_app

    folder.mkdir(parents=True, exist_ok=True)
    scaffold_app("fidelity", folder)
    return [*sorted((ROOT / "apps").glob("*/configs/*.toml")), folder / "fidelity" / "rl.toml",
            *sorted((ROOT / "tests" / "train" / "configs").rglob("*.toml"))]


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _kind(path: Path) -> str:
    """RL or SFT, as our loader tells them (for a config it refuses: from its sections)."""
    try:
        return load_config(path).kind
    except Exception:  # noqa: BLE001 - refused configs are compared below
        import tomllib

        raw = tomllib.loads(path.read_text())
        algorithm = raw.get("algorithm") if isinstance(raw.get("algorithm"), dict) else {}
        offline = raw.get("type") == "sft" or algorithm.get("type") == "offline"
        return "sft" if offline or "job" in raw else "rl"


def _ours(path: Path, kind: str) -> dict[str, Any]:
    try:
        config = load_config(path, kind)
        payload = rl_payload(config, "https://app.example") if kind == "rl" else \
            sft_payload(config)
    except Exception as exc:  # noqa: BLE001 - a refusal is a verdict to compare
        said = [x.strip() for x in str(exc).splitlines() if not x.strip().startswith("hint:")]
        return {"error": (said[1] if len(said) > 1 else said[0])[:160]}  # the first problem
    return {"payload": payload, "warnings": config.warnings}


def _compare_builders(what: str, paths: list[Path], python: str) -> None:
    """synth-ai's builder and ours on each TOML: both build the same payload (tags.source
    aside) or both refuse. A TOML synth-ai builds and we refuse is a FAIL; one we build and
    synth-ai refuses is said (our loader is lenient on purpose where synth-ai refuses a
    missing section; the line shows whether we warned)."""
    kinds = [_kind(p) for p in paths]
    theirs = synth_ai(python, *(
        {"op": "rl_payload", "args": {"path": str(p), "task_url": "https://app.example"}}
        if kind == "rl" else {"op": "sft_payload", "args": {"path": str(p)}}
        for p, kind in zip(paths, kinds, strict=True)))
    agreed = lenient = 0
    for path, kind, their in zip(paths, kinds, theirs, strict=True):
        mine, name = _ours(path, kind), f"{what}: {_shown(path)} ({kind})"
        if "error" in their and "error" in mine:
            agreed += 1
            continue
        if "error" in mine:
            report(name, False, f"synth-ai builds it, we refuse: {mine['error']}")
        elif "error" in their:
            lenient += 1
            warned = f"{len(mine['warnings'])} warning(s)" if mine["warnings"] else "no warning"
            said = " ".join(their["error"].split())[:240]
            print(f"note {name}: we build it ({warned}), synth-ai refuses: {said}")
        else:
            diff = [d for d in differences(mine["payload"], their)
                    if not d.startswith(".tags.source")]
            agreed += not diff
            report(name, not diff, "; ".join(diff))
    print(f"{what}: {len(paths)} TOMLs, {agreed} agree (the same payload, or both refuse), "
          f"{lenient} built here only")


# Values no trainer would take, probed in every number of our schemas: each must load here
# wherever synth-ai's builder takes it.
_PROBES = {int: (0, -1, 2**31), float: (0.0, -1.0, 1.5)}
_BASES = {"rl": ROOT / "apps" / "math" / "configs" / "rl.toml",
          "sft": ROOT / "apps" / "math" / "configs" / "sft.toml"}


def _range_probes(python: str, folder: Path) -> list[Path]:
    """A copy of the math app's RL and SFT configs for each number of our schemas set to
    each of `_PROBES` (in a table the base has: a new [policy] beside its [model] would
    change what the config is, not test a range)."""
    import copy
    import shutil
    import tomllib

    from synth_deploy.train import RLConfig, SFTConfig

    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for kind, schema in (("rl", RLConfig), ("sft", SFTConfig)):
        base = tomllib.loads(_BASES[kind].read_text())
        if kind == "sft":  # the dataset, beside the probes as beside the base
            job = base["job"]
            shutil.copy(_BASES[kind].parent / (job.get("data") or job["data_path"]), folder)
        for path, number, shape in _numbers(schema):
            if path[0] not in base:
                continue
            for value in _PROBES[number]:
                data = copy.deepcopy(base)
                table = data
                for part in path[:-1]:
                    table = table.setdefault(part, {})
                if not isinstance(table, dict):
                    continue
                table[path[-1]] = [value] if shape == "list" else \
                    {"probe": value} if shape == "dict" else value
                name = f"{kind}-{'.'.join(path)}={value}.toml"
                files.append({"path": str(folder / name), "data": data})
    return [Path(p) for p in synth_ai(python, {"op": "write_tomls", "args": {
        "files": files}})[0]]


def _numbers(schema: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], type,
                                                                   str]]:
    """(path, int or float, "value"/"list"/"dict") of every number field of ``schema``."""
    import typing

    from pydantic import BaseModel

    found = []
    for name, info in schema.model_fields.items():
        stack, shape = [info.annotation], "value"
        while stack:
            ann = stack.pop()
            origin = typing.get_origin(ann)
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                found += _numbers(ann, (*path, name))
            elif ann in (int, float):
                found.append(((*path, name), ann, shape))
            elif origin in (list, dict):
                shape = "list" if origin is list else "dict"
                stack.append(typing.get_args(ann)[-1])
            elif origin is not None:  # Annotated, Optional, Union
                stack += [a for a in typing.get_args(ann) if not isinstance(a, str)]
    return found


def check_traces(python: str, folder: Path) -> None:
    db = folder / "synth_ai.db"
    (ids,) = synth_ai(python, {"op": "write_sessions", "args": {
        "db": str(db), "count": 3, "reward": 1.0, "env_name": "crafter"}})
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    cli = [sys.executable, "-m", "synth_deploy.cli", "traces"]
    for args in (["where"], ["ls"], ["stats"], ["show", ids[0]],
                 ["export", "-o", str(folder / "a.jsonl"), "--min-reward", "1"]):
        proc = subprocess.run([*cli, *args, "--trace-db", str(db)], capture_output=True,
                              text=True, timeout=120)
        report(f"traces {args[0]} on synth-ai's file", proc.returncode == 0,
               proc.stderr[-200:] if proc.returncode else "")
    after = hashlib.sha256(db.read_bytes()).hexdigest()
    report("traces: read commands left the file byte for byte", before == after)
    report("traces: nothing created beside it", sorted(p.name for p in folder.iterdir()
                                                        if p.name.startswith(db.name))
           == [db.name])
    subprocess.run([*cli, "init", "--trace-db", str(db)], check=True, capture_output=True)
    (later,) = synth_ai(python, {"op": "write_sessions", "args": {
        "db": str(db), "count": 2, "reward": 1.0, "env_name": "crafter"}})
    with open_trace_store(db, read_only=True) as store:
        listed = {s.session_id: s for s in store.list_sessions(limit=None, app="crafter",
                                                              min_reward=1.0)}
        report("traces: synth-ai's sessions after the migration filter by --app/--min-reward",
               set(ids + later) <= set(listed), f"{len(listed)} of {len(ids + later)}")
        result = export_sft(store, folder / "b.jsonl", app="crafter", min_reward=1.0)
    report("traces: and are exported", result.sessions == len(ids + later), result.sessions)


def check_our_sessions(python: str, folder: Path) -> None:
    """Sessions the kit writes (each message once: `_db/_once`), read by synth-ai's own
    readers: the math app's and a 30-turn episode of an environment that never ends."""
    from synth_deploy.env import Env
    from synth_deploy.runs import RunOptions, run_suite
    from synth_deploy.tracing import parse_trace_db

    db = folder / "kit.db"
    app = folder / "corridor.py"
    app.write_text(
        "from synth_deploy.taskapp import Step, TaskApp, function_tool\n"
        "task_app = TaskApp('corridor-fidelity', name='Corridor', description='Walk.')\n"
        "@task_app.environment(max_turns=30)\n"
        "class Corridor:\n"
        "    tool = function_tool('walk', 'Walk on.', {'type': 'object', 'properties': {}})\n"
        "    def reset(self, seed, *, episode_id, config):\n"
        "        self.at = 0\n"
        "        return {'text': 'cell 0'}\n"
        "    def step(self, action):\n"
        "        self.at += 1\n"
        "        return Step({'text': f'cell {self.at}'}, reward=0.1)\n")
    for target, seeds in ((str(app), [0, 1]), ("math", [0, 1, 2])):
        run_suite(target, seeds, Env(), options=RunOptions(), traces=parse_trace_db(str(db)))
    with open_trace_store(db, read_only=True) as store:
        ours = {s.session_id: store.get_session(s.session_id)
                for s in store.list_sessions(limit=None)}
    (read,) = synth_ai(python, {"op": "read_sessions", "args": {"db": str(db)}})
    if isinstance(read, dict):  # synth-ai raised
        report("traces: synth-ai's readers read the kit's sessions", False, read["error"])
        return
    report("traces: synth-ai's trace manager reads every session the kit wrote",
           {r["session_id"] for r in read} == set(ours), f"{len(read)} of {len(ours)}")
    for r in read:
        session = ours.get(r["session_id"])
        turns = [s for s in session.timesteps if any(m.message_type == "user"
                                                     for m in s.messages)]
        ok = (r["timesteps"] == len(session.timesteps)
              and r["loaded_events"] == len(session.events)
              and r["loaded_messages"] == r["num_messages"] > 0
              and r["filter_examples"] == len(turns))
        report(f"traces: synth-ai reads {session.metadata.get('app_id')} session "
               f"{r['session_id'][-8:]} whole", ok,
               f"{r['timesteps']} steps, {r['num_messages']} messages once, "
               f"{r['filter_examples']} filter examples for {len(turns)} turns")


def check_sft(python: str, folder: Path) -> None:
    tools = [{"type": "function", "function": {
        "name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]
    db = folder / "ours.db"
    with open_trace_store(db) as store:
        tracer = SessionTracer(metadata={"app_id": "tools", "status": "ok"})
        tracer.record_message("user", "What is 2 + 2?")
        tracer.record_lm_call(model_name="m", call_records=[{"request": {
            "messages": [{"role": "user", "content": "What is 2 + 2?"}], "tools": tools}}])
        tracer.record_message("assistant", "", metadata={"tool_calls": [{
            "id": "c1", "type": "function",
            "function": {"name": "add", "arguments": '{"a": 2}'}}]})
        store.write_session_sync(tracer.finish())
        export_sft(store, folder / "export.jsonl")
    nested = folder / "nested.jsonl"
    nested.write_text(json.dumps({"messages": [{"role": "user", "content": "2+2?"},
                                               {"role": "assistant", "content": "4"}],
                                  "tools": tools}) + "\n")
    copy = upload_copy(nested)
    paths = {"export": folder / "export.jsonl", "upload copy": copy,
             "nested tools as written": nested}
    verdicts = synth_ai(python, *({"op": "validate_sft", "args": {"path": str(p)}}
                                  for p in paths.values()))
    for (name, _), errors in zip(paths.items(), verdicts, strict=True):
        expected_ok = name != "nested tools as written"  # why the export and upload flatten
        report(f"sft: synth-ai's validator on the {name}", (errors == []) == expected_ok,
               "; ".join(errors) if errors else "no errors")


CHECKS = {"rollout": lambda python, tmp: check_rollout(python),
          "long": lambda python, tmp: check_long_rollouts(python),
          "configs": check_configs_and_payloads, "traces": check_traces,
          "sessions": check_our_sessions, "sft": check_sft}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("python", help="the python of a venv with synth-ai==0.4.4")
    parser.add_argument("--only", choices=CHECKS, action="append",
                        help="run these checks only (repeatable; default: all)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or CHECKS:
            CHECKS[name](args.python, Path(tmp))
    print(f"\n{len(failures)} failure(s)" + (f": {', '.join(failures)}" if failures else ""))
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
