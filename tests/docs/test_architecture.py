"""docs/ARCHITECTURE.md's rules of who imports whom hold in the source: the library never
imports a command (only ``bench/``, the subcommands of ``scratchgpt bench``, takes the
commands' flag types), and ``errors.py`` is the leaf the other leaves stand on."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "scratchgpt"


def imported(path: Path, top_level_only: bool = False) -> set[str]:
    """The ``scratchgpt`` modules ``path`` imports (anywhere, or at module level only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n == "scratchgpt" or n.startswith("scratchgpt.")}


def library_modules() -> list[Path]:
    """Every module but the command line's: cli.py, commands/ and bench/."""
    return [p for p in sorted(PACKAGE.rglob("*.py"))
            if p.relative_to(PACKAGE).parts[0] not in ("commands", "bench", "cli.py")]


def test_the_library_never_imports_a_command() -> None:
    offenders = {str(p.relative_to(PACKAGE)): sorted(m for m in imported(p)
                                                     if m.startswith("scratchgpt.commands"))
                 for p in library_modules()}
    assert not {k: v for k, v in offenders.items() if v}
    assert library_modules(), "the walk found the package"


SHARED = {"scratchgpt.commands.argtypes", "scratchgpt.commands.options",
          "scratchgpt.commands.prompts"}  # the commands' shared flag types and helpers


def test_bench_takes_only_the_commands_shared_flag_helpers() -> None:
    shared = SHARED
    for path in sorted((PACKAGE / "bench").glob("*.py")):
        taken = {m for m in imported(path) if m.startswith("scratchgpt.commands")}
        assert taken <= shared, (path.name, taken - shared)


def test_errors_is_a_leaf_and_validation_and_chat_stand_on_it_alone() -> None:
    assert imported(PACKAGE / "errors.py") == set()
    assert imported(PACKAGE / "paths.py") == set()  # the cache directory, for every layer
    assert imported(PACKAGE / "wording.py") == set()  # counts in messages, for every layer
    assert imported(PACKAGE / "bars.py") == set()  # progress bars, for every layer
    assert imported(PACKAGE / "validation.py") == {"scratchgpt.errors"}
    # chat.py reads a Hugging Face directory's template through checkpoints/hf.py, on call
    assert imported(PACKAGE / "chat.py", top_level_only=True) == {"scratchgpt.errors"}
    assert imported(PACKAGE / "chat.py") == {"scratchgpt.errors", "scratchgpt.checkpoints.hf"}


def test_no_command_imports_another() -> None:
    shared = SHARED
    commands = sorted((PACKAGE / "commands").glob("*.py"))
    for path in commands:
        taken = {m for m in imported(path) if m.startswith("scratchgpt.commands")}
        assert taken <= shared, (path.name, taken - shared)
    assert len(commands) > 10, "the walk found the commands"


def test_models_and_tokenizers_stand_on_the_leaves_alone() -> None:
    """The bottom row: a network or a tokenizer imports no training, data or generation."""
    leaves = {"scratchgpt.errors", "scratchgpt.validation", "scratchgpt.paths",
              "scratchgpt.wording", "scratchgpt.bars"}
    for part in ("models", "tokenizers"):
        for path in sorted((PACKAGE / part).rglob("*.py")):
            outside = {m for m in imported(path)
                       if m not in leaves and not m.startswith(f"scratchgpt.{part}")}
            assert not outside, (str(path.relative_to(PACKAGE)), outside)


def test_the_readmes_layout_names_every_module_of_the_parts_it_lists_file_by_file() -> None:
    """README.md's Layout lists these parts' modules one by one; it had fallen behind (the
    optimizers, the curriculum, the block kernels were missing)."""
    readme = (PACKAGE.parents[1] / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"[A-Za-z_0-9]+", layout))
    missing = [f"{part}/{path.name}"
               for part in ("models", "training", "generation", "data", "tokenizers",
                            "checkpoints")
               for path in sorted((PACKAGE / part).glob("*.[pch]*"))
               if path.suffix in (".py", ".c", ".h") and path.stem != "__init__"
               and path.stem not in named]
    assert not missing, missing
