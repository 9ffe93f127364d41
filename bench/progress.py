"""Progress bars: tqdm's where it is installed (the `bench` extra) and stderr is a terminal,
else none, through the same calls, so that `tritonrnn bench`, `check` and `tune` run without
the extra."""

from __future__ import annotations

import sys


class _Silent:
    """A bar that shows nothing (progress off, stderr not a terminal, or no tqdm)."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(total: int, desc: str, enabled: bool = True, unit: str = "it"):
    """A tqdm bar of `total` steps where enabled, stderr is a terminal (a log file or a pipe
    would collect every frame of it) and tqdm is installed; else a silent one."""
    if enabled and sys.stderr is not None and sys.stderr.isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            return _Silent()
        return tqdm(total=total, desc=desc, unit=unit, leave=False)
    return _Silent()
