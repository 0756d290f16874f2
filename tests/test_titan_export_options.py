"""The torchtitan export's policy checkpoints core-attn, attn, mlp, mlp-act and norm parts (and save-matmuls); a plan
option with a part it cannot write (latent attention's mla-up, Megatron's norm-out) would make the written
file raise when torchtitan builds it. Such layers recompute whole instead, said and re-scored."""

import re

from export_plans import make_chunked_plan
from fixtures.cli import run_ok

from planner import io
from planner.emit import torchtitan


def test_options_the_policy_cannot_write_recompute_whole_layers(tmp_path):
    run_ok("profile", "--arch", "deepseek-v2-lite", "--seq-len", "1024", "--micro-batch-size", "1", "--gpu", "h100",
           "--out", tmp_path / "p.json")
    profile = io.load_profile(tmp_path / "p.json")
    blocks = [layer.name for layer in profile.layers if layer.kind in ("decoder_block", "moe_block")]
    options = {name: "mla-up,mlp,norm-out" if i % 2 else "core-attn,mlp" for i, name in enumerate(blocks)}
    plan = make_chunked_plan(profile, tmp_path / "p.json", [len(profile.layers)], options, schedule="1F1B", chunks=1,
                             microbatches=4, cap_mib=10**6, runtime="torchtitan")
    io.save_plan(plan, tmp_path / "plan.yaml")
    result = torchtitan.export(plan, profile, plan_file=str(tmp_path / "plan.yaml"), version="0.3.0",
                               base="torchtitan.models.deepseek_v3.config_registry:deepseek_v3_16b")
    odd = [name for name, option in options.items() if option != "core-attn,mlp"]
    assert (f"the {len(odd)} layers the plan recomputes with mla-up,mlp,norm-out recompute whole layers"
            in " ".join(result.rounded.changes))
    assert "'core-attn,mlp'" in result.text and not re.search(r"mla-up|norm-out", _code(result.text))
    stage = result.rounded.stages[0]
    assert {stage.option(name) for name in odd} == {"full"}
    assert result.scored.rounded.stages[0].peak_bytes <= result.scored.exact.stages[0].peak_bytes  # whole layers free more


def _code(text: str) -> str:
    """The file without its comment lines (the header says what was rounded, naming the options)."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
