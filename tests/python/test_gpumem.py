#!/usr/bin/env python3
"""Tests of the Python binding (package gpumem) against a real gpumemd on the KFD model: the ctypes layouts
against the C compiler's, every public call with its values checked, the errors with their exact errno and
reason, the memoryviews over CPU-visible memory, the administration calls and the example program."""
import ctypes
import errno
import faulthandler
import json
import os
import pickle
import re
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from gmtest import GPUMEMD, Notify, check, ctl, run_tests, stop  # noqa: E402

import gpumem  # noqa: E402
from gpumem import LOCATION_CPU, SVM_LOCATION_UNDEFINED, UNLIMITED, Access, Advice, Kind, MemFlag, Resource  # noqa
from gpumem import SvmAttr, SvmFlag, _lib  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
UID = os.getuid()
# A uid of a class without administrator rights, reachable only when the tests may change uid.
GUEST_UID = 65534
CAN_SETUID = UID == 0
# The guest runs the system's python3: an interpreter under root's home is out of its reach.
GUEST_PYTHON = "/usr/bin/python3"

CONFIG = f"[class py]\nmatch-uid = {UID}\nadmin = yes\n"
if CAN_SETUID:
    CONFIG += f"[class guests]\nmatch-uid = {GUEST_UID}\n"


def die_with_parent():
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 15, 0, 0, 0)


class Daemon:
    """gpumemd on the model backend, on a socket of its own, ready when READY=1 came."""

    def __init__(self, tmp, config=CONFIG, preset="mi300x"):
        os.chmod(tmp, 0o755)  # a guest's process must reach the socket
        self.sock = os.path.join(tmp, "gpumemd.sock")
        self.conf = os.path.join(tmp, "gpumemd.conf")
        with open(self.conf, "w") as f:
            f.write(config)
        self.notify = Notify(os.path.join(tmp, "notify"))
        # the daemon goes when this test does, even when it dies of a signal
        self.proc = subprocess.Popen(
            [GPUMEMD, "--socket", self.sock, "--config", self.conf, "--backend", "model", "--model-preset", preset,
             "--log-level", "warning"],
            env=dict(os.environ, NOTIFY_SOCKET=self.notify.path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, preexec_fn=die_with_parent)
        self.ready = self.notify.wait("READY=1")

    def stop(self):
        rc, err = stop(self.proc)
        self.notify.close()
        return rc, err


@contextmanager
def daemon(tmp, **kw):
    d = Daemon(tmp, **kw)
    check(d.ready, "gpumemd is ready")
    try:
        yield d
    finally:
        rc, err = d.stop()
        check(rc == 0, f"gpumemd exits 0 (stderr: {err.strip()[-2000:]!r})")


def expect_error(what, fn, *args, err, reason=None, **kw):
    """fn(*args) raises gpumem.Error with @err; @reason: a substring its reason must hold ("" for any, None
    for none required). Returns the exception."""
    try:
        fn(*args, **kw)
    except gpumem.Error as e:
        check(e.errno == err, f"{what}: errno {errno.errorcode.get(err)}, got {errno.errorcode.get(e.errno)} ({e})")
        check(isinstance(e, OSError) and e.strerror == os.strerror(err), f"{what}: an OSError with strerror ({e})")
        if reason is not None:
            check(reason in e.reason and e.reason, f"{what}: reason holds {reason!r} ({e.reason!r})")
        return e
    except Exception as e:  # noqa: BLE001 - anything else is the failure to report
        check(False, f"{what}: gpumem.Error {errno.errorcode.get(err)} expected, got {e!r}")
        return None
    check(False, f"{what}: gpumem.Error {errno.errorcode.get(err)} expected, nothing raised")
    return None


def expect_raise(what, exc, fn, *args, **kw):
    """fn(*args) raises @exc (a Python error, raised before any C call)."""
    try:
        fn(*args, **kw)
    except exc:
        return True
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: {exc.__name__} expected, got {e!r}")
        return False
    check(False, f"{what}: {exc.__name__} expected, nothing raised")
    return False


def gpu_ids(c):
    return [n.gpu_id for n in c.gpus()]


def ctl_json(sock, *args):
    r = ctl(sock, "--json", *args)
    check(r.returncode == 0, f"gpumemctl {' '.join(args)} ({r.stderr.strip()})")
    return json.loads(r.stdout) if r.returncode == 0 else None


def pattern(size, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(251)) * (size // 251) + bytes(size % 251)


# ---- the library and the structs ------------------------------------------------------------------------

def test_layout(tmp):
    r = subprocess.run([os.environ["GPUMEM_PY_LAYOUT"]], capture_output=True, text=True, timeout=30)
    check(r.returncode == 0, f"the layout program runs ({r.stderr})")
    c_side = {}
    for line in r.stdout.splitlines():
        s = json.loads(line)
        c_side[s["struct"]] = s
    py_side = {s.__name__: s for s in _lib.STRUCTS}
    check(set(c_side) == set(py_side), f"the same structs on both sides: C {sorted(c_side)}, ctypes {sorted(py_side)}")
    for name in sorted(set(c_side) & set(py_side)):
        cs, ps = c_side[name], py_side[name]
        check(ctypes.sizeof(ps) == cs["size"], f"sizeof({name}): ctypes {ctypes.sizeof(ps)}, C {cs['size']}")
        c_fields = [(f, off, size) for f, off, size in cs["fields"]]
        py_fields = [(f[0], getattr(ps, f[0]).offset, getattr(ps, f[0]).size) for f in ps._fields_]
        check(py_fields == c_fields, f"{name}: fields (name, offset, size) as C has them:\n  C  {c_fields}\n"
                                     f"  py {py_fields}")


def test_loading(tmp):
    lib = os.environ["GPUMEM_CLIENT_LIBRARY"]
    check(_lib.library_path() == lib, f"the library named by $GPUMEM_CLIENT_LIBRARY is loaded ({_lib.library_path()})")
    r = subprocess.run(["objdump", "-p", lib], capture_output=True, text=True)
    soname = [ln.split()[1] for ln in r.stdout.splitlines() if ln.strip().startswith("SONAME")]
    check(soname == [_lib.SONAME], f"the package's soname {_lib.SONAME} is the library's ({soname})")
    # every C function the package calls has its prototype declared, and is one the library exports
    called = set()
    pkg = os.path.dirname(gpumem.__file__)
    for f in os.listdir(pkg):
        if f.endswith(".py") and f != "_lib.py":
            with open(os.path.join(pkg, f)) as src:
                text = src.read()
            called |= set(re.findall(r'_call\(\s*"(gm_\w+)"', text)) | set(re.findall(r"_lib\.(gm_\w+)", text))
    called -= {s.__name__ for s in _lib.STRUCTS}
    check(len(called) > 40 and called <= set(_lib.PROTOTYPES),
          f"calls without a prototype: {called - set(_lib.PROTOTYPES)}")
    with open(os.path.join(os.environ["SOURCE_ROOT"], "libclient", "libgpumem_client.sym")) as f:
        exported = set(re.findall(r"^\s+(gm_\w+);", f.read(), re.M))
    check(set(_lib.PROTOTYPES) <= exported, f"prototypes of no exported function: {set(_lib.PROTOTYPES) - exported}")
    unused = set(_lib.PROTOTYPES) - called
    check(not unused, f"prototypes declared but never called: {unused}")
    # every module of the package is installed
    with open(os.path.join(os.environ["SOURCE_ROOT"], "python", "meson.build")) as f:
        listed = set(re.findall(r"'gpumem/(\w+\.py)'", f.read()))
    modules = {f for f in os.listdir(pkg) if f.endswith(".py")}
    check(listed == modules, f"python/meson.build installs every module: listed {sorted(listed)}, {sorted(modules)}")
    loaded = _lib.get()
    check(all(getattr(loaded, n).argtypes is not None for n in _lib.PROTOTYPES), "the prototypes are applied")
    env = dict(os.environ, GPUMEM_CLIENT_LIBRARY=os.path.join(tmp, "no-such-lib.so"))
    r = subprocess.run([sys.executable, "-c", "import gpumem\ntry:\n gpumem.Client()\nexcept OSError as e:\n"
                        " print(type(e).__name__, e)\n raise SystemExit(3)\n"], env=env, capture_output=True, text=True)
    check(r.returncode == 3 and "GPUMEM_CLIENT_LIBRARY" in r.stdout and "no-such-lib.so" in r.stdout,
          f"a library that cannot be loaded is an OSError naming it and the variable ({r.stdout!r} {r.stderr!r})")
    r = subprocess.run([sys.executable, "-c", "import gpumem"], env=env, capture_output=True, text=True)
    check(r.returncode == 0, f"importing the package needs no library yet ({r.stderr!r})")


def test_errors_and_arguments(tmp):
    check(issubclass(gpumem.Error, OSError), "gpumem.Error is an OSError")
    e = gpumem.Error(errno.EDQUOT, "class 'x' host limit", "gm_host_malloc")
    check(e.errno == errno.EDQUOT and e.strerror == os.strerror(errno.EDQUOT) and e.reason == "class 'x' host limit"
          and e.call == "gm_host_malloc", f"Error's fields ({e!r})")
    check(str(e) == f"[Errno {errno.EDQUOT}] {os.strerror(errno.EDQUOT)}: class 'x' host limit (gm_host_malloc)",
          f"str(Error) ({e})")
    back = pickle.loads(pickle.dumps(e))
    check((back.errno, back.reason, back.call) == (e.errno, e.reason, e.call), "an Error pickles")
    # the socket does not exist: ENOENT, with the path
    missing = os.path.join(tmp, "nobody.sock")
    err = expect_error("connect to no daemon", gpumem.Client, missing, err=errno.ENOENT)
    check(err is not None and err.filename == missing and repr(missing) in str(err) and err.reason == ""
          and err.call == "gm_client_open_with", f"the error names the socket ({err})")
    expect_raise("socket of a wrong type", TypeError, gpumem.Client, 5)
    expect_raise("name of a wrong type", TypeError, gpumem.Client, missing, 7)
    expect_raise("a NUL in the socket path", ValueError, gpumem.Client, "a\0b")
    expect_raise("negative window", ValueError, gpumem.Client, missing, window_size=-1)
    expect_error("a path too long", gpumem.Client, "/" + "x" * 200, err=errno.ENAMETOOLONG)
    with daemon(tmp) as d:
        with gpumem.Client(d.sock) as c:
            gpu = gpu_ids(c)[0]
            buf = c.host_malloc(4096)
            for what, fn in [
                ("negative size", lambda: c.malloc(-1, gpu)),
                ("size over 64 bits", lambda: c.host_malloc(1 << 64)),
                ("negative GPU", lambda: c.malloc(4096, -3)),
                ("GPU over 32 bits", lambda: c.malloc(4096, 1 << 32)),
                ("negative offset of a view", lambda: buf.view(-1)),
                ("negative fd", lambda: c.import_fd(-1)),
            ]:
                expect_raise(what, ValueError, fn)
            for what, fn in [
                ("size as str", lambda: c.malloc("4096", gpu)),
                ("size as float", lambda: c.host_malloc(4096.0)),
                ("size as bool", lambda: c.host_malloc(True)),
                ("GPU as None", lambda: c.malloc(4096, None)),
                ("address as str", lambda: c.pointer_attributes("0x1000")),
                ("fd as str", lambda: c.import_fd("3")),
                ("access not pairs", lambda: c.set_access(c.window[0], 4096, [1, 2])),
                ("SVM attributes not pairs", lambda: c.svm_set_attributes(c.window[0], 4096, [(1, 2, 3)])),
                ("flags as str", lambda: c.malloc(4096, gpu, "x")),
            ]:
                expect_raise(what, TypeError, fn)
            buf.free()
            # nothing reached the daemon: it holds nothing for the client
            left = ctl_json(d.sock, "allocations", "--client", str(c.id))["allocations"]
            check(left == [], f"no bad argument reached the daemon ({left})")


# ---- the connection -------------------------------------------------------------------------------------

def test_connection(tmp):
    with daemon(tmp) as d:
        c = gpumem.Client(d.sock, name="py-session")
        status = ctl_json(d.sock, "status")
        check(c.id > 0, f"a client id ({c.id})")
        base, size = c.window
        check(size == 64 * GiB and base % (2 * MiB) == 0 and base > 0,
              f"the 64 GiB default window ({base:#x}+{size:#x})")
        check(c.server_version == status["server_version"], f"server version {c.server_version}")
        check(c.backend == "model", f"backend {c.backend}")
        check(c.kfd_version == (status["kfd_version"]["major"], status["kfd_version"]["minor"]) == (1, 19),
              f"KFD version {c.kfd_version}")
        check(c.protocol_version == status["protocol_version"] == 4, f"protocol {c.protocol_version}")
        check(c.in_window(base) and c.in_window(base + size - 1) and not c.in_window(base + size), "in_window")
        check(c.ping() is None, "ping")
        check(c.name == "py-session" and f"id={c.id} " in repr(c), f"repr ({c!r})")
        clients = ctl_json(d.sock, "clients")["clients"]
        mine = [x for x in clients if x["id"] == c.id]
        check(len(mine) == 1 and mine[0]["name"] == "py-session" and mine[0]["pid"] == os.getpid(),
              f"the daemon sees the client with its name and pid ({mine})")
        # the window is reserved in this process: nothing else lands there
        with open("/proc/self/maps") as f:
            maps = f.read()
        check(f"{base:x}-{base + size:x} ---p" in maps, "the window is reserved PROT_NONE in this process")
        # a child after fork() may not use the parent's client
        pid = os.fork()
        if pid == 0:
            try:
                c.ping()
                code = 1
            except ValueError:
                code = 0
            except BaseException:  # noqa: BLE001 - whatever it was, the child must not go on
                code = 2
            os._exit(code)
        _, wstatus = os.waitpid(pid, 0)
        check(os.WIFEXITED(wstatus) and os.WEXITSTATUS(wstatus) == 0, f"a forked child's call is refused ({wstatus})")
        c.ping()  # the parent's client is unharmed
        c.close()
        check(c.closed, "closed")
        c.close()  # twice: nothing
        expect_raise("a call on a closed client", ValueError, c.ping)
        with open("/proc/self/maps") as f:
            check(f"{base:x}-{base + size:x}" not in f.read(), "closing gives the window back")
        # options of hello
        with gpumem.Client(d.sock, window_size=GiB) as small:
            check(small.window[1] == GiB, f"a 1 GiB window asked for ({small.window[1]:#x})")
        with gpumem.Client(d.sock, low_window=True) as low:
            check(low.window[0] + low.window[1] <= 1 << 40, f"a window below 1 TiB ({low.window[0]:#x})")
        expect_error("a window not a multiple of 2 MiB", gpumem.Client, d.sock, window_size=3 * MiB, err=errno.EINVAL,
                     reason="")
        # $GPUMEM_SOCKET when no socket is given
        os.environ["GPUMEM_SOCKET"] = d.sock
        try:
            with gpumem.Client() as env_client:
                check(env_client.id > c.id, "a client through $GPUMEM_SOCKET")
        finally:
            del os.environ["GPUMEM_SOCKET"]
        with gpumem.Client(d.sock) as c2:
            pass
        check(c2.closed, "the context manager closes")


def test_no_class(tmp):
    # a daemon whose only class admits someone else: the reason comes from the daemon through gm_client_open
    with daemon(tmp, config=f"[class other]\nmatch-uid = {UID + 1}\n") as d:
        expect_error("no class admits this uid", gpumem.Client, d.sock, err=errno.EACCES, reason="no policy class")


# ---- topology --------------------------------------------------------------------------------------------

def test_topology(tmp):
    with daemon(tmp) as d:
        with gpumem.Client(d.sock) as c:
            t = c.topology()
            ref = ctl_json(d.sock, "topology")
            check(t.generation_id == ref["generation_id"], f"generation {t.generation_id}")
            check(len(t.nodes) == len(ref["nodes"]) == 10, f"10 nodes ({len(t.nodes)})")
            check(len(t.gpus) == 8 and all(n.is_gpu for n in t.gpus), "8 GPUs")
            for n, r in zip(t.nodes, ref["nodes"]):
                got = (n.node_id, n.gpu_id, n.name, "gpu" if n.is_gpu else "cpu", n.cpu_cores, n.simd_count,
                       n.local_mem_size, n.system_mem_size, n.gfx_target_version, n.vendor_id, n.device_id,
                       n.pci_domain, n.pci_location, n.drm_render_minor, n.hive_id, n.numa_node, n.large_bar,
                       n.capability)
                want = (r["node_id"], r["gpu_id"], r["name"], r["kind"], r["cpu_cores"], r["simd_count"],
                        r["vram_bytes"], r["system_mem_bytes"], r["gfx_target_version"], r["vendor_id"],
                        r["device_id"], r["pci_domain"], r["pci_location"], r["drm_render_minor"], r["hive_id"],
                        r["numa_node"], r["large_bar"], r["capability"])
                check(got == want, f"node {n.node_id} as gpumemctl reads it:\n  {got}\n  {want}")
                links = [(k.node_from, k.node_to, k.weight, k.min_bandwidth, k.max_bandwidth) for k in n.io_links]
                rlinks = [(k["from"], k["to"], k["weight"], k["min_bandwidth"], k["max_bandwidth"])
                          for k in r["io_links"]]
                check(links == rlinks and links, f"node {n.node_id}: its IO links ({len(links)})")
                check(n.properties == {}, "no raw properties unless asked")
            for g in t.gpus:
                check(g.gpu_id != 0 and g.local_mem_size == 192 * GiB and g.gfx_target_version == 90402
                      and g.large_bar and g.simd_count > 0, f"an MI300X GPU ({g})")
                check(all(k.type in (2, 11) for k in g.io_links), "GPU links are PCIe or XGMI")
            check(sum(1 for g in t.gpus for k in g.io_links if k.type == 11) == 8 * 7, "XGMI between every pair")
            cpus = [n for n in t.nodes if not n.is_gpu]
            check(len(cpus) == 2 and all(n.cpu_cores > 0 and n.gpu_id == 0 and n.system_mem_size > 0 for n in cpus),
                  "two CPU nodes")
            check(c.gpus() == t.gpus, "gpus() is the topology's GPUs")
            full = c.topology(with_properties=True)
            gprops = full.gpus[0].properties
            check(gprops.get("simd_count") == t.gpus[0].simd_count and gprops.get("gfx_target_version") == 90402
                  and len(gprops) > 20, f"raw properties of a GPU ({len(gprops)})")
            files = c.topology_files()
            check(files.get("generation_id", b"").strip() == str(t.generation_id).encode(),
                  f"generation_id file ({files.get('generation_id')!r})")
            for n in t.nodes:
                check(files.get(f"nodes/{n.node_id}/gpu_id", b"").strip() == str(n.gpu_id).encode(),
                      f"nodes/{n.node_id}/gpu_id")
                check(f"simd_count {n.simd_count}".encode() in files.get(f"nodes/{n.node_id}/properties", b""),
                      f"nodes/{n.node_id}/properties")
            tc = c.tile_config(t.gpus[0].gpu_id)
            check(tc.gb_addr_config != 0 and len(tc.tile) <= 32 and len(tc.macro) <= 16, f"tile config ({tc})")
            expect_error("tile config of no GPU", c.tile_config, 12345, err=errno.ENODEV)


# ---- device, host and managed memory -----------------------------------------------------------------

def test_allocations(tmp):
    with daemon(tmp) as d:
        with gpumem.Client(d.sock) as c:
            gpus = gpu_ids(c)
            gpu = gpus[0]
            dev = c.malloc(8 * MiB, gpu)
            check(isinstance(dev, gpumem.Allocation) and dev.kind == Kind.DEVICE and dev.size == 8 * MiB
                  and dev.gpu_id == gpu and dev.flags == MemFlag.NONE, f"device allocation ({dev!r})")
            check(c.in_window(dev.va, dev.size) and dev.va % (2 * MiB) == 0, "inside the window, 2 MiB aligned")
            a = dev.attributes()
            check(a.kind == Kind.DEVICE and a.base == dev.va and a.size == 8 * MiB and a.gpu_id == gpu
                  and a.mapped_gpus == (gpu,) and not a.cpu_accessible and a.handle == dev.handle != 0,
                  f"its attributes ({a})")
            expect_raise("no view of device memory without HOST_VISIBLE", ValueError, dev.view)
            host = c.host_malloc(10000, gpu)
            a = host.attributes()
            check(host.kind == Kind.HOST and a.kind == Kind.HOST and a.size == 12288 and a.cpu_accessible
                  and sorted(a.mapped_gpus) == sorted(gpus), f"host memory: rounded to pages, on every GPU ({a})")
            check(len(host.view()) == 10000, "its view has the size asked for")
            managed = c.malloc_managed(4 * MiB)
            a = managed.attributes()
            check(managed.kind == Kind.MANAGED and a.kind == Kind.MANAGED and a.gpu_id == 0 and a.cpu_accessible
                  and a.mapped_gpus == (), f"managed memory ({a})")
            vis = c.malloc(2 * MiB, gpu, MemFlag.HOST_VISIBLE | MemFlag.COHERENT)
            a = vis.attributes()
            check(a.cpu_accessible and a.flags == MemFlag.HOST_VISIBLE | MemFlag.COHERENT, f"host-visible VRAM ({a})")
            # what the daemon lists, client by client
            listed = {x["va"]: x for x in ctl_json(d.sock, "allocations", "--client", str(c.id))["allocations"]}
            for alloc, size in ((dev, 8 * MiB), (host, 12288), (managed, 4 * MiB), (vis, 2 * MiB)):
                x = listed.get(alloc.va)
                check(x is not None and x["size"] == size and x["kind"] == alloc.kind.name.lower()
                      and int(x["handle"], 16) == alloc.handle, f"{alloc!r} listed by the daemon ({x})")
            # options of gm_malloc_desc
            big = c.malloc(4096, gpu, alignment=64 * MiB)
            check(big.va % (64 * MiB) == 0, f"alignment 64 MiB ({big.va:#x})")
            at = c.window[0] + 40 * GiB
            fixed = c.host_malloc(4096, gpu, fixed_addr=at)
            check(fixed.va == at, f"fixed address ({fixed.va:#x})")
            peers = c.malloc(2 * MiB, gpu, map_gpus=[gpus[1], gpus[2]])
            check(sorted(peers.attributes().mapped_gpus) == sorted([gpus[1], gpus[2]]), "mapped on the GPUs asked")
            some = c.host_malloc(4096, gpu, map_gpus=[gpus[3]])
            check(some.attributes().mapped_gpus == (gpus[3],), "host memory on a subset of GPUs")
            # peer mappings
            dev.map_gpus([gpus[1], gpus[2]])
            check(sorted(dev.attributes().mapped_gpus) == sorted([gpu, gpus[1], gpus[2]]), "map_gpus adds GPUs")
            dev.map_gpus([gpus[1]])  # again: fine
            dev.unmap_gpus([gpus[1]])
            check(sorted(dev.attributes().mapped_gpus) == sorted([gpu, gpus[2]]), "unmap_gpus removes one")
            c.unmap_gpus(dev.va, [])
            check(dev.attributes().mapped_gpus == (), "unmap_gpus with none: from every GPU")
            c.map_gpus(dev, [gpu])
            check(dev.attributes().mapped_gpus == (gpu,), "Client.map_gpus with an Allocation")
            expect_error("unmap from a GPU it is not on", dev.unmap_gpus, [gpus[5]], err=errno.EINVAL, reason="")
            expect_error("map with no GPU", dev.map_gpus, [], err=errno.EINVAL)
            expect_error("map on no such GPU", dev.map_gpus, [4242], err=errno.ENODEV, reason="")
            expect_error("map managed memory on GPUs", managed.map_gpus, [gpu], err=errno.EINVAL,
                         reason="SVM attributes")
            expect_error("map_gpus of an address no allocation starts at", c.map_gpus, dev.va + 4096, [gpu],
                         err=errno.EINVAL, reason="")
            # errors of the allocation calls, with the daemon's reasons
            expect_error("size 0", c.malloc, 0, gpu, err=errno.EINVAL, reason="")
            expect_error("GPU 0 for device memory", c.malloc, 4096, 0, err=errno.ENODEV, reason="")
            expect_error("no such GPU", c.malloc, 4096, 4242, err=errno.ENODEV, reason="4242")
            expect_error("unknown flags", c.malloc, 4096, gpu, 1 << 20, err=errno.EINVAL, reason="")
            expect_error("EXT_COHERENT without COHERENT", c.malloc, 4096, gpu, MemFlag.EXT_COHERENT,
                         err=errno.EINVAL)
            expect_error("device flags for host memory", c.host_malloc, 4096, gpu, -1, MemFlag.HOST_VISIBLE,
                         err=errno.EINVAL)
            expect_error("bad managed flags", c.malloc_managed, 4096, MemFlag.UNCACHED, err=errno.EINVAL)
            expect_error("larger than the window", c.malloc, 65 * GiB, gpu, err=errno.ENOMEM)
            expect_error("a fixed address taken", c.host_malloc, 4096, gpu, fixed_addr=at, err=errno.EADDRINUSE)
            expect_error("a fixed address outside the window", c.host_malloc, 4096, gpu, fixed_addr=0x10000,
                         err=errno.EINVAL)
            expect_error("bad alignment", c.malloc, 4096, gpu, alignment=12345, err=errno.EINVAL)
            expect_error("a GPU twice in map_gpus", c.malloc, 4096, gpu, map_gpus=[gpu, gpu], err=errno.EINVAL)
            expect_error("65 GPUs to map on", c.malloc, 4096, gpu, map_gpus=list(range(1, 66)), err=errno.E2BIG)
            # freeing: the Allocation, then the same again, then by address
            h_va = host.va
            host.free()
            check(host.freed, "freed")
            expect_error("freeing twice", host.free, err=errno.EINVAL, reason="was not returned")
            expect_error("freeing an address twice", c.free, h_va, err=errno.EINVAL, reason="was not returned")
            expect_error("freeing an address nothing was allocated at", c.free, c.window[0] + 50 * GiB,
                         err=errno.EINVAL)
            expect_error("freeing inside an allocation", c.free, dev.va + 4096, err=errno.EINVAL)
            check(c.free(None) is None and c.free(0) is None, "freeing NULL does nothing, as in C")
            c.free(big.va)
            check(big.freed, "free by address marks the Allocation freed")
            # a freed Allocation whose address went to a newer one: its free() must not free that one
            again = c.host_malloc(4096, gpu, fixed_addr=h_va)
            expect_error("a stale Allocation's free", host.free, err=errno.EINVAL, reason="in use again")
            check(again.attributes().base == h_va, "the newer allocation is still there")
            with c.host_malloc(4096, gpu) as scoped:
                scoped_va = scoped.va
            check(scoped.freed, "the context manager frees")
            expect_error("the context manager's memory is gone", c.pointer_attributes, scoped_va, err=errno.ENOENT)
            with c.host_malloc(4096, gpu) as scoped:
                scoped.free()  # freed inside: the exit does not free again
            check(scoped.freed, "freed inside a with block")
            for alloc in (dev, managed, vis, fixed, peers, some, again):
                alloc.free()
            check(ctl_json(d.sock, "allocations", "--client", str(c.id))["allocations"] == [], "everything freed")
            other = gpumem.Client(d.sock)
            mine = c.host_malloc(4096, gpu)
            expect_raise("freeing another client's Allocation", ValueError, other.free, mine)
            other.close()
            mine.free()


def test_views(tmp):
    with daemon(tmp) as d:
        with gpumem.Client(d.sock) as c:
            gpu = gpu_ids(c)[0]
            size = 3 * MiB + 123
            a = c.host_malloc(size, gpu)
            v = a.view()
            check(isinstance(v, memoryview) and not v.readonly and v.nbytes == size and v.format == "B",
                  f"a writable byte view of the size asked ({v.nbytes}, {v.format}, readonly={v.readonly})")
            data = pattern(size, 3)
            v[:] = data
            check(ctypes.string_at(a.va, size) == data, "the view is the memory at the allocation's address")
            part = a.view(4096, 100)
            check(bytes(part) == data[4096:4196], "a view of part of it")
            part[:4] = b"\1\2\3\4"
            check(bytes(v[4096:4100]) == b"\1\2\3\4", "views of one allocation are the same memory")
            expect_raise("a view beyond the mapping", ValueError, a.view, 3 * MiB, 2 * MiB)
            check(len(a.view(a.attributes().size - 1, 1)) == 1, "the last byte the daemon mapped is in reach")
            # a buffer taken from a view keeps the memory: free refuses while it lives
            held = (ctypes.c_ubyte * 16).from_buffer(v)
            expect_raise("free while a view is exported", BufferError, a.free)
            check(not a.freed and a.attributes().base == a.va, "the memory stayed")
            check(bytes(held[:4]) == data[:4], "and is still readable through the buffer")
            del held
            a.free()
            check(a.freed, "freed once the buffer was gone")
            expect_raise("a view after free is released", ValueError, lambda: v[0])
            expect_raise("a part view after free is released", ValueError, lambda: part[0])
            # read-only memory gives a read-only view
            ro = c.host_malloc(4096, gpu, flags=MemFlag.READ_ONLY)
            rv = ro.view()
            check(rv.readonly and bytes(rv) == bytes(4096), "a read-only view of read-only host memory")
            expect_raise("writing a read-only view", TypeError, rv.__setitem__, 0, 1)
            ro.free()
            # managed and host-visible device memory
            m = c.malloc_managed(2 * MiB)
            mv = m.view()
            mv[-8:] = b"managed!"
            check(ctypes.string_at(m.va + 2 * MiB - 8, 8) == b"managed!", "managed memory through its view")
            hv = c.malloc(2 * MiB, gpu, MemFlag.HOST_VISIBLE)
            hvv = hv.view()
            hvv[:3] = b"vis"
            check(bytes(hv.view(0, 3)) == b"vis", "host-visible VRAM through its view")
            # the view keeps its allocation alive when nothing else refers to it
            va = hv.va
            del hv
            check(bytes(hvv[:3]) == b"vis" and c.pointer_attributes(va).base == va, "a view keeps its allocation")
            hvv.release()
            m.release_views()
            expect_raise("release_views releases them", ValueError, lambda: mv[0])
            # close releases what is left
            keep = c.host_malloc(4096, gpu)
            kv = keep.view()
        expect_raise("a view after the client closed is released", ValueError, lambda: kv[0])
        check(keep.freed, "closing marks the allocations freed")
        expect_raise("free after close", ValueError, keep.free)


# ---- queries ---------------------------------------------------------------------------------------------

def test_queries(tmp):
    with daemon(tmp) as d:
        with gpumem.Client(d.sock) as c:
            gpus = gpu_ids(c)
            gpu = gpus[0]
            before = c.mem_info(gpu)
            before_peer = c.mem_info(gpus[1])
            check(before.total == 192 * GiB and 0 < before.free <= before.total, f"mem_info ({before})")
            a = c.malloc(GiB, gpu)
            after = c.mem_info(gpu)
            check(after.total == before.total and before.free - after.free == GiB,
                  f"a 1 GiB allocation takes 1 GiB from free ({before.free - after.free})")
            check(c.mem_info(gpus[1]) == before_peer, "other GPUs are unchanged")
            expect_error("mem_info of GPU 0", c.mem_info, 0, err=errno.EINVAL)
            expect_error("mem_info of no GPU", c.mem_info, 4242, err=errno.ENODEV)
            inside = c.pointer_attributes(a.va + 12345)
            check(inside.base == a.va and inside.size == GiB and inside.kind == Kind.DEVICE, "a pointer inside")
            expect_error("outside the window", c.pointer_attributes, 0x1000, err=errno.EFAULT, reason="outside")
            expect_error("nothing allocated there", c.pointer_attributes, c.window[0] + 60 * GiB, err=errno.ENOENT,
                         reason="nothing is allocated")
            check(c.allocation_granularity(gpu) == 4096, "minimum granularity 4 KiB")
            check(c.allocation_granularity(gpu, recommended=True) == 2 * MiB, "recommended granularity 2 MiB")
            expect_error("granularity of no GPU", c.allocation_granularity, 4242, err=errno.ENODEV)
            p = c.allocation_properties(a)
            check(p == gpumem.AllocationProperties(Kind.DEVICE, gpu, GiB, MemFlag.NONE), f"properties ({p})")
            check(c.allocation_properties(a.handle) == p, "properties by the handle's value")
            expect_error("properties of no handle", c.allocation_properties, 12345, err=errno.ENOENT)
            a.free()


def test_managed(tmp):
    with daemon(tmp) as d:
        with gpumem.Client(d.sock) as c:
            gpus = gpu_ids(c)
            gpu, peer = gpus[0], gpus[1]
            size = 4 * MiB
            m = c.malloc_managed(size)
            got = dict(m.svm_get_attributes([SvmAttr.PREFERRED_LOC, SvmAttr.PREFETCH_LOC, SvmAttr.SET_FLAGS,
                                             SvmAttr.GRANULARITY]))
            check(got == {SvmAttr.PREFERRED_LOC: SVM_LOCATION_UNDEFINED, SvmAttr.PREFETCH_LOC: SVM_LOCATION_UNDEFINED,
                          SvmAttr.SET_FLAGS: SvmFlag.HOST_ACCESS | SvmFlag.COHERENT, SvmAttr.GRANULARITY: 9},
                  f"the driver's defaults ({got})")
            check(m.svm_get_attributes([(SvmAttr.ACCESS, gpu)]) == [(SvmAttr.NO_ACCESS, gpu)], "no GPU access yet")
            m.advise(Advice.SET_ACCESSED_BY, gpu)
            check(m.svm_get_attributes([(SvmAttr.ACCESS, gpu), (SvmAttr.ACCESS, peer)])
                  == [(SvmAttr.ACCESS_IN_PLACE, gpu), (SvmAttr.NO_ACCESS, peer)], "accessed-by maps in place")
            m.advise(Advice.UNSET_ACCESSED_BY, gpu)
            check(m.svm_get_attributes([(SvmAttr.ACCESS, gpu)]) == [(SvmAttr.ACCESS, gpu)], "unset: access remains")
            m.advise(Advice.SET_READ_MOSTLY)
            flags = dict(m.svm_get_attributes([SvmAttr.SET_FLAGS]))[SvmAttr.SET_FLAGS]
            check(flags & SvmFlag.GPU_READ_MOSTLY, f"read-mostly set ({flags:#x})")
            m.advise(Advice.SET_COARSE_GRAIN)
            flags = dict(m.svm_get_attributes([SvmAttr.SET_FLAGS]))[SvmAttr.SET_FLAGS]
            check(not flags & SvmFlag.COHERENT, f"coarse grain clears COHERENT ({flags:#x})")
            # the first half preferred on one GPU: the whole range then has no one preferred location
            c.advise(m.va, size // 2, Advice.SET_PREFERRED_LOCATION, peer)
            check(c.svm_get_attributes(m.va, size // 2, [SvmAttr.PREFERRED_LOC]) == [(SvmAttr.PREFERRED_LOC, peer)],
                  "the first half's preferred location")
            check(m.svm_get_attributes([SvmAttr.PREFERRED_LOC]) == [(SvmAttr.PREFERRED_LOC, SVM_LOCATION_UNDEFINED)],
                  "sub-ranges that differ read UNDEFINED")
            c.advise(m.va, size // 2, Advice.UNSET_PREFERRED_LOCATION, peer)
            m.prefetch(gpu)
            check(m.svm_get_attributes([SvmAttr.PREFETCH_LOC]) == [(SvmAttr.PREFETCH_LOC, gpu)], "prefetch to a GPU")
            c.prefetch(m.va, size, LOCATION_CPU)
            check(m.svm_get_attributes([SvmAttr.PREFETCH_LOC]) == [(SvmAttr.PREFETCH_LOC, LOCATION_CPU)],
                  "prefetch to the CPU")
            m.svm_set_attributes({SvmAttr.GRANULARITY: 4, SvmAttr.PREFERRED_LOC: LOCATION_CPU})
            check(dict(m.svm_get_attributes([SvmAttr.GRANULARITY, SvmAttr.PREFERRED_LOC]))
                  == {SvmAttr.GRANULARITY: 4, SvmAttr.PREFERRED_LOC: LOCATION_CPU}, "raw attributes set")
            c.svm_set_attributes(m.va, size, [(SvmAttr.SET_FLAGS, SvmFlag.GPU_EXEC)])
            flags = dict(m.svm_get_attributes([SvmAttr.SET_FLAGS]))[SvmAttr.SET_FLAGS]
            check(flags & SvmFlag.GPU_EXEC, "a flag set")
            # the data is untouched by all of it
            m.view()[:4] = b"abcd"
            m.advise(Advice.SET_READ_MOSTLY)
            check(bytes(m.view(0, 4)) == b"abcd", "data unchanged by advice")
            dev = c.malloc(2 * MiB, gpu)
            expect_error("advice on device memory", c.advise, dev.va, 2 * MiB, Advice.SET_READ_MOSTLY,
                         err=errno.EINVAL)
            expect_error("a size not page aligned", c.advise, m.va, 100, Advice.SET_READ_MOSTLY, err=errno.EINVAL)
            expect_error("size 0", c.prefetch, m.va, 0, gpu, err=errno.EINVAL)
            expect_error("unknown advice", m.advise, 77, err=errno.EINVAL, reason="unknown advice")
            expect_error("prefetch outside the window", c.prefetch, 0x10000, 4096, gpu, err=errno.EFAULT)
            expect_error("prefetch to no GPU", m.prefetch, 4242, err=errno.EINVAL)
            expect_error("33 attributes", m.svm_set_attributes, [(SvmAttr.GRANULARITY, 1)] * 33, err=errno.E2BIG)
            expect_error("no attribute", m.svm_set_attributes, [], err=errno.EINVAL)
            expect_error("ACCESS_IN_PLACE as a query", m.svm_get_attributes, [(SvmAttr.ACCESS_IN_PLACE, gpu)],
                         err=errno.EINVAL)
            expect_error("granularity over 63", m.svm_set_attributes, [(SvmAttr.GRANULARITY, 64)], err=errno.EINVAL)
            dev.free()
            m.free()


# ---- virtual memory management -----------------------------------------------------------------------

def test_vmm(tmp):
    with daemon(tmp) as d:
        with gpumem.Client(d.sock) as c:
            gpus = gpu_ids(c)
            gpu = gpus[0]
            chunk = c.allocation_granularity(gpu, recommended=True)
            res = c.address_reserve(4 * chunk)
            check(isinstance(res, gpumem.Reservation) and res.size == 4 * chunk and c.in_window(res.va, res.size)
                  and res.va % chunk == 0, f"a reservation ({res!r})")
            expect_error("nothing mapped in a reservation", c.pointer_attributes, res.va, err=errno.ENOENT)
            h = c.mem_create(chunk, gpu)
            check(isinstance(h, gpumem.MemHandle) and h.kind == Kind.VMM and h.size == chunk and h.handle != 0,
                  f"a VMM handle ({h!r})")
            check(h.properties() == gpumem.AllocationProperties(Kind.VMM, gpu, chunk, MemFlag.NONE),
                  f"its properties ({h.properties()})")
            m = res.map(h)
            check(isinstance(m, gpumem.Mapping) and m.va == res.va and m.size == chunk and m.handle == h.handle,
                  f"a mapping ({m!r})")
            check(m.get_access() == Access.NONE and m.get_access(gpu) == Access.NONE, "no access until granted")
            expect_raise("no view without CPU access", ValueError, m.view)
            m.set_access({gpu: Access.READ_WRITE, LOCATION_CPU: Access.READ_WRITE})
            check(m.get_access(gpu) == Access.READ_WRITE and c.get_access(m.va, LOCATION_CPU) == Access.READ_WRITE,
                  "access granted")
            a = c.pointer_attributes(m.va)
            check(a.kind == Kind.VMM and a.base == m.va and a.size == chunk and a.mapped_gpus == (gpu,)
                  and a.cpu_accessible and a.handle == h.handle, f"the mapping's attributes ({a})")
            v = m.view()
            check(not v.readonly and len(v) == chunk, "a writable view of the mapping")
            v[:5] = b"first"
            # the same handle at a second place: the same bytes
            m2 = c.mem_map(res.va + 2 * chunk, chunk, 0, h)
            c.set_access(m2.va, chunk, [(LOCATION_CPU, Access.READ)])
            v2 = m2.view()
            check(v2.readonly and bytes(v2[:5]) == b"first", "a second mapping shows the same memory, read-only")
            check(c.get_access(m2.va, gpu) == Access.NONE, "access is per mapping")
            # retain gives a new reference to the same handle: two releases are needed, a third is refused
            r = c.retain_allocation_handle(m.va)
            check(r.handle == h.handle and r.properties() == h.properties() and r.size == chunk
                  and r.kind == Kind.VMM, f"retained handle ({r!r})")
            r.release()
            check(h.properties().size == chunk, "one reference is left")
            h.release()
            expect_error("properties of a released handle", h.properties, err=errno.ENOENT)
            check(bytes(m.view(0, 5)) == b"first", "the memory lives on while mapped after release")
            expect_error("releasing once more", c.mem_release, h.handle, err=errno.ENOENT, reason="")
            again = c.retain_allocation_handle(m.va)
            check(again.handle == h.handle and again.properties().size == chunk,
                  "retain gives a reference back after every earlier one was released")
            again.release()
            # errors of the VMM calls
            expect_error("address_free while mapped", res.free, err=errno.EBUSY)
            expect_error("address_free with the wrong size", c.address_free, res.va, chunk, err=errno.EINVAL)
            expect_error("address_free of no reservation", c.address_free, c.window[0] + 60 * GiB, chunk,
                         err=errno.ENOENT)
            expect_error("reserve a size not of pages", c.address_reserve, 1000, err=errno.EINVAL)
            expect_error("reserve at a taken address", c.address_reserve, chunk, addr=res.va, err=errno.EADDRINUSE)
            expect_error("reserve with flags", c.address_reserve, chunk, flags=1, err=errno.EINVAL)
            expect_error("reserve more than the window", c.address_reserve, 65 * GiB, err=errno.ENOMEM)
            h3 = c.mem_create(chunk, gpu)
            expect_error("map over a mapping", c.mem_map, res.va, chunk, 0, h3, err=errno.EADDRINUSE)
            expect_error("map at an unaligned address", c.mem_map, res.va + chunk + 100, 4096, 0, h3,
                         err=errno.EINVAL)
            expect_error("map beyond the handle", c.mem_map, res.va + chunk, chunk, 4096, h3, err=errno.EINVAL)
            expect_error("map outside a reservation", c.mem_map, c.window[0] + 60 * GiB, chunk, 0, h3,
                         err=errno.EINVAL)
            expect_error("map no handle", c.mem_map, res.va + chunk, chunk, 0, 12345, err=errno.ENOENT)
            expect_error("bad access value", c.set_access, m.va, chunk, {gpu: 2}, err=errno.EINVAL)
            expect_error("no access descriptor", c.set_access, m.va, chunk, {}, err=errno.EINVAL)
            expect_error("access for no GPU", m.set_access, {4242: Access.READ}, err=errno.ENODEV)
            expect_error("get_access where nothing is mapped", c.get_access, res.va + chunk, gpu, err=errno.EINVAL)
            expect_error("retain where nothing is mapped", c.retain_allocation_handle, res.va + chunk,
                         err=errno.EINVAL)
            expect_error("mem_create on no GPU", c.mem_create, chunk, 4242, err=errno.ENODEV)
            expect_error("mem_create of no pages", c.mem_create, 100, gpu, err=errno.EINVAL)
            expect_error("unmap cutting a mapping", c.mem_unmap, m.va, 4096, err=errno.EINVAL)
            v = m.view()
            # revoking CPU access releases the views over the mapping first
            m2.set_access({LOCATION_CPU: Access.NONE})
            expect_raise("a view after CPU access was revoked", ValueError, lambda: v2[0])
            m2.unmap()
            m.unmap()
            expect_raise("a view after unmap", ValueError, lambda: v[0])
            res.free()
            expect_error("freeing a reservation twice", res.free, err=errno.ENOENT)
            # reservation at an exact address, and the with blocks
            with c.address_reserve(chunk, addr=res.va) as exact:
                check(exact.va == res.va, "a reservation at an exact address")
                with exact.map(h3) as mm:
                    mm.set_access({LOCATION_CPU: Access.READ_WRITE})
                    mm.view()[:2] = b"ok"
                expect_error("the with block unmaps", c.pointer_attributes, exact.va, err=errno.ENOENT)
            expect_error("the with block freed the reservation", c.address_free, res.va, chunk, err=errno.ENOENT)
            # map_handle: reserve, map and grant in one, undone on failure
            with c.map_handle(h3) as mh:
                check(mh.get_access() == Access.READ_WRITE and bytes(mh.view(0, 2)) == b"ok",
                      "map_handle maps for this process; the memory kept what was written")
                mh_va = mh.va
            expect_error("the reservation went with the mapping", c.address_free, mh_va, chunk, err=errno.ENOENT)
            expect_error("map_handle with a bad grant", h3.map, {4242: Access.READ}, err=errno.ENODEV)
            with h3.map({gpu: Access.READ_WRITE}) as gm:
                check(gm.get_access() == Access.NONE and gm.get_access(gpu) == Access.READ_WRITE, "a GPU-only map")
            h3.release()
            listed = ctl_json(d.sock, "allocations", "--client", str(c.id))["allocations"]
            check(listed == [], f"nothing left behind by the failed map_handle or the others ({listed})")


# ---- sharing ---------------------------------------------------------------------------------------------

def test_sharing(tmp):
    with daemon(tmp) as d:
        with gpumem.Client(d.sock, name="owner") as c, gpumem.Client(d.sock, name="peer") as peer:
            gpus = gpu_ids(c)
            gpu, other = gpus[0], gpus[-1]
            size = 2 * MiB
            a = c.host_malloc(size, gpu)
            v = a.view()
            data = pattern(size, 11)
            v[:] = data
            # a writable export: its mmap is the same pages, both ways
            e = a.export()
            check(isinstance(e, gpumem.Export) and e.size == size and not e.read_only and e.fileno() >= 0,
                  f"an export ({e!r})")
            mm = e.mmap()
            check(mm[:size] == data, "the export's mmap holds what the view wrote")
            mm[:4] = b"back"
            check(bytes(v[:4]) == b"back", "a write through the export's mmap shows in the view")
            mm.close()
            e.close()
            check(e.closed, "closed")
            expect_raise("fileno after close", ValueError, e.fileno)
            # a read-only export, imported by another client
            ro = a.export(read_only=True)
            check(ro.read_only, "a read-only export is an O_RDONLY fd")
            rmm = ro.mmap()
            check(memoryview(rmm).readonly, "its mmap is read-only")
            expect_raise("writing the read-only mmap", TypeError, rmm.__setitem__, 0, 1)
            rmm.close()
            imp = peer.import_fd(ro, other)
            check(imp.kind == Kind.IMPORT and imp.size == size and imp.gpu_id == other, f"an import ({imp!r})")
            p = imp.properties()
            check(p.kind == Kind.IMPORT and p.size == size and p.gpu_id == other and p.flags & MemFlag.READ_ONLY,
                  f"the import is read-only ({p})")
            expect_error("CPU read-write on a read-only import", imp.map, err=errno.EACCES, reason="read-only")
            expect_error("GPU read-write on a read-only import", imp.map, {other: Access.READ_WRITE},
                         err=errno.EACCES)
            m = imp.map({LOCATION_CPU: Access.READ, other: Access.READ})
            check(peer.in_window(m.va, m.size) and not c.in_window(m.va), "mapped in the importer's own window")
            iv = m.view()
            check(iv.readonly, "the read-only import's view is read-only")
            check(bytes(iv[:4]) == b"back" and bytes(iv[4:size]) == data[4:], "the importer sees the data")
            expect_raise("writing the read-only import's view", TypeError, iv.__setitem__, slice(0, 1), b"x")
            v[8:12] = b"more"
            check(bytes(iv[8:12]) == b"more", "the owner's writes show in the import")
            # the export stays read-only on re-export by the importer
            again = peer.export(imp)
            check(again.read_only, "a read-only import is exported read-only")
            again.close()
            m.unmap()
            imp.release()
            expect_error("releasing the import twice", imp.release, err=errno.ENOENT)
            ro.close()
            # exported read-only, the memory is sealed: no new writable mapping of it, by anyone
            expect_error("a read-write export after a read-only one", c.export, a, err=errno.EPERM,
                         reason="read-only before")
            v[12:16] = b"mine"
            check(bytes(v[12:16]) == b"mine", "the owner's view stays writable")
            # host-visible VRAM shared writable: the peer's writes reach the owner
            dv = c.malloc(size, gpu, MemFlag.HOST_VISIBLE)
            with dv.export() as de:
                with peer.import_fd(de.fileno(), other) as dimp, dimp.map() as dm:
                    dm.view()[:6] = b"vram!!"
                    check(bytes(dv.view(0, 6)) == b"vram!!", "the importer's writes reach the owner")
            # a VMM handle shared, through a detached fd
            h = c.mem_create(size, gpu)
            fd = h.export().detach()
            try:
                with peer.import_fd(fd) as vimp:
                    check(vimp.size == size and vimp.properties().gpu_id == gpus[0],
                          f"GPU 0 means the first GPU ({vimp.properties()})")
            finally:
                os.close(fd)
            h.release()
            # the exports are counted
            listed = {x["va"]: x for x in ctl_json(d.sock, "allocations", "--client", str(c.id))["allocations"]}
            check(listed.get(a.va, {}).get("exports") == 2, f"two exports of the host memory ({listed.get(a.va)})")
            # errors
            expect_error("export of no handle", c.export, 12345, err=errno.ENOENT)
            with open(os.devnull) as f:
                expect_error("import of a device file", peer.import_fd, f, err=errno.EINVAL)
            r, w = os.pipe()
            expect_error("import of a pipe", peer.import_fd, r, err=errno.EINVAL)
            os.close(r)
            os.close(w)
            expect_error("import on no GPU", peer.import_fd, a.export(read_only=True), 4242, err=errno.ENODEV)
            dv.free()
            a.free()


def test_named_shares(tmp):
    """A share published by name and opened by another client of this process: roles, revocation, listing."""
    conf = (f"[class everyone]\nmatch-uid = {UID}\nshare-publish = py/*\nshare-read = py/*\n"
            "share-write = py/rw\nadmin = yes\n")
    with daemon(tmp, config=conf) as d, gpumem.Client(d.sock, "publisher") as pub, \
            gpumem.Client(d.sock, "reader") as rd, gpumem.Admin(d.sock) as adm:
        gpu = pub.gpus()[0].gpu_id
        with pub.malloc(2 * MiB, gpu, gpumem.MemFlag.HOST_VISIBLE) as buf:
            buf.view()[:5] = b"hello"
            info = pub.share_publish(buf, "py/ro", read_only=True)
            check(info.name == "py/ro" and info.size == 2 * MiB and info.read_only and not info.persistent
                  and info.va != buf.va, f"published ({info})")
            expect_error("the memory published already", pub.share_publish, buf, "py/ro2", err=errno.EBUSY, reason="")
            expect_error("no right to the name", pub.share_publish, pub.malloc(4096, gpu), "other/x",
                         err=errno.EACCES, reason="share-publish")
            with rd.share_open("py/ro") as sh:
                check(sh.va == info.va and sh.size == 2 * MiB and sh.read_only, f"opened ({sh})")
                v = sh.view()
                check(bytes(v[:5]) == b"hello" and v.readonly, "the publisher's data, read-only")
                v.release()
                a = sh.attributes()
                check(a.kind == gpumem.Kind.SHARE and a.base == info.va, f"its attributes ({a})")
                expect_error("open twice", rd.share_open, "py/ro", err=errno.EBUSY, reason="open already")
                expect_error("read-write of a read-only share", rd.share_open, "py/ro", write=True,
                             err=errno.EACCES, reason="")
                listed = {s.name: s for s in adm.shares()}
                check(listed.get("py/ro") is not None and listed["py/ro"].readers == 1
                      and listed["py/ro"].owner_client_id == pub.id and listed["py/ro"].kind == gpumem.Kind.DEVICE,
                      f"the administrators' listing ({listed})")
                pub.share_revoke("py/ro")
                expect_error("a revoked share's handle", sh.attributes, err=errno.ESTALE, reason="revoked")
                check(bytes(sh.view()[:5]) == b"hello", "the CPU mapping stays until closed")
            check(adm.shares() == [], "no share left")
            expect_error("no such share", rd.share_open, "py/ro", err=errno.ENOENT, reason="no share named")


def test_share_across_processes(tmp):
    # the fd goes to another process over a Unix socket, as between containers
    child = r"""
import os, socket, sys
import gpumem
s = socket.socket(fileno=int(sys.argv[1]))
msg, fds, _, _ = socket.recv_fds(s, 16, 1)
with gpumem.Client(sys.argv[2], name="child") as c:
    with c.import_fd(fds[0]) as h, h.map({gpumem.LOCATION_CPU: gpumem.Access.READ}) as m:
        v = m.view()
        ok = v.readonly and bytes(v[:len(msg)]) == msg
        v.release()
os.close(fds[0])
s.send(b"ok" if ok else b"no")
"""
    with daemon(tmp) as d:
        with gpumem.Client(d.sock) as c:
            a = c.host_malloc(MiB, gpu_ids(c)[0])
            a.view()[:12] = b"across procs"
            parent, kid = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            p = subprocess.Popen([sys.executable, "-c", child, str(kid.fileno()), d.sock], pass_fds=[kid.fileno()])
            kid.close()
            with a.export(read_only=True) as e:
                socket.send_fds(parent, [b"across procs"], [e.fileno()])
            parent.settimeout(60)
            try:
                answer = parent.recv(16)
            except OSError as err:
                answer = repr(err).encode()
            check(answer == b"ok", f"another process imports the read-only fd and reads the data ({answer!r})")
            check(p.wait(timeout=60) == 0, "the child exits 0")
            parent.close()
            a.free()


# ---- threads -----------------------------------------------------------------------------------------

def test_threads(tmp):
    with daemon(tmp) as d:
        with gpumem.Client(d.sock) as c:
            gpu = gpu_ids(c)[0]
            problems = []
            start = threading.Barrier(4)

            def worker(i):
                start.wait()
                for k in range(20):
                    try:
                        a = c.host_malloc(4096 * (i + 1), gpu)
                        a.view()[:2] = bytes([i, k])
                        if bytes(a.view(0, 2)) != bytes([i, k]):
                            problems.append(f"thread {i}: data")
                        a.free()
                        # each thread's failure comes with its own reason
                        try:
                            c.malloc(4096, 10000 + i)
                        except gpumem.Error as e:
                            if e.errno != errno.ENODEV or str(10000 + i) not in e.reason:
                                problems.append(f"thread {i}: {e}")
                        else:
                            problems.append(f"thread {i}: no error")
                    except Exception as e:  # noqa: BLE001
                        problems.append(f"thread {i}: {e!r}")

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            check(not problems, f"four threads on one client ({problems[:5]})")
            # close waits for the calls in flight on another thread; that thread's next call is refused
            outcome = []

            def pinger():
                try:
                    while True:
                        c.ping()
                        outcome.append("ping")
                except ValueError:
                    outcome.append("closed")
                except Exception as e:  # noqa: BLE001
                    outcome.append(repr(e))

            slow = threading.Thread(target=pinger)
            slow.start()
            while not outcome:
                time.sleep(0.001)
        slow.join(60)
        check(c.closed and not slow.is_alive() and outcome[-1] == "closed" and set(outcome[:-1]) == {"ping"},
              f"close with calls in flight on another thread ({outcome[-3:]})")


# ---- administration ----------------------------------------------------------------------------------

def test_admin(tmp):
    with daemon(tmp) as d:
        with gpumem.Admin(d.sock, name="py-admin") as adm, gpumem.Client(d.sock, name="py-worker") as w:
            check(isinstance(adm, gpumem.Client), "an Admin is a Client")
            gpus = gpu_ids(w)
            dev = w.malloc(4 * MiB, gpus[1])
            host = w.host_malloc(5000, gpus[0])
            managed = w.malloc_managed(2 * MiB)
            res = w.address_reserve(2 * MiB)
            h = w.mem_create(2 * MiB, gpus[2])
            s = adm.status()
            ref = ctl_json(d.sock, "status")
            check(isinstance(s, gpumem.Status) and s.backend == "model" and s.preset == "mi300x" and s.gpus == 8
                  and s.server_version == w.server_version and s.protocol_version == 4
                  and (s.kfd_major, s.kfd_minor) == (1, 19) and s.pid == d.proc.pid, f"status ({s})")
            check(s.bytes_device == 4 * MiB + 2 * MiB and s.bytes_host == 8192 and s.bytes_managed == 2 * MiB,
                  f"bytes by kind ({s.bytes_device}, {s.bytes_host}, {s.bytes_managed})")
            check(s.has_model and s.model_vram_bytes == ref["model"]["vram_bytes"] and s.model_contexts >= 2,
                  f"the model's books ({s.model_vram_bytes}, {s.model_contexts})")
            check(s.clients == 2 and s.uptime_usec > 0 and s.started_usec > 1.6e15 and s.va_windows == 2,
                  f"two clients and the rest ({s.clients}, {s.va_windows})")
            clients = {x.client_id: x for x in adm.clients()}
            others = {x.name for i, x in clients.items() if i not in (adm.id, w.id)}
            check({adm.id, w.id} <= set(clients) and others <= {"gpumemctl"},
                  f"the test's clients, by id ({sorted(clients)}, others {others})")
            cw = clients.get(w.id)
            check(cw is not None and cw.name == "py-worker" and cw.pid == os.getpid() and cw.uid == UID
                  and cw.gid == os.getgid() and cw.class_name == "py" and cw.admin and cw.host_bytes == 8192
                  and cw.managed_bytes == 2 * MiB and cw.handles == 5 and cw.cgroup.startswith("/"),
                  f"the worker as administrators see it ({cw})")
            check(cw is not None and sorted((u.gpu_id, u.vram_bytes) for u in cw.usage)
                  == sorted([(gpus[1], 4 * MiB), (gpus[2], 2 * MiB)]), f"its VRAM per GPU ({cw and cw.usage})")
            check(clients[adm.id].name == "py-admin" and clients[adm.id].handles == 0, "the admin itself")
            allocs = adm.allocations(w.id)
            by_id = {x.id: x for x in allocs}
            check(len(allocs) == 5 and all(x.client_id == w.id for x in allocs), f"five objects ({allocs})")
            want = gpumem.AllocInfo(w.id, dev.handle, Kind.DEVICE, 4 * MiB, gpus[1], dev.va, (gpus[1],), 0)
            check(by_id.get(dev.handle) == want, f"the device memory ({by_id.get(dev.handle)})")
            x = by_id.get(host.handle)
            check(x is not None and x.kind == Kind.HOST and x.size == 8192 and x.va == host.va
                  and sorted(x.mapped_gpus) == sorted(gpus), f"the host memory, rounded to pages ({x})")
            x = by_id.get(managed.handle)
            check(x is not None and x.kind == Kind.MANAGED and x.size == 2 * MiB and x.mapped_gpus == (),
                  f"the managed memory ({x})")
            x = by_id.get(h.handle)
            check(x is not None and x.kind == Kind.VMM and x.size == 2 * MiB and x.gpu_id == gpus[2] and x.va == 0,
                  f"the VMM handle ({x})")
            x = [a for a in allocs if a.kind == Kind.RESERVATION]
            check(len(x) == 1 and x[0].va == res.va and x[0].size == 2 * MiB, f"the reservation ({x})")
            host.export().close()
            check({a.id: a.exports for a in adm.allocations(w.id)}.get(host.handle) == 1, "an export is counted")
            check(len(adm.allocations()) == 5, "every client's: the admin holds none")
            # page by page
            seen, cursor, pages = [], 0, 0
            while True:
                page, cursor = adm.allocations_page(w.id, 2, cursor)
                check(len(page) <= 2, f"a page holds at most the limit ({len(page)})")
                seen.extend(page)
                pages += 1
                if cursor == 0 or pages > 10:
                    break
            check(sorted(a.id for a in seen) == sorted(by_id) and pages == 3, f"pages of two ({pages})")
            expect_error("allocations of no client", adm.allocations, 99999, err=errno.ESRCH, reason="99999")
            # quotas: get, set, the over-quota error, restore
            qs = adm.quotas("py")
            check(all(isinstance(q, gpumem.Quota) and q.class_name == "py" for q in qs) and qs,
                  f"the class's quotas ({len(qs)})")
            check({q.resource for q in qs if q.gpu_id == 0} == set(Resource), "every resource listed")
            check(sorted(q.gpu_id for q in qs if q.resource == Resource.VRAM and q.gpu_id) == sorted(gpus),
                  "VRAM per GPU")
            hq = adm.quota("py", Resource.HOST)
            check(hq is not None and hq.limit == UNLIMITED and hq.used == 8192, f"host quota ({hq})")
            check(adm.quota("py", Resource.VRAM, gpus[1]).used == 4 * MiB, "per-GPU VRAM use")
            check(adm.quota("py", Resource.HANDLES).used == 5, "handles in use")
            everyone = adm.quotas()
            classes = {q.class_name for q in everyone}
            check(classes == ({"py", "guests"} if CAN_SETUID else {"py"}), f"every class's ({classes})")
            adm.set_quota("py", Resource.HOST, 4 * 4096)
            check(adm.quota("py", Resource.HOST).limit == 16384, "the new limit reads back")
            expect_error("over the host quota", w.host_malloc, 3 * 4096, gpus[0], err=errno.EDQUOT,
                         reason="host memory limit")
            small = w.host_malloc(2 * 4096, gpus[0])
            check(adm.quota("py", Resource.HOST).used == 16384, "what fits is allowed")
            expect_error("a limit below the use", adm.set_quota, "py", Resource.HOST, 4096, err=errno.EBUSY,
                         reason="force")
            adm.set_quota("py", Resource.HOST, 4096, force=True)
            check(adm.quota("py", Resource.HOST).limit == 4096, "forced below the use")
            adm.set_quota("py", Resource.HOST, UNLIMITED)
            check(adm.quota("py", Resource.HOST).limit == UNLIMITED, "unlimited again")
            adm.set_quota("py", Resource.VRAM, 5 * MiB, gpu=gpus[1])
            expect_error("over a per-GPU VRAM quota", w.malloc, 2 * MiB, gpus[1], err=errno.EDQUOT, reason="")
            w.malloc(2 * MiB, gpus[3]).free()  # another GPU is not limited
            adm.set_quota("py", Resource.VRAM, UNLIMITED, gpu=gpus[1])
            expect_error("quotas of no class", adm.quotas, "nope", err=errno.ENOENT)
            expect_error("set_quota of no class", adm.set_quota, "nope", Resource.HOST, 1, err=errno.ENOENT)
            expect_error("a per-GPU limit on host memory", adm.set_quota, "py", Resource.HOST, 1, gpu=gpus[0],
                         err=errno.EINVAL, reason="per-GPU")
            expect_error("an unknown resource", adm.set_quota, "py", 99, 1, err=errno.EINVAL)
            expect_error("a per-GPU limit of no GPU", adm.set_quota, "py", Resource.VRAM, 1, gpu=4242,
                         err=errno.ENODEV)
            expect_raise("a negative limit", ValueError, adm.set_quota, "py", Resource.HOST, -1)
            # metrics and the log level
            text = adm.metrics()
            check('gpumemd_up{backend="model"} 1' in text and "# TYPE" in text, "the metrics text")
            adm.set_log_level("debug")
            adm.set_log_level("warning")
            expect_error("an unknown log level", adm.set_log_level, "loud", err=errno.EINVAL, reason="loud")
            # disconnect: the victim learns why, and what it held is gone
            victim = gpumem.Client(d.sock, name="victim")
            victim.host_malloc(4096, gpus[0])
            adm.disconnect(victim.id)
            expect_error("a disconnected client's call", victim.ping, err=errno.ECONNABORTED,
                         reason="disconnected by an administrator")
            victim.close()
            for _ in range(200):
                if victim.id not in {x.client_id for x in adm.clients()}:
                    break
                time.sleep(0.02)
            check(victim.id not in {x.client_id for x in adm.clients()}, "the victim is gone")
            expect_error("disconnect no client", adm.disconnect, 99999, err=errno.ESRCH)
            expect_error("disconnect oneself", adm.disconnect, adm.id, err=errno.EINVAL)
            for a in (dev, host, managed, small):
                a.free()
            res.free()
            h.release()
            check(adm.allocations(w.id) == [], "the worker freed everything")
            # a client that is not an administrator gets EACCES and stays connected
            if CAN_SETUID and os.access(GUEST_PYTHON, os.X_OK):
                os.chmod(d.sock, 0o666)
                guest = ("import errno, sys, gpumem\n"
                         "with gpumem.Admin(sys.argv[1]) as a:\n"
                         "    try:\n"
                         "        a.status()\n"
                         "    except gpumem.Error as e:\n"
                         "        assert e.errno == errno.EACCES, e\n"
                         "        a.ping()\n"
                         "        print('refused', e.reason)\n")
                r = subprocess.run([GUEST_PYTHON, "-c", guest, d.sock], user=GUEST_UID, group=GUEST_UID,
                                   extra_groups=[], capture_output=True, text=True, timeout=60)
                check(r.returncode == 0 and r.stdout.startswith("refused"),
                      f"a guest's admin call is EACCES and it stays connected ({r.stdout!r} {r.stderr[-500:]!r})")
            else:
                print(f"  (not root, or no {GUEST_PYTHON}: the guest's EACCES is not checked)", file=sys.stderr)


# ---- the example -------------------------------------------------------------------------------------

def test_example(tmp):
    example = os.environ["GPUMEM_PY_EXAMPLE"]
    with daemon(tmp) as d:
        r = subprocess.run([sys.executable, example], env=dict(os.environ, GPUMEM_SOCKET=d.sock),
                           capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, f"the example exits 0 ({r.stdout!r} {r.stderr!r})")
        for line in ["connected to gpumemd", "GPU ", "filled it through a memoryview", "exported it read-only",
                     "the import holds the pattern and is read-only", "a write through the allocation shows",
                     "freed everything"]:
            check(line in r.stdout, f"the example says {line!r}")
        check(r.stdout.count("\nGPU ") == 8, "it lists the 8 GPUs")
        s = None
        for _ in range(200):
            s = ctl_json(d.sock, "status")
            if s and s["clients"] == 1 and s["allocations"] == 0:
                break
            time.sleep(0.02)
        check(s is not None and s["allocations"] == 0 and s["bytes"] == {"device": 0, "host": 0, "managed": 0},
              f"the example leaves nothing behind ({s})")
    r = subprocess.run([sys.executable, example], env=dict(os.environ, GPUMEM_SOCKET=os.path.join(tmp, "none.sock")),
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "cannot connect" in r.stderr and "No such file or directory" in r.stderr,
          f"without a daemon the example fails with a reason ({r.stderr!r})")


faulthandler.enable()  # a crash in C says where it happened
run_tests([
    ("struct layouts match the C compiler's", test_layout),
    ("the library is loaded by soname or from $GPUMEM_CLIENT_LIBRARY", test_loading),
    ("errors and argument checks", test_errors_and_arguments),
    ("connect, session facts, close", test_connection),
    ("a daemon that admits no class of ours: the reason", test_no_class),
    ("topology, topology files, tile config", test_topology),
    ("device, host and managed memory, peer mapping, free", test_allocations),
    ("memoryviews of CPU-visible memory", test_views),
    ("queries: mem info, pointer attributes, granularity, properties", test_queries),
    ("managed memory: advice, prefetch, SVM attributes", test_managed),
    ("VMM: reserve, create, map, access, retain, release", test_vmm),
    ("sharing: export, read-only export, import", test_sharing),
    ("sharing with another process over SCM_RIGHTS", test_share_across_processes),
    ("named shares: publish, open read-only, revoke, list", test_named_shares),
    ("threads on one client", test_threads),
    ("administration: status, clients, allocations, quotas, disconnect, metrics, log level", test_admin),
    ("the example program", test_example),
])
