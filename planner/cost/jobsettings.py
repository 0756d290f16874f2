"""Settings a job states that move bytes the profile does not, each timed from its runtime record
(planner/cost/runtimes.py) at the profile's GPU's HBM bandwidth, memory-bound (issue 35: the
settings Megatron-LM's functional tests gpt3_7b_tp*_memory_speed run, Megatron-LM 6e091e1b):

- unfused weight-gradient accumulation (Megatron-LM's --no-gradient-accumulation-fusion): per
  microbatch, each weight's bf16 gradient added into main_grad by DDP's hook (copied into its bucket
  by Megatron-FSDP's), a kernel of its own: hook_bytes a weight less the `.grad` add the profile
  charged where it timed one (beyond_profile_bytes: 4 B at the record's bf16 gradient and fp32
  main_grad where the record's `main_grad_hook` says the runtime has one), at the profile's elementwise rate (§412). Embedding tables
  (the profile's lookup_param_count) are not linears: their gradients take that path with or
  without the setting, charged so (embedding_hook_add_ms).
- the logging reads (--log-params-norm, --log-num-zeros-in-grad): once a step, each over the rank's
  optimizer shard, the record's `logged_read_shard_bytes` a parameter.
- deterministic mode (--deterministic-mode): torch.use_deterministic_algorithms(True) makes every
  aten::empty write NaN into the tensor before returning it (torch.utils.deterministic.
  fill_uninitialized_memory, default True), and Transformer Engine allocates its outputs through
  at::empty (the record's `fills_te_outputs`; TE f8a01cd5: GEMM outputs gemm.cpp 178-180 and
  quantizer.cpp 162, the norms' outputs and input gradients normalization.cpp 23-25, 140, 224-225, 377,
  attention's output and dQ, dK, dV attention.cpp 156-157, 376-450): per microbatch a dense block's
  bf16 outputs forward and input gradients backward (and the bf16 weight gradients where accumulation
  is unfused) are written once more; again in a recomputed forward. On sm90 the attention's backward
  workspace too (attention.cpp 587-588: allocateSpace, at::empty, common.cpp 264-273): cuDNN's
  deterministic backward there is the dP-workspace decomposition, forced under determinism by the
  cudnn-frontend TE builds with (v1.22.0, 97f6cb3b, TE f8a01cd5's 3rdparty submodule;
  scaled_dot_product_flash_attention.h 1480-1484, "the user force requests deterministic algorithm on
  hopper"), whose dP workspace is b x h_q x s_q x s_kv x 2 bytes, each length padded to 64 (1465-1467;
  cudnn-frontend#398: "always forced the dP-workspace decomposition", quadratic in the length): at least
  that much is filled a layer's backward (dp_workspace_bytes; 4 GiB at T15's 32 heads x 8,192 tokens).
  The kernels' own reads and writes of dP are not charged (no deterministic sm90 rate is published), nor
  a context-parallel ring's calls. Per-token fp32 statistics (the norms' mu and rsigma, the softmax's)
  and TE's other workspaces are left out. Read from the profile's model (an analytic or --hf-config
  profile's `assumptions.model`); MoE blocks and other layers are not read (0).
- deterministic mode's attention: Transformer Engine picks its backend under determinism
  (NVTE_ALLOW_NONDETERMINISTIC_ALGO=0; the record's `deterministic_attention`, "transformer-engine"):
  on sm90 it keeps cuDNN's fused attention and asks it for its deterministic backward; on sm100 and later
  cuDNN's deterministic backward is offered only without dropout (nvte_get_fused_attn_backend: "is_training
  && deterministic && cudnn >= 9.18.1 && dropout == 0.0", transformer_engine/common/fused_attn/
  fused_attn.cpp 461-470 at TE e7c550c5, v2.18, the GB200 golden files' image; the same at f8a01cd5,
  v2.16), so under attention dropout (Megatron's default 0.1) FusedAttention has no backend there and TE
  runs FlashAttention-2 (FlashAttention-3 is sm90's only, FlashAttention-4 refuses dropout: dot_product_
  attention/utils.py 495-498, 1010-1015); below sm90 (A100) TE drops FusedAttention under determinism and
  runs FlashAttention-2 too. cuDNN's deterministic backward is charged at its published rate (GPU.te_
  attention_deterministic_bwd: GB200's, NVIDIA/cudnn-frontend's training SDPA benchmark, cuDNN 9.22) beyond
  the non-deterministic one the profile's record times; none is published for sm90: 0 there.
  FlashAttention-2's forward at the GPU's FlashAttention-2 figures (its attention figures: torch SDPA's
  flash backend, FlashAttention-2's kernels), and its deterministic backward, whose grid holds a block an SM
  for every (batch, head) split, run in waves (flash2_deterministic_factor, from its launch code and shared
  memory), replace the kernels the profile timed (on GB200 and B200: cuDNN's). The extra fp32 dQ
  accumulators (splits - 1 of them, zero-filled and summed) are not charged (402 MB a layer at T16's shape),
  nor TE's sbhd -> bshd copies around it. The attention dropout's draws inside either kernel are their own
  term (planner/cost/attention_dropout.py), on the times te_attention_ms gives.

Memory is unchanged: the unfused bf16 gradient lives from its GEMM to the DDP hook that runs right
after its AccumulateGrad, one linear's weight at a time, inside the backward transients the profile
charges at the moments that set a stage's peak (docs/published-runs.md §12.megtest)."""

from __future__ import annotations

from planner.cost import dataparallel, megatron_fsdp, runtimes
from planner.cost.fsdp2work import PROFILE_ACCUMULATE
from planner.cost.hpgrads import elementwise_tbps
from planner.cost.layers import LayerCost
from planner.schema import OPTION_FULL, Profile, TrainSetup

ATTENTION_BWD_FLOPS = 2.5  # torch's sdpa_backward_flop_count: five matmuls to the forward's two
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def _hbm_tbps(profile: Profile) -> float | None:
    tbps = profile.assumptions.get("gpu_hbm_tbps")
    return tbps if isinstance(tbps, (int, float)) and not isinstance(tbps, bool) and tbps > 0 else None


def weight_param_count(layer: LayerCost) -> int:
    """The layer's parameters whose gradients a linear's wgrad GEMM makes: all but its embedding tables (the
    profile's lookup_param_count; a block's norms and biases, under 0.1% of it, counted with its linears)."""
    return layer.param_count - layer.lookup_param_count


def accumulation_timed(profile: Profile) -> bool:
    """Whether the profile's backward charges each parameter's `.grad` add (PROFILE_ACCUMULATE x the gradient's
    bytes): a measured or fake profile (each runs its backward into a `.grad` made before it: measure.py, fake.py),
    an analytic one timed by its roofline (analytic_time.accumulate_ms, embedding_work); not under --mfu, which
    times FLOPs alone. The one answer: deepspeed_grads.takes_accumulation_off reads it."""
    return profile.source != "analytic" or profile.assumptions.get("mfu") is None


def hook_bytes(setup: TrainSetup) -> int:
    """Bytes a parameter a microbatch the runtime's hook moves taking a gradient autograd made: Megatron-FSDP
    (megatron_fsdp.runs: its gradient buffer sharded) copies it into main_grad's bucket (read the gradient, write
    main_grad: docs/framework-facts.md §411); Megatron-LM's DDP adds it into main_grad (read both, write main_grad:
    §372). main_grad is the record's gradient dtype (fp32), bf16 under --grad-reduce-in-bf16."""
    held = dataparallel.param_bytes(setup)
    main_grad = DTYPE_BYTES["bfloat16"] if setup.training.grad_reduce_bf16 else held.grads
    return held.weights + (1 if megatron_fsdp.runs(setup) else 2) * main_grad


def beyond_profile_bytes(profile: Profile, setup: TrainSetup) -> int:
    """Bytes a parameter a microbatch the hook moves beyond the `.grad` add the profile's backward charged (none
    where it timed none: accumulation_timed); negative where the hook moves less (Megatron-FSDP's copy); 0 for a
    runtime whose record has no such hook (main_grad_hook False: torch's own `.grad` add is the profile's)."""
    if not runtimes.of(setup.training).main_grad_hook:
        return 0
    timed = PROFILE_ACCUMULATE * dataparallel.param_bytes(setup).weights if accumulation_timed(profile) else 0
    return hook_bytes(setup) - timed


def unfused_accumulation_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch the layer's unfused weight-gradient accumulation adds to its backward (beyond_profile_bytes
    a weight), a tied head's weight on one stage left out (its gradient meets the embedding's in autograd's add,
    then one hook add, charged on the embedding: embedding_hook_add_ms); at the profile's elementwise rate (the
    eager add's class, hpgrads.elementwise_tbps: Liger-Kernel's elementwise sweeps, membound.py), the rate the
    profile times the accumulation at; 0 where the setup keeps the fused path or the profile names no rate."""
    tbps = elementwise_tbps(profile)
    if not setup.training.unfused_grad_accumulation or tbps is None:
        return 0.0
    shared = layer.shared_before if setup.pipeline.stages == 1 else 0
    moved = (weight_param_count(layer) - shared) * beyond_profile_bytes(profile, setup)
    return moved / (tbps * 1e12) * 1e3


def embedding_hook_add_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch the runtime's hook moves taking the layer's embedding tables' gradients beyond what the
    profile's backward charges, with the fusion or without (docs/framework-facts.md §372-§374, §411): the lookup's
    backward hands autograd a bf16 gradient, the hook adds it into main_grad (DDP) or copies it into its bucket
    (Megatron-FSDP), beyond_profile_bytes a table parameter, at the profile's elementwise rate; 0 for a layer of no
    table (lookup_param_count 0), records without such a hook, a profile naming no rate."""
    tbps = elementwise_tbps(profile)
    if not layer.lookup_param_count or tbps is None:
        return 0.0
    return layer.lookup_param_count * beyond_profile_bytes(profile, setup) / (tbps * 1e12) * 1e3


def logged_reads_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """ms once a step the setup's logging reads take over the layer's share of the rank's shard."""
    training = setup.training
    reads = int(training.log_params_norm) + int(training.log_num_zeros_in_grad)
    tbps = _hbm_tbps(profile)
    if not reads or tbps is None:
        return 0.0
    shard = layer.param_count / dataparallel.shard_size(setup)
    moved = reads * shard * runtimes.of(training).logged_read_shard_bytes
    return moved / (tbps * 1e12) * 1e3


def te_output_elements(profile: Profile, layer: LayerCost) -> tuple[int, int]:
    """(forward, backward) bf16 elements a token that a dense decoder block's TE modules allocate on
    one device. Forward: the two norms' outputs (2h), linear_qkv's Q, K, V, the attention's output (q),
    linear_proj's h, linear_fc1's f (2f gated), linear_fc2's h. Backward: each GEMM's input gradient
    (h, q, h, f), the attention's dQ, dK, dV, the norms' input gradients (2h). (0, 0) for any other
    layer, or where the profile does not describe its model."""
    model, found = profile.assumptions.get("model"), profile.assumptions
    if layer.kind != "decoder_block" or not isinstance(model, dict) or model.get("num_experts") \
            or model.get("kv_lora_rank"):
        return 0, 0
    try:
        tp, h, heads = int(found.get("tp", 1)), int(model["hidden_size"]), int(model["num_heads"])
        kv_heads, width = int(model.get("num_kv_heads") or heads), int(model["intermediate_size"])
        head = int(model.get("head_dim") or h // heads)
    except (KeyError, TypeError, ValueError):
        return 0, 0
    q, kv, f = heads // tp * head, max(kv_heads // tp, 1) * head, width // tp
    fc1 = 2 * f if model.get("style") == "llama" else f
    gemms = (q + 2 * kv + h + fc1 + h, h + q + h + f)
    return gemms[0] + 2 * h + q, gemms[1] + q + 2 * kv + 2 * h


def deterministic_fill_ms(layer: LayerCost, ckpt, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch torch's NaN fill of the layer's TE outputs adds under deterministic
    mode (recomputed: the forward's again); 0 off, or where nothing is read."""
    training, tbps = setup.training, _hbm_tbps(profile)
    if not training.deterministic or tbps is None or not runtimes.of(training).fills_te_outputs:
        return 0.0
    fwd, bwd = te_output_elements(profile, layer)
    if not fwd:
        return 0.0
    found = profile.assumptions
    tokens = int(found.get("seq_len", 0)) * profile.micro_batch_size // max(int(found.get("cp", 1) or 1), 1)
    element = DTYPE_BYTES.get(str(found.get("dtype")), 2)
    reruns = 1 if layer.options[int(ckpt)].name == OPTION_FULL else 0
    moved = (fwd * (1 + reruns) + bwd) * tokens * element
    if training.unfused_grad_accumulation:  # the bf16 weight gradients, each allocated by its GEMM
        moved += weight_param_count(layer) * element
    return (moved + dp_workspace_bytes(layer, profile, setup)) / (tbps * 1e12) * 1e3


DP_WORKSPACE_PAD = 64  # cudnn-frontend 97f6cb3b scaled_dot_product_flash_attention.h 1465-1466: s_q, s_kv to 64
DP_ELEMENT_BYTES = 2  # the same file's 1467: b * h_q * s_q * s_kv * 2


def dp_workspace_bytes(layer: LayerCost, profile: Profile, setup: TrainSetup) -> int:
    """Bytes of the dP workspace cuDNN's deterministic backward takes a call on sm90, one call a dense
    block's backward (the module's docstring): b x h_q x ceil64(s) x ceil64(s) x 2, heads over TP; 0 where
    the job does not run it: not deterministic, not Transformer Engine's cuDNN attention (te_attention,
    deterministic_attention_kernel), not Hopper (below sm90 and on sm100+ another kernel: a record with
    cuDNN's figures and no cuda_arch of 100 or more), or context parallel (the ring's calls, not read)."""
    training = setup.training
    if not training.deterministic or runtimes.of(training).deterministic_attention != "transformer-engine":
        return 0
    found = te_attention(profile, layer)
    if found is None or max(int(profile.assumptions.get("cp", 1) or 1), 1) != 1:
        return 0
    gpu, drops = found
    if deterministic_attention_kernel(gpu, drops_attention=drops) != "cudnn" or gpu.cuda_arch >= 100 \
            or not gpu.te_attention_efficiency:
        return 0
    heads, tp = int(profile.assumptions["model"]["num_heads"]), int(profile.assumptions.get("tp", 1))
    padded = -(-int(profile.assumptions.get("seq_len", 0)) // DP_WORKSPACE_PAD) * DP_WORKSPACE_PAD
    return profile.micro_batch_size * (heads // tp) * padded * padded * DP_ELEMENT_BYTES


def deterministic_attention_kernel(gpu, *, drops_attention: bool) -> str:
    """Which attention Transformer Engine runs for training under deterministic mode on `gpu` (the
    module's docstring): "flash2" (FlashAttention-2's deterministic backward) below sm90, where TE drops
    FusedAttention under determinism, and on sm100 and later where the attention drops, where cuDNN's
    deterministic backward takes no dropout; else "cudnn" (its deterministic backward: sm90, and sm100+
    without dropout). A GPU whose `cuda_arch` is not read (0: the Hopper records, MI300X) reads "cudnn"."""
    if 0 < gpu.cuda_arch < 90 or (gpu.cuda_arch >= 100 and drops_attention):
        return "flash2"
    return "cudnn"


def deterministic_attention_ms(layer: LayerCost, ckpt, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch the attention Transformer Engine runs under deterministic mode adds to a dense
    block over the kernels the profile's record times (TE's cuDNN attention where the GPU has its figures,
    else the GPU's attention; the module's docstring): te_attention_ms under deterministic mode less the
    same without it, a full recompute's rerun forward again. cuDNN's deterministic backward at the GPU's
    deterministic rate (GB200's; none published elsewhere: 0); FlashAttention-2's (deterministic_attention_
    kernel) forward at the GPU's FlashAttention-2 rate and its deterministic backward (that backward's rate x
    flash2_deterministic_factor on the GPU's SMs). 0 off, or where the runtime, the GPU or the profile says
    nothing."""
    training = setup.training
    if not training.deterministic or runtimes.of(training).deterministic_attention != "transformer-engine":
        return 0.0
    found = te_attention(profile, layer)
    if found is None:
        return 0.0
    gpu, drops = found
    kernel = deterministic_attention_kernel(gpu, drops_attention=drops)
    if kernel == "flash2" and (not gpu.num_sms or max(int(profile.assumptions.get("cp", 1) or 1), 1) != 1):
        return 0.0
    det, timed = te_attention_ms(profile, gpu, kernel, deterministic=True), _timed_attention_ms(profile, gpu)
    reruns = 1 if layer.options[int(ckpt)].name == OPTION_FULL else 0
    return (det[0] - timed[0]) * (1 + reruns) + det[1] - timed[1]


def te_attention(profile: Profile, layer: LayerCost):
    """(the profile's GPU, whether the attention drops) for a dense block whose attention is TE's fused
    kernel (flash: an unfused one keeps the scores), else None. A model that does not say drops where it is
    GPT-style (Megatron-LM's default attention_dropout 0.1)."""
    found, model = profile.assumptions, profile.assumptions.get("model")
    if not te_output_elements(profile, layer)[0] or not isinstance(found.get("gpu"), str) \
            or found.get("attention", "flash") != "flash":
        return None
    from planner.models import archs

    drops = model.get("attention_dropout")
    return archs.gpu(found["gpu"]), model.get("style") == "gpt" if drops is None else bool(drops)


def _attention_forward_flops(profile: Profile) -> float:
    """The block's causal attention forward FLOPs a microbatch on one device: 4·s²·d·heads / 2 (heads / TP,
    tokens / CP), as FlashAttention's benchmarks count them."""
    found, model = profile.assumptions, profile.assumptions["model"]
    heads, tp = int(model["num_heads"]), int(found.get("tp", 1))
    head = int(model.get("head_dim") or int(model["hidden_size"]) // heads)
    seq, cp = int(found.get("seq_len", 0)), max(int(found.get("cp", 1) or 1), 1)
    return 4 * seq * seq * head * (heads // tp) * profile.micro_batch_size / 2 / cp


def _timed_attention_ms(profile: Profile, gpu) -> tuple[float, float]:
    """(forward, backward) ms the profile's record times the attention at: TE's cuDNN figures where the GPU
    has them, else the GPU's attention figures at the profile's length."""
    from planner.models.attention_rates import attention_efficiency

    forward, peak = _attention_forward_flops(profile), gpu.bf16_tflops * 1e12
    rates = gpu.te_attention_efficiency or attention_efficiency(gpu, int(profile.assumptions.get("seq_len", 0)))
    return forward / (peak * rates[0]) * 1e3, ATTENTION_BWD_FLOPS * forward / (peak * rates[1]) * 1e3


def te_attention_ms(profile: Profile, gpu, kernel: str, *, deterministic: bool) -> tuple[float, float]:
    """(forward, backward) ms a microbatch of the attention kernel TE runs on `gpu`: "cudnn" as the profile
    times it, its backward at the GPU's deterministic rate where deterministic and published; "flash2" at the
    GPU's FlashAttention-2 figures (torch SDPA's flash backend), its backward x flash2_deterministic_factor on
    the GPU's SMs where deterministic."""
    from planner.models.attention_rates import attention_efficiency

    forward, peak = _attention_forward_flops(profile), gpu.bf16_tflops * 1e12
    if kernel == "cudnn":
        fwd_ms, bwd_ms = _timed_attention_ms(profile, gpu)
        if deterministic and gpu.te_attention_deterministic_bwd and len(gpu.te_attention_efficiency) >= 2:
            bwd_ms = ATTENTION_BWD_FLOPS * forward / (peak * gpu.te_attention_deterministic_bwd) * 1e3
        return fwd_ms, bwd_ms
    flash = attention_efficiency(gpu, int(profile.assumptions.get("seq_len", 0)))
    factor = 1.0
    if deterministic and gpu.num_sms:
        heads, tp = int(profile.assumptions["model"]["num_heads"]), int(profile.assumptions.get("tp", 1))
        factor = flash2_deterministic_factor(gpu.num_sms, profile.micro_batch_size * (heads // tp))
    return forward / (peak * flash[0]) * 1e3, ATTENTION_BWD_FLOPS * forward / (peak * flash[1]) * factor * 1e3


def flash2_deterministic_factor(sms: int, batch_heads: int) -> float:
    """FlashAttention-2's deterministic backward against its non-deterministic one, on `sms` streaming
    multiprocessors for `batch_heads` (batch x query heads a device). Deterministic, it launches
    ceil(sms / batch_heads) blocks a (batch, head), each looping over its share of the key blocks and adding
    into its own dQ accumulator (flash_bwd_launch_template.h 77-82, flash_bwd_kernel.h 834-838, Dao-AILab/
    flash-attention 0251105a, in this form since 073afd59 of 2024-12-06), where the non-deterministic grid
    has a block per key block (64 at 8,192 tokens). Head dim 128 takes 144 KiB of shared memory a block
    (kSmemSize1colblock of Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2>, kernel_traits.h 278-290): one
    block an SM on the A100 (164 KiB an SM) and on sm90 / sm100 (228 KiB an SM, the CUDA C++ Programming
    Guide's table of compute capabilities), so the blocks run in ceil(blocks / sms) waves of 1/blocks of the
    work each, where the non-deterministic kernel spreads the work over every SM: waves x sms / blocks. T16
    (32 heads, batch 1):
    128 blocks in 2 waves on 108 SMs, 1.69x; T19 (8 heads, batch 2): 112 blocks, 1.93x."""
    blocks = -(-sms // batch_heads) * batch_heads
    return -(-blocks // sms) * sms / blocks
