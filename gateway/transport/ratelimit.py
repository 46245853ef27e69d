"""Token buckets, sans-IO: the caller passes the clock, so limits are exact and testable without sleeping."""

from __future__ import annotations


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved up."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def take(self, now: float, n: float = 1) -> bool:
        """Admission: take `n` tokens if there are that many, else take nothing."""
        self._refill(now)
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False

    def wait(self, now: float, n: float) -> float:
        """Seconds until `n` tokens are there (0: now); takes nothing."""
        self._refill(now)
        return (n - self.tokens) / self.rate if self.tokens < n else 0.0

    def charge(self, now: float, n: float) -> float:
        """Metering: take `n` tokens even into debt; returns the seconds until the debt is paid (0: none).

        Used where the work cannot be refused piecemeal: the caller then pauses for the returned time, so the
        long-run rate holds and nothing is dropped.
        """
        self._refill(now)
        self.tokens -= n
        return -self.tokens / self.rate if self.tokens < 0 else 0.0


class InboundLimiter:
    """A client's inbound message and byte budgets (either may be off), one PUBLISH at a time."""

    __slots__ = ("bytes", "messages")

    def __init__(self, messages_per_s: float, bytes_per_s: float, now: float) -> None:
        # One second's worth of burst: a client may be bursty, but not above its rate over any second.
        self.messages = TokenBucket(messages_per_s, max(messages_per_s, 1.0), now) if messages_per_s else None
        self.bytes = TokenBucket(bytes_per_s, max(bytes_per_s, 1.0), now) if bytes_per_s else None

    def admit(self, now: float, nbytes: int) -> float:
        """0 when a PUBLISH of `nbytes` may go now (and is charged), else the seconds to wait (nothing charged).
        A message larger than the byte burst waits for a full bucket and then goes, leaving a debt."""
        wait = 0.0
        if self.messages is not None:
            wait = self.messages.wait(now, 1)
        if self.bytes is not None:
            wait = max(wait, self.bytes.wait(now, min(nbytes, self.bytes.burst)))
        if wait > 0:
            return wait
        if self.messages is not None:
            self.messages.charge(now, 1)
        if self.bytes is not None:
            self.bytes.charge(now, nbytes)
        return 0.0
