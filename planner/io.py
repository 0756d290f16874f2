"""Reading and writing ckplan's files: atomically, with one clear error for bad input."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from planner.errors import UserError
from planner.schema import SCHEMA_VERSION, FileRef, Plan, Profile, RunReport

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
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}; choose a writable path") from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable(path: str | Path) -> None:
    """Fail before long work starts, not after, when the output cannot be written."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if path.is_dir():
        reason = "the path is a folder"
    elif not probe.is_dir():
        reason = f"{probe} is a file, not a folder"
    elif not os.access(probe, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        reason = "the path is not writable"
    else:
        return
    raise UserError(f"cannot write {path}: {reason}; choose another --out")


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "top level"
    more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
    return f"field '{where}': {first['msg']}{more}"


def _read_text(path: str | Path, what: str) -> str:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist; check the path")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {what} {path}: {exc}") from exc


def _validate(model: type[ModelT], data: object, path: str | Path, what: str, remedy: str) -> ModelT:
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a ckplan {what}; {remedy}")
    version = data.get("schema_version")
    if version is not None and version != SCHEMA_VERSION:
        raise UserError(
            f"{path} is a {what} of schema version {version}, this ckplan reads version "
            f"{SCHEMA_VERSION}; {remedy}"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"{path} is not a valid {what}: {_describe(exc)}; {remedy}") from exc


def load_profile(path: str | Path) -> Profile:
    text = _read_text(path, "profile")
    remedy = "re-create it with `ckplan profile MODEL.py`"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON (line {exc.lineno}); {remedy}") from exc
    return _validate(Profile, data, path, "profile", remedy)


def save_profile(profile: Profile, path: str | Path) -> None:
    write_atomic(path, profile.model_dump_json(indent=2) + "\n")


def load_plan(path: str | Path) -> Plan:
    text = _read_text(path, "plan")
    remedy = "re-create it with `ckplan solve`"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"{path} is not valid YAML; {remedy}") from exc
    return _validate(Plan, data, path, "plan", remedy)


def plan_to_yaml(plan: Plan) -> str:
    return yaml.safe_dump(plan.model_dump(mode="json"), sort_keys=False)


def save_plan(plan: Plan, path: str | Path) -> None:
    write_atomic(path, plan_to_yaml(plan))


def save_report(report: RunReport, path: str | Path) -> None:
    write_atomic(path, report.model_dump_json(indent=2) + "\n")


def load_report(path: str | Path) -> RunReport:
    text = _read_text(path, "run report")
    remedy = "re-create it with `ckplan launch PLAN --report PATH`"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON (line {exc.lineno}); {remedy}") from exc
    return _validate(RunReport, data, path, "run report", remedy)
