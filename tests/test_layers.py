"""The package's layers (docs/architecture.md, "Layers"): no import, at module level or inside a
function, runs from a lower layer up to a higher one; and no layer outside the estimators names an
estimator (they ask the registry for its declarations)."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agentrl"

# lowest first; a module may import its own layer and the ones below
LAYERS = [
    {"__init__", "errors", "data"},
    {"envs", "models", "estimators", "runtime", "weights"},
    {"config", "rollout", "runs"},
    {"learner", "warmstart"},
    {"training", "evaluation", "bench"},
    {"cli"},
]
LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}
# units that never import each other, whatever their layers: the learner and the rollout meet only
# in the trainer's components (agentrl.training: weight sync, rollout sources)
INDEPENDENT = [("learner", "rollout")]


def unit_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def imported_units(path: Path) -> set[str]:
    units = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names] if node.module == "agentrl" \
                else [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "agentrl" and len(parts) > 1:
                units.add(parts[1])
    return units


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
