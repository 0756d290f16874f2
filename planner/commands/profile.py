"""`ckplan profile MODEL.py`: measure every pipeline layer and write a profile (json)."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import click

from planner.commands import profile_arch, profile_hf, profile_options
from planner.errors import UserError

if TYPE_CHECKING:
    from planner.models.modelfile import Chain

DTYPES = ("float32", "bfloat16", "float16")


@click.command("profile")
@click.argument("model_file", metavar="[MODEL.py]", required=False)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES + tuple(profile_arch.DTYPE_ALIASES)), default="float32",
              show_default=True, callback=profile_arch.dtype_name,
              help="Parameters and floating-point inputs are cast to this.")
@click.option("--micro-batch-size", type=click.IntRange(min=1), default=4, show_default=True,
              help="Samples per microbatch, passed to example_batch().")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Untimed steps per layer before timing.")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed steps per layer; the profile keeps their median, min and max.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads for torch (default: torch's own default).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Profile to write [default: profiles/<model>-<device>-mbs<N>.json].")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=600, show_default=True,
              help="Seconds MODEL.py may take to import, and each of its build_model(), example_batch() "
                   "and the first run of the layers; past it ckplan stops and names the line it was "
                   "running. 0: no limit.")
@click.option("--fake", is_flag=True,
              help="Run MODEL.py's or --hf-config's own code at full size under FakeTensorMode, on no hardware: "
                   "exact bytes, parameters and FLOPs; times are rooflines on --gpu. --device (default cuda) is "
                   "the device the profile is for.")
@profile_arch.options
@profile_hf.options
def command(model_file, device, dtype, micro_batch_size, warmup, repeats, threads, out, timeout_s, fake, hf_config,
            hf_set, **arch_options) -> None:
    """Measure every pipeline layer of MODEL.py and write a profile for `ckplan solve`.

    \b
    Per layer, per microbatch: forward and backward time (median, min, max of
    --repeats after --warmup), the bytes it keeps for backward, its transient
    peak, its input/output and parameter sizes. MODEL.py defines build_model()
    and example_batch(micro_batch_size), and optionally loss_fn(output, target).

    \b
    With --arch NAME or --arch-config config.json instead of MODEL.py: an
    analytic profile of a published architecture, from formulas, per device
    (--tp, --sp, --cp) on --gpu, without running it; --dtype defaults to bfloat16.

    \b
    With --hf-config CONFIG instead of MODEL.py: a Hugging Face causal LM
    (llama, qwen2, qwen3, mistral, gemma, gpt2, phi3, olmo2, starcoder2, granite,
    cohere, mixtral, qwen2_moe, phimoe, qwen3_moe, olmoe, granitemoe, deepseek_v2,
    deepseek_v3, gemma3_text, smollm3) built from its config with random weights, at --seq-len tokens,
    measured like a model file; ckplan writes that model file (hf_<name>.py)
    beside the profile for launch and compare.
    """
    ctx = click.get_current_context()
    config = None
    if fake:
        device, dtype = _fake_defaults(ctx, device, dtype)
    if hf_config is not None:
        profile_arch.check_mixing(ctx, model_file, arch_options, hf_config=hf_config, fake=fake)
        path, config = profile_hf.model_file_for(hf_config, hf_set, seq_len=arch_options["seq_len"], out=out,
                                                 dtype=dtype, fake=fake)
        model_file = str(path)
    elif hf_set:
        raise UserError("--hf-set applies to --hf-config; drop it, or give --hf-config CONFIG")
    elif profile_arch.dispatch(model_file, dtype=dtype, micro_batch_size=micro_batch_size, out=out, fake=fake,
                               **arch_options):
        return
    if fake:
        from planner.commands import profile_fake

        profile_fake.run(model_file, device=device, dtype=dtype, micro_batch_size=micro_batch_size,
                         gpu=arch_options["gpu"], out=out, timeout_s=timeout_s or None, arch_config=config,
                         seq_len=(arch_options["seq_len"] or profile_hf._default_seq_len(config))
                         if hf_config is not None else None, compiled=arch_options["compiled"])
        return
    import torch  # here, not at the top: `ckplan --help` must not wait for torch

    from planner import io

    if device == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"--device cuda needs a CUDA GPU, but torch {torch.__version__} sees none; use --device cpu"
        )
    out = out or Path("profiles") / f"{Path(model_file).stem}-{device}-mbs{micro_batch_size}.json"
    io.check_outputs({"--out": out}, inputs={"MODEL.py": model_file})
    if threads is not None:
        torch.set_num_threads(threads)
    model_ref, chain = _load(model_file, torch.device(device), getattr(torch, dtype), micro_batch_size,
                             timeout_s=timeout_s or None)
    measurement = _measure(chain, warmup=warmup, repeats=repeats)
    thread_ms, shared_ms = (_thread_ms(chain, model_file=model_file, dtype=dtype, micro_batch_size=micro_batch_size)
                            if device == "cpu" else (None, None))
    profile = _profile(
        measurement, model_file=model_file, model_ref=model_ref, device=torch.device(device),
        dtype=dtype, micro_batch_size=micro_batch_size, warmup=warmup, repeats=repeats, thread_ms=thread_ms,
        shared_ms=shared_ms,
    )
    if hf_config is not None:  # the length ckplan's model file feeds it: exports and throughput read it
        seq_len = arch_options["seq_len"] or profile_hf._default_seq_len(config)
        profile = profile.model_copy(update={"assumptions": {**profile.assumptions, "seq_len": seq_len}})
        profile = _with_variants(profile, config, model_file)
    profile = with_timing_verdict(profile)
    io.save_profile(profile, out)
    _report(profile, out)


def _with_variants(profile, config: dict, model_file: str):
    """Each decoder block's variant (planner/profiler/variants.py) where the config reads as an architecture (before
    the timing verdict, which judges a layer among its variant)."""
    from planner.models import archconfig
    from planner.profiler.variants import with_variants

    try:
        arch = archconfig.from_hf_config(config, where=model_file, name=Path(model_file).stem)
    except UserError:
        return profile  # a shape the reader does not read: its layers grouped by kind alone
    return profile.model_copy(update={"layers": with_variants(profile.layers, arch)})


def with_timing_verdict(profile):
    """The profile with why its times cannot be trusted, when they contradict themselves (one
    layer's repeats or identical layers far apart, more threads slower), recorded for `solve`."""
    from planner.profiler import sanity
    from planner.profiler.noise import noisy_timings

    reasons = [noisy_timings(profile)]
    thread_ms = profile.device.thread_ms or {}
    slower = sanity.slower_with_more_threads(thread_ms)
    if slower:
        reasons.append(f"the whole model ran slower at {max(slower)} threads ({thread_ms[max(slower)]:.3g} ms) than at "
                       f"{min(thread_ms)} ({thread_ms[min(thread_ms)]:.3g} ms)")
    said = "; ".join(reason for reason in reasons if reason)
    return profile.model_copy(update={"assumptions": {**profile.assumptions, "timing_noise": said}}) if said else profile


def _fake_defaults(ctx: click.Context, device: str, dtype: str) -> tuple[str, str]:
    """--fake profiles for a GPU unless told (--device cpu), in bfloat16 there unless told."""
    given = {name for name in ("device", "dtype")
             if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT}
    device = device if "device" in given else "cuda"
    dtype = dtype if "dtype" in given or device == "cpu" else "bfloat16"
    return device, dtype


def _load(model_file: str, device, dtype, micro_batch_size: int, *, timeout_s: float | None):
    """The model file pinned by content, and its chain, checked against the contract
    (and against the model's own forward(), where it has one)."""
    import torch

    from planner import io
    from planner.models import modelfile
    from planner.profiler.userfault import blame

    loaded = modelfile.load_model_file(model_file, timeout_s=timeout_s)
    model_ref = io.file_ref(model_file)  # the path as the user gave it
    torch.manual_seed(0)  # weights, random batches and dropout masks repeat run to run
    model = loaded.build_model()
    layers = modelfile.pipeline_layers(model, loaded.path)
    inputs, targets = loaded.example_batch(micro_batch_size)
    with blame(f"moving the model and batch of {loaded.path} to {device} in {dtype}"):
        model.to(device=device, dtype=dtype).train()
        inputs, targets = (modelfile.cast_batch(t, device, dtype) for t in (inputs, targets))
    with loaded.bounded("running the layers on example_batch()"):
        outputs = modelfile.check_chain(layers, inputs, loaded.path)
    loaded.check_loss(outputs[-1], targets)
    _check_model(loaded, model, layers, inputs)
    return model_ref, modelfile.Chain(layers, inputs, targets, loaded.loss_fn, outputs)


def _check_model(loaded, model, layers, inputs) -> None:
    """The chain computes what the model's forward() does; no layer checkpoints itself."""
    from planner.console import warn
    from planner.models import modelfile
    from planner.profiler.userfault import blame

    with loaded.bounded("comparing the layers with the model's forward()"), blame(f"the model of {loaded.path}"):
        note = modelfile.forward_mismatch(model, layers, inputs, loaded.path)
    if note:
        warn(f"{note}; make sure pipeline_layers() covers every step of forward()")
    frozen = modelfile.frozen_parameters(layers)
    if frozen:
        shown = ", ".join(fqn for fqn, _ in frozen[:4]) + (f" and {len(frozen) - 4} more" if len(frozen) > 4 else "")
        warn(f"layers {shown} hold {sum(count for _, count in frozen):,} parameters with requires_grad False: "
             "charged as frozen, their weights held but no gradient nor optimizer state (the profile's "
             "trained_param_count); `ckplan launch` trains only the others")
    inside = modelfile.checkpointed_inside(layers)
    if inside:
        shown = ", ".join(inside[:4]) + (f" and {len(inside) - 4} more" if len(inside) > 4 else "")
        warn(f"layers {shown} already checkpoint inside themselves (e.g. Hugging Face's "
             "gradient_checkpointing_enable() or torch's checkpoint_wrapper): the profile measures them as if "
             "kept and a plan may checkpoint them twice; switch it off in build_model() and let ckplan choose")


def _measure(chain: Chain, *, warmup: int, repeats: int):
    from planner.console import WorkProgress, warn
    from planner.profiler.measure import measure_model

    with WorkProgress("profile") as work:
        work.phase(f"measuring the memory of {len(chain.layers)} layers")
        measurement = measure_model(
            chain.layers, chain.inputs, chain.targets, chain.loss_fn,
            layer_outputs=chain.layer_outputs, warmup=warmup, repeats=repeats, on_progress=work.update,
        )
    for note in measurement.warnings:
        warn(note)
    return measurement


def _thread_ms(chain: Chain, *, model_file: str, dtype: str,
               micro_batch_size: int) -> tuple[dict[int, float], dict[int, float] | None]:
    """(the whole model's forward + backward at 1, 2, 4, ... threads up to torch's own, least
    of 5: a launch that gives each rank fewer threads than the profile had scales the times
    by it; the same at 1 thread, median, alone and beside a copy on every other core, or
    None where there is no other core or no memory for the copies)."""
    import statistics

    import torch

    from planner.console import WorkProgress
    from planner.profiler.threads import alongside_ms, thread_counts, thread_samples, whole_step
    from planner.profiler.userfault import blame

    counts = thread_counts(torch.get_num_threads())
    step = whole_step(chain.layers, chain.inputs, chain.targets, chain.loss_fn)
    with WorkProgress("profile") as work, blame("the whole model's forward and backward"):
        work.phase(f"timing the whole model at {', '.join(map(str, counts))} threads")
        samples = thread_samples(step, counts, warmup=1, repeats=5)
        copies = _copies(chain)
        if copies < 2:
            return {count: min(values) for count, values in samples.items()}, None
        work.phase(f"timing it at 1 thread beside {copies - 1} cop{'ies' if copies > 2 else 'y'} on the other cores")
        beside = alongside_ms(step, copies=copies, warmup=1, repeats=5, start_copy=partial(
            _start_copy, model_file=model_file, dtype=dtype, micro_batch_size=micro_batch_size))
    thread_ms = _consistent_threads({count: min(values) for count, values in samples.items()},
                                    lambda: thread_samples(step, counts, warmup=1, repeats=5))
    return thread_ms, (None if beside is None else {1: statistics.median(samples[1]), copies: beside})


def _consistent_threads(thread_ms: dict[int, float], again) -> dict[int, float]:
    """thread_ms, timed `again()` once where more threads ran slower than fewer (the faster of
    the two kept). Where they still do, the machine's load is real: the layers were timed under
    it at the profile's threads, and the ratio is what converts their times to a launch's
    threads, so it is kept, and said with what to do."""
    from planner.console import warn
    from planner.profiler import sanity

    if not sanity.slower_with_more_threads(thread_ms):
        return thread_ms
    timed = again()
    thread_ms = {count: min(ms, *timed.get(count, [ms])) for count, ms in thread_ms.items()}
    slower = sanity.slower_with_more_threads(thread_ms)
    if slower:
        shown = ", ".join(f"{thread_ms[count]:.3g} ms at {count}" for count in sorted(thread_ms))
        fastest = min(thread_ms, key=thread_ms.get)
        warn(f"the whole model ran slower with more threads ({shown}), even when timed again: other work keeps "
             f"cores busy, so the layers' times at {max(thread_ms)} threads cannot be trusted for a quiet machine "
             f"(a launch scales them by these figures); profile with --threads {fastest}, or on a quiet machine")
    return thread_ms


def _copies(chain: Chain) -> int:
    """How many processes time the model side by side: one a core, up to MAX_COPIES, as
    many as this machine's free memory holds (weights, gradients and kept activations each)."""
    from planner.commands.profile_hf import available_bytes
    from planner.profiler.threads import MAX_COPIES

    each = 2 * sum(p.numel() * p.element_size() for _, layer in chain.layers for p in layer.parameters())
    each += sum(out.numel() * out.element_size() for out in chain.layer_outputs if hasattr(out, "numel"))
    have = available_bytes()
    fit = MAX_COPIES if have is None else int(have // 2 // max(each, 1))
    return max(1, min(os.cpu_count() or 1, MAX_COPIES, fit))


COPY_BOOTSTRAP = "import sys; from planner.commands.profile import run_copy; run_copy(*sys.argv[1:])"


def _start_copy(ready, stop, *, model_file: str, dtype: str, micro_batch_size: int):
    """A process that trains the model file's chain at 1 thread in a loop (run_copy)."""
    import subprocess
    import sys

    import planner
    from planner.runtime.children import child_env, guarded

    root = str(Path(planner.__file__).parent.parent)
    env = child_env({**os.environ, "OMP_NUM_THREADS": "1",
                     "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))})
    return subprocess.Popen([sys.executable, "-c", guarded(COPY_BOOTSTRAP), model_file, dtype, str(micro_batch_size),
                             str(ready), str(stop)], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_copy(model_file: str, dtype: str, micro_batch_size: str, ready: str, stop: str) -> None:
    """The chain's forward + backward at 1 thread, over and over: from when `ready` is
    created until `stop` exists (profiler/threads.alongside_ms times beside it)."""
    import torch

    from planner.profiler.threads import whole_step

    torch.set_num_threads(1)
    _, chain = _load(model_file, torch.device("cpu"), getattr(torch, dtype), int(micro_batch_size), timeout_s=None)
    step = whole_step(chain.layers, chain.inputs, chain.targets, chain.loss_fn)
    step()
    Path(ready).touch()
    while not Path(stop).exists():
        step()


def _profile(measurement, *, model_file, model_ref, device, dtype, micro_batch_size, warmup, repeats,
             thread_ms=None, shared_ms=None):
    import datetime
    import platform

    import torch

    from planner.profiler.measure import host_step_ns_per_param
    from planner.schema import DeviceInfo, Profile

    if device.type == "cuda":
        info = DeviceInfo(type="cuda", name=torch.cuda.get_device_name(device))
    else:
        info = DeviceInfo(type="cpu", name=platform.processor() or "cpu", threads=torch.get_num_threads(),
                          thread_ms=thread_ms, shared_ms=shared_ms)
    return Profile(
        name=Path(model_file).stem,
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch_version=torch.__version__,
        device=info,
        dtype=dtype,
        micro_batch_size=micro_batch_size,
        warmup=warmup,
        repeats=repeats,
        model=model_ref,
        batch_input_bytes=measurement.batch_input_bytes,
        batch_target_bytes=measurement.batch_target_bytes,
        loss_bytes=measurement.loss_bytes,
        tied=measurement.tied,
        loss_ms=measurement.loss_ms,
        loss_transient_bytes=measurement.loss_transient_bytes, loss_alloc=measurement.loss_alloc,
        layers=measurement.layers,
        host_step_ns_per_param=host_step_ns_per_param(),
    )


def _report(profile, out: Path) -> None:
    from planner.console import console, info, table, warn
    from planner.cost.optimizers import OPTIMIZERS
    from planner.profiler.noise import noisy_timings
    from planner.units import format_bytes

    rows = [
        [layer.name, layer.kind, f"{layer.fwd_ms:.3f}", f"{layer.bwd_ms:.3f}",
         "–" if layer.recompute_ms is None else f"{layer.recompute_ms:.3f}",
         f"{layer.step_ms.get('adam', 0.0):.3f}", f"{layer.act_bytes / 2**20:.2f}", f"{layer.param_count:,}"]
        for layer in profile.layers
    ]
    title = (f"{profile.name} on {profile.device.type} ({profile.device.name}), {profile.dtype}, "
             f"micro-batch {profile.micro_batch_size}")
    columns = ["layer", "kind", "fwd ms", "bwd ms", "recompute ms", "adam step ms", "act MiB", "params"]
    console.print(table(title, columns, rows, right_from=2))
    total_act = sum(layer.act_bytes for layer in profile.layers)
    steps = {name: sum(layer.step_ms.get(name, 0.0) for layer in profile.layers) for name in OPTIMIZERS}
    info(f"activations kept per microbatch without checkpointing: {format_bytes(total_act)}; "
         f"loss {profile.loss_ms:.3f} ms; optimizer step, whole model: "
         + ", ".join(f"{name} {ms:.1f} ms" for name, ms in steps.items()))
    if profile.device.thread_ms:
        info("whole model forward + backward: " + ", ".join(
            f"{ms:.1f} ms at {count} thread{'s' if count > 1 else ''}" for count, ms in profile.device.thread_ms.items())
             + " (a launch with fewer threads per rank scales the layer times by these)")
    shared = profile.device.shared_ms or {}
    if len(shared) > 1:
        copies = max(shared)
        info(f"at 1 thread beside {copies - 1} cop{'ies' if copies > 2 else 'y'} on the other cores: "
             f"{shared[copies]:.1f} ms against {shared[1]:.1f} ms alone (medians): x{shared[copies] / shared[1]:.3g} "
             + ("for ranks that compute at once" if shared[copies] >= shared[1] else
                "(under 1, the machine's load changed between the two timings: ranks that compute at once are "
                "charged x1)"))
    profile_options.options_report(profile, "each timed with half the --repeats")
    noisy = noisy_timings(profile)
    if noisy:
        warn(f"timings are noisy ({noisy}); the machine may be busy: stop other work, "
             "or try --threads 1 or more --repeats, and profile again")
    info(f"wrote {out}")

