"""LoRA's hyperparameters (:class:`LoRAConfig`) and the config of a GPT with adapters
(:class:`GPTLoRAConfig`, ``gpt-lora`` in the registry): plain data, no torch (the adapters
are ``models/lora.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from scratchgpt.errors import ConfigError
from scratchgpt.models.configs.gpt import GPTConfig
from scratchgpt.validation import check_range, refuse_unknown_fields

# LoRAConfig.targets' names -> the GPT Linear layers (module-name suffixes) they adapt
TARGETS: dict[str, tuple[str, ...]] = {
    "qkv": ("attn.c_attn",),
    "attn": ("attn.c_attn", "attn.c_proj"),
    "mlp": ("mlp.c_fc", "mlp.c_proj"),
}


@refuse_unknown_fields
@dataclass
class LoRAConfig:
    """LoRA's hyperparameters (each is a ``--lora-*`` flag). A refusal names the field
    (``rank must be >= 1``), as a Python caller gives it; the commands name their flag."""

    rank: int = field(default=8, metadata={"help": "rank r of the update B A"})
    alpha: float = field(default=16.0, metadata={"help": "the update is scaled by alpha / r"})
    dropout: float = field(default=0.0, metadata={"help": "dropout on the LoRA path's input"})
    targets: str = field(default="attn,mlp", metadata={
        "help": "comma-separated layers to adapt: qkv (attention's input projection), attn "
                "(qkv and attention's output projection), mlp (both MLP layers)"})

    def __post_init__(self) -> None:
        if isinstance(self.rank, int) and self.rank < 1:
            raise ConfigError(f"rank must be >= 1, got {self.rank} (a rank-0 update adapts "
                              "nothing; train without adapters instead)")
        check_range("alpha", self.alpha, 0, low_open=True)
        check_range("dropout", self.dropout, 0, 1, high_open=True)
        self.target_layers()  # validates

    def target_layers(self) -> tuple[str, ...]:
        """The module-name suffixes to adapt."""
        names = [t.strip() for t in self.targets.split(",") if t.strip()]
        unknown = [t for t in names if t not in TARGETS]
        if unknown or not names:
            raise ConfigError(f"targets must be comma-separated names from "
                              f"{', '.join(TARGETS)}, got {self.targets!r}")
        return tuple(dict.fromkeys(s for t in names for s in TARGETS[t]))

    def check_width(self, width: int) -> None:
        """The rank is at most ``width``, the narrowest side of the layers it adapts: ``B A``
        of a higher rank is still of rank <= width, more parameters for the same updates."""
        if self.rank > width:
            raise ConfigError(f"rank ({self.rank}) must be at most the width of the layers it "
                              f"adapts ({width}): a higher rank adds parameters, not updates "
                              "it can make")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


# ---- a GPT language model with adapters: the model of LoRA instruction tuning and continued
# pretraining (``gpt-lora`` in the registry)


@refuse_unknown_fields
@dataclass
class GPTLoRAConfig:
    """A GPT (``gpt``, its base's config) whose ``lora.targets`` layers carry adapters; only
    the adapters train."""

    gpt: GPTConfig = field(default_factory=GPTConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)

    def __post_init__(self) -> None:
        self.lora.check_width(self.gpt.n_embd)  # (every layer a GPT's targets name is so wide)

    @property
    def block_size(self) -> int:
        """The context of the language model (its base's): a ``gpt-lora`` is read, resumed
        and evaluated as the GPT it adapts."""
        return self.gpt.block_size
