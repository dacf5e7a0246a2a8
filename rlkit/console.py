"""Rich consoles that never cut what they print: the terminal's width on a terminal, no limit when piped.

Rich lays out for 80 columns when its stream is not a terminal, so `rlkit recipes show dapo >
x.yaml` lost the end of long lines, `rlkit runs list | less` cut columns and the step table in
a log file printed `-2.79e-…`. Output that goes to a file or a pipe is read by programs and
people later: it must be whole.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

# Wide enough for any table row rlkit prints; rich pads nothing to this width (tables and text
# take the width of their content), it only stops wrapping and truncating.
PIPED_WIDTH = 100_000


def make_console(**options: Any) -> Console:
    """A rich Console (options as for Console) whose width is unlimited when it is not a terminal."""
    console = Console(**options)
    if not console.is_terminal and "width" not in options:
        console.width = PIPED_WIDTH
    return console
