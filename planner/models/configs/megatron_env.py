"""The environment a Megatron-LM launch sets: a functional test's model_config.yaml's ENV_VARS (over its
launcher's exports), a Megatron-Bridge run's PERF_ENV_VARS, and a launch script's `export NAME=value` lines,
each variable said as modelled, not modelled, of no effect or unknown, and the JobSettings the modelled ones set."""

from __future__ import annotations

# A variable's value whose meaning its ENV_VARS sentence (written for another value) does not say
ENV_VALUES = {("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1"): ("modelled", "1, Transformer Engine's default (os.getenv(..., "
              "'1'); framework-facts §65): its non-deterministic attention kernels, as the profile times them")}


# The functional tests' model_config.yaml beside MODEL_ARGS: its ENV_VARS, each what it does to the
# prediction (Megatron-LM 6e091e1b tests/functional_tests/test_cases/gpt/gpt3_7b_*_memory_speed), and the
# test harness's own keys (TEST_TYPE, METRICS, LAUNCHER, ...), which change no memory or time. Each: (status, the
# value or values the prediction reads as they are, what it does); another value is said as not modelled.
ENV_VARS = {
    "CUBLAS_WORKSPACE_CONFIG": ("modelled", ":4096:8", "torch's cuBLAS workspaces, 8 x 4 MiB each, held after the step "
                                "(runtimes: megatron's cublas_workspace_bytes)"),
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": ("not modelled", None, "0: Transformer Engine's deterministic attention "
                                         "backward (as --deterministic-mode says): charged at cuDNN's published rate on "
                                         "GB200, and on A100 as FlashAttention-2's split grid runs (in waves); on "
                                         "H100 and B200 none is published, timed as the non-deterministic kernel"),
    "CUDA_DEVICE_MAX_CONNECTIONS": ("not modelled", None, "1: one hardware queue, kernels started in the order "
                                    "launched (megatron/core/tensor_parallel/layers.py 684-692, 6e091e1b), so an "
                                    "asynchronous collective starts before the GEMM launched after it: the cost model "
                                    "already charges every TP collective and pipeline send on the critical path and "
                                    "hides only the data-parallel reduction, as this ordering lets it"),
    "NCCL_ALGO": ("modelled", "Ring", "collectives charged as rings (planner/cost/comm.py); with the launcher's "
                  "NCCL_PROTO=simple the step's scalar all-reduces at Ring/Simple's latency (planner/cost/stepcomm.py)"),
    "NCCL_PROTO": ("modelled", "simple", "the step's scalar all-reduces at Ring/Simple's latency under NCCL_ALGO=Ring "
                   "(planner/cost/stepcomm.py)"),
    # 0 scored as nccl_nvls_off, 1 and 2 (NCCL's default: on where the GPUs have multicast) as NVLS where it runs
    "NCCL_NVLS_ENABLE": ("modelled", ("0", "1", "2"), "0: no NVLink SHARP (the setting nccl_nvls_off), neither its "
                         "buffers (planner/cost/nccl_buffers.py) nor NVLS / NVLS Tree in NCCL's tuner "
                         "(planner/cost/nccltuner.py); 1 or 2: both where the GPUs and the group run NVLS"),
    "NVTE_FWD_LAYERNORM_SM_MARGIN": ("not modelled", None, "SMs the LayerNorm kernels leave to communication: time "
                                     "only, not charged"),
    "NVTE_BWD_LAYERNORM_SM_MARGIN": ("not modelled", None, "as NVTE_FWD_LAYERNORM_SM_MARGIN"),
    # framework-facts §159
    "NCCL_DEBUG": ("no effect", None, "NCCL's log level"),
    "PYTHONWARNINGS": ("no effect", None, "Python's warning filter"),
    "NON_DETERMINSTIC_RESULTS": ("no effect", None, "the functional test harness's comparison of results"),
    "TORCH_NCCL_AVOID_RECORD_STREAMS": ("not modelled", None, "1: ProcessGroupNCCL keeps a collective's tensors until "
                                        "wait() instead of recordStream, so the allocator may reuse them earlier: "
                                        "the reserved peak, not charged"),
    "NVTE_CPU_OFFLOAD_V1": ("not modelled", None, "TE's first activation-offloading implementation, used by "
                            "--fine-grained-activation-offloading (not modelled)"),
    "NVTE_CUTEDSL_FUSED_GROUPED_MLP": ("not modelled", None, "TE's CuTe DSL fused grouped MLP under the op fuser: "
                                       "another kernel, timed as TE's grouped GEMMs"),
    "NVTE_FUSED_ATTN": ("modelled", "1", "TE's cuDNN fused attention allowed (TE's default), as the attention is timed "
                        "and kept; 0 turns it off: FlashAttention or the unfused softmax instead"),
}


# A launcher's rendezvous and device variables: which rank a process is, where its group meets, which GPUs it sees.
# None moves a rank's memory or time: the job's sizes are its flags and --gpus. torch 2.13.0's env:// rendezvous reads
# RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torch/distributed/rendezvous.py 269-277), and torchrun sets those with
# GROUP_RANK, LOCAL_WORLD_SIZE and LOCAL_RANK in every worker's environment over the parent's (elastic/agent/server/
# local_elastic_agent.py 416-425, 487, 512; subprocess_handler.py 49-50: os.environ, then the agent's); CUDA_VISIBLE_
# DEVICES masks the devices (torch/cuda/__init__.py 860-862), each still the GPU named; NODE_RANK is a script's shell
# variable for torchrun's --node_rank (Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh 12, 157006d6), which
# torch reads as PET_NODE_RANK (torch/distributed/run.py 620-627, argparse_util.py 13-15). docs/framework-facts.md §447.
_LAUNCHER = "a launcher's variable: which rank, where its group meets, which GPUs it sees; no memory or time moves"
LAUNCHER_VARS = {name: ("no effect", None, f"{_LAUNCHER} ({source})") for name, source in (
    ("MASTER_ADDR", "torch's env:// rendezvous; torchrun sets it per worker"),
    ("MASTER_PORT", "torch's env:// rendezvous; torchrun sets it per worker"),
    ("WORLD_SIZE", "torch's env:// rendezvous; torchrun sets it per worker: the job's size is its flags and --gpus"),
    ("RANK", "torch's env:// rendezvous; torchrun sets it per worker"),
    ("LOCAL_RANK", "torchrun sets it per worker"), ("LOCAL_WORLD_SIZE", "torchrun sets it per worker"),
    ("GROUP_RANK", "torchrun sets it per worker"),
    ("NODE_RANK", "the script's value for torchrun's --node_rank"),
    ("CUDA_VISIBLE_DEVICES", "the CUDA runtime's device mask: each rank's GPU is still the one named"))}
ENV_VARS.update(LAUNCHER_VARS)


# What Megatron-LM's functional tests' launcher exports before a test's ENV_VARS (which override it):
# tests/functional_tests/shell_test_utils/_run_training.sh 58-59 at 93ebf8d7, NCCL_PROTO=simple and NCCL_ALGO=Ring.
LAUNCHER_NCCL = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "simple"}


def launch_forces_ring_simple(data: object) -> bool:
    """Whether a model_config.yaml runs under NCCL_ALGO=Ring and NCCL_PROTO=simple: a functional test's (one with
    ENV_VARS beside MODEL_ARGS, which _run_training.sh reads) under its launcher's exports as its ENV_VARS leave
    them; a file without ENV_VARS (Megatron-Bridge's runs as configs/megatron-bridge writes them) names no launch."""
    if not isinstance(data, dict) or not isinstance(data.get("MODEL_ARGS"), dict):
        return False
    env = data.get("ENV_VARS")
    if not isinstance(env, dict):
        return False
    said = {name: str(env.get(name, value)).lower() for name, value in LAUNCHER_NCCL.items()}
    return said == {"NCCL_ALGO": "ring", "NCCL_PROTO": "simple"}


# The launch's NCCL_NVLS_ENABLE: the functional tests' _run_training.sh exports 0 unless the test's ENV_VARS say
# otherwise (docs/framework-facts.md §45); Megatron-Bridge's Slurm executor exports PERF_ENV_VARS to every performance
# run, NCCL_NVLS_ENABLE 0 "to save memory" (scripts/performance/utils/executors.py 38-47 at 00b7660b), which the
# configs/megatron-bridge files copy under that key
LAUNCHER_NVLS = "0"
PERF_ENV_VARS = "PERF_ENV_VARS"


def launch_disables_nvls(data: object) -> bool:
    """Whether a model_config.yaml's launch sets NCCL_NVLS_ENABLE=0: a functional test's (ENV_VARS beside MODEL_ARGS)
    unless its ENV_VARS set it otherwise, or a Megatron-Bridge run whose PERF_ENV_VARS set it to 0."""
    if not isinstance(data, dict) or not isinstance(data.get("MODEL_ARGS"), dict):
        return False
    env, perf = data.get("ENV_VARS"), data.get(PERF_ENV_VARS)
    if isinstance(env, dict):
        return str(env.get("NCCL_NVLS_ENABLE", LAUNCHER_NVLS)) == "0"
    return isinstance(perf, dict) and str(perf.get("NCCL_NVLS_ENABLE")) == "0"


# torch's caching allocator reads PYTORCH_CUDA_ALLOC_CONF as comma-separated option:value pairs
# (c10/cuda/CUDAAllocatorConfig.cpp parseArgs); the cost model's replay runs expandable_segments either way
# (planner/cost/allocator.py), the others (max_split_size_mb, garbage_collection_threshold, ...) it does not read
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def alloc_conf(value: object) -> tuple[bool | None, list[str]]:
    """(expandable_segments as the setting says it, None where it does not; the other options given)."""
    expandable, others = None, []
    for part in str(value).split(","):
        option, _, setting = part.strip().partition(":")
        if option == "expandable_segments" and setting.strip() in ("True", "False"):
            expandable = setting.strip() == "True"
        elif part.strip():
            others.append(part.strip())
    return expandable, others


def launch_expandable_segments(data: object) -> bool | None:
    """Whether a model_config.yaml's ENV_VARS set PYTORCH_CUDA_ALLOC_CONF's expandable_segments (None: not said)."""
    env = data.get("ENV_VARS") if isinstance(data, dict) and isinstance(data.get("MODEL_ARGS"), dict) else None
    return alloc_conf(env[ALLOC_CONF])[0] if isinstance(env, dict) and ALLOC_CONF in env else None


# A Megatron-Bridge 25.11 performance run (a file with its executor's PERF_ENV_VARS, as configs/megatron-bridge
# writes them) runs megatron-core 92c8482e with TransformerEngine v2.9: the Megatron record's version for it
# (planner/cost/runtime_megatron.py megatron_bridge; runtimes.VERSIONS refuses a version not read)
BRIDGE_RUNTIME_VERSION = "92c8482e"
BRIDGE_VERSION_NOTE = ("runtime version: megatron-core 92c8482e with TransformerEngine v2.9 (Megatron-Bridge 25.11), "
                       "since the file holds Bridge's PERF_ENV_VARS (planner/cost/runtime_megatron.py megatron_bridge)")


def launch_settings(data: object) -> dict:
    """The JobSettings a model_config.yaml's launch sets (ENV_VARS over the functional tests' launcher; a Bridge
    run's PERF_ENV_VARS: its runtime version too)."""
    bridge = isinstance(data, dict) and isinstance(data.get("MODEL_ARGS"), dict) and isinstance(
        data.get(PERF_ENV_VARS), dict)
    return {"nccl_ring_simple": launch_forces_ring_simple(data), "nccl_nvls_off": launch_disables_nvls(data),
            "expandable_segments": launch_expandable_segments(data),
            **({"runtime_version": BRIDGE_RUNTIME_VERSION} if bridge else {})}


def _alloc_conf_said(setting: object) -> tuple[str, str]:
    expandable, others = alloc_conf(setting)
    if others:
        return "not modelled", (f"the caching allocator's {', '.join(others)}: not read (the replay runs torch's "
                                "defaults for them)" + ("; expandable_segments read" if expandable is not None else ""))
    segments = "expandable segments" if expandable else "the default segments"
    return "modelled", (f"expandable_segments {expandable}: the allocator replay (planner/cost/allocator.py) runs "
                        f"{segments}, as `ckplan evaluate --expandable-segments` says it of a plan")


def env_said(name: str, setting: object) -> tuple[str, str]:
    """(status, what) of one environment variable at its value, as ENV_VARS says (a value other than the
    modelled one: not modelled; an unknown variable: unknown)."""
    status, modelled_value, what = ENV_VARS.get(name, ("unknown", None, "an environment variable this reader does "
                                                       "not know"))
    modelled_values = (modelled_value,) if isinstance(modelled_value, str) else modelled_value or ()
    if modelled_values and str(setting) not in modelled_values:
        status, what = "not modelled", f"{what}; the prediction assumes {' or '.join(modelled_values)}"
    if name == ALLOC_CONF:
        status, what = _alloc_conf_said(setting)
    return ENV_VALUES.get((name, str(setting)), (status, what))


def yaml_extras(data: object) -> list[tuple[str, str, str, str]]:
    """(name, value, status, what) for what a model_config.yaml holds beside MODEL_ARGS: each of its
    ENV_VARS as env_said says, and the harness's keys as no effect."""
    if not isinstance(data, dict) or not isinstance(data.get("MODEL_ARGS"), dict):
        return []
    found = []
    for key, value in data.items():
        if key == "MODEL_ARGS":
            continue
        if key not in ("ENV_VARS", PERF_ENV_VARS) or not isinstance(value, dict):
            found.append((str(key), str(value), "no effect", "the functional test harness's setting"))
            continue
        for name, setting in value.items():
            found.append((f"{key}.{name}", str(setting), *env_said(str(name), setting)))
    return found


def script_env(exports: dict[str, str]) -> tuple[list[tuple[str, str, str, str]], dict]:
    """What a launch script's `export NAME=value` lines set before its trainer line: each variable said as
    env_said says, and the JobSettings they set. A script has no functional-test launcher under it, so no
    launcher default applies: NCCL runs Ring/Simple only where the script exports both, NVLS is off only where
    it exports NCCL_NVLS_ENABLE=0, and the segments are expandable only as its PYTORCH_CUDA_ALLOC_CONF says."""
    said = [(f"export {name}", value, *env_said(name, value)) for name, value in exports.items()]
    ring_simple = (exports.get("NCCL_ALGO", "").lower(), exports.get("NCCL_PROTO", "").lower()) == ("ring", "simple")
    settings = {"nccl_ring_simple": ring_simple, "nccl_nvls_off": exports.get("NCCL_NVLS_ENABLE") == "0",
                "expandable_segments": alloc_conf(exports[ALLOC_CONF])[0] if ALLOC_CONF in exports else None}
    return said, settings
