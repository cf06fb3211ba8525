"""Every option of every command says what it does in --help."""

import argparse
import dataclasses
import re
import subprocess
import sys

from scratchgpt.cli import build_parser


def _options_without_help(parser: argparse.ArgumentParser, path: list[str]):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options_without_help(sub, [*path, name])
        elif action.option_strings and action.dest != "help" and not action.help:
            yield f"{' '.join(path)} {action.option_strings[0]}"


def test_every_option_of_every_command_has_help():
    missing = list(_options_without_help(build_parser(), ["scratchgpt"]))
    assert missing == [], missing


def _helps(parser: argparse.ArgumentParser, path: list[str]):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _helps(sub, [*path, name])
        elif action.option_strings and action.help:
            yield f"{' '.join(path)} {action.option_strings[0]}", action.help


def test_no_default_is_shown_as_python_spells_it():
    """'(default: None)', '(default: False)' and '(default: )' say nothing to a user: an
    unset setting reads 'unset', a switch 'on'/'off', an empty one 'none'."""
    raw = [where for where, text in _helps(build_parser(), ["scratchgpt"])
           if any(f"default: {v})" in text for v in ("None", "False", "True", ""))]
    assert raw == [], raw


def test_every_lora_setting_says_it_implies_lora():
    """--lora-rank, --lora-alpha ... turn LoRA on by themselves (finetune, train): their help
    says so, where a user looking for the switch reads."""
    helps = dict(_helps(build_parser(), ["scratchgpt"]))
    # (bench finetune's --lora-rank is the rank of the one suite variant that uses LoRA)
    commands = ("scratchgpt finetune", "scratchgpt train")
    settings = {where: text for where, text in helps.items()
                if where.startswith(tuple(f"{c} --lora-" for c in commands))}
    assert {where.split(" --")[0] for where in settings} == set(commands)
    silent = [where for where, text in settings.items() if "implies --lora" not in text]
    assert silent == [], silent


def test_every_option_says_more_than_its_default():
    """A config field made a flag without help text reads only "default: 3"; one that is no
    setting at all (a tokenizer's reserved id) must not become a flag."""
    import re

    bare = [where for where, text in _helps(build_parser(), ["scratchgpt"])
            if not re.sub(r"\(?default: [^)]*\)?", "", text).strip()]
    assert bare == [], bare


def _texts(parser: argparse.ArgumentParser, path: list[str]):
    """(where, text) for every description and help string --help prints, every command."""
    yield " ".join(path), parser.description or ""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield f"{' '.join(path)} {choice.dest}", choice.help or ""
            for name, sub in action.choices.items():
                yield from _texts(sub, [*path, name])
        elif action.help:
            yield f"{' '.join(path)} {action.option_strings[0] if action.option_strings else ''}", \
                action.help


def test_help_shows_no_docstring_markup():
    """Descriptions taken from a module's docstring printed its reST code marks as typed
    (``scratchgpt serve``: ...)."""
    marked = [where for where, text in _texts(build_parser(), ["scratchgpt"]) if "``" in text]
    assert marked == [], marked


def test_train_states_every_model_types_own_default():
    """A model flag is added once, from the first model type that has it: --n-layer said
    "default: 6" (the GPT's) to a user training an LSTM, whose default is 2."""
    import dataclasses
    import re

    from scratchgpt.commands.options import show_default
    from scratchgpt.models import LM_TYPES

    train = next(a for a in build_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)).choices["train"]
    helps = {a.dest: a.help for a in train._actions}
    defaults: dict[str, dict[str, str]] = {}
    for model, (cfg_cls, _) in LM_TYPES.items():
        for f in dataclasses.fields(cfg_cls):
            if f.init and f.default is not dataclasses.MISSING:
                defaults.setdefault(f.name, {})[model] = show_default(f.default)
    differing = {name: by_model for name, by_model in defaults.items()
                 if len(set(by_model.values())) > 1}
    assert "n_layer" in differing  # the case this guards; the check covers any other
    for name, by_model in differing.items():
        for model, value in by_model.items():
            pattern = rf"\b{re.escape(value)} \([^)]*\b{model}\b"
            assert re.search(pattern, " ".join(helps[name].split())), (name, model, helps[name])


def test_building_the_parser_imports_no_torch():
    """--help and every argparse error build the whole parser: importing torch there (the
    model configs the flags come from lived beside the models) cost each of them a second."""
    code = ("import sys; from scratchgpt.cli import build_parser; build_parser(); "
            "print([m for m in sys.modules if m.split('.')[0] == 'torch'][:5])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", out


def test_train_help_states_each_model_types_n_layer_default():
    """What a user reads: ``scratchgpt train --help`` (built without the models) still gives
    --n-layer's default for each model type, from their configs."""
    from scratchgpt.models import LM_CONFIGS

    text = subprocess.run([sys.executable, "-m", "scratchgpt", "train", "--help"],
                          capture_output=True, text=True, check=True).stdout
    line = " ".join(text.split("--n-layer N_LAYER", 2)[2].split("--n-head")[0].split())
    layered = {model: f.default for model, cfg_cls in LM_CONFIGS.items()
               for f in dataclasses.fields(cfg_cls) if f.name == "n_layer"}
    assert len(set(layered.values())) > 1, layered  # the types differ: each must be named
    for model, n_layer in layered.items():
        assert re.search(rf"\b{n_layer} \([^)]*\b{model}\b", line), (model, line)
