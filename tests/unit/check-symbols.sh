#!/bin/sh
# Fails when libgpumem_client's exported symbols (with version nodes) differ from libclient/libgpumem_client.symbols.
set -eu
lib="$1"
expected="$2"
actual=$(nm -D --defined-only "$lib" | awk '$2 == "T" || $2 == "D" || $2 == "B" { split($3, a, "@@"); print a[2], a[1] }' | sort)
want=$(grep -v '^#' "$expected" | sed '/^$/d' | sort)
if [ "$actual" != "$want" ]; then
    echo "exported symbols of $lib changed:"
    printf '%s\n' "$want" > /tmp/gm-symbols-want.$$
    printf '%s\n' "$actual" > /tmp/gm-symbols-have.$$
    diff -u /tmp/gm-symbols-want.$$ /tmp/gm-symbols-have.$$ || true
    rm -f /tmp/gm-symbols-want.$$ /tmp/gm-symbols-have.$$
    echo "add new symbols in a new version node of libgpumem_client.sym, then list them in $expected"
    echo "0 passed, 1 failed"
    exit 1
fi
soname=$(objdump -p "$lib" | awk '/SONAME/ { print $2 }')
if [ "$soname" != "libgpumem_client.so.1" ]; then
    echo "unexpected soname $soname"
    echo "0 passed, 1 failed"
    exit 1
fi
echo "ok 1 - $(echo "$actual" | wc -l) exported symbols match, soname $soname"
echo "1 passed, 0 failed"
