"""Every flag the Megatron reader meets in a set of files, as it classifies them: which files give it and what the
reader says of it (modelled, no effect, not modelled, unknown). A flag the reader names with its generic "does not
know" sentence is unclassified; scripts/megatron_flag_audit.py prints the table, tests/test_megflags_audit.py fails on
any unclassified flag of a shipped config. Nothing printed or written here: the files are read by the reader."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import UserError

# the generic sentences of an unclassified flag, key or variable (megatron._rest, megatron_env.env_said,
# megatron_deepspeed's ds_config keys)
GENERIC = ("not a flag this reader knows", "an environment variable this reader does not know",
           "a ds_config key this reader does not know")
# the folders whose files --from-megatron reads (launch scripts and model_config.yaml files)
FOLDERS = ("configs/megatron-lm", "configs/megatron-bridge", "configs/megatron-deepspeed")
SUFFIXES = (".sh", ".yaml", ".yml")


@dataclass
class FlagRow:
    """One flag (or key) and status across the files that give it."""

    name: str
    status: str
    what: str
    files: list[str] = field(default_factory=list)

    @property
    def classified(self) -> bool:
        return not (self.status == "unknown" and self.what.startswith(GENERIC))


def config_files(root: Path) -> list[Path]:
    """The files under FOLDERS that are Megatron arguments (a userbuffers cfg file, which a flag names, left out)."""
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file() and not _is_ub_cfg(path):
                found.append(path)
    return found


def _is_ub_cfg(path: Path) -> bool:
    return path.suffix in (".yaml", ".yml") and "MODEL_ARGS" not in path.read_text(errors="replace")


def audit(paths: list[Path], root: Path) -> tuple[list[FlagRow], dict[str, str]]:
    """(a row per flag and status, the files the reader refuses with its sentence), over `paths`."""
    from planner.models.configs import megatron

    rows: dict[tuple[str, str, str], FlagRow] = {}
    refused = {}
    for path in paths:
        shown = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        try:
            job = megatron.read(path)
        except UserError as exc:
            refused[shown] = str(exc)
            continue
        for setting in job.settings:
            key = (setting.name, setting.status, setting.what)
            rows.setdefault(key, FlagRow(setting.name, setting.status, setting.what)).files.append(shown)
    return sorted(rows.values(), key=lambda r: (r.classified, r.status, r.name)), refused
