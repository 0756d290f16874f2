"""`ckplan profile --hf-config config.json`: a Hugging Face model measured without a model
file from the user. ckplan writes the model file itself (planner/models/hfmodels.py), beside the
profile, and measures it; `launch`, `compare` and `--reference` then run that file."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import click

from planner.errors import UserError

DEFAULT_SEQ_LEN = 256
TENSORS_PER_PARAM = 4  # weight, gradient and Adam's two moments, in the profile's dtype, as ckplan's runtime trains


def options(command):
    decorators = [
        click.option("--hf-config", default=None, metavar="CONFIG",
                     help="Measure a Hugging Face causal LM built from its config with random weights (a "
                          "config.json or its folder; never the hub or its cache, never the config's own code): "
                          "llama, qwen2, qwen3, mistral, gemma, gpt2, phi3, olmo2, starcoder2, granite, cohere, mixtral, qwen2_moe, "
                          "phimoe, qwen3_moe, olmoe, granitemoe, deepseek_v2, deepseek_v3, gemma3_text, smollm3. ckplan writes the model file beside the "
                          "profile."),
        click.option("--hf-set", multiple=True, metavar="KEY=VALUE",
                     help="With --hf-config: override a config field, e.g. num_hidden_layers=4 (repeatable)."),
    ]
    for decorator in reversed(decorators):
        command = decorator(command)
    return command


def model_file_for(source: str, settings: tuple[str, ...], *, seq_len: int | None, out: Path | None,
                   dtype: str, fake: bool = False) -> tuple[Path, dict]:
    """Write the model file of this config (beside --out, else in profiles/) and return its
    path and the config; refuse, in one sentence, a config ckplan cannot build or (unless
    `fake`: run without memory) this machine cannot train."""
    from planner import io
    from planner.console import info
    from planner.models import hfmodels

    config, name = hfmodels.read_config(source)
    config = hfmodels.with_settings(config, settings)
    hfmodels.check_fields(config)
    if seq_len is None:
        seq_len = _default_seq_len(config)
        info(f"--seq-len not given: {seq_len} tokens per sequence")
    hfmodels.check_config(config, seq_len=seq_len)
    if not fake:
        _check_fits(config, name, dtype)
    elif config["model_type"] in hfmodels.MOE and dtype != "bfloat16":
        raise UserError(f"--fake runs the {config['model_type']} experts through torch's grouped matmul, whose fake "
                        f"kernel takes bfloat16 only (torch 2.13), not --dtype {dtype}: use --dtype bfloat16, or "
                        "profile without --fake (a smaller --hf-set config)")
    tag = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_").lower() or config["model_type"]
    text = hfmodels.model_file_text(config, seq_len=seq_len, source=source)
    path = _model_path((out.parent if out is not None else Path("profiles")), tag, text)
    # every check of --out, and of the model file's own path, before the model file is written:
    # a refused run leaves nothing behind, and nothing is written beside an --out that cannot be
    config_file = Path(source) / "config.json" if Path(source).is_dir() else Path(source)
    io.check_outputs({"--out": out, "the model file": path}, inputs={"--hf-config": config_file})
    if path.exists() and not hfmodels.is_generated(path):
        raise UserError(f"{path} exists and was not written by ckplan; move it, or give --out in another folder")
    created = not path.exists()
    io.write_atomic(path, text)
    if created:
        _remove_unless_profiled(path)
    info(f"wrote {path}: the {config['model_type']} model of {source} (random weights, {seq_len} tokens), the "
         "model file `launch` and `compare` run")
    if config.get("num_nextn_predict_layers"):  # DeepSeek-V3's; --arch-config says the same (analytic_notes.py)
        from planner.console import warn

        warn(f"{source}: its {config['num_nextn_predict_layers']} multi-token-prediction module(s) "
             "(num_nextn_predict_layers) are not planned: transformers' causal LM trains none (it builds them for "
             "generation's speculative decoding only), so the profile is the main model's")
    return path, config


def _model_path(folder: Path, tag: str, text: str) -> Path:
    """hf_TAG.py, unless ckplan wrote that file for other settings (--hf-set, --seq-len) which an earlier
    profile and its plans run: then hf_TAG_HASH.py, named by what it holds, so neither is overwritten."""
    from planner.models import hfmodels

    path = folder / f"hf_{tag}.py"
    if not (path.exists() and hfmodels.is_generated(path)) or path.read_text(encoding="utf-8") == text:
        return path
    return folder / f"hf_{tag}_{hashlib.sha256(text.encode()).hexdigest()[:8]}.py"


def _remove_unless_profiled(path: Path) -> None:
    """The model file this run wrote is removed when the run ends in an error or is interrupted
    (Ctrl-C, or SIGTERM where it is turned into one): only a written profile needs it."""
    import sys

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return

    def close() -> None:
        error = sys.exc_info()[1]
        if error is not None and not (isinstance(error, click.exceptions.Exit) and error.exit_code == 0):
            path.unlink(missing_ok=True)

    ctx.call_on_close(close)


def _default_seq_len(config: dict) -> int:
    from planner.models.hfmodels import hf_config

    hf = hf_config(config)
    limits = [getattr(hf, name, None) for name in ("max_position_embeddings", "sliding_window")]
    return min([DEFAULT_SEQ_LEN, *(limit for limit in limits if limit)])


def _check_fits(config: dict, name: str, dtype: str) -> None:
    """Refuse a model whose training state alone exceeds this machine's free memory."""
    import torch

    from planner.models.hfmodels import hf_config, transformers_offline
    from planner.units import format_bytes

    with torch.device("meta"):
        model = transformers_offline().AutoModelForCausalLM.from_config(hf_config(config), trust_remote_code=False)
    params = sum(p.numel() for p in model.parameters())
    need = params * TENSORS_PER_PARAM * getattr(torch, dtype).itemsize
    have = available_bytes()
    if have is not None and need > have:
        raise UserError(
            f"{name} has {params / 1e9:.2f}B parameters: training them here needs about {format_bytes(int(need))} "
            f"(weights, gradients, Adam state) and this machine has {format_bytes(have)} free; shrink it with "
            "--hf-set (e.g. num_hidden_layers=4), or profile it without running it: --arch-config CONFIG")


def available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
