#!/usr/bin/env bash
# Builds the component images from their Dockerfiles: `make images-docker`, for those
# with docker (or podman) and a container registry. `make images` builds the same
# components, and kube-scheduler and pause, with no registry (images/README.md).
#   REGISTRY  repository prefix (default: infergrid)
#   TAG       image tag (default: the version in pyproject.toml)
#   DOCKER    the builder CLI (default: docker; podman works too)
#   PUSH=1    push each image after building it
# Base images come from images/pins.env, pinned by tag.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=pins.env
source images/pins.env
REGISTRY=${REGISTRY:-infergrid}
TAG=${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)}
DOCKER=${DOCKER:-docker}
export DOCKER_BUILDKIT=1   # for Dockerfile.dockerignore next to each Dockerfile

command -v "$DOCKER" >/dev/null || { echo "error: $DOCKER not found: image builds need a container builder (or: make images)" >&2; exit 2; }
for component in device-plugin scheduler-extender operator gateway engine; do
  image="$REGISTRY/$component:$TAG"
  from=$PYTHON_IMAGE
  [[ $component == engine ]] && from=$CUDA_IMAGE
  echo "building $image from $from" >&2
  "$DOCKER" build -f "images/$component/Dockerfile" --build-arg "BASE=$from" -t "$image" .
  if [[ ${PUSH:-0} == 1 ]]; then "$DOCKER" push "$image"; fi
done
