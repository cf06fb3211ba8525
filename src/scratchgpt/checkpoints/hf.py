"""Hugging Face GPT-2 directories <-> our GPT.

A Hugging Face GPT-2 directory holds ``config.json`` (``"model_type": "gpt2"``), the weights as
``model.safetensors`` (or, above 5 GB, shards that ``model.safetensors.index.json`` lists, or
the older ``pytorch_model.bin``, or its shards that ``pytorch_model.bin.index.json`` lists) and
usually tokenizer files. Our GPT
uses GPT-2's parameter names, so the mapping is nearly the identity:

* keys may carry a ``transformer.`` prefix (``GPT2LMHeadModel``) or not (``GPT2Model``);
* GPT-2's ``Conv1D`` layers (``c_attn``, ``c_proj``, ``c_fc``) store their weight as (in, out)
  and compute ``x @ W + b``; ``nn.Linear`` stores (out, in), so those weights are transposed;
* ``lm_head.weight`` is the token embedding when ``tie_word_embeddings`` is true (the default),
  unless the file stores a head that differs: then, as in ``transformers``, the stored head
  is kept and the two are untied;
* config: ``n_positions`` -> ``block_size``, ``layer_norm_epsilon`` -> ``layer_norm_eps``,
  ``activation_function`` ``gelu_new`` = our tanh-approximated GELU.

Anything GPT-2 allows that our GPT does not compute the same way (other activations, attention
scaling variants, cross-attention, a different MLP width) is refused with a :class:`CheckpointError`
naming the key, rather than loaded into a model that would silently compute something else. The
other way, a GPT with an option GPT-2 lacks (RoPE, QK-norm, ReLU, no LayerNorm, ...) is refused
for export with a :class:`ConfigError` naming the flag (``gpt2_incompatibility`` in models/gpt.py).

An instruction-tuned model keeps its chat template through the round trip: the export writes
the template's name (see :data:`scratchgpt.chat.TEMPLATES`) as ``"scratchgpt_chat_template"``
in ``config.json``, a key ``transformers`` keeps as an unused config attribute, and reading the
directory (:func:`hf_chat_template`: ``chat``, ``sample``, ``serve``, ``convert --from hf``)
finds it again. A plain model's export has no such key, nor has a directory from elsewhere:
neither can chat. Where the export writes Hugging Face tokenizer files (byte-level BPE), their
``tokenizer_config.json`` also holds the template in Jinja
(:attr:`scratchgpt.chat.ChatTemplate.jinja`), so that ``transformers``'
``tokenizer.apply_chat_template`` writes the prompts the model was tuned on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from scratchgpt import memory
from scratchgpt.checkpoints.io import (
    TEMP_SUFFIX,
    current_umask,
    dead_temporaries,
    fsync_dir,
    missing_folders,
    read_torch_file,
    remove_dead_temporaries,
    remove_folders,
    temporary_name,
    write_failure,
)
from scratchgpt.errors import CheckpointError, ConfigError, ScratchGPTError
from scratchgpt.signals import signals_held
from scratchgpt.validation import json_loads
from scratchgpt.wording import first_of

CONFIG_FILE = "config.json"
SHARD_INDEX = "model.safetensors.index.json"  # weights in shards, which it maps tensors to
# (transformers' save_pretrained splits a model above 5 GB: GPT-2 XL in fp32)
BIN_SHARD_INDEX = "pytorch_model.bin.index.json"  # the same, of .bin shards (torch.save's:
# what transformers wrote with safe_serialization=False)
SHARD_INDEXES = (SHARD_INDEX, BIN_SHARD_INDEX)
WEIGHT_FILES = ("model.safetensors", SHARD_INDEX, "pytorch_model.bin",  # preferred first
                BIN_SHARD_INDEX)
OUR_TOKENIZER_DIR = "scratchgpt-tokenizer"  # our own tokenizer, kept beside the HF files
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")  # both are 0.5x(1 + tanh(...)), our nn.GELU(tanh)
IGNORED_BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers of old checkpoints
MISSING_NAMED = 3  # the missing tensors a refusal names; it counts the rest
CHAT_TEMPLATE_KEY = "scratchgpt_chat_template"  # in config.json: the name of the chat template
STAGING = "export"  # an export's temporary folder inside --out: .export.PID.X.tmp
# its name before it held the process id (tempfile.mkdtemp's 8 characters): see
# io.dead_temporaries
UNTAGGED_STAGING = rf"\.{STAGING}\.[a-z0-9_]{{8}}{re.escape(TEMP_SUFFIX)}"
# An export's marker in --out while it replaces the files there (.export-moving.PID.X.tmp):
# made before the first earlier file goes, removed once the last new one is in place, so
# that a directory an export killed outright left half moved (the new config.json beside the
# old weights) is refused by every reader (check_export_whole), not loaded as neither model
MOVING = "export-moving"
# A GPT-2 directory's files besides its weights: what a hub download fetches, and what an
# export clears first (with the weights), so that an earlier model's tokenizer never stays
# beside a new model, where every reader would take it for the new model's.
DIRECTORY_FILES = (CONFIG_FILE, "generation_config.json", "tokenizer.json",
                   "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "encoder.json", "vocab.bpe")


def is_hf_dir(path: str | Path) -> bool:
    """True if ``path`` is a directory holding a Hugging Face config.json and weights file,
    or the marker of an export moving its files in (cut short or under way: whatever files it
    holds, its readers refuse it, see :func:`check_export_whole`)."""
    path = Path(path)
    return path.is_dir() and (((path / CONFIG_FILE).is_file()
                               and any((path / w).is_file() for w in WEIGHT_FILES))
                              or bool(moving_markers(path)))


def moving_markers(directory: Path) -> list[Path]:
    """The markers of exports moving their files into ``directory`` (see :data:`MOVING`)."""
    return sorted(directory.glob(f".{MOVING}.*{TEMP_SUFFIX}"))


def check_export_whole(directory: Path) -> None:
    """A CheckpointError where an export was moving its files into ``directory`` (its marker
    is there): killed part-way, the directory holds part of the earlier model and part of the
    new one, or misses files; still running, it is about to."""
    markers = moving_markers(directory)
    if not markers:
        return
    dead = dead_temporaries(directory, MOVING)
    pid = (dead or markers)[0].name.split(".")[2]
    if dead:
        raise CheckpointError(f"{directory}: an export into it was cut short (process {pid} "
                              "died while moving the files in: they may mix two models); "
                              "export again")
    raise CheckpointError(f"{directory}: an export into it is under way (process {pid} is "
                          "moving the files in); read it once that export ends")


# ---- config

@dataclass(frozen=True)
class HFConfig:
    """A Hugging Face directory's ``config.json``, read once per load (:func:`read_hf_config`)
    and handed to each reader of the directory: ``settings`` is the parsed JSON, any value
    until :func:`config_from_hf` checks it is an object of GPT-2 settings."""

    settings: Any
    path: Path

    def get(self, key: str) -> Any:
        """The setting ``key``, or None (also when the file holds no JSON object)."""
        return self.settings.get(key) if isinstance(self.settings, dict) else None


def read_hf_config(directory: str | Path) -> HFConfig:
    """The parsed ``config.json`` of ``directory``; unreadable or not JSON, or the directory
    half replaced by an export (:func:`check_export_whole`): a CheckpointError. Every reader of
    a Hugging Face directory starts here."""
    check_export_whole(Path(directory))
    path = Path(directory) / CONFIG_FILE
    try:
        return HFConfig(json_loads(path.read_text(encoding="utf-8")), path)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not readable JSON ({e})") from None


def config_from_hf(hf: Any, where: str = CONFIG_FILE) -> dict[str, Any]:
    """Our GPTConfig fields from a Hugging Face GPT-2 ``config.json`` dict (checked: the keys'
    types, then the values as GPTConfig checks them; each problem is one CheckpointError)."""
    def bad(key: str, why: str) -> CheckpointError:
        return CheckpointError(f"{where}: {key}={hf.get(key)!r} is not supported ({why})")

    if not isinstance(hf, dict):
        raise CheckpointError(f"{where} holds a JSON {type(hf).__name__}, not an object of "
                              "settings; it is not a Hugging Face config")
    if hf.get("model_type") != "gpt2":
        raise bad("model_type", "only GPT-2 models can be loaded")
    archs = hf.get("architectures") or ["GPT2LMHeadModel"]
    if not isinstance(archs, list) or not set(map(str, archs)) & {"GPT2LMHeadModel",
                                                                  "GPT2Model"}:
        raise bad("architectures", "need GPT2LMHeadModel")
    act = hf.get("activation_function", "gelu_new")
    if act not in (*GELU_TANH, "gelu"):
        raise bad("activation_function", "our GPT has the tanh GELU (gelu_new) or exact gelu")
    missing = [k for k in ("vocab_size", "n_positions", "n_layer", "n_head") if k not in hf]
    if missing:
        raise CheckpointError(f"{where}: lacks {', '.join(missing)}")
    n_embd = _number(hf, "n_embd", 768, int, where)
    if hf.get("n_inner") not in (None, 4 * n_embd):
        raise bad("n_inner", f"the MLP width must be 4 * n_embd = {4 * n_embd}")
    for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                    ("reorder_and_upcast_attn", False), ("add_cross_attention", False)):
        if hf.get(key, ok) != ok:
            raise bad(key, f"only {ok} is implemented")
    p = _number(hf, "resid_pdrop", 0.0, float, where)
    p_attn = _number(hf, "attn_pdrop", p, float, where)
    p_embd = _number(hf, "embd_pdrop", p, float, where)
    out = dict(vocab_size=_number(hf, "vocab_size", None, int, where),
               block_size=_number(hf, "n_positions", None, int, where),
               n_layer=_number(hf, "n_layer", None, int, where),
               n_head=_number(hf, "n_head", None, int, where), n_embd=n_embd,
               dropout=p, bias=True, pos_encoding="learned",
               tie_weights=bool(hf.get("tie_word_embeddings", True)),
               layer_norm_eps=_number(hf, "layer_norm_epsilon", 1e-5, float, where),
               activation="gelu" if act == "gelu" else "gelu_tanh",
               attn_dropout=None if p_attn == p else p_attn,  # None: the same as dropout
               embd_dropout=None if p_embd == p else p_embd)
    _gpt_config(out, where)  # GPTConfig's own checks (sizes >= 1, dropout in [0, 1), ...)
    return out


def _number(hf: dict[str, Any], key: str, default: Any, kind: type, where: str) -> Any:
    """``hf[key]`` as ``kind`` (int, or float which also takes an int); anything else (a
    string, a list, a bool) is a CheckpointError naming the key."""
    value = hf.get(key, default)
    allowed = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, allowed):
        what = "a number" if kind is float else "an integer"
        raise CheckpointError(f"{where}: {key} must be {what}, got {value!r}")
    return kind(value)


def _gpt_config(cfg: dict[str, Any], where: str) -> Any:
    from scratchgpt.models.gpt import GPTConfig

    try:
        return GPTConfig(**cfg)
    except ConfigError as e:
        raise CheckpointError(f"{where}: {e}") from None


def config_to_hf(cfg: dict[str, Any], eos_id: int | None = None) -> dict[str, Any]:
    """A Hugging Face ``config.json`` dict for our GPTConfig fields. A model GPT-2 cannot
    express (see :func:`~scratchgpt.models.gpt.gpt2_incompatibility`) is a ConfigError."""
    from scratchgpt.models.gpt import gpt2_incompatibility

    reason = gpt2_incompatibility(cfg)
    if reason is not None:
        raise ConfigError(f"cannot export to Hugging Face GPT-2: {reason}")
    p = float(cfg.get("dropout", 0.0))
    p_attn, p_embd = (p if cfg.get(k) is None else float(cfg[k])
                      for k in ("attn_dropout", "embd_dropout"))
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg["vocab_size"], "n_positions": cfg["block_size"],
        "n_embd": cfg["n_embd"], "n_layer": cfg["n_layer"], "n_head": cfg["n_head"],
        "n_inner": None,
        "activation_function": "gelu" if cfg.get("activation") == "gelu" else "gelu_new",
        "resid_pdrop": p, "embd_pdrop": p_embd, "attn_pdrop": p_attn,
        "layer_norm_epsilon": cfg.get("layer_norm_eps", 1e-5), "initializer_range": 0.02,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "add_cross_attention": False,
        "tie_word_embeddings": bool(cfg.get("tie_weights", True)), "use_cache": True,
        "bos_token_id": eos_id, "eos_token_id": eos_id, "dtype": "float32",
    }


# ---- weights

def untie_if_head_differs(weights: dict[str, Tensor], cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with ``tie_weights`` off when the file stores an ``lm_head.weight`` that is not
    the token embedding, as ``transformers`` does: the stored head is kept, not dropped
    (dropping it would change the logits)."""
    head, wte = weights.get("lm_head.weight"), _find(weights, "wte.weight")
    if (cfg["tie_weights"] and head is not None and wte is not None
            and (head.shape != wte.shape or not torch.equal(head, wte))):
        return {**cfg, "tie_weights": False}
    return cfg


def _find(weights: dict[str, Tensor], name: str) -> Tensor | None:
    return weights.get(name, weights.get(f"transformer.{name}"))


def check_weights_match_config(weights: dict[str, Tensor], cfg: dict[str, Any],
                               where: str = "weights") -> None:
    """The number of layers and the embedding shapes the weights hold are those config.json
    claims; checked before a model of the config is built, so a config claiming 100,000
    layers beside one layer of weights is refused at once rather than built."""
    layers = {int(m.group(1)) for key in weights
              if (m := re.match(r"(?:transformer\.)?h\.(\d+)\.", key))}
    found = max(layers) + 1 if layers else 0
    if found != cfg["n_layer"]:
        raise CheckpointError(f"{where}: holds {found} layers, config.json says n_layer="
                              f"{cfg['n_layer']}")
    for name, shape in (("wte.weight", (cfg["vocab_size"], cfg["n_embd"])),
                        ("wpe.weight", (cfg["block_size"], cfg["n_embd"]))):
        t = _find(weights, name)
        if t is not None and tuple(t.shape) != shape:
            raise CheckpointError(f"{where}: tensor {name!r} has shape {tuple(t.shape)}, "
                                  f"config.json implies {shape}")


def state_dict_from_hf(weights: dict[str, Tensor], cfg: dict[str, Any],
                       where: str = "weights") -> dict[str, Tensor]:
    """Our GPT state_dict from Hugging Face GPT-2 tensors (Conv1D weights transposed).

    Every expected tensor must be present with the expected shape; unknown tensors are errors
    too (they would mean the file is some other model). With ``tie_weights``, a stored
    ``lm_head.weight`` must be the token embedding (see :func:`untie_if_head_differs`)."""
    from scratchgpt.models.gpt import GPT, GPTConfig

    check_weights_match_config(weights, cfg, where)
    with torch.device("meta"):  # shapes only, no memory, no init
        expected = {k.removeprefix("transformer."): v
                    for k, v in GPT(GPTConfig(**cfg)).state_dict().items()}
    found = {}
    for key, t in weights.items():
        name = key.removeprefix("transformer.")
        if name.endswith(IGNORED_BUFFERS):
            continue
        if name == "lm_head.weight" and cfg["tie_weights"]:
            continue  # the same matrix as wte (saved twice by some exporters)
        if name not in expected:
            raise CheckpointError(f"{where}: unexpected tensor {key!r} (not part of GPT-2)")
        found[name] = t.t() if name.endswith(CONV1D) else t
    missing = [k for k in expected if k not in found
               and not (k == "lm_head.weight" and cfg["tie_weights"])]
    if missing:
        raise CheckpointError(f"{where}: missing tensor{'s' if len(missing) > 1 else ''} "
                              f"{first_of([repr(k) for k in missing], MISSING_NAMED)}")
    for name, t in found.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            theirs = tuple(t.t().shape) if name.endswith(CONV1D) else tuple(t.shape)
            want = (tuple(expected[name].shape)[::-1] if name.endswith(CONV1D)
                    else tuple(expected[name].shape))
            raise CheckpointError(f"{where}: tensor {name!r} has shape {theirs}, config.json "
                            f"implies {want}")
    if cfg["tie_weights"]:
        found["lm_head.weight"] = found["wte.weight"]
    return {f"transformer.{k}" if k != "lm_head.weight" else k: v.float().contiguous()
            for k, v in found.items()}


def state_dict_to_hf(state: dict[str, Tensor], tie_weights: bool) -> dict[str, Tensor]:
    """Hugging Face ``GPT2LMHeadModel`` tensors from our GPT state_dict (contiguous copies)."""
    out = {}
    for key, t in state.items():
        if key == "lm_head.weight" and tie_weights:
            continue  # HF re-ties it to wte on load; safetensors refuses shared tensors
        out[key] = (t.t() if key.endswith(CONV1D) else t).detach().contiguous().clone()
    return out


def read_hf_weights(directory: Path) -> tuple[dict[str, Tensor], Path]:
    """The tensors of ``model.safetensors`` (preferred), of the shards
    ``model.safetensors.index.json`` names, of ``pytorch_model.bin``, or of the shards
    ``pytorch_model.bin.index.json`` names."""
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if name in SHARD_INDEXES:
            return _read_shards(path), path
        if not name.endswith(".safetensors"):
            return _read_torch_weights(path, "weights file"), path
        return _read_safetensors(path), path
    raise CheckpointError(f"{directory}: no {' or '.join(WEIGHT_FILES)}")


def _read_shards(index: Path) -> dict[str, Tensor]:
    """The tensors of every shard ``index`` maps a tensor to (a file beside it), each checked to
    be there before any is read: safetensors shards, or .bin shards (read as
    ``pytorch_model.bin`` is) for ``pytorch_model.bin.index.json``."""
    paths = []
    for shard in listed_shards(index):
        path = index.parent / str(shard)
        if path.parent != index.parent or not path.is_file():
            raise CheckpointError(f"{index} names the shard {shard!r}, which is not a file "
                                  f"beside it (a download or copy left it out?)")
        paths.append(path)
    tensors: dict[str, Tensor] = {}
    for path in paths:
        tensors.update(_read_safetensors(path) if index.name == SHARD_INDEX
                       else _read_torch_weights(path, "weights shard"))
    return tensors


def _read_torch_weights(path: Path, what: str) -> dict[str, Tensor]:
    """The tensors by name of a ``.bin`` file torch.save wrote (``pytorch_model.bin`` or one of
    its shards), read with weights_only; a file holding anything else is a CheckpointError."""
    data = read_torch_file(path, what)
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is not a readable {what}: it holds a "
                              f"{type(data).__name__}, not tensors by name")
    bad = next((k for k, v in data.items()
                if not (isinstance(k, str) and isinstance(v, Tensor))), None)
    if bad is not None:
        raise CheckpointError(f"{path} is not a readable {what}: its {bad!r} is a "
                              f"{type(data[bad]).__name__}, not a tensor")
    return data


def listed_shards(index: Path) -> list[str]:
    """The shard files ``index`` maps tensors to, each once, in order (what a hub download
    fetches besides it); an index that cannot be read so is a CheckpointError."""
    try:
        weight_map = json_loads(index.read_text(encoding="utf-8"))["weight_map"]
        return [str(shard) for shard in dict.fromkeys(weight_map.values())]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{index} is not readable: no weight_map of tensors to shard "
                              f"files ({type(e).__name__}: {e})") from None


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    """The tensors of one safetensors file; a damaged one is a one-line CheckpointError."""
    short = _cut_short(path)
    if short is not None:
        raise CheckpointError(f"{path} is not readable: {short}")
    try:
        from safetensors.torch import load_file

        return load_file(str(path))
    except ImportError:
        raise CheckpointError("reading model.safetensors needs the safetensors package "
                              "(pip install safetensors)") from None
    except Exception as e:  # noqa: BLE001 - any corrupt file becomes one clear line
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise CheckpointError(f"{path} is not readable: {reason}") from None


def _cut_short(path: Path) -> str | None:
    """Why a safetensors file is shorter than its header says (8 bytes of length, then the
    JSON of each tensor's byte range), or None: as long as it says, or a header that cannot be
    read, of which safetensors says why. safetensors itself said "incomplete metadata, file
    not fully covered" of a download or copy cut short."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if length > SAFETENSORS_HEADER_MAX:
                return None
            header = f.read(length)
        end = 0 if len(header) < length else max(
            (v["data_offsets"][1] for k, v in json.loads(header).items() if k != "__metadata__"),
            default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
    if not isinstance(end, int) or size >= 8 + length + end:
        return None
    return (f"it is truncated, {size:,} bytes where its header needs at least {8 + length + end:,} "
            "(a copy or download cut short?)")


SAFETENSORS_HEADER_MAX = 100_000_000  # safetensors' own limit on a header's length


def load_hf(directory: str | Path, config: HFConfig | None = None) -> tuple[nn.Module, Path]:
    """Load a Hugging Face GPT-2 directory as our GPT (eval mode, fp32, CPU), from its
    ``config`` when the caller has read it already (else it is read here).

    Returns (model, the weights file read)."""
    from scratchgpt.models.gpt import GPT, GPTConfig

    directory = Path(directory)
    config = config or read_hf_config(directory)
    cfg = config_from_hf(config.settings, str(config.path))
    weights, path = read_hf_weights(directory)
    cfg = untie_if_head_differs(weights, cfg)
    state = state_dict_from_hf(weights, cfg, str(path))
    config = GPTConfig(**cfg)
    memory.check_fits(memory.inference_estimate(config, 1, 1), f"loading {directory}",
                      error=CheckpointError)
    model = GPT(config)
    model.load_state_dict(state)
    model.eval()
    return model, path


def hf_chat_template(directory: str | Path, config: HFConfig | None = None) -> str | None:
    """The name of the chat template a Hugging Face directory's model was instruction-tuned
    with (written by :func:`save_hf`), or None: the model cannot chat. A name scratchgpt does
    not know is a CheckpointError naming the key. ``config``: as :func:`load_hf` takes it."""
    from scratchgpt.chat import TEMPLATES

    config = config or read_hf_config(directory)
    name = config.get(CHAT_TEMPLATE_KEY)
    if name is not None and (not isinstance(name, str) or name not in TEMPLATES):
        raise CheckpointError(f"{config.path}: {CHAT_TEMPLATE_KEY}={name!r} is not a chat "
                              f"template scratchgpt knows ({', '.join(TEMPLATES)})")
    return name


def save_hf(model: nn.Module, directory: str | Path, tokenizer: Any = None,
            chat_template: str | None = None) -> Path:
    """Write ``model`` (our GPT) as a Hugging Face GPT-2 directory that
    ``transformers.GPT2LMHeadModel.from_pretrained`` loads. Returns the directory.

    With a ``tokenizer``, it is saved in ``scratchgpt-tokenizer/`` (read back by
    :func:`hf_tokenizer`), and a GPT-2 style BPE tokenizer is also written in Hugging Face's
    format (``vocab.json``, ``merges.txt``; see
    :func:`scratchgpt.tokenizers.bpe_files.write_hf_tokenizer`). ``chat_template``, the name
    of an instruction-tuned model's template, goes into ``config.json`` (read back by
    :func:`hf_chat_template`), and the template itself, in Jinja, into the Hugging Face
    tokenizer's ``tokenizer_config.json``, where ``apply_chat_template`` finds it.

    The files are written into a temporary folder inside ``directory`` and moved into place
    once all are written, so a write that fails (a full disk) is a one-line
    :class:`~scratchgpt.errors.StorageError` that leaves an earlier export there whole; Ctrl-C
    or SIGTERM removes the folder, or, once the files move, is held until they all have. The
    folder's name holds the process id (``.export.PID.X.tmp``): an export killed outright
    leaves it, and the next export into ``directory`` removes it (never a live export's), and
    one an older scratchgpt left without the id (``.export.X.tmp``) once a day old. One killed
    outright as the files move leaves its marker (``.export-moving.PID.X.tmp``), and every
    reader refuses the directory until the next export replaces it whole (see
    :func:`check_export_whole`)."""
    check_gpt_to_export(model, "Hugging Face format")
    _check_template_name(chat_template)  # (before anything is written, and not taken for a
    # failure to write: the writer reports what it raises as the disk's)
    directory = Path(directory)
    created = missing_folders(directory)
    directory.mkdir(parents=True, exist_ok=True)
    remove_dead_temporaries(directory, STAGING, UNTAGGED_STAGING)
    earlier = "export" if is_hf_dir(directory) and not moving_markers(directory) else None
    staging = directory / temporary_name(STAGING)
    try:
        staging.mkdir()
        _write_hf_files(model, staging, tokenizer, chat_template)
    except BaseException as e:  # Ctrl-C too: no temporary folder, no new empty directory
        shutil.rmtree(staging, ignore_errors=True)
        remove_folders(created)  # (only while empty: another process may have written there)
        if isinstance(e, ScratchGPTError) or not isinstance(e, Exception):
            raise
        # a full disk or no permission: an OSError, or safetensors' own error, naming the
        # temporary folder
        raise write_failure(directory, e, earlier) from None
    with signals_held():  # half moved, the directory would hold neither export
        _move_in(staging, directory)
    return directory


def _check_template_name(name: str | None) -> None:
    from scratchgpt.chat import TEMPLATES

    if name is not None and name not in TEMPLATES:
        raise ConfigError(f"unknown chat template {name!r}; the templates are "
                          f"{', '.join(sorted(TEMPLATES))}")


def _move_in(staging: Path, directory: Path) -> None:
    """Replace the model in ``directory`` (an earlier export's, whole or cut short) by the
    files of ``staging``, under a marker (:data:`MOVING`) from before the first old file goes
    until the last new one is in place, each made durable before the next step: a kill or a
    power loss in between leaves the marker, which readers refuse, and the next export
    replaces everything again and removes it (and those of exports killed before)."""
    earlier = is_hf_dir(directory)  # none of an earlier model's files may outlive it
    marker = directory / temporary_name(MOVING)
    os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    fsync_dir(directory)
    if earlier:
        _clear_directory(directory)
    for f in staging.iterdir():
        os.replace(f, directory / f.name)
    staging.rmdir()
    fsync_dir(directory)
    for done in (*dead_temporaries(directory, MOVING), marker):
        done.unlink(missing_ok=True)
    fsync_dir(directory)


def _write_hf_files(model: nn.Module, directory: Path, tokenizer: Any,
                    chat_template: str | None) -> None:
    """The files of :func:`save_hf`, written into the empty ``directory``."""
    from safetensors.torch import save_file

    from scratchgpt.chat import TEMPLATES

    cfg = model.config.to_dict()
    eos = getattr(tokenizer, "eot_id", None)
    hf_cfg = config_to_hf(cfg, eos)
    if chat_template is not None:
        hf_cfg[CHAT_TEMPLATE_KEY] = chat_template
    tensors = state_dict_to_hf(model.state_dict(), cfg["tie_weights"])
    weights = directory / "model.safetensors"
    save_file({k: v.float() for k, v in tensors.items()}, str(weights), metadata={"format": "pt"})
    os.chmod(weights, 0o666 & ~current_umask())  # safetensors makes it 0600, unlike the rest
    (directory / CONFIG_FILE).write_text(json.dumps(hf_cfg, indent=2) + "\n")
    (directory / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": eos, "eos_token_id": eos}, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(directory / OUR_TOKENIZER_DIR)
        if has_hf_form(tokenizer):
            from scratchgpt.tokenizers.bpe_files import write_hf_tokenizer

            write_hf_tokenizer(tokenizer, directory, cfg["block_size"],
                               TEMPLATES[chat_template].jinja if chat_template else None)


def has_hf_form(tokenizer: Any) -> bool:
    """Whether :func:`save_hf` writes ``tokenizer`` in Hugging Face's own files too (vocab.json,
    merges.txt, tokenizer_config.json with the chat template): byte-level BPE does; a
    character vocabulary has no such form and is kept in ``scratchgpt-tokenizer/`` only."""
    return getattr(tokenizer, "kind", None) == "bpe"


def _clear_directory(directory: Path) -> None:
    """Remove the files of the Hugging Face model (ours or another tool's) in ``directory``;
    other files stay: the shards its index lists go with it."""
    shards = [s for index in SHARD_INDEXES for s in _shard_names(directory / index)]
    for name in (*shards, *DIRECTORY_FILES, *WEIGHT_FILES):
        (directory / name).unlink(missing_ok=True)
    shutil.rmtree(directory / OUR_TOKENIZER_DIR, ignore_errors=True)


def _shard_names(index: Path) -> list[str]:
    """The files beside it that a shard index lists; none where it is absent or unreadable."""
    try:
        return [s for s in listed_shards(index) if Path(s).name == s]
    except CheckpointError:
        return []


# ---- tokenizers

def hf_tokenizer(directory: str | Path, required: bool = True,
                 config: HFConfig | None = None) -> Any:
    """The tokenizer of a Hugging Face directory, or None when it has none and not required.

    Looks for, in order: ``scratchgpt-tokenizer/`` (written by :func:`save_hf`), a Hugging
    Face ``tokenizer.json``, ``vocab.json`` + ``merges.txt``, ``encoder.json`` + ``vocab.bpe``.
    The last three are GPT-2 byte-level BPE, read by ``BPETokenizer``. A tokenizer with more
    ids than config.json's ``vocab_size`` is a CheckpointError: the model could not embed
    them (fewer is fine: GPT-2 models may pad their vocabulary). ``config``: as
    :func:`load_hf` takes it."""
    directory = Path(directory)
    tok = _read_tokenizer(directory, required)
    config = config or read_hf_config(directory)
    vocab = config.get("vocab_size")
    n = getattr(tok, "vocab_size", None)
    if isinstance(vocab, int) and isinstance(n, int) and n > vocab:
        raise CheckpointError(f"{directory}: its tokenizer has {n:,} tokens but {config.path.name} "
                              f"says vocab_size={vocab:,}; the tokenizer belongs to another "
                              "model")
    return tok


def _read_tokenizer(directory: Path, required: bool) -> Any:
    from scratchgpt.tokenizers import load_tokenizer

    if (directory / OUR_TOKENIZER_DIR / "tokenizer.json").is_file():
        return load_tokenizer(directory / OUR_TOKENIZER_DIR)
    candidates = [("tokenizer.json",), ("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")]
    found = next((c for c in candidates if all((directory / f).is_file() for f in c)), None)
    if found is None:
        if required:
            raise CheckpointError(f"{directory} has no tokenizer (tokenizer.json, vocab.json + "
                            "merges.txt, or encoder.json + vocab.bpe)")
        return None
    try:
        from scratchgpt.tokenizers.bpe import BPETokenizer
    except ImportError:
        raise CheckpointError(f"{directory}: reading its {found[0]} needs the BPE tokenizer "
                        "(scratchgpt.tokenizers.bpe), which this install lacks") from None
    if found == ("tokenizer.json",):
        return BPETokenizer.from_hf_json(directory / "tokenizer.json")
    return BPETokenizer.from_gpt2_files(directory / found[0], directory / found[1])


def _ours_already(source: str | Path) -> str:
    """``"; it is a scratchgpt run ..."`` when ``source`` is a run directory or a ``.pt`` file,
    which a user may take for what ``--from hf`` reads: nothing needs converting. A GGUF file
    is named so: scratchgpt does not read one."""
    from scratchgpt.checkpoints.io import GGUF_NOT_READ, is_gguf
    from scratchgpt.checkpoints.rundir import RunDir

    path = Path(source)
    if path.is_file() and is_gguf(path):
        return f": it is a GGUF file, for llama.cpp, and {GGUF_NOT_READ}"
    what = ("run" if RunDir(path).has_checkpoint()
            else "checkpoint" if path.is_file() and path.suffix == ".pt" else None)
    if what is None:
        return ""
    return (f": it is a scratchgpt {what}, which every command reads as it is (for a Hugging "
            f"Face directory of it: convert --to hf --checkpoint {path} --out DIR)")


def import_hf(source: str | Path, out: str | Path,
              overwrite: bool = False) -> tuple[Path, bool]:
    """Write the Hugging Face GPT-2 directory ``source`` as our run directory ``out``
    (``best.pt`` with the tokenizer inside, ``tokenizer.json``, ``config.json``), with the
    chat template the directory names, if any. -> (the run, whether ``source`` had a tokenizer
    for it: without one the run holds weights only, which nothing can prompt)."""
    from scratchgpt.checkpoints.io import Checkpoint
    from scratchgpt.checkpoints.rundir import write_model_run

    if not is_hf_dir(source):
        raise CheckpointError(f"{source} is not a Hugging Face directory (config.json plus "
                              "model.safetensors, pytorch_model.bin or the shards of either)"
                              f"{_ours_already(source)}")
    config = read_hf_config(source)  # read once, for the model, tokenizer and template
    model, _ = load_hf(source, config)
    tok = hf_tokenizer(source, required=False, config=config)
    template = hf_chat_template(source, config)
    data = {"converted_from": str(source),
            **({"chat_template": template} if template is not None else {})}
    checkpoint = Checkpoint("gpt", model.config, model.state_dict(),
                            {"text": tok.state()} if tok is not None else {}, data)
    return write_model_run(out, checkpoint, tok, overwrite), tok is not None


def check_gpt_to_export(model: Any, target: str) -> None:
    """Only a GPT language model exports to ``target`` ("Hugging Face format", "GGUF"), both
    GPT-2's layout; any other is refused naming its model as the user knows it (its type and
    the command that made it), where the model's class name was all it said."""
    from scratchgpt.models import model_type
    from scratchgpt.models.gpt import GPT

    if isinstance(model, GPT):
        return
    try:
        kind = model_type(model.config)
    except (AttributeError, ConfigError):
        kind = type(model).__name__
    if kind == "gpt-classifier":
        raise CheckpointError(f"a gpt-classifier run (finetune --task classify) ends in a "
                              f"classification head, which GPT-2's layout in {target} cannot "
                              "hold; only a GPT language model exports (label texts with "
                              "scratchgpt classify)")
    raise CheckpointError(f"a model of type {kind} cannot be exported to {target}, which holds "
                          "GPT-2's layout: only a GPT language model exports")
