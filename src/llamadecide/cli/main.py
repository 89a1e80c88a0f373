"""The `llamadecide` command."""

from __future__ import annotations

import os
import sys

import typer
import typer.rich_utils

from llamadecide.cli.bench import bench_command
from llamadecide.cli.calibrate import calibrate_command, compare_command
from llamadecide.cli.decide import decide_command
from llamadecide.cli.deploy import deploy_app
from llamadecide.cli.label import label_command
from llamadecide.cli.labels import labels_app
from llamadecide.cli.models import models_command
from llamadecide.cli.plan import plan_command
from llamadecide.cli.serve import serve_command
from llamadecide.cli.simulate import simulate_command

# Help piped to a file or another program is not cut to 80 columns (in a terminal it fits the terminal).
if not sys.stdout.isatty() and not os.environ.get("TERMINAL_WIDTH"):
    typer.rich_utils.MAX_WIDTH = 160

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="A probability for every declared option, on llama.cpp."
)
app.command("decide")(decide_command)
app.command("serve")(serve_command)
app.command("calibrate")(calibrate_command)
app.command("compare")(compare_command)
app.command("bench")(bench_command)
app.command("models")(models_command)
app.command("plan")(plan_command)
app.command("simulate")(simulate_command)
app.command("label")(label_command)
app.add_typer(deploy_app, name="deploy")
app.add_typer(labels_app, name="labels")


@app.callback()
def main() -> None:
    """llamadecide: decisions with probabilities from small GGUF models."""


if __name__ == "__main__":  # pragma: no cover
    app()
