"""The canary's share, exact: smooth weighted round-robin over the tracks.

Each pick adds every track's weight to its credit, takes the track with the most credit and
charges it the sum of the weights. Over any run of picks the share of each track is within
one request of its weight, whatever the replica counts, so `trafficPercent: 10` is 10 of
every 100 requests, spread out (not ten in a row), rather than the canary's share of pods.
"""

from __future__ import annotations

from collections.abc import Mapping


class TrackSplit:
    """One service's split; not thread-safe (the gateway's event loop owns it)."""

    def __init__(self) -> None:
        self._credit: dict[str, int] = {}

    def pick(self, weights: Mapping[str, int]) -> str:
        """The track the next request goes to. `weights` are positive, by track; a track
        missing from them (no ready pod now) keeps no credit, so it does not burst later."""
        if not weights:
            raise ValueError("no track to pick from")
        self._credit = {t: self._credit.get(t, 0) + w for t, w in weights.items()}
        chosen = max(sorted(self._credit), key=lambda t: self._credit[t])
        self._credit[chosen] -= sum(weights.values())
        return chosen
