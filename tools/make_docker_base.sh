#!/usr/bin/env bash
# Make a local Debian base image for docker/Dockerfile.cpu on a machine that cannot pull from a
# container registry but reaches a Debian mirror (and, for the build, a Python package index).
#
#   sudo tools/make_docker_base.sh [--name octavo-base:bookworm] [--suite bookworm]
#        [--mirror http://deb.debian.org/debian] [--ca-bundle FILE | --no-ca-bundle]
#
# The image holds Debian's minimal base plus python3, python3-pip, python3-venv and
# ca-certificates: the same shape as the public python:<v>-slim base, so the Dockerfile builds
# unchanged on either (pass the Python of the suite: bookworm has 3.11):
#
#   nox -s images -- cpu --build-arg BASE_IMAGE=octavo-base:bookworm --build-arg PYTHON_VERSION=3.11
#
# Two differences from Debian's defaults, both only in this local base:
#   - Debian marks its Python EXTERNALLY-MANAGED (PEP 668); the marker is removed so that `pip
#     install` as root installs into /usr/local, as it does on python:<v>-slim.
#   - A CA bundle (by default the host's /etc/ssl/certs/ca-certificates.crt) is added to the
#     image's trusted certificates, so pip inside builds and containers reaches the package
#     index through a TLS-intercepting proxy that the host trusts. PIP_CERT points pip at the
#     system bundle. Pass --no-ca-bundle to keep Debian's certificates only.
# Needs root, debootstrap and a running Docker engine.
set -euo pipefail

name="octavo-base:bookworm"
suite="bookworm"
mirror="http://deb.debian.org/debian"
ca_bundle="/etc/ssl/certs/ca-certificates.crt"

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --name) name="$2"; shift 2 ;;
        --suite) suite="$2"; shift 2 ;;
        --mirror) mirror="$2"; shift 2 ;;
        --ca-bundle) ca_bundle="$2"; shift 2 ;;
        --no-ca-bundle) ca_bundle=""; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "make_docker_base.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

for tool in debootstrap docker chroot tar; do
    command -v "$tool" > /dev/null || { echo "make_docker_base.sh: '$tool' not found" >&2; exit 1; }
done
[[ $(id -u) -eq 0 ]] || { echo "make_docker_base.sh: debootstrap needs root" >&2; exit 1; }
if [[ -n "$ca_bundle" && ! -r "$ca_bundle" ]]; then
    echo "make_docker_base.sh: CA bundle '$ca_bundle' not readable (or pass --no-ca-bundle)" >&2
    exit 1
fi
docker info > /dev/null || { echo "make_docker_base.sh: no Docker engine reachable" >&2; exit 1; }

rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT

echo "== debootstrap $suite from $mirror into $rootfs"
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
    "$suite" "$rootfs" "$mirror"

# The suite's updates and security pockets, so `apt-get install` in a build gets fixed packages.
security_mirror="${mirror%/debian}/debian-security"
cat > "$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security_mirror $suite-security main
EOF

# As Debian's own slim container images do: apt keeps no package caches in image layers, and
# dpkg leaves out manuals, docs (but copyrights) and translations.
cat > "$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT::Install-Recommends "false";
EOF
cat > "$rootfs/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/*
find "$rootfs/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete

# debootstrap installs the suite's release packages; bring them to the current point release.
chroot "$rootfs" apt-get update -qq
DEBIAN_FRONTEND=noninteractive chroot "$rootfs" apt-get upgrade -y -qq > /dev/null

rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
if [[ -n "$ca_bundle" ]]; then
    mkdir -p "$rootfs/usr/local/share/ca-certificates"
    cp "$ca_bundle" "$rootfs/usr/local/share/ca-certificates/octavo-base-extra.crt"
    chroot "$rootfs" update-ca-certificates > /dev/null
fi
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/*.log

python_version="$(chroot "$rootfs" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
echo "== docker import as $name (Python $python_version)"
tar --numeric-owner -C "$rootfs" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' \
    --message "debootstrap --variant=minbase $suite + python3, pip, venv, ca-certificates" \
    - "$name"
docker run --rm --network host "$name" python3 -c 'import ssl, sys; print(sys.version)'
echo "== $name ready: build with --build-arg BASE_IMAGE=$name --build-arg PYTHON_VERSION=$python_version"
