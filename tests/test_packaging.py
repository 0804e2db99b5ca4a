"""Static checks of what ships around the package: Dockerfiles, setup script extras, scripts named
in the docs, doc links, the console script and the GPU smoke script's overrides. Nothing here
builds an image or needs a GPU; the point is that the install paths the docs and images describe
are the one CI exercises (scripts/setup.sh) and that every name they use exists."""

import importlib
import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DOCKERFILES = sorted(p for p in (ROOT / "docker").glob("Dockerfile*") if not p.name.endswith(".dockerignore"))
# Markdown and shell files whose commands users copy.
TEXT_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docker").glob("*.md")),
              *DOCKERFILES, *sorted((ROOT / "scripts").glob("*.sh")), ROOT / ".ci" / "run"]
# Docs another piece of work writes; links to them may exist before the files do.
PENDING_DOCS = {"docs/evaluation.md", "docs/reproducing.md"}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_there_are_gpu_and_cpu_dockerfiles():
    assert {p.name for p in DOCKERFILES} >= {"Dockerfile", "Dockerfile.cpu"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_install_only_through_setup_sh(dockerfile):
    text = dockerfile.read_text()
    runs = re.findall(r"^RUN (.*)$", text.replace("\\\n", " "), re.M)
    assert any("bash scripts/setup.sh" in r for r in runs), f"{dockerfile.name} does not run scripts/setup.sh"
    assert "pip install" not in text, f"{dockerfile.name} installs Python packages outside scripts/setup.sh"
    assert re.search(r"python3\.11|python:3\.11", text), f"{dockerfile.name} is not on Python 3.11"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_copy_sources_exist(dockerfile):
    for line in re.findall(r"^COPY (.*)$", dockerfile.read_text(), re.M):
        *sources, _dest = line.split()
        for src in sources:
            assert (ROOT / src).exists(), f"{dockerfile.name} copies {src}, which is not in the repository"


def extras_in(text: str) -> list[tuple[str, str]]:
    """(where, extra) for every AGENTRL_EXTRAS=... value and ${AGENTRL_EXTRAS:-...} default in text."""
    found = []
    for match in re.finditer(r"AGENTRL_EXTRAS(?::-|=)[\"']?([A-Za-z0-9_,\-$\{]+)", text):
        value = match.group(1)
        if value.startswith("$"):
            continue  # passed through from a build argument, checked where that is defined
        found += [(match.group(0), extra) for extra in value.split(",") if extra]
    for match in re.finditer(r"ARG AGENTRL_EXTRAS=([A-Za-z0-9_,\-]+)", text):
        found += [(match.group(0), extra) for extra in match.group(1).split(",")]
    for match in re.finditer(r"agentrl\[([A-Za-z0-9_,\-]+)\]", text):
        found += [(match.group(0), extra) for extra in match.group(1).split(",")]
    return found


def test_setup_sh_default_extras_exist_in_pyproject():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    default = re.search(r"AGENTRL_EXTRAS:-([A-Za-z0-9_,\-]+)\}", setup)
    assert default, "scripts/setup.sh no longer has a default AGENTRL_EXTRAS"
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    assert set(default.group(1).split(",")) <= extras


def test_every_extra_named_in_docs_and_images_exists():
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    missing = [(rel(path), where, extra) for path in TEXT_FILES if path.exists()
               for where, extra in extras_in(path.read_text()) if extra not in extras]
    assert not missing, missing


def test_every_script_referenced_exists():
    missing = []
    for path in TEXT_FILES:
        if not path.exists():
            continue
        for name in re.findall(r"(?<![\w./-])(scripts/[\w.\-]+\.(?:sh|py))", path.read_text()):
            if not (ROOT / name).is_file():
                missing.append((rel(path), name))
    assert not missing, missing


def test_console_script_resolves():
    scripts = PYPROJECT["project"]["scripts"]
    assert "agentrl" in scripts
    module_name, _, attr = scripts["agentrl"].partition(":")
    assert callable(getattr(importlib.import_module(module_name), attr))


def test_docs_index_lists_every_doc():
    index = (ROOT / "docs" / "README.md").read_text()
    linked = set(re.findall(r"\]\(([\w\-]+\.md)\)", index))
    present = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert present <= linked, f"docs/README.md does not list {sorted(present - linked)}"


def test_relative_markdown_links_resolve():
    missing = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docker").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            resolved = (path.parent / target).resolve()
            if not resolved.exists() and rel(resolved) not in PENDING_DOCS:
                missing.append((rel(path), target))
    assert not missing, missing


def test_qwen15b_architecture_is_known_for_random_init():
    from agentrl.models.architectures import QWEN25_ARCHITECTURES

    assert "Qwen/Qwen2.5-1.5B-Instruct" in QWEN25_ARCHITECTURES


def test_ci_runs_the_readme_test_command_with_durations():
    """.ci/run calls exactly the README's test command (the one docs/quickstart.md repeats), which
    shows the slowest tests (`--durations`)."""
    readme = re.search(r"# 2\. set up \./\.venv and run the test suite.*\n(.*)\n", (ROOT / "README.md").read_text())
    command = readme.group(1).strip()
    assert "--durations=" in command and command.endswith(" tests"), command
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-1] == command, (ci[-1], command)
    assert command in (ROOT / "docs" / "quickstart.md").read_text()
