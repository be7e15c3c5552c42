"""Trace-driven packing simulation: replay a node list and a pod list through the placement core.

``infergrid simulate`` follows the FGD paper's protocol (USENIX ATC '23) on its
openb trace (``shared/traces/openb``): per seed, shuffled nodes and pods,
inflation to 130% of the cluster's GPUs, one attempt per pod, no departures.
Every placement is the core's (``fit``, the scorer tables); this package only
reads the trace (``trace``), maps it onto the core's types (``cluster``),
orders arrivals (``arrivals``), picks among scored nodes as kube-scheduler
does (``policies``), replays (``replay``), measures (``metrics``) and reports
(``report``, ``cli``).
"""
