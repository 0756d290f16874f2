"""Megatron-LM's arguments as they are written, before any flag is read (planner/models/configs/
megatron.py reads them): a launch script's trainer arguments or a YAML mapping of flags to values
(the functional tests' model_config.yaml, --yaml-cfg's) as (flag, its values) pairs, and the GPUs
the script's torchrun line starts."""

from __future__ import annotations

from pathlib import Path

from planner.errors import UserError


def text_of(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; give a Megatron-LM launch script or YAML of its arguments") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} cannot be read as text ({exc.__class__.__name__}); give a Megatron-LM launch "
                        "script or YAML of its arguments") from None
    _refuse_ds_config(text, path)
    return text


# keys of DeepSpeed's config JSON (deepspeed/runtime/constants.py 17-105, zero/config.py 53 at 38327e07f), no Megatron flag
DS_CONFIG_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                  "zero_optimization")


def _refuse_ds_config(text: str, path: Path) -> None:
    """A DeepSpeed config JSON holds the engine's settings and no model: the Megatron-DeepSpeed script
    that passes it as --deepspeed_config is what --from-megatron reads (megatron_deepspeed.py)."""
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return
    given = [key for key in DS_CONFIG_KEYS if isinstance(data, dict) and key in data]
    if given:
        raise UserError(f"{path} is a DeepSpeed config ({', '.join(given)}), which holds no model; give the "
                        "Megatron-DeepSpeed launch script that passes it as --deepspeed_config (with the config "
                        "beside it), which --from-megatron reads with it")


# The trainers at Megatron-LM d98e8a64ddf3 other than pretrain_gpt.py (the repository's root and examples/),
# and the model each trains: none is the decoder-only GPT model the flags are read as.
OTHER_TRAINERS = {
    "pretrain_bert.py": "BERT, a bidirectional encoder with its own heads",
    "pretrain_t5.py": "T5, an encoder-decoder",
    "pretrain_mamba.py": "a Mamba state-space model",
    "pretrain_hybrid.py": "a hybrid of Mamba, attention and MoE layers",
    "pretrain_hybrid_flex.py": "a hybrid of Mamba, attention and MoE layers",
    "pretrain_vlm.py": "a vision-language model",
    "pretrain_mimo.py": "a multimodal model",
}


def check_trainer(trainer: str, where: str) -> None:
    """Refuse a script whose trainer is not pretrain_gpt.py: its flags describe another model, which the
    GPT reader would plan as a GPT without a word."""
    name = trainer.rsplit("/", 1)[-1]
    if name != "pretrain_gpt.py":
        what = f"which trains {OTHER_TRAINERS[name]}" if name in OTHER_TRAINERS else "not Megatron-LM's GPT trainer"
        raise UserError(f"{where} runs {name}, {what}; ckplan reads the decoder-only models pretrain_gpt.py "
                        "trains, and would plan this one as a GPT: give a pretrain_gpt.py script")


# Megatron-LM d98e8a64 megatron/training/arguments.py 3652-3662: --hybrid-layer-pattern (M mamba, G gdn,
# * attention, D dsa, - mlp, E moe) "is the sole indicator that a hybrid model is being run", and the
# deprecated --hybrid-override-pattern forwards to it; 787-797: the pattern sets --num-layers, overriding any given.
HYBRID_PATTERN_FLAGS = ("--hybrid-layer-pattern", "--hybrid-override-pattern")


def check_hybrid(pairs: list[tuple[str, list[str]]], where: str) -> None:
    """Refuse arguments of a hybrid model (a YAML names no trainer, so check_trainer cannot): read as a GPT,
    its Mamba layers would be planned as transformer blocks (and a missing --num-layers asked for)."""
    for flag, values in pairs:
        if flag in HYBRID_PATTERN_FLAGS and values and values != ["false"]:
            raise UserError(f"{where} gives {flag} {' '.join(values)}: the model is {OTHER_TRAINERS['pretrain_hybrid.py']}"
                            " (pretrain_hybrid.py trains it); ckplan reads the decoder-only models pretrain_gpt.py "
                            "trains, and would plan this one as a GPT: give a pretrain_gpt.py model's arguments")


def script_pairs(args: list[str], where: str) -> list[tuple[str, list[str]]]:
    """(flag, its values) in order; a word before any flag is refused."""
    pairs: list[tuple[str, list[str]]] = []
    for word in args:
        if word.startswith("--"):
            flag, eq, value = word.partition("=")
            pairs.append((flag, [value] if eq else []))
        elif pairs:
            pairs[-1][1].append(word)
        else:
            raise UserError(f"{where}: the trainer's arguments start with {word!r}, not a --flag; give Megatron-LM's "
                            "arguments as --flag value")
    return pairs


def yaml_pairs(text: str, where: str) -> list[tuple[str, list[str]]]:
    """A YAML mapping of flags to values: the functional tests' model_config.yaml (its MODEL_ARGS)
    or --yaml-cfg's (keys with underscores, nested sections flattened)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{where} is not valid YAML{at}; give a mapping of Megatron-LM flags to values") from None
    if isinstance(data, dict) and isinstance(data.get("MODEL_ARGS"), dict):
        data = data["MODEL_ARGS"]
    if not isinstance(data, dict) or not data:
        raise UserError(f"{where} is not a mapping of Megatron-LM flags to values (e.g. --num-layers: 32, or "
                        "MODEL_ARGS: with such a mapping)")
    _refuse_nemo(data, where)
    pairs = []
    for key, value in _flatten(data):
        flag = key if key.startswith("--") else "--" + key.replace("_", "-")
        if value is False or value is None:
            pairs.append((flag, ["false"]))
        elif value is True:
            pairs.append((flag, []))
        elif isinstance(value, list):
            pairs.append((flag, [str(v) for v in value]))
        else:
            pairs.append((flag, _words(value)))
    return pairs


def _refuse_nemo(data: dict, where: str) -> None:
    """A NeMo run's overrides (trainer.devices, model.config.num_layers: the gpt-nemo functional tests'
    MODEL_ARGS, which _run_training.sh passes as key=value to NeMo's own trainer when IS_NEMO_TEST) are
    not Megatron-LM's flags: refused, rather than read as flags that give no model."""
    dotted = [str(key) for key in data if not str(key).startswith("-") and "." in str(key)]
    if dotted:
        raise UserError(f"{where} gives NeMo's overrides ({', '.join(dotted[:3])}{', ...' if len(dotted) > 3 else ''}"
                        "), not Megatron-LM's flags: ckplan reads Megatron-LM's arguments (--num-layers: 32 ...); "
                        "give the run's Megatron-LM flags")


def _words(value: object) -> list[str]:
    """A value's command-line words: a string in [ ] loses its brackets, as the functional tests'
    tests/functional_tests/shell_test_utils/_run_training.sh 148-152 (d98e8a64) strips them
    ("[layernorm moe_act]" -> --recompute-modules layernorm moe_act)."""
    if not isinstance(value, str):
        return [str(value)]
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return text.split()


def _flatten(data: dict, prefix: str = ""):
    for key, value in data.items():
        if isinstance(value, dict) and not str(key).startswith("--"):
            yield from _flatten(value)
        else:
            yield str(key), value


def torchrun_world(launcher: list[str]) -> int | None:
    """GPUs torchrun starts: --nproc_per_node x --nnodes (None where not both are numbers)."""
    start = next((i for i, w in enumerate(launcher) if w.endswith(("torchrun", "torch.distributed.run"))), None)
    if start is None:
        return None
    values: dict[str, str] = {}
    words = launcher[start + 1:]
    for i, word in enumerate(words):
        if word.startswith("-"):
            name, eq, value = word.lstrip("-").replace("-", "_").partition("=")
            values[name] = value if eq else (words[i + 1] if i + 1 < len(words) else "")
    per, nodes = values.get("nproc_per_node"), values.get("nnodes", "1")
    if per and per.isdigit() and nodes.isdigit():
        return int(per) * int(nodes)
    return None
