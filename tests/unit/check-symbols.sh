#!/bin/sh
# Fails when libgpumem_client's exported symbols (with version nodes) differ from what its version script
# (libclient/libgpumem_client.sym, the one list of them) exports, or its soname is not the released one.
set -eu
lib="$1"
script="$2"
actual=$(nm -D --defined-only "$lib" | awk '$2 == "T" || $2 == "D" || $2 == "B" { split($3, a, "@@"); print a[2], a[1] }' | sort)
# "NODE symbol" for each name under a node's global:, as the linker reads the script (comments dropped)
want=$(awk '
    # the script without its comments, which may span lines
    { out = ""; rest = $0
      while (rest != "") {
          if (incomment) { i = index(rest, "*/"); if (!i) break; rest = substr(rest, i + 2); incomment = 0 }
          else { i = index(rest, "/*"); if (!i) { out = out rest; break }
                 out = out substr(rest, 1, i - 1); rest = substr(rest, i + 2); incomment = 1 }
      }
      print out }' "$script" | awk '
    /^[ \t]*[A-Za-z_][A-Za-z0-9_.]*[ \t]*\{/ { node = $1; sub(/\{.*/, "", node); scope = ""; next }
    /^[ \t]*global:/ { scope = "global"; next }
    /^[ \t]*local:/ { scope = "local"; next }
    /^[ \t]*\}/ { node = ""; next }
    node != "" && scope == "global" { gsub(/[ \t;]/, ""); if ($0 != "") print node, $0 }' | sort)
if [ -z "$want" ]; then
    echo "no exported symbol found in $script"
    echo "0 passed, 1 failed"
    exit 1
fi
if [ "$actual" != "$want" ]; then
    echo "exported symbols of $lib differ from $script:"
    printf '%s\n' "$want" > /tmp/gm-symbols-want.$$
    printf '%s\n' "$actual" > /tmp/gm-symbols-have.$$
    diff -u /tmp/gm-symbols-want.$$ /tmp/gm-symbols-have.$$ || true
    rm -f /tmp/gm-symbols-want.$$ /tmp/gm-symbols-have.$$
    echo "a new symbol goes in a new version node of $script; a released node never changes"
    echo "0 passed, 1 failed"
    exit 1
fi
soname=$(objdump -p "$lib" | awk '/SONAME/ { print $2 }')
if [ "$soname" != "libgpumem_client.so.1" ]; then
    echo "unexpected soname $soname"
    echo "0 passed, 1 failed"
    exit 1
fi
echo "ok 1 - $(echo "$actual" | wc -l) exported symbols match $(basename "$script"), soname $soname"
echo "1 passed, 0 failed"
