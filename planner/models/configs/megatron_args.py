"""Megatron-LM's flags as given, for the reader in megatron.py: each taken once by the reader that
accounts for it, its value cast and checked, and recorded as it is taken (what Job.said lists);
what no reader takes is left for megatron._rest to name."""

from __future__ import annotations

from planner.errors import UserError


class Flags:
    """The flags given, each consumed once by the reader that accounts for it."""

    def __init__(self, pairs, job_sink: list):
        self.given: dict[str, list[str]] = {}
        for flag, values in pairs:
            self.given[flag] = values
        self.sink = job_sink
        self.notes: list[str] = []

    def has(self, flag: str) -> bool:
        values = self.given.get(flag)
        return values is not None and values != ["false"]

    def take(self, flag: str, what: str, cast=str, default=None):
        """The flag's value (cast), recorded as modelled; `default` where not given."""
        if flag not in self.given:
            return default
        values = self.given.pop(flag)
        if values == ["false"]:
            self.sink.append((flag, "false", "modelled", what + " (off)"))
            return default
        if cast is bool:
            self.sink.append((flag, " ".join(values), "modelled", what))
            return True
        if len(values) != 1:
            raise UserError(f"{flag} takes one value and was given {len(values)} ({' '.join(values) or 'none'}); "
                            "give one")
        self.sink.append((flag, values[0], "modelled", what))
        return cast_value(flag, values[0], cast)

    def take_list(self, flag: str, what: str) -> list[str] | None:
        if flag not in self.given:
            return None
        values = self.given.pop(flag)
        self.sink.append((flag, " ".join(values), "modelled", what))
        return values


def cast_value(flag: str, value: str, cast):
    from planner.models.configs.bashargs import COMMAND_MARK

    if COMMAND_MARK in value:
        command = value.split(COMMAND_MARK, 1)[1]
        raise UserError(f"{flag}'s value comes from the command $({command}, which ckplan does not run; write the "
                        "value in the file")
    try:
        return cast(value)
    except ValueError:
        kind = {int: "a whole number", float: "a number"}.get(cast, "a value")
        raise UserError(f"{flag} {value!r} is not {kind}; give {kind}") from None


def positive(flag: str, value: int | None) -> int | None:
    if value is not None and value < 1:
        raise UserError(f"{flag} {value}: give 1 or more")
    return value


def check_positions(flags: Flags, seq_len: int) -> None:
    """Megatron-LM stops at its argument checks where --max-position-embeddings is under --seq-length, whatever
    the positions (rope, yarn and none too: megatron/training/arguments.py 1353-1356 at d98e8a64), so such a
    script is refused here before it is scored."""
    values = flags.given.get("--max-position-embeddings") or []
    if len(values) == 1 and values[0].isdigit() and int(values[0]) < seq_len:
        raise UserError(f"--max-position-embeddings {values[0]} is under --seq-length {seq_len}, and Megatron-LM "
                        f"stops there (\"max_position_embeddings ({values[0]}) must be greater than or equal to "
                        f"seq_length ({seq_len})\", megatron/training/arguments.py 1354 at d98e8a64); give "
                        f"--max-position-embeddings {seq_len} or more, or a --seq-length of {values[0]} or less")


def unread_positions(flags: Flags, kind: str, hidden: int) -> None:
    """A SwiGLU (LLaMA-style) model is read as rotary, so a learned position table under it (Megatron-LM's
    --position-embedding-type default learned_absolute: megatron/training/arguments.py 2397 at d98e8a64, one
    Embedding(--max-position-embeddings, --hidden-size) in the first stage's LanguageModelEmbedding) is listed as
    not modelled, given or not, rather than said to have no effect; returns None, the reader's table rows."""
    if kind != "learned_absolute":
        return None
    given = flags.given.pop("--position-embedding-type", None)
    rows = (flags.given.get("--max-position-embeddings") or ["--max-position-embeddings"])[-1]
    size = f"{int(rows) * hidden:,} parameters" if rows.isdigit() else "its parameters"
    flags.sink.append(("--position-embedding-type", " ".join(given) if given else "not given (learned_absolute)",
                       "not modelled", f"learned_absolute{'' if given else ', Megatron-LM default'}: a table of "
                       f"{rows} x {hidden} ({size}) on the first stage, with its gradient and optimizer state, "
                       "which ckplan does not charge a SwiGLU model (it reads one as rotary, and times its "
                       "rotation); give --position-embedding-type rope where the job rotates"))
    return None
