"""Output that fits the terminal (or COLUMNS) without breaking a number or a name across lines.

Rich folds a table cell at the console width, so at 80 columns `-9.09e-05` became `-9.09e-0` / `5`
and `registered` became `register` / `ed`. Here a table keeps its columns only when every column
can be as wide as its longest word (a value or a name is never split, cells wrap at spaces);
below that width each row is printed as a block of `column  value` lines instead. Text lines wrap
at spaces with a hanging indent. A single word wider than the whole line (a long path) is the
only thing ever folded; `--json` always has every value whole.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

#: Extra indent of a wrapped line's continuation (beyond the line's own indent).
HANGING_INDENT = 2
#: Space between a stacked row's column names and its values.
KEY_GAP = 2


def _text(console: Console, cell: RenderableType) -> RenderableType:
    return console.render_str(cell) if isinstance(cell, str) else cell


def _measure(console: Console, cell: RenderableType) -> Measurement:
    """(longest word, longest line) of a cell, as Rich measures it (markup removed)."""
    return Measurement.get(console, console.options, _text(console, cell))


def _overhead(console: Console, table: Table) -> int:
    """Width of borders and padding: the table's width when every column is one character wide."""
    saved = [column.width for column in table.columns]
    for column in table.columns:
        column.width = 1
    try:
        return Measurement.get(console, console.options, table).maximum - len(table.columns)
    finally:
        for column, width in zip(table.columns, saved):
            column.width = width


def _column_ranges(console: Console, table: Table) -> list[tuple[int, int]]:
    ranges = []
    for column in table.columns:
        measures = [_measure(console, cell) for cell in (column.header, *column.cells)]
        ranges.append((max(m.minimum for m in measures), max(m.maximum for m in measures)))
    return ranges


def _widths(ranges: list[tuple[int, int]], room: int) -> list[int]:
    """Column widths within `room`: every column at least its longest word, the rest shared out smallest need first."""
    widths = [low for low, _ in ranges]
    spare = room - sum(widths)
    needs = sorted(range(len(ranges)), key=lambda i: ranges[i][1] - ranges[i][0])
    for position, i in enumerate(needs):
        share = spare // (len(needs) - position)
        grant = min(ranges[i][1] - ranges[i][0], share)
        widths[i] += grant
        spare -= grant
    return widths


def fitted_table(console: Console, table: Table) -> Table | None:
    """`table` with column widths that keep every word whole at the console width, or None when it cannot fit."""
    ranges = _column_ranges(console, table)
    room = console.width - _overhead(console, table)
    if sum(low for low, _ in ranges) > room:
        return None
    for column, width in zip(table.columns, _widths(ranges, room)):
        column.width, column.no_wrap, column.overflow = width, False, "fold"
    return table


def _compact(table: Table, gap: int) -> Table:
    """The same table without an outer edge or vertical rules: columns `gap` + 1 spaces apart
    (as `docker ps` prints them)."""
    table.box, table.show_edge, table.pad_edge, table.padding = box.SIMPLE_HEAD, False, False, (0, gap, 0, 0)
    return table


def _stacked_rows(console: Console, table: Table) -> list[RenderableType]:
    """One block per row: each column's name, then its value (under the name when both do not fit on a line)."""
    headers = [str(column.header) for column in table.columns]
    key_width = max(len(h) for h in headers)
    cells = [list(column.cells) for column in table.columns]
    blocks: list[RenderableType] = []
    for row in range(table.row_count):
        block = Table.grid(padding=(0, KEY_GAP))
        block.add_column(no_wrap=True, style="bold", width=key_width)
        block.add_column(overflow="fold")
        values = [cells[c][row] if row < len(cells[c]) else "" for c in range(len(headers))]
        words = max((_measure(console, v).minimum for v in values), default=0)
        if key_width + KEY_GAP + words <= console.width:
            for header, value in zip(headers, values):
                block.add_row(header, _text(console, value))
            blocks.append(block)
        else:
            lines: list[RenderableType] = []
            for header, value in zip(headers, values):
                lines += [Text(header, style="bold"), Padding(_text(console, value), (0, 0, 0, HANGING_INDENT))]
            blocks.extend(lines)
        blocks.append(Text(""))
    return blocks


def _default(console: Console | None) -> Console:
    if console is not None:
        return console
    from .app import console as app_console

    return app_console


def _fitted_any(console: Console, table: Table) -> Table | None:
    """`table` fitted as it is, or compacted (narrower gaps), or None when no form fits as columns."""
    return (
        fitted_table(console, table)
        or fitted_table(console, _compact(table, 1))
        or fitted_table(console, _compact(table, 0))
    )


def _print_titled(console: Console, table: Table, fitted: Table | None) -> None:
    title = table.title
    table.title = None
    if title:
        say(str(title), style="bold", console=console)
    if fitted is not None:
        fitted.title = None
        console.print(fitted)
        return
    for block in _stacked_rows(console, table):
        console.print(block)


def print_table(table: Table, console: Console | None = None) -> None:
    """Print `table` to fit the console: columns when every word fits whole, else one block per row.
    The title goes first."""
    console = _default(console)
    title = table.title
    table.title = None  # measured without it, as printed
    fitted = _fitted_any(console, table)
    table.title = title
    _print_titled(console, table, fitted)


def print_narrowing_table(tables: Iterable[Table], console: Console | None = None) -> None:
    """Print the first of `tables` that fits as columns, else the last one as `print_table` does.

    The tables hold the same rows with long names cut shorter and shorter (schemas/labels.py): a table with
    shortened names reads better than one block of lines per row, which long transformers paths forced.
    """
    console = _default(console)
    last = None
    for table in tables:
        last = table
        title = table.title
        table.title = None
        fitted = _fitted_any(console, table)
        table.title = title
        if fitted is not None:
            _print_titled(console, table, fitted)
            return
    if last is not None:
        _print_titled(console, last, None)


def wrapped_lines(text: str, width: int) -> list[str]:
    """`text` wrapped at spaces to `width`; each continuation indented past its line's own indent.
    Words stay whole unless wider than a line."""
    lines = []
    for line in text.splitlines() or [""]:
        body = line.lstrip(" ")
        indent = " " * (len(line) - len(body))
        if not body:
            lines.append("")
            continue
        hanging = indent + " " * HANGING_INDENT if len(indent) + HANGING_INDENT < width // 2 else indent
        lines += textwrap.wrap(
            body,
            width=max(width, 1),
            initial_indent=indent,
            subsequent_indent=hanging,
            break_on_hyphens=False,
            break_long_words=True,
            replace_whitespace=False,
            drop_whitespace=True,
        )
    return lines


def clipped(text: str, limit: int) -> str:
    """`text`, or its words up to `limit` characters and '…': a cut cell must not read as a whole one
    (--json has it all)."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    return (head.rsplit(" ", 1)[0] if " " in head else head) + "…"


def say(text: str, style: str | None = None, console: Console | None = None) -> None:
    """Print plain text (no markup) wrapped to the console width."""
    console = _default(console)
    for line in wrapped_lines(text, console.width):
        console.print(line, style=style, highlight=False, markup=False, soft_wrap=True)


def say_marked(prefix: str, text: str, console: Console | None = None) -> None:
    """Print `prefix` (Rich markup, e.g. a coloured severity) then plain `text`,
    wrapped to the console width at spaces."""
    console = _default(console)
    line = Text.from_markup(prefix)
    line.append(text)
    console.print(line, highlight=False, overflow="fold")


__all__: Sequence[str] = [
    "clipped",
    "fitted_table",
    "print_narrowing_table",
    "print_table",
    "say",
    "say_marked",
    "wrapped_lines",
]
