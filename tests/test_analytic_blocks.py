"""An analytic profile builds each distinct decoder block once and renames it for the others
(planner/profiler/analytic_blocks.py): the profile must be the one built block by block, field by field."""

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from planner.models import archconfig, archs
from planner.profiler import analytic, analytic_blocks
from planner.profiler.analytic import Shape
from planner.schema import FileRef

REF = FileRef(file="model.py", sha256="0" * 64)
H100 = archs.gpu("h100")
HF = Path(__file__).resolve().parent.parent / "configs" / "hf"


def _hf(name):
    return archconfig.from_hf_config(json.loads((HF / f"{name}.json").read_text()), where=name, name=name)


CASES = {  # name: (arch, shape, analytic_profile's options)
    "llama3-8b, Float8 and TE records": (lambda: archs.arch("llama3-8b"), Shape(seq_len=2048, micro_batch_size=1), {}),
    "llama3-8b, TP 2 + SP, compiled": (lambda: archs.arch("llama3-8b"), Shape(seq_len=2048, micro_batch_size=1, tp=2,
                                                                               sp=True), {"compiled": True}),
    "llama3-8b, CP 2, --mfu": (lambda: archs.arch("llama3-8b"), Shape(seq_len=2048, micro_batch_size=2, cp=2), {"mfu": 0.4}),
    "qwen3-30b-a3b, EP 8": (lambda: archs.arch("qwen3-30b-a3b"), Shape(seq_len=2048, micro_batch_size=1, ep=8), {}),
    "gemma-3-12b (sliding and global), compiled": (lambda: _hf("gemma-3-12b"), Shape(seq_len=2048, micro_batch_size=1),
                                                   {"compiled": True}),
    "gpt-oss-20b (MoE, sliding and full)": (lambda: _hf("gpt-oss-20b"), Shape(seq_len=2048, micro_batch_size=1, ep=4), {}),
    "deepseek-v3 (dense then MoE, MLA), MTP 1": (lambda: archs.arch("deepseek-v3"),
                                                 Shape(seq_len=2048, micro_batch_size=1, tp=8, sp=True, ep=64, mtp=1), {}),
}


def _each_block(build, arch, shape, gpu, mfu, *, compiled):
    """The builder before analytic_blocks: block_layer at every index."""
    return [build(i, arch.layer(i), shape, gpu, mfu, compiled=compiled).model_copy(update={"variant": arch.layer_variant(i)})
            for i in range(arch.num_layers)]


@pytest.mark.parametrize("case", list(CASES))
def test_the_profile_is_the_one_built_block_by_block(case, monkeypatch):
    make, shape, options = CASES[case]
    arch = make()
    new = analytic.analytic_profile(arch, shape, gpu=H100, model=REF, **options)
    monkeypatch.setattr(analytic_blocks, "blocks", _each_block)
    old = analytic.analytic_profile(arch, shape, gpu=H100, model=REF, **options)
    assert [layer.name for layer in new.layers[1:arch.num_layers + 1]] == [f"layers.{i}" for i in range(arch.num_layers)]
    for before, after in zip(old.layers, new.layers, strict=True):
        assert after.model_dump_json() == before.model_dump_json(), before.name
    assert new.model_dump_json(exclude={"created_at"}) == old.model_dump_json(exclude={"created_at"})


@pytest.mark.parametrize("name, distinct", [("qwen3-30b-a3b", 1), ("deepseek-v3", 2), ("llama3-8b", 1)])
def test_each_distinct_block_is_built_once(name, distinct):
    arch, built = archs.arch(name), []

    def build(index, *args, **kwargs):
        built.append(index)
        return analytic.block_layer(index, *args, **kwargs)

    layers = analytic_blocks.blocks(build, arch, Shape(seq_len=1024, micro_batch_size=1), H100, 0.5, compiled=False)
    assert len(layers) == arch.num_layers and len(built) == distinct
    # DeepSeek-V3: layers 0-2 dense (first_k_dense_replace 3), the rest MoE, each kind built at its first index
    assert built == ([0, 3] if name == "deepseek-v3" else [0])
    assert [layer.kind for layer in layers] == ["moe_block" if arch.is_moe_layer(i) else "decoder_block"
                                                for i in range(arch.num_layers)]


def test_gemma3_builds_one_block_per_attention_kind():
    arch, built = _hf("gemma-3-12b"), []

    def build(index, *args, **kwargs):
        built.append(index)
        return analytic.block_layer(index, *args, **kwargs)

    layers = analytic_blocks.blocks(build, arch, Shape(seq_len=1024, micro_batch_size=1), H100, 0.5, compiled=False)
    assert len(built) == len({arch.layer_variant(i) for i in range(arch.num_layers)}) == 2
    assert [layer.variant for layer in layers] == [arch.layer_variant(i) for i in range(arch.num_layers)]


class _Part(BaseModel):
    name: str
    sizes: list[int]


class _Record(BaseModel):
    name: str
    parts: list[_Part]
    by_module: dict[str, int]


def test_renamed_reaches_names_inside_and_only_the_index_given():
    record = _Record(name="layers.1", parts=[_Part(name="layers.1.attention.wq", sizes=[1, 2]),
                                             _Part(name="layers.10.attention.wq", sizes=[3]),
                                             _Part(name="xlayers.1", sizes=[4])],
                     by_module={"layers.1.mlp": 5, "output": 6})
    where = analytic_blocks.naming(record, "layers.1")
    out = analytic_blocks.renamed(record, where, "layers.1", "layers.7")
    assert out.name == "layers.7"
    assert [part.name for part in out.parts] == ["layers.7.attention.wq", "layers.10.attention.wq", "xlayers.1"]
    assert out.by_module == {"layers.7.mlp": 5, "output": 6}
    assert out.parts[1] is record.parts[1]  # what names nothing is shared, not copied
    assert record.name == "layers.1" and record.parts[0].name == "layers.1.attention.wq"  # the built one as it was
    assert analytic_blocks.renamed(record, where, "layers.1", "layers.1") is record
