"""The documentation: a README that fits two screens, and a site that builds with --strict (every page in the
nav, every link and anchor found) whose reference pages are generated from the code."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_LINES = 60  # two screens of a laptop terminal


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_fits_two_screens_and_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    first_block = re.search(r"```bash\n(.*?)```", "\n".join(lines), re.S)
    assert first_block and first_block.group(1).splitlines()[0].startswith("pip install -c constraints.txt -e . &&")
    for link in re.findall(r"\]\(([^)#]+)", "\n".join(lines)):
        if not link.startswith("http"):
            assert (ROOT / link).exists(), f"README.md links to {link}, which does not exist"


def test_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra (part of the test extra)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-4000:]
    for page in ("reference/configuration/index.html", "reference/cli/index.html", "tutorials/first-run/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_configuration_reference_lists_every_key_of_every_model() -> None:
    hooks = _hooks()
    page = hooks.configuration_page()
    for section, _where, model, own_only in hooks._models():
        assert f"## {section}" in page
        inherited = {n for base in model.__mro__[1:] for n in getattr(base, "model_fields", {})} if own_only else set()
        for key in set(model.model_fields) - inherited:
            assert f"| `{key}` |" in page, f"{model.__name__}.{key} is missing from the configuration reference"
    # Each case's own defaults too, read from its files (never by importing its code).
    assert "### generate/tiny-llama-generate" in page and "| `max_new_tokens` | `16` |" in page


def test_cli_reference_lists_every_command_and_option() -> None:
    import typer

    from flows.cli import app

    page = _hooks().cli_page()
    root = typer.main.get_command(app)

    def walk(command, path):
        assert f"## `{' '.join(path)}`" in page
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if param.param_type_name == "option":
                    assert f"`{opt}`" in page, f"{' '.join(path)} {opt}"
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(root, ["flagperf"])


def test_commands_in_reads_bash_blocks() -> None:
    text = "x\n```bash\n# a comment\nflagperf run \\\n  --suite smoke   # why\nls\n```\n```yaml\nno: 1\n```\n"
    assert _hooks().commands_in(text) == ["flagperf run --suite smoke", "ls"]
