"""What the CLI shows: step progress on stderr (a live bar in a terminal, a line per step), parity tables."""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from app.cli.validate import Check

stderr = Console(stderr=True, highlight=False)
stdout = Console(highlight=False)


class Steps:
    """`with Steps("export") as step: step("exporting layernorm ...")`: each call starts the next step.

    Each step is printed as one line, so a pipe or a CI log shows progress as it happens; in a terminal,
    a live bar below the lines shows the step under way with a spinner and the elapsed time.
    """

    def __init__(self, title: str, total: int | None = None, console: Console = stderr) -> None:
        self.title, self.total, self.console, self.count = title, total, console, 0
        self._live = console.is_terminal
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Steps:
        return self

    def __call__(self, message: str) -> None:
        if self._live and self._progress is None:  # started by the first step: `--help` never flashes a bar
            columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
            self._progress = Progress(*columns, TimeElapsedColumn(), console=self.console, transient=True)
            self._progress.start()
            self._task = self._progress.add_task(self.title, total=self.total)
        if self._progress is not None and self._task is not None:
            if self.count:
                self._progress.advance(self._task)
            self._progress.update(self._task, description=f"{self.title}: {message}")
        self.count += 1
        of = f"/{self.total}" if self.total else ""
        self.console.print(f"[{self.count}{of}] {message}", markup=False, soft_wrap=True)  # one line each

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()


def parity_table(checks: Iterable[Check], title: str) -> Table:
    table = Table(title=title)
    for name in ("model", "check"):
        table.add_column(name)
    for name in ("max abs diff", "atol"):
        table.add_column(name, justify="right")
    table.add_column("result")
    for c in checks:
        result = "[green]pass[/]" if c.passed else "[bold red]FAIL[/]"
        table.add_row(c.model, c.check, f"{c.max_abs_diff:.2e}", f"{c.atol:.2e}", result)
    return table
