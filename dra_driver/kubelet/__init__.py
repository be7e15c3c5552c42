"""The kubelet APIs the DRA driver serves: DRA v1 and plugin registration v1.

Each ``api.proto`` is the official definition, unchanged, from the Kubernetes module
k8s.io/kubelet v0.35.4 (pkg/apis/dra/v1 and pkg/apis/pluginregistration/v1, Apache-2.0); the
``api_pb2*`` modules beside them come from device_plugin/kubelet/codegen.py, the project's one
stub generator, and a test fails if they drift from the protos.
"""
