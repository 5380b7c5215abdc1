"""The house's rules, read from the sources: no import circle, no import that runs back up the layers, and no
method package that imports another.

Layers, bottom up: the engine (a library: torch, transformers and itself), the shared modules (the method catalog,
the family registry, models, questions, corpus, hub, templates, files, provenance, versions), what trained drafts
share (`drafts`: checkpoints, the tree-draft base, training data, the trainer), the methods (`baselines`,
`logitspec`, `gumiho`, `eagle`, `medusa`: each imports only the layers below and itself), the report and figures,
the run path (`evaluation.run`), the standalone commands (`evaluation.tools`) and the Python API (`specdec`). A
module may import its own layer and those below. Every import counts, at the top of a file or inside a function.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
METHOD_PACKAGES = ("baselines", "logitspec", "gumiho", "eagle", "medusa")
PACKAGES = ("evaluation", "drafts", *METHOD_PACKAGES, "specdec")
LAYERS = ("engine", "shared", "drafts", "methods", "report", "run", "tools")


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] in METHOD_PACKAGES:
        return "methods"
    if parts[0] == "drafts":
        return "drafts"
    if parts[0] == "specdec":  # the Python API: the top, beside the commands
        return "tools"
    if len(parts) > 1 and parts[1] in ("engine", "report", "run", "tools"):
        return parts[1]
    return "shared"  # evaluation itself and its top-level modules


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `module` imports (the longest known prefix of each imported name)."""
    names = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = project_modules(root)
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} ({layer(m)}) imports {t} ({layer(t)})" for m, targets in graph.items() for t in targets
                  if LAYERS.index(layer(t)) > LAYERS.index(layer(m)))


def cross_method_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from one method package into another: methods share only what the layers below hold."""
    return sorted(f"{m} imports {t}" for m, targets in graph.items() for t in targets
                  if layer(m) == layer(t) == "methods" and m.split(".")[0] != t.split(".")[0])


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_no_import_runs_back_up():
    assert upward_imports(import_graph()) == []


def test_no_method_package_imports_another():
    assert cross_method_imports(import_graph()) == []


def test_the_rules_catch_a_circle_and_an_upward_import(tmp_path):
    """The scan itself: a planted circle and an engine module reaching into the run path are both found."""
    for package, files in {"evaluation": {"__init__.py": "", "models.py": "from evaluation import questions\n",
                                          "questions.py": "def f():\n    from evaluation.models import x\n"},
                           "evaluation/engine": {"__init__.py": "", "loop.py": "import evaluation.run.answer\n"},
                           "evaluation/run": {"__init__.py": "", "answer.py": "from ..engine import loop\n"}}.items():
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (tmp_path / package / name).write_text(text)
    graph = import_graph(tmp_path)
    assert sorted(map(tuple, circles(graph))) == [("evaluation.engine.loop", "evaluation.run.answer"),
                                                  ("evaluation.models", "evaluation.questions")]
    assert upward_imports(graph) == ["evaluation.engine.loop (engine) imports evaluation.run.answer (run)"]


def test_the_rules_catch_a_cross_method_import_and_a_shared_package_reaching_into_a_method(tmp_path):
    """A method borrowing another's module (as eagle once took gumiho's draft) and the drafts' shared package
    reaching up into a family are both found; a method using the shared package is allowed."""
    planted = {"evaluation": {"__init__.py": ""},
               "drafts": {"__init__.py": "", "tree.py": "", "method.py": "import gumiho.draft\n"},
               "gumiho": {"__init__.py": "", "draft.py": "from drafts.tree import x\n"},
               "eagle": {"__init__.py": "", "method.py": "def f():\n    from gumiho.draft import y\n"}}
    for package, files in planted.items():
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (tmp_path / package / name).write_text(text)
    graph = import_graph(tmp_path)
    assert cross_method_imports(graph) == ["eagle.method imports gumiho.draft"]
    assert upward_imports(graph) == ["drafts.method (drafts) imports gumiho.draft (methods)"]


def test_the_engine_imports_only_itself_torch_and_transformers():
    graph = import_graph()
    outside = {m: sorted(t for t in targets if layer(t) != "engine")
               for m, targets in graph.items() if layer(m) == "engine"}
    assert {m: t for m, t in outside.items() if t} == {}
    third_party = set()
    for module, path in project_modules().items():
        if layer(module) != "engine":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                third_party.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level:
                third_party.add((node.module or "").split(".")[0])
    allowed = {"torch", "transformers", "numpy", "pandas", "evaluation", "__future__"} | set(sys.stdlib_module_names)
    assert third_party - allowed == set()


@pytest.mark.parametrize("command", ["import evaluation.report, evaluation.report.figures, evaluation.catalog",
                                     "from evaluation.catalog import catalog; catalog()"])
def test_the_report_imports_neither_torch_nor_a_method(command):
    code = (f"import sys; {command}; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'drafts', "
            "'baselines', 'logitspec', 'gumiho', 'eagle', 'medusa')); print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_project_import_names_something_that_exists():
    """Imports inside functions run only when called: each `from <project module> import <name>` is checked here
    (a moved or renamed name fails at once, not when a rarely used command runs)."""
    import importlib

    modules = project_modules()
    missing = []
    for module, path in sorted(modules.items()):
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] not in PACKAGES:
                continue
            try:
                target = importlib.import_module(base)
            except ImportError as exc:
                missing.append(f"{module}: {base} ({exc})")
                continue
            for alias in node.names:
                if not hasattr(target, alias.name) and f"{base}.{alias.name}" not in modules:
                    missing.append(f"{module}: {base}.{alias.name}")
    assert missing == []


def test_the_report_modules_import_in_order_and_the_figures_not_the_command_line():
    """The report split by concern: stats reads load, markdown reads both, cli (the command line) reads them all,
    never the other way round; the figures read the first three, never the command line."""
    graph = import_graph()
    order = ["evaluation.report.load", "evaluation.report.stats", "evaluation.report.markdown",
             "evaluation.report.cli"]
    for i, module in enumerate(order):
        later = set(order[i + 1:])
        assert not graph[module] & later, f"{module} imports {sorted(graph[module] & later)}"
    figures = {m for m in graph if m.startswith("evaluation.report.figures")}
    assert figures and not any("evaluation.report.cli" in graph[m] for m in figures)


def unsafe_loads(source: str) -> list[str]:
    """Loads that can run code from a file: `torch.load` without `weights_only=True`, pickle (or dill, joblib),
    `allow_pickle=True` and `trust_remote_code=True`, as (line: what)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{node.lineno}: imports {n}" for n in names
                      if n.split(".")[0] in ("pickle", "cPickle", "_pickle", "dill", "joblib", "cloudpickle")]
        if not isinstance(node, ast.Call):
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        for name in ("allow_pickle", "trust_remote_code"):
            if name in keywords and not (isinstance(keywords[name], ast.Constant) and keywords[name].value is False):
                found.append(f"{node.lineno}: {name}")
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "load" and isinstance(func.value, ast.Name) \
                and func.value.id == "torch":
            safe = keywords.get("weights_only")
            if not (isinstance(safe, ast.Constant) and safe.value is True):
                found.append(f"{node.lineno}: torch.load without weights_only=True")
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def test_nothing_loads_a_file_in_a_way_that_can_run_code():
    """Every file a user may hand the harness (drafts, heads, training states, caches) is read as tensors only:
    safetensors or `torch.load(weights_only=True)`, never pickle, never remote code."""
    paths = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")] + [ROOT / "run.py"]
    found = {str(p.relative_to(ROOT)): unsafe_loads(p.read_text(encoding="utf-8")) for p in paths}
    assert {path: lines for path, lines in found.items() if lines} == {}


def test_the_unsafe_load_scan_catches_each_kind():
    planted = ("import pickle\nfrom dill import loads\nimport torch, numpy as np\n"
               "a = torch.load(path)\nb = torch.load(path, weights_only=False)\nc = torch.load(path, weights_only=True)\n"
               "d = np.load(path, allow_pickle=True)\ne = AutoModel.from_pretrained(x, trust_remote_code=True)\n"
               "f = np.load(path, allow_pickle=False)\n")
    assert unsafe_loads(planted) == ["1: imports pickle", "2: imports dill", "4: torch.load without weights_only=True",
                                     "5: torch.load without weights_only=True", "7: allow_pickle",
                                     "8: trust_remote_code"]
