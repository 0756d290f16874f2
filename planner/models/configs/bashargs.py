"""A Megatron-LM launch script read as text, never run: its `VAR=value` assignments, arrays
(`ARGS=( ... )`, `ARGS+=( ... )`), `${VAR}` / `$VAR` / `${VAR:-default}` / `$((arithmetic))`
expansions and simple `if [[ "$X" == "y" ]]` tests are followed within the file, and the line
that starts `pretrain_*.py` gives the arguments (the words before it, torchrun's, give the
world size). A `$(command)` is never run: its value is a marker the reader reports. A here-document
written to a file (`cat <<EOT > $DS_CONFIG ... EOT`, as Megatron-DeepSpeed's examples write their
ds_config) is kept as text, expanded as bash would (not with a quoted delimiter), by the path it names."""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

from planner.errors import UserError
from planner.models.configs.bashscan import (
    brace_end,
    depth_after,
    is_trainer,
    matching,
    module_file,
    without_comments,
)

COMMAND_MARK = "\x00$("  # a value that a command would have made: never run, reported by the reader


@dataclass
class Script:
    """What the script says: the trainer's arguments, torchrun's, and what could not be decided."""

    args: list[str]
    launcher_args: list[str]
    trainer: str
    notes: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # here-documents the script writes, by path as written
    exports: dict[str, str] = field(default_factory=dict)  # `export NAME=value` before the trainer line: its environment


def read_script(text: str, where: str) -> Script:
    """The arguments of the `pretrain_*.py` line of a bash script (see the module docstring)."""
    shell = _Shell(where)
    lines = _logical_lines(text)
    shell.run(lines)
    if shell.launch is None and "CKPLAN_MEGATRON_ARGS" in shell.vars:
        raise UserError(f"{where} is ckplan's Megatron-LM export: it sets CKPLAN_MEGATRON_ARGS and runs no trainer; "
                        "read the script that launches it, or add its launch line, e.g. `torchrun --nproc_per_node 8 "
                        "pretrain_gpt.py \"${CKPLAN_MEGATRON_ARGS[@]}\" --vocab-size N` (the export leaves the "
                        "vocabulary to your tokenizer)")
    if shell.launch is None:
        other = shell.other_script
        runs = f": line {other[0]} runs {other[1]}, which ckplan does not read" if other else ""
        raise UserError(f"{where}: no line runs a Megatron-LM trainer (pretrain_gpt.py or another "
                        f"pretrain_*.py){runs}; give the script that launches training, or the arguments as a YAML "
                        "mapping")
    if shell.defaults:
        said = ", ".join(f"{'$' * name.isdigit()}{name}={value if value and ' ' not in value else repr(value)}"
                         for name, value in shell.defaults.items())
        shell.notes.append(f"read at the script's defaults, its environment and arguments unknown to ckplan: {said}; "
                           "set them in the file to score other values")
    return shell.launch


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) with backslash-newline continuations joined and blank lines dropped."""
    out, pending, start = [], "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        if pending.strip():
            out.append((start, pending))
        pending = ""
    if pending.strip():
        out.append((start, pending))
    return out


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_ASSIGN = re.compile(r"^(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?)?([A-Za-z_][A-Za-z0-9_]*)(\+?=)(.*)$", re.S)
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Div: operator.floordiv, ast.Mod: operator.mod}


class _Shell:
    """Enough of bash to follow a launch script's variables, and nothing that runs anything."""

    def __init__(self, where: str):
        self.where = where
        self.vars: dict[str, list[str] | str] = {}
        self.launch: Script | None = None
        self.notes: list[str] = []
        self.files: dict[str, str] = {}
        self.other_script: tuple[int, str] | None = None  # the first line running a Python file not a trainer
        self.defaults: dict[str, str] = {}  # ${NAME:-default} read at its default: NAME not set in the file
        self.exports: dict[str, str] = {}  # variables the script exports, at their values

    # ------------------------------------------------------------ statements

    def run(self, lines: list[tuple[int, str]]) -> None:
        i = 0
        taking = [True]  # one entry per open `if`: whether its current branch is read
        decided = [True]
        while i < len(lines):
            number, line = lines[i]
            stripped = line.strip()
            words = stripped.split()
            head = words[0] if words else ""
            if head in ("if", "elif"):
                condition = re.sub(r";\s*then\s*$", "", stripped[len(head):]).strip()
                value = self._condition(condition, number)
                if head == "if":
                    taking.append(value is not False)
                    decided.append(value is True)
                else:
                    taking[-1] = not decided[-1] and value is not False
                    decided[-1] = decided[-1] or value is True
                i += 1
                continue
            if head == "else":
                taking[-1], decided[-1] = not decided[-1], True
                i += 1
                continue
            if head == "fi":
                taking.pop(), decided.pop()
                i += 1
                continue
            if head in ("then", "do", "done") or head.startswith("#"):
                i += 1
                continue
            heredoc = _HEREDOC.search(stripped)
            if heredoc:
                i = self._heredoc(lines, i, heredoc, write=all(taking))
            elif all(taking):
                i = self._statement(lines, i)
            else:
                i = self._skip(lines, i)

    def _heredoc(self, lines, i: int, heredoc, *, write: bool) -> int:
        """Past the here-document starting at line i; its text kept by the path after `>` where it is written."""
        number, delimiter = lines[i][0], heredoc.group(2)
        end = next((j for j in range(i + 1, len(lines)) if lines[j][1].strip() == delimiter), None)
        if end is None:
            raise UserError(f"{self.where}, line {number}: the here-document <<{delimiter} is never closed by a "
                            f"line `{delimiter}`; give a script bash can read")
        target = re.search(r">\s*(\S+)", lines[i][1][heredoc.end():])
        if write and target:
            body = "\n".join(line for _, line in lines[i + 1:end])
            path = " ".join(w for w, _ in self._words(target.group(1), number))
            self.files[path] = body if heredoc.group(1) else self._expand(body, number)
        return end + 1

    def _expand(self, text: str, number: int) -> str:
        """`text` with its `$` expansions made, as an unquoted here-document's body (no word splitting)."""
        out, i = [], 0
        while i < len(text):
            if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "$`\\":
                out.append(text[i + 1])
                i += 2
            elif text[i] == "$":
                value, i, _ = self._dollar(text, i, number)
                out.append(" ".join(value) if isinstance(value, list) else value)
            else:
                out.append(text[i])
                i += 1
        return "".join(out)

    def _skip(self, lines, i: int) -> int:
        """Past the statement at i (an array literal may span lines)."""
        match = _ASSIGN.match(lines[i][1].strip())
        if match and match.group(3).lstrip().startswith("("):
            return self._array_end(lines, i)[0]
        return i + 1

    def _array_end(self, lines, i: int) -> tuple[int, str]:
        """(the index after the array literal starting at line i, its text between the parentheses)."""
        first = _ASSIGN.match(lines[i][1].strip()).group(3).lstrip()[1:]
        body, j, depth = [], i, 1
        line = first
        while True:
            depth, cut = depth_after(line, depth)
            if cut is not None:
                body.append(line[:cut])
                return j + 1, "\n".join(body)
            body.append(line)
            j += 1
            if j == len(lines):
                raise UserError(f"{self.where}, line {lines[i][0]}: an array opened with '(' is never closed; "
                                "give a script bash can read")
            line = lines[j][1]

    def _statement(self, lines, i: int) -> int:
        number, line = lines[i]
        stripped = line.strip()
        match = _ASSIGN.match(stripped)
        if match:
            name, op, value = match.groups()
            if value.lstrip().startswith("("):
                end, body = self._array_end(lines, i)
                items = [w for w, _ in self._words(without_comments(body), number)]
                old = self.vars.get(name, []) if op == "+=" else []
                self.vars[name] = (old if isinstance(old, list) else [old]) + items
                return end
            words = self._words(value, number)
            text = " ".join(w for w, _ in words) if words else ""
            old = self.vars.get(name, "") if op == "+=" else ""
            if isinstance(old, list):
                self.vars[name] = old + [text]
            else:
                self.vars[name] = old + text
            if re.match(r"export\s", stripped) or name in self.exports:  # an exported variable set again stays exported
                self._export(name)
            return i + 1
        words = self._words(stripped, number)
        if words and words[0][0] == "export":  # `export NAME ...`: names set before (an unset one exports nothing)
            for word, _ in words[1:]:
                if _NAME.fullmatch(word) and word in self.vars:
                    self._export(word)
            return i + 1
        words = [(module_file(w) if k and words[k - 1][0] in ("-m", "--module") else w, q)
                 for k, (w, q) in enumerate(words)]
        trainer = next((k for k, (w, _) in enumerate(words) if is_trainer(w)), None)
        script = next((w for w, _ in words if w.endswith(".py")), None)
        if trainer is None and script is not None and self.other_script is None:
            self.other_script = (number, script)
        if trainer is not None:
            if self.launch is not None:
                self.notes.append(f"line {number}: a second trainer line; the first one ({self.launch.trainer}) "
                                  "is read")
            else:
                self.launch = Script(args=_split_flags([w for w, _ in words[trainer + 1:]]),
                                     launcher_args=[w for w, _ in words[:trainer]], trainer=words[trainer][0],
                                     notes=self.notes, files=self.files, exports=dict(self.exports))
        return i + 1

    def _export(self, name: str) -> None:
        value = self.vars[name]
        if isinstance(value, str):  # an array is never in the environment
            self.exports[name] = value

    # ------------------------------------------------------------ conditions

    def _condition(self, text: str, number: int) -> bool | None:
        """The value of `[[ a == b ]]` / `[ -z a ]` tests joined by || and &&; None where it
        cannot be decided from the file (said in a note; the `then` branch is read)."""
        ors = re.split(r"\s*\|\|\s*", text)
        values = []
        for part in ors:
            ands = [self._test(term.strip(), number) for term in re.split(r"\s*&&\s*", part)]
            values.append(None if None in ands and all(a is not False for a in ands) else all(a for a in ands))
        value = True if True in values else None if None in values else False
        if value is None:
            self.notes.append(f"line {number}: the test {text!r} cannot be decided without running anything; "
                              "its `then` branch was read")
        return value

    def _test(self, text: str, number: int) -> bool | None:
        inner = re.fullmatch(r"\[\[?\s*(.*?)\s*\]\]?", text)
        if inner is None:
            return None
        words = [w for w, _ in self._words(inner.group(1), number)]
        negate = bool(words) and words[0] == "!"
        words = words[1:] if negate else words
        if any(COMMAND_MARK in w for w in words):
            return None
        if len(words) == 3 and words[1] in ("==", "=", "!="):
            value = (words[0] == words[2]) == (words[1] != "!=")
        elif len(words) == 2 and words[0] in ("-z", "-n"):
            value = (words[1] == "") == (words[0] == "-z")
        elif len(words) == 1:
            value = words[0] != ""
        else:
            return None
        return value != negate

    # ------------------------------------------------------------ words

    def _words(self, text: str, number: int) -> list[tuple[str, bool]]:
        """The words of `text` after expansion: (word, quoted). An unquoted array expansion
        gives one word per element, each split again on blanks as bash splits it."""
        words: list[tuple[str, bool]] = []
        current: list[str] = []
        quoted = started = False
        i, n = 0, len(text)

        def flush():
            nonlocal current, quoted, started
            if started:
                words.append(("".join(current), quoted))
            current, quoted, started = [], False, False

        while i < n:
            c = text[i]
            if c in " \t\n;" and True:
                flush()
                i += 1
                continue
            if c == "#" and not started:
                while i < n and text[i] != "\n":
                    i += 1
                continue
            if c == "'":
                end = text.find("'", i + 1)
                end = n if end < 0 else end
                current.append(text[i + 1:end])
                quoted = started = True
                i = end + 1
                continue
            if c == '"':
                i += 1
                started = quoted = True
                while i < n and text[i] != '"':
                    if text[i] == "\\" and i + 1 < n:
                        current.append(text[i + 1])
                        i += 2
                    elif text[i] == "$":
                        value, i, _ = self._dollar(text, i, number)
                        if isinstance(value, list) and not current and text[i - 4:i + 1] == '[@]}"':
                            words.extend((item, True) for item in value)  # "${A[@]}": a word per element
                            started = quoted = False
                            continue
                        current.append(" ".join(value) if isinstance(value, list) else value)
                    else:
                        current.append(text[i])
                        i += 1
                i += 1
                continue
            if c == "\\" and i + 1 < n:
                current.append(text[i + 1])
                started = True
                i += 2
                continue
            if c == "$":
                value, i, _ = self._dollar(text, i, number)
                if isinstance(value, list):  # unquoted ${A[@]}: its elements, each split on blanks
                    flush()
                    words.extend((part, False) for item in value for part in item.split())
                    continue
                if value and not current and (i >= n or text[i] in " \t\n;"):
                    words.extend((part, False) for part in value.split())
                    continue
                current.append(value)
                started = True
                continue
            current.append(c)
            started = True
            i += 1
        flush()
        return words

    def _dollar(self, text: str, i: int, number: int):
        """(the expansion of the `$...` at i, the index after it, kind)."""
        rest = text[i + 1:]
        if rest.startswith("("):
            end = matching(text, i + 1)
            if end < 0:
                opened = "$((" if rest.startswith("((") else "$("
                raise UserError(f"{self.where}, line {number}: '{opened}' is never closed; give a script bash can read")
        if rest.startswith("(("):
            return self._arithmetic(text[i + 3:end - 1], number), end + 1, "arith"
        if rest.startswith("("):
            command = text[i + 2:end].strip()
            return f"{COMMAND_MARK}{command})", end + 1, "command"
        if rest.startswith("{"):
            end = brace_end(text, i)
            if end < 0:
                raise UserError(f"{self.where}, line {number}: '${{' is never closed; give a script bash can read")
            return self._braced(text[i + 2:end], number), end + 1, "var"
        match = _NAME.match(rest) or re.match(r"[0-9@*#?]", rest)
        if match is None:
            return "$", i + 1, "text"
        return self._value(match.group(0)), i + 1 + match.end(), "var"

    def _braced(self, inner: str, number: int):
        array = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]", inner)
        if array:
            value = self.vars.get(array.group(1), [])
            return value if isinstance(value, list) else [value]
        default = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+):?[-=](.*)", inner, re.S)
        if default:
            value = self._value(default.group(1))
            if value == "":
                words = " ".join(w for w, _ in self._words(default.group(2), number))
                if default.group(1) not in self.vars:  # the environment's (or a positional parameter's) default
                    self.defaults.setdefault(default.group(1), words)
                return words
            return value
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+", inner):
            return self._value(inner)
        self.notes.append(f"line {number}: ${{{inner}}} is an expansion ckplan does not follow; read as empty")
        return ""

    def _value(self, name: str) -> str:
        value = self.vars.get(name, "")  # positional parameters and the environment: empty
        return " ".join(value) if isinstance(value, list) else value

    def _arithmetic(self, expression: str, number: int) -> str:
        expanded = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: self._value(m.group(1)) or "0", expression)
        expanded = re.sub(r"\b([A-Za-z_][A-Za-z0-9_]*)\b", lambda m: self._value(m.group(1)) or "0", expanded)
        try:
            return str(_evaluate(ast.parse(expanded.strip(), mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError):
            self.notes.append(f"line {number}: $(({expression})) is not integer arithmetic ckplan can follow; "
                              "read as empty")
            return ""


def _evaluate(node) -> int:
    """Integer arithmetic only: numbers, + - * / %, parentheses, unary minus."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError("not integer arithmetic")


def _split_flags(words: list[str]) -> list[str]:
    return [w for w in words if w != ""]
