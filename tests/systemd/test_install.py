#!/usr/bin/env python3
"""meson install into a DESTDIR puts every file where it belongs, and a small program built against the installed
header and pkg-config file talks to a gpumemd started from the installed binary."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import Notify, check, ctl, in_dest, install_or_exit, run_tests, stop  # noqa: E402

E = os.environ
DEST = tempfile.mkdtemp(prefix="gpumemd-install-")

CLIENT_C = r"""
/* A program that uses gpumemd the way applications do, built against the installed library. */
#include <gpumem-client.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
        gm_client *c = NULL;
        gm_topology *t = NULL;
        char buf[256];
        uint64_t base, size;
        size_t gpus = 0;
        int r;

        r = gm_client_connect(NULL, "installed-client", &c); /* $GPUMEM_SOCKET */
        if (r < 0) {
                fprintf(stderr, "connect: %s\n", gm_strerror(NULL, r, buf, sizeof(buf)));
                return 1;
        }
        r = gm_topology_get(c, false, &t);
        if (r < 0) {
                fprintf(stderr, "topology: %s\n", gm_strerror(c, r, buf, sizeof(buf)));
                gm_client_close(c);
                return 1;
        }
        for (size_t i = 0; i < t->n_nodes; i++)
                gpus += t->nodes[i].is_gpu;
        gm_client_window(c, &base, &size);
        printf("version=%s backend=%s gpus=%zu window=%llu ping=%d\n", gm_client_server_version(c),
               gm_client_backend(c), gpus, (unsigned long long)size, gm_ping(c));
        gm_topology_free(t);
        gm_client_close(c);
        return 0;
}
"""


def d(path):
    return in_dest(DEST, path)


def test_layout(tmp):
    libdir = d(E["LIBDIR"])
    expect = [
        (E["SBINDIR"], "gpumemd"), (E["BINDIR"], "gpumemctl"), (E["INCLUDEDIR"], "gpumem-client.h"),
        (os.path.join(E["LIBDIR"], "pkgconfig"), "gpumem-client.pc"), (E["UNITDIR"], "gpumemd.service"),
        (E["UNITDIR"], "gpumemd.socket"), (E["SYSUSERSDIR"], "gpumemd.conf"), (E["TMPFILESDIR"], "gpumemd.conf"),
        (E["CATALOGDIR"], "gpumemd.catalog"), (os.path.join(E["SYSCONFDIR"], "gpumemd"), "gpumemd.conf"),
        (os.path.join(E["DATADIR"], "gpumemd", "presets", "mi300x"), "nodes"),
        (os.path.join(E["DATADIR"], "gpumemd"), "gpumemctl.schema.json"),
    ]
    if E.get("DOCS_BUILT") == "1":
        expect += [(os.path.join(E["MANDIR"], "man" + p[-1]), p)
                   for p in ("gpumemd.8", "gpumemctl.1", "gpumemd.conf.5", "gpumem-client.3", "gpumem-memory.3",
                             "gm_malloc.3", "gm_admin_status.3")]
    # the documents the man pages point at
    expect += [(os.path.join(E["DATADIR"], "doc", "gpumemd"), f) for f in ("policy.md", "gpumemctl.md",
                                                                           "operations.md")]
    for dirname, name in expect:
        check(os.path.exists(os.path.join(d(dirname), name)), f"{os.path.join(dirname, name)} installed")
    for exe in (os.path.join(E["SBINDIR"], "gpumemd"), os.path.join(E["BINDIR"], "gpumemctl")):
        check(os.access(d(exe), os.X_OK), f"{exe} is executable")
    reals = [f for f in os.listdir(libdir) if re.fullmatch(r"libgpumem_client\.so\.1\.\d+\.\d+", f)]
    check(len(reals) == 1, f"one libgpumem_client.so.1.x.y: {reals}")
    if not reals:
        return
    real = os.path.join(libdir, reals[0])
    check(os.path.isfile(real) and not os.path.islink(real), f"{reals[0]} is the library")
    check(os.readlink(os.path.join(libdir, "libgpumem_client.so.1")) == reals[0],
          f"libgpumem_client.so.1 -> {reals[0]}")
    check(os.readlink(os.path.join(libdir, "libgpumem_client.so")) in ("libgpumem_client.so.1", reals[0]),
          "libgpumem_client.so, the link-time name, points at the library")
    r = subprocess.run(["readelf", "-d", real], capture_output=True, text=True)
    check("Library soname: [libgpumem_client.so.1]" in r.stdout, "the soname is libgpumem_client.so.1")
    # the client-side KFD, where the preload libraries are built: it finds libprotobuf-c beside it
    kfd = os.path.join(libdir, "gpumemd", "libgpumem-kfd.so")
    if os.path.exists(os.path.join(libdir, "gpumemd", "libgpumem-model-preload.so")):
        check(os.path.isfile(kfd), "libgpumem-kfd.so installed beside the model's preload library")
        if os.path.isfile(kfd):
            r = subprocess.run(["readelf", "-d", kfd], capture_output=True, text=True)
            check("[$ORIGIN]" in r.stdout, f"its RUNPATH is $ORIGIN: {r.stdout}")
            needed = re.findall(r"Shared library: \[([^]]+)\]", r.stdout)
            if E.get("B_SANITIZE", "none") != "none":  # a sanitizer build links its runtimes too
                needed = [n for n in needed if not re.match(r"lib(a|ub|t)san\.so", n)]
            check(set(needed) <= {"libprotobuf-c.so.1", "libc.so.6"},
                  f"it needs libprotobuf-c and libc only, as a container gets them: {needed}")
    with open(os.path.join(libdir, "pkgconfig", "gpumem-client.pc")) as f:
        pc = f.read()
    check(f"prefix={E['PREFIX']}" in pc and "-lgpumem_client" in pc, "the .pc file names the prefix and library")


def test_build_and_run_client(tmp):
    pcdir = d(os.path.join(E["LIBDIR"], "pkgconfig"))
    # the system's own .pc files too: gpumem-client requires libprotobuf-c's for static links
    system_pc = subprocess.run(["pkg-config", "--variable", "pc_path", "pkg-config"], capture_output=True,
                               text=True).stdout.strip()
    env = dict(os.environ, PKG_CONFIG_LIBDIR=pcdir + ":" + system_pc, PKG_CONFIG_PATH="",
               PKG_CONFIG_SYSROOT_DIR=DEST)
    r = subprocess.run(["pkg-config", "--cflags", "--libs", "gpumem-client"], capture_output=True, text=True, env=env)
    check(r.returncode == 0, f"pkg-config finds gpumem-client in the DESTDIR: {r.stderr}")
    rs = subprocess.run(["pkg-config", "--static", "--libs", "gpumem-client"], capture_output=True, text=True,
                        env=env)
    check(rs.returncode == 0 and "-lprotobuf-c" in rs.stdout.split(),
          f"a static link gets libprotobuf-c (Requires.private): {rs.stdout.strip()} {rs.stderr.strip()}")
    flags = r.stdout.split()
    check(f"-I{d(E['INCLUDEDIR'])}" in flags or d(E["INCLUDEDIR"]) in r.stdout or E["INCLUDEDIR"] == "/usr/include",
          f"--cflags point into the DESTDIR: {r.stdout.strip()}")
    check(f"-L{d(E['LIBDIR'])}" in flags, f"--libs point into the DESTDIR: {r.stdout.strip()}")
    src = os.path.join(tmp, "client.c")
    exe = os.path.join(tmp, "client")
    with open(src, "w") as f:
        f.write(CLIENT_C)
    san = E.get("B_SANITIZE", "none")
    extra = [f"-fsanitize={san}"] if san not in ("", "none") else []
    cflags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wstrict-prototypes", "-Wmissing-prototypes"]
    # -I of the DESTDIR explicitly too: with prefix /usr, pkg-config drops the system include dir
    r = subprocess.run([E.get("CC", "cc"), *cflags, *extra, f"-I{d(E['INCLUDEDIR'])}", src, "-o", exe, *flags],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"the client compiles against the installed header and library: {r.stderr}")
    if r.returncode != 0:
        return

    sock = os.path.join(tmp, "gpumemd.sock")
    notify = Notify(os.path.join(tmp, "notify"))
    denv = dict(os.environ, NOTIFY_SOCKET=notify.path,
                GPUMEMD_PRESETDIR=d(os.path.join(E["DATADIR"], "gpumemd", "presets")))
    daemon = subprocess.Popen([d(os.path.join(E["SBINDIR"], "gpumemd")), "--socket", sock, "--config", "/dev/null",
                               "--backend", "model", "--model-preset", "mi300x"],
                              env=denv, stderr=subprocess.PIPE, text=True)
    try:
        check(notify.wait("READY=1"), "the installed gpumemd is ready")
        cenv = dict(os.environ, LD_LIBRARY_PATH=d(E["LIBDIR"]), GPUMEM_SOCKET=sock)
        r = subprocess.run(["ldd", exe], capture_output=True, text=True, env=cenv)
        line = [x for x in r.stdout.splitlines() if "libgpumem_client" in x]
        check(line and d(E["LIBDIR"]) in line[0], f"the client loads the installed library: {line}")
        r = subprocess.run([exe], capture_output=True, text=True, env=cenv, timeout=30)
        check(r.returncode == 0, f"the client runs: {r.stderr}")
        out = dict(kv.split("=", 1) for kv in r.stdout.split())
        check(out.get("backend") == "model" and out.get("gpus") == "8" and out.get("ping") == "0",
              f"the client sees the daemon's 8 model GPUs: {r.stdout.strip()}")
        check(out.get("window") == str(64 << 30), "the client got the default 64 GiB window")
        r = ctl(sock, "--json", "status", gpumemctl=d(os.path.join(E["BINDIR"], "gpumemctl")), env=cenv)
        check(r.returncode == 0, f"the installed gpumemctl works: {r.stderr}")
        if r.returncode == 0:
            st = json.loads(r.stdout)
            check(st["pid"] == daemon.pid and st["server_version"] == out.get("version"),
                  "installed gpumemctl and the client talk to the same installed daemon")
    finally:
        code, err = stop(daemon)
        notify.close()
    check(code == 0, f"the installed gpumemd exits 0: {err[-500:]}")


def main():
    install_or_exit(DEST)
    try:
        run_tests([
            ("installed files and library links", test_layout),
            ("a client built with pkg-config runs against the installed daemon", test_build_and_run_client),
        ])
    finally:
        shutil.rmtree(DEST, ignore_errors=True)


main()
