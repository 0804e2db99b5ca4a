"""The package's layers (docs/architecture.md, "Layers"): no import, at module level or inside a
function, runs from a lower layer up to a higher one; no two modules import each other, directly or
through others (a circle); and no layer outside the estimators names an estimator (they ask the
registry for its declarations).

A unit is a top-level package or module of agentrl."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agentrl"

# lowest first; a module may import its own layer and the ones below
LAYERS = [
    {"__init__", "errors", "plugins", "data"},
    {"envs", "models", "estimators", "policy_losses", "runtime", "weights", "generation"},
    {"config", "runs", "placement", "gateway"},
    {"rollout", "agents"},
    {"learner", "warmstart"},
    {"training", "evaluation", "bench", "checklist"},
    {"cli"},
]
LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}
# units that never import each other, whatever their layers: the learner and the rollout meet only
# in the trainer's components (agentrl.training: weight sync, rollout sources); the roles take their
# placement as agentrl.runtime.actor_slots objects and never read the plan that made them
INDEPENDENT = [("learner", "rollout"), ("learner", "placement"), ("rollout", "placement")]


def unit_of(path: Path) -> str:
    return path.relative_to(PACKAGE).with_suffix("").parts[0]


def module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_of(p): p for p in PACKAGE.rglob("*.py")}


def imported_modules(path: Path) -> set[str]:
    """The agentrl modules ``path`` imports (at module level or inside a function): ``from a.b import c``
    counts ``a.b.c`` when that is a module, else ``a.b``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                     for alias in node.names]
        else:
            continue
        found.update(name for name in names if name.split(".")[0] == "agentrl" and name != "agentrl")
    return found


def imported_units(path: Path) -> set[str]:
    return {name.split(".")[1] for name in imported_modules(path)}


def test_every_unit_has_a_layer():
    units = {unit_of(p) for p in PACKAGE.rglob("*.py")} - {"recipes"}
    assert units <= set(LAYER_OF), f"add to LAYERS (and docs/architecture.md): {sorted(units - set(LAYER_OF))}"


def test_no_import_runs_up_the_layers():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit_of(path)
        for target in imported_units(path):
            if target in LAYER_OF and LAYER_OF[target] > LAYER_OF[source]:
                upward.append(f"{path.relative_to(PACKAGE.parent)} imports agentrl.{target}")
    assert not upward, "imports from a lower layer up to a higher one:\n" + "\n".join(upward)


def import_graph() -> dict[str, set[str]]:
    """Every agentrl module and the agentrl modules it imports; importing ``a.b.c`` runs ``a.b``'s
    ``__init__`` too, so that counts as an import of the package."""
    graph = {}
    for name, path in MODULES.items():
        targets = set()
        for target in imported_modules(path):
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            parts = target.split(".")
            targets.update(".".join(parts[:end]) for end in range(2, len(parts) + 1))
        graph[name] = {t for t in targets if t in MODULES and t != name and not name.startswith(t + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others():
    found = circles(import_graph())
    assert not found, "modules that import each other (a circle):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_circle_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_independent_units_do_not_import_each_other():
    crossing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit_of(path)
        for a, b in INDEPENDENT:
            other = b if source == a else a if source == b else None
            if other is not None and other in imported_units(path):
                crossing.append(f"{path.relative_to(PACKAGE.parent)} imports agentrl.{other}")
    assert not crossing, "units meant to be independent import each other:\n" + "\n".join(crossing)


def test_only_the_estimators_name_an_estimator():
    names = re.compile(r"\b(bipace|gigpo|gagpo|rloo)\b", re.I)
    naming = [str(p.relative_to(PACKAGE.parent)) for p in sorted(PACKAGE.rglob("*.py"))
              if unit_of(p) not in ("estimators", "bench") and names.search(p.read_text())]
    assert not naming, f"these modules name an estimator instead of asking the registry: {naming}"


def test_only_the_policy_losses_name_a_policy_loss():
    names = re.compile(r"\b(gspo|sapo|gpg|clip_cov|kl_cov|gmpo|geo_mean|cispo)\b", re.I)
    naming = [str(p.relative_to(PACKAGE.parent)) for p in sorted(PACKAGE.rglob("*.py"))
              if unit_of(p) not in ("policy_losses", "bench") and names.search(p.read_text())]
    assert not naming, f"these modules name a policy loss instead of asking the registry: {naming}"
