"""Defects a user's pass over models and configs no test used found (docs/published-runs.md §41.usertrial4):
each test fails on the commit before its fix."""

from __future__ import annotations

from fixtures.cli import run, run_ok


def test_search_names_the_flag_a_missing_config_was_given_by(tmp_path):
    """`ckplan search --hf-config missing.json` answered "--arch-config missing.json does not exist": a flag the
    user never gave. The sentence names --hf-config, the flag the path came by."""
    missing = tmp_path / "missing.json"
    for flag in ("--hf-config", "--arch-config"):
        result = run("search", flag, missing, "--gpus", "8", "--global-batch", "64", "--seq-len", "4096")
        assert result.exit_code != 0
        assert f"{flag} {missing} does not exist" in result.output


TINY_GPT_SCRIPT = """#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=1
{exports}
torchrun --nproc_per_node 1 pretrain_gpt.py \\
    --num-layers 2 --hidden-size 256 --num-attention-heads 4 --ffn-hidden-size 1024 \\
    --seq-length 512 --max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 8 \\
    --vocab-size 1024 --bf16
"""


def _script(tmp_path, exports: str = ""):
    path = tmp_path / "train.sh"
    path.write_text(TINY_GPT_SCRIPT.format(exports=exports))
    return path


def test_a_launch_scripts_exports_are_read_as_a_yamls_env_vars(tmp_path):
    """A launch script's `export NAME=value` lines were dropped unsaid, where the same variables in a YAML's
    ENV_VARS are listed and PYTORCH_CUDA_ALLOC_CONF's expandable_segments runs the allocator replay's expandable
    segments (a user's script sets it to lower its reserve). Now each export is said and the allocator's read."""
    from planner.models.configs import megatron

    plain = megatron.read(_script(tmp_path))
    assert plain.modelled.expandable_segments is None
    [said] = [s for s in plain.settings if s.name == "export CUDA_DEVICE_MAX_CONNECTIONS"]
    assert (said.value, said.status) == ("1", "not modelled")
    job = megatron.read(_script(tmp_path, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
                                          "NCCL_ALGO=Ring\nexport NCCL_ALGO\nexport NCCL_PROTO=simple"))
    assert job.modelled.expandable_segments is True and job.modelled.nccl_ring_simple
    assert {s.name: s.status for s in job.settings if s.name.startswith("export ")} == {
        "export CUDA_DEVICE_MAX_CONNECTIONS": "not modelled", "export PYTORCH_CUDA_ALLOC_CONF": "modelled",
        "export NCCL_ALGO": "modelled", "export NCCL_PROTO": "modelled"}
    # no functional-test launcher under a script: its defaults (Ring/Simple, NVLS off) are not assumed
    assert not plain.modelled.nccl_ring_simple and not plain.modelled.nccl_nvls_off


def test_a_scripts_expandable_segments_move_the_reserve_as_a_yamls_do(tmp_path):
    """The export's figure: evaluate's reserved peak under the script's expandable segments is the one the same
    job's YAML with them in its ENV_VARS gets (the allocator replay's), and differs from the default's."""
    import json

    def reserved(path):
        out = run("evaluate", "--from-megatron", path, "--gpus", "1", "--json")
        assert out.exit_code == 0, out.output
        return [rank["reserved_bytes"] for rank in json.loads(out.output)["ranks"]]

    exported = reserved(_script(tmp_path, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"))
    assert exported != reserved(_script(tmp_path))
    yaml = tmp_path / "model_config.yaml"
    yaml.write_text("ENV_VARS:\n  PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True\nMODEL_ARGS:\n" + "".join(
        f"  {flag}: {value}\n" for flag, value in (
            ("--num-layers", 2), ("--hidden-size", 256), ("--num-attention-heads", 4), ("--ffn-hidden-size", 1024),
            ("--seq-length", 512), ("--max-position-embeddings", 512), ("--micro-batch-size", 1),
            ("--global-batch-size", 8), ("--vocab-size", 1024), ("--bf16", "true"))))
    assert exported == reserved(yaml)


def _tiny_yaml(tmp_path, **flags):
    args = {"--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 4, "--ffn-hidden-size": 1024,
            "--seq-length": 512, "--max-position-embeddings": 512, "--micro-batch-size": 1, "--global-batch-size": 8,
            "--vocab-size": 1000, "--bf16": "true", **{f"--{k.replace('_', '-')}": v for k, v in flags.items()}}
    path = tmp_path / "model_config.yaml"
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {flag}: {value}\n" for flag, value in args.items()))
    return path


def test_a_zero_padding_multiple_is_one_sentence_not_a_division_by_zero(tmp_path):
    """`--tensor-model-parallel-size: 0` in a YAML of flags raised ZeroDivisionError with a traceback: the vocabulary
    was padded to a multiple of --make-vocab-size-divisible-by x TP before the degrees were checked."""
    for flag, value in (("tensor_model_parallel_size", 0), ("make_vocab_size_divisible_by", 0)):
        result = run("evaluate", "--from-megatron", _tiny_yaml(tmp_path, **{flag: value}), "--gpus", "8")
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
        assert f"--{flag.replace('_', '-')} 0: give 1 or more" in result.output
    # the padding itself, by hand: 1000 to a multiple of 128 x TP 2 = 256 is 1024
    out = run("evaluate", "--from-megatron", _tiny_yaml(tmp_path, tensor_model_parallel_size=2), "--gpus", "2").output
    assert "vocabulary 1000 padded to 1024" in " ".join(out.split())


def test_a_converters_string_is_refused_not_read_as_no_float8(tmp_path):
    """`converters = "float8"` (a string where torchtitan takes a list) scored the job without Float8 and listed
    model.converters and its float8 keys as "no effect": the user's Float8 silently dropped."""
    from planner.models.configs import torchtitan

    toml = ('[model]\nname = "llama3"\nflavor = "8B"\nconverters = {}\n[training]\nseq_len = 1024\n'
            'local_batch_size = 1\n[quantize.linear.float8]\nfilter_fqns = ["output"]\n')
    (tmp_path / "list.toml").write_text(toml.format('["float8"]'))
    assert torchtitan.read(tmp_path / "list.toml").modelled.float8
    (tmp_path / "string.toml").write_text(toml.format('"float8"'))
    result = run("evaluate", "--from-torchtitan", tmp_path / "string.toml", "--gpus", "8")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert "model.converters = 'float8' is not a list" in " ".join(result.output.split())


def test_a_negative_recompute_count_is_refused(tmp_path):
    """`--recompute-num-layers: -1` under --recompute-method uniform was scored as every layer recomputed; Megatron-core
    asks for a count "between 1 and num_layers_per_pipeline_rank" (transformer_config.py 1919-1925 at d98e8a64), and
    its uniform loop steps by the count, which at -1 never ends."""
    for method in ("uniform", "block"):
        path = _tiny_yaml(tmp_path, recompute_granularity="full", recompute_method=method, recompute_num_layers=-1)
        result = run("evaluate", "--from-megatron", path, "--gpus", "1")
        assert result.exit_code == 1 and "--recompute-num-layers -1: give 1 or more" in result.output
    run_ok("evaluate", "--from-megatron", _tiny_yaml(tmp_path, recompute_granularity="full", recompute_method="block",
                                                     recompute_num_layers=1), "--gpus", "1")


def test_evaluates_heading_names_the_expert_parallelism_it_scored(tmp_path):
    """A config's expert parallelism was modelled (the experts' all-to-all over EP charged) but the heading said
    "TP 1, PP 2 x 2 virtual, DP 8 (ZeRO 3)" only, as if the file's expert_parallel_degree had been dropped."""
    path = _tiny_yaml(tmp_path, swiglu="true", num_experts=4, moe_router_topk=2, expert_model_parallel_size=2)
    heading = " ".join(run_ok("evaluate", "--from-megatron", path, "--gpus", "2").output.split())
    assert "DP 2 (ZeRO 0), EP 2, 4 microbatches" in heading
    plain = " ".join(run_ok("evaluate", "--from-megatron", _tiny_yaml(tmp_path), "--gpus", "2").output.split())
    assert "EP" not in plain[:plain.index("microbatches")]


def test_a_log_of_one_framework_is_not_set_against_the_others_config(tmp_path):
    """`calibrate --from-log titan.log --from-megatron train.sh` set a torchtitan log's reserved peak and tokens/s
    against a Megatron-LM job's prediction (+244.8% reserved, +89.7% step on the trial's pair), rc 0, unsaid."""
    log = tmp_path / "titan.log"
    log.write_text("[rank0]:[titan] step:  1  loss: 11.0  grad_norm:  2.0  memory: 72.51GiB(91.53%)  tps: 410  "
                   "tflops: 380.12  mfu: 38.4%\n")
    result = run("calibrate", "--from-log", log, "--from-megatron", _script(tmp_path), "--gpus", "1")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    said = " ".join(result.output.split())
    assert f"{log} is a torchtitan log, and --from-megatron" in said and "--from-torchtitan" in said
    megatron_log = tmp_path / "megatron.log"
    megatron_log.write_text(" iteration        2/      10 | elapsed time per iteration (ms): 30.5 |\n")
    toml = tmp_path / "job.toml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "debugmodel"\n')
    result = run("calibrate", "--from-log", megatron_log, "--from-torchtitan", toml, "--gpus", "1")
    assert result.exit_code == 1 and "is a Megatron-LM log, and --from-torchtitan" in " ".join(result.output.split())
    run_ok("calibrate", "--from-log", megatron_log, "--from-megatron", _script(tmp_path), "--gpus", "1")
