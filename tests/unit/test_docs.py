"""The documentation: a README that fits two screens, and a site that builds with --strict (every page in the
nav, every link and anchor found) whose reference pages are generated from the code."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
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
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
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


def test_commands_in_reads_shell_blocks() -> None:
    text = ("x\n```bash\n# a comment\nflagperf run \\\n  --suite smoke   # why\nls\n```\n```yaml\nno: 1\n```\n"
            "```sh\ncat > f.yaml <<'YAML'\nflagperf: not a command\nYAML\nflagperf ls\n```\n"
            "```console\n$ flagperf server \\\n  --port 1\nflagperf output\n```\n")
    assert _hooks().commands_in(text) == ["flagperf run --suite smoke", "ls", "cat > f.yaml <<'YAML'", "flagperf ls",
                                          "flagperf server --port 1"]


def _shell_commands(line: str) -> list[list[str]]:
    """A command line's commands, each as its words: split at `;`, `&&`, `||`, `|`, `&` (spaces or none; not
    inside quotes), with `$(...)` taken out (its options are another program's) and leading `NAME=value`s."""
    lexer = shlex.shlex(re.sub(r"\$\([^)]*\)", "", line), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, ""
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote (prose in a span): words as written
        words = line.split()
    commands: list[list[str]] = [[]]
    for word in words:
        redirect = word == "&" and commands[-1][-1:] and commands[-1][-1].endswith((">", "<"))  # 2>&1
        if word and set(word) <= set(";&|") and not redirect:
            commands.append([])
        elif commands[-1] or not re.fullmatch(r"[A-Za-z_]\w*=.*", word):
            commands[-1].append(word)
    return [command for command in commands if command]


def _flagperf_uses(markdown: str) -> list[list[str]]:
    """Every `flagperf ...` a page shows, as its words: each command that starts with flagperf, in an inline code
    span outside fenced blocks or on a command line of a shell block."""
    lines = [span.replace("\\|", " ")  # a table's `[--baseline RUN \| --history]`: alternatives, not a pipe
             for span in re.findall(r"`([^`\n]*flagperf[^`\n]*)`", re.sub(r"```.*?```", "", markdown, flags=re.S))]
    lines += _hooks().commands_in(markdown)
    return [command for line in lines for command in _shell_commands(line) if command[0] == "flagperf"]


def _placeholder(word: str) -> bool:
    """COMMAND, ..., <name>: a word that stands for what the reader puts there."""
    return word.isupper() or "..." in word or "…" in word or word.startswith("<")


def _stale_flagperf_uses(markdown: str) -> list[str]:
    """A command or option of `flagperf` that a page shows and the CLI does not have (`--help` is every one's).
    An option's value (`--set engine_args=--enforce-eager`) is not an option; a placeholder command is not read."""
    import typer

    from flows.cli import app

    root, stale = typer.main.get_command(app), []
    for use in _flagperf_uses(markdown):
        shown, words, command, path = " ".join(use), use[1:], root, ["flagperf"]
        while words and words[0] in getattr(command, "commands", {}):
            path.append(words[0])
            command = command.commands[words.pop(0)]
        if getattr(command, "commands", None) and words and not words[0].startswith("-"):
            if not _placeholder(words[0]):
                stale.append(f"`{shown}`: {' '.join(path)} has no command {words[0]}")
            continue
        options = {opt: param for param in command.params for opt in [*param.opts, *param.secondary_opts]}
        while words:
            word = words.pop(0).removeprefix("[").removesuffix("]")  # [--out FILE]: a synopsis's optional part
            if word == "--":
                break
            if not re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", word):
                continue
            name = word.split("=", 1)[0]
            if name == "--help":
                continue
            if name not in options:
                stale.append(f"`{shown}`: {' '.join(path)} has no option {name}")
            elif "=" not in word and not getattr(options[name], "is_flag", False) and words:
                words.pop(0)  # the option's value
    return stale


def _yaml_keys(markdown: str) -> set[str]:
    """The keys a page declares in the YAML it shows (its ```yaml blocks and the YAML files its heredocs write):
    each `key:` (also in a flow mapping) and each name of an engine.yaml's `options: [...]`."""
    texts = re.findall(r"```ya?ml\n(.*?)```", markdown, flags=re.S)
    texts += [body for opening, delimiter, body in re.findall(
        r"^([^\n]*<<-?\s*['\"]?(\w+)['\"]?[^\n]*)\n(.*?)^\s*\2\s*$", markdown, flags=re.S | re.M)
        if delimiter == "YAML" or re.search(r"\.ya?ml\b", opening)]
    keys = set()
    for text in texts:
        keys.update(re.findall(r"^\s*(?:-\s+)?([A-Za-z_][\w-]*)\s*:", text, flags=re.M))
        keys.update(re.findall(r"[{,]\s*([A-Za-z_][\w-]*)\s*:", text))
        for listed in re.findall(r"\boptions:\s*\[([^\]]*)\]", text):
            keys.update(name.strip(" '\"") for name in listed.split(","))
    return keys


def _stale_set_keys(markdown: str, configuration: str, cases: set[str]) -> list[str]:
    """A `--set [CASE.]KEY=` whose KEY is in no configuration (the generated reference lists every key of every
    model and case), unless the YAML the page shows declares it (a tutorial's engine adds its own option). CASE is
    the longest case name that prefixes it, as `flagperf run` reads it (case names hold dots: llama3.2-1b-generate),
    among the cases of cases/ and those the page itself writes (its `<case>/case.yaml`); `*.` is every case."""
    from flagperf.config.models import parse_set_override
    from flagperf.errors import ConfigError

    names = sorted(cases | set(re.findall(r"([\w.-]+)/case\.ya?ml", markdown)))
    declared, stale = _yaml_keys(markdown), []
    for dotted in re.findall(r"--set[ =]['\"]?([A-Za-z0-9_.*-]+)=", markdown):
        try:
            override = parse_set_override(f"{dotted.removeprefix('*.')}=", names)
        except ConfigError as exc:
            stale.append(f"--set {dotted}=: {exc.message}")
            continue
        key = override.key.split(".")[0]  # slo.ttft_s: the key is slo, a mapping
        if key.isupper() or f"| `{key}` |" in configuration or key in declared:
            continue
        stale.append(f"--set {dotted}=: no configuration has the key {key}")
    return stale


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_flagperf_command_and_option_the_docs_show_exists() -> None:
    stale = [f"{page.relative_to(ROOT)}: {line}" for page in _pages()
             for line in _stale_flagperf_uses(page.read_text(encoding="utf-8"))]
    assert not stale, "\n".join(stale)
    # The check itself: a renamed option, an unknown command, in a span or a shell block, every command of a line
    # (separators with or without spaces), are caught; another program's options (after a pipe, inside $(...)),
    # another program's word flagperf, an option's value and a placeholder are not flagperf's.
    sample = ("`flagperf run --compile-mode x`, `flagperf vendor inspect X`, `flagperf server --server-name a`\n"
              "```bash\nflagperf compare $(ls --sort=time results | head -n 2) --out x.md | grep --count B\n"
              "createdb -O flagperf prefect; docker exec flagperf list --all\n"
              "flagperf run --set engine_args=--enforce-eager --set 'x=--y' && flagperf COMMAND --help\n"
              "flagperf list cases&&flagperf list cases --sorted;flagperf diagnose r|flagperf vendor lst\n```\n"
              "```sh\nPREFECT_API_URL=x flagperf server --servername a 2>&1 | tee --append log\n```\n"
              "`flagperf ...`, `flagperf run ... --suite smoke`, `flagperf compare A B [--output F]`\n"
              "| `flagperf diagnose RUN [--baseline RUN \\| --histories]` |\n")
    assert _stale_flagperf_uses(sample) == [
        "`flagperf run --compile-mode x`: flagperf run has no option --compile-mode",
        "`flagperf vendor inspect X`: flagperf vendor has no command inspect",
        "`flagperf compare A B [--output F]`: flagperf compare has no option --output",
        "`flagperf diagnose RUN [--baseline RUN --histories]`: flagperf diagnose has no option --histories",
        "`flagperf list cases --sorted`: flagperf list has no option --sorted",
        "`flagperf vendor lst`: flagperf vendor has no command lst",
        "`flagperf server --servername a 2> & 1`: flagperf server has no option --servername"]


def test_every_set_key_the_docs_show_is_a_configuration_key() -> None:
    configuration = _hooks().configuration_page()
    cases = {folder.name for folder in (ROOT / "cases").glob("*/*") if folder.is_dir()}
    stale = [f"{page.relative_to(ROOT)}: {line}" for page in _pages()
             for line in _stale_set_keys(page.read_text(encoding="utf-8"), configuration, cases)]
    assert not stale, "\n".join(stale)
    # operators' compile_mode became inductor_mode: a page that still sets the old key is caught.
    assert _stale_set_keys("`--set op-gemm.compile_mode=max-autotune`", configuration, cases) == [
        "--set op-gemm.compile_mode=: no configuration has the key compile_mode"]
    assert _stale_set_keys("`--set op-gemm.inductor_mode=max-autotune`", configuration, cases) == []
    # A case name holds dots; `*.` is every case; a case the page writes is a case; its YAML declares its keys,
    # a `key:` elsewhere on the page (prose, Python) does not.
    assert _stale_set_keys("`--set llama3.2-1b-generate.max_new_tokens=8`, `--set '*.repeat=2'`",
                           configuration, cases) == []
    assert _stale_set_keys("`--set qwen2.5-7b-generate.max_new_tokens_x=8`", configuration, cases) == [
        "--set qwen2.5-7b-generate.max_new_tokens_x=: no configuration has the key max_new_tokens_x"]
    tutorial = ("```bash\ncat > my-cases/base/my-case/case.yaml <<'YAML'\nname: my-case\nsize_mib: 4\nYAML\n```\n"
                "`--set my-case.size_mib=8`, `--set my-case.sizes_mib=8`\n```python\nclass C:\n    stride: int\n```\n"
                "`--set stride=2`\n")
    assert _stale_set_keys(tutorial, configuration, cases) == [
        "--set my-case.sizes_mib=: no configuration has the key sizes_mib",
        "--set stride=: no configuration has the key stride"]


def test_every_family_is_named_where_the_families_are_listed() -> None:
    """A family folder of cases/ that the concepts page, or the README's list of family pages, leaves out is one a
    newcomer never hears of (the operation family was missing from both)."""
    concepts = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    families_row = next(line for line in concepts.splitlines() if line.startswith("| **family** |"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    pages = {"base": "docs/families/base.md", "inference": "docs/families/inference.md",
             "training": "docs/families/training.md", "generate": "docs/families/generate.md",
             "operation": "docs/operation.md"}
    for family in sorted(folder.name for folder in (ROOT / "cases").iterdir() if folder.is_dir()):
        assert f"`{family}`" in families_row, f"docs/concepts.md's family row does not name {family}"
        assert family in pages, f"cases/{family}/: which page documents this family? (add it to this test)"
        assert f"]({pages[family]})" in readme, f"README.md does not link {pages[family]}, the {family} family's page"
