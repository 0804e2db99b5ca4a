"""Environments are plug-ins: each is a distribution of its own under envs/<name>/ that declares an
EnvSpec and an entry point in the group agentrl.envs; the shared code never names one."""

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agentrl.envs.spec import (ENTRY_POINT_GROUP, EnvSpec, check_env_spec, env_names, env_spec, new_registry,
                               source_checkout_envs)
from agentrl.config.loading import recipe_names

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
ENV_DIRS = sorted(p for p in (ROOT / "envs").iterdir() if (p / "pyproject.toml").is_file())
BUILT_IN = ("alfworld", "webshop", "textcraft", "sokoban", "scienceworld")
# Modules of agentrl that may name one environment, and why: the default environment (the default
# recipe's); benchmarks of one environment's own engine or data, and those that start a served pool.
MAY_NAME = {
    "agentrl/config/schema.py": "env.name's default",
    "agentrl/bench/alfworld.py": "the ALFWorld generation benchmark",
    "agentrl/bench/alfworld_steps.py": "the ALFWorld engine benchmark",
    "agentrl/bench/webshop.py": "the WebShop data benchmark",
    "agentrl/bench/webshop_steps.py": "the WebShop step benchmark",
    "agentrl/bench/env_server.py": "the env server benchmark's default environment",
    "agentrl/bench/_attacks.py": "the attack kit's served environment",
}


def names_in(path: Path, root: Path = ROOT) -> list[str]:
    """String literals that are an environment's name, and imports of an environment package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in BUILT_IN:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
        else:
            continue
        found += [f"{path.relative_to(root)}:{node.lineno}: import {m}"
                  for m in modules if m.startswith("agentrl_env_")]
    return found


def test_no_shared_module_names_an_environment():
    found = [hit for path in sorted((ROOT / "agentrl").rglob("*.py")) if str(path.relative_to(ROOT)) not in MAY_NAME
             for hit in names_in(path)]
    assert not found, ("shared code names an environment; declare it in the environment's EnvSpec "
                       "(agentrl/envs/spec.py) instead:\n" + "\n".join(found))


def test_the_scan_finds_what_it_looks_for(tmp_path):
    (tmp_path / "m.py").write_text('import agentrl_env_webshop\nif env == "ALFWorld":\n    pass\n')
    assert sorted(names_in(tmp_path / "m.py", tmp_path)) == ["m.py:1: import agentrl_env_webshop", "m.py:2: 'ALFWorld'"]


@pytest.mark.parametrize("folder", ENV_DIRS, ids=lambda p: p.name)
def test_each_environment_is_a_distribution_with_an_entry_point(folder):
    name = folder.name
    project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    assert project["name"] == f"agentrl-env-{name}"
    assert project["entry-points"][ENTRY_POINT_GROUP] == {name: f"agentrl_env_{name}:SPEC"}
    assert any(dep.split("[")[0].strip() == "agentrl" for dep in project["dependencies"])
    spec = env_spec(name)
    assert isinstance(spec, EnvSpec) and spec.name == name and check_env_spec(spec, name) is spec
    blocks = Path(spec.recipes_dir) / "_base"
    assert (blocks / "env" / f"{name}.yaml").is_file() and (blocks / "tiny" / f"{name}.yaml").is_file()
    assert Path(spec.results.published).is_file() if spec.results.published else True


def test_the_source_checkout_finds_every_environment_folder():
    assert source_checkout_envs() == {p.name: f"agentrl_env_{p.name}:SPEC" for p in ENV_DIRS}
    assert set(BUILT_IN) <= set(env_names())
    # their recipes are listed beside the built-in ones, and the heavy engines stay unimported
    assert {"alfworld_grpo_tiny", "webshop_gigpo_qwen7b", "textcraft_grpo_tiny"} <= set(recipe_names())
    done = subprocess.run([sys.executable, "-c", "import sys; from agentrl.envs import env_spec; "
                           "[env_spec(n) for n in ('alfworld', 'webshop', 'textcraft')]; "
                           "assert 'textworld' not in sys.modules and 'alfworld' not in sys.modules"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_an_installed_distribution_is_found_by_its_entry_point(tmp_path, monkeypatch):
    """An installed distribution's metadata (a .dist-info folder on sys.path, as pip writes it)
    names the spec; a fresh registry finds it by name."""
    (tmp_path / "shop_env.py").write_text(
        "from agentrl.envs.spec import EnvSpec\n"
        "SPEC = EnvSpec(name='shop', make_env=lambda **kwargs: 'an env', description='a test shop')\n")
    info = tmp_path / "agentrl_env_shop-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agentrl-env-shop\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nshop = shop_env:SPEC\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = new_registry()
    assert "shop" in registry.names()
    assert registry.get("shop").description == "a test shop" and registry.get("shop").make_env() == "an env"


@pytest.mark.slow
def test_the_wheels_carry_the_recipes_and_the_entry_point(tmp_path):
    """agentrl's wheel holds the top-level recipes/ as agentrl/recipes/; an environment's wheel its
    building blocks, its published numbers and its entry point."""
    for source in (ROOT, ROOT / "envs" / "textcraft"):
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path), str(source)], check=True, capture_output=True)
    agentrl = zipfile.ZipFile(next(tmp_path.glob("agentrl-*.whl"))).namelist()
    assert "agentrl/recipes/textcraft_grpo_tiny.yaml" in agentrl and "agentrl/recipes/_base/model/tiny.yaml" in agentrl
    assert not any(name.startswith("agentrl_env_") for name in agentrl)
    wheel = zipfile.ZipFile(next(tmp_path.glob("agentrl_env_textcraft-*.whl")))
    names = wheel.namelist()
    assert {"agentrl_env_textcraft/recipe_files/_base/env/textcraft.yaml", "agentrl_env_textcraft/published.yaml",
            "agentrl_env_textcraft/env.py"} <= set(names)
    points = wheel.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert f"[{ENTRY_POINT_GROUP}]\ntextcraft = agentrl_env_textcraft:SPEC" in points
