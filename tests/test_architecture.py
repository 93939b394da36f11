"""The layout's promises, checked on the source: one owner per concept, surfaces respected,
no cycles. Each rule names what it protects; a failure lists the offending file:line."""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "synth_deploy"

# Process entry points: the only code that may read the process environment, each with why.
ENVIRONMENT_READERS = {
    "env.py": "resolves .env files and the environment into an Env",
    "handoff.py": "documents the variables a parent hands a child process",
    "modal/_container.py": "entry of the Modal container process",
    "modal/_modal_app.py": "entry of the `modal deploy` child (modal_app)",
    "serving/_runner.py": "entry of each `serve --reload` server process (reloaded_app)",
    "tls.py": "trusts SSL_CERT_FILE/SSL_CERT_DIR for the standard library, as httpx does",
    "tunnel/_process.py": "passes this process's environment on to cloudflared",
}


@functools.cache
def modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(PACKAGE)): ast.parse(p.read_text(), filename=str(p))
            for p in sorted(PACKAGE.rglob("*.py"))}


def imported_names(tree: ast.Module, *, runs: bool = False) -> list[tuple[int, str, bool]]:
    """(line, dotted module name, at module level) for every synth_deploy import, inside
    functions too; ``runs``: only those that run (not under ``if TYPE_CHECKING:``, which
    serve annotations only)."""
    top = {id(node) for node in tree.body}
    typing_only = {id(inner) for node in ast.walk(tree) if runs and isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test)
                   for stmt in node.body for inner in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith("synth_deploy"):
                found.append((node.lineno, name, id(node) in top))
    return found


def package_of(path: str) -> str:
    return path.split("/")[0] if "/" in path else path.removesuffix(".py")


# The one pair of packages that share internals: the engine runs what the SDK declares (its
# config, environments and policy client), as uvicorn's protocols read its Config. The SDK's
# public list stays what an app author uses.
FRIENDS = {("serving", "taskapp")}


def test_no_module_imports_another_packages_private_module():
    offenders = []
    for path, tree in modules().items():
        for line, name, _ in imported_names(tree):
            parts = name.split(".")
            private = next((i for i, p in enumerate(parts) if p.startswith("_")), None)
            if private is not None and private >= 2 and parts[1] != package_of(path) \
                    and (package_of(path), parts[1]) not in FRIENDS:
                offenders.append(f"{path}:{line} imports {name}")
    assert offenders == []


def test_tests_and_benchmarks_use_package_surfaces():
    root = PACKAGE.parent
    offenders = []
    for folder in ("tests", "bench"):
        for p in sorted((root / folder).rglob("*.py")):
            if p.name == Path(__file__).name:
                continue
            for line, name, _ in imported_names(ast.parse(p.read_text())):
                private = any(part.startswith("_") for part in name.split(".")[1:])
                # The CLI's shared helpers (seed ranges, exit codes) are tested directly.
                if private and not name.startswith("synth_deploy.cli._common"):
                    offenders.append(f"{p.relative_to(root)}:{line} imports {name}")
    assert offenders == []


def test_test_modules_share_through_helpers_and_conftest_only():
    # A test module imported by another runs its tests' module code twice and ties the two
    # files' fates: shared fixtures live in a conftest.py, shared helpers in a helper module.
    root = PACKAGE.parent / "tests"
    offenders = []
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{p.relative_to(root)}:{node.lineno} imports {name}"
                          for name in names if name.split(".")[-1].startswith("test_")]
    assert offenders == []


# Which package may use which, lowest first: a package imports only packages of the layers
# below its own (never one of its own layer, never one above), at module level or inside a
# function alike. The root modules are the packages' common ground.
LAYERS = (
    ("errors", "deadlines", "_lazy", "_batches", "tls", "logs", "proxy_limits", "__init__"),
    ("env", "urls", "handoff"),
    ("tracing",),    # the trace store: what rollouts record, written and read
    ("otel",),       # traces as OpenTelemetry spans
    ("sandbox",),    # where an environment runs the model's code (its commands traced)
    ("taskapp",),    # the SDK an app author writes against
    ("serving",),    # the engine that serves what the SDK declares (it records traces)
    ("health",),     # probing a served app
    ("train", "tunnel", "viewer"),  # what is built on a served, checked app
    ("runs",),       # smoke, eval and rehearsal (through tunnels, as training does), the mock
    ("modal",),      # deploying: validated and sized by runs first
    ("cli",),
)


def module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def module_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: line}, function-level imports included."""
    graph: dict[str, dict[str, int]] = defaultdict(dict)
    known = {module_name(p) for p in modules()}
    for path, tree in modules().items():
        me = module_name(path)
        for line, name, _ in imported_names(tree, runs=True):
            target = name.removeprefix("synth_deploy.")
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != me and not me.startswith(target + "."):
                graph[me].setdefault(target, line)
    return graph


def test_no_import_cycles_between_modules():
    graph = module_graph()
    cycles, done = [], set()

    def visit(node: str, stack: list[str]) -> None:  # depth-first, each module once
        for nxt in sorted(graph[node]):
            if nxt in stack:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, stack + [nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    assert [" -> ".join(c) for c in cycles] == []


def test_packages_import_only_the_layers_below_their_own():
    layer = {package: level for level, names in enumerate(LAYERS) for package in names}
    assert set(layer) == {package_of(path) for path in modules()}, "every package has a layer"
    offenders = []
    for path, tree in modules().items():
        me = package_of(path)
        for line, name, _ in imported_names(tree, runs=True):
            other = name.split(".")[1] if "." in name else me
            if other != me and other in layer and layer[other] >= layer[me]:
                offenders.append(f"{path}:{line} imports {name} ({me} may not use {other})")
    assert offenders == []


def test_cli_modules_do_not_import_each_other():
    offenders = []
    for path, tree in modules().items():
        if not path.startswith("cli/"):
            continue
        for line, name, _ in imported_names(tree):
            module = name.removeprefix("synth_deploy.").replace(".", "/") + ".py"
            # _app assembles the commands; help_text renders the assembled app's help.
            if module.startswith("cli/") and module in modules() \
                    and path not in ("cli/__init__.py", "cli/_app.py", "cli/help_text.py") \
                    and module not in ("cli/_common.py", "cli/__init__.py"):
                offenders.append(f"{path}:{line} imports {name}")
    assert offenders == []


def test_only_entry_points_read_the_environment():
    offenders = []
    for path, tree in modules().items():
        if path.startswith("cli/") or path in ENVIRONMENT_READERS:
            continue
        for node in ast.walk(tree):
            reads_environ = (isinstance(node, ast.Attribute) and node.attr in ("environ",
                                                                               "getenv")
                             and isinstance(node.value, ast.Name) and node.value.id == "os")
            calls_load_env = (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                              and node.func.id == "load_env")
            if reads_environ or calls_load_env:
                offenders.append(f"{path}:{node.lineno}")
    assert offenders == []


def calls_to(name: str) -> list[str]:
    found = []
    for path, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called == name:
                    found.append(path)
    return sorted(set(found))


def test_one_place_builds_a_local_server():
    uvicorn_users = [path for path, tree in modules().items()
                     if any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                            and n.value.id == "uvicorn" for n in ast.walk(tree))]
    # _runner configures and runs every server; _prompt_stop is the Server class it runs.
    assert uvicorn_users == ["serving/_prompt_stop.py", "serving/_runner.py"]
    assert calls_to("create_app") == ["serving/_runner.py"]


def test_one_place_decides_the_missing_key_rule():
    assert calls_to("api_keys") == ["serving/_auth.py"]
    # Minting: the rule's ephemeral keys, and `setup` writing a key into .env.
    assert calls_to("mint_key") == ["cli/taskapp.py", "serving/_auth.py"]


def test_one_rule_says_which_host_is_this_machine():
    # urls.is_loopback_host; a hand-written list of names, or startswith("127."), drifts.
    names = {"127.0.0.1", "localhost", "::1", "[::1]"}
    offenders = []
    for path, tree in modules().items():
        if path == "urls.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                for value in ast.walk(ast.Tuple(elts=node.comparators)):
                    if isinstance(value, ast.Constant) and value.value in names:
                        offenders.append(f"{path}:{node.lineno} compares with {value.value!r}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "startswith" and any(
                        isinstance(a, ast.Constant) and a.value == "127." for a in node.args):
                offenders.append(f"{path}:{node.lineno} startswith('127.')")
    assert offenders == []


def test_every_httpx_client_verifies_with_the_kits_one_tls_context():
    # tls.client_ssl_context: one trust store, built once (a client given a transport: its
    # module builds the transport with it). The metrics client speaks plain HTTP to loopback.
    plain_http = {"tunnel/_metrics.py"}
    offenders = []
    for path, tree in modules().items():
        uses_context = "client_ssl_context" in ast.unparse(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "httpx" and \
                    node.func.attr in ("Client", "AsyncClient", "get", "post", "stream") and \
                    path not in plain_http:
                given = {k.arg: k.value for k in node.keywords}
                verify = given.get("verify")
                if not (isinstance(verify, ast.Call) and getattr(verify.func, "id", "")
                        == "client_ssl_context") and not ("transport" in given and uses_context):
                    offenders.append(f"{path}:{node.lineno} httpx.{node.func.attr}")
    assert offenders == []


def test_only_the_tracing_package_opens_the_trace_store():
    # Everyone else calls open_trace_store(setting) with the setting resolved at the entry.
    assert all(path.startswith("tracing/") for path in calls_to("TraceStore"))


def test_every_variable_the_kit_reads_is_in_env_example():
    """README: "Every variable the kit reads is in .env.example, with a comment"."""
    read: dict[str, str] = {}
    for path, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                value = node.value.value
                for target in node.targets:  # NAME = "NAME" or SOMETHING_VAR = "NAME"
                    if isinstance(target, ast.Name) and isinstance(value, str) and (
                            target.id == value or target.id.endswith("_VAR")):
                        read[value] = f"{path}:{node.lineno}"
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "get" and isinstance(node.func.value, ast.Name)
                  and node.func.value.id == "env" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                read[str(node.args[0].value)] = f"{path}:{node.lineno}"
    listed = set(re.findall(r"^([A-Z][A-Z0-9_]+)=", (PACKAGE.parent / ".env.example").read_text(),
                            re.M))
    missing = [f"{name} ({where})" for name, where in sorted(read.items())
               if name.isupper() and name != "PATH" and name not in listed]
    assert missing == []


def test_the_sdk_exports_what_an_app_author_uses_and_little_more():
    # The names an app file imports (the bundled apps show which) are the SDK's package
    # surface; everything else is in a public module named for what it holds.
    import synth_deploy.taskapp as sdk

    used = set()
    for p in sorted((PACKAGE.parent / "apps").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "synth_deploy.taskapp":
                used |= {alias.name for alias in node.names}
    assert used and used <= set(sdk.__all__)
    assert len(sdk.__all__) <= 25
    for name in sdk.__all__:
        assert getattr(sdk, name) is not None
