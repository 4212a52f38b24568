"""Algorithm 1 (dynamic admission threshold) as pure functions.

No clock, no I/O: callers pass measurements and `now`. Bytes are ints or floats, times
are seconds on any monotonic clock.

    G_active    = Σ over running sandboxes of their near-term growth within t_react
    G_candidate = the template's profiled cold-start growth
    H = max(α·(G_active + G_candidate), floor·M_total);  T = 1 − H / M_total
    admit iff M_used < T·M_total

After an OOM the node is safe again when M_used ≤ T·M_total with H = max(α·G_active, floor·M_total).
`floor` is the workload-tuned minimum headroom (Appendix D): growth the estimators cannot
see coming, such as a command starting in an idle sandbox, must fit in it. floor = 0 is
Algorithm 1 exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxMemory:
    """What the node measured of one running sandbox."""

    samples: tuple[tuple[float, float], ...]  # (time, bytes), oldest first
    started_at: float
    cold_start_bytes: float  # profiled growth of its template's cold start
    cold_start_s: float  # how long a cold start lasts

    @property
    def current(self) -> float:
        return self.samples[-1][1] if self.samples else 0.0


@dataclass(frozen=True)
class AdmissionDecision:
    admit: bool
    threshold: float  # T, a fraction of M_total (may be negative: admit nothing)
    headroom: float  # H in bytes
    m_used: float
    m_total: float
    g_active: float
    g_candidate: float

    @property
    def reason(self) -> str:
        verdict = "admit" if self.admit else "redirect"
        return (f"{verdict}: used {self.m_used / 2**20:.0f} MiB vs threshold "
                f"{self.threshold * self.m_total / 2**20:.0f} MiB (H={self.headroom / 2**20:.0f} MiB, "
                f"G_active={self.g_active / 2**20:.0f} MiB, G_candidate={self.g_candidate / 2**20:.0f} MiB)")


def _require(condition: bool, field: str, message: str, value: object) -> None:
    if not condition:
        raise ValueError(f"{field}: {message}, got {value!r}")


def growth_rate(samples: Sequence[tuple[float, float]], now: float, window: float) -> float:
    """Least-squares slope (bytes/s) of the samples within `window` before `now`; 0 when
    fewer than two samples fall inside or memory is shrinking."""
    _require(window > 0, "window", "must be > 0", window)
    recent = [(t, b) for t, b in samples if now - window <= t <= now]
    if len(recent) < 2:
        return 0.0
    n = len(recent)
    mean_t = sum(t for t, _ in recent) / n
    mean_b = sum(b for _, b in recent) / n
    var = sum((t - mean_t) ** 2 for t, _ in recent)
    if var == 0:
        return 0.0
    slope = sum((t - mean_t) * (b - mean_b) for t, b in recent) / var
    return max(0.0, slope)


def estimate_active_growth(sandboxes: Sequence[SandboxMemory], now: float, window: float, t_react: float) -> float:
    """Σ near-term growth. A sandbox still in its cold start is expected to reach at least
    its template's cold-start size; otherwise it grows at its recent rate for t_react."""
    _require(t_react >= 0, "t_react", "must be >= 0", t_react)
    total = 0.0
    for sandbox in sandboxes:
        growth = growth_rate(sandbox.samples, now, window) * t_react
        if now - sandbox.started_at < sandbox.cold_start_s:
            growth = max(growth, sandbox.cold_start_bytes - sandbox.current)
        total += growth
    return total


def decide(m_total: float, m_used: float, g_active: float, g_candidate: float, alpha: float,
           floor: float = 0.0) -> AdmissionDecision:
    """Algorithm 1, lines 3-11."""
    _require(m_total > 0, "m_total", "must be > 0", m_total)
    _require(m_used >= 0, "m_used", "must be >= 0", m_used)
    _require(g_active >= 0, "g_active", "must be >= 0", g_active)
    _require(g_candidate >= 0, "g_candidate", "must be >= 0", g_candidate)
    _require(alpha > 0, "alpha", "must be > 0", alpha)
    _require(0 <= floor < 1, "floor", "must be in [0, 1)", floor)
    headroom = max(alpha * (g_active + g_candidate), floor * m_total)
    threshold = 1.0 - headroom / m_total
    return AdmissionDecision(m_used < threshold * m_total, threshold, headroom, m_used, m_total, g_active, g_candidate)


def decide_declared(m_total: float, declared_in_use: float, candidate_declared: float) -> AdmissionDecision:
    """The baseline: admit while the declared sizes fit the node (native E2B)."""
    _require(m_total > 0, "m_total", "must be > 0", m_total)
    _require(candidate_declared > 0, "candidate_declared", "must be > 0", candidate_declared)
    admit = declared_in_use + candidate_declared <= m_total
    return AdmissionDecision(admit, 1.0, 0.0, declared_in_use, m_total, 0.0, candidate_declared)


def safe_after_oom(m_total: float, m_used: float, g_active: float, alpha: float, floor: float = 0.0) -> bool:
    """Algorithm 1, lines 22-24: the migration loop stops once this holds."""
    _require(m_total > 0, "m_total", "must be > 0", m_total)
    threshold = 1.0 - max(alpha * g_active, floor * m_total) / m_total
    return m_used <= threshold * m_total
