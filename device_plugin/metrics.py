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

# GPU telemetry (device_plugin/telemetry.py), read through NVML every usage interval. Each
# series is labelled with the GPU; a value NVML does not offer on a GPU has no series there.
_GPU = ["node", "gpu_uuid", "model"]
_MIG = [*_GPU, "mig_uuid"]
GPU_MEMORY_USED = Gauge(
    "infergrid_device_plugin_gpu_memory_used_mib",
    "Memory in use on the GPU by anyone, MiB (DCGM_FI_DEV_FB_USED).",
    _GPU,
)
GPU_UTILIZATION = Gauge(
    "infergrid_device_plugin_gpu_utilization_percent",
    "Percent of NVML's last sample period in which a kernel ran on the GPU (DCGM_FI_DEV_GPU_UTIL).",
    _GPU,
)
GPU_MEMORY_BANDWIDTH = Gauge(
    "infergrid_device_plugin_gpu_memory_bandwidth_utilization_percent",
    "Percent of NVML's last sample period in which device memory was read or written "
    "(DCGM_FI_DEV_MEM_COPY_UTIL).",
    _GPU,
)
GPU_POWER = Gauge(
    "infergrid_device_plugin_gpu_power_watts",
    "Power the GPU draws, watts (DCGM_FI_DEV_POWER_USAGE).",
    _GPU,
)
GPU_POWER_LIMIT = Gauge(
    "infergrid_device_plugin_gpu_power_limit_watts",
    "Power limit the driver enforces on the GPU, watts (DCGM_FI_DEV_ENFORCED_POWER_LIMIT).",
    _GPU,
)
GPU_TEMPERATURE = Gauge(
    "infergrid_device_plugin_gpu_temperature_celsius",
    "GPU core temperature, degrees Celsius (DCGM_FI_DEV_GPU_TEMP).",
    _GPU,
)
GPU_SM_CLOCK = Gauge(
    "infergrid_device_plugin_gpu_sm_clock_mhz",
    "SM clock, MHz (DCGM_FI_DEV_SM_CLOCK).",
    _GPU,
)
GPU_MEMORY_CLOCK = Gauge(
    "infergrid_device_plugin_gpu_memory_clock_mhz",
    "Memory clock, MHz (DCGM_FI_DEV_MEM_CLOCK).",
    _GPU,
)
GPU_CLOCKS_THROTTLED = Gauge(
    "infergrid_device_plugin_gpu_clocks_throttled",
    "1 while the reason holds the GPU's clocks down, else 0, per reason as DCGM exporter "
    "names them (DCGM_FI_DEV_CLOCKS_EVENT_REASONS).",
    [*_GPU, "reason"],
)
GPU_PCIE_THROUGHPUT = Gauge(
    "infergrid_device_plugin_gpu_pcie_bytes_per_second",
    "PCIe traffic by direction (tx: from the GPU), bytes per second over NVML's last 20 ms "
    "(DCGM_FI_PROF_PCIE_TX_BYTES, DCGM_FI_PROF_PCIE_RX_BYTES).",
    [*_GPU, "direction"],
)
GPU_NVLINK_BYTES = Counter(
    "infergrid_device_plugin_gpu_nvlink_bytes",
    "Bytes sent (tx) and received (rx) over all of the GPU's NVLinks since the plugin "
    "started; only GPUs with NVLink (DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL).",
    [*_GPU, "direction"],
)
MIG_MEMORY_USED = Gauge(
    "infergrid_device_plugin_mig_memory_used_mib",
    "Memory in use on one MIG instance, MiB (DCGM_FI_DEV_FB_USED with GPU_I_PROFILE).",
    [*_MIG, "mig_profile"],
)
PROCESS_MEMORY_USED = Gauge(
    "infergrid_device_plugin_gpu_process_memory_used_mib",
    "Memory one process holds on the GPU or MIG instance, MiB; pid as the host numbers it, "
    "and the pod of the container that holds the GPU or instance alone (empty when shared).",
    [*_MIG, "pid", "namespace", "pod", "container"],
)
GPU_HELD = Gauge(
    "infergrid_device_plugin_gpu_held_ratio",
    "Fraction of the GPU a container holds, as the kubelet lists it: 1 for a whole GPU, "
    "1/gpuReplicas for a time slice, the instance's or share's memory over the GPU's.",
    [*_MIG, "namespace", "pod", "container"],
)
