"""The training speedrun's options: the warmup-stable-decay schedule, the sequence-length
warmup, the batch-size ramp, and validation loss in bits per character."""

import json
import math

import pytest
import torch

from scratchgpt.checkpoints import load_checkpoint
from scratchgpt.data.dataset import TokenDataset
from scratchgpt.data.prepare import prepare_text
from scratchgpt.errors import ConfigError, ScratchGPTError
from scratchgpt.models import model_config
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.curriculum import batch_rows, window_length
from scratchgpt.training.job import train
from scratchgpt.training.optim import lr_at
from scratchgpt.training.trainer import Trainer

MODEL = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, dropout=0.0)


def cfg(**kw) -> TrainConfig:
    base = dict(batch_size=8, max_iters=40, eval_interval=20, eval_iters=4, log_interval=5,
                learning_rate=3e-3, warmup_iters=5, dtype="fp32")
    return TrainConfig(**{**base, **kw})


def gpt(data: TokenDataset):
    return model_config("gpt", vocab_size=data.vocab_size, **MODEL)


def test_wsd_holds_the_rate_then_decays_linearly_to_min_lr():
    lrs = [lr_at(s, 10, 1.0, 0.1, s / 100, "wsd", 0.3) for s in range(101)]
    assert lrs[0] < lrs[9] < 1.0  # the same warmup as the cosine
    assert all(lr == 1.0 for lr in lrs[10:71])  # stable until the last 30%
    decay = lrs[70:]
    steps = [a - b for a, b in zip(decay, decay[1:], strict=False)]
    assert all(d == pytest.approx(0.9 / 30) for d in steps)  # a straight line ...
    assert lrs[100] == pytest.approx(0.1)  # ... down to min_lr
    assert lr_at(150, 10, 1.0, 0.1, 1.5, "wsd", 0.3) == pytest.approx(0.1)  # and no lower


def test_cosine_stays_the_default_schedule():
    c = cfg()
    assert c.schedule == "cosine" and c.seq_len_warmup == 0 and c.batch_size_ramp == 0
    assert lr_at(30, 10, 1.0, 0.1, 0.3) == lr_at(30, 10, 1.0, 0.1, 0.3, "cosine", 0.3)


@pytest.mark.parametrize("bad", [dict(schedule="linear"), dict(decay_fraction=0.0),
                                 dict(decay_fraction=1.5), dict(seq_len_warmup=-1),
                                 dict(batch_size_ramp=-5), dict(decay_fraction=float("nan"))])
def test_invalid_speedrun_settings(bad):
    with pytest.raises(ConfigError):
        cfg(**bad)


def test_window_length_grows_from_a_quarter_to_the_context_in_multiples_of_8():
    lengths = [window_length(s, 100, 64) for s in range(120)]
    assert lengths[0] == 16 and lengths[100:] == [64] * 20
    assert all(a <= b for a, b in zip(lengths, lengths[1:], strict=False))
    assert all(n % 8 == 0 for n in lengths)
    assert window_length(0, 100, 6) == 6  # a context shorter than one step is used whole
    assert window_length(0, 0, 64) == 64  # no warmup: the whole context


def test_batch_rows_grow_from_a_quarter_to_the_batch():
    rows = [batch_rows(s, 40, 12) for s in range(50)]
    assert rows[0] == 3 and rows[40:] == [12] * 10
    assert all(a <= b for a, b in zip(rows, rows[1:], strict=False))
    assert batch_rows(0, 10, 1) == 1 and batch_rows(0, 0, 12) == 12


def test_the_loop_draws_the_scheduled_batch_shapes(small_dataset, tmp_path, monkeypatch):
    data = TokenDataset(small_dataset)
    shapes = []
    real = TokenDataset.get_batch

    def recording(self, split, batch_size, block_size, generator, *args, **kw):
        x, y = real(self, split, batch_size, block_size, generator, *args, **kw)
        if split == "train" and kw.get("shard", args[0] if args else None) is not None:
            shapes.append(tuple(x.shape))
        return x, y

    monkeypatch.setattr(TokenDataset, "get_batch", recording)
    res = train(cfg(max_iters=30, seq_len_warmup=20, batch_size_ramp=10), gpt(data), data,
                tmp_path / "r", progress=False)
    expected = [(batch_rows(s, 10, 8), window_length(s, 20, 32)) for s in range(30)]
    assert shapes == expected
    assert shapes[0] == (2, 8) and shapes[-1] == (8, 32)
    state = load_checkpoint(tmp_path / "r" / "last.pt").state
    assert state.tokens == sum(b * t for b, t in expected)  # tokens/s counts what was trained
    assert res.step == 30


def test_speedrun_options_train_and_resume_exactly(small_dataset, tmp_path):
    data = TokenDataset(small_dataset)
    opts = dict(schedule="wsd", decay_fraction=0.5, seq_len_warmup=25, batch_size_ramp=15,
                lr_decay_iters=40, optimizer="muon", muon_dtype="fp32")
    full = train(cfg(max_iters=40, **opts), gpt(data), data, tmp_path / "a", progress=False)
    train(cfg(max_iters=20, **opts), gpt(data), data, tmp_path / "b", progress=False)
    resumed = train(cfg(max_iters=40, **opts), None, data, tmp_path / "b", resume=True,
                    progress=False)
    assert resumed.step == 40 and resumed.val_loss == full.val_loss
    a = load_checkpoint(tmp_path / "a" / "last.pt").model
    b = load_checkpoint(tmp_path / "b" / "last.pt").model
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert full.val_loss < math.log(data.vocab_size) - 0.5  # and it learns
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["train"]["schedule"] == "wsd" and saved["train"]["seq_len_warmup"] == 25


def test_the_ramps_apply_to_language_models_only():
    class PairsTask:  # a task whose batches are not token windows (as seq2seq's)
        pass

    config = model_config("gpt", vocab_size=10, **MODEL)
    for option in ("seq_len_warmup", "batch_size_ramp"):
        with pytest.raises(ScratchGPTError, match=option.replace("_", "-")):
            Trainer(cfg(**{option: 10}), config, PairsTask(), progress=False)
    with pytest.raises(ScratchGPTError, match="--windows"):
        Trainer(cfg(windows="epoch"), config, PairsTask(), progress=False)


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_bits_per_char_uses_the_val_text_length(tmp_path, english_text, tokenizer):
    text = english_text[:60_000]
    meta = prepare_text(text, tmp_path, tokenizer,
                        vocab_size=300 if tokenizer == "bpe" else None)
    data = TokenDataset(tmp_path)
    assert meta["val_chars"] == len(text) - int(len(text) * 0.9)
    ratio = meta["val_chars"] / meta["val_tokens"]
    assert data.chars_per_token("val") == pytest.approx(ratio)
    assert data.bits_per_char("val", 1.5) == pytest.approx(1.5 / ratio / math.log(2))
    if tokenizer == "char":
        assert ratio == 1.0
    else:
        assert ratio > 1.2  # BPE tokens span several characters
    # A dataset prepared before meta.json recorded characters: counted by decoding the split.
    stored = json.loads((tmp_path / "meta.json").read_text())
    del stored["val_chars"], stored["train_chars"]
    (tmp_path / "meta.json").write_text(json.dumps(stored))
    assert TokenDataset(tmp_path).chars_per_token("val") == pytest.approx(ratio)


def test_the_speedrun_stack_builds_and_trains(small_dataset, tmp_path):
    from scratchgpt.models import build_model
    from scratchgpt.training.config import PRESETS
    from scratchgpt.training.settings import Settings, finish_model_config, known_settings, new_run

    preset = PRESETS["cpu-medium-speedrun"]
    assert set(preset) <= known_settings()
    # The preset's own options on a test's shape: fewer updates, the ramps scaled with them.
    short = dict(max_iters=60, seq_len_warmup=20, batch_size_ramp=20, warmup_iters=10,
                 eval_interval=60, eval_iters=2, dtype="fp32", n_layer=2, n_head=2, n_embd=32,
                 block_size=32)
    kind, values, train_cfg, _ = new_run(Settings("cpu-medium-speedrun", flags=short))
    data = TokenDataset(small_dataset)
    config = finish_model_config(kind, values, data.vocab_size)
    model = build_model(config)
    for name in ("pos_encoding", "qk_norm", "activation", "zero_init_proj", "value_embeds",
                 "unet_skips", "logit_softcap", "tie_weights"):
        assert getattr(config, name) == preset[name]
    assert train_cfg.schedule == "wsd" and train_cfg.optimizer == "muon"
    x = torch.randint(0, data.vocab_size, (1, 16))
    assert model(x).abs().max() < config.logit_softcap  # soft-capped logits
    res = train(train_cfg, config, data, tmp_path / "run", progress=False)
    assert res.step == 60
    assert res.val_loss < math.log(data.vocab_size) - 1.0  # well below a uniform guess


def test_the_90s_speedrun_preset_is_cpu_small_halved_with_rope_a_higher_rate_and_a_budget():
    """(and its windows drawn epoch by epoch)"""
    from scratchgpt.cli import build_parser
    from scratchgpt.commands.options import given
    from scratchgpt.training.config import PRESETS
    from scratchgpt.training.settings import Settings, known_settings, new_run

    small, speedrun = PRESETS["cpu-small"], PRESETS["cpu-speedrun"]
    changed = {k: v for k, v in speedrun.items() if small.get(k) != v}
    assert changed == dict(n_layer=2, pos_encoding="rope", learning_rate=1e-2, warmup_iters=50,
                           weight_decay=0.3, time_budget="90s", windows="epoch",
                           max_iters=1_000_000)  # the budget, not the updates, ends it
    parser = build_parser()

    def budget(*flags):
        args = parser.parse_args(["train", "--preset", "cpu-speedrun", *flags])
        settings = Settings(args.preset, None, given(args, known_settings() - {"dataset"}))
        return new_run(settings)[2].time_budget_s

    assert budget() == 90.0
    assert budget("--time-budget", "10m") == 600.0
    assert budget("--time-budget", "") is None  # off: --max-iters alone ends the run


def _speedrun_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "speedrun.py"
    spec = importlib.util.spec_from_file_location("speedrun_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("budget", ["90s", "10m", "400"])
def test_every_row_of_the_speedrun_table_is_a_valid_run(budget):
    from scratchgpt.cli import build_parser
    from scratchgpt.commands.options import given
    from scratchgpt.training.settings import Settings, finish_model_config, known_settings, new_run

    script = _speedrun_script()
    parser = build_parser()
    variants = [*script.ABLATIONS, *script.RECIPES, script.STACK, script.NANOGPT]
    configs = {}
    for variant in variants:
        args = parser.parse_args(["train", *script.run_flags(variant, budget),
                                  *script.limit_flags(budget)])
        settings = Settings(args.preset, None, given(args, known_settings() - {"dataset"}))
        kind, values, train_cfg, _ = new_run(settings)
        configs[variant] = (finish_model_config(kind, values, 65), train_cfg)
    base_model, base_train = configs["baseline"]
    for variant in script.ABLATIONS:  # one change at a time: exactly one setting differs
        model, train_cfg = configs[variant]
        changed = [k for k, v in model.to_dict().items() if getattr(base_model, k) != v] + \
                  [k for k, v in train_cfg.to_dict().items() if getattr(base_train, k) != v]
        assert len(changed) == (0 if variant == "baseline" else 1), (variant, changed)
    recipe, _ = configs["two-layers-rope"]  # a recipe: the changes it names, no others
    assert [k for k, v in recipe.to_dict().items() if getattr(base_model, k) != v] == \
        ["n_layer", "pos_encoding"]
    every_model, every_train = configs["all-options"]
    # Every option at once: the base shape with each option of SPEEDRUN_OPTIONS.
    assert (every_model.n_layer, every_model.block_size) == (base_model.n_layer,
                                                             base_model.block_size)
    assert every_model.pos_encoding == "rope" and every_model.qk_norm
    assert every_train.schedule == "wsd" and every_train.seq_len_warmup > 0
    stack_model, stack_train = configs[script.STACK]  # the speedrun preset of the budget
    if budget == "10m":
        assert (stack_model, stack_train) == (every_model, every_train)
    else:
        assert (stack_model.n_layer, stack_model.pos_encoding) == (2, "rope")
    # every row runs for the budget given, whatever budget its preset names
    assert stack_train.time_budget == ("" if budget.isdigit() else budget)


@pytest.mark.parametrize("tokenizer, dropout, copies", [
    ("bpe:768", 0.0, 1), ("bpe:768:drop0.1", 0.1, 16), ("bpe:512:drop.25x4", 0.25, 4)])
def test_the_speedrun_tokenizers_are_valid_prepare_commands(tmp_path, monkeypatch, tokenizer,
                                                            dropout, copies):
    from scratchgpt.cli import build_parser
    from scratchgpt.commands.prepare import train_copies

    script = _speedrun_script()
    assert script.TOKENIZER.fullmatch(tokenizer)
    calls = []
    monkeypatch.setattr(script, "OUT", tmp_path)
    monkeypatch.setattr(script, "scratchgpt", lambda *a: calls.append(a) or "")
    target = script.prepared("shakespeare", tokenizer)
    assert target == str(tmp_path / "data" / script.text_name("shakespeare", tokenizer))
    args = build_parser().parse_args(list(calls[0]))
    assert (args.out, args.bpe_dropout, train_copies(args)) == (target, dropout, copies)


def test_the_medium_speedrun_preset_is_cpu_medium_with_the_speedrun_options():
    from scratchgpt.training.config import PRESETS, SPEEDRUN_OPTIONS

    medium, stack = PRESETS["cpu-medium"], PRESETS["cpu-medium-speedrun"]
    assert {k: v for k, v in stack.items() if k not in SPEEDRUN_OPTIONS} == \
        {**{k: v for k, v in medium.items() if k not in SPEEDRUN_OPTIONS},
         "seq_len_warmup": 600, "batch_size_ramp": 600}
    assert all(stack[k] == v for k, v in SPEEDRUN_OPTIONS.items())


def test_the_speedrun_prepares_a_bpe_of_each_text_once(tmp_path, monkeypatch):
    script = _speedrun_script()
    monkeypatch.setattr(script, "OUT", tmp_path)
    calls = []

    def fake_scratchgpt(*args):  # stands for `scratchgpt prepare`: writes the dataset's meta
        calls.append(args)
        out = tmp_path / args[args.index("--out") + 1]
        out.mkdir(parents=True)
        (out / "meta.json").write_text("{}")
        return ""

    monkeypatch.setattr(script, "scratchgpt", fake_scratchgpt)
    assert script.prepared("shakespeare", "char") == "shakespeare"  # named, as it is
    first = script.prepared("shakespeare", "bpe:768")
    assert script.prepared("shakespeare", "bpe:768") == first  # prepared once, then reused
    assert len(calls) == 1
    args = calls[0]
    assert args[:3] == ("prepare", "--dataset", "shakespeare")
    assert args[args.index("--tokenizer") + 1] == "bpe"
    assert args[args.index("--vocab-size") + 1] == "768"
    assert first == args[args.index("--out") + 1] and first.endswith("shakespeare-bpe768")


def test_the_speedrun_picture_puts_every_run_in_bits_per_char(tmp_path, monkeypatch):
    from scratchgpt import viz
    from scratchgpt.training.metrics import MetricsLog

    script = _speedrun_script()
    monkeypatch.setattr(script, "OUT", tmp_path)
    rows = []
    for variant, losses, (val, bpc) in (("baseline", [5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0,
                                                      -3.0, -4.0], (2.0, 1.5)),
                                        ("stack", [6.0, 5.0], (3.0, 1.2))):
        script.run_dir("text", "90s", variant).mkdir()
        log = MetricsLog(script.run_dir("text", "90s", variant) / "metrics.csv", None)
        for step, loss in enumerate(losses, 1):
            log.row(step=step, tokens=step * 8, elapsed_s=step * 0.5, loss=loss)
        log.row(step=len(losses), tokens=0, elapsed_s=len(losses) * 0.5, val_loss=val)
        log.close()
        rows.append({"dataset": "text", "budget": "90s", "variant": variant,
                     "train_s": len(losses) * 0.5, "val_loss": val, "val_bpc": bpc})
    # the stack's run names its dataset (a BPE's train and val split differ in characters per
    # token, so its training curve takes its own split's); the baseline's names none: val's
    prepare_text("abcdefgh " * 400, tmp_path / "chars", "char")
    (script.run_dir("text", "90s", "stack") / "config.json").write_text(
        json.dumps({"data": {"dataset": str(tmp_path / "chars")}}))
    drawn = []
    monkeypatch.setattr(viz, "time_curves_figure",
                        lambda *a, **k: drawn.append(a) or viz.pyplot().figure())
    assert script.figures(rows) == [tmp_path / "text-90s.png"]
    assert (tmp_path / "text-90s.png").stat().st_size > 0
    curves, finals, *_ = drawn[0]
    # the baseline: its val split's 0.75 bits/char per nat/token, smoothed over a fifth of its
    # logs (2 of 10); the stack: its training split's, its 2 logs as they are
    assert curves["baseline"][0] == tuple(0.5 * i for i in range(1, 11))
    assert curves["baseline"][1] == pytest.approx([3.75, 3.375, 2.625, 1.875, 1.125, 0.375,
                                                   -0.375, -1.125, -1.875, -2.625])
    assert curves["stack"][0] == (0.5, 1.0)  # one character per token: nats / ln 2
    assert curves["stack"][1] == pytest.approx([6.0 / math.log(2), 5.0 / math.log(2)])
    assert finals == {"baseline": (5.0, 1.5), "stack": (1.0, 1.2)}


@pytest.mark.parametrize("flags,says", [
    (["--decay-fraction", "0.2"], "--decay-fraction applies with --schedule wsd"),
    (["--muon-lr-scale", "3"], "--muon-lr-scale applies with --optimizer muon"),
    (["--muon-dtype", "fp32", "--optimizer", "adamw"], "--muon-dtype applies with --optimizer"),
])
def test_a_setting_for_a_choice_the_run_did_not_make_is_refused(small_dataset, tmp_path,
                                                                 capsys, flags, says):
    """They ran as if not given (the cosine schedule has no decay fraction; AdamW no Muon
    scale)."""
    from tests.cli_errors import error_of

    line = error_of(capsys, ["train", "--dataset", str(small_dataset), "--out",
                             str(tmp_path / "r"), "--max-iters", "1", *flags])
    assert says in line
    assert not (tmp_path / "r").exists()
