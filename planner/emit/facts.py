"""What an export copies from a profile's recorded assumptions, typed and checked.

A profile is a file: it may have been edited, or come from elsewhere. Every value an export
writes into a script or a config file comes through here first, so a number is a number
(never text that a shell or Python would run), a flag is a flag, and a field of the wrong
type or out of range is refused in one sentence naming it.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
)

from planner.errors import UserError
from planner.models.archs import MAX_LAYERS
from planner.schema import Profile

Count = Annotated[StrictInt, Field(ge=0, le=2**40)]
Size = Annotated[StrictInt, Field(gt=0, le=2**40)]
Layers = Annotated[StrictInt, Field(gt=0, le=MAX_LAYERS)]  # an export walks them (--moe-layer-freq)


def _positive_finite(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError("must be a positive number")
    return float(value)


class RopeScaling(BaseModel):
    """Rotary positions stretched past the trained context: Llama 3.1's "llama3" (low and high
    frequency bands) or YaRN (DeepSeek), by `factor`."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    type: Literal["llama3", "yarn", "linear", "dynamic"]
    factor: float
    original_max_position_embeddings: Size | None = None

    _factor = field_validator("factor", mode="before")(_positive_finite)


class ModelFacts(BaseModel):
    """The model's dimensions as planner/models/archs.py's Arch records them (its canonical JSON plus
    rope_theta, norm_eps and rope_scaling where known)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    hidden_size: Size
    intermediate_size: Size
    num_layers: Layers
    num_heads: Size
    num_kv_heads: Size
    vocab_size: Size
    tie_word_embeddings: StrictBool
    max_position_embeddings: Size | None = None
    style: Literal["llama", "gpt"] = "llama"
    qkv_bias: StrictBool = False
    head_dim: Size | None = None
    mlp_act: Literal["gelu", "relu", "gelu_kernel", "gelu_new", "gelu_fast", "gelu_python"] = "gelu"
    sliding_window: Size | None = None
    qk_norm: StrictBool = False
    scaled_embedding: StrictBool = False
    num_experts: Count = 0
    num_experts_per_tok: Count = 0
    moe_intermediate_size: Count = 0
    num_shared_experts: Count = 0
    shared_intermediate_size: Count = 0
    shared_expert_gate: StrictBool = False
    dense_layers: Annotated[tuple[Count, ...], Field(max_length=MAX_LAYERS)] = ()
    num_mtp_layers: Count = 0
    kv_lora_rank: Count = 0
    q_lora_rank: Count = 0
    qk_rope_head_dim: Count = 0
    qk_nope_head_dim: Count = 0
    v_head_dim: Count = 0
    rope_theta: float | None = None
    norm_eps: float | None = None
    rope_scaling: RopeScaling | None = None
    rotary: StrictBool | None = None  # None: the style's own (Arch.rotates)
    residual_dropout: StrictBool | None = None  # None: the style's own (Arch.drops_residual)
    embedding_dropout: StrictBool | None = None
    attention_dropout: StrictBool | None = None
    post_norms: StrictBool = False  # Gemma 3's norms on the attention's and the MLP's outputs (Arch.post_norms)
    layer_rotary: Annotated[tuple[StrictBool, ...], Field(max_length=MAX_LAYERS)] = ()  # SmolLM3's NoPE layers

    @property
    def rotates(self) -> bool:
        if self.rotary is not None:
            return self.rotary
        return self.style == "llama" or not self.max_position_embeddings

    def drops(self, which: Literal["residual", "embedding", "attention"]) -> bool:
        """Whether the model drops there (Arch.drops_residual and its kin)."""
        given = getattr(self, f"{which}_dropout")
        return self.style == "gpt" if given is None else given

    @property
    def head_size(self) -> int:
        """Each attention head's width: head_dim where given, else hidden_size / heads."""
        return self.head_dim or self.hidden_size // self.num_heads

    @field_validator("rope_theta", mode="before")
    @classmethod
    def _positive(cls, value: object) -> float | None:
        return None if value is None else _positive_finite(value)

    @field_validator("norm_eps", mode="before")
    @classmethod
    def _epsilon(cls, value: object) -> float | None:
        if value is not None and _positive_finite(value) >= 1:
            raise ValueError("must be a number between 0 and 1")
        return None if value is None else float(value)


class Facts(BaseModel):
    """The profile's assumptions an export reads."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    arch: str | None = None
    seq_len: Size | None = None
    tp: Annotated[StrictInt, Field(ge=1, le=2**20)] = 1
    sp: StrictBool = False
    capacity_factor: float | None = None
    model: ModelFacts | None = None

    @field_validator("capacity_factor", mode="before")
    @classmethod
    def _factor(cls, value: object) -> float | None:
        return None if value is None else _positive_finite(value)


def read(profile: Profile) -> Facts:
    """The profile's facts, typed; one sentence naming the field where one is not what it must be."""
    try:
        return Facts.model_validate(profile.assumptions)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        if error.get("type") == "missing":
            what = f"{where} is missing"
        else:
            value = repr(error.get("input"))
            value = value if len(value) <= 60 else value[:57] + "..."
            what = f"{where} is {value}: {_said(error)}"
        raise UserError(f"the profile's recorded {what}; an export copies it into a file you run, so re-create the "
                        "profile with `ckplan profile`") from None


def _said(error: dict) -> str:
    message = str(error.get("msg", "not valid")).removeprefix("Value error, ")
    return message[0].lower() + message[1:] if message else "not valid"


def sequence_note(profile: Profile) -> str:
    """A comment line for an export whose framework config has no sequence length (the model
    and data code set it): the length the plan's numbers hold for, where the profile knows it."""
    known = read(profile)
    if known.seq_len is None:
        return ""
    return (f"# The plan's memory and times are for sequences of {known.seq_len} tokens (the profile's --seq-len): "
            "train at that length, or profile and solve again\n")
