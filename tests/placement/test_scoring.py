"""Raw scores per policy, the one normalise step, and the fit-and-score loop."""

import math

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
    best_node,
    normalize_scores,
    raw_scorer,
    resolve_policy,
    score_nodes,
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
    scored = score_nodes(pod(share(8192, 30)), nodes_with_one_fuller(), policy)
    assert {s.node: s.score for s in scored}[winner] == MAX_EXTENDER_PRIORITY
    assert best_node(scored).node == winner


def test_infeasible_nodes_score_0_and_keep_their_shortfalls():
    full = node_of(L4X2, [held_whole(0, 1)])
    free = node_of(L4X2)
    scored = score_nodes(pod(whole(1)), [full, free], BINPACK)
    assert [(s.raw is None, s.score, s.fit.fits) for s in scored] == [
        (True, 0, False),
        (False, EQUAL_SCORE, True),
    ]
    assert scored[0].fit.reasons[0] == "container 'engine': 0 of 2 GPUs free, needs 1"


def test_no_feasible_node_gives_no_best():
    scored = score_nodes(pod(whole(3)), [node_of(L4X2)], BINPACK)
    assert best_node(scored) is None
    assert best_node(()) is None
