"""The watchdog's stop rule: the memory threshold held for N samples, or a leak projected to cross it in time."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from daedalus.schemas.training import GIB, StopReason, WatchdogPolicy
from daedalus.training.memory import MAX_FIT_POINTS, SlopeFit, fit_slope


@dataclass
class StopRule:
    """Threshold on N consecutive samples; optionally a projected crossing within the horizon."""

    policy: WatchdogPolicy
    consecutive: int = 0
    times: deque[float] = field(default_factory=deque)
    values: deque[int] = field(default_factory=deque)
    fit: SlopeFit | None = None
    _last_fit_t: float = float("-inf")

    def observe(self, t: float, available: int, fit: bool = True) -> StopReason | None:
        """One sample; `fit=False` (refilling from the curve on disk) leaves the slope for one `refit` after."""
        self.times.append(t)
        self.values.append(available)
        while self.times and self.times[0] < t - self.policy.slope_window_s:
            self.times.popleft()
            self.values.popleft()
        self.consecutive = self.consecutive + 1 if available < self.policy.threshold_bytes else 0
        if self.consecutive >= self.policy.consecutive_samples:
            return StopReason.THRESHOLD
        # Refit once per fit bucket (>= 1 s): a fit per sample would be most of the watchdog's cost at 10 Hz.
        if fit and t - self._last_fit_t >= max(1.0, self.policy.slope_window_s / MAX_FIT_POINTS / 2):
            self.refit(t)
        if self.policy.projection_horizon_s > 0 and self.fit is not None:
            # The slope interval's end nearest zero: project with the slowest leak the data allows.
            slow = self.fit.high_gib_per_h
            if slow < 0:
                headroom_gib = (available - self.policy.threshold_bytes) / GIB
                if headroom_gib / -slow * 3600.0 <= self.policy.projection_horizon_s:
                    return StopReason.PROJECTED
        return None

    def refit(self, t: float) -> None:
        self.fit = fit_slope(list(self.times), list(self.values), self.policy.min_fit_span_s)
        self._last_fit_t = t

    @property
    def leak_flagged(self) -> bool:
        return self.fit is not None and self.fit.leak_lower_bound_gib_per_h >= self.policy.leak_flag_gib_per_h
