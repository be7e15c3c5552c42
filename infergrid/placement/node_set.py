"""The one placement entry point: which of many nodes take a pod, and how each rates it.

The extender's filter and prioritize and every pod of the trace simulator's
replay ask a ``NodeSet`` and nothing else, so the simulator measures the
decisions production makes. A node set holds each node's state under a key
its owner chooses: equal keys promise equal placement (the extender keys a node
by its name, cache version and staleness; the simulator by what fit and the
scorers read, so that nodes alike are asked once).

Two ways to the same answer: the numpy ``OfferIndex`` answers fit, the reasons
and the production policies' scores for the common pods (one share or whole-GPU
container) on thousands of nodes at once; everything else goes
through the exact ``fit`` and the policy's raw scorer, memoised per node key and
pod shape like kube-scheduler's old equivalence cache. Property tests hold the
two equal.
"""

from collections.abc import Hashable, Mapping, Sequence
from itertools import chain, compress
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from infergrid.placement.fit import FitResult, fit, surely_unfit
from infergrid.placement.host import HostRequest
from infergrid.placement.offers import OfferIndex, Rows, tuple_array
from infergrid.placement.policy import Policy
from infergrid.placement.shortfall import Shortfall
from infergrid.placement.state import NodeState
from infergrid.pod_request import PodGpuRequest

MAX_SHAPES: Final = 4096
"""Pod shapes remembered before the memo of decisions starts over."""

MAX_SCORED_SHAPES: Final = 64
"""Pod shapes whose index scores (one float per index row) are kept for the next pod of the
shape; the oldest goes first. 64 shapes of 5,000 nodes hold 5 MiB."""

MAX_REJECTED_SHAPES: Final = 16
"""Pod shapes whose index rejection lines (one per index row) are kept for the next pod of
the shape. Nodes in the same state share a whole-GPU line, so a row costs a reference; a
share's line names a GPU and is the row's own (about 100 bytes)."""

MAX_KEYS: Final = 1 << 16
"""Node keys whose decisions one pod shape remembers before its memo starts over. A key no
node holds any more is kept until then: the simulator's nodes often come back to a state
another left."""

NO_NODE: Final = "no-inventory"
"""The resource counted for a node without a state (unknown, no inventory, bad data)."""

Decision = tuple[FitResult, float | None]

_UNFIT: Final = FitResult(
    shortfalls=(Shortfall(None, "", 0, 0, "does not fit (scores are not explained)"),)
)
"""What a score remembers where ``surely_unfit`` spared the fit: only filter explains."""
Floats = npt.NDArray[np.float64]


class Verdicts(NamedTuple):
    """Filter's answer: nodes passed (in the order asked) with their index rows (-1: none),
    failed and unresolvable with their reasons, and the resource (or why none) behind
    each rejection, for metrics."""

    passed: list[str]
    passed_rows: Rows
    failed: dict[str, str]
    unresolvable: dict[str, str]
    categories: list[str]


class NodeSet:
    """Nodes' placement states by name, each under its owner's key; see the module.

    ``indexed`` False keeps no offer index: for nodes whose pods always come with a
    ``HostRequest`` (the simulator's), which only the exact core checks.
    """

    def __init__(self, indexed: bool = True) -> None:
        self._index = OfferIndex()
        self._indexed = indexed
        self._states: dict[str, tuple[Hashable, NodeState]] = {}
        self._key_ids: dict[Hashable, int] = {}
        """A small number per node key, so memo lookups hash an int, not the key."""
        self._keys: dict[str, int] = {}
        self._decisions: dict[int, dict[int, Decision]] = {}
        """Per pod shape, the decision on each node key's number: looked up with ``map``."""
        self._shapes: dict[tuple[object, ...], int] = {}
        self._scored: dict[Hashable, _Kept] = {}
        """Per pod shape, the index's raw score of each row and when the row was written
        then (``OfferIndex.written``): rows written since are scored again."""
        self._rejected: dict[Hashable, _Kept] = {}
        """Per pod shape (the request and policy, not the learned workload, which no reason
        reads), the index's rejection line of each row and the resources it is short of,
        kept as the scores are: rows written since are explained again."""
        self.evaluations = 0
        """How many times the exact core ran (a fit, and a score where asked): for tests and
        the simulator's report."""

    # Upkeep.

    def put(self, state: NodeState, key: Hashable) -> int:
        """Holds ``state`` under ``key``: its index row, or -1 where the index cannot hold it."""
        name = state.name
        if len(self._key_ids) >= MAX_KEYS:
            self._forget()
        self._states[name] = (key, state)
        self._keys[name] = self._key_id(key)
        if not (self._indexed and self._index.update(state)):
            return -1
        return int(self._index.rows([name])[0])

    def discard(self, name: str) -> None:
        """Drops the node, if held."""
        self._states.pop(name, None)
        self._keys.pop(name, None)
        self._index.discard(name)

    def get(self, name: str) -> tuple[Hashable, NodeState] | None:
        """The node's key and state, if held."""
        return self._states.get(name)

    def rows(self, names: Sequence[str]) -> Rows:
        """The index row of each name; -1 where it has none (not held, or not indexable)."""
        return self._index.rows(names)

    def held_rows(self) -> Rows:
        """The index row of every node held, in no particular order."""
        rows = self._index.rows(list(self._states))
        return rows[rows >= 0]

    def row_of(self, name: str) -> int:
        return int(self._index.rows([name])[0])

    def _key_id(self, key: Hashable) -> int:
        found = self._key_ids.get(key)
        if found is None:
            found = self._key_ids[key] = len(self._key_ids)
        return found

    def _forget(self) -> None:
        """Starts the memo over, numbering only the keys nodes hold now."""
        self._key_ids.clear()
        self._decisions.clear()
        self._keys = {name: self._key_id(key) for name, (key, _) in self._states.items()}

    def _memo(self, shape: int) -> dict[int, Decision]:
        """The decisions remembered for the pod shape, by node key number (shared by
        every node that holds the key)."""
        memo = self._decisions.get(shape)
        if memo is None:
            memo = self._decisions[shape] = {}
        return memo

    # The questions.

    def filter(
        self,
        names: list[str],
        request: PodGpuRequest,
        policy: Policy,
        rows: Rows | None = None,
        missing: Mapping[int, str] | None = None,
    ) -> Verdicts:
        """Which nodes the pod fits, and every reason each other one does not.

        ``rows`` (from ``rows``, which the caller may have kept) saves looking the names
        up; ``missing`` holds, by position, why a node has no state (unresolvable).
        """
        rows = self.rows(names) if rows is None else rows
        missing = missing or {}
        passed = np.zeros(len(names), dtype=np.bool_)
        out = Verdicts([], rows, {}, {}, [])
        if self._index.answers(request):
            held = np.flatnonzero(rows >= 0)
            fits = self._index.fits(rows[held], request)
            assert fits is not None
            passed[held[fits]] = True
            rejected = held[~fits]
            if len(rejected):
                reasons, short = self._index_why_not(rows[rejected], request, policy)
                failed = compress(names, _mask(len(names), rejected))
                out.failed.update(zip(failed, reasons, strict=True))
                out.categories.extend(chain.from_iterable(short))
            others = np.flatnonzero(rows < 0).tolist()
        else:
            others = range(len(names))
        memo = self._memo(self._shape_id(request, None, policy, False)) if len(others) else {}
        for at in others:
            name = names[at]
            result = self._decided(name, missing.get(at), memo, request, policy)
            if isinstance(result, str):
                out.unresolvable[name] = result
                out.categories.append(NO_NODE)
                continue
            passed[at] = result[0].fits
            if not result[0].fits:
                out.failed[name] = "; ".join(result[0].reasons)
                out.categories.extend(s.resource for s in result[0].shortfalls)
        out.passed.extend(compress(names, passed.tolist()))
        return out._replace(passed_rows=rows[passed])

    def scores(
        self,
        names: list[str],
        request: PodGpuRequest,
        policy: Policy,
        host: HostRequest | None = None,
        rows: Rows | None = None,
    ) -> Floats:
        """The raw score of the pod on each node, in the order given; NaN where it does not
        fit or the node is not held. ``host`` is the pod's CPU, memory and models (see
        ``fit``): the learning policies read its CPU."""
        raw = np.full(len(names), np.nan)
        if self._index.scores(request, policy):
            rows = self.rows(names) if rows is None else rows
            held = np.flatnonzero(rows >= 0)
            raw[held] = self._index_scores(rows[held], request, policy, host)
            others = np.flatnonzero(rows < 0).tolist()
        else:
            others = range(len(names))
        if not len(others):
            return raw
        memo = self._memo(self._shape_id(request, host, policy, True))
        asked = names if isinstance(others, range) else [names[at] for at in others]
        keys = list(map(self._keys.get, asked))
        found = list(map(memo.get, keys))  # the simulator asks this for every pod: in C
        if None in found:
            for at, decision in enumerate(found):
                key = keys[at]
                if decision is None and key is not None:
                    decision = memo.get(key)  # another node under the key, just now
                    if decision is None:
                        state = self._states[asked[at]][1]
                        decision = memo[key] = self._decide(state, request, host, policy, True)
                    found[at] = decision
        # None (no state, or no fit) becomes NaN in a float array.
        raw[others] = np.array([d and d[1] for d in found], dtype=np.float64)
        return raw

    def warm(
        self, rows: Rows, request: PodGpuRequest, policy: Policy, host: HostRequest | None = None
    ) -> None:
        """Scores the rows for the pod shape now, as ``scores`` would, so that its next pod
        finds them kept: the extender scores a new workload a slice of rows at a time
        before it adopts it. Shapes the index does not score are left to ``scores``."""
        if self._index.scores(request, policy):
            self._index_scores(rows, request, policy, host)

    def _index_scores(
        self, rows: Rows, request: PodGpuRequest, policy: Policy, host: HostRequest | None
    ) -> Floats:
        """The index's raw scores of the rows, reusing those of rows not written since the
        shape was last scored: between two pods of a shape, most nodes do not change."""
        shape = self._shape_id(request, host, policy, True)
        kept = _kept(self._scored, shape, rows, MAX_SCORED_SHAPES, np.float64)
        written = self._index.written(rows)
        stale = written != kept.when[rows]
        if stale.any():
            again = rows[stale]
            scored = self._index.raw_scores(again, request, policy, host)
            assert scored is not None
            kept.values[again], kept.when[again] = scored, written[stale]
        return kept.values[rows]

    def _index_why_not(
        self, rows: Rows, request: PodGpuRequest, policy: Policy
    ) -> tuple[list[str], list[tuple[str, ...]]]:
        """The index's rejection line of each row and the resources it is short of, reusing
        those of rows not written since the shape was last rejected: a whole-GPU pod that
        most nodes turn down would otherwise build thousands of long lines again."""
        shape = (request, policy.name, policy.salt)
        kept = _kept(self._rejected, shape, rows, MAX_REJECTED_SHAPES, np.object_)
        written = self._index.written(rows)
        stale = written != kept.when[rows]
        if stale.any():
            again = rows[stale]
            why = self._index.why_not(again, request, policy)
            kept.values[again] = why.reasons
            kept.extra[again] = tuple_array(why.short)
            kept.when[again] = written[stale]
        return kept.values[rows].tolist(), kept.extra[rows].tolist()

    def place(
        self, name: str, request: PodGpuRequest, policy: Policy, host: HostRequest | None = None
    ) -> FitResult:
        """The exact placement of the pod on the named node (bind's answer); never memoised,
        since a policy may choose at random (``Policy.salt``)."""
        held = self._states.get(name)
        if held is None:
            raise KeyError(name)
        return fit(request, held[1], policy, host)

    def _decided(
        self,
        name: str,
        why_none: str | None,
        memo: dict[int, Decision],
        request: PodGpuRequest,
        policy: Policy,
    ) -> Decision | str:
        """Filter's memoised decision on the named node, or why it has none."""
        if why_none is not None:
            return why_none
        held = self._states.get(name)
        if held is None:
            return f"node {name} has no placement state"
        key = self._keys[name]
        decision = memo.get(key)
        if decision is None:
            decision = memo[key] = self._decide(held[1], request, None, policy, False)
        return decision

    def _decide(
        self,
        state: NodeState,
        request: PodGpuRequest,
        host: HostRequest | None,
        policy: Policy,
        score: bool,
    ) -> Decision:
        self.evaluations += 1
        if score and surely_unfit(request, state, host):
            return (_UNFIT, None)
        result = fit(request, state, policy, host)
        after = result.after if score else None
        raw = None if after is None else policy.raw_score(state, after, policy.workload)
        return (result, raw)

    def _shape_id(
        self, request: PodGpuRequest, host: HostRequest | None, policy: Policy, score: bool
    ) -> int:
        """A small number per pod shape and policy, hashed once per call, not once per node.

        The workload's contention and CPU per GPU take no part in its equality, so they
        are part of the shape here: a re-read that changes only them changes the scores.
        """
        workload = policy.workload
        cluster = (tuple(sorted(workload.contention.items())), workload.cluster_cpu_per_gpu)
        shape = (request, host, policy.name, policy.salt, workload, cluster, score)
        found = self._shapes.get(shape)
        if found is None:
            if len(self._shapes) >= MAX_SHAPES:
                self._shapes.clear()
                self._decisions.clear()
                self._scored.clear()
                self._rejected.clear()
            found = self._shapes[shape] = len(self._shapes)
        return found


class _Kept:
    """Per index row, an answer kept for one pod shape (``values``, and ``extra`` where the
    answer has two parts) and when the row was written then (-1: never answered)."""

    __slots__ = ("extra", "values", "when")

    def __init__(self, size: int, dtype: type[np.generic]) -> None:
        fill = np.nan if dtype is np.float64 else None
        self.values = np.full(size, fill, dtype=dtype)
        self.extra = np.full(size, None, dtype=np.object_) if dtype is np.object_ else None
        self.when = np.full(size, -1, dtype=np.int64)

    def grown(self, size: int) -> "_Kept":
        """A copy at least ``size`` rows tall, doubling, so growing row by row stays cheap."""
        if len(self.when) >= size:
            return self
        bigger = _Kept(max(size, 2 * len(self.when)), self.values.dtype.type)
        for name in self.__slots__:
            old = getattr(self, name)
            if old is not None:
                getattr(bigger, name)[: len(old)] = old
        return bigger


def _kept(
    memo: dict[Hashable, _Kept], shape: Hashable, rows: Rows, most: int, dtype: type[np.generic]
) -> _Kept:
    """The shape's kept answers, tall enough for ``rows``, now the most recently asked; the
    least recently asked shape goes when ``most`` are kept."""
    height = int(rows.max(initial=-1)) + 1
    found = memo.pop(shape, None)
    kept = _Kept(height, dtype) if found is None else found.grown(height)
    if len(memo) >= most:
        del memo[next(iter(memo))]
    memo[shape] = kept
    return kept


def _mask(size: int, positions: npt.NDArray[np.intp]) -> list[bool]:
    """``size`` flags, true at ``positions``: for ``compress``, which walks them in C."""
    flags = np.zeros(size, dtype=np.bool_)
    flags[positions] = True
    return flags.tolist()
