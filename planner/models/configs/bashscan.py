"""Scanning a bash script's text as bash reads it, never running it: where a `${` or `$(` closes, what lies
outside quotes and comments, and which word names the script a line runs (planner/models/configs/bashargs.py)."""

from __future__ import annotations

import re


def brace_end(text: str, i: int) -> int:
    """The index of the '}' closing the '${' at i, past the expansions nested in it (`${A:-"${B}/$(date)"}`,
    Megatron-LM d98e8a64 examples/mimo/scripts/run_hetero_nemotron_20l_mock_train.sh line 14); -1 if none."""
    depth, j, double = 0, i, False
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text.startswith("$(", j):
            end = matching(text, j + 1)
            if end < 0:
                return -1
            j = end + 1
            continue
        if text.startswith("${", j):
            depth, j = depth + 1, j + 2
            continue
        if text[j] == '"':
            double = not double
        elif text[j] == "'" and not double:  # single quotes quote a '}' outside double ones
            j = text.find("'", j + 1)
            if j < 0:
                return -1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return -1


def matching(text: str, i: int) -> int:
    """The index of the ')' closing the '(' at i (nesting and quotes respected); -1 if none (the caller names the
    file and line)."""
    depth, quote = 0, None
    for j in range(i, len(text)):
        c = text[j]
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j
    return -1


def depth_after(line: str, depth: int) -> tuple[int, int | None]:
    """(the parenthesis depth after `line`, the index of the ')' that closes depth 1, if any),
    quotes and comments respected."""
    for j, c in unquoted(line):
        if c is None:  # the comment
            break
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return 0, j
    return depth, None


def unquoted(line: str):
    """(index, character) of `line` outside quotes; at a `# comment` (a '#' starting a word),
    (its index, None) and no more."""
    quote = None
    for j, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (j == 0 or line[j - 1] in " \t"):
            yield j, None
            return
        else:
            yield j, c


def without_comments(text: str) -> str:
    """`text` with each line's `# comment` (a '#' starting a word, outside quotes) removed."""
    out = []
    for line in text.split("\n"):
        out.append(line[:next((j for j, c in unquoted(line) if c is None), len(line))])
    return "\n".join(out)


def module_file(word: str) -> str:
    """A module run with `-m` (python's, or torchrun's `--module`) as its file: `-m examples.mimo.pretrain_mimo`
    (Megatron-LM d98e8a64 examples/mimo/scripts/run_hetero_nemotron_20l_mock_train.sh) runs
    examples/mimo/pretrain_mimo.py; torch's own launcher (`-m torch.distributed.run`) stays as it is."""
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", word) or word.startswith("torch."):
        return word
    return word.replace(".", "/") + ".py"


def is_trainer(word: str) -> bool:
    name = word.rsplit("/", 1)[-1]
    return name.startswith("pretrain_") and name.endswith(".py")
