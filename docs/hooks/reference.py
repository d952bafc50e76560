"""mkdocs hook: the reference pages are generated from the code at build time, never written by hand.

  reference/configuration.md   every key of every configuration file, from the pydantic models that read them
                               (and each case's own keys with their defaults, from its case.yaml)
  reference/cli.md             every command and option of `flagperf`, from the typer app
  reference/results-schema.md  result.json, from flagperf/results/schema.py

Case code is never imported (a case's Config lives in its folder): the per-case tables come from the YAML.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[2]

PAGES = {
    "reference/configuration.md": "configuration_page",
    "reference/cli.md": "cli_page",
    "reference/results-schema.md": "results_page",
}


def _type_name(annotation: Any) -> str:
    """A field's type as a reader would write it: `int | None`, `list[str]`, `Literal["a", "b"]` as `"a" | "b"`."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f'`{value!r}`'.replace("'", '"') for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is not None:
        args = ", ".join(_type_name(arg).strip("`") for arg in typing.get_args(annotation))
        return f"`{getattr(origin, '__name__', str(origin))}[{args}]`"
    if annotation is type(None):
        return "`null`"
    if inspect.isclass(annotation):
        return f"`{annotation.__name__}`"
    return f"`{annotation}`".replace("typing.", "")


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    return f"`{value!r}`" if value not in ("", None) else ("`null`" if value is None else '`""`')


def model_table(model: type[BaseModel], own_only: bool = False) -> str:
    """One row per field: key, type, default, description (the model's own fields when own_only)."""
    inherited: set[str] = set()
    if own_only:
        for base in model.__mro__[1:]:
            inherited |= set(getattr(base, "model_fields", {}))
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if name in inherited:
            continue
        rows.append(f"| `{name}` | {_type_name(field.annotation)} | {_cell(_default(field))} | "
                    f"{_cell(field.description or '')} |")
    return "\n".join(rows) if len(rows) > 2 else "(no keys of its own)"


def _doc(model: type) -> str:
    own = model.__dict__.get("__doc__")  # not pydantic's BaseModel docstring, which a model without one inherits
    return " ".join(inspect.cleandoc(own).split("\n\n")[0].split()) if own else ""


def _models() -> list[tuple[str, str, type[BaseModel], bool]]:
    """(section, file it reads, model, own fields only): every configuration model a user writes for."""
    from flagperf.basespec import capacity, collective, copy, gemm, toolkit, transfer
    from flagperf.config.engines import EngineManifest
    from flagperf.config.models import CaseConfig, CaseManifest, SuiteFile
    from flagperf.config.vendors import ContainerOptions, DeviceRequestEntry, MonitorEntry, VendorManifest
    from flagperf.generate.config import GenerateConfig
    from flagperf.hosts import inventory
    from flagperf.inference.config import InferenceConfig
    from flagperf.measure.casekit import TimedCaseConfig
    from flagperf.training.config import TrainingConfig

    models: list[tuple[str, str, type[BaseModel], bool]] = [
        ("Suite", "deployments/suites/<name>.yaml", SuiteFile, False),
        ("Case manifest", "cases/<family>/<case>/case.yaml", CaseManifest, False),
        ("Every case", "case.yaml `configurations`", CaseConfig, False),
        ("Timed cases (base specs)", "case.yaml `configurations`", TimedCaseConfig, True),
        ("GEMM kernel (computation-*)", "case.yaml `configurations`", gemm.Config, True),
        ("Memory copy kernel", "case.yaml `configurations`", copy.Config, True),
        ("Host-device transfer kernel", "case.yaml `configurations`", transfer.Config, True),
        ("Memory capacity kernel", "case.yaml `configurations`", capacity.Config, True),
        ("Collective kernel (interconnect-*)", "case.yaml `configurations`", collective.Config, True),
        ("Vendor toolkit kernel", "case.yaml `configurations`", toolkit.Config, True),
        ("Training cases", "case.yaml `configurations`", TrainingConfig, True),
        ("Inference cases", "configurations.yaml / parameters.yaml", InferenceConfig, True),
        ("Generate cases", "case.yaml `configurations`", GenerateConfig, True),
        ("Vendor", "vendor_images/<vendor>/vendor.yaml", VendorManifest, False),
        ("Vendor monitor entry", "vendor.yaml `monitors[]`", MonitorEntry, False),
        ("Vendor container options", "vendor.yaml `container`", ContainerOptions, False),
        ("Vendor device request", "vendor.yaml `container.device_requests[]`", DeviceRequestEntry, False),
        ("Engine", "vendor_images/<vendor>/{engines,generate}/<engine>/engine.yaml", EngineManifest, False),
    ]
    # The inventory's models, whatever they are named: every strict model of the module, in source order.
    for name, model in vars(inventory).items():
        if inspect.isclass(model) and issubclass(model, BaseModel) and model.__module__ == inventory.__name__:
            models.append((f"Inventory: {name}", "deployments/inventories/<name>.yaml", model, False))
    return models


def _case_tables() -> str:
    """Each case's configuration keys and defaults as its files give them (read as YAML, never imported)."""
    from flagperf.config.yamlio import load_yaml_mapping

    out = []
    manifests = sorted(ROOT.glob("cases/*/*/case.yaml")) + sorted(ROOT.glob("cases/inference/*/configurations.yaml"))
    for manifest in manifests:
        folder = manifest.parent
        data = load_yaml_mapping(manifest)
        configurations = data.get("configurations", data) if manifest.name == "case.yaml" else data
        if not isinstance(configurations, dict):
            continue
        parameters = data.get("parameters", {}) if manifest.name == "case.yaml" else {}
        params_file = folder / "parameters.yaml"
        if params_file.is_file():
            parameters = load_yaml_mapping(params_file)
        family = folder.parent.name
        out.append(f"### {family}/{folder.name}\n")
        out.append("| key | default | kind |\n|---|---|---|")
        for key, value in configurations.items():
            out.append(f"| `{key}` | {_cell(f'`{value!r}`')} | configuration (vendor-overridable) |")
        for key, value in (parameters or {}).items():
            out.append(f"| `{key}` | {_cell(f'`{value!r}`')} | parameter (fixed) |")
        out.append("")
    return "\n".join(out)


def configuration_page() -> str:
    parts = ["# Configuration reference\n",
             "Generated from the models that read each file (`docs/hooks/reference.py`): what a file may "
             "hold, the type (checked strictly: `\"3\"` is not a number, `1` is not `true`), the default and the "
             "meaning. A key not listed is an error naming the file and key.\n"]
    for section, where, model, own_only in _models():
        doc = _doc(model)
        parts.append(f"## {section}\n\n*{where}*" + (f": {doc}" if doc else "") + "\n")
        parts.append(model_table(model, own_only) + "\n")
    parts.append("## Each case's keys and defaults\n\nFrom the case folders; the family's models above say what "
                 "each key means and its type; a case's own keys are described in its folder.\n")
    parts.append(_case_tables())
    return "\n".join(parts)


def _param_type(param: Any) -> str:
    """The option's type, whichever click typer runs on (click's ``type.name``, or typer's own ``bare_type()``)."""
    if hasattr(param, "type"):
        return str(param.type.name)
    return "flag" if getattr(param, "is_flag", False) else str(param.bare_type())


def cli_page() -> str:
    import typer

    from flows.cli import app

    root = typer.main.get_command(app)
    parts = ["# CLI reference\n", "Generated from the `flagperf` command itself (`docs/hooks/reference.py`). "
             "What the commands do and their exit codes: [Commands](../commands.md).\n"]

    def walk(command: Any, path: list[str]) -> None:
        name = " ".join(path)
        parts.append(f"## `{name}`\n\n{_cell(command.help or '')}\n")
        params = [p for p in command.params if p.name != "help"]
        if params:
            parts.append("| argument or option | type | default | help |\n|---|---|---|---|")
            for p in params:
                opts = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts)) if p.param_type_name == "option" \
                    else f"`{(p.name or '').upper()}`"
                default = p.default if not callable(p.default) else None
                default_text = "required" if p.required else ("" if default in (None, (), []) else f"`{default!r}`")
                help_text = getattr(p, "help", "") or ""
                parts.append(f"| {opts} | {_cell(_param_type(p))} | {_cell(default_text)} | {_cell(help_text)} |")
            parts.append("")
        for sub_name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, sub_name])

    walk(root, ["flagperf"])
    return "\n".join(parts)


def results_page() -> str:
    from flagperf.results import schema

    parts = ["# result.json schema\n",
             "Generated from `flagperf/results/schema.py`: every round of every family writes one "
             "`result.json` in this shape (`<case>/round<N>/<host>_noderank<K>/`).\n"]
    models = [m for m in vars(schema).values()
              if inspect.isclass(m) and issubclass(m, BaseModel) and m.__module__ == schema.__name__
              and not m.__name__.startswith("_")]
    order = sorted(models, key=lambda m: (m.__name__ != "RoundResult", inspect.getsourcelines(m)[1]))
    for model in order:
        doc = _doc(model)
        parts.append(f"## {model.__name__}\n\n{doc}\n\n{model_table(model)}\n")
    return "\n".join(parts)


def generate(name: str) -> str:
    return globals()[PAGES[name]]()


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for uri in PAGES:
        files.append(File.generated(config, uri, content=generate(uri)))
    return files


def commands_in(markdown: str) -> list[str]:
    """The shell commands of a page's ```bash, ```sh, ```shell and ```console blocks (comments and continuation
    lines joined; a heredoc's body is a file's text, not commands; in a console block only the `$ ` lines are
    commands, the rest is their output)."""
    commands = []
    for language, block in re.findall(r"```(bash|sh|shell|console)\n(.*?)```", markdown, flags=re.S):
        pending, heredoc = "", None
        for line in block.splitlines():
            if heredoc is not None:
                heredoc = None if line.strip() == heredoc else heredoc
                continue
            if language == "console" and not pending:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            line = pending + line
            pending = ""
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(" ".join(line.split()))
                opened = re.search(r"(?<!<)<<-?\s*['\"]?(\w+)['\"]?", line)  # not a <<< here-string
                heredoc = opened.group(1) if opened else None
    return commands
