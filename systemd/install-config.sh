#!/bin/sh
# meson install step: put the default gpumemd.conf in place unless the destination already has one.
set -eu
src=$1
dest=${DESTDIR:+$DESTDIR/}$2
dest=$(printf '%s' "$dest" | sed 's://*:/:g')
if [ -e "$dest" ]; then
    echo "Keeping existing $dest (the default is $src)"
    exit 0
fi
mkdir -p "$(dirname "$dest")"
install -m 0644 "$src" "$dest"
echo "Installing $src to $dest"
