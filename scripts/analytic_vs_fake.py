"""The same architecture profiled two ways, side by side: `ckplan profile --arch-config CONFIG`
(the analytic formulas, planner/profiler/analytic*.py) against `ckplan profile --hf-config CONFIG
--fake` (transformers' own code for that config under FakeTensorMode, timed by the same roofline).

Per layer (the embedding, each decoder block, the head): forward and backward ms, kept, transient
and parameter bytes, and analytic / fake for each; then every recompute option both profiles offer
by the same name, its kept bytes and rerun ms. The config's depth is cut to --layers (default 2)
so the fake run is quick on a CPU; its widths stay as given (full-size hidden sizes are fine under
FakeTensorMode). A config either reader refuses is reported with the refusal's sentence.

    PYTHONPATH=$PWD python scripts/analytic_vs_fake.py CONFIG.json [--seq-len 256] [--micro-batch-size 1]
        [--gpu h100] [--layers 2] [--set KEY=VALUE ...] [--json OUT.json]

Then each option's split backward (a zero-bubble schedule's I and W, input_grad_ms and weight_grad_ms) on the
first block, analytic / fake, for the options both record ("-": not recorded).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner

from planner import io
from planner.cli import cli

_DEPTH_KEYS = ("n_layer", "num_hidden_layers")


def _cut(config: dict, layers: int) -> dict:
    """The config at `layers` decoder layers (a MoE config's dense-layer lists are left as given)."""
    key = next((k for k in _DEPTH_KEYS if k in config), None)
    return {**config, key: layers} if key else config


def _profile(*args: str):
    result = CliRunner().invoke(cli, list(args))
    if result.exit_code:
        return None, result.output.strip().splitlines()[-1] if result.output.strip() else repr(result.exception)
    return io.load_profile(args[args.index("--out") + 1]), None


def _value(text: str):
    """A --set value as JSON reads it (numbers, true, null), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def profiles(config_path: Path, *, seq_len: int, micro_batch_size: int, gpu: str, layers: int, work: Path,
             settings: tuple[str, ...] = ()):
    """((analytic profile or None, its refusal), (fake profile or None, its refusal)); `settings`:
    KEY=VALUE over the config's fields (e.g. LLaMA 3 8B's widths over a LLaMA config)."""
    given = json.loads(config_path.read_text())
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep:
            raise SystemExit(f"--set {setting!r} is not KEY=VALUE")
        given[key] = _value(value)
    config = _cut(given, layers)
    folder = work / config_path.stem
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    shape = ("--seq-len", str(seq_len), "--micro-batch-size", str(micro_batch_size), "--gpu", gpu)
    analytic = _profile("profile", "--arch-config", str(folder / "config.json"), *shape, "--out", str(folder / "a.json"))
    fake = _profile("profile", "--hf-config", str(folder), "--fake", *shape, "--out", str(folder / "f.json"))
    return analytic, fake


def eager_terms(config_path: Path, *, seq_len: int, micro_batch_size: int, settings: tuple[str, ...] = ()):
    """hf_kept.extra_terms of the config: what transformers' eager block keeps beyond the analytic terms."""
    from planner.models import archconfig
    from planner.profiler import hf_kept
    from planner.profiler.formulas import Shape

    given = json.loads(config_path.read_text())
    for setting in settings:
        key, _, value = setting.partition("=")
        given[key] = _value(value)
    arch = archconfig.from_hf_config(given, where=str(config_path), name=config_path.stem)
    return hf_kept.extra_terms(arch, Shape(seq_len=seq_len, micro_batch_size=micro_batch_size))


def _ratio(mine: float, theirs: float) -> float | None:
    return None if not theirs else mine / theirs


def compare(analytic, fake, extra=()) -> dict:
    """Layer by layer (paired in order) and option by option (paired by name); `extra`: hf_kept's terms,
    each block's kept bytes the fake profile has beyond the analytic count ("explained")."""
    rows, options = [], []
    kernels = fake.assumptions.get("attention_kernels", {})
    for mine, theirs in zip(analytic.layers, fake.layers, strict=True):
        row = {"analytic": mine.name, "fake": theirs.name}
        for field in ("fwd_ms", "bwd_ms", "act_bytes", "transient_bytes", "param_bytes"):
            a, f = getattr(mine, field), getattr(theirs, field)
            row[field] = {"analytic": a, "fake": f, "ratio": _ratio(a, f)}
        # the transient with weight gradients accumulated in place (the analytic's own; the fake's less autograd's
        # fresh weight gradients, LayerProfile.weight_grad_transient_bytes; None where a profile does not record it)
        a, f = (None if layer.weight_grad_transient_bytes is None
                else layer.transient_bytes - layer.weight_grad_transient_bytes for layer in (mine, theirs))
        row["transient_in_place"] = {"analytic": a, "fake": f, "ratio": None if a is None or f is None else _ratio(a, f)}
        if theirs.name in kernels:
            row["attention_kernel"] = {"analytic": _analytic_kernel(analytic), "fake": kernels[theirs.name]}
            explained = sum(term.num_bytes for term in extra)
            row["kept_gap"] = {"fake_minus_analytic": theirs.act_bytes - mine.act_bytes, "explained": explained,
                               "terms": {term.what: term.num_bytes for term in extra}}
        rows.append(row)
        theirs_by_name = {option.name: option for option in theirs.recompute_options}
        for option in mine.recompute_options:
            other = theirs_by_name.get(option.name)
            if other is not None:
                options.append({"layer": mine.name, "option": option.name,
                                "kept_bytes": {"analytic": option.kept_bytes, "fake": other.kept_bytes,
                                               "ratio": _ratio(option.kept_bytes, other.kept_bytes)},
                                "recompute_ms": {"analytic": option.recompute_ms, "fake": other.recompute_ms,
                                                 "ratio": _ratio(option.recompute_ms, other.recompute_ms)},
                                **{field: {"analytic": getattr(option, field), "fake": getattr(other, field),
                                           "ratio": _ratio(getattr(option, field) or 0.0, getattr(other, field) or 0.0)
                                           if getattr(option, field) is not None and getattr(other, field) is not None
                                           else None}
                                   for field in ("input_grad_ms", "weight_grad_ms")}})
    loss = {"loss_bytes": {"analytic": analytic.loss_bytes, "fake": fake.loss_bytes,
                           "ratio": _ratio(analytic.loss_bytes, fake.loss_bytes)},
            "loss_ms": {"analytic": analytic.loss_ms, "fake": fake.loss_ms, "ratio": _ratio(analytic.loss_ms, fake.loss_ms)}}
    return {"layers": rows, "options": options, "loss": loss}


def _analytic_kernel(profile) -> str:
    """The analytic profile's attention: one fused kernel at the GPU's attention rate, or eager's matmuls."""
    attention = profile.assumptions.get("attention", "flash")
    return "fused (flash-style)" if "flash" in str(attention) else str(attention)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(name: str, found: dict) -> None:
    print(f"## {name}")
    print("| layer (analytic / fake) | fwd ms a / f (ratio) | bwd ms a / f (ratio) | kept B a / f (ratio) "
          "| transient B a / f (ratio) | transient in place B a / f (ratio) | param B ratio |")
    print("|---|---|---|---|---|---|---|")
    blocks = [row for row in found["layers"] if row["analytic"].startswith("layers.")]
    shown = [row for row in found["layers"] if not row["analytic"].startswith("layers.")]
    kinds = {}
    for row in blocks:  # one block of each (analytic) kind: the rest repeat it
        kinds.setdefault(json.dumps({k: row[k]["analytic"] for k in ("act_bytes", "param_bytes")}), row)
    shown[1:1] = kinds.values()
    for row in shown:
        cells = [f"{row['analytic']} / {row['fake']}"]
        for field, digits in (("fwd_ms", 4), ("bwd_ms", 4)):
            v = row[field]
            cells.append(f"{_fmt(v['analytic'], digits)} / {_fmt(v['fake'], digits)} ({_fmt(v['ratio'])})")
        for field in ("act_bytes", "transient_bytes", "transient_in_place"):
            v = row[field]
            a, f = ("-" if v[side] is None else f"{v[side]:,}" for side in ("analytic", "fake"))
            cells.append(f"{a} / {f} ({_fmt(v['ratio'])})")
        cells.append(_fmt(row["param_bytes"]["ratio"], 4))
        print("| " + " | ".join(cells) + " |")
    for row in blocks:
        if "attention_kernel" in row and row in kinds.values():
            gap, k = row["kept_gap"], row["attention_kernel"]
            print(f"\n{row['fake']}: attention kernel analytic {k['analytic']} / fake {k['fake']}; kept fake - analytic "
                  f"{gap['fake_minus_analytic']:,} B, of which transformers' eager terms (planner/profiler/hf_kept.py) "
                  f"{gap['explained']:,}: " + "; ".join(f"{name} {n:,}" for name, n in gap["terms"].items()))
    loss = found["loss"]
    print(f"\nloss: kept {loss['loss_bytes']['analytic']:,} / {loss['loss_bytes']['fake']:,} "
          f"({_fmt(loss['loss_bytes']['ratio'])}), ms {_fmt(loss['loss_ms']['analytic'], 4)} / "
          f"{_fmt(loss['loss_ms']['fake'], 4)} ({_fmt(loss['loss_ms']['ratio'])})")
    first_block = blocks[0]["analytic"] if blocks else None
    rows = [o for o in found["options"] if o["layer"] == first_block and o["option"] not in ("none",)]
    if rows:
        print(f"\nrecompute options both offer ({first_block}): option: kept a / f (ratio), rerun ms a / f (ratio)")
        for o in rows:
            print(f"- {o['option']}: {o['kept_bytes']['analytic']:,} / {o['kept_bytes']['fake']:,} "
                  f"({_fmt(o['kept_bytes']['ratio'])}), {_fmt(o['recompute_ms']['analytic'], 4)} / "
                  f"{_fmt(o['recompute_ms']['fake'], 4)} ({_fmt(o['recompute_ms']['ratio'])})")
    split = [o for o in found["options"] if o["layer"] == first_block]
    if split:
        print(f"\nsplit backward ({first_block}): | option | I ms a / f (ratio) | W ms a / f (ratio) |")
        print("|---|---|---|")
        for o in split:
            i, w = o["input_grad_ms"], o["weight_grad_ms"]
            print(f"| {o['option']} | {_fmt(i['analytic'], 4)} / {_fmt(i['fake'], 4)} ({_fmt(i['ratio'])}) "
                  f"| {_fmt(w['analytic'], 4)} / {_fmt(w['fake'], 4)} ({_fmt(w['ratio'])}) |")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+", type=Path, help="Hugging Face config.json files")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=1)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers to profile (the config's depth is cut)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config field over each config's own (repeatable)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    everything = {}
    with tempfile.TemporaryDirectory() as work:
        for path in args.configs:
            (analytic, refused_a), (fake, refused_f) = profiles(
                path, seq_len=args.seq_len, micro_batch_size=args.micro_batch_size, gpu=args.gpu,
                layers=args.layers, work=Path(work), settings=tuple(args.set))
            if analytic is None or fake is None:
                everything[path.stem] = {"refused": {"arch-config": refused_a, "hf-config --fake": refused_f}}
                print(f"## {path.stem}\nrefused: --arch-config: {refused_a or 'read'}; "
                      f"--hf-config --fake: {refused_f or 'read'}\n")
                continue
            extra = eager_terms(path, seq_len=args.seq_len, micro_batch_size=args.micro_batch_size,
                                settings=tuple(args.set))
            everything[path.stem] = compare(analytic, fake, extra)
            print_table(path.stem, everything[path.stem])
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
