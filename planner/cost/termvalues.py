"""A layer's value of one quantity under every recompute option at once, each term evaluated once where its
row does not read the option: the bounds (planner/solve/bounds.py) ask every option of every layer, and most
step rows (the reductions, NCCL's CTAs, the step's checks) and several time rows are the same under each.

Whether a row reads its option is read from its code, never assumed: a row's value is a function of (layer,
option, ctx); where that function is plain Python whose option parameter no instruction names (not loaded,
not captured by an inner function, no `locals()`/`vars()`/`eval`), it cannot depend on it. Anything else
(a bound method, a partial, a builtin) counts as reading it. The sums run in layer_value's order (0 + the
rows in TERMS' order), so each option's figure is layer_value's to the last bit
(tests/test_termvalues.py)."""

from __future__ import annotations

import dis
import functools
import types

from planner.cost.terms import Context, LayerCost, _rows

_OPAQUE_NAMES = frozenset({"locals", "vars", "eval", "exec", "globals"})


@functools.cache
def reads_option(function) -> bool:
    """Whether a layer row's value (layer, option, ctx) may read its option (see the module's text)."""
    if not isinstance(function, types.FunctionType):
        return True
    code = function.__code__
    if code.co_argcount < 2 or code.co_flags & (0x04 | 0x08):  # *args / **kwargs: the option may be in them
        return True
    name = code.co_varnames[1]
    if name in code.co_cellvars or _OPAQUE_NAMES & set(code.co_names):
        return True
    return any(name in _names(instruction) for instruction in dis.get_instructions(code))


def _names(instruction: dis.Instruction) -> tuple:
    """The names an instruction reads or writes: one, or (CPython 3.13's LOAD_FAST_LOAD_FAST, STORE_FAST_LOAD_FAST,
    STORE_FAST_STORE_FAST; 3.14's LOAD_FAST_BORROW_LOAD_FAST_BORROW) the pair a superinstruction names, which dis gives
    as a tuple (docs/framework-facts.md §656)."""
    if instruction.opname in ("RESUME", "NOP"):
        return ()
    argval = instruction.argval
    return argval if isinstance(argval, tuple) else (argval,)


def layer_values(quantity: str, layer: LayerCost, options: range | list[int], ctx: Context) -> list[float]:
    """[layer_value(quantity, layer, o, ctx) for o in options], each row that does not read the option
    evaluated once."""
    rows: list[list[float]] = []
    for term in _rows(quantity, "layer"):
        if reads_option(term.value):
            rows.append([term.value(layer, o, ctx) for o in options])
        else:
            value = term.value(layer, options[0], ctx)
            rows.append([value] * len(options))
    return [sum(row[i] for row in rows) for i in range(len(options))]

