"""Every rich Console the CLI prints through is made here, so colour rules live in one place.

Colour only when the stream is a terminal, and never when NO_COLOR is set to anything non-empty
(https://no-color.org). Text that came from outside (evidence, notes, node names, install
hints such as `pip install 'podhealth[burnin]'`) goes through `plain()`: rich would read
`[burnin]` as a style tag and print nothing of it.
"""

from __future__ import annotations

import os
import sys
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


def is_tty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or fake stream
        return False


def colour_wanted(stream: IO[str]) -> bool:
    return not os.environ.get("NO_COLOR") and is_tty(stream)


def console(file: IO[str] | None = None, *, stderr: bool = False, min_width: int = 0) -> "Console":
    """A Console on `file` (default stdout, or stderr). `min_width` keeps wide tables readable
    when the output is a pipe (rich assumes 80 columns there)."""
    from rich.console import Console

    out = file if file is not None else (sys.stderr if stderr else sys.stdout)
    colour = colour_wanted(out)
    c = Console(file=out, highlight=False, no_color=not colour, color_system="auto" if colour else None,
                emoji=False)
    if min_width and c.width < min_width:
        c = Console(file=out, highlight=False, no_color=not colour, color_system="auto" if colour else None,
                    emoji=False, width=min_width)
    return c


def plain(text: object) -> str:
    """`text` as literal characters in rich markup (square brackets escaped)."""
    from rich.markup import escape

    return escape(str(text))
