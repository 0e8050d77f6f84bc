#!/usr/bin/env bash
# Makes a Debian 12 base image from the Debian archive with mmdebstrap, for builders that
# cannot pull debian:bookworm-slim (no Docker Hub). Like the slim image it is the minbase
# variant without man pages, docs (copyright files kept), info pages or locales, and the
# dpkg excludes stay in the image, so packages installed later are trimmed the same way.
#
# Usage: deploy/docker/make-base.sh [--engine podman|docker] [--tag NAME] [--mirror URL]
#   default tag localhost/onlineps-base:bookworm; pass it to the image builds as
#   --build-arg BASE=localhost/onlineps-base:bookworm (deploy/README.md, "Images").
# Needs root (or mmdebstrap's unshare mode) and mmdebstrap (apt-get install mmdebstrap).
set -euo pipefail

engine=podman
tag=localhost/onlineps-base:bookworm
mirror=http://deb.debian.org
while (($#)); do
  case $1 in
    --engine) engine=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "make-base.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
command -v mmdebstrap >/dev/null || { echo "make-base.sh: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
command -v "$engine" >/dev/null || { echo "make-base.sh: needs $engine" >&2; exit 1; }

# The paths debian:bookworm-slim leaves out (debuerreotype --slimify).
slim=(
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-include=/usr/share/locale/locale.alias'
  --dpkgopt='path-exclude=/usr/share/lintian/*'
  --dpkgopt='path-exclude=/usr/share/linda/*'
  --dpkgopt='path-exclude=/usr/share/groff/*'
)
# merged-usr: /bin -> usr/bin etc. made by the hook, as debuerreotype does, instead of the
# usrmerge package (which pulls in perl, ~45 MB).
mmdebstrap --quiet --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  "${slim[@]}" bookworm - \
  "deb $mirror/debian bookworm main" \
  "deb $mirror/debian bookworm-updates main" \
  "deb $mirror/debian-security bookworm-security main" |
  "$engine" import --change 'CMD ["bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' --message 'mmdebstrap --variant=minbase bookworm' - "$tag" >/dev/null
"$engine" image ls "$tag"
