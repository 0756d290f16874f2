"""The model-file contract: loading, finding pipeline layers, checking the chain."""

import pathlib

import pytest
import torch
from torch import nn

from planner.errors import UserError
from planner.models import modelfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ROOT / "configs" / "models"
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.mark.parametrize("name, first, last, count", [("gpt.py", "embed", "head", 10), ("mlp.py", "0", "7", 8)])
def test_bundled_models_follow_the_contract(name, first, last, count):
    loaded = modelfile.load_model_file(MODELS / name)
    layers = modelfile.pipeline_layers(loaded.build_model(), loaded.path)
    assert (layers[0][0], layers[-1][0], len(layers)) == (first, last, count)
    inputs, targets = loaded.example_batch(2)
    outputs = modelfile.check_chain(layers, inputs, loaded.path)
    assert len(outputs) == count
    loss = loaded.loss_fn(outputs[-1], targets)
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_default_loss_is_cross_entropy_for_class_ids_else_mse():
    logits = torch.randn(2, 3, 5)
    ids = torch.randint(0, 5, (2, 3))
    expected = nn.functional.cross_entropy(logits.reshape(-1, 5), ids.reshape(-1))
    assert torch.allclose(modelfile.default_loss_fn(logits, ids), expected)
    values = torch.randn(2, 3)
    assert torch.allclose(modelfile.default_loss_fn(values, values + 1), torch.tensor(1.0))


def test_file_without_loss_fn_uses_the_default():
    loss_fn = modelfile.load_model_file(FIXTURES / "tiny.py").loss_fn
    output, target = torch.randn(4, 8), torch.randn(4, 8)
    assert torch.equal(loss_fn(output, target), modelfile.default_loss_fn(output, target))


def test_a_loss_viewing_a_larger_buffer_is_copied_out_of_it():
    # torch's mse_loss on cpu returns its mean as a view of its elementwise buffer; the
    # pipeline schedule keeps every microbatch's loss to the end of the step
    buffer = torch.randn(1024, requires_grad=True)
    value = modelfile.compact_loss(lambda output, target: (output * 2)[0])(buffer, None)
    assert value.untyped_storage().nbytes() == 4 and value.item() == (buffer[0] * 2).item()
    value.backward()
    assert buffer.grad[0] == 2 and buffer.grad[1:].abs().sum() == 0
    fresh = torch.tensor(1.0)
    assert modelfile.compact_loss(lambda output, target: fresh)(None, None) is fresh


@pytest.mark.parametrize(
    "text, needle",
    [
        ("x = (\n", "not valid Python: line 1"),
        ("raise RuntimeError('no GPU here')\n", "failed to import: RuntimeError: no GPU here at line 1"),
        ("def example_batch(n):\n    pass\n", "defines no function build_model()"),
        ("build_model = 3\ndef example_batch(n):\n    pass\n", "defines no function build_model()"),
    ],
)
def test_bad_model_files_name_the_file_and_the_problem(tmp_path, text, needle):
    path = tmp_path / "model.py"
    path.write_text(text)
    with pytest.raises(UserError, match="model.py") as info:
        modelfile.load_model_file(path)
    assert needle in str(info.value)


def test_missing_and_non_python_files(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        modelfile.load_model_file(tmp_path / "absent.py")
    with pytest.raises(UserError, match=r"not a Python file \(\.py\)"):
        modelfile.load_model_file(FIXTURES / "not_a_model.txt")


def test_user_errors_show_the_users_lines():
    loaded = modelfile.load_model_file(FIXTURES / "build_raises.py")
    with pytest.raises(UserError) as info:
        loaded.build_model()
    message = str(info.value)
    assert "build_model() raised ValueError: width 8 must be a multiple of 3" in message
    assert "line 9: raise ValueError" in message  # the line in the user's file that raised


def test_example_batch_must_be_a_pair_of_tensors(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import torch\ndef build_model():\n    return torch.nn.Linear(2, 2)\n"
                    "def example_batch(n):\n    return torch.randn(n, 2)\n")
    with pytest.raises(UserError, match=r"example_batch\(3\) must return a pair of tensors"):
        modelfile.load_model_file(path).example_batch(3)


def test_build_model_must_return_a_module(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def build_model():\n    return [1]\ndef example_batch(n):\n    pass\n")
    with pytest.raises(UserError, match="returned list, expected a torch.nn.Module"):
        modelfile.load_model_file(path).build_model()


class Custom(nn.Module):
    def __init__(self, names=None):
        super().__init__()
        self.inner = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)})
        self.names = names

    def pipeline_layers(self):
        return [(name, self.get_submodule(target)) for name, target in self.names]


def test_pipeline_layers_from_a_method_use_fqns():
    model = Custom([("inner.a", "inner.a"), ("inner.b", "inner.b")])
    assert [name for name, _ in modelfile.pipeline_layers(model)] == ["inner.a", "inner.b"]


@pytest.mark.parametrize(
    "names, needle",
    [
        ([("a", "inner.a")], "'a' is not the FQN"),
        ([("inner.b", "inner.a")], "'inner.b' is not the FQN"),
        ([("inner.a", "inner.a"), ("inner.a", "inner.a")], "names repeat"),
        ([], "no pipeline layers"),
    ],
)
def test_pipeline_layers_errors(names, needle):
    with pytest.raises(UserError, match=needle):
        modelfile.pipeline_layers(Custom(names), "m.py")


def test_a_model_without_layers_is_refused():
    with pytest.raises(UserError, match="neither an nn.Sequential nor has a pipeline_layers"):
        modelfile.pipeline_layers(nn.Linear(2, 2), "m.py")
    with pytest.raises(UserError, match="no pipeline layers"):
        modelfile.pipeline_layers(nn.Sequential(), "m.py")


def test_check_chain_names_the_layer_that_breaks_it():
    broken = nn.Sequential(nn.Linear(4, 8), nn.Linear(16, 2))
    with pytest.raises(UserError, match=r"layer '1' failed on the output of layer '0' \(shape \(3, 8\)\)"):
        modelfile.check_chain(modelfile.pipeline_layers(broken), torch.randn(3, 4), "m.py")
    first = nn.Sequential(nn.Linear(5, 8))
    with pytest.raises(UserError, match=r"layer '0' failed on the output of example_batch\(\) \(shape \(3, 4\)\)"):
        modelfile.check_chain(modelfile.pipeline_layers(first), torch.randn(3, 4), "m.py")


def test_check_chain_refuses_non_tensor_outputs():
    class Pair(nn.Module):
        def forward(self, x):
            return x, x

    with pytest.raises(UserError, match="layer '0' returned tuple, expected one tensor"):
        modelfile.check_chain(modelfile.pipeline_layers(nn.Sequential(Pair())), torch.randn(2), "m.py")
