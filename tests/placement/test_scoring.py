"""Raw scores per policy, the one normalise step, and the node set that asks them."""

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from infergrid.constants import PLACEMENT_POLICIES
from infergrid.errors import ContractError
from infergrid.placement import (
    EQUAL_SCORE,
    GPU_CHOICES,
    MAX_EXTENDER_PRIORITY,
    RAW_SCORERS,
    NodeState,
    normalize_scores,
    raw_scorer,
    resolve_policy,
)
from infergrid.placement.scoring import fullness

from .builders import (
    BINPACK,
    FGD,
    NOW,
    SPREAD,
    gpu,
    held_share,
    held_whole,
    inventory,
    node_of,
    node_set_of,
    pod,
    share,
    whole,
)

L4X2 = inventory(gpu(0), gpu(1))


@pytest.mark.parametrize(
    ("raw", "scores"),
    [
        ([], []),
        ([3.5], [EQUAL_SCORE]),
        ([1.0, 1.0, 1.0], [EQUAL_SCORE] * 3),
        ([0.0, 5.0, 10.0], [0, 5, 10]),
        ([-2.0, -1.0], [0, 10]),
        ([0.0, 0.25, 1.0], [0, 3, 10]),  # 2.5 rounds half up
        ([0.0, 1e-12], [EQUAL_SCORE] * 2),  # float noise is not a difference
        ([math.nan, 1.0, 2.0], [0, 0, 10]),
        ([math.inf, 1.0], [0, EQUAL_SCORE]),
        ([math.nan], [0]),
        ([-1e308, 1e308], [0, 10]),  # the span would overflow
    ],
    ids=[
        "no feasible nodes",
        "one node",
        "all equal",
        "linear",
        "negative raw scores",
        "rounding",
        "within tolerance",
        "NaN is worst",
        "infinity is worst",
        "only NaN",
        "huge span",
    ],
)
def test_normalize_scores(raw, scores):
    assert normalize_scores(raw) == scores


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True)))
def test_normalized_scores_are_always_integers_from_0_to_10(raw):
    scores = normalize_scores(raw)
    assert len(scores) == len(raw)
    assert all(isinstance(s, int) and 0 <= s <= MAX_EXTENDER_PRIORITY for s in scores)


def test_every_policy_has_a_scorer_and_a_gpu_choice():
    assert set(RAW_SCORERS) == set(GPU_CHOICES) == set(PLACEMENT_POLICIES)


@pytest.mark.parametrize("lookup", [raw_scorer, resolve_policy])
def test_an_unknown_policy_fails_at_lookup(lookup):
    with pytest.raises(ContractError, match="'tetris' is not one of binpack, spread, fgd"):
        lookup("tetris")


def test_fullness_is_memory_first_then_busy_gpus():
    empty, one_share = node_of(L4X2), node_of(L4X2, [held_share(0, 12288, 10)])
    assert fullness(empty) == 0
    assert fullness(one_share) == pytest.approx(0.25 + 0.001 * 0.5)
    assert fullness(node_of(L4X2, missing=(0, 1))) == 0  # nothing offered, nothing to fill


def nodes_with_one_fuller():
    emptier = node_of(inventory(gpu(0), gpu(1)))
    fuller = node_of(inventory(gpu(0), gpu(1)), [held_share(0, 12288, 50)])
    return [
        NodeState("emptier", emptier.gpus, True, NOW),
        NodeState("fuller", fuller.gpus, True, NOW),
    ]


@pytest.mark.parametrize(
    ("policy", "winner"),
    [(BINPACK, "fuller"), (SPREAD, "emptier"), (FGD, "fuller")],
    ids=["binpack", "spread", "fgd"],
)
def test_each_policy_prefers_its_node(policy, winner):
    node_set, names = node_set_of(nodes_with_one_fuller())
    raw = node_set.scores(names, pod(share(8192, 30)), policy)
    assert dict(zip(names, normalize_scores(raw.tolist()), strict=True))[winner] == (
        MAX_EXTENDER_PRIORITY
    )
    assert names[int(np.nanargmax(raw))] == winner


def test_infeasible_nodes_score_nan_and_keep_every_shortfall():
    node_set, names = node_set_of(
        [replace(node_of(L4X2, [held_whole(0, 1)]), name="full"), node_of(L4X2)]
    )
    request = pod(whole(1))
    raw = node_set.scores(names, request, BINPACK)
    assert math.isnan(raw[0]) and not math.isnan(raw[1])
    verdicts = node_set.filter(names, request, BINPACK)
    assert verdicts.passed == [names[1]]
    assert verdicts.failed["full"] == (
        "container 'engine': 0 of 2 GPUs free, needs 1: 2 held whole by another pod"
    )


def test_no_feasible_node_scores_nothing():
    node_set, names = node_set_of([node_of(L4X2)])
    assert math.isnan(node_set.scores(names, pod(whole(3)), BINPACK)[0])
    assert node_set.scores([], pod(whole(3)), BINPACK).tolist() == []
