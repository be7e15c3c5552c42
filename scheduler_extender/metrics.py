"""Prometheus metrics of the extender, named infergrid_scheduler_extender_<thing>_<unit>."""

from prometheus_client import Counter, Gauge, Histogram

REQUEST_SECONDS = Histogram(
    "infergrid_scheduler_extender_request_seconds",
    "Time to answer kube-scheduler, by verb.",
    ["verb"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
PLACEMENTS = Counter(
    "infergrid_scheduler_extender_placements_total",
    "Pods bound with a GPU assignment, by policy.",
    ["policy"],
)
PREEMPTION_NODES = Counter(
    "infergrid_scheduler_extender_preemption_nodes_total",
    "Candidate nodes of the preempt verb: kept (with victims that make room) or dropped.",
    ["outcome"],
)
PREEMPTION_EVICTIONS = Counter(
    "infergrid_scheduler_extender_preemption_evictions_total",
    "Evictions the extender asked for to make GPU room for a higher-priority pod, by outcome"
    " (evicted, or refused: RBAC, an admission policy, or the pod already gone; a victim whose"
    " PodDisruptionBudget refuses is deleted instead).",
    ["outcome"],
)
PREEMPTIONS_GIVEN_UP = Counter(
    "infergrid_scheduler_extender_preemptions_given_up_total",
    "Preemptions stopped by a refused eviction; the pod evicts no one else until that victim"
    " is gone or the retry time passes.",
)
REJECTIONS = Counter(
    "infergrid_scheduler_extender_rejections_total",
    "Node rejections in filter, by reason (the resource that fell short, or why none fits).",
    ["reason"],
)
BIND_FAILURES = Counter(
    "infergrid_scheduler_extender_bind_failures_total",
    "Binds that returned an error, by cause.",
    ["cause"],
)
BIND_WAIT_SECONDS = Histogram(
    "infergrid_scheduler_extender_bind_wait_seconds",
    "Time a filter waited for other pods' binds to reach the extender (kube-scheduler binds "
    "asynchronously).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
BIND_WAIT_RAN_OUT = Counter(
    "infergrid_scheduler_extender_bind_wait_ran_out_total",
    "Filters that stopped waiting because a pod that passed filter was not bound in time.",
)
TENTATIVE_RESERVATIONS = Counter(
    "infergrid_scheduler_extender_tentative_reservations_total",
    "Tentative reservations (a pod's placement held from prioritize until its bind), by event: "
    "made, confirmed (bound where held), moved (bound on another node), expired (no bind in "
    "time), released (the pod scheduled again).",
    ["event"],
)
CACHE_OBJECTS = Gauge(
    "infergrid_scheduler_extender_cache_objects",
    "Objects in the watch-fed cache, by kind.",
    ["kind"],
)
LEADER = Gauge("infergrid_scheduler_extender_leader", "1 while this replica holds the lease.")
SCHEDULER_TOKEN_FAILURES = Counter(
    "infergrid_scheduler_extender_scheduler_token_failures_total",
    "Failed attempts to mint or write kube-scheduler's API token (each is retried).",
)
SCHEDULER_TOKEN_EXPIRY = Gauge(
    "infergrid_scheduler_extender_scheduler_token_expiry_timestamp_seconds",
    "When the kube-scheduler token last written expires (Unix time).",
)
