"""`ckplan profile MODEL.py --fake` / `--hf-config CONFIG --fake`: a profile of the model's
own code at full size, run under FakeTensorMode (planner/profiler/fake.py) on no hardware."""

from __future__ import annotations

from pathlib import Path

from planner.errors import UserError


def run(model_file: str, *, device: str, dtype: str, micro_batch_size: int, gpu: str, out: Path | None,
        timeout_s: float | None, arch_config: dict | None = None, seq_len: int | None = None,
        compiled: bool = False) -> None:
    """Build MODEL.py on meta, run it fake, write the profile. `arch_config`: the Hugging
    Face config it was written from (--hf-config), recorded so exports know the shape, and its
    --seq-len (the tokens per sequence plans count tokens/s and MFU by). `compiled`: record each
    layer's kept bytes under torch.compile too (AOTAutograd's partition, once per layer kind)."""
    import torch

    from planner import io
    from planner.models import archs

    spec = archs.gpu(gpu)
    out = out or Path("profiles") / f"{Path(model_file).stem}-fake-{spec.name}-mbs{micro_batch_size}.json"
    io.check_outputs({"--out": out}, inputs={"MODEL.py": model_file})
    model_ref, chain, mode = _load(model_file, getattr(torch, dtype), micro_batch_size, timeout_s=timeout_s)
    from planner.profiler import device_attention as attention
    from planner.profiler.storages import counted_as

    # for a GPU: its allocator's blocks and its attention kernels, though CPU kernels run
    with mode, counted_as(device), attention.device_attention(device, spec, chain.layers) as ran:
        measurement, flops = _measure(chain, spec, device)
        if compiled:
            measurement.layers[:] = _with_compiled(chain, measurement.layers)
    profile = _profile(measurement, flops, model_file=model_file, model_ref=model_ref, device=device, dtype=dtype,
                       micro_batch_size=micro_batch_size, gpu=spec, arch_config=arch_config)
    dropouts = ran.dropouts
    if ran.by_layer():
        profile = profile.model_copy(update={"assumptions": {**profile.assumptions,
                                                             **attention.kernels_note(ran, spec.name)}})
    if dropouts:
        note = (f"dropout {', '.join(f'{p:g}' for p in sorted(dropouts))} in the fused kernel, as {spec.name} runs it "
                f"({attention.CUDA_ATTENTION_CHECKS}; on the CPU {attention.CPU_ATTENTION_CHECKS}): kept as without dropout, its "
                "in-kernel cost not timed")
        profile = profile.model_copy(update={"assumptions": {**profile.assumptions, "attention_dropout": note}})
    if seq_len is not None:
        profile = profile.model_copy(update={"assumptions": {**profile.assumptions, "seq_len": seq_len}})
        profile = _blocks_on_te(profile, arch_config, model_file, seq_len, micro_batch_size, spec)
    io.save_profile(profile, out)
    _report(profile, out)


def _load(model_file: str, dtype, micro_batch_size: int, *, timeout_s: float | None):
    """The model built on meta (no memory, no initialisation), its parameters made fake,
    and the batch from example_batch() made fake: the chain ready to run under the mode."""
    import torch

    from planner import io
    from planner.models import modelfile
    from planner.profiler import fake
    from planner.profiler.userfault import blame

    loaded = modelfile.load_model_file(model_file, timeout_s=timeout_s)
    model_ref = io.file_ref(model_file)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = loaded.build_model()
    layers = modelfile.pipeline_layers(model, loaded.path)
    inputs, targets = loaded.example_batch(micro_batch_size)  # real and small: token ids or a few samples
    with blame(f"casting the model of {loaded.path} to {dtype} on meta"):
        model.to(dtype=dtype).train()
    mode = fake.new_mode()
    with blame(f"making the model of {loaded.path} fake"), mode:
        fake.fake_module(model, mode)
        inputs, targets = (modelfile.cast_batch(fake.fake_tensor(t, mode), torch.device("cpu"), dtype)
                           for t in (inputs, targets))
        with loaded.bounded("running the layers on example_batch() under FakeTensorMode"), \
                fake.data_free(str(loaded.path), layers):
            outputs = modelfile.check_chain(layers, inputs, loaded.path)
            loaded.check_loss(outputs[-1], targets)
    return model_ref, modelfile.Chain(layers, inputs, targets, loaded.loss_fn, outputs), mode


def _measure(chain, gpu, device: str):
    from planner.console import WorkProgress
    from planner.profiler.fake import fake_measure

    total = len(chain.layers)
    with WorkProgress("profile --fake") as work:
        work.phase(f"running {total} layers fake")
        done = iter(range(1, total + 1))
        return fake_measure(chain.layers, chain.inputs, chain.targets, chain.loss_fn,
                            layer_outputs=chain.layer_outputs, gpu=gpu, device_type=device,
                            on_layer=lambda name: work.update(next(done), total, f"ran layer {name}"))


def _with_compiled(chain, layers):
    """The layers with their kept bytes under torch.compile (none and full), partitioned once per kind."""
    from planner.profiler.compiled import module_figures
    from planner.profiler.userfault import blame

    inputs = [chain.inputs, *chain.layer_outputs[:-1]]
    by_kind: dict[str, dict[str, int]] = {}
    found = []
    for (name, module), x, layer in zip(chain.layers, inputs, layers, strict=True):
        if layer.kind not in by_kind:
            with blame(f"compiling layer {name!r} (AOTAutograd's partition)"):
                by_kind[layer.kind] = module_figures(module, x)
        found.append(layer.model_copy(update={"compiled_kept_bytes": by_kind[layer.kind]}))
    return found


def _profile(measurement, flops: dict, *, model_file: str, model_ref, device: str, dtype: str,
             micro_batch_size: int, gpu, arch_config: dict | None):
    import datetime
    import json

    import torch

    from planner.commands.profile_arch import _with_host_step
    from planner.models import archconfig, archs
    from planner.profiler.membound import membound_facts
    from planner.schema import DeviceInfo, Profile

    facts = {
        "gpu": gpu.name, "gpu_memory_bytes": gpu.memory_bytes, "gpu_bf16_tflops": gpu.bf16_tflops,
        "gpu_hbm_tbps": gpu.hbm_tbps, "gpu_source": gpu.source, "membound_tbps": membound_facts(gpu),
        "gpu_usable_bytes": gpu.usable_bytes, "gpu_usable_source": f"{gpu.total_source}; less the "
                                                                   f"{archs.CONTEXT_SOURCE}",
        "matmul_efficiency": gpu.matmul_efficiency, "matmul_source": gpu.matmul_source,
        "time": "per pass, a roofline per kernel (planner/profiler/roofline.py): each matmul at the efficiency "
                "published for its size up to matmul_efficiency (the best matmul measured, a per-kernel ceiling, not "
                "an end-to-end MFU), attention at FlashAttention-2's published throughput, memory-bound ops' bytes / "
                "HBM bandwidth",
        "memory": "the model's own code run under FakeTensorMode: saved-tensor hooks and storages, byte for byte; "
                  "kernels as torch's CPU kernels",
        "transients": "each layer's forward and backward peak beyond what it keeps, its code run into a `.grad` made "
                      "before: autograd's fresh weight gradients, alive until AccumulateGrad adds them in place, are "
                      "in it (weight_grad_transient_bytes says how much: a wgrad GEMM accumulating into main_grad, "
                      "Megatron-core's gradient_accumulation_fusion, holds transient_bytes less that)",
        "flops": flops,
        "optimizer_step": "memory-bound: Adam 28, SGD 20 bytes per parameter / HBM bandwidth",
        "tied": "a split tied set's gradient all-reduced between its holders' stages over their link (the cost "
                "model's, from bytes); sum_ms the local add of the two uses' gradients on one stage (read 2, write 1) at the eager "
                "elementwise rate",
    }
    if any(layer.expert_param_count for layer in measurement.layers):
        from planner.profiler.fake_moe import ROUTING_NOTE

        facts["routing"] = ROUTING_NOTE
    if arch_config is not None:
        try:
            arch = archconfig.from_hf_config(arch_config, where=model_file, name=Path(model_file).stem)
            facts["model"] = json.loads(arch.canonical_json())
            facts["style"] = arch.style
        except UserError:
            pass  # a shape --arch-config does not read: exports then ask for it
    name = f"{gpu.name} (fake)"
    info = DeviceInfo(type=device, name=name) if device == "cuda" else DeviceInfo(type="cpu", name=name, threads=1)
    profile = Profile(
        name=f"{Path(model_file).stem}-fake",
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch_version=torch.__version__, device=info, dtype=dtype, micro_batch_size=micro_batch_size,
        model=model_ref, batch_input_bytes=measurement.batch_input_bytes,
        batch_target_bytes=measurement.batch_target_bytes, loss_bytes=measurement.loss_bytes,
        loss_ms=measurement.loss_ms, loss_transient_bytes=measurement.loss_transient_bytes,
        layers=measurement.layers, tied=measurement.tied, source="fake", assumptions=facts,
        loss_alloc=measurement.loss_alloc,
    )
    return _with_host_step(profile)


def _blocks_on_te(profile, arch_config: dict | None, model_file: str, seq_len: int, micro_batch_size: int, gpu):
    """The profile with its dense blocks' passes on Transformer Engine's fused kernels recorded
    (te_fused.fake_blocks_on_te) and each block's variant (variants.py), where the Hugging Face config reads as an
    architecture."""
    from planner.models import archconfig
    from planner.profiler import te_fused
    from planner.profiler.formulas import Shape

    if arch_config is None:
        return profile
    try:
        arch = archconfig.from_hf_config(arch_config, where=model_file, name=Path(model_file).stem)
    except UserError:
        return profile  # a shape the reader does not read: timed as profiled, evaluate says so
    from planner.profiler.variants import with_variants

    shape = Shape(seq_len=seq_len, micro_batch_size=micro_batch_size)
    layers = with_variants(te_fused.fake_blocks_on_te(profile.layers, arch, shape, gpu), arch)  # global apart
    return profile.model_copy(update={"layers": layers})


def _report(profile, out: Path) -> None:
    from planner.commands.profile_options import options_report
    from planner.console import console, info, table
    from planner.units import format_bytes

    facts = profile.assumptions
    flops = facts["flops"]
    rows = [[layer.name, layer.kind, f"{(flops[layer.name]['forward']) / 1e12:.3g}", f"{layer.fwd_ms:.3f}",
             f"{layer.bwd_ms:.3f}", "–" if layer.recompute_ms is None else f"{layer.recompute_ms:.3f}",
             format_bytes(layer.act_bytes), format_bytes(layer.transient_bytes), f"{layer.param_count:,}"]
            for layer in profile.layers]
    title = (f"{profile.name}: the model's code under FakeTensorMode, for {profile.device.type} "
             f"({facts['gpu']}), {profile.dtype}, micro-batch {profile.micro_batch_size}")
    console.print(table(title, ["layer", "kind", "fwd TFLOP", "fwd ms", "bwd ms", "recompute ms", "kept", "transient",
                                "params"], rows, right_from=2))
    params = sum(layer.param_count for layer in profile.layers)
    shared = sum((len(item.layers) - 1) * item.param_count for item in profile.tied)
    info(f"{params - shared:,} parameters ({len(profile.tied)} tied set{'s' if len(profile.tied) != 1 else ''}); "
         f"{format_bytes(sum(layer.act_bytes for layer in profile.layers))} kept per microbatch without "
         f"checkpointing; the loss keeps {format_bytes(profile.loss_bytes)}")
    info(f"times are rooflines: each matmul at its size's published efficiency, up to {facts['matmul_efficiency']:g} "
         f"of {facts['gpu_bf16_tflops']:g} TFLOP/s (the best matmul measured on the {facts['gpu']}, a per-kernel "
         f"ceiling, not end to end), attention at FlashAttention-2's published rate, plus memory-bound bytes "
         f"at what eager kernels of each op class are measured to reach of the {facts['gpu_hbm_tbps']:g} TB/s "
         f"datasheet ({_class_rates(facts['membound_tbps'])}); `ckplan solve` defaults --mem to {format_bytes(facts['gpu_usable_bytes'])}")
    options_report(profile, "recompute times are rooflines of the work each adds, as full's")
    info(f"wrote {out}")


def _class_rates(rates: dict) -> str:
    """'norm 2.12, loss 1.31, ... TB/s' from membound_facts, the rates a fake profile's times rest on."""
    by_class = rates.get("by_class") or {}
    if not by_class:
        return f"{rates['eager']:.2f} TB/s"
    return ", ".join(f"{name} {tbps:.2f}" for name, tbps in by_class.items()) + " TB/s"
