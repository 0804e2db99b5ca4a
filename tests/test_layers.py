"""The package's layers (docs/architecture.md, "Layers"): no import, at module level or inside a
function, runs from a lower layer up to a higher one; and no layer outside the estimators names an
estimator (they ask the registry for its declarations).

A unit is a top-level package or module of agentrl, or a module listed by its dotted name
(``warmstart.options``): declarations that a lower layer reads sit low while the machinery of
their package sits high. Importing such a module runs its packages' ``__init__`` files, so those
import nothing above its layer."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agentrl"

# lowest first; a module may import its own layer and the ones below
LAYERS = [
    {"__init__", "errors", "plugins", "data"},
    {"envs", "models", "estimators", "runtime", "weights", "generation", "warmstart.options"},
    {"config", "rollout", "runs", "placement", "gateway", "agents"},
    {"learner", "warmstart"},
    {"training", "evaluation", "bench", "checklist"},
    {"cli"},
]
LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}
# units that never import each other, whatever their layers: the learner and the rollout meet only
# in the trainer's components (agentrl.training: weight sync, rollout sources); the roles take their
# placement as agentrl.runtime.actor_slots objects and never read the plan that made them
INDEPENDENT = [("learner", "rollout"), ("learner", "placement"), ("rollout", "placement")]


def listed_unit(parts: tuple[str, ...] | list[str]) -> str:
    """The most specific listed unit holding the module ``agentrl.<parts>`` (``warmstart.options``
    before ``warmstart``); an unlisted top-level name as it is."""
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in LAYER_OF:
            return ".".join(parts[:end])
    return parts[0]


def unit_of(path: Path) -> str:
    return listed_unit(path.relative_to(PACKAGE).with_suffix("").parts)


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
                units.add(listed_unit(parts[1:]))
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


def test_a_low_module_of_a_high_package_imports_it_without_running_its_machinery():
    dotted = [unit for unit in LAYER_OF if "." in unit]
    assert dotted, "no dotted unit listed: this test checks nothing"
    upward = []
    for unit in dotted:
        parts = unit.split(".")
        for end in range(1, len(parts)):
            init = PACKAGE.joinpath(*parts[:end], "__init__.py")
            above = sorted(t for t in imported_units(init) if LAYER_OF.get(t, 0) > LAYER_OF[unit])
            upward += [f"{init.relative_to(PACKAGE.parent)} imports agentrl.{t}, above {unit}" for t in above]
    assert not upward, "importing a low module would run imports of higher layers:\n" + "\n".join(upward)


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
