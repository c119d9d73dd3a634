#!/usr/bin/env bash
# Make a stand-in for the images' base (python:3.11-slim-bookworm) without any container
# registry: debootstrap a minimal Debian bookworm with Debian's python3.11, give it the layout the
# Dockerfiles expect (`python` on PATH, pip allowed to install into /usr/local), and
# `docker import` it. Prints the tag to pass as `--build-arg BASE_IMAGE=<tag>`: the image's own
# content-addressed tag, <BASE_TAG>-<first 12 hex digits of its image ID>. (A digest reference,
# name@sha256:..., needs a registry; an imported image has none, so this tag stands in for it.)
#
#   images/build-local-base.sh            # reuse the tag if it exists
#   FORCE=1 images/build-local-base.sh    # rebuild it
#
# Env: BASE_TAG (default codeq-local/python:3.11-slim-bookworm), DEBIAN_MIRROR (default: the
# first Debian URI apt already uses, else http://deb.debian.org/debian), DOCKER (client).
# Needs root (debootstrap) and a running Docker daemon. About 40 s to a few minutes.
set -euo pipefail

tag="${BASE_TAG:-codeq-local/python:3.11-slim-bookworm}"
docker="${DOCKER:-docker}"

pinned_tag() {
  local id
  id="$("$docker" image inspect -f '{{.Id}}' "$tag")"
  id="${id#sha256:}"
  "$docker" tag "$tag" "$tag-${id:0:12}"
  echo "$tag-${id:0:12}"
}

if [ -z "${FORCE:-}" ] && "$docker" image inspect "$tag" >/dev/null 2>&1; then
  pinned_tag
  exit 0
fi

mirror="${DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
  mirror="$(grep -hsoE '^URIs: *http[^ ]*/debian/?$' /etc/apt/sources.list.d/*.sources | head -n1 | sed 's/^URIs: *//')"
  mirror="${mirror:-http://deb.debian.org/debian}"
fi

rootfs="$(mktemp -d /var/tmp/codeq-base.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT

# What python:3.11-slim-bookworm holds that the Dockerfiles use: bash, apt with Debian's keyring
# (to add bookworm-backports), useradd, CA certificates, tzdata, and Python 3.11 with pip.
debootstrap --variant=minbase \
  --include=passwd,ca-certificates,netbase,tzdata,python3.11,python3-pip \
  bookworm "$rootfs" "$mirror" >&2

# The official image's python is not Debian-managed: `python` exists and pip installs freely.
rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
ln -sf /usr/bin/python3.11 "$rootfs/usr/local/bin/python"
ln -sf /usr/bin/python3.11 "$rootfs/usr/local/bin/python3"
printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
  "$mirror" >"$rootfs/etc/apt/sources.list.d/debian.sources"
: >"$rootfs/etc/apt/sources.list"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb

tar --numeric-owner -C "$rootfs" -c . | "$docker" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  - "$tag" >&2
pinned_tag
