#!/usr/bin/env bash
# Builds the InferGrid images from the repository root: `make images`.
#   REGISTRY  repository prefix (default: infergrid)
#   TAG       image tag (default: the version in pyproject.toml)
#   DOCKER    the builder CLI (default: docker; podman works too)
#   PUSH=1    push each image after building it
#   ALLOW_UNPINNED=1  build from base tags whose digest is still a placeholder
# Base images come from images/pins.env, pinned by tag@digest.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=pins.env
source images/pins.env
REGISTRY=${REGISTRY:-infergrid}
TAG=${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)}
DOCKER=${DOCKER:-docker}
export DOCKER_BUILDKIT=1   # for Dockerfile.dockerignore next to each Dockerfile

base() {  # base IMAGE DIGEST: IMAGE@DIGEST, or IMAGE alone when allowed
  local image=$1 digest=$2
  if [[ $digest == sha256:* && $digest != *REPLACE* ]]; then
    echo "$image@$digest"
  elif [[ ${ALLOW_UNPINNED:-0} == 1 ]]; then
    echo "warning: $image is not pinned by digest (images/pins.env)" >&2
    echo "$image"
  else
    echo "error: images/pins.env has no digest for $image; fill it in (see the comment there) or set ALLOW_UNPINNED=1" >&2
    exit 2
  fi
}

command -v "$DOCKER" >/dev/null || { echo "error: $DOCKER not found: image builds need a container builder" >&2; exit 2; }
python_base=$(base "$PYTHON_IMAGE" "$PYTHON_DIGEST")
cuda_base=$(base "$CUDA_IMAGE" "$CUDA_DIGEST")
for component in device-plugin scheduler-extender operator engine; do
  image="$REGISTRY/$component:$TAG"
  from=$python_base
  [[ $component == engine ]] && from=$cuda_base
  echo "building $image from $from" >&2
  "$DOCKER" build -f "images/$component/Dockerfile" --build-arg "BASE=$from" -t "$image" .
  if [[ ${PUSH:-0} == 1 ]]; then "$DOCKER" push "$image"; fi
done
