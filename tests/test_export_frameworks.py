"""Each export fed to the framework's own code (parser, splitter, checkpoint rule), where the
framework is installed: `pip install -c torch-pin.txt --no-deps megatron-core torchtitan ...`.
Skipped cleanly where it is not.

The plan: embedding + 8 decoder layers + head on 3 stages of 4, 3, 3 layers (decoder layers
3, 3, 2), checkpointing layers.1, layers.2 (stage 0), layers.3 (stage 1), layers.6 (stage 2).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from export_plans import write

from planner.cli import cli

pytestmark = pytest.mark.frameworks

SIZES = [4, 3, 3]
CHECKPOINTED = {"layers.1", "layers.2", "layers.3", "layers.6"}
DECODERS_PER_STAGE = [3, 3, 2]


def export(tmp_path, target: str, *extra: str) -> str:
    _, _, plan_path = write(tmp_path, SIZES, CHECKPOINTED)
    out = tmp_path / f"out.{target}"
    result = CliRunner().invoke(cli, ["export", str(plan_path), "--to", target, "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return out.read_text()


# ---------------------------------------------------------------- Megatron-LM


def test_megatron_layout_and_recompute_pass_megatron_core(tmp_path):
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    args = dict(re.findall(r"^\s+(--[\w-]+)(?: (.+))?$", export(tmp_path, "megatron"), flags=re.M))
    num_stages = int(args["--pipeline-model-parallel-size"])
    config = TransformerConfig(
        num_layers=int(args["--num-layers"]), hidden_size=64, num_attention_heads=4,
        pipeline_model_parallel_size=num_stages, pipeline_dtype=torch.bfloat16,
        pipeline_model_parallel_layout=shlex.split(args["--pipeline-model-parallel-layout"])[0],
        recompute_granularity=args["--recompute-granularity"], recompute_method=args["--recompute-method"],
        recompute_num_layers=int(args["--recompute-num-layers"]),
    )
    layout = config.pipeline_model_parallel_layout
    layout.validate_layer_layout(num_layers=8, mtp_num_layers=None)
    ids = [layout.get_layer_id_list(pp_rank=rank) for rank in range(num_stages)]
    assert ids == [[0, 1, 2], [3, 4, 5], [6, 7]]
    # the safe maximum: stage 0 checkpoints 2, so every stage recomputes its first 2
    assert config.recompute_num_layers == 2


# ---------------------------------------------------------------- DeepSpeed


def _deepspeed_layers():
    class Embedding(torch.nn.Linear):
        pass

    class Block(torch.nn.Linear):
        pass

    class Head(torch.nn.Linear):
        pass

    return [Embedding(2, 2)] + [Block(2, 2) for _ in range(8)] + [Head(2, 2)]


def test_deepspeed_partition_and_checkpoints_by_deepspeeds_own_code(tmp_path):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.activation_checkpointing import checkpointing
    from deepspeed.runtime.pipe.module import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    namespace: dict = {}
    exec(compile(export(tmp_path, "deepspeed"), "export.py", "exec"), namespace)
    layers, checkpointable = namespace["ckplan_layers"](_deepspeed_layers())
    # PipelineModule's partitioning without a process group: its own _partition_layers on a skeleton
    module = PipelineModule.__new__(PipelineModule)
    torch.nn.Module.__init__(module)
    module._layer_specs, module.num_stages, module.global_rank = layers, 3, 1
    module._topo = PipeDataParallelTopology(num_pp=3, num_dp=1)
    module.loss_fn = None
    module._partition_layers(method="type:^StageStart")
    assert module.parts == [0, 4, 7, 10]
    module.checkpointable_layers = checkpointable
    module.activation_checkpoint_func = checkpointing.checkpoint
    chosen = {i for i, layer in enumerate(layers) if module._is_checkpointable([layer])}
    assert chosen == {2, 3, 4, 7}  # layers.1, .2, .3, .6 at list positions 2, 3, 4, 7


# ---------------------------------------------------------------- torchtitan


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)


class _TitanModel(torch.nn.Module):
    """The top-level structure torchtitan's llama3 splits: tok_embeddings, layers (a dict
    keyed by layer number), norm, lm_head."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(4, 2)
        self.layers = torch.nn.ModuleDict({str(i): _Block() for i in range(num_layers)})
        self.norm = torch.nn.LayerNorm(2)
        self.lm_head = torch.nn.Linear(2, 4)


def _load_titan_export(tmp_path, text: str):
    (tmp_path / "ckplan_base.py").write_text(
        "from types import SimpleNamespace\n"
        "from torchtitan.components.loss import ChunkedLossWrapper\n"
        "from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig\n"
        "def base():\n"
        "    model = SimpleNamespace(layers=[None] * 8)\n"
        "    return SimpleNamespace(model_spec=SimpleNamespace(model=model), parallelism=ParallelismConfig(),\n"
        "                           training=TrainingConfig(), activation_checkpoint=None, compile=CompileConfig(),\n"
        "                           loss=ChunkedLossWrapper.Config())  # as torchtitan's llama3 configs\n")
    path = tmp_path / "ckplan_titan.py"
    path.write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        spec = importlib.util.spec_from_file_location("ckplan_titan", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("ckplan_base", None)


def test_torchtitan_python_config_splits_and_checkpoints_with_torchtitans_code(tmp_path):
    pytest.importorskip("torchtitan")
    pytest.importorskip("tyro")
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torchtitan.distributed.pipeline_parallel import _split_module

    module = _load_titan_export(tmp_path, export(tmp_path, "torchtitan", "--torchtitan-base", "ckplan_base:base"))
    config = module.ckplan_config()
    parallelism = config.parallelism
    assert (parallelism.pipeline_parallel_degree, parallelism.pipeline_parallel_schedule) == (3, "1F1B")
    assert config.training.local_batch_size == 6
    assert config.compile.enable is False  # the plan was scored eager: a base that compiles is turned off
    wrapped = []
    for part in parallelism.module_fqns_per_model_part:
        chunk = _split_module(_TitanModel(8), part)
        config.activation_checkpoint.build().apply(chunk)
        kept = [f"layers.{i}" for i in chunk.layers] + [n for n in ("tok_embeddings", "norm", "lm_head")
                                                         if getattr(chunk, n) is not None]
        assert sorted(kept) == sorted(part)
        wrapped += [f"layers.{i}" for i, block in chunk.layers.items() if isinstance(block, CheckpointWrapper)]
    assert parallelism.module_fqns_per_model_part[0][0] == "tok_embeddings"
    assert parallelism.module_fqns_per_model_part[-1][-2:] == ["norm", "lm_head"]
    assert sorted(wrapped) == sorted(CHECKPOINTED)


def test_torchtitan_cli_keeps_the_plans_policy(tmp_path):
    """torchtitan's ConfigManager parses the command line over the loaded config with tyro:
    the policy class must survive it rather than fall back to a built-in one."""
    pytest.importorskip("torchtitan")
    tyro = pytest.importorskip("tyro")
    from dataclasses import field, make_dataclass

    from torchtitan.config import ParallelismConfig
    from torchtitan.distributed.activation_checkpoint import (
        ActivationCheckpointingConfig,
        SelectiveAC,
    )

    module = _load_titan_export(tmp_path, export(tmp_path, "torchtitan", "--torchtitan-base", "ckplan_base:base"))
    loaded = module.ckplan_config()

    # the two fields of Trainer.Config the export sets, typed as torchtitan types them
    Job = make_dataclass("Job", [
        ("parallelism", ParallelismConfig, field(default_factory=ParallelismConfig)),
        ("activation_checkpoint", ActivationCheckpointingConfig, field(default_factory=SelectiveAC.Config)),
    ], kw_only=True)

    default = Job(parallelism=loaded.parallelism, activation_checkpoint=loaded.activation_checkpoint)
    parsed = tyro.cli(Job, args=["--parallelism.pipeline_parallel_microbatch_size", "1"], default=default)
    assert type(parsed.activation_checkpoint) is module.CkplanAC.Config
    assert sorted(parsed.activation_checkpoint.layers) == sorted(CHECKPOINTED)


def test_torchtitan_0_2_toml_reads_as_toml_with_its_fields(tmp_path):
    """No 0.2 torchtitan installs beside 0.3: the TOML is checked against 0.2.2's field names."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    text = export(tmp_path, "torchtitan", "--torchtitan-version", "0.2.2")
    job = tomllib.loads(text)
    parts = job["parallelism"]["module_fqns_per_model_part"]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert [len([n for n in part if n.startswith("layers.")]) for part in parts] == DECODERS_PER_STAGE
    assert job["activation_checkpoint"]["mode"] in {"none", "selective", "full"}
    assert job["training"]["local_batch_size"] == 6


# ---------------------------------------------------------------- ColossalAI


def test_colossalai_counts_read_by_colossalais_checkpoint_config(tmp_path):
    spec = importlib.util.find_spec("colossalai")
    if spec is None:
        pytest.skip("colossalai not installed")
    # colossalai's package import needs CUDA-era dependencies; its checkpoint config is plain Python
    path = Path(spec.submodule_search_locations[0]) / "shardformer" / "shard" / "grad_ckpt_config.py"
    loader = importlib.util.spec_from_file_location("grad_ckpt_config", path)
    grad_ckpt_config = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(grad_ckpt_config)
    call = next(node for node in ast.walk(ast.parse(export(tmp_path, "colossalai")))
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "HybridParallelPlugin")
    kwargs = {k.arg: k.value for k in call.keywords}
    counts = ast.literal_eval(kwargs["num_layers_per_stage"])
    ks = ast.literal_eval(kwargs["gradient_checkpoint_config"].keywords[0].value)
    assert counts == DECODERS_PER_STAGE and ast.literal_eval(kwargs["pp_size"]) == 3
    config = grad_ckpt_config.PipelineGradientCheckpointConfig(num_ckpt_layers_per_stage=ks)
    assert [config.get_num_ckpt_layers(s, 3, counts[s]) for s in range(3)] == [2, 1, 1]


def test_megatron_shape_flags_make_a_megatron_core_config(tmp_path):
    """The shape flags of an analytic LLaMA 3 8B plan, as megatron-core's TransformerConfig takes
    them (what pretrain_gpt.py's argument parser turns them into)."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig
    from test_export import _llama_export

    flags = _llama_export(tmp_path, "llama3-8b")
    config = TransformerConfig(
        num_layers=int(flags["--num-layers"]), hidden_size=int(flags["--hidden-size"]),
        ffn_hidden_size=int(flags["--ffn-hidden-size"]), num_attention_heads=int(flags["--num-attention-heads"]),
        num_query_groups=int(flags["--num-query-groups"]), gated_linear_unit="--swiglu" in flags,
        normalization=flags["--normalization"], add_bias_linear="--disable-bias-linear" not in flags,
        tensor_model_parallel_size=int(flags["--tensor-model-parallel-size"]), sequence_parallel=True,
        pipeline_model_parallel_size=int(flags["--pipeline-model-parallel-size"]), pipeline_dtype=torch.bfloat16,
    )
    # the parameters of one decoder layer as megatron-core lays them out: QKV, output, SwiGLU MLP
    kv_channels = config.kv_channels
    qkv = config.hidden_size * kv_channels * (config.num_attention_heads + 2 * config.num_query_groups)
    mlp = 3 * config.hidden_size * config.ffn_hidden_size
    out = config.num_attention_heads * kv_channels * config.hidden_size
    assert qkv + out + mlp == 218_103_808  # LLaMA 3 8B's decoder layer, without its two norms
