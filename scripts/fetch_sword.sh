#!/usr/bin/env bash
# Makes the SWORD modules engKJV2006eb and spaRV1909eb available to the data
# reader. Uses /usr/share/sword when they are installed there; otherwise
# downloads the two public-domain Debian packages and unpacks them (no root
# needed) into the cache folder that attention_jax.data looks in.
set -uo pipefail
cache="${ATTENTION_JAX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/attention_jax}/sword"
have() { [ -f "$1/modules/texts/ztext/engKJV2006eb/ot.bzz" ] && [ -f "$1/modules/texts/ztext/spaRV1909eb/ot.bzz" ]; }
if have /usr/share/sword || have "$cache/usr/share/sword"; then exit 0; fi
mkdir -p "$cache/debs"
cd "$cache/debs" || exit 1
if ! apt-get download sword-text-kjv sword-text-sparv >/dev/null 2>&1; then
  # A fresh machine may have empty package lists; refresh them when we can.
  if [ "$(id -u)" = 0 ]; then apt-get update -qq >/dev/null 2>&1 || true; fi
  apt-get download sword-text-kjv sword-text-sparv >/dev/null 2>&1 || {
    echo "warning: could not download the SWORD Bible modules. Install them with:" >&2
    echo "  sudo apt-get install sword-text-kjv sword-text-sparv" >&2
    echo "(Bible-corpus tests will be skipped.)" >&2
    exit 0
  }
fi
tmp="$cache/unpack.tmp"
rm -rf "$tmp" && mkdir -p "$tmp"
for deb in sword-text-kjv_*.deb sword-text-sparv_*.deb; do dpkg -x "$deb" "$tmp"; done
# Publish atomically: the reader never sees a half-unpacked tree.
rm -rf "$cache/usr" && mv "$tmp/usr" "$cache/usr" && rm -rf "$tmp"
echo "SWORD modules unpacked under $cache/usr/share/sword"
