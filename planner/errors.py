"""The one exception type that reaches the user as a sentence instead of a traceback."""


class UserError(Exception):
    """Bad input: the message says what is wrong and what to do. The CLI prints it and exits 1."""


class SolverTimeLimit(UserError):
    """The solver ran out of --time-limit before it found any plan (not: no plan fits)."""
