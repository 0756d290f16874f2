"""Reading and writing ckplan's files: atomically, with one clear error for bad input."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from planner.errors import UserError
from planner.schema import (
    PLAN_CORE_ATTN_VERSION,
    PLAN_SCHEMA_VERSION,
    PLAN_SCHEMA_VERSIONS,
    PROFILE_SCHEMA_VERSION,
    PROFILE_SCHEMA_VERSIONS,
    SCHEMA_VERSION,
    FileRef,
    Plan,
    Profile,
    RunReport,
    renames,
)

ModelT = TypeVar("ModelT", bound=BaseModel)


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_ref(path: str | Path) -> FileRef:
    return FileRef(file=str(path), sha256=sha256_file(path))


def write_atomic(path: str | Path, text: str) -> None:
    """Write to a temp file beside `path`, then rename: a reader never sees half a file."""
    write_atomic_bytes(path, text.encode())


def write_atomic_bytes(path: str | Path, data: bytes) -> None:
    """A symlink is followed (its target is replaced, the link stays); a character device
    such as /dev/null is written in place; a new file gets the umask's mode, a replaced one
    keeps its own."""
    path = Path(path)
    target = _resolve(path)
    kind = _special_kind(target)
    if kind == "character device":
        _write_in_place(target, data)
        return
    if kind is not None:
        raise UserError(f"cannot write {path}: it is a {kind}, not a regular file; choose another path")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}; choose a writable path") from exc
    try:
        os.fchmod(fd, _mode_for(target))
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())  # a full disk shows here, before the old file is replaced
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        kept = " (the earlier file is unchanged)" if target.exists() else ""
        raise UserError(f"cannot write {path}: {exc.strerror or exc}{kept}; free some space or choose another "
                        "path") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _resolve(path: Path) -> Path:
    """Where a write to `path` lands: the file a symlink (chain) points to."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _mode_for(target: Path) -> int:
    """Keep the mode of the file being replaced; a new file gets 0666 less the umask, as
    `open()` would give it (mkstemp's temp file is 0600)."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


_SPECIAL_KINDS = (
    (stat.S_ISFIFO, "named pipe (FIFO)"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISCHR, "character device"),
)


def _special_kind(target: Path) -> str | None:
    """What `target` is when it exists and is neither a regular file nor a folder."""
    try:
        mode = target.stat().st_mode
    except OSError:
        return None
    return next((kind for test, kind in _SPECIAL_KINDS if test(mode)), None)


def _write_in_place(target: Path, data: bytes) -> None:
    try:
        with open(target, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        raise UserError(f"cannot write {target}: {exc.strerror}; choose a writable path") from exc


def check_writable(path: str | Path, option: str = "--out") -> None:
    """Fail before long work starts, not after, when the output cannot be written."""
    check_outputs({option: path})


def check_outputs(outputs: dict[str, str | Path | None], inputs: dict[str, str | Path | None] | None = None) -> None:
    """Every output path of a command, checked before any work: writable, a regular file
    (or a symlink to one, or a character device), not one of the command's inputs, and no
    two outputs the same file. Keys name the option (or argument) in messages."""
    given = {option: Path(path) for option, path in outputs.items() if path is not None}
    sources = {name: Path(path) for name, path in (inputs or {}).items() if path is not None}
    for option, path in given.items():
        for name, source in sources.items():
            if _same_file(path, source):
                raise UserError(f"{option} {path} is the {name} this command reads: writing there would "
                                f"overwrite it; choose another {option}")
        reason = _unwritable_reason(_resolve(path))
        if reason:
            raise UserError(f"cannot write {path}: {reason}; choose another {option}")
    options = list(given)
    for idx, first in enumerate(options):
        for second in options[idx + 1:]:
            if _same_file(given[first], given[second]):
                raise UserError(f"{first} and {second} are the same file, {given[first]}; give them different paths")


def _same_file(first: Path, second: Path) -> bool:
    if os.path.realpath(first) == os.path.realpath(second):
        return True
    try:
        return os.path.samefile(first, second)  # hard links
    except OSError:
        return False


def _unwritable_reason(path: Path) -> str | None:
    kind = _special_kind(path)
    if kind == "character device":
        return None if os.access(path, os.W_OK) else "the path is not writable"
    if kind is not None:
        return f"it is a {kind}, not a regular file"
    if path.is_dir():
        return "the path is a folder"
    probe = path.parent if str(path.parent) else Path(".")
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, not a folder"
    if not os.access(probe, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return "the path is not writable"
    return _probe_write(probe)


def _probe_write(folder: Path) -> str | None:
    """os.access trusts permission bits; root on a read-only mount learns the truth only
    by creating a file. The probe is removed at once."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".ckplan-probe.")
    except OSError as exc:
        return f"the path is not writable ({exc.strerror})"
    os.close(fd)
    os.unlink(tmp)
    return None


def describe_error(exc: ValidationError) -> str:
    """The first problem of a pydantic error as a phrase naming the field and the value,
    without pydantic's 'Value error, ' prefix."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    value = first.get("input")
    shown = f" = {value!r:.40}" if where and isinstance(value, int | float | str | bool) else ""
    message = str(first["ctx"]["error"]) if first["type"] == "value_error" else first["msg"]
    more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
    whole = isinstance(value, dict) and first["type"] == "value_error"  # a part's own check names its fields
    return f"field '{where}'{shown}: {message}{more}" if where and not whole else f"{message}{more}"


# The command-line option that sets each setup field, where it is not the field's own name.
SETUP_OPTIONS = {
    "mem_caps_bytes": "--mem", "host_mem_bytes": "--host-mem", "offload": "--offload-optimizer",
    "offload_overlap": "--offload-copies", "shard_gb_per_s": "--shard-bandwidth",
    "replica_gb_per_s": "--replica-bandwidth", "ep_gb_per_s": "--ep-bandwidth", "host_gb_per_s": "--host-bandwidth",
    "host_step_ns_per_param": "--host-step-ns", "micro_batch_size": "the profile's --micro-batch-size",
}


def describe_setup_error(exc: ValidationError) -> str:
    """The first problem of a setup's pydantic error as a sentence naming the option that set
    the field, with a byte bound in bytes' units: '--host-mem must be at most 1 EiB'."""
    from planner.units import format_bytes

    first = exc.errors()[0]
    field = next((str(part) for part in reversed(first["loc"]) if isinstance(part, str)), "")
    option = SETUP_OPTIONS.get(field, f"--{field.replace('_', '-')}" if field else "the setup")
    bounds = {"le": "at most", "lt": "less than", "ge": "at least", "gt": "greater than"}
    found = next(((word, first["ctx"][key]) for key, word in bounds.items() if key in first.get("ctx", {})), None)
    if found is None:
        return f"{option}: {describe_error(exc)}"
    word, bound = found
    if field.endswith("_bytes"):
        shown = f"{bound / 2**60:g} EiB" if bound >= 2**60 else format_bytes(int(bound))
    else:
        shown = f"{bound:,}" if isinstance(bound, int) else f"{bound:g}"
    return f"{option} must be {word} {shown}"


# No file ckplan reads is near this: a profile of 100,000 layers (synthetic.heterogeneous) is
# 58 MiB and loads in about 2 s; a 200 MB one took minutes before it was refused.
MAX_FILE_BYTES = 64 * 2**20
# What a YAML file may expand to, aliases and merge keys followed: a plan of 10,000 layers is
# about 60,000 nodes; an alias bomb is billions.
MAX_YAML_NODES = 2_000_000


def _read_text(path: str | Path, what: str) -> str:
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} {path} is a folder, not a file; give the path of the {what} file")
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist; check the path")
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc}") from exc
    if size > MAX_FILE_BYTES:
        raise UserError(f"{what} {path} is {size / 2**20:.0f} MiB, far larger than any ckplan {what} "
                        f"(at most {MAX_FILE_BYTES // 2**20} MiB); check that it is the right file")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {what} {path}: {exc}") from exc


def _validate(model: type[ModelT], data: object, path: str | Path, what: str, remedy: str,
              versions: tuple[int, ...] = (SCHEMA_VERSION,), *, strict: bool = False) -> ModelT:
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a ckplan {what}; {remedy}")
    version = data.get("schema_version")
    if version is not None and version not in versions:
        raise UserError(
            f"{path} is a {what} of schema version {version}, this ckplan reads version "
            f"{' or '.join(map(str, versions))}; {remedy}"
        )
    if model is Plan and version != PLAN_SCHEMA_VERSION:
        data = renames.plan_in_current_names(data, version, PLAN_CORE_ATTN_VERSION)
        data = {**data, "schema_version": PLAN_SCHEMA_VERSION}  # the setup's parts are nested on validation
    if model is Profile and version != PROFILE_SCHEMA_VERSION:
        data = renames.profile_in_current_names(data, version, PROFILE_SCHEMA_VERSION)
        data = {**data, "schema_version": PROFILE_SCHEMA_VERSION}
    try:
        if not strict:
            return model.model_validate(data)
        # strictly, as the JSON it is: a number is a number (not "2", "2; import os", true or
        # [2]), while keys that JSON writes as strings (threads -> ms) still read as integers
        return model.model_validate_json(json.dumps(data, default=str), strict=True)
    except ValidationError as exc:
        raise UserError(f"{path} is not a valid {what}: {describe_error(exc)}; {remedy}") from exc
    except RecursionError as exc:
        raise UserError(f"{path} nests deeper than any ckplan {what}; {remedy}") from exc


def parse_json(text: str, path: str | Path, remedy: str):
    """JSON as Python data, every way it can be malformed one sentence: syntax, an integer
    past Python's digit limit, nesting deeper than the parser's recursion."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON (line {exc.lineno}); {remedy}") from exc
    except RecursionError as exc:
        raise UserError(f"{path} nests deeper than any ckplan file; {remedy}") from exc
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise UserError(f"{path} holds a value JSON readers refuse ({exc}); {remedy}") from exc


# libyaml's parser and emitter where PyYAML was built with it (the wheels are): the same safe
# constructor and resolver, the same nodes, the same text written, ~10x faster than PyYAML's pure
# Python scanner and emitter, which were most of loading and saving a plan
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_LIBYAML_TOO_DEEP = "exceeded maximum nesting depth"  # libyaml 0.2.5's parser past 1,000 levels


def parse_yaml(text: str, path: str | Path, remedy: str):
    """YAML as Python data (safe types only), refused before it is built when aliases and
    merge keys would expand it past MAX_YAML_NODES or it nests past the parser's recursion
    (or libyaml's nesting limit)."""
    loader = _SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and _expanded_nodes(node, {}) > MAX_YAML_NODES:
            raise UserError(f"{path} expands (through its aliases) to more than {MAX_YAML_NODES:,} nodes, far more "
                            f"than any ckplan file; {remedy}")
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        if getattr(exc, "problem", None) == _LIBYAML_TOO_DEEP:
            raise UserError(f"{path} nests deeper than any ckplan file; {remedy}") from exc
        raise UserError(f"{path} is not valid YAML; {remedy}") from exc
    except RecursionError as exc:
        raise UserError(f"{path} nests deeper than any ckplan file; {remedy}") from exc
    finally:
        loader.dispose()


def _expanded_nodes(node, memo: dict[int, int]) -> int:
    """Nodes the document has once every alias is followed; an aliased node is counted every
    time it is used, computed once (memo), so a bomb is measured without being expanded."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # a node that contains itself counts once
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_nodes(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_nodes(key, memo) + _expanded_nodes(value, memo) for key, value in node.value)
    else:
        size = 1
    memo[id(node)] = size
    return size


def load_json(path: str | Path, what: str, remedy: str):
    """A JSON file's data, every failure (missing, too large, malformed) one sentence."""
    return parse_json(_read_text(path, what), path, remedy)


def load_model(model: type[ModelT], path: str | Path, what: str, remedy: str) -> ModelT:
    """A JSON file of `model`, every failure one sentence."""
    return _validate(model, load_json(path, what, remedy), path, what, remedy)


def load_profile(path: str | Path) -> Profile:
    text = _read_text(path, "profile")
    remedy = "re-create it with `ckplan profile MODEL.py`"
    return _validate(Profile, parse_json(text, path, remedy), path, "profile", remedy, versions=PROFILE_SCHEMA_VERSIONS)


def save_profile(profile: Profile, path: str | Path) -> None:
    write_atomic(path, profile.model_dump_json(indent=2) + "\n")


def load_plan(path: str | Path) -> Plan:
    text = _read_text(path, "plan")
    remedy = "re-create it with `ckplan solve`"
    return _validate(Plan, parse_yaml(text, path, remedy), path, "plan", remedy, versions=PLAN_SCHEMA_VERSIONS,
                     strict=True)


def plan_profile_path(plan: Plan, plan_path: str | Path, *, remedy: str) -> Path:
    """The profile a plan was made from: its recorded path as written (from the working
    directory), else beside the plan; `remedy` ends the sentence when neither exists."""
    file = Path(plan.profile.file)
    for candidate in ([file] if file.is_absolute() else [file, Path(plan_path).resolve().parent / file]):
        if candidate.is_file():
            return candidate
    raise UserError(f"the plan's profile {plan.profile.file} was not found; {remedy}")


def plan_to_yaml(plan: Plan) -> str:
    return yaml.dump(plan.model_dump(mode="json"), Dumper=_SafeDumper, sort_keys=False)


def save_plan(plan: Plan, path: str | Path) -> None:
    write_atomic(path, plan_to_yaml(plan))


def save_report(report: RunReport, path: str | Path) -> None:
    write_atomic(path, report.model_dump_json(indent=2) + "\n")


def load_report(path: str | Path) -> RunReport:
    text = _read_text(path, "run report")
    remedy = "re-create it with `ckplan launch PLAN --report PATH`"
    return _validate(RunReport, parse_json(text, path, remedy), path, "run report", remedy)
