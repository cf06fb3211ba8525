"""The GPT's hyperparameters, :class:`GPTConfig`: plain data, no torch (the model is
``models/gpt.py``). Every field is also a ``scratchgpt train`` flag, so building the command
line reads this file and not the network."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from scratchgpt.errors import ConfigError
from scratchgpt.validation import check_range, refuse_unknown_fields


def _help(text: str) -> dict[str, str]:
    return {"help": text}


POS_ENCODINGS = ("learned", "sinusoidal", "rope")
ACTIVATIONS = ("gelu_tanh", "gelu", "relu", "relu2")
WEIGHT_INITS = ("gpt2", "torch")


@refuse_unknown_fields
@dataclass
class GPTConfig:
    """Hyperparameters of the GPT decoder. Each field is also a ``scratchgpt train`` flag
    (``--n-embd``; a bool ``x`` gives ``--x``/``--no-x``), with its help text below. Every
    default is GPT-2's architecture."""

    vocab_size: int = 65
    block_size: int = field(default=256, metadata=_help(
        "context length in tokens: the longest context a GPT attends over; other models "
        "train on sequences this long"))
    n_layer: int = field(default=6, metadata=_help("number of layers (GPT: transformer blocks)"))
    n_head: int = field(default=6, metadata=_help(
        "GPT: attention heads per layer (n_embd must be a multiple)"))
    n_embd: int = field(default=384, metadata=_help(
        "GPT: width of the embeddings and of the residual stream"))
    dropout: float = field(default=0.0, metadata=_help(
        "dropout probability (GPT: on embeddings, residual branches and attention weights)"))
    # GPT-2's attn_pdrop. On a CPU it is the dearer kind (attention then runs its written-out
    # form, not the fused kernel), so attn_dropout=0 keeps most of dropout's effect for less.
    attn_dropout: float | None = field(default=None, metadata=_help(
        "GPT: dropout on the attention weights alone (unset: --dropout; 0 is cheaper on CPUs)"))
    # GPT-2's embd_pdrop, which a Hugging Face config may set apart from resid_pdrop.
    embd_dropout: float | None = field(default=None, metadata=_help(
        "GPT: dropout on the embeddings alone, before the first block (unset: --dropout)"))
    bias: bool = field(default=True, metadata=_help(
        "GPT: biases in Linear layers and LayerNorms, as GPT-2"))
    pos_encoding: str = field(default="learned", metadata=_help(
        "GPT: learned (GPT-2's table of position vectors), sinusoidal (a fixed table, Vaswani "
        "et al.) or rope (rotary: each layer turns queries and keys by their position)"))
    tie_weights: bool = field(default=True, metadata=_help(
        "GPT: the output head shares the token embedding matrix"))
    attn_impl: str = field(default="sdpa", metadata=_help(
        "GPT: attention kernel: sdpa (fused) or math (written out; the same result)"))
    # gelu_tanh is GPT-2's tanh approximation; gelu (exact) is ~3.5x cheaper on CPUs
    activation: str = field(default="gelu_tanh", metadata=_help(
        "GPT: the MLP's nonlinearity: gelu_tanh (GPT-2), gelu (exact; cheaper on CPUs), relu, "
        "or relu2 (relu(x)^2, as in the modded-nanogpt speedrun)"))
    layer_norm_eps: float = field(default=1e-5, metadata=_help(
        "GPT: epsilon of the LayerNorms (and of --qk-norm)"))
    # -- options of the training speedruns (modded-nanogpt); off by default
    qk_norm: bool = field(default=False, metadata=_help(
        "GPT: RMS-normalize every head's queries and keys (with a learned gain) before "
        "attention, which keeps attention logits in range"))
    zero_init_proj: bool = field(default=False, metadata=_help(
        "GPT: initialize every output projection (attention's and the MLP's c_proj) to zero, "
        "so each block starts as the identity"))
    value_embeds: int = field(default=0, metadata=_help(
        "GPT: N extra token-embedding tables mixed into the attention values of the first N "
        "and the last N layers (v = (1 - a) v + a ve, a learned per layer); 0 = none"))
    unet_skips: bool = field(default=False, metadata=_help(
        "GPT: U-net skip connections: each of the last n_layer/2 blocks first adds a learned "
        "multiple of the output of its mirror block in the first half"))
    logit_softcap: float = field(default=0.0, metadata=_help(
        "GPT: squash the logits into (-c, c) with c * tanh(logits / c); 0 = off"))
    # -- parts that "Let's build GPT" adds one at a time; all on by default
    residual: bool = field(default=True, metadata=_help(
        "GPT: residual connections (--no-residual: a block computes x = attn(ln(x)), then "
        "x = mlp(ln(x)))"))
    layernorm: bool = field(default=True, metadata=_help(
        "GPT: LayerNorms (--no-layernorm: every LayerNorm, the final one too, is the identity)"))
    mlp: bool = field(default=True, metadata=_help(
        "GPT: the feed-forward layer of each block (--no-mlp: attention only)"))
    weight_init: str = field(default="gpt2", metadata=_help(
        "GPT: initial weights: gpt2 (every weight N(0, 0.02), residual projections scaled by "
        "1/sqrt(2 n_layer)) or torch (PyTorch's own defaults: Linear U(+-1/sqrt(fan_in)), "
        "embeddings N(0, 1); what the from-scratch lectures build with)"))

    def __post_init__(self) -> None:
        self._check_sizes()
        self._check_choices()
        self._check_options()

    def _check_sizes(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head != 0:
            raise ConfigError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )
        check_range("dropout", self.dropout, 0, 1, high_open=True)
        check_range("attn_dropout", self.attn_dropout, 0, 1, high_open=True)
        check_range("embd_dropout", self.embd_dropout, 0, 1, high_open=True)
        # an epsilon <= 0 divides by zero on a constant input: NaN weights after one step
        check_range("layer_norm_eps", self.layer_norm_eps, 0, 1, low_open=True)

    def _check_choices(self) -> None:
        for name, choices in (("pos_encoding", POS_ENCODINGS), ("activation", ACTIVATIONS),
                              ("attn_impl", ("sdpa", "math")), ("weight_init", WEIGHT_INITS)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"{name} must be one of {', '.join(choices)}, got "
                                  f"{getattr(self, name)!r}")

    def _check_options(self) -> None:
        head_dim = self.n_embd // self.n_head
        if self.pos_encoding == "rope" and head_dim % 2:
            raise ConfigError(f"pos_encoding (rope) needs an even head width, as it rotates "
                              f"pairs of features: n_embd / n_head = {head_dim}")
        if not 0 <= self.value_embeds <= self.n_layer:
            raise ConfigError(f"value_embeds must be in [0, n_layer = {self.n_layer}], got "
                              f"{self.value_embeds}")
        if self.zero_init_proj and not self.residual:
            raise ConfigError("zero_init_proj needs residual connections: without them every "
                              "block would start by outputting zeros")
        if self.unet_skips and self.n_layer < 2:
            raise ConfigError("unet_skips needs n_layer >= 2 (it joins first-half blocks to "
                              "second-half ones)")
        check_range("logit_softcap", self.logit_softcap, 0)

    def to_dict(self) -> dict:
        return asdict(self)
