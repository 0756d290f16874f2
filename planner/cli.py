"""The `ckplan` command line. Commands live in planner/commands/, one module each, imported when
the command is asked for (`ckplan launch` imports launch's module, not evaluate's), and heavy
imports (torch, pulp) happen inside the commands, so `--help` is instant."""

from __future__ import annotations

import sys
from collections.abc import MutableMapping

import click

from planner import __version__
from planner.errors import UserError


class _Group(click.Group):
    """Turns a UserError anywhere below into one clean line and exit code 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            raise click.ClickException(str(exc)) from exc
        except KeyboardInterrupt:
            raise click.ClickException("interrupted; no output was written") from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click.Group.format_commands, a command not yet imported listed by the first sentence
        of its help (COMMANDS), which is what click lists of it once imported."""
        listed = []
        for name in self.list_commands(ctx):
            command = self.commands.loaded(name) or click.Command(name, help=COMMANDS[name][1])
            if not command.hidden:
                listed.append((name, command))
        if listed:
            limit = formatter.width - 6 - max(len(name) for name, _ in listed)
            with formatter.section("Commands"):
                formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in listed])


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ckplan")
def cli() -> None:
    """Plan activation checkpointing and pipeline stages under memory caps, and run the plan.

    \b
      ckplan profile model.py             measure every pipeline layer
      ckplan profile --arch llama3-70b ...  the same from a published architecture (no GPU)
      ckplan solve --mem 24GB --stages 4  choose stages + checkpointed layers (exact solver)
      ckplan launch plan.yaml             run the plan and compare with its prediction
      ckplan calibrate plan.yaml          fit sends, per-action cost and core sharing; solve then uses them
      ckplan evaluate --layers-per-stage 19,20,20,21 --ckpt-per-stage 19,19,19,13
                                          score a hand configuration beside ckplan's plan
      ckplan export plan.yaml --to megatron   the plan as ColossalAI/Megatron/torchtitan/DeepSpeed config
      ckplan search --arch llama3-70b --gpus 64 --global-batch 512 --seq-len 8192
                                          every degree searched, each with its plan: the fastest ranked
    """


# name: (module, the first sentence of its help). `ckplan --help` lists the commands from these
# sentences without importing a module; tests/test_cli_lazy.py holds each to its command's help.
COMMANDS = {
    "calibrate": ("planner.commands.calibrate", "Time point-to-point sends (a ping-pong micro-benchmark on "
                  "the plan's backend), run PLAN's pipeline briefly, and fit the send latency and bandwidth, the "
                  "compute scale, the cost per schedule action (ranks within the cores) or the cost of ranks "
                  "sharing cores (more ranks than cores), so `solve` predicts what `launch` measures."),
    "compare": ("planner.commands.compare", "Run ckplan's plan and every baseline in it that fits the caps, with "
                "the same steps and seed, and print measured iteration time, speed-up over full checkpointing, "
                "measured peak per stage against the cap, and the error of the predictions."),
    "evaluate": ("planner.commands.evaluate", "Score a configuration you run today (layers and checkpointed "
                 "layers per stage) with the same cost model as ckplan's plans: each stage's peak against its "
                 "cap, and the iteration time, beside ckplan's optimal plan for the same setup."),
    "export": ("planner.commands.export", "Write PLAN as ColossalAI, Megatron-LM, torchtitan or DeepSpeed "
               "configuration, with comments."),
    "launch": ("planner.commands.launch", "Train PLAN's pipeline locally (one process per stage) or as one rank "
               "of torchrun, and show predicted vs measured memory and time per stage."),
    "profile": ("planner.commands.profile", "Measure every pipeline layer of MODEL.py and write a profile for "
                "`ckplan solve`."),
    "search": ("planner.commands.search", "Search every tensor-, context- (--runtime megatron or torchtitan), "
               "pipeline-, data- and expert-parallel degree, ZeRO stage and shard group, micro-batch size and "
               "schedule for N GPUs, each with its exact plan (layers per stage, recompute per layer), and rank "
               "the fastest that fit."),
    "solve": ("planner.commands.solve", "Choose, jointly, how many layers each pipeline stage gets and which of "
              "them are checkpointed, so every stage fits its cap and the iteration is fastest (exact: a dynamic "
              "programme, or the MILP on HiGHS with --solver milp; --time-limit bounds the whole solve)."),
    "validate": ("planner.commands.validate", "Measure each stage's peak memory under its schedule (in-flight "
                 "microbatches, receive buffers, optimizer state) and exit non-zero if one exceeds its cap."),
}


class _Commands(MutableMapping):
    """click.Group's `commands`, each command's module imported at its first look-up. Listing
    the names or asking whether one is there imports nothing."""

    def __init__(self, modules: dict[str, str]):
        self._modules, self._loaded = dict(modules), {}

    def loaded(self, name: str) -> click.Command | None:
        return self._loaded.get(name)

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            if name not in self._modules:
                raise KeyError(name)
            # __import__, not importlib.import_module: `python -X importtime` lists only the former
            self._loaded[name] = __import__(self._modules[name], fromlist=["command"]).command
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._modules.pop(name, None)
        self._loaded.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._modules or name in self._loaded

    def __iter__(self):
        return iter(dict.fromkeys([*self._modules, *self._loaded]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*self._modules, *self._loaded]))


cli.commands = _Commands({name: module for name, (module, _) in COMMANDS.items()})


def main() -> None:
    cli(prog_name="ckplan")


if __name__ == "__main__":
    sys.exit(main())
