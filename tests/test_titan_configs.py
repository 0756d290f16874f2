"""`evaluate --from-torchtitan` on the configs torchtitan ships today: Python config functions
(0.3.0 and main, read without running them: planner/models/configs/titan_python.py), main's token
counts (73aed7f6c), every key accounted for, and the hint for a model ckplan has no built-in for.
The config files are torchtitan's own: main's as the repository ships them to users (configs/torchtitan/README.md),
0.3.0's a fixture (tests/fixtures/configs/torchtitan_0_3_0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.cli import run, run_ok

from planner.errors import UserError
from planner.models.configs import torchtitan

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
MAIN = Path(__file__).parents[1] / "configs" / "torchtitan"
RELEASE = CONFIGS / "torchtitan_0_3_0"


def per_rank(source: str, *extra: str) -> list[tuple[int, int, int]]:
    summary = json.loads(run_ok("evaluate", "--from-torchtitan", source, "--gpus", "64", "--gpu", "h100", *extra,
                                "--json").stdout)
    return [(r["static_bytes"], r["peak_bytes"], r["reserved_bytes"]) for r in summary["ranks"]]


# (static, peak, reserved) of the one rank each runs on 64 H100s, as ckplan scores the jobs today (reserved: the
# FSDP2 step replayed under default segments, the jobs spanning 8 nodes); main's
# functions and 0.3.0's describe the same jobs (8B: 1 x 8192 tokens, FSDP 64, per-op SAC; 70B: 8 x 8192,
# TP 8, full AC; 405B: 2 x 8192, TP 8, full AC, compiled with AsyncTP, Float8 rowwise not modelled); each
# runs ChunkedLossWrapper's 8 chunks (planner/cost/chunkedloss.py; the 405B's peak is not at its loss)
# (reserved since §19.bwdblocks: each block's backward replayed as its record's tensors; the 405B's peak since
# §19.bwdterms: SwiGLU's third [tokens, f/t] gradient, 16,384 x 6,656 x 2 B = 208 MiB; the 70B's and 405B's reserve
# since §29.reserve405: each checkpointed block's forward requests played, as its rerun makes them; since
# §29.fwdlife each freed at its last use in the block's code, the 70B's reserve 1,080,033,280 higher, the 405B's
# 620,756,992 lower: where the freed blocks fall, not how much is alive; since §29.fwdsplit the extra's one tensor
# split into its parts, each freed with its sub-block or matmul: the 70B's 809,500,672 lower, the 405B's 75,497,472
# higher, again where the freed blocks fall; since §31.f8cast's second round the sub-modules' arguments freed after
# their tensors and TP + SP's gathered input whole beside the caller's shard: the 70B's 134,217,728 higher, the
# 405B's 452,984,832 lower, where the freed blocks fall; since its third round TP + SP's row-parallel partial sums
# beside their reduce-scattered shards: the 70B's 2,147,483,648 lower, the 405B's 75,497,472 higher, likewise)
PINNED = {"llama3_8b": [(2007565312, 24477213708, 28837937152)],
          # the 70B's reserve settles at the third step (allocator.settled_replay): 37,306,236,928 after two
          "llama3_70b": [(17640734720, 35961503756, 37643878400)],
          # branch zero3peak: a layer's own unsharded gradients made by its backward, none at its start (FSDP2's
          # moments, planner/cost/fsdpunits.py): the 405B's allocated peak 116,722,745,344 -> 115,925,762,048
          # branch smallterms: b5bcd76c's positions, 8 B a token beside the inputs (collators.py 55-80), each peak + 8 B x
          # the microbatch's tokens: 8B + 65,536, 70B + 524,288 (8 x 8,192), 405B + 131,072 (2 x 8,192)
          "llama3_405b": [(101470601216, 115925893120, 121834045440)]}


@pytest.mark.parametrize("function", sorted(PINNED))
def test_mains_and_the_releases_llama3_configs_predict_the_same_ranks(function):
    main = per_rank(f"{MAIN / 'llama3' / 'config_registry.py'}:{function}")
    assert main == per_rank(f"{RELEASE / 'llama3' / 'config_registry.py'}:{function}") == PINNED[function]


def test_mains_token_counts_read_as_sequences():
    """num_tokens_per_microbatch_per_dp_rank 8 x 8192 with max_context_length 8192: 8 sequences of 8192."""
    job = torchtitan.read(Path(f"{MAIN / 'llama3' / 'config_registry.py'}:llama3_70b"))
    assert (job.seq_len, job.micro_batch_size, job.local_batch_size, job.tp) == (8192, 8, 8, 8)
    assert job.recompute.mode == "full" and job.arch.name == "llama3-70b"


def test_every_key_of_a_python_config_is_accounted_for():
    job = torchtitan.read(Path(f"{MAIN / 'llama3' / 'config_registry.py'}:llama3_405b"))
    status = {s.name: s.status for s in job.settings}
    assert not job.of("unknown"), job.of("unknown")
    assert status["loss.function"] == "modelled" and job.modelled.chunked_cross_entropy == 8  # ChunkedLossWrapper
    assert status["model.converters"] == status["quantize.linear.float8.recipe_name"] == "not modelled"  # rowwise
    assert status["training.disable_cuda_graphs"] == "not modelled"  # graphs on: the default since f84224af0
    assert status["parallelism.enable_async_tensor_parallel"] == "modelled" and job.modelled.tp_overlap == "async-tp"
    assert status["compile.enable"] == "modelled" and job.modelled.compile
    assert {"optimizer.lr", "training.steps", "checkpoint", "dataloader"} <= {s.name for s in job.of("no effect")}


@pytest.mark.parametrize("family, function, arch", [
    ("deepseek_v3", "deepseek_v3_16b", "deepseek-v2-lite"), ("deepseek_v3", "deepseek_v3_671b", "deepseek-v3"),
    ("qwen3", "qwen3_30b_a3b", "qwen3-30b-a3b"), ("qwen3", "qwen3_32b", "qwen3-32b")])
def test_mains_moe_and_qwen3_configs_read_as_their_architectures(family, function, arch):
    job = torchtitan.read(Path(f"{MAIN / family / 'config_registry.py'}:{function}"))
    assert job.arch.name == arch and not job.of("unknown"), job.of("unknown")


def test_a_toml_in_mains_keys_predicts_as_the_same_toml_in_0_3_0s(tmp_path):
    """main's keys in a job file (torchtitan itself reads Python now; its command line still takes
    --training.num_tokens_per_microbatch_per_dp_rank): 2 stages x 4 microbatches of 2 sequences of 4096."""
    model = '[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\nmode = "full"\n'
    (tmp_path / "main.toml").write_text(
        model + "[parallelism]\npipeline_parallel_degree = 2\ntensor_parallel_degree = 2\nnum_pp_microbatches = 4\n"
        "[training]\nnum_tokens_per_microbatch_per_dp_rank = 8192\nmax_context_length = 4096\n")
    (tmp_path / "release.toml").write_text(
        model + "[parallelism]\npipeline_parallel_degree = 2\ntensor_parallel_degree = 2\n"
        "pipeline_parallel_microbatch_size = 2\n[training]\nlocal_batch_size = 8\nseq_len = 4096\n")
    main, release = torchtitan.read(tmp_path / "main.toml"), torchtitan.read(tmp_path / "release.toml")
    assert (main.micro_batch_size, main.local_batch_size, main.seq_len) == (2, 8, 4096)
    assert (release.micro_batch_size, release.local_batch_size, release.seq_len) == (2, 8, 4096)
    # 64 H100s: TP 2 x PP 2 x FSDP 16, full AC; the two pipeline ranks' (static, peak, reserved) as ckplan scores today
    # (rank 0 peaks in a block's backward, beside its bf16 gradients: gradtiming.layer_grad_in_flight_bytes; since
    # §19.bwdterms with SwiGLU's third gradient, 8,192 x 7,168 x 2 B = 112 MiB, and the replay's input gradients
    # made once and torchtitan's loss as its requests; rank 0's reserve 20 MiB lower since §21.order405 made each
    # weight's gradient where its linear's backward makes it; rank 1's peak +1x the bf16 logits, 2 x 4,096 x 64,128 x 2 B
    # = 1,050,673,152, and its reserve +2x since §27.c8last: the eager loss's fp32 log-softmax kept beside the output;
    # since §29.reserve405 both reserves moved: the blocks' forward requests played, each output made before its loss;
    # since §29.fwdlife rank 1's again, those requests freed at their last uses; since §29.fwdsplit rank 0's 8,388,608
    # and rank 1's 33,554,432 lower:
    # the extra's parts freed with their sub-blocks or matmuls; since §31.f8cast's second round, the gathered input
    # whole beside the caller's shard and the sub-modules' arguments freed after their tensors, rank 0's 8,388,608
    # and rank 1's 33,554,432 higher again, where the freed blocks fall; since its third round, TP + SP's row-parallel
    # partial sums beside their shards, rank 0's 33,554,432 lower; since §44.boundgrad2 rank 0's peak 33,554,432 lower
    # again, one stage output: its last block's backward transient less the gradient its receive buffer holds; since
    # §45.boundgrad3 rank 0's peak and reserve 33,554,432 higher, one stage output: microbatch 0's, kept past its
    # backward by Schedule1F1B's warm-up send through the steady phase, 4 microbatches at w = 2: warmupsend.py; and
    # rank 1's 20 B higher, its four loss values and the backward's seed: lossvalues.py; since §45.smallterms each
    # stage's peak 524,288 higher: the whole batch on every stage, b5bcd76c's positions with it, 4 x 8,192 x 8 B x 2 —
    # rank 0 the positions and labels, rank 1 the inputs and positions: trainer.py 880-888, collators.py 55-80)
    assert per_rank(str(tmp_path / "main.toml")) == per_rank(str(tmp_path / "release.toml")) == [
        (13551501312, 16153329664, 18001952768), (13551528960, 23780142104, 28330426368)]


def test_tokens_that_are_not_whole_sequences_are_refused():
    with pytest.raises(UserError, match="not a multiple of max_context_length 4096"):
        torchtitan.from_mapping({"model": {"name": "llama3", "flavor": "8B"},
                                 "training": {"num_tokens_per_microbatch_per_dp_rank": 6000,
                                              "max_context_length": 4096}}, "t")


def test_nothing_in_a_python_config_runs_and_what_is_not_followed_is_listed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama3").mkdir()
    path = tmp_path / "llama3" / "my_configs.py"
    path.write_text('open("made_at_import", "w")\n'
                    "from torchtitan.config import ParallelismConfig, TrainingConfig\n"
                    "from torchtitan.models.llama3 import model_registry\n"
                    "def mine():\n"
                    '    open("made_in_function", "w")\n'
                    '    return Trainer.Config(model_spec=model_registry("8B"), training=TrainingConfig(\n'
                    "        local_batch_size=2, seq_len=4096), parallelism=ParallelismConfig(tensor_parallel_degree=2 * 2))\n"
                    "def tuned():\n"
                    "    config = mine()\n"
                    "    for _ in range(2):\n"
                    "        config.training.local_batch_size += 1\n"
                    "    return config\n")
    job = torchtitan.read(Path(f"{path}:tuned"))
    assert not (tmp_path / "made_at_import").exists() and not (tmp_path / "made_in_function").exists()
    assert (job.tp, job.local_batch_size, job.seq_len) == (4, 2, 4096)
    unknown = {s.name: s.value for s in job.of("unknown")}  # the base's call before its return, the loop after
    assert sorted(unknown) == ["python.line 10", "python.line 5"]
    assert unknown["python.line 5"] == "open('made_in_function', 'w')"
    assert unknown["python.line 10"].startswith("for _ in range(2)")


@pytest.mark.parametrize("given, said", [
    ("config_registry.py", "name the config function too, FILE.py:FUNCTION"),
    ("config_registry.py:llama3_9t", "no function llama3_9t at the file's top level"),
])
def test_a_python_config_without_its_function_gets_one_sentence(given, said):
    result = run("evaluate", "--from-torchtitan", str(MAIN / "llama3" / given), "--gpus", "8")
    assert result.exit_code != 0 and said in result.output
    assert len(result.output.strip().splitlines()) <= 3


def test_llama4_is_said_to_be_unsupported_not_sent_to_another_refusal(tmp_path):
    """(gpt_oss was refused here too until the gptoss branch built it in: tests/test_gptoss.py reads it.)"""
    (tmp_path / "llama4.toml").write_text('[model]\nname = "llama4"\nflavor = "17bx16e"\n')
    result = run("evaluate", "--from-torchtitan", str(tmp_path / "llama4.toml"), "--gpus", "8")
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "ckplan does not model torchtitan's" in said and "no ckplan route" in said
    assert "--arch-config config.json" not in said


def test_a_gpt_oss_flavor_without_a_built_in_is_pointed_to_its_config(tmp_path):
    (tmp_path / "oss.toml").write_text('[model]\nname = "gpt_oss"\nflavor = "debugmodel"\n')
    result = run("evaluate", "--from-torchtitan", str(tmp_path / "oss.toml"), "--gpus", "8")
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "--arch-config config.json" in said and "gpt_oss configs" in said


def test_the_hint_for_another_llama3_flavor_works(tmp_path):
    """A llama3 flavor with no built-in (2025's debugmodel_flex_attn): the hint's `profile --arch-config`
    reads a llama config and its profile is scored by `evaluate --profile` under torchtitan's runtime."""
    (tmp_path / "debug.toml").write_text('[model]\nname = "llama3"\nflavor = "debugmodel_flex_attn"\n')
    said = " ".join(run("evaluate", "--from-torchtitan", tmp_path / "debug.toml", "--gpus", "8").output.split())
    assert "profile --arch-config config.json --seq-len N" in said and "evaluate --profile PROFILE" in said
    # torchtitan's llama3 debugmodel (models/llama3/__init__.py _debugmodel at b5bcd76c): dim 256, 6 layers,
    # 16 heads, vocab 2048, ffn 768 (compute_ffn_hidden_dim(256, multiple_of=256))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 6,
        "num_attention_heads": 16, "vocab_size": 2048, "max_position_embeddings": 2048}))
    run_ok("profile", "--arch-config", tmp_path / "config.json", "--seq-len", "2048", "--out", tmp_path / "p.json")
    run_ok("evaluate", "--profile", tmp_path / "p.json", "--layers-per-stage", "8", "--ckpt-per-stage", "0",
           "--microbatches", "1", "--mem", "80GB", "--precision", "bf16-mixed", "--runtime", "torchtitan")


def test_an_exported_config_names_the_base_file_the_reader_would_need(tmp_path):
    """ckplan's own export refines a base config function from another module; the reader reads one
    file and says which function it would need, in one sentence."""
    from test_titan_main import _export, _plan

    path = _export(_plan(tmp_path, [3, 3]), "main")
    result = run("evaluate", "--from-torchtitan", f"{path}:ckplan_config", "--gpus", "8")
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "builds its config with base_config() from ckplan_base" in said


def test_a_file_that_is_not_python_or_nests_too_deep_gets_one_sentence(tmp_path):
    (tmp_path / "bad.py").write_text("def f(:\n")
    (tmp_path / "deep.py").write_text("def f():\n    return Trainer.Config(x=" + "[" * 3000 + "]" * 3000 + ")\n")
    for name, said in (("bad.py:f", "cannot be read as Python (SyntaxError)"), ("deep.py:f", "deep.py")):
        result = run("evaluate", "--from-torchtitan", tmp_path / name, "--gpus", "8")  # run(): no traceback
        assert result.exit_code != 0 and said in " ".join(result.output.split()), result.output
        assert len(result.output.strip().splitlines()) <= 3


@pytest.mark.parametrize("version", ["main", "0.3.0"])
def test_every_key_of_the_0_3_config_sections_is_known(version):
    """Each field of TrainingConfig, ParallelismConfig, CompileConfig, CommConfig and DebugConfig as the
    version defines it (the fixture lists them with their defaults), given at its default, is accounted for:
    modelled, not modelled or no effect, never unknown."""
    listed = json.loads((CONFIGS / "torchtitan_config_keys_0_3.json").read_text())[version]
    assert len(listed) == 51
    data: dict = {"model": {"name": "llama3", "flavor": "8B"}}
    for key, value in listed.items():
        if value is not None:
            section, name = key.split(".", 1)
            data.setdefault(section, {})[name] = value
    job = torchtitan.from_mapping(data, "t.toml")
    assert not job.of("unknown"), job.of("unknown")
    named = {s.name for s in job.settings}
    assert {key for key, value in listed.items() if value is not None} <= named


def test_sequence_parallel_off_and_asynctp_in_compile_are_read():
    job = torchtitan.from_mapping({"model": {"name": "llama3", "flavor": "8B"},
                                   "parallelism": {"tensor_parallel_degree": 2, "enable_sequence_parallel": False},
                                   "compile": {"enable": True, "enable_async_tensor_parallel": True}}, "t.toml")
    assert (job.tp, job.sp, job.modelled.tp_overlap) == (2, False, "async-tp")
    status = {s.name: s.status for s in job.settings}
    assert status["parallelism.enable_sequence_parallel"] == status["compile.enable_async_tensor_parallel"] == "modelled"


def test_a_new_compile_config_replaces_the_old_one_asynctp_included(tmp_path):
    (tmp_path / "llama3").mkdir()
    path = tmp_path / "llama3" / "c.py"
    path.write_text("from . import model_registry\n"
                    "def base():\n"
                    '    return Trainer.Config(model_spec=model_registry("8B"), parallelism=ParallelismConfig(\n'
                    "        tensor_parallel_degree=2), compile=CompileConfig(enable=True, enable_async_tensor_parallel=True))\n"
                    "def float8_then_plain():\n"
                    "    config = base()\n"
                    '    config.model_spec = model_registry("8B", converters=[Float8LinearConverter.Config()])\n'
                    '    config.model_spec = model_registry("8B")\n'
                    "    return config\n"
                    "def eager_asynctp_off():\n"
                    "    config = base()\n"
                    '    config.compile = CompileConfig(enable=True, components=["loss"])\n'
                    "    return config\n")
    assert torchtitan.read(Path(f"{path}:base")).modelled.tp_overlap == "async-tp"
    job = torchtitan.read(Path(f"{path}:eager_asynctp_off"))
    assert job.modelled.tp_overlap == "none" and not job.modelled.compile and job.modelled.compile_loss
    plain = {s.name for s in torchtitan.read(Path(f"{path}:float8_then_plain")).settings}
    assert "model.converters" not in plain and not any(name.startswith("quantize") for name in plain)
    # main's llama3_8b_mxfp8 swaps the 8B model for one with MX linears
    mx = torchtitan.read(Path(f"{MAIN / 'llama3' / 'config_registry.py'}:llama3_8b_mxfp8"))
    status = {s.name: (s.value, s.status) for s in mx.settings}
    assert status["model.converters"] == ("mx", "not modelled") and not any(n.startswith("quantize") for n in status)


@pytest.mark.parametrize("function, arch, dims", [
    # torchtitan/models/llama3/__init__.py at b5bcd76c: (dim, ffn, layers, heads, kv heads, vocab, tied)
    ("llama3_debugmodel", "titan-llama3-debugmodel", (256, 768, 6, 16, 16, 2048, False)),
])
def test_mains_llama3_debug_and_small_flavors_are_built_in(function, arch, dims):
    """The quickstart's llama3_debugmodel (and the 1B / 3B flavors) read as built-ins, not refused."""
    job = torchtitan.read(Path(f"{MAIN / 'llama3' / 'config_registry.py'}:{function}"))
    a = job.arch
    assert job.arch.name == arch
    assert (a.hidden_size, a.intermediate_size, a.num_layers, a.num_heads, a.num_kv_heads, a.vocab_size,
            a.tie_word_embeddings) == dims


def test_the_1b_and_3b_flavors_are_llama_3_2s_tied_models(tmp_path):
    """model_registry("1B") / ("3B") (_1b, _3b at b5bcd76c): compute_ffn_hidden_dim(dim, 1024, 1.5 / 1.0) = 8192."""
    for flavor, dims in (("1B", (2048, 8192, 16, 32, 8)), ("3B", (3072, 8192, 28, 24, 8))):
        (tmp_path / "t.toml").write_text(f'[model]\nname = "llama3"\nflavor = "{flavor}"\n')
        a = torchtitan.read(tmp_path / "t.toml").arch
        assert (a.hidden_size, a.intermediate_size, a.num_layers, a.num_heads, a.num_kv_heads) == dims
        assert a.tie_word_embeddings and a.vocab_size == 128256


def test_each_converter_is_listed_once_with_what_it_does():
    """main's llama3_debugmodel_float8_emulate_lora: LoRA (frozen base weights) is no quantized matmul, and
    an NVFP4-only config lists no Float8 row (b5bcd76c's config_registry.py)."""
    lora = torchtitan.read(Path(f"{MAIN / 'llama3' / 'config_registry.py'}:llama3_debugmodel_float8_emulate_lora"))
    rows = [(s.value, s.what.split(" (")[0]) for s in lora.settings if s.name == "model.converters"]
    assert rows == [("LoRAConverter.Config", "LoRA adapters"), ("float8 LoRAConverter.Config", "Float8 matmuls")]
    nvfp4 = torchtitan.read(Path(f"{MAIN / 'llama3' / 'config_registry.py'}:llama3_8b_first_85_pct_layers_nvfp4"))
    assert [(s.value, s.status) for s in nvfp4.settings if s.name == "model.converters"] == [("nvfp4", "not modelled")]


def test_model_registrys_comm_backends_are_listed_not_unknown():
    """deepseek_v3_16b_hybridep and llama3_debugmodel_dist_gemm (b5bcd76c) pass model_registry keyword
    arguments the cost model does not time: listed with what they do; their defaults have no effect."""
    hybrid = torchtitan.read(Path(f"{MAIN / 'deepseek_v3' / 'config_registry.py'}:deepseek_v3_16b_hybridep"))
    status = {s.name: s.status for s in hybrid.settings}
    assert status["model.moe_comm_backend"] == status["model.non_blocking_capacity_factor"] == "not modelled"
    assert not hybrid.of("unknown")
    default = torchtitan.from_mapping({"model": {"name": "llama3", "flavor": "8B", "tp_gemm_backend": "default"}},
                                      "t.toml")
    assert {s.name: s.status for s in default.settings}["model.tp_gemm_backend"] == "no effect"


def test_a_converted_config_names_the_config_function_it_converts(tmp_path):
    """graph_trainer's registry (torchtitan b5bcd76c) returns to_graph_trainer_config(qwen3_14b(), ...): the
    reader names qwen3_14b's own registry as the file to give, not the converter's."""
    registry = tmp_path / "config_registry.py"
    registry.write_text("from torchtitan.experiments.graph_trainer.configs import to_graph_trainer_config\n"
                        "from torchtitan.models.qwen3.config_registry import qwen3_14b\n"
                        "from . import model_registry\n\n\n"
                        "def graph_trainer_qwen3_14b():\n"
                        "    config = to_graph_trainer_config(qwen3_14b(), model_registry)\n"
                        "    return config\n")
    result = run("evaluate", "--from-torchtitan", f"{registry}:graph_trainer_qwen3_14b", "--gpus", "8")
    assert result.exit_code != 0 and result.output.strip().count("\n") == 0, result.output
    assert "--from-torchtitan torchtitan/models/qwen3/config_registry.py:qwen3_14b" in result.output


def _torchft_config(tmp_path, fault_tolerance: str) -> Path:
    """torchtitan 0.3.0's experiments/torchft/llama3/config_registry.py in its parts that matter here: the
    container of default_adamw's groups, and the fault-tolerance section."""
    (tmp_path / "llama3").mkdir(exist_ok=True)
    path = tmp_path / "llama3" / "config_registry.py"
    path.write_text("from torchtitan.experiments.torchft.optimizer import TorchFTOptimizersContainer\n"
                    "from torchtitan.experiments.torchft.config.job_config import FaultTolerance\n"
                    "from . import model_registry\n"
                    "def llama3_torchft_debugmodel():\n"
                    "    return FaultTolerantTrainer.Config(model_spec=model_registry('debugmodel'),\n"
                    "        optimizer=TorchFTOptimizersContainer.Config(param_groups=default_adamw(lr=8e-4).param_groups),\n"
                    "        training=TrainingConfig(local_batch_size=8, seq_len=2048),\n"
                    f"        fault_tolerance={fault_tolerance})\n")
    return path


def test_torchfts_optimizer_container_reads_as_the_adamw_its_groups_are_and_its_fault_tolerance_is_listed(tmp_path):
    path = _torchft_config(tmp_path, "FaultTolerance(enable=True, semi_sync_method='diloco', "
                                     "process_group_timeout_ms=10000)")
    job = torchtitan.read(Path(f"{path}:llama3_torchft_debugmodel"))
    said = {s.name: (s.status, s.value) for s in job.settings}
    assert said["optimizer.name"] == ("modelled", "AdamW") and float(said["optimizer.lr"][1]) == 0.0008
    assert said["fault_tolerance.enable"] == ("not modelled", "true")
    assert said["fault_tolerance.semi_sync_method"] == ("not modelled", "diloco")
    assert said["fault_tolerance.process_group_timeout_ms"][0] == "no effect"
    off = torchtitan.read(Path(f"{_torchft_config(tmp_path, 'FaultTolerance(enable=False)')}:llama3_torchft_debugmodel"))
    assert {s.name: s.status for s in off.settings}["fault_tolerance.enable"] == "no effect"


def test_the_transformers_backend_is_pointed_to_its_hub_models_config(tmp_path):
    (tmp_path / "transformers_modeling_backend").mkdir()
    path = tmp_path / "transformers_modeling_backend" / "config_registry.py"
    path.write_text("from . import model_registry\n"
                    "def transformers_modeling_backend_debugmodel():\n"
                    "    return TransformersBackendConfig(model_spec=model_registry('debugmodel'),\n"
                    "        hf_model='Qwen/Qwen3-4B-Instruct-2507')\n")
    result = run("evaluate", "--from-torchtitan", f"{path}:transformers_modeling_backend_debugmodel", "--gpus", "8")
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "Hugging Face's Qwen/Qwen3-4B-Instruct-2507" in said and "--hf-config config.json" in said
    assert "flavor debugmodel overrides" in said


def test_a_training_section_a_helper_builds_is_listed_not_a_traceback(tmp_path):
    """`training=_training()` (a helper returning a TrainingConfig, not followed): the section held as written, said
    as a key the prediction leaves out; the default cuda-graphs key, set only in a section that is a table."""
    family = tmp_path / "llama3"
    family.mkdir()
    path = family / "config_registry.py"
    path.write_text("def _training() -> TrainingConfig:\n"
                    "    return TrainingConfig(steps=100, local_batch_size=8, seq_len=2048)\n\n\n"
                    "def cfg() -> Trainer.Config:\n"
                    "    return Trainer.Config(model_spec=model_registry(\"8B\"), training=_training())\n")
    result = run("evaluate", "--from-torchtitan", f"{path}:cfg", "--gpus", "8", "--gpu", "h100")
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "training │ _training(...) │ not a key this reader knows" in said


def test_a_floor_division_by_zero_gets_one_sentence(tmp_path):
    path = tmp_path / "zero.py"
    path.write_text("def cfg():\n    steps = 1000 // 0\n    return Trainer.Config(training=TrainingConfig(steps=steps))\n")
    result = run("evaluate", "--from-torchtitan", f"{path}:cfg", "--gpus", "8")
    assert result.exit_code != 0 and "line 2: 1000 // 0 divides by zero" in " ".join(result.output.split())
    assert len(result.output.strip().splitlines()) <= 3


@pytest.mark.parametrize("imported, file", [
    ("from .config_registry import qwen3_32b as base_config", "qwen3/config_registry.py"),
    ("from ..qwen3.config_registry import qwen3_32b as base_config", "qwen3/config_registry.py"),
    ("from torchtitan.models.qwen3.config_registry import qwen3_32b as base_config",
     "torchtitan/models/qwen3/config_registry.py"),
])
def test_a_refined_base_imported_relatively_is_named_by_its_file(tmp_path, imported, file):
    """A config refining a base config function imported from another registry is refused with the file to give
    instead. A relative import was named by its dots turned to slashes: `from .config_registry import ...` beside
    qwen3/mine.py said `--from-torchtitan /config_registry.py:qwen3_32b`, a file at the root."""
    (tmp_path / "qwen3").mkdir()
    mine = tmp_path / "qwen3" / "mine.py"
    mine.write_text(f"{imported}\n\n\ndef mine():\n    config = base_config()\n    return config\n")
    result = run("evaluate", "--from-torchtitan", f"{mine}:mine", "--gpus", "8")
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and result.output.strip().count("\n") <= 1, result.output
    expected = file if file.startswith("torchtitan/") else str(tmp_path / file)
    assert f"--from-torchtitan {expected}:qwen3_32b " in said, said
