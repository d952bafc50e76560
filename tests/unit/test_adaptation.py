"""A vendor's case adaptation read without running it, and the guide's forbidden changes refused in one line."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest
import torch

from flagperf.config.adaptation import (
    REQUIREMENTS_FILES,
    TREE_LIMITS,
    check_extern,
    expand_env,
    parse_env_file,
    read_adaptation,
    requirement_files,
    tree_digest,
)
from flagperf.errors import CaseUserError, ConfigError
from flagperf.training.driver import TrainingConfig, TrainingContext

FIXTURE_CASE = Path(__file__).resolve().parents[1] / "fixtures" / "vendor_adaptation" / "cases" / "training" / \
    "adapted-mlp"


def env_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "environment_variables.sh"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_environment_file_is_read_as_data(tmp_path: Path) -> None:
    path = env_file(tmp_path, "# comment\n\nexport A=1\nB='$HOME literal'\nC=\"x:${A}:$MISSING\"\nexport D=$A/lib\n")
    values = parse_env_file(path)
    assert expand_env(values, {"HOME": "/root"}) == {"A": "1", "B": "$HOME literal", "C": "x:1:", "D": "1/lib"}


@pytest.mark.parametrize(("line", "why"), [
    ("source /opt/vendor/env.sh", "sources another script"),
    ("export A=$(cat /etc/passwd)", "shell syntax"),
    ("A=`id`", "shell syntax"),
    ('A="$(id)"', "nothing is run"),
    ("A=x; rm -rf /", "shell syntax"),
    ("A=${B:-x}", "only $NAME and ${NAME}"),
    ("PYTHONPATH=/x", "set by the engine"),
    ("f() { echo; }", "not an assignment"),
    # FlagPerf sources the file, and its vendors' files source their toolkit's script: said where that goes instead.
    ("source /usr/local/corex/set_env.sh", "put the toolkit's environment in the image (ENV lines of the Dockerfile)"),
    (". ./env.sh", "sources another script, which is never run here"),
])
def test_anything_but_an_assignment_is_refused_naming_file_and_line(tmp_path: Path, line: str, why: str) -> None:
    path = env_file(tmp_path, f"export OK=1\n{line}\n")
    with pytest.raises(ConfigError) as info:
        parse_env_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}: line 2:") and why in message and "\n" not in message


def test_the_fixture_adaptation_is_read_with_every_point() -> None:
    adaptation = read_adaptation(FIXTURE_CASE, "adapted-mlp", "training", "testvendor")
    assert adaptation is not None
    assert adaptation.env == {"TESTVENDOR_MODE": "fast", "TESTVENDOR_PATHS": "/opt/testvendor/lib:${TESTVENDOR_MODE}"}
    assert adaptation.requirements is not None and adaptation.csrc is not None
    assert adaptation.hooks == ("wrap_model", "make_optimizer", "setup_distributed", "on_step")
    assert read_adaptation(FIXTURE_CASE, "adapted-mlp", "training", "nobody") is None


def adapted_case(tmp_path: Path) -> Path:
    """A case folder whose vendor "v" adapts it with csrc/setup.py and extern/hooks.py; returns the case folder."""
    folder = tmp_path / "case" / "vendor" / "v"
    (folder / "csrc").mkdir(parents=True)
    (folder / "csrc" / "setup.py").write_text("from setuptools import setup\nsetup(name='x')\n", encoding="utf-8")
    (folder / "extern").mkdir()
    (folder / "extern" / "hooks.py").write_text("def on_step(ctx, step):\n    return None\n", encoding="utf-8")
    return tmp_path / "case"


def refusal(case: Path) -> str:
    with pytest.raises(ConfigError) as info:
        read_adaptation(case, "c", "training", "v")
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("what", ["csrc", "extern"])
def test_a_huge_file_in_an_adaptation_folder_is_refused_unread(tmp_path: Path, what: str) -> None:
    """A file past the folder's byte limit (a hole: no disk used, and never read) is refused naming the folder and
    the file; one byte less in all is read."""
    case = adapted_case(tmp_path)
    folder = case / "vendor" / "v" / what
    _, max_bytes = TREE_LIMITS[what]
    used = sum(p.stat().st_size for p in folder.iterdir())
    huge = folder / "blob.bin"
    with huge.open("wb") as out:
        out.truncate(max_bytes - used)
    assert read_adaptation(case, "c", "training", "v") is not None
    with huge.open("ab") as out:
        out.truncate(max_bytes - used + 1)
    message = refusal(case)
    assert message.startswith(f"{folder}: ") and f"more than {max_bytes >> 20} MiB" in message and "blob.bin" in message


def test_the_wheels_beside_requirements_are_bounded_as_a_folder(tmp_path: Path) -> None:
    """What requirements.txt may name beside it (a wheel, a wheelhouse folder) is hashed every round and installed
    on every host: bounded as csrc/ is, the wheel a hole (no disk used, never read). Files it cannot name (notes,
    csrc/, extern/) do not count; an sdist (.tar.gz) does, and is in the install's cache key."""
    case = adapted_case(tmp_path)
    folder = case / "vendor" / "v"
    (folder / "requirements.txt").write_text("--no-index\n--find-links wheels\nvendor-kernels==1.0\n")
    (folder / "wheels").mkdir()
    (folder / "wheels" / "vendor_kernels-1.0.tar.gz").write_bytes(b"sdist")
    (folder / "README.md").write_bytes(b"x" * 4096)  # not a file pip may be named: not counted
    _, max_bytes = TREE_LIMITS[REQUIREMENTS_FILES]
    used = (folder / "requirements.txt").stat().st_size + 5
    wheel = folder / "torch-2.9.0-cp311-cp311-linux_x86_64.whl"
    with wheel.open("wb") as out:
        out.truncate(max_bytes - used)
    assert read_adaptation(case, "c", "training", "v") is not None
    assert requirement_files(folder) == [folder / "requirements.txt", wheel, folder / "wheels"]
    with wheel.open("ab") as out:
        out.truncate(max_bytes - used + 1)
    message = refusal(case)
    assert message.startswith(f"{folder}: ") and f"more than {max_bytes >> 20} MiB" in message
    assert "past it at" in message and "beside requirements.txt" in message  # at the file walked last
    wheel.unlink()
    before = tree_digest(*requirement_files(folder))
    (folder / "wheels" / "vendor_kernels-1.0.tar.gz").write_bytes(b"sdist, changed")
    assert tree_digest(*requirement_files(folder)) != before


def test_an_adaptation_folder_of_too_many_files_is_refused(tmp_path: Path) -> None:
    case = adapted_case(tmp_path)
    folder = case / "vendor" / "v" / "extern"
    max_entries, _ = TREE_LIMITS["extern"]
    for i in range(max_entries - 1):  # with hooks.py: exactly the limit
        (folder / f"f{i}.txt").touch()
    assert read_adaptation(case, "c", "training", "v") is not None
    (folder / "one-more.txt").touch()
    assert f"more than {max_entries} files and folders" in refusal(case)


def test_links_count_as_the_copy_follows_them(tmp_path: Path) -> None:
    """A build copies what links point to: a few links that expand to many copies count as those copies, and a
    link to a folder that holds it (a copy that would never end) is refused by name."""
    case = adapted_case(tmp_path)
    csrc = case / "vendor" / "v" / "csrc"
    (csrc / "d0").mkdir()
    (csrc / "d0" / "x.c").touch()
    for level in range(1, 16):  # 30 links, 2**15 copies of x.c
        (csrc / f"d{level}").mkdir()
        for name in ("a", "b"):
            (csrc / f"d{level}" / name).symlink_to(f"../d{level - 1}")
    assert f"more than {TREE_LIMITS['csrc'][0]} files and folders" in refusal(case)
    for level in range(2, 16):
        for name in ("a", "b"):
            (csrc / f"d{level}" / name).unlink()
    assert read_adaptation(case, "c", "training", "v") is not None  # d1's two links to d0: allowed
    (csrc / "d0" / "up").symlink_to("..")
    message = refusal(case)  # found as d0/up or as d1/a/up, whichever the listing gives first
    assert message.startswith(f"{csrc}/d") and "/up: a link to a folder that holds it (a loop)" in message


def test_the_content_key_reads_files_in_pieces_with_the_same_digest(tmp_path: Path) -> None:
    folder = tmp_path / "csrc"
    folder.mkdir()
    (folder / "big.bin").write_bytes(os.urandom(3 << 20))
    (folder / "setup.py").write_text("x", encoding="utf-8")
    whole = hashlib.sha256()
    for name in ("big.bin", "setup.py"):  # the key's form: F name NUL content NUL, by relative path
        whole.update(b"F" + name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    whole.update(b"Skey\0")
    assert tree_digest(folder, "key") == whole.hexdigest()


@pytest.mark.parametrize(("code", "why"), [
    ("import torch\ndef wrap_model(model, ctx):\n    model.load_state_dict(torch.load('w.pt'))\n    return model\n",
     "line 3: load_state_dict: loads weights"),
    ("import torch\ndef wrap_model(model, ctx):\n    torch.load('w.pt')\n    return model\n", "line 3: torch.load"),
    ("from torch.utils.data import DataLoader\ndef on_step(ctx, step):\n    pass\n", "line 1: DataLoader"),
    ("def build_dataset(config):\n    return None\n", "line 1: build_dataset is not an extension point"),
    ("def wrap_modle(model, ctx):\n    return model\n", "line 1: wrap_modle is not an extension point of the "
                                                         "training family (did you mean wrap_model? known: "),
    ("def _helper():\n    pass\n", "defines no hook"),
    ("def wrap_model(model, ctx)\n    return model\n", "invalid Python"),
])
def test_extern_code_that_would_change_what_is_forbidden_is_refused(tmp_path: Path, code: str, why: str) -> None:
    extern = tmp_path / "extern"
    extern.mkdir()
    (extern / "hooks.py").write_text(code, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        check_extern(extern, "training")
    assert why in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_every_forbidden_name_of_every_extern_file_is_named_at_once(tmp_path: Path) -> None:
    """check_extern stopped at the first forbidden name of the first file: a vendor fixed one, ran the check again,
    met the next. Every one is now named at once, as the hooks' own findings are: file, line and name each, the
    hooks' findings with them, and a file that is no Python among them."""
    from flagperf.errors import findings

    extern = tmp_path / "extern"
    (extern / "kernels").mkdir(parents=True)
    hooks = extern / "hooks.py"
    hooks.write_text("import torch\nfrom torch.utils.data import DataLoader\ndef wrap_model(model, ctx):\n"
                     "    model.load_state_dict(torch.load('w.pt'))\n    return model\ndef on_step(ctx):\n    pass\n",
                     encoding="utf-8")
    loader = extern / "kernels" / "loader.py"
    loader.write_text("def fetch(path):\n    return from_pretrained(path)\n", encoding="utf-8")
    broken = extern / "kernels" / "broken.py"
    broken.write_text("def f(:\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        check_extern(extern, "training")
    lines = [str(finding) for finding in findings(info.value)]
    assert lines == [
        f"{hooks}: line 2: DataLoader: builds a data loader: the data set is not the vendor's to change",
        f"{hooks}: line 4: load_state_dict: loads weights: the initial checkpoint is not the vendor's to change",
        f"{hooks}: line 4: torch.load loads weights: the initial checkpoint is not the vendor's to change",
        f"{broken}: line 1: invalid Python: " + lines[3].partition("invalid Python: ")[2],  # the parser's words
        f"{loader}: line 2: from_pretrained: loads pretrained weights: the initial checkpoint is not the vendor's to "
        "change",
        f"{hooks}: line 6: on_step: def on_step(ctx) takes 1 argument(s), but a round calls it as on_step(ctx, step), "
        "with 2 argument(s)",
    ], lines


BAD_HOOKS = """\
import os
from acme.fused import on_step
if os.environ.get("ACME_FUSED"):
    def make_optimizer(cls, params, kwargs, ctx):
        return cls(params, **kwargs)
def wrap_model(model):
    return model
async def setup_distributed(device_type, backend):
    return backend
"""


def test_a_hook_a_round_could_not_call_is_named_with_its_function_all_at_once(tmp_path: Path) -> None:
    """hooks.py is read, never imported: a hook bound other than by a top-level def (imported, defined inside an if)
    was silently never called, and one of the wrong parameters failed only inside a round, with a TypeError. Each is
    now one line naming the file, the line and the function, all of them at once."""
    from flagperf.errors import findings

    extern = tmp_path / "extern"
    extern.mkdir()
    hooks = extern / "hooks.py"
    hooks.write_text(BAD_HOOKS, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        check_extern(extern, "training")
    lines = [str(finding) for finding in findings(info.value)]
    never = ": a hook is a def at the top of hooks.py (a run reads the file, never runs it, to find its hooks), so " \
            "this one would never be called; write `def "
    assert lines == [
        f"{hooks}: line 2: on_step: imported{never}on_step(ctx, step):` there (it may call what it imports)",
        f"{hooks}: line 4: make_optimizer: defined inside an `if` block{never}make_optimizer(cls, params, kwargs, "
        "ctx):` there (it may call what it imports)",
        f"{hooks}: line 6: wrap_model: def wrap_model(model) takes 1 argument(s), but a round calls it as "
        "wrap_model(model, ctx), with 2 argument(s)",
        f"{hooks}: line 8: setup_distributed: async def: a round calls it as setup_distributed(device_type, backend), "
        "with 2 argument(s) and uses what it returns, which would be a coroutine",
    ], lines
    for code, why in (("def on_step(ctx, step, extra):\n    pass\n", "needs 3 argument(s), but a round calls it as "
                                                                     "on_step(ctx, step), with 2"),
                      ("def on_step(ctx, step, *, mode):\n    pass\n", "needs the keyword argument(s) mode"),
                      ("def engine_forward(engine, inputs):\n    pass\n", "a round calls it as "
                                                                           "engine_forward(standard, engine, inputs)")):
        hooks.write_text(code, encoding="utf-8")
        with pytest.raises(ConfigError, match=re.escape(why)):
            check_extern(extern, "inference" if "engine" in code else "training")
    # A round calls hooks positionally: other names, defaults, *args and keywords with defaults all take the call.
    hooks.write_text("def wrap_model(m, c, scale=1.0, *, fuse=True):\n    return m\n"
                     "def on_step(*args):\n    pass\n"
                     "def make_optimizer(cls, params, kwargs, ctx, /):\n    return cls(params, **kwargs)\n",
                     encoding="utf-8")
    assert check_extern(extern, "training") == ("wrap_model", "on_step", "make_optimizer")



NEVER = ": a hook is a def at the top of hooks.py (a run reads the file, never runs it, to find its hooks), so this " \
        "one would never be called; write `def on_step(ctx, step):` there (it may call what it imports)"


@pytest.mark.parametrize(("code", "lines"), [
    # A def of a hook's name in a class or a function under a top-level block binds no name of the module: it was
    # taken for a hook defined inside the block.
    ("import os\nif os.environ.get('X'):\n    class Fused:\n        def on_step(self, ctx, step):\n            pass\n"
     "try:\n    def _make():\n        def on_step(ctx, step):\n            pass\n        return on_step\n"
     "except ImportError:\n    pass\ndef wrap_model(model, ctx):\n    return model\n", []),
    # A decorator makes what a round calls: the def's own arguments are not those (load_hooks checks the result).
    ("import functools\ndef _fused(fn):\n    @functools.wraps(fn)\n    def run(model, ctx):\n        return fn(model)\n"
     "    return run\n@_fused\ndef wrap_model(model):\n    return model\n", []),
    # Blocks the check did not look into: except*, match, async with (the file would not even import).
    ("try:\n    pass\nexcept* ImportError:\n    def on_step(ctx, step):\n        pass\n",
     [f"line 4: on_step: defined inside a `try` block{NEVER}"]),
    ("match 1:\n    case 1:\n        def on_step(ctx, step):\n            pass\n",
     [f"line 3: on_step: defined inside a `match` block{NEVER}"]),
    ("async with lock as on_step:\n    pass\n",
     [f"line 1: on_step: bound by `with ... as` inside an `async with` block{NEVER}"]),
    # Rebound or deleted after its def: the round called another object, or failed loading the hooks.
    ("def on_step(ctx, step):\n    pass\ndel on_step\n",
     ["line 3: on_step: deleted after its def at line 1: once hooks.py has run there is no on_step, so a round would "
      "fail as it loads the hooks; keep the def, drop the del"]),
    ("def wrap_model(model, ctx):\n    return model\nif True:\n    wrap_model = None\n",
     ["line 4: wrap_model: assigned inside an `if` block after its def at line 1: a round would call what the name "
      "is bound to last, not that def; bind it by the def alone"]),
    # A generator hook returns a generator, never the model (a generator inside a hook is the hook's own business).
    ("def on_step(ctx, step):\n    yield step\ndef wrap_model(model, ctx):\n    def parts():\n        yield model\n"
     "    return model\n",
     ["line 1: on_step: a generator (it yields): a round calls it as on_step(ctx, step), with 2 argument(s) and uses "
      "what it returns, which would be a generator"]),
    # A public def that is no hook is one finding among the others, not the end of the check.
    ("def build(x):\n    pass\ndef on_step(ctx):\n    pass\n",
     ["line 1: build is not an extension point of the training family",
      "line 3: on_step: def on_step(ctx) takes 1 argument(s)"]),
])
def test_only_what_a_run_of_hooks_py_leaves_bound_is_a_hook(tmp_path: Path, code: str, lines: list[str]) -> None:
    """The hooks are what running hooks.py leaves bound, read from the file: its statements and the statement lists
    of its blocks, in order; every finding at once, each one line naming the file and line."""
    from flagperf.errors import findings

    extern = tmp_path / "extern"
    extern.mkdir()
    (extern / "hooks.py").write_text(code, encoding="utf-8")
    if not lines:
        assert check_extern(extern, "training")
        return
    with pytest.raises(ConfigError) as info:
        check_extern(extern, "training")
    found = [str(finding) for finding in findings(info.value)]
    assert len(found) == len(lines), found
    for line, finding in zip(lines, found, strict=True):
        assert finding.startswith(f"{extern / 'hooks.py'}: {line}"), (line, finding)


def test_what_hooks_py_leaves_bound_once_run_is_checked_as_a_round_loads_it(tmp_path: Path) -> None:
    """What reading the file cannot know is checked when the round imports it, before any hook is called: a
    decorator's function that does not take the round's call, a name the file removed as it ran. Each is one line
    naming hooks.py (it was a TypeError inside the round, or an AttributeError traceback at load)."""
    from flagperf.config.adaptation import Adaptation, decorated_hooks, load_hooks

    extern = tmp_path / "extern"
    extern.mkdir()
    hooks = extern / "hooks.py"
    cases = {
        "def _one(fn):\n    def run(model):\n        return fn(model, None)\n    return run\n@_one\n"
        "def wrap_model(model, ctx):\n    return model\n":
            "wrap_model: its signature once hooks.py has run, wrap_model(model), does not take the call (too many "
            "positional arguments): a round calls it as wrap_model(model, ctx)",
        "def on_step(ctx, step):\n    pass\nglobals().pop('on_step')\n":
            "on_step: not defined once hooks.py has run (it deleted the name as it ran): a round calls it as "
            "on_step(ctx, step)",
    }
    for number, (code, why) in enumerate(cases.items()):
        hooks.write_text(code, encoding="utf-8")
        adaptation = Adaptation(f"case{number}", "training", "v", tmp_path, extern=extern,
                                hooks=check_extern(extern, "training"))
        with pytest.raises(ConfigError) as info:
            load_hooks(adaptation)
        assert str(info.value) == f"{hooks}: {why}", str(info.value)
    assert decorated_hooks(extern, "training") == {}
    hooks.write_text("import functools\ndef _timed(fn):\n    @functools.wraps(fn)\n    def run(*args):\n"
                     "        return fn(*args)\n    return run\n@_timed\ndef on_step(ctx, step):\n    pass\n")
    assert decorated_hooks(extern, "training") == {"on_step": 8}  # the def's line
    loaded = load_hooks(Adaptation("timed", "training", "v", tmp_path, extern=extern,
                                   hooks=check_extern(extern, "training")))
    assert loaded["on_step"](None, 1) is None

def test_a_decoding_model_forward_may_yield(tmp_path: Path) -> None:
    """A decoding inference case's model_forward is a generator (the contract consumes one per token), and
    `yield from standard(...)` is how a hook keeps a context open while it decodes: neither the file's check nor the
    round's load refuses it (a training hook that yields still is refused, above)."""
    from flagperf.config.adaptation import Adaptation, load_hooks

    extern = tmp_path / "extern"
    extern.mkdir()
    (extern / "hooks.py").write_text("import contextlib\ndef model_forward(standard, model, inputs):\n"
                                     "    with contextlib.nullcontext():\n        yield from standard(model, inputs)\n",
                                     encoding="utf-8")
    hooks = check_extern(extern, "inference")
    assert "model_forward" in hooks
    loaded = load_hooks(Adaptation("decode", "inference", "v", tmp_path, extern=extern, hooks=hooks))
    assert list(loaded["model_forward"](lambda model, inputs: iter([model, inputs]), 1, 2)) == [1, 2]


def test_the_hook_check_reads_no_syntax_a_python_3_10_container_lacks() -> None:
    """try/except* (ast.TryStar) is Python 3.11's: the module must import where ast lacks it (in a process of its
    own, so that no class of this session is made twice)."""
    import subprocess
    import sys

    code = ("import ast; del ast.TryStar\nimport flagperf.config.adaptation as a\n"
            "assert a._TRIES == (ast.Try,), a._TRIES")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_each_hook_signature_is_the_one_its_description_shows() -> None:
    from flagperf.config.adaptation import EXTERN_HOOKS, HOOK_PARAMETERS

    described = {name: text for points in EXTERN_HOOKS.values() for name, text in points.items()}
    assert described.keys() == HOOK_PARAMETERS.keys()
    for name, parameters in HOOK_PARAMETERS.items():
        assert described[name].startswith(f"{name}({', '.join(parameters)}) -> "), name


def test_extern_of_a_family_without_extension_points_is_refused(tmp_path: Path) -> None:
    extern = tmp_path / "extern"
    extern.mkdir()
    (extern / "hooks.py").write_text("def on_step(ctx, step):\n    pass\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="the base family has no extension points"):
        check_extern(extern, "base")


def training_context(tmp_path: Path, **hooks: object) -> TrainingContext:
    config = TrainingConfig(nnodes=1, nproc_per_node=1, max_epochs=1, log_freq=1, master_port=29500, seed=0,
                            target_metric="accuracy", target=0.0, timeout_s=60, max_retries=0)
    stream = (tmp_path / "perf.log").open("w")
    return TrainingContext(config, device=torch.device("cpu"), stream=stream, hooks=hooks)  # type: ignore[arg-type]


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_a_wrap_hook_that_keeps_the_model_is_used_and_listed(tmp_path: Path) -> None:
    class Fused(torch.nn.Module):  # a vendor's module swap: other names, the same parameters
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    ctx = training_context(tmp_path, wrap_model=lambda model, ctx: Fused(model))
    wrapped = ctx.wrap(small_model())
    assert isinstance(wrapped, Fused) and ctx.extra["vendor_hooks"] == ["wrap_model"]


@pytest.mark.parametrize(("hook", "why"), [
    (lambda model, ctx: torch.nn.Sequential(*model, torch.nn.Linear(2, 2)), "structure and size are not"),
    (lambda model, ctx: torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)),
     "initial checkpoint is not"),
    (lambda model, ctx: "not a module", "not a torch module"),
])
def test_a_wrap_hook_that_changes_the_model_is_refused(tmp_path: Path, hook: object, why: str) -> None:
    ctx = training_context(tmp_path, wrap_model=hook)
    with pytest.raises(CaseUserError, match=why) as info:
        ctx.wrap(small_model())
    assert "\n" not in str(info.value)


def test_the_optimizer_hook_must_build_the_class_the_case_asked_for(tmp_path: Path) -> None:
    model = small_model()
    ctx = training_context(tmp_path, make_optimizer=lambda cls, params, kwargs, ctx: cls(params, **kwargs))
    optimizer = ctx.optimizer(torch.optim.SGD, model.parameters(), lr=0.1)
    assert type(optimizer) is torch.optim.SGD and ctx.extra["vendor_hooks"] == ["make_optimizer"]

    other = training_context(tmp_path, make_optimizer=lambda cls, params, kwargs, ctx: torch.optim.Adam(params))
    with pytest.raises(CaseUserError, match="returned Adam, the case asks for SGD: the optimizer type is not"):
        other.optimizer(torch.optim.SGD, model.parameters(), lr=0.1)
    fewer = training_context(tmp_path, make_optimizer=lambda cls, params, kwargs, ctx: cls(params[:1], **kwargs))
    with pytest.raises(CaseUserError, match="does not hold exactly the case's parameters"):
        fewer.optimizer(torch.optim.SGD, model.parameters(), lr=0.1)


def test_the_step_hook_sees_every_step(tmp_path: Path) -> None:
    seen: list[int] = []
    ctx = training_context(tmp_path, on_step=lambda ctx, step: seen.append(step))
    for _ in range(3):
        ctx.step(4, loss=1.0)
    assert seen == [1, 2, 3]
    assert os.path.getsize(tmp_path / "perf.log") > 0


def test_inference_hooks_wrap_the_cases_own_forward() -> None:
    import types

    from flagperf.entry import hooked_module

    case = types.ModuleType("case")
    case.model_forward = lambda model, inputs: [model * x for x in inputs]  # type: ignore[attr-defined]
    case.engine_forward = lambda engine, inputs: (inputs, 0.0)  # type: ignore[attr-defined]
    calls: list[str] = []

    def model_forward(standard: object, model: object, inputs: object) -> object:
        calls.append("model_forward")
        return standard(model, inputs)  # type: ignore[operator]

    hooked = hooked_module(case, {"model_forward": model_forward})
    assert hooked.model_forward(2, [1, 3]) == [2, 6] and calls == ["model_forward"]
    assert hooked.engine_forward is case.engine_forward  # type: ignore[attr-defined]
    assert hooked_module(case, {}) is case


def test_inference_hooks_called_are_recorded_at_their_first_call() -> None:
    """The record says which hooks ran: one the file defines but the case never reaches is not in it."""
    import types

    from flagperf.entry import hooked_module

    case = types.ModuleType("case")
    case.model_forward = lambda model, inputs: [model * x for x in inputs]  # type: ignore[attr-defined]
    case.export_model = lambda model, config, path: None  # type: ignore[attr-defined]
    called: list[str] = []
    hooked = hooked_module(case, {"model_forward": lambda standard, model, inputs: standard(model, inputs),
                                  "export_model": lambda standard, model, config, path: None}, called)
    assert called == []
    assert hooked.model_forward(2, [1]) == [2] and hooked.model_forward(3, [1]) == [3]
    assert called == ["model_forward"]


@pytest.mark.parametrize(("line", "why"), [
    ("A=a\x00b", "control character '\\x00'"),
    ('A="red\x1b[31m"', "control character '\\x1b'"),
    ("PREFECT_API_URL=http://elsewhere/api", "set by the engine"),
    ("A=" + "x" * 5000, "a value of at most 4096"),
])
def test_values_no_process_or_log_can_take_are_refused(tmp_path: Path, line: str, why: str) -> None:
    path = env_file(tmp_path, f"export OK=1\n{line}\n")
    with pytest.raises(ConfigError, match="line 2: ") as info:
        parse_env_file(path)
    assert why in str(info.value)


def test_secrets_are_masked_in_the_record(tmp_path: Path) -> None:
    """A token written in the file, and a value taken from a secret of the host, never reach result.json."""
    from flagperf.config.adaptation import Adaptation
    from flagperf.hosts.adaptation import Applied
    from flagperf.hosts.inventory import MASK

    values = parse_env_file(env_file(tmp_path, "HF_TOKEN=hf_written\nMIRROR=https://u:pw@mirror/x\n"
                                               "COPIED=$SERVICE_API_KEY\nMODE=fast\n"))
    applied = Applied(Adaptation("c", "training", "v", tmp_path, env=values),
                      env=expand_env(values, {"SERVICE_API_KEY": "from-the-host"}))
    record = applied.record()
    assert record["env"] == {"HF_TOKEN": MASK, "MIRROR": MASK, "COPIED": MASK, "MODE": "fast"}
    assert record["env_applied"] == {"HF_TOKEN": MASK, "MIRROR": MASK, "COPIED": MASK, "MODE": "fast"}
    assert "from-the-host" not in str(record) and "hf_written" not in str(record)



def test_a_secret_is_masked_however_it_reaches_a_value(tmp_path: Path) -> None:
    """Secrecy is decided in file order, on the value as applied too and through every line on: the host's index URL
    with its password copied (MIRROR=$PIP_INDEX_URL: neither name nor written value says so), a host's token copied
    and that copy copied again (B=x$A, C=${B}/y) were each recorded in the clear. A literal dollar ('$HF_TOKEN'
    single-quoted) refers to nothing and stays as it is."""
    from flagperf.config.adaptation import Adaptation
    from flagperf.hosts.adaptation import Applied
    from flagperf.hosts.inventory import MASK

    values = parse_env_file(env_file(tmp_path, "MIRROR=$PIP_INDEX_URL\nA=$HF_TOKEN\nB=x$A\nC=${B}/y\n"
                                               "LITERAL='$HF_TOKEN'\nMODE=fast\nUSES_MODE=$MODE-1\n"))
    host = {"PIP_INDEX_URL": "https://bob:hunter2@mirror.example/simple", "HF_TOKEN": "hf_from_the_host"}
    record = Applied(Adaptation("c", "training", "v", tmp_path, env=values), env=expand_env(values, host)).record()
    masked = {"MIRROR": MASK, "A": MASK, "B": MASK, "C": MASK}
    assert record["env"] == {**masked, "LITERAL": "$$HF_TOKEN", "MODE": "fast", "USES_MODE": "$MODE-1"}
    assert record["env_applied"] == {**masked, "LITERAL": "$HF_TOKEN", "MODE": "fast", "USES_MODE": "fast-1"}
    assert "hunter2" not in str(record) and "hf_from_the_host" not in str(record)

OPS_C = """\
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "xin_ops", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_xin_ops(void) { return PyModule_Create(&module); }
"""


@pytest.mark.parametrize(("source", "compiler", "setup_import", "cause"), [
    (OPS_C + "this is not C;\n", None, "", r"ops\.c:5:\d+: error: "),
    # An image without a compiler (a minimal base): the cause is the compiler setuptools could not start.
    (OPS_C, "/nonexistent/xin-cc", "", r"error: \[Errno 2\] No such file or directory: '/nonexistent/xin-cc'$"),
    # A setup.py importing what the image lacks (torch, for its cpp_extension): pip's "error:
    # metadata-generation-failed" was quoted, not the traceback's last line.
    (OPS_C, None, "import xin_missing_torch\n", r"ModuleNotFoundError: No module named 'xin_missing_torch'$"),
], ids=["compiler-diagnostic", "no-compiler", "setup-import"])
def test_a_failed_csrc_build_names_its_cause_not_pips_last_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               source: str, compiler: str | None, setup_import: str,
                                                               cause: str) -> None:
    """A real pip build of csrc/ that fails: the round's one line quoted pip's closing words ("hint: See above for
    output from the failure", "ERROR: Could not build wheels for ..."), which name no cause; it now quotes the
    compiler's first diagnostic, the compiler that could not be started or the setup.py's exception."""
    from flagperf.hosts.adaptation import CSRC_LOG, apply_adaptation

    csrc = tmp_path / "case" / "vendor" / "v" / "csrc"
    csrc.mkdir(parents=True)
    (csrc / "setup.py").write_text(setup_import + "from setuptools import Extension, setup\n"
                                   "setup(name='xin-ops', version='0.1',\n"
                                   "      ext_modules=[Extension('xin_ops', ['ops.c'])])\n")
    (csrc / "ops.c").write_text(source)
    if compiler is not None:
        monkeypatch.setenv("CC", compiler)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # restored after: a build adds to it
    adaptation = read_adaptation(tmp_path / "case", "c", "training", "v")
    assert adaptation is not None
    (tmp_path / "round").mkdir()
    with pytest.raises(CaseUserError) as failed:
        apply_adaptation(adaptation, tmp_path / "round", tmp_path / "cache")
    message = str(failed.value)
    assert message.startswith(f"{csrc / 'setup.py'}: build failed (exit 1); log {CSRC_LOG}: "), message
    assert re.search(cause, message) and "hint:" not in message and "\n" not in message, message
    last = (tmp_path / "round" / CSRC_LOG).read_text().strip().splitlines()[-1].strip()
    assert not re.search(cause, last), last  # what the line quoted: pip's closing words


PIP_CLOSING = ("  note: This error originates from a subprocess, and is likely not a problem with pip.\n"
               "  ERROR: Failed building wheel for xin-ops\n")


@pytest.mark.parametrize(("log", "cause"), [
    # nvcc's diagnostics name the line in parentheses; setuptools' "error: command ... failed" came after them.
    ("  building 'xin_ops' extension\n  /usr/local/cuda/bin/nvcc -c ops.cu -o build/ops.o\n"
     "  ops.cu(3): error: identifier \"undefined_thing\" is undefined\n\n"
     "  1 error detected in the compilation of \"ops.cu\".\n"
     "  error: command '/usr/local/cuda/bin/nvcc' failed with exit code 2\n  [end of output]\n" + PIP_CLOSING,
     'ops.cu(3): error: identifier "undefined_thing" is undefined'),
    # A traceback's exception line: "RuntimeError" holds "Error" inside a word, and pip's "status 'error'" and
    # "error: metadata-generation-failed" come after it.
    ("  Preparing metadata (pyproject.toml): finished with status 'error'\n  error: subprocess-exited-with-error\n"
     "      Traceback (most recent call last):\n        File \"<string>\", line 4, in <module>\n"
     "      RuntimeError: CUDA_HOME is unset: nvcc not found\n      [end of output]\n"
     "error: metadata-generation-failed\n\u00d7 Encountered error while generating package metadata.\n"
     "note: This is an issue with the package mentioned above, not pip.\nhint: See above for details.\n",
     "RuntimeError: CUDA_HOME is unset: nvcc not found"),
    ("  error: subprocess-exited-with-error\n      ImportError: libcudart.so.12: cannot open shared object file\n"
     "      [end of output]\nerror: metadata-generation-failed\n",
     "ImportError: libcudart.so.12: cannot open shared object file"),
], ids=["nvcc", "traceback", "metadata-generation-failed"])
def test_the_failed_builds_line_is_its_cause(tmp_path: Path, log: str, cause: str) -> None:
    """Log shapes no compiler here writes (nvcc) or that vary with the setup.py: the line a failed build's error
    quotes is the cause, not setuptools' or pip's wrapper after it."""
    from flagperf.hosts.adaptation import _last_line

    path = tmp_path / "build.log"
    path.write_text(log, encoding="utf-8")
    assert _last_line(path) == cause


def test_an_adaptation_in_the_vendors_own_folder_is_read_and_may_not_lead_out_of_it(tmp_path: Path) -> None:
    """<vendor folder>/cases/<family>/<case>/ holds what the case's vendor/<vendor>/ would (a vendor kept in its
    own repository); a link on the way to it that leads out of the vendor folder is refused, as one out of the
    case folder is for the case's own place."""
    case = tmp_path / "cases" / "training" / "mlp"
    case.mkdir(parents=True)
    vendor = tmp_path / "vendors" / "acme"
    kept = vendor / "cases" / "training" / "mlp"
    kept.mkdir(parents=True)
    env_file(kept, "export ACME=1\n")
    adaptation = read_adaptation(case, "mlp", "training", "acme", vendor)
    assert adaptation is not None and adaptation.folder == kept and adaptation.env == {"ACME": "1"}
    assert read_adaptation(case, "mlp", "training", "acme") is None  # no vendor of that name is found by it
    outside = tmp_path / "elsewhere"
    (vendor / "cases").rename(outside)
    (vendor / "cases").symlink_to(outside)
    with pytest.raises(ConfigError) as info:
        read_adaptation(case, "mlp", "training", "acme", vendor)
    assert str(info.value) == (f"{vendor}/cases/training/mlp: 'cases/training/mlp' is outside the vendor folder (a "
                               f"link to {outside}/training/mlp): it must stay inside the vendor folder")


def test_a_link_in_extern_to_a_file_of_it_does_not_repeat_its_findings(tmp_path: Path) -> None:
    """A link in extern/ to one of its files (kernels/alias.py -> ../hooks.py) had the file's findings named twice,
    once under the link's name. Each file is read once, named by its own name."""
    from flagperf.errors import findings

    extern = tmp_path / "extern"
    (extern / "kernels").mkdir(parents=True)
    hooks = extern / "hooks.py"
    hooks.write_text("import torch\ndef wrap_model(model, ctx):\n    return torch.load('w.pt')\n", encoding="utf-8")
    (extern / "kernels" / "alias.py").symlink_to(os.path.join("..", "hooks.py"))
    (extern / "a_first.py").symlink_to("hooks.py")  # sorts before hooks.py: still named by hooks.py
    with pytest.raises(ConfigError) as info:
        check_extern(extern, "training")
    lines = [str(finding) for finding in findings(info.value)]
    assert lines == [f"{hooks}: line 3: torch.load loads weights: the initial checkpoint is not the vendor's to "
                     "change"], lines


def test_extern_files_in_a_linked_folder_are_read_and_a_link_out_is_refused(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """check_extern read extern/'s files by Path.rglob, which passes over a linked folder: a forbidden name in a file
    a round imports through extern/lib -> ../shared went unnamed, and so did the link out of extern/. Links are now
    followed inside extern/ (a loop of them walked once), one leading out is refused, and the walk is bounded."""
    import flagperf.config.adaptation as adaptation
    from flagperf.errors import findings

    vendor = tmp_path / "vendor" / "acme"
    extern = vendor / "extern"
    (extern / "kernels").mkdir(parents=True)
    (extern / "hooks.py").write_text("def on_step(ctx, step):\n    return None\n", encoding="utf-8")
    loader = extern / "kernels" / "loader.py"
    loader.write_text("from torch.utils.data import DataLoader\n", encoding="utf-8")
    (extern / "fused").symlink_to("kernels")  # the same files by another name: said once, by their own
    (extern / "kernels" / "back").symlink_to("..")  # a loop
    shared = vendor / "shared"
    shared.mkdir()
    (shared / "weights.py").write_text("def get(m, p):\n    m.load_state_dict(p)\n", encoding="utf-8")
    (extern / "lib").symlink_to(os.path.join("..", "shared"))

    def lines() -> list[str]:
        with pytest.raises(ConfigError) as info:
            check_extern(extern, "training")
        return [str(finding) for finding in findings(info.value)]

    assert lines() == [
        f"{extern / 'lib'}: 'lib' is outside the extern folder (a link to {shared}): it must stay inside the extern "
        "folder",
        f"{loader}: line 1: DataLoader: builds a data loader: the data set is not the vendor's to change"]
    (extern / "lib").unlink()
    (extern / "kernels" / "shared").symlink_to(os.path.join("..", "lib-real"))
    real = extern / "lib-real"
    real.mkdir()
    (real / "weights.py").write_text((shared / "weights.py").read_text(encoding="utf-8"), encoding="utf-8")
    (extern / "hooks.py").write_text("from lib_real import weights\n\ndef on_step(ctx, step):\n    return None\n",
                                     encoding="utf-8")
    (extern / "lib").symlink_to("lib-real")  # inside extern/: followed, its file read once, by its own name
    assert lines() == [
        f"{loader}: line 1: DataLoader: builds a data loader: the data set is not the vendor's to change",
        f"{real / 'weights.py'}: line 2: load_state_dict: loads weights: the initial checkpoint is not the vendor's to "
        "change"]
    monkeypatch.setattr(adaptation, "LINK_WALK_LIMIT", 3)
    assert f"{extern}: its links were looked through for the first 3 paths only, the rest not checked (a data set " \
           "in the folder?); keep data out of it" in lines()
