"""Prometheus metrics of the device plugin, named infergrid_device_plugin_<thing>_<unit>."""

from prometheus_client import Counter, Gauge, Histogram

ALLOCATIONS = Counter(
    "infergrid_device_plugin_allocations_total",
    "Allocate calls by resource and result (granted or refused).",
    ["resource", "result"],
)
ALLOCATE_SECONDS = Histogram(
    "infergrid_device_plugin_allocate_seconds",
    "Time to decide a granted Allocate call.",
    ["resource"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
LIST_AND_WATCH_SENDS = Counter(
    "infergrid_device_plugin_list_and_watch_sends_total",
    "Device lists sent to the kubelet by resource.",
    ["resource"],
)
DEVICES = Gauge(
    "infergrid_device_plugin_devices",
    "Advertised devices by resource and health.",
    ["resource", "health"],
)
GPU_MEMORY_USED = Gauge(
    "infergrid_device_plugin_gpu_memory_used_mib",
    "Measured GPU memory in use, MiB.",
    ["gpu"],
)
GPU_UTILIZATION = Gauge(
    "infergrid_device_plugin_gpu_utilization_percent",
    "Measured GPU utilisation, percent.",
    ["gpu"],
)
NVML_ERRORS = Counter(
    "infergrid_device_plugin_nvml_errors_total",
    "NVML calls that failed, by call.",
    ["call"],
)
REGISTRATIONS = Counter(
    "infergrid_device_plugin_registrations_total",
    "Register calls to the kubelet by resource and result.",
    ["resource", "result"],
)
PUBLISH_ERRORS = Counter(
    "infergrid_device_plugin_publish_errors_total",
    "Failed writes of node annotations, pod allocation marks, pod conditions and events, by what.",
    ["what"],
)
POD_RESOURCES_ERRORS = Counter(
    "infergrid_device_plugin_pod_resources_errors_total",
    "Calls to the kubelet's PodResources API that got no answer.",
)
POD_RESOURCES_FALLBACKS = Counter(
    "infergrid_device_plugin_pod_resources_fallbacks_total",
    "Times the ledger fell back to allocation marks, or a mark to the plugin's guess, "
    "because PodResources did not answer; by what fell back (ledger or mark).",
    ["what"],
)
ECC_FAULTS = Counter(
    "infergrid_device_plugin_ecc_faults_total",
    "GPUs an ECC reading turned unhealthy, by kind: needs-reset (a volatile double-bit "
    "count, a page or row waiting for a reset, a failed remap) or grew (a count kept "
    "across reboots grew since the plugin started).",
    ["kind"],
)
PODS_MARKED = Counter(
    "infergrid_device_plugin_pods_marked_total",
    "GPUHealthy conditions written on pods, by status: False (a GPU the pod holds is "
    "unhealthy) or True (healthy again).",
    ["status"],
)
MPS_DAEMON_UP = Gauge(
    "infergrid_device_plugin_mps_daemon_up",
    "1 while the MPS control daemon of a GPU that offers shares answers its probe, 0 while "
    "not (the GPU is then unhealthy); only with mps on.",
    ["gpu"],
)
MPS_DAEMON_RESTARTS = Counter(
    "infergrid_device_plugin_mps_daemon_restarts_total",
    "MPS control daemons seen answering under a new pid: restarted, their clients cut off.",
    ["gpu"],
)
