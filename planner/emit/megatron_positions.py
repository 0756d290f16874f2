"""A plan's sequence length and position table as Megatron-LM arguments. Megatron-LM requires
--max-position-embeddings and stops at its argument checks where it is under --seq-length, whatever the
position kind (megatron/training/arguments.py 1314-1317 and 1353-1356 at d98e8a64, framework-facts §681).
A rotary model has no table to size, so a plan run past the config's max_position_embeddings (which `profile`
and `search` allow, saying so) is written at the plan's length; a learned table shorter than the plan's
sequence is a model that does not run, refused."""

from __future__ import annotations

from planner.errors import UserError


def arguments(model, seq_len: int, arg) -> list[str]:
    """--seq-length and --max-position-embeddings (`arg` formats one flag), with a comment where the config's
    max_position_embeddings is raised to the plan's length."""
    rows = model.max_position_embeddings or seq_len
    lines = [arg("--seq-length", seq_len)]
    if rows < seq_len and not model.rotates:
        raise UserError(f"the plan runs {seq_len} tokens a sequence past the model's learned position table of "
                        f"{rows} rows, which Megatron-LM refuses and no model runs; plan again at --seq-len {rows} "
                        "or less")
    if rows < seq_len:
        lines.append(f"# the config's max_position_embeddings {rows} is under the plan's {seq_len} tokens, which "
                     "Megatron-LM refuses (arguments.py 1354): written at the plan's length (rotary positions: "
                     "no table)")
        rows = seq_len
    return lines + [arg("--max-position-embeddings", rows)]
