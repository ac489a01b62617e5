"""A progress bar over a fraction of the work (time or steps, whichever is further), on stderr."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    """A tqdm bar over a fraction of the work (time or steps, whichever is further), so its ETA is the budget's."""

    def __init__(self, desc: str, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=1000, desc=desc, file=sys.stderr, disable=not enabled, leave=True,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining} {postfix}")
        self.shown = 0.0

    def update(self, fraction: float, **postfix) -> None:
        now = time.monotonic()
        if now - self.shown < 0.5 and fraction < 1.0:
            return
        self.shown = now
        self.bar.n = min(1000, int(1000 * fraction))
        self.bar.set_postfix(postfix, refresh=True)

    def close(self) -> None:
        self.bar.close()
