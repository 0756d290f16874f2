"""A torchtitan config function read without running it (`--from-torchtitan FILE.py:FUNCTION`).

torchtitan stopped shipping job TOMLs after 238fa9953e4a (2026-02): 0.3.0 and main configure a run
with a Python function returning `Trainer.Config` (torchtitan/config/manager.py `_load_config`:
`--module M --config FN` imports M's config_registry and calls FN; config/README.md at b5bcd76c).
This reads such a function's syntax tree (Python's `ast`; nothing is imported or called): the
`Trainer.Config(...)` it returns, each `config.SECTION.KEY = VALUE` after it, and a call to another
config function of the same file (the base it refines), into the sections and keys of the TOML
reader (planner/models/configs/torchtitan.py), which accounts for every one of them.

What the Python form says otherwise than the TOML did (read at b5bcd76c and in the 0.3.0 wheel):
- the model is `model_spec=model_registry(FLAVOR, attn_backend=..., converters=[...])`, from the
  family's package (`from . import model_registry` in torchtitan/models/FAMILY/config_registry.py);
- activation checkpointing is a policy config: `FullAC.Config()` (every block), `SelectiveAC.Config()`
  (every block under the per-op policy, the TOML's selective "op"), `MemoryBudgetAC.Config(...)`,
  or None (distributed/activation_checkpoint.py, ActivationCheckpointingConfig);
- Float8 is a converter, `Float8LinearConverter.Config(recipe_name="rowwise" by default, filter_fqns)`
  (components/quantization/float8.py 58-61), MX ones `MXFP8LinearConverter` and `NVFP4LinearConverter`;
- AsyncTP is `CompileConfig(enable_async_tensor_parallel=...)` (moved into compile at 737594746);
- the loss is `loss=ChunkedLossWrapper.Config(...)` (chunked cross-entropy) or `CrossEntropyLoss.Config`.
A statement or value this reader does not follow is listed (`python.line N`, unknown), never dropped.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import UserError

# config dataclass -> its section (config/configs.py); policy configs -> the TOML's mode/option
SECTIONS = {"TrainingConfig": "training", "ParallelismConfig": "parallelism", "CompileConfig": "compile",
            "CommConfig": "comm", "DebugConfig": "debug",
            "FaultTolerance": "fault_tolerance"}  # 0.3.0 experiments/torchft/config/job_config.py
AC_POLICIES = {"FullAC.Config": {"mode": "full"}, "SelectiveAC.Config": {"mode": "selective", "selective_ac_option": "op"},
               "MemoryBudgetAC.Config": {"mode": "memory_budget"}}
AC_KEYS = {"force_recompute_mm_shapes_by_fqns": "per_op_sac_force_recompute_mm_shapes_by_fqns"}
CONVERTERS = {"Float8LinearConverter.Config": "float8", "MXFP8LinearConverter.Config": "mx",
              "NVFP4LinearConverter.Config": "nvfp4"}
FLOAT8_DEFAULTS = {"recipe_name": "rowwise", "filter_fqns": []}  # float8.py 58-61 (0.3.0, b5bcd76c)
_ARITHMETIC = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.FloorDiv: lambda a, b: a // b}
_MAX_DEPTH = 8


@dataclass(frozen=True)
class Call:
    """A call as written: the callee's dotted name, its arguments' values."""

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Opaque:
    """A value this reader does not compute (a lookup, an attribute, a call's result), as written; `of`: the
    call whose attribute it is (`default_adamw(lr=...).param_groups`), where it is one."""

    text: str
    of: Call | None = None


def split(text: str) -> tuple[Path, str] | None:
    """FILE.py:FUNCTION -> (FILE.py, FUNCTION); None when the path names no Python file."""
    path, _, function = str(text).rpartition(":")
    if not path.endswith(".py"):
        return None
    return Path(path), function


def read(path: Path, function: str) -> dict:
    """The sections and keys `function` in `path` sets, as the TOML reader takes them."""
    where = f"{path}:{function}"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; give a torchtitan config file and function, FILE.py:FUNCTION") from None
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise UserError(f"{path} cannot be read as Python ({exc.__class__.__name__}); give a torchtitan config "
                        "file and function, FILE.py:FUNCTION") from None
    try:
        return _Reader(path, tree, where).config(function)
    except RecursionError:
        raise UserError(f"{where}: an expression nests too deeply to read; give a torchtitan config function") from None


class _Reader:
    def __init__(self, path: Path, tree: ast.Module, where: str):
        self.where, self.path = where, path
        self.functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        self.imports = {alias.asname or alias.name: ("." * node.level) + (node.module or "")
                        for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names}
        self.names = {alias.asname: alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                      for alias in node.names if alias.asname}  # `import NAME as ALIAS`: ALIAS -> NAME
        self.family = path.resolve().parent.name  # torchtitan/models/FAMILY/config_registry.py
        self.unfollowed: dict[str, str] = {}  # "line N" -> the statement, from every function read

    def config(self, function: str, depth: int = 0) -> dict:
        node = self.functions.get(function)
        if node is None:
            names = ", ".join(sorted(self.functions)) or "none"
            raise UserError(f"{self.where}: no function {function} at the file's top level (its functions: {names})")
        if depth > _MAX_DEPTH:
            raise UserError(f"{self.where}: config functions call each other more than {_MAX_DEPTH} deep")
        env: dict = {"__returns__": ast.unparse(node.returns)} if node.returns is not None else {}
        data: dict | None = None
        for statement in node.body:
            data = self._statement(statement, env, data, depth)
        if data is None:
            raise UserError(f"{self.where}: {function} returns no Trainer.Config this reader can follow")
        if depth == 0:  # the default said, since it changes the step (planner/emit/titan_keys.py graphs_line)
            training = data.setdefault("training", {})
            if isinstance(training, dict):  # else a section held as written (a helper's call, not followed)
                training.setdefault("disable_cuda_graphs", False)
            if self.unfollowed:
                data.setdefault("python", {}).update(self.unfollowed)
        return data

    def _statement(self, node: ast.stmt, env: dict, data: dict | None, depth: int) -> dict | None:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if docstring or isinstance(node, (ast.Assert, ast.FunctionDef, ast.Pass, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom):
                self.imports.update({a.asname or a.name: ("." * node.level) + (node.module or "") for a in node.names})
                self.names.update({a.asname: a.name for a in node.names if a.asname})
            return data  # docstrings, checks, helpers and imports set nothing
        if isinstance(node, ast.Return):
            value = self._value(node.value, env)
            return self._trainer(value) if isinstance(value, Call) else data
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            value = self._value(node.value, env)
            if isinstance(target, ast.Name):
                if isinstance(value, Call) and self._base_config(value.name, env):
                    env[target.id] = "config"
                    return self.config(value.name, depth + 1)
                env[target.id] = value
                return data
            chain = _chain(target)
            if data is not None and chain and env.get(chain[0]) == "config":
                self._set(data, chain[1:], value)
                return data
        self.unfollowed[f"line {node.lineno}"] = ast.unparse(node)[:200]
        return data

    def _base_config(self, name: str, env: dict) -> bool:
        """Whether a call to `name` is the base config the function refines: a function of this file returning
        what the caller returns (both `-> Trainer.Config`, or either unsaid). A helper of another type is a value
        (flux's `_flux_dataset(...) -> SingleDatasetConfig` in `flux_dev() -> FluxTrainer.Config`, b5bcd76c)."""
        helper = self.functions.get(name)
        if helper is None:
            return False
        caller = env.get("__returns__")
        returns = ast.unparse(helper.returns) if helper.returns is not None else None
        return caller is None or returns is None or returns == caller

    def _set(self, data: dict, chain: list[str], value) -> None:
        """config.FIELD = VALUE replaces the field's section (its other keys back to their defaults);
        config.FIELD.KEY = VALUE sets one key."""
        if len(chain) == 1:
            if chain[0] == "compile":  # a new CompileConfig resets the AsyncTP it holds (read into parallelism)
                data.get("parallelism", {}).pop("enable_async_tensor_parallel", None)
            if chain[0] == "model_spec":  # and a new model spec its converters' settings
                data.pop("quantize", None)
            for section, keys in self._section(chain[0], value).items():
                if section == {"model_spec": "model"}.get(chain[0], chain[0]) or not isinstance(keys, dict):
                    data[section] = keys
                else:
                    data.setdefault(section, {}).update(keys)
            return
        section, key = chain[0], ".".join(chain[1:])
        if section == "activation_checkpoint":
            key = AC_KEYS.get(key, key)
        if section == "compile" and key == "enable_async_tensor_parallel":
            section = "parallelism"
        held = data.get(section)
        if held is not None and not isinstance(held, dict):  # a section held as written (a call not followed): the
            data[section] = f"{held}; .{key} = {_text(value)}"  # key set in it said beside it (torchtitan's RL
            return  # `config.async_loop.batcher = ...` after `async_loop=AsyncLoopConfig(...)`, b5bcd76c)
        data.setdefault(section, {})[key] = _plain(value)

    def _converted(self, call: Call) -> str:
        """What to give instead: the config function a converter is handed, where the file imports it from
        another config registry (graph_trainer's to_graph_trainer_config(qwen3_14b(), ...) at b5bcd76c)."""
        own = self.imports.get(call.name, "")
        if own.endswith("config_registry") and not call.args:  # the base itself, from another file (ckplan's
            name = self.names.get(call.name, call.name)  # export: `from ...qwen3.config_registry import qwen3_32b
            alias = "" if name == call.name else f" (imported as {call.name})"  # as base_config`)
            return (f"it refines {name}() from {own}{alias}; give that one, --from-torchtitan "
                    f"{self._module_file(own)}:{name} (what this function changes beside it is not read)")
        base = call.args[0] if call.args else None
        source = self.imports.get(base.name.split(".")[0], "") if isinstance(base, Call) else ""
        if not source.endswith("config_registry"):
            return f"give the file and function {call.name} is defined in"
        return (f"it converts {base.name}() from {source}; give that one, --from-torchtitan "
                f"{self._module_file(source)}:{base.name} (what {call.name} changes beside it is not read)")

    def _module_file(self, module: str) -> str:
        """The file an import names: a dotted module as its path from torchtitan's checkout; a relative one
        (`from .config_registry import ...`, `from ..qwen3.config_registry import ...`) beside this file, one folder
        up a dot past the first, as Python resolves it."""
        name = module.lstrip(".")
        level = len(module) - len(name)
        if not level:
            return f"{name.replace('.', '/')}.py"
        folder = self.path.parent
        for _ in range(level - 1):
            folder = folder.parent
        return str(folder / f"{name.replace('.', '/')}.py")

    def _trainer(self, call: Call) -> dict:
        origin = self.imports.get(call.name.split(".")[0])
        if origin is not None and not call.name.endswith("Config"):
            raise UserError(f"{self.where} builds its config with {call.name}() from {origin}, which this reader "
                            f"does not open (it reads one file, never importing it): {self._converted(call)}")
        if not call.name.endswith("Config"):
            raise UserError(f"{self.where} returns {call.name}(...), not a Trainer.Config this reader can follow")
        if call.name.split(".")[-2:-1] == ["Controller"]:  # b5bcd76c torchtitan/experiments/rl/controller.py 261-330
            raise UserError(f"{self.where} returns {call.name}(...), torchtitan's RL loop (a PolicyTrainer beside vLLM "
                            "generators on their own GPUs), not a training job ckplan scores: its trainer's settings sit "
                            "in trainer=PolicyTrainer.Config(...), which this reader does not take as a job; give a "
                            "config function returning a Trainer.Config")
        data: dict = {}
        if call.args:
            data["python"] = {"Trainer.Config arguments": ", ".join(_text(a) for a in call.args)}
        for name, value in call.kwargs.items():
            for section, keys in self._section(name, value).items():
                if isinstance(keys, dict):
                    data.setdefault(section, {}).update(keys)
                else:
                    data[section] = keys
        return data

    def _section(self, name: str, value) -> dict:
        """One Trainer.Config field as the TOML's sections and keys."""
        if name == "model_spec":
            return self._model(value)
        if name == "activation_checkpoint":
            if value is None:
                return {"activation_checkpoint": {"mode": "none"}}
            if isinstance(value, Call) and value.name in AC_POLICIES:
                keys = {AC_KEYS.get(k, k): _plain(v) for k, v in value.kwargs.items()}
                return {"activation_checkpoint": {**AC_POLICIES[value.name], **keys}}
        if name == "optimizer" and isinstance(value, Call):
            groups = value.kwargs.get("param_groups")
            if value.name.endswith("OptimizersContainer.Config") and isinstance(groups, Opaque) and groups.of \
                    and groups.text.endswith(".param_groups"):
                # a container of another config's groups (torchft's TorchFTOptimizersContainer.Config, 0.3.0
                # experiments/torchft/optimizer.py 26-29: OptimizersContainer.Config, nothing added; its step is
                # OptimizersContainer's, its cached state dict the same tensors): that config's optimizer
                rest = {k: v for k, v in value.kwargs.items() if k != "param_groups"}
                value = Call(groups.of.name, groups.of.args, groups.of.kwargs | rest)
            optimizer = {"name": "AdamW" if value.name.endswith("adamw") else value.name}
            return {"optimizer": optimizer | {k: _plain(v) for k, v in value.kwargs.items()}}
        if name == "loss":  # ChunkedLossWrapper.Config(num_chunks=N, loss_fn=...): its chunks read
            chunks = value.kwargs.get("num_chunks") if isinstance(value, Call) else None
            return {"loss": {"function": _text(value)} | ({"num_chunks": _plain(chunks)} if chunks is not None else {})}
        if isinstance(value, Call) and value.name in SECTIONS:
            keys = {k: _plain(v) for k, v in value.kwargs.items()}
            section = {SECTIONS[value.name]: keys}
            if value.name == "CompileConfig" and "enable_async_tensor_parallel" in keys:
                section["parallelism"] = {"enable_async_tensor_parallel": keys.pop("enable_async_tensor_parallel")}
            return section
        return {name: _text(value)}

    def _model(self, value) -> dict:
        """model_registry(FLAVOR, ...) as the model section, its Float8 converter as quantize's keys."""
        if not isinstance(value, Call) or not value.name.endswith("model_registry") or not value.args:
            return {"model": {"spec": _text(value)}}
        origin = self.imports.get(value.name.split(".")[0], "")
        family = self.family if origin.strip(".") == "" else origin.rsplit(".", 1)[-1]
        model = {"name": family, "flavor": _plain(value.args[0])}
        model |= {k: _plain(v) for k, v in value.kwargs.items() if k != "converters"}
        if len(value.args) > 1:  # model_registry(flavor, attn_backend, ...) given by position
            model["model_registry arguments"] = ", ".join(_text(a) for a in value.args[1:])
        converters = value.kwargs.get("converters") or []
        names = [CONVERTERS.get(c.name, c.name) if isinstance(c, Call) else _text(c) for c in converters]
        sections = {"model": model | ({"converters": names} if names else {})}
        for converter in converters:
            if isinstance(converter, Call) and CONVERTERS.get(converter.name) == "float8":
                float8 = FLOAT8_DEFAULTS | {k: _plain(v) for k, v in converter.kwargs.items()
                                            if k != "model_compile_enabled"}  # compile's, set by compile.enable
                sections["quantize"] = {"linear": {"float8": float8}}
        return sections

    def _value(self, node: ast.expr | None, env: dict):
        if node is None or isinstance(node, ast.Constant):
            return None if node is None else node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self._value(item, env) for item in node.elts]
        if isinstance(node, ast.Dict):
            return {self._value(k, env): self._value(v, env) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            value = self._value(node.operand, env)
            return -value if _number(value) else Opaque(ast.unparse(node))
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            left, right = self._value(node.left, env), self._value(node.right, env)
            if _number(left) and _number(right):
                if isinstance(node.op, ast.FloorDiv) and right == 0:  # Python raises ZeroDivisionError there
                    raise UserError(f"{self.where}, line {node.lineno}: {ast.unparse(node)} divides by zero, so the "
                                    "config does not run; give the value it means")
                return _ARITHMETIC[type(node.op)](left, right)
        if isinstance(node, ast.Name) and node.id in env and env[node.id] != "config":
            return env[node.id]
        if isinstance(node, ast.Call) and _chain(node.func):
            return Call(name=".".join(_chain(node.func)), args=tuple(self._value(a, env) for a in node.args),
                        kwargs={k.arg: self._value(k.value, env) for k in node.keywords if k.arg})
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) and _chain(node.value.func):
            return Opaque(ast.unparse(node), of=self._value(node.value, env))
        return Opaque(ast.unparse(node))


def _chain(node: ast.expr) -> list[str]:
    """a.b.c as ["a", "b", "c"]; [] for anything else."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        inner = _chain(node.value)
        return inner + [node.attr] if inner else []
    return []


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plain(value):
    """A value as TOML would hold it: literals as they are, anything computed as its text."""
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, (Call, Opaque)):
        return _text(value)
    return value


def _text(value) -> str:
    if isinstance(value, Call):
        return f"{value.name}(...)"
    if isinstance(value, Opaque):
        return value.text
    return str(value)
