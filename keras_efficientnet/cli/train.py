"""`keras-efficientnet-train --recipe=NAME` (or `--flagfile=FILE`): the training command.

Everything a user can get wrong is checked before TensorFlow loads, in about a second: the flags
(into a frozen TrainConfig) and the run directory (writable, not in use by another run, the
fresh-run rule). Failures print one line; `cli.errors` lists the exit statuses, `cli.parser`
the convention every command follows. SIGTERM and SIGINT checkpoint the current training step
and exit with 128 + the signal number.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from pathlib import Path

from absl import app, flags

from keras_efficientnet import recipes
from keras_efficientnet.cli import errors, quiet
from keras_efficientnet.cli.flags import config_from_flags, define_flags
from keras_efficientnet.cli.help import grouped_help
from keras_efficientnet.cli.parser import HELP_FLAGS, parse_absl_flags
from keras_efficientnet.datasets.source_table import local_folder_problem
from keras_efficientnet.training.modes import MODE_TABLE
from keras_efficientnet.training.plan import STRATEGY_TABLE
from keras_efficientnet.training.preemption import Preempted
from keras_efficientnet.training.run_config import evaluation_config

define_flags()
flags.DEFINE_string("recipe", "", "A recipe that ships with the package, by name (the "
                    "flagfiles of flags/): --recipe=smoke, --recipe=default, "
                    "--recipe=b0-g16-lnpn-half; --recipe=list lists them with what each "
                    "trains. Flags given beside it override the recipe's. Without --recipe or "
                    "--flagfile the command runs the default recipe (`make train`'s job).")
flags.DEFINE_bool("show", False, "Print the flags the recipe sets (--recipe=NAME --show; the "
                  "default recipe without --recipe) and exit.")
# The recipe the bare command runs: `make train`'s job, minutes on a CPU. The paper's ImageNet
# recipes (hours to days) run only when asked for by name.
DEFAULT_RECIPE = "default"


def cpu_oversubscription(config) -> str | None:
    """A warning when logical CPU replicas (mirrored, no GPU) outnumber this host's cores."""
    if config.strategy != "mirrored":
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if config.replicas <= (cores or 1):
        return None
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return None
    return (f"--replicas={config.replicas} runs {config.replicas} logical CPU devices on "
            f"{cores} CPU cores: they take turns on the cores, so this is a functional run, "
            f"far slower than --replicas={cores} or fewer")


def check_local_folder(config) -> None:
    """The one data check cheap enough for before TensorFlow loads beside the source table's
    (TrainConfig's): a local image folder that is not there or lacks a split the mode reads
    (the pipeline checks the rest)."""
    mode = MODE_TABLE[config.mode]
    splits = ((config.train_split,) if mode.trains or mode.finetunes else ()) + (
        config.eval_split,)
    problem = local_folder_problem(config.dataset, splits, config.hold_out)
    if problem:
        raise ValueError(f"{problem} (--dataset={config.dataset})")


def _run(config, session) -> dict:
    """Inside the run's session: the warnings and the plan, TensorFlow's import, the run."""
    warning = cpu_oversubscription(config)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    # tf.distribute logs every all-reduce it plans at INFO; keep the run's output readable.
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    print(loading_line(config), flush=True)
    if recipe_line(flags.FLAGS):
        print(recipe_line(flags.FLAGS), flush=True)
    print(config.plan.describe(), flush=True)  # the plan and its global batch
    from keras_efficientnet.training import preemption

    # TensorFlow's threads, started by its import, must leave SIGTERM and SIGINT to this
    # one for the multi-worker start-up's watchdog to see them (distribute.watchdog).
    with preemption.held(STRATEGY_TABLE[config.strategy].signals_held_at_import):
        started = time.perf_counter()
        quiet.import_tensorflow(verbose=asked_for_logs(flags.FLAGS))
        print(f"loaded: TensorFlow in {time.perf_counter() - started:.1f} s", flush=True)
        from keras_efficientnet import registration
        from keras_efficientnet.distribute import run

        registration.register()  # Keras and the model's modules load inside the hold too
    return run(config, session=session)


def loading_line(config) -> str:
    """The run's first line: what it runs and what loads now (TensorFlow takes seconds)."""
    return (f"loading: TensorFlow, then {config.model} on {config.dataset} "
            f"(--mode={config.mode}, --model_dir={config.model_dir})")


def _report(config, results: dict, chief: bool) -> None:
    """The end-of-run summary (the chief's; other processes name the chief)."""
    from keras_efficientnet.cli.summary import summary
    from keras_efficientnet.training.results import results_path

    if not chief:
        print(f"top-1 {results['top1']:.4f}; the chief process writes the results", flush=True)
        return
    print(summary(config, results, results_path(config)), flush=True)


def main(argv: list[str], command_line: bool = False) -> int:
    """The training command; `command_line`: this process is the command (`run()`), not a
    caller of `main` (a test), so it may end itself at once after a refused write."""
    problem = errors.backend_problem(os.environ)
    if len(argv) > 1:
        problem = f"unexpected arguments {argv[1:]}; every setting is a --flag"
    try:
        config = config_from_flags(flags.FLAGS) if problem is None else None
        if config is not None and MODE_TABLE[config.mode].scores_only:  # config.json fills in
            config = evaluation_config(config, {n for n in flags.FLAGS if flags.FLAGS[n].present})
    except ValueError as error:
        problem = str(error)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return errors.BAD_INPUT
    if not asked_for_logs(flags.FLAGS):
        quiet.plain_log_lines()
    if config.verbose == 1 and not sys.stdout.isatty():  # a log file: no progress-bar frames
        config = config.replace(verbose=2)
    from keras_efficientnet.training.session import RunSession

    # One-process strategies own model_dir now, before TensorFlow loads (logging what it did:
    # take-over, fresh run); the others once the runtime says which process is the chief.
    one_process = STRATEGY_TABLE[config.strategy].one_process
    try:
        check_local_folder(config)
        with RunSession(config, chief=True if one_process else None) as session:
            results = _run(config, session)
    except (Exception, Preempted) as error:  # one line for those a user can act on
        described = errors.describe(error)
        if described is None:
            raise
        message, status = described
        print(message, file=sys.stderr, flush=True)
        if command_line and status == errors.RUN_FAILED and isinstance(error, OSError):
            _exit_now(status)
        if command_line:  # a stopped or failed run's graphs are as slow to collect
            quiet.leave_without_collecting()
        return status
    _report(config, results, session.chief)
    if command_line:
        quiet.leave_without_collecting()
    return 0


def _exit_now(status: int) -> None:
    """After a write the disk refused, HDF5 may still hold the file it could not flush, and its
    exit handler then crashes the process (exit 139, a traceback after the one line): the
    command leaves without running exit handlers."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def asked_for_logs(flag_values) -> bool:
    """Whether absl's --verbosity was given at INFO (0) or more: TensorFlow's start-up lines
    show then (absl sets the flag to 0 itself when it was not given)."""
    return flag_values["verbosity"].present and flag_values.verbosity >= 0


def parse_command_line(argv: list[str]) -> list[str]:
    """`app.run`'s flags parser: `--recipe` becomes its flagfile (the default recipe where
    neither --recipe nor --flagfile is given), `--recipe=list` and `--show` print recipes,
    `--help` prints the project's flags by group, absl's errors are one line (exit 2), and a
    recipe tuned for a built-in dataset warns when the run reads another
    (`recipes.dataset_mismatch`)."""
    try:
        names = recipes.recipe_names(argv)
        if recipes.LIST in names:
            print(recipe_table())
            sys.exit(0)
        show = any(arg in ("--show", "-show") for arg in options_of(argv))
        expanded = recipes.expand_recipe(argv)
        argv = with_default_recipe(expanded)
        if argv != expanded:  # the default recipe, chosen by the command
            names = [DEFAULT_RECIPE]
        if show:
            print(shown_flags(argv))
            sys.exit(0)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(errors.BAD_INPUT)
    options = options_of(argv)
    if any(arg in HELP_FLAGS for arg in options):
        print(grouped_help(project_flag_names()))
        sys.exit(0)
    if any(arg in ("--helpfull", "-helpfull") for arg in options):  # absl's exits with 1
        print(flags.FLAGS.get_help())
        sys.exit(0)
    remaining = parse_absl_flags(argv)
    for name in names:  # a digits recipe run on photos says so once, before anything loads
        mismatch = recipes.dataset_mismatch(name, flags.FLAGS.dataset)
        if mismatch:
            print(f"warning: {mismatch}", file=sys.stderr, flush=True)
    return remaining


def options_of(argv: list[str]) -> list[str]:
    """The options of `argv`: after the program name, before `--`."""
    return argv[1:argv.index("--")] if "--" in argv else argv[1:]


def _flagfiles(argv: list[str]) -> list[str]:
    return [arg.split("=", 1)[1] for arg in options_of(argv)
            if arg.startswith(("--flagfile=", "-flagfile="))]


def _mode(argv: list[str]) -> str | None:
    options = options_of(argv)
    for position, arg in enumerate(options):
        if arg.startswith(("--mode=", "-mode=")):
            return arg.split("=", 1)[1]
        if arg in ("--mode", "-mode") and position + 1 < len(options):
            return options[position + 1]
    return None


def with_default_recipe(argv: list[str]) -> list[str]:
    """`argv` with the default recipe's flagfile first where it names no recipe or flagfile
    (the bare command runs `make train`'s job; flags given override the recipe's), and
    `--recipe=default` after it, which the run's first lines report (`recipe_line`). A
    scores-only mode (`--mode=evaluate`) takes the run's own settings from its config.json
    instead, so it gets no recipe."""
    mode = _mode(argv)
    if _flagfiles(argv) or (mode in MODE_TABLE and MODE_TABLE[mode].scores_only):
        return argv
    expanded = recipes.expand_recipe([argv[0], f"--recipe={DEFAULT_RECIPE}", *argv[1:]])
    return [*expanded[:2], f"--recipe={DEFAULT_RECIPE}", *expanded[2:]]


def recipe_line(flag_values) -> str | None:
    """"recipe: default (...)" where the command chose the default recipe itself."""
    if flag_values["recipe"].value != DEFAULT_RECIPE:
        return None  # a recipe given by name became its --flagfile: the user knows it
    return (f"recipe: {DEFAULT_RECIPE} (no --recipe or --flagfile given; --recipe=list lists "
            "the others)")


def recipe_table() -> str:
    """`--recipe=list`: every recipe, its name and one-line description."""
    described = recipes.list_recipes()
    width = max(map(len, described))
    lines = [f"{name.ljust(width)}  {text}" for name, text in described.items()]
    return "\n".join([*lines, "", f"{len(described)} recipes; --recipe=NAME --show prints the "
                       "flags one sets, --recipe=NAME runs it"])


def shown_flags(argv: list[str]) -> str:
    """`--show`: the flags of the recipes and flagfiles `argv` names, each under its file."""
    parts = []
    for path in _flagfiles(argv):
        parts.append(f"# {path}")
        parts += recipes.file_flags(Path(path))
    return "\n".join(parts)


def project_flag_names() -> list[str]:
    import dataclasses

    from keras_efficientnet.training.config import TrainConfig

    return [f.name for f in dataclasses.fields(TrainConfig)] + [
        "global_batch_size", "recipe", "show", "flagfile"]


def run() -> None:
    """Console-script entry point (`keras-efficientnet-train`)."""
    app.run(functools.partial(main, command_line=True), flags_parser=parse_command_line)


if __name__ == "__main__":
    run()
