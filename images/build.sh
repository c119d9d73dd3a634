#!/usr/bin/env bash
# Build codeq-infer and codeq-train with BuildKit (what `make images` runs).
#
#   images/build.sh                      # CPU variants, tagged codeq-{infer,train}:cpu
#   VARIANT=cuda images/build.sh         # the production (CUDA) variants
#
# Env:
#   VARIANT     cpu (default here) or cuda (the Dockerfiles' default)
#   IMAGE_TAG   tag of both images (default: $VARIANT)
#   BASE_IMAGE  auto (default): the Dockerfiles' pinned python:3.11-slim-bookworm digest if it
#               is present or can be pulled, else the stand-in from images/build-local-base.sh;
#               local: always the stand-in; anything else: that image reference
#   WHEEL_DIRS  colon-separated folders of wheels already on this machine (default: pip's
#               configured find-links); those whose sha256 the lock pins are linked into
#               images/wheelhouse/ so the build does not download them again
#   CA_CERTS_DIR  locally added CA certificates for a TLS-re-signing proxy (default
#               /usr/local/share/ca-certificates, what update-ca-certificates reads); passed as
#               the BuildKit secret `extra-ca`, never written to a layer
#   DOCKER      docker client with BuildKit (default: Debian's /usr/bin/docker if present)
set -euo pipefail
cd "$(dirname "$0")/.."

variant="${VARIANT:-cpu}"
tag="${IMAGE_TAG:-$variant}"
lock="images/requirements-${variant}.lock"
[ -f "$lock" ] || { echo "error: no lock $lock for VARIANT=$variant" >&2; exit 2; }
if [ -z "${DOCKER:-}" ]; then
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi
export DOCKER

pinned_base="$(sed -n 's/^FROM ${BASE_IMAGE:-\(.*\)}$/\1/p' Dockerfile.infer)"
base="${BASE_IMAGE:-auto}"
if [ "$base" = auto ]; then
  if "$DOCKER" image inspect "$pinned_base" >/dev/null 2>&1 \
    || "$DOCKER" pull -q "$pinned_base" >/dev/null 2>&1; then
    base="$pinned_base"
  else
    echo "warning: cannot pull $pinned_base; building on the local stand-in base" >&2
    base=local
  fi
fi
if [ "$base" = local ]; then
  started=$SECONDS
  base="$(images/build-local-base.sh)"
  echo "base $base ready in $((SECONDS - started)) s" >&2
fi

# Wheels already here whose hash the lock pins (anything else would fail --require-hashes).
if [ -z "${WHEEL_DIRS+set}" ]; then
  WHEEL_DIRS="$(python3 -m pip config get global.find-links 2>/dev/null | tr ' ' ':' || true)"
  WHEEL_DIRS="${WHEEL_DIRS:+$WHEEL_DIRS:}${PIP_FIND_LINKS:-}"
fi
mkdir -p images/wheelhouse
IFS=: read -r -a wheel_dirs <<<"$WHEEL_DIRS"
for dir in "${wheel_dirs[@]}"; do
  [ -d "$dir" ] || continue
  for wheel in "$dir"/*.whl; do
    [ -f "$wheel" ] || continue
    name="$(basename "$wheel")"
    [ -f "images/wheelhouse/$name" ] && continue
    if grep -q "sha256:$(sha256sum "$wheel" | cut -d' ' -f1)" "$lock"; then
      ln -f "$wheel" "images/wheelhouse/$name" 2>/dev/null || cp "$wheel" "images/wheelhouse/$name"
    fi
  done
done
build_args=(--build-arg "VARIANT=$variant" --build-arg "BASE_IMAGE=$base")
if [ "$variant" = cpu ] && compgen -G 'images/wheelhouse/torch-*+cpu-*.whl' >/dev/null; then
  build_args+=(--build-arg TORCH_CPU_INDEX=)  # torch is local: no need for PyTorch's index
fi

secret=()
ca_dir="${CA_CERTS_DIR:-/usr/local/share/ca-certificates}"
if [ -d "$ca_dir" ] && [ -n "$(find "$ca_dir" -name '*.crt' -print -quit)" ]; then
  ca_file="$(mktemp)"
  trap 'rm -f "$ca_file"' EXIT
  find "$ca_dir" -name '*.crt' -exec cat {} + >"$ca_file"
  secret=(--secret "id=extra-ca,src=$ca_file")
fi

for image in infer train; do
  started=$SECONDS
  DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain -f "Dockerfile.$image" \
    "${build_args[@]}" "${secret[@]}" -t "codeq-$image:$tag" .
  echo "built codeq-$image:$tag on $base in $((SECONDS - started)) s" >&2
done
