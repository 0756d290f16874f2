"""Megatron-LM's --tp-comm-overlap and --tp-comm-overlap-cfg: the userbuffers config TE runs the tensor-parallel
block's GEMMs with (framework-facts §137, §154; planner/cost/ub_sms.py charges the SMs).

Megatron-LM d98e8a64 (megatron/training/initialize.py 211-215) opens --tp-comm-overlap-cfg, reads it with
`yaml.safe_load` (nothing given: `{}`) and passes it as `ub_cfgs` to TE's `initialize_ub`. TransformerEngine v2.9
(transformer_engine/pytorch/module/base.py 289-348, 470-480) makes one communicator per GEMM it knows, each from
`get_default_config(name)` (by the GEMM's default method) updated with the file's entry for that name, and passes
the merged keys to `add_ub(name, mode, **cfg)`: a name TE does not know is never looked at; a key `add_ub` does not
take raises TypeError; a pipeline on an all-gather raises ValueError; proj_wgrad / fc2_wgrad assert external.

The file is found where the script writes it (a here-document), at its absolute path, beside the config, or (as
Megatron-LM opens it) from the current directory; a value that names no file and has neither a suffix nor a
directory is Megatron-Bridge's config name (cost/ub_sms.py CONFIGS, checked by the command)."""

from __future__ import annotations

from pathlib import Path

from planner.errors import UserError

_TE = "TransformerEngine v2.9 transformer_engine/pytorch/module/base.py"
# initialize_ub's `methods` (base.py 302-312): each GEMM's default method
DEFAULT_METHOD = {
    "qkv_fprop": "ring_exchange", "fc1_fprop": "ring_exchange", "proj_dgrad": "ring_exchange",
    "fc2_dgrad": "ring_exchange", "proj_fprop": "pipeline", "fc2_fprop": "pipeline", "qkv_dgrad": "bulk",
    "qkv_wgrad": "bulk", "fc1_dgrad": "bulk", "fc1_wgrad": "bulk", "proj_wgrad": "external", "fc2_wgrad": "external",
}
ALL_GATHERS = ("qkv_fprop", "qkv_dgrad", "proj_dgrad", "proj_wgrad", "fc1_fprop", "fc1_dgrad", "fc2_dgrad",
               "fc2_wgrad")  # layers_all_gather_overlap (base.py 289-298): a pipeline on one raises ValueError
REDUCE_SCATTERS = ("proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_wgrad")  # layers_reduce_scatter_overlap
METHODS = ("ring_exchange", "pipeline", "bulk", "external")
# add_ub's keyword arguments (base.py 350-365) and the type each takes (a bool as pybind takes it: true / false, 1 / 0)
KEYS = {"method": str, "is_reduce_scatter": bool, "num_sm": int, "cga_size": int, "set_sm_margin": bool,
        "num_splits": int, "aggregate": bool, "atomic_gemm": bool, "use_ce": bool, "fp8_buf": bool,
        "comm_priority": int, "gemm_priority": int, "pipeline_rs_overlap_first_gemm": bool}
MAX_SMS = 32  # NVTE_MAX_SMS (TE v2.9 comm_gemm_overlap/userbuffers/userbuffers.h 31): _check_grid
CHARGED = ("method", "num_sm", "set_sm_margin", "use_ce", "aggregate")  # what planner/cost/ub_sms.py, ub_ring.py read
# what the other keys change, which ckplan does not charge
NOT_CHARGED = {
    "is_reduce_scatter": "which collective the communicator runs (TE sets it by the GEMM)",
    "cga_size": "the communication kernel's thread-block clusters",
    "num_splits": "the chunks a pipeline or bulk overlap splits the GEMM into (the chunks' own cost is not charged)",
    "atomic_gemm": "cuBLAS's atomic GEMM, which signals each chunk as it is written",
    "fp8_buf": "the buffer's dtype (TE sets it: FP8 on the all-gathers, on a pipeline where given)",
    "comm_priority": "the communication stream's priority",
    "gemm_priority": "the GEMM streams' priority",
    "pipeline_rs_overlap_first_gemm": "a pipeline's first chunk overlapped too",
}


def te_default(name: str, tp: int | None = None) -> dict:
    """get_default_config(name) (base.py 327-348), but the stream priorities (the device's range): by the GEMM's
    default method, whatever method the user's entry gives."""
    method = DEFAULT_METHOD[name]
    ring = method == "ring_exchange"
    return {"method": method, "is_reduce_scatter": name in REDUCE_SCATTERS, "num_sm": 1 if ring else 16,
            "cga_size": 1 if ring else 2, "set_sm_margin": not ring, "num_splits": tp if ring else 4,
            "aggregate": False, "atomic_gemm": False, "use_ce": True, "fp8_buf": name in ALL_GATHERS,
            "pipeline_rs_overlap_first_gemm": False}


def read_tp_overlap(flags, job, *, where: str, files: dict[str, str] | None) -> None:
    """--tp-comm-overlap (the runtime's tp_overlap) and --tp-comm-overlap-cfg: a file read here, per GEMM, into
    JobSettings.ub_gemms; a Bridge config name left in JobSettings.ub_cfg."""
    overlap = flags.take("--tp-comm-overlap", "TE's TP communication overlapped with the GEMMs (the runtime's "
                         "tp_overlap, --tp-overlap tp-comm-overlap)", bool, False)
    if overlap and job.tp == 1:  # arguments.py 1433-1442 at d98e8a64ddf3: SP turned off at TP 1, then asserted
        raise UserError("--tp-comm-overlap at tensor-parallel size 1: Megatron-LM turns sequence parallelism off at "
                        "TP 1 and then refuses the overlap without it; drop --tp-comm-overlap or give TP 2 or more")
    if overlap and not job.sp:  # arguments.py 1441-1442 at d98e8a64ddf3 asserts it
        raise UserError("--tp-comm-overlap needs --sequence-parallel; Megatron-LM refuses it without")
    if overlap:
        job.modelled.tp_overlap = "tp-comm-overlap"
    given = flags.given.get("--tp-comm-overlap-cfg")
    if given is not None and not overlap:  # initialize.py 164-166: the communicators only under --tp-comm-overlap
        flags.take("--tp-comm-overlap-cfg", "TE's userbuffers config", str)
        flags.sink[-1] = (*flags.sink[-1][:2], "no effect", "Megatron-LM opens it only under --tp-comm-overlap "
                          "(initialize.py 164-166 at d98e8a64), not given: never read")
        return
    found = None if given is None or len(given) != 1 else find(given[0], where=where, files=files or {})
    if found is None:
        job.modelled.ub_cfg = flags.take("--tp-comm-overlap-cfg", "TE's userbuffers config by name (Megatron-Bridge's "
                                         "TransformerLayerTPOverlapCfg; planner/cost/ub_sms.py)", str)
        return
    source, text = found
    gemms, said = parse(load(text, source), source, tp=job.tp)
    flags.take("--tp-comm-overlap-cfg", f"TE's userbuffers config read from {source}: the SMs each GEMM's overlap "
               "takes (method, num_sm, set_sm_margin, use_ce; planner/cost/ub_sms.py)", str)
    job.modelled.ub_cfg, job.modelled.ub_gemms = given[0], gemms
    flags.sink.extend(said)


def find(value: str, *, where: str, files: dict[str, str]) -> tuple[str, str] | None:
    """(where it was found, its text): the script's here-document of that path, the path itself where absolute,
    beside the config, or from the current directory (Megatron-LM's open); None for a Bridge config's name.
    A path that is none of these: one sentence."""
    if value in files:
        return f"{value} (the script's here-document)", files[value]
    path = Path(value).expanduser()
    tried = [path] if path.is_absolute() else [Path(where).parent / path, Path.cwd() / path]
    for candidate in tried:
        if candidate.is_file():
            try:
                return str(candidate), candidate.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise UserError(f"--tp-comm-overlap-cfg {value}: {candidate} cannot be read as text "
                                f"({exc.__class__.__name__}); give the YAML file Megatron-LM reads") from None
    if path.suffix == "" and len(path.parts) == 1:
        return None
    raise UserError(f"--tp-comm-overlap-cfg {value}: no such file beside {where} or in the current directory "
                    f"({', '.join(map(str, tried))}); give the YAML file Megatron-LM passes to TE's initialize_ub")


def load(text: str, source: str) -> dict:
    """The file as Megatron-LM reads it (yaml.safe_load: nothing is run); empty: TE's defaults."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"--tp-comm-overlap-cfg {source} is not valid YAML{at}; give a mapping of TE's GEMM names "
                        "to their userbuffers settings") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"--tp-comm-overlap-cfg {source} is a {type(data).__name__}, not a mapping of TE's GEMM "
                        "names (qkv_fprop, proj_fprop, ...) to their userbuffers settings; give one mapping")
    return data


def parse(data: dict, source: str, *, tp: int | None = None) -> tuple[dict[str, dict], list[tuple]]:
    """Per GEMM TE knows, its merged config's charged keys (CHARGED); and each entry, key or name ckplan does not
    charge as (name, value, status, what) for the settings table."""
    said: list[tuple] = []
    for name in data:
        if name not in DEFAULT_METHOD:
            said.append((f"--tp-comm-overlap-cfg {name}", data[name], "no effect",
                         f"not a GEMM TE's initialize_ub makes a communicator for ({_TE} 302-312: "
                         f"{', '.join(DEFAULT_METHOD)}): never read"))
    gemms = {}
    for name in DEFAULT_METHOD:
        cfg = te_default(name, tp)
        if name in data:
            entry = _entry(name, data[name], source)
            _check_method(name, entry.get("method", cfg["method"]), source)
            said += _not_charged(name, entry, cfg)
            cfg.update(entry)
            _check_grid(name, cfg, source)
        if DEFAULT_METHOD[name] != "external":
            gemms[name] = {key: cfg[key] for key in CHARGED}
        elif name in data:
            said.append((f"--tp-comm-overlap-cfg {name}", data[name], "no effect", "the row-parallel weight "
                         "gradient's external overlap, which TE runs only under MXFP8 (linear.py 777-805, TE v2.9), a "
                         "recipe ckplan does not read"))
    return gemms, said


def _entry(name: str, entry, source: str) -> dict:
    if not isinstance(entry, dict):
        raise UserError(f"--tp-comm-overlap-cfg {source}: {name} is {entry!r}, not a mapping of settings "
                        f"(method: ..., num_sm: ...); TE updates the GEMM's defaults with a mapping")
    for key, value in entry.items():
        if key not in KEYS:
            raise UserError(f"--tp-comm-overlap-cfg {source}: {name}.{key} is not a setting TE's add_ub takes "
                            f"({', '.join(KEYS)}); TE v2.9 raises TypeError on it")
        kind = KEYS[key]
        ok = (isinstance(value, str) if kind is str else value in (0, 1) and not isinstance(value, float)
              if kind is bool else isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            what = {str: "a method name", bool: "true or false", int: "a whole number"}[kind]
            raise UserError(f"--tp-comm-overlap-cfg {source}: {name}.{key} is {value!r}, not {what}; give {what}")
        if key in ("num_sm", "cga_size") and value < 1:
            raise UserError(f"--tp-comm-overlap-cfg {source}: {name}.{key} is {value}; TE launches at least one "
                            "SM's worth: give 1 or more")
    return {key: bool(value) if KEYS[key] is bool else value for key, value in entry.items()}


def _check_grid(name: str, cfg: dict, source: str) -> None:
    """A pipeline's or a bulk's userbuffers kernel launches num_sm thread blocks (comm_gemm_overlap.cpp
    `_ub_comm->sms = _num_comm_sm`; userbuffers.cu SETUP_LAUNCH_CONFIG(sms, ...)), and each kernel counts its blocks'
    arrival against NVTE_MAX_SMS = 32 (userbuffers.h 31; userbuffers.cu: block 0 adds NVTE_MAX_SMS - gridDim.x + 1,
    the rest 1, and the block that brings the sum to NVTE_MAX_SMS x the op's id is taken as the last): past 32 blocks
    the sum can reach that while blocks are still copying (where block 0 is not first). TE v2.9 checks nothing
    (base.py takes any int): refused."""
    if cfg["method"] in ("pipeline", "bulk") and cfg["num_sm"] > MAX_SMS:
        raise UserError(f"--tp-comm-overlap-cfg {source}: {name}.num_sm is {cfg['num_sm']}, and TE's {cfg['method']} "
                        f"kernel counts its thread blocks' completion against NVTE_MAX_SMS = {MAX_SMS} (TE v2.9 "
                        f"userbuffers.h 31): give {MAX_SMS} or fewer")
    if cfg["num_sm"] > 1 << 16:  # the schema's bound (UbGemm.num_sm), far past any GPU's SMs
        raise UserError(f"--tp-comm-overlap-cfg {source}: {name}.num_sm is {cfg['num_sm']}, past the 65536 SMs "
                        "ckplan reads (no GPU has that many; where TE reads it, it launches or margins that many): "
                        "give the SMs the overlap should take")


def _check_method(name: str, method: str, source: str) -> None:
    """The methods TE takes at this GEMM, and those ckplan charges."""
    if method not in METHODS:
        raise UserError(f"--tp-comm-overlap-cfg {source}: {name}.method is {method!r}; TE's methods are "
                        f"{', '.join(METHODS)}")
    if method == "pipeline" and name in ALL_GATHERS:
        raise UserError(f"--tp-comm-overlap-cfg {source}: {name} is an all-gather, and TE's add_ub raises "
                        "ValueError on a pipeline there (base.py 380-383); give ring_exchange or bulk")
    if (method == "external") != (DEFAULT_METHOD[name] == "external"):
        raise UserError(f"--tp-comm-overlap-cfg {source}: {name}.method {method}: external is the overlap of "
                        "proj_wgrad and fc2_wgrad, and theirs only (base.py 302-312; 403-407 asserts it)")
    if name in ("qkv_dgrad", "fc1_dgrad") and method != "bulk":
        raise UserError(f"--tp-comm-overlap-cfg {source}: {name}.method {method} turns the bulk overlaps into the "
                        "input gradient's reduce-scatter overlap (base.py 455-468, Megatron-LM's "
                        "tp_comm_overlap_rs_dgrad), which ckplan does not charge; give bulk")


def _not_charged(name: str, entry: dict, default: dict) -> list[tuple]:
    """An entry's keys ckplan does not charge: at TE's default, no effect; else not modelled, with what it changes."""
    rows = []
    method = entry.get("method", default["method"])
    for key, value in entry.items():
        if key == "aggregate" and not (method == "ring_exchange" and name in ALL_GATHERS):
            rows.append((f"--tp-comm-overlap-cfg {name}.{key}", value, "no effect", "TE reads aggregate only in a "
                         "ring-exchange all-gather (comm_gemm_overlap.cpp 922, split_overlap_ag, TE v2.9)"))
            continue
        if key in CHARGED:
            continue
        pipeline = method == "pipeline"
        if value == default.get(key) or (key == "fp8_buf" and not (value and pipeline)):
            what = "TE's default" if value == default.get(key) else "TE sets it itself off a pipeline (base.py 475-477)"
            rows.append((f"--tp-comm-overlap-cfg {name}.{key}", value, "no effect", what))
        else:
            rows.append((f"--tp-comm-overlap-cfg {name}.{key}", value, "not modelled", NOT_CHARGED[key]))
    return rows
