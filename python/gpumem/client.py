"""gpumem.Client: a connection to gpumemd with every memory call of libgpumem_client, and the objects they return."""
import ctypes
import errno
import fcntl
import gc
import mmap
import os
import sys
import threading
import weakref
from ctypes import POINTER, byref, c_int, c_size_t, c_uint32, c_uint64, c_void_p

from . import _lib
from .constants import (DEFAULT_SOCKET, EXPORT_READ_ONLY, GRANULARITY_MINIMUM, GRANULARITY_RECOMMENDED,
                        LOCATION_CPU, SHARE_READ_ONLY, SHARE_WRITE, Access, Kind, MemFlag, SvmAttr, as_enum)
from .errors import Error, int_arg, reason_of, size_arg, str_arg, u32_arg, u64_arg
from .records import (AllocationProperties, MemInfo, PointerAttributes, ShareInfo, TileConfig, Topology,
                      TopologyNode)

__all__ = ["Client", "Allocation", "Reservation", "MemHandle", "Mapping", "Export"]

PAGE_SIZE = 4096
"""The daemon rounds allocation sizes up to this, and VMM sizes, offsets and addresses are multiples of it."""


def _round_up(n, to=PAGE_SIZE):
    """@n rounded up to a multiple of @to."""
    return (n + to - 1) // to * to


def _addr(ptr, what="ptr"):
    """An address argument: an int, or an object of this module that has one (its ``va``)."""
    if isinstance(ptr, (_Memory, Reservation)):
        return ptr.va
    return u64_arg(ptr, what)


def _handle_of(h, what="handle"):
    """A gm_handle argument: an int, or a MemHandle or Allocation (its ``handle``)."""
    if isinstance(h, (MemHandle, Allocation)):
        return h.handle
    return u64_arg(h, what)


def _fd_of(fd):
    """An fd argument: a non-negative int or anything with fileno() (an Export, a socket, a file)."""
    if hasattr(fd, "fileno") and not isinstance(fd, int):
        fd = fd.fileno()
    if isinstance(fd, bool) or not isinstance(fd, int):
        raise TypeError(f"fd must be an int or have fileno(), not {type(fd).__name__}")
    if fd < 0:
        raise ValueError(f"fd must not be negative: {fd}")
    return fd


def _access_descs(access):
    """{location: Access} or (location, Access) pairs as a gm_access_desc array, with its length."""
    pairs = list(access.items()) if isinstance(access, dict) else list(access)
    arr = (_lib.gm_access_desc * len(pairs))()
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"access entries are (location, access) pairs, not {pair!r}")
        arr[i].gpu_id = u32_arg(pair[0], "location")
        arr[i].access = int_arg(pair[1], "access")
    return arr, len(pairs), any(pair[0] == LOCATION_CPU for pair in pairs)


def _svm_attrs(attrs):
    """(type, value) pairs as a gm_svm_attr array, with its length."""
    pairs = list(attrs.items()) if isinstance(attrs, dict) else list(attrs)
    arr = (_lib.gm_svm_attr * len(pairs))()
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"SVM attributes are (type, value) pairs, not {pair!r}")
        arr[i].type = u32_arg(pair[0], "attribute type")
        arr[i].value = u32_arg(pair[1], "attribute value")
    return arr, len(pairs)


def _gpu_list(gpus, what="gpus"):
    """An iterable of GPU ids as a uint32_t array (None for an empty one), with its length."""
    ids = [u32_arg(g, what) for g in gpus]
    return ((c_uint32 * len(ids))(*ids) if ids else None), len(ids)


class _Views:
    """The memoryviews handed out over one piece of memory, so that the memory does not go while one is in use.

    Each view is made over a ctypes array at the memory's address. Every buffer derived from a view (a slice,
    memoryview(view), ctypes from_buffer, an array of another library) keeps that array referenced, and
    drops the reference when it is released or collected: the array's reference count is what says that
    something still reaches the memory, whichever way the buffer was passed on.
    """

    def __init__(self):
        self._arrays = []  # the exporters, one per view()
        self._views = []  # weak references to the views themselves, released first

    def _in_use(self, i):
        # references: this list's and the argument's; any more is a buffer that reaches the memory
        return sys.getrefcount(self._arrays[i]) > 2

    def make(self, owner, addr, length, writable):
        """A memoryview of @length bytes at @addr; read-only unless @writable. It keeps @owner alive."""
        self._arrays = [self._arrays[i] for i in range(len(self._arrays)) if self._in_use(i)]
        self._views = [r for r in self._views if r() is not None]
        arr = (ctypes.c_ubyte * length).from_address(addr)
        # the memory goes when its owner is freed or its client closed: while a view exists, neither may be
        # collected behind its back
        arr._gpumem_owner = owner
        with memoryview(arr) as raw:
            view = raw.cast("B")
        if not writable:
            ro = view.toreadonly()
            view.release()
            view = ro
        self._arrays.append(arr)
        self._views.append(weakref.ref(view))
        return view

    def _release_views(self):
        for r in self._views:
            v = r()
            if v is not None:
                try:
                    v.release()
                except BufferError:  # something holds a buffer of it: counted below
                    pass

    def busy(self):
        """How many views still have users, after the views handed out were released."""
        self._release_views()
        n = sum(1 for i in range(len(self._arrays)) if self._in_use(i))
        if n:
            gc.collect()  # buffers that are garbage in a reference cycle do not count
            n = sum(1 for i in range(len(self._arrays)) if self._in_use(i))
        return n

    def release(self, force=False):
        """Release every view before the memory goes. While a buffer taken from a view is still in use the
        memory must stay: BufferError, unless @force (the client is closing: such buffers become invalid)."""
        n = self.busy() if (self._arrays or self._views) else 0
        if n and not force:
            raise BufferError(f"{n} view(s) of the memory at {self._arrays[0]._gpumem_owner.va:#x} are still in "
                              "use (a buffer taken from a view is alive): release them first")
        self._arrays = []
        self._views = []


class Client:
    """A connection to gpumemd (gm_client_open_with), and every memory call of libgpumem_client on it.

    ``socket``: the daemon's socket (None: $GPUMEM_SOCKET, else /run/gpumemd/gpumemd.sock); ``name``: a label
    administrators see; ``window_size``: a VA window smaller than the daemon's default (a multiple of 2 MiB,
    0 for the default); ``low_window``: a window below 1 TiB. A Client is a context manager that closes it;
    it may be used by several threads at once, but only in the process that connected it (not after fork()).
    Failed calls raise gpumem.Error; a call on a closed client raises ValueError.
    """

    def __init__(self, socket=None, name=None, *, window_size=0, low_window=False):
        self._lib = _lib.get()
        path = str_arg(socket, "socket", allow_none=True, path=True)
        label = str_arg(name, "name", allow_none=True)
        opts = _lib.gm_client_options(struct_size=ctypes.sizeof(_lib.gm_client_options), socket_path=path,
                                      name=label, window_size=u64_arg(window_size, "window_size"),
                                      low_window=bool(low_window))
        handle = c_void_p()
        errbuf = ctypes.create_string_buffer(_lib.ERRBUF_SIZE)
        r = self._lib.gm_client_open_with(byref(opts), byref(handle), errbuf, len(errbuf))
        if r < 0:
            where = os.fsdecode(path) if path else (os.environ.get("GPUMEM_SOCKET") or DEFAULT_SOCKET)
            err = Error(-r, reason_of(-r, errbuf.value.decode(errors="replace")), "gm_client_open_with")
            err.filename = where
            raise err
        self._c = handle
        self._close_at_exit = weakref.finalize(self, self._lib.gm_client_close, handle)
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._busy = 0
        self._allocs = {}  # va -> Allocation not yet freed, for free() by address and double frees
        self._mems = weakref.WeakSet()  # objects that may have handed out views
        self.name = name
        """The label given at connect."""
        self._id = self._lib.gm_client_id(handle)
        base, size = c_uint64(), c_uint64()
        self._lib.gm_client_window(handle, byref(base), byref(size))
        self._window = (base.value, size.value)
        major, minor = c_uint32(), c_uint32()
        self._lib.gm_client_kfd_version(handle, byref(major), byref(minor))
        self._kfd = (major.value, minor.value)
        # the strings live while the client is open: copied now
        self._server_version = (self._lib.gm_client_server_version(handle) or b"").decode()
        self._backend = (self._lib.gm_client_backend(handle) or b"").decode()
        self._protocol = self._lib.gm_client_protocol_version(handle)

    # ---- the connection ----------------------------------------------------------------------------------

    def _enter(self):
        with self._cond:
            if self._c is None:
                raise ValueError("the gpumem client is closed")
            if os.getpid() != self._pid:
                # its connection and window are the parent's: a child connects a client of its own
                raise ValueError("a gpumem client belongs to the process that connected it (this is a fork)")
            self._busy += 1
            return self._c

    def _leave(self):
        with self._cond:
            self._busy -= 1
            if self._busy == 0:
                self._cond.notify_all()

    def _error(self, c, call, r):
        # the reason is the calling thread's latest on this client: asked for before anything else runs here
        buf = ctypes.create_string_buffer(_lib.ERRBUF_SIZE)
        self._lib.gm_strerror(c, r, buf, len(buf))
        return Error(-r, reason_of(-r, buf.value.decode(errors="replace")), call)

    def _call(self, name, *args):
        """Call @name(client, *args); a negative return becomes gpumem.Error with the library's reason."""
        c = self._enter()
        try:
            r = getattr(self._lib, name)(c, *args)
            if r < 0:
                raise self._error(c, name, r)
            return r
        finally:
            self._leave()

    def close(self):
        """Close the connection (gm_client_close): the daemon frees everything this client held and the VA
        window goes from this process. Views still in use become invalid. Closing twice does nothing."""
        with self._cond:
            c, self._c = self._c, None
            if c is None:
                return
            while self._busy:
                self._cond.wait()
        for m in list(self._mems):
            m._views.release(force=True)
        for a in self._allocs.values():
            a._freed = True
        self._allocs.clear()
        self._close_at_exit()

    @property
    def closed(self):
        """True once close() was called."""
        return self._c is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else f"id={self._id} window={self._window[0]:#x}+{self._window[1]:#x}"
        return f"<gpumem.Client {state}>"

    @property
    def id(self):
        """The client id administrators see (gm_client_id)."""
        return self._id

    @property
    def window(self):
        """(base, size) of this client's VA window, where every address it gets lies (gm_client_window)."""
        return self._window

    @property
    def server_version(self):
        """The daemon's version string (gm_client_server_version)."""
        return self._server_version

    @property
    def backend(self):
        """The daemon's backend, "kfd" or "model" (gm_client_backend)."""
        return self._backend

    @property
    def kfd_version(self):
        """(major, minor) of the KFD ABI the daemon drives (gm_client_kfd_version)."""
        return self._kfd

    @property
    def protocol_version(self):
        """The protocol version agreed at connect (gm_client_protocol_version)."""
        return self._protocol

    def in_window(self, va, size=1):
        """Whether [va, va + size) lies inside this client's VA window."""
        base, length = self._window
        return base <= va and va + size <= base + length

    def ping(self):
        """A round trip that does nothing (gm_ping)."""
        self._call("gm_ping")

    # ---- topology ----------------------------------------------------------------------------------------

    def topology(self, with_properties=False):
        """The node topology (gm_topology_get) as a Topology; @with_properties adds every raw sysfs property."""
        t = POINTER(_lib.gm_topology)()
        self._call("gm_topology_get", bool(with_properties), byref(t))
        try:
            top = t.contents
            return Topology(top.generation_id, tuple(TopologyNode.from_c(top.nodes[i]) for i in range(top.n_nodes)))
        finally:
            self._lib.gm_topology_free(t)

    def gpus(self):
        """The GPU nodes of the topology, in order (a tuple of TopologyNode)."""
        return self.topology().gpus

    def topology_files(self):
        """The KFD sysfs topology file by file (gm_topology_files): {relative path: content bytes}."""
        files = POINTER(_lib.gm_topology_file)()
        n = c_size_t()
        self._call("gm_topology_files", byref(files), byref(n))
        try:
            out = {}
            for i in range(n.value):
                f = files[i]
                out[(f.path or b"").decode(errors="backslashreplace")] = (
                    ctypes.string_at(f.content, f.len) if f.len else b"")
            return out
        finally:
            self._lib.gm_topology_files_free(files, n.value)

    def tile_config(self, gpu):
        """A GPU's tiling configuration (gm_tile_config_get) as a TileConfig."""
        t = _lib.gm_tile_config()
        self._call("gm_tile_config_get", u32_arg(gpu, "gpu"), byref(t))
        return TileConfig(t.gb_addr_config, t.num_banks, t.num_ranks, tuple(t.tile[:min(t.n_tile, 32)]),
                          tuple(t.macro[:min(t.n_macro, 16)]))

    # ---- device, host and managed memory -----------------------------------------------------------------

    def _malloc(self, kind, size, gpu, flags, numa_node, alignment, fixed_addr, map_gpus):
        d = _lib.gm_alloc_desc(kind=kind, size=size_arg(size), gpu_id=u32_arg(gpu, "gpu"),
                               flags=u32_arg(flags, "flags"), numa_node=int_arg(numa_node, "numa_node"),
                               alignment=size_arg(alignment, "alignment"),
                               fixed_addr=_addr(fixed_addr, "fixed_addr") if fixed_addr is not None else None)
        keep = None
        if map_gpus is not None:
            keep, n = _gpu_list(map_gpus, "map_gpus")
            d.map_gpus = ctypes.cast(keep, POINTER(c_uint32)) if keep is not None else None
            d.n_map_gpus = n
        p = c_void_p()
        self._call("gm_malloc_desc", byref(d), byref(p))
        a = Allocation(self, p.value, size, Kind(kind), gpu, MemFlag(flags))
        with self._cond:
            self._allocs[a.va] = a
        return a

    def malloc(self, size, gpu, flags=0, *, alignment=0, fixed_addr=None, map_gpus=None):
        """Device memory on GPU @gpu (gm_malloc / gm_malloc_desc) as an Allocation.

        @flags: MemFlag (HOST_VISIBLE maps it into this process too); @alignment: 0 (by size) or a power of
        two >= 4 KiB; @fixed_addr: an address in the window to place it at; @map_gpus: the GPUs to map it on
        at once (default: @gpu).
        """
        return self._malloc(Kind.DEVICE, size, gpu, flags, -1, alignment, fixed_addr, map_gpus)

    def host_malloc(self, size, gpu=0, numa_node=-1, flags=0, *, alignment=0, fixed_addr=None, map_gpus=None):
        """Pinned host memory, mapped on every GPU (or @map_gpus) and into this process (gm_host_malloc), as an
        Allocation; placed on @numa_node or, when -1, on the node nearest @gpu (0: the first GPU)."""
        return self._malloc(Kind.HOST, size, gpu, flags, numa_node, alignment, fixed_addr, map_gpus)

    def malloc_managed(self, size, flags=0, *, alignment=0, fixed_addr=None):
        """Managed memory, one pointer for the CPU and every GPU steered by SVM attributes
        (gm_malloc_managed), as an Allocation."""
        return self._malloc(Kind.MANAGED, size, 0, flags, -1, alignment, fixed_addr, None)

    def _invalidate(self, va, size):
        """Release the views over [va, va + size) before a call takes that memory from this process."""
        for m in list(self._mems):
            if m.va < va + size and va < m.va + m._span:
                m._views.release()

    def free(self, ptr):
        """Free memory from malloc, host_malloc or malloc_managed (gm_mem_free), given as its Allocation or its
        address. None or 0 does nothing, as in C. Its views must no longer be exported (BufferError)."""
        if isinstance(ptr, Allocation):
            if ptr._client is not self:
                raise ValueError("the allocation belongs to another client")
            ptr.free()
            return
        if ptr is None:
            return
        va = _addr(ptr)
        if va == 0:
            return
        self._free_va(va)

    def _free_va(self, va):
        a = self._allocs.get(va)
        if a is not None:
            a._views.release()
        self._call("gm_mem_free", va)
        with self._cond:
            a = self._allocs.pop(va, None)
        if a is not None:
            a._freed = True

    def map_gpus(self, ptr, gpus):
        """Map an allocation on more GPUs (gm_mem_map_gpus); @ptr: the Allocation or its base address."""
        arr, n = _gpu_list(gpus)
        self._call("gm_mem_map_gpus", _addr(ptr), arr, n)

    def unmap_gpus(self, ptr, gpus=()):
        """Unmap an allocation from @gpus, or from every GPU when @gpus is empty (gm_mem_unmap_gpus)."""
        arr, n = _gpu_list(gpus)
        self._call("gm_mem_unmap_gpus", _addr(ptr), arr, n)

    # ---- queries -----------------------------------------------------------------------------------------

    def mem_info(self, gpu):
        """Free and total VRAM of @gpu as this client's class allows it (gm_mem_get_info), as a MemInfo."""
        free, total = c_size_t(), c_size_t()
        self._call("gm_mem_get_info", u32_arg(gpu, "gpu"), byref(free), byref(total))
        return MemInfo(free.value, total.value)

    def pointer_attributes(self, ptr):
        """What lies at @ptr, which may point inside an allocation (gm_pointer_get_attributes), as
        PointerAttributes."""
        a = _lib.gm_pointer_attributes(struct_size=ctypes.sizeof(_lib.gm_pointer_attributes))
        self._call("gm_pointer_get_attributes", _addr(ptr), byref(a))
        n = min(a.n_mapped_gpus, len(a.mapped_gpus))
        return PointerAttributes(a.handle, as_enum(Kind, a.kind), a.gpu_id, a.base or 0, a.size, MemFlag(a.flags),
                                 bool(a.cpu_accessible), tuple(a.mapped_gpus[:n]))

    def allocation_granularity(self, gpu, recommended=False):
        """The VMM granularity of @gpu in bytes: the minimum, or the recommended one
        (gm_mem_get_allocation_granularity)."""
        g = c_size_t()
        option = GRANULARITY_RECOMMENDED if recommended else GRANULARITY_MINIMUM
        self._call("gm_mem_get_allocation_granularity", u32_arg(gpu, "gpu"), option, byref(g))
        return g.value

    def allocation_properties(self, handle):
        """What a handle is (gm_mem_get_allocation_properties), as AllocationProperties; @handle: an int, a
        MemHandle or an Allocation."""
        p = _lib.gm_allocation_prop(struct_size=ctypes.sizeof(_lib.gm_allocation_prop))
        self._call("gm_mem_get_allocation_properties", _handle_of(handle), byref(p))
        return AllocationProperties(as_enum(Kind, p.kind), p.gpu_id, p.size, MemFlag(p.flags))

    # ---- managed-memory attributes -----------------------------------------------------------------------

    def advise(self, ptr, size, advice, location=LOCATION_CPU):
        """hipMemAdvise on [ptr, ptr + size) of managed memory (gm_mem_advise); @advice an Advice, @location a
        GPU id or gpumem.LOCATION_CPU."""
        self._call("gm_mem_advise", _addr(ptr), size_arg(size), int_arg(advice, "advice"),
                   u32_arg(location, "location"))

    def prefetch(self, ptr, size, location):
        """Set the prefetch location of [ptr, ptr + size) of managed memory (gm_mem_prefetch)."""
        self._call("gm_mem_prefetch", _addr(ptr), size_arg(size), u32_arg(location, "location"))

    def svm_set_attributes(self, ptr, size, attrs):
        """Set raw SVM attributes on [ptr, ptr + size) (gm_svm_set_attributes); @attrs: (SvmAttr, value) pairs
        or a dict."""
        arr, n = _svm_attrs(attrs)
        self._call("gm_svm_set_attributes", _addr(ptr), size_arg(size), arr, n)

    def svm_get_attributes(self, ptr, size, attrs):
        """Query SVM attributes of [ptr, ptr + size) (gm_svm_get_attributes): @attrs are (SvmAttr, value) pairs
        (the value matters for ACCESS: the GPU asked about) or bare types; returns (type, value) pairs."""
        attrs = [(a, 0) if not isinstance(a, (tuple, list)) else a for a in attrs]
        arr, n = _svm_attrs(attrs)
        self._call("gm_svm_get_attributes", _addr(ptr), size_arg(size), arr, n)
        return [(as_enum(SvmAttr, arr[i].type), arr[i].value) for i in range(n)]

    # ---- virtual memory management -----------------------------------------------------------------------

    def address_reserve(self, size, alignment=0, addr=None, flags=0):
        """Reserve VA in the window with nothing behind it (gm_mem_address_reserve), as a Reservation; @addr asks
        for exactly that address."""
        p = c_void_p()
        size = size_arg(size)
        self._call("gm_mem_address_reserve", size, size_arg(alignment, "alignment"),
                   _addr(addr, "addr") if addr is not None else None, u64_arg(flags, "flags"), byref(p))
        return Reservation(self, p.value, size)

    def address_free(self, ptr, size):
        """Give back a whole reservation by its start and size (gm_mem_address_free)."""
        self._call("gm_mem_address_free", _addr(ptr), size_arg(size))

    def mem_create(self, size, gpu, flags=0):
        """Physical memory on @gpu with no address (gm_mem_create), as a MemHandle."""
        h = c_uint64()
        size = size_arg(size)
        self._call("gm_mem_create", size, u32_arg(gpu, "gpu"), u32_arg(flags, "flags"), byref(h))
        return MemHandle(self, h.value, size, Kind.VMM, gpu)

    def mem_release(self, handle):
        """Drop a reference to a VMM handle or import (gm_mem_release); the memory lives on while mapped."""
        self._call("gm_mem_release", _handle_of(handle))

    def mem_map(self, ptr, size, offset, handle):
        """Bind [offset, offset + size) of @handle at @ptr inside a reservation (gm_mem_map), as a Mapping. No one
        may access it until set_access grants it."""
        va, size, h = _addr(ptr), size_arg(size), _handle_of(handle)
        self._call("gm_mem_map", va, size, size_arg(offset, "offset"), h)
        return Mapping(self, va, size, h)

    def mem_unmap(self, ptr, size):
        """Remove the whole mappings in [ptr, ptr + size) (gm_mem_unmap). Views over them must no longer be
        exported (BufferError)."""
        va, size = _addr(ptr), size_arg(size)
        self._invalidate(va, size)
        self._call("gm_mem_unmap", va, size)

    def set_access(self, ptr, size, access):
        """Grant or revoke access to the mappings in [ptr, ptr + size) (gm_mem_set_access); @access:
        {location: Access} or (location, Access) pairs, location a GPU id or gpumem.LOCATION_CPU (which maps
        the memory into this process)."""
        va, size = _addr(ptr), size_arg(size)
        arr, n, cpu = _access_descs(access)
        if cpu:  # the CPU mapping is replaced or removed: views over it would outlive it
            self._invalidate(va, size)
        self._call("gm_mem_set_access", va, size, arr, n)

    def get_access(self, ptr, location=LOCATION_CPU):
        """The Access of @location (a GPU id or gpumem.LOCATION_CPU) to the mapping at @ptr (gm_mem_get_access)."""
        a = c_int()
        self._call("gm_mem_get_access", _addr(ptr), u32_arg(location, "location"), byref(a))
        return as_enum(Access, a.value)

    def retain_allocation_handle(self, ptr):
        """The handle mapped at @ptr with a new reference (gm_mem_retain_allocation_handle), as a MemHandle."""
        h = c_uint64()
        self._call("gm_mem_retain_allocation_handle", _addr(ptr), byref(h))
        props = self.allocation_properties(h.value)
        return MemHandle(self, h.value, props.size, props.kind, props.gpu_id)

    def map_handle(self, handle, size=None, offset=0, access=None):
        """Give a VMM handle or an import an address: reserve VA, map [offset, offset + size) of it there and
        grant @access ({location: Access}; default: this process read-write). Returns a Mapping that owns
        its reservation: unmap() gives both back. What was done is undone when a step fails."""
        h = _handle_of(handle)
        if size is None:
            if not isinstance(handle, MemHandle):
                raise TypeError("size is needed unless handle is a MemHandle")
            size = handle.size - size_arg(offset, "offset")
        if access is None:
            access = {LOCATION_CPU: Access.READ_WRITE}
        res = self.address_reserve(size)
        try:
            m = self.mem_map(res.va, size, offset, h)
        except BaseException:
            res.free()
            raise
        m._reservation = res
        try:
            if access:
                m.set_access(access)
        except BaseException:
            m.unmap()
            raise
        return m

    # ---- sharing -----------------------------------------------------------------------------------------

    def export(self, handle, read_only=False):
        """An fd for an allocation or a VMM handle (gm_mem_export_flags), as an Export the caller owns; with
        @read_only the fd and every import of it may only read the memory."""
        fd, size = c_int(), c_size_t()
        self._call("gm_mem_export_flags", _handle_of(handle), EXPORT_READ_ONLY if read_only else 0, byref(fd),
                   byref(size))
        return Export(fd.value, size.value)

    def import_fd(self, fd, gpu=0):
        """Import an fd (borrowed: the caller still closes it) on @gpu (0: the first GPU) as a MemHandle to map
        (gm_mem_import); @fd: an int, an Export, or anything with fileno()."""
        h, size = c_uint64(), c_size_t()
        self._call("gm_mem_import", _fd_of(fd), u32_arg(gpu, "gpu"), byref(h), byref(size))
        return MemHandle(self, h.value, size.value, Kind.IMPORT, gpu)


    # ---- named shares (protocol 3) -----------------------------------------------------------------------

    def share_publish(self, handle, name, read_only=False):
        """Publish the memory of @handle (an Allocation, a MemHandle of VMM memory, or a handle) as @name
        (gm_share_publish); with @read_only every reader only reads. Returns its ShareInfo: ``va`` is where
        every reader finds it, ``persistent`` whether it outlives this handle (the class's share-persistent)."""
        info = _lib.gm_share_info()
        self._call("gm_share_publish", _handle_of(handle), str_arg(name, "name"), SHARE_READ_ONLY if read_only else 0,
                   byref(info))
        return ShareInfo.from_c(info)

    def share_open(self, name, write=False, gpus=()):
        """Open the share @name (gm_share_open), read-only or, with @write, read-write, mapped on @gpus (none:
        every GPU the class may use) and in this process at the share's address. Returns a Share."""
        ids = [u32_arg(g, "gpu") for g in gpus]
        arr = (c_uint32 * max(len(ids), 1))(*ids)
        ptr, size, h = c_void_p(), c_size_t(), c_uint64()
        self._call("gm_share_open", str_arg(name, "name"), SHARE_WRITE if write else 0, arr, len(ids), byref(ptr),
                   byref(size), byref(h))
        return Share(self, name, ptr.value, size.value, h.value, not write)

    def share_revoke(self, name):
        """End the share @name now (gm_share_revoke): readers lose their GPU mappings; their CPU mappings stay
        until they close it."""
        self._call("gm_share_revoke", str_arg(name, "name"))


class _Memory:
    """Memory with an address in a client's window that this process may be able to touch."""

    def __init__(self, client, va, size, span):
        self._client = client
        self.va = va
        """The address: the same in this process, the daemon and every GPU."""
        self.size = size
        """The size in bytes."""
        self._span = span  # what the daemon holds (sizes are rounded up to pages)
        self._views = _Views()
        client._mems.add(self)

    @property
    def client(self):
        """The Client this memory belongs to."""
        return self._client

    def _view(self, offset, length, limit, writable):
        offset = size_arg(offset, "offset")
        length = max(self.size - offset, 0) if length is None else size_arg(length, "length")
        if offset + length > limit:
            raise ValueError(f"view [{offset}, {offset + length}) goes beyond the {limit} bytes mapped")
        return self._views.make(self, self.va + offset, length, writable)

    def release_views(self):
        """Release every memoryview view() returned; BufferError while a buffer taken from one is in use."""
        self._views.release()


class Allocation(_Memory):
    """Device, host or managed memory from Client.malloc, host_malloc or malloc_managed.

    ``va`` is its address, ``size`` the size asked for (the daemon rounds it up to 4 KiB), ``kind`` a
    gpumem.Kind, ``gpu_id`` the GPU it was asked for, ``flags`` its MemFlag, ``handle`` the handle that exports
    and properties take. A context manager that frees it. free() a second time raises gpumem.Error EINVAL,
    as gm_mem_free does.
    """

    def __init__(self, client, va, size, kind, gpu_id, flags):
        super().__init__(client, va, size, _round_up(size))
        self.kind = kind
        """gpumem.Kind.DEVICE, HOST or MANAGED."""
        self.gpu_id = gpu_id
        """The GPU named at allocation (0 for managed memory and host memory placed near the first GPU)."""
        self.flags = flags
        """The MemFlag it was allocated with."""
        self._handle = None
        self._freed = False

    def __repr__(self):
        state = " freed" if self._freed else ""
        return f"<gpumem.Allocation {self.kind.name.lower()} {self.va:#x} size={self.size}{state}>"

    @property
    def freed(self):
        """True once free() succeeded (or the client was closed)."""
        return self._freed

    @property
    def handle(self):
        """The allocation's handle (from gm_pointer_get_attributes), what export() and properties take."""
        if self._handle is None:
            self._handle = self._client.pointer_attributes(self.va).handle
        return self._handle

    def free(self):
        """Free the memory (gm_mem_free). Views over it are released first: BufferError while a buffer taken
        from one is still in use, and nothing is freed."""
        c = self._client
        if self._freed and c._allocs.get(self.va, self) is not self:
            # the daemon gave the address to a newer allocation: gm_mem_free would free that one
            raise Error(errno.EINVAL, f"{self.va:#x} was freed already, and the address is in use again",
                        "gm_mem_free")
        c._free_va(self.va)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._freed and not self._client.closed:
            self.free()

    def attributes(self):
        """The daemon's PointerAttributes of this allocation."""
        return self._client.pointer_attributes(self.va)

    def view(self, offset=0, length=None):
        """A memoryview of the memory, where the library maps it into this process: host and managed memory,
        and device memory with MemFlag.HOST_VISIBLE. Read-only for MemFlag.READ_ONLY memory. ValueError for
        memory the CPU cannot reach. Valid until the allocation is freed or its client closed."""
        attrs = self.attributes()
        if not attrs.cpu_accessible:
            raise ValueError(f"the {self.kind.name.lower()} memory at {self.va:#x} is not mapped into this "
                             "process (device memory needs MemFlag.HOST_VISIBLE)")
        return self._view(offset, length, attrs.size, not attrs.flags & MemFlag.READ_ONLY)

    def export(self, read_only=False):
        """An Export (fd) of this allocation (gm_mem_export_flags)."""
        return self._client.export(self, read_only)

    def map_gpus(self, gpus):
        """Map it on more GPUs (gm_mem_map_gpus)."""
        self._client.map_gpus(self, gpus)

    def unmap_gpus(self, gpus=()):
        """Unmap it from @gpus, or from every GPU (gm_mem_unmap_gpus)."""
        self._client.unmap_gpus(self, gpus)

    def advise(self, advice, location=LOCATION_CPU):
        """gm_mem_advise over the whole (managed) allocation."""
        self._client.advise(self.va, self._span, advice, location)

    def prefetch(self, location):
        """gm_mem_prefetch of the whole (managed) allocation."""
        self._client.prefetch(self.va, self._span, location)

    def svm_set_attributes(self, attrs):
        """gm_svm_set_attributes over the whole (managed) allocation."""
        self._client.svm_set_attributes(self.va, self._span, attrs)

    def svm_get_attributes(self, attrs):
        """gm_svm_get_attributes over the whole (managed) allocation."""
        return self._client.svm_get_attributes(self.va, self._span, attrs)


class Reservation:
    """VA reserved in the window (Client.address_reserve): ``va``, ``size``. A context manager that frees it."""

    def __init__(self, client, va, size):
        self._client = client
        self.va = va
        """The start of the reservation."""
        self.size = size
        """Its size in bytes."""
        self._freed = False

    def __repr__(self):
        return f"<gpumem.Reservation {self.va:#x} size={self.size}{' freed' if self._freed else ''}>"

    def free(self):
        """Give the reservation back (gm_mem_address_free); EBUSY while anything is mapped in it."""
        self._client.address_free(self.va, self.size)
        self._freed = True

    def map(self, handle, offset=0, size=None, at=None):
        """Map [offset, offset + size) of @handle at @at (default: the start) in this reservation (gm_mem_map),
        as a Mapping; @size defaults to the rest of a MemHandle."""
        if size is None:
            if not isinstance(handle, MemHandle):
                raise TypeError("size is needed unless handle is a MemHandle")
            size = handle.size - size_arg(offset, "offset")
        return self._client.mem_map(self.va if at is None else at, size, offset, handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._freed and not self._client.closed:
            self.free()


class MemHandle:
    """A VMM handle (Client.mem_create, retain_allocation_handle) or an import (Client.import_fd): ``handle``,
    ``size``, ``kind`` (Kind.VMM or Kind.IMPORT), ``gpu_id``. A context manager that releases it."""

    def __init__(self, client, handle, size, kind, gpu_id):
        self._client = client
        self.handle = handle
        """The gm_handle value."""
        self.size = size
        """The size of the memory in bytes."""
        self.kind = kind
        """Kind.VMM or Kind.IMPORT."""
        self.gpu_id = gpu_id
        """The GPU it was created or imported on (0: the first GPU)."""
        self._released = False

    def __repr__(self):
        return f"<gpumem.MemHandle {self.kind.name.lower()} {self.handle:#x} size={self.size}>"

    def release(self):
        """Drop this reference (gm_mem_release); a second release raises gpumem.Error ENOENT."""
        self._client.mem_release(self)
        self._released = True

    def properties(self):
        """The AllocationProperties of the handle (gm_mem_get_allocation_properties)."""
        return self._client.allocation_properties(self)

    def export(self, read_only=False):
        """An Export (fd) of the memory (gm_mem_export_flags)."""
        return self._client.export(self, read_only)

    def map(self, access=None, size=None, offset=0):
        """Client.map_handle of this handle: reserve, map and grant @access (default: this process
        read-write), as a Mapping owning its reservation."""
        return self._client.map_handle(self, size, offset, access)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._released and not self._client.closed:
            self.release()


class Mapping(_Memory):
    """A VMM mapping of a handle at ``va`` (Client.mem_map, Reservation.map, Client.map_handle): ``size``,
    ``handle``. A context manager that unmaps it (and gives back the reservation map_handle made for it)."""

    def __init__(self, client, va, size, handle):
        super().__init__(client, va, size, size)
        self.handle = handle
        """The handle mapped here."""
        self._reservation = None
        self._unmapped = False

    def __repr__(self):
        return f"<gpumem.Mapping {self.va:#x} size={self.size} handle={self.handle:#x}>"

    def set_access(self, access):
        """Grant or revoke access to this mapping (gm_mem_set_access); @access: {location: Access}."""
        self._client.set_access(self.va, self.size, access)

    def get_access(self, location=LOCATION_CPU):
        """The Access of @location (a GPU or gpumem.LOCATION_CPU) to this mapping (gm_mem_get_access)."""
        return self._client.get_access(self.va, location)

    def view(self, offset=0, length=None):
        """A memoryview of the mapping, which the library maps into this process once CPU access was granted:
        read-only when that access is Access.READ (a read-only import, say); ValueError without CPU access.
        Valid until CPU access changes or the mapping goes."""
        access = self.get_access(LOCATION_CPU)
        if access == Access.NONE:
            raise ValueError(f"the mapping at {self.va:#x} has no CPU access: grant it with set_access first")
        return self._view(offset, length, self.size, access == Access.READ_WRITE)

    def unmap(self):
        """Remove the mapping (gm_mem_unmap), then give back the reservation map_handle made for it."""
        if not self._unmapped:
            self._client.mem_unmap(self.va, self.size)
            self._unmapped = True
        if self._reservation is not None:
            self._reservation.free()
            self._reservation = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._client.closed and (not self._unmapped or self._reservation is not None):
            self.unmap()


class Share(_Memory):
    """A named share this client opened (Client.share_open), mapped at ``va`` (the same in every reader),
    ``size`` bytes, ``name``, ``handle``, ``read_only`` for a read-only reader. A context manager that closes
    it; close() a second time does nothing. After a revocation its handle answers gpumem.Error ESTALE but
    view() and close() still work: the CPU mapping stays until closed."""

    def __init__(self, client, name, va, size, handle, read_only):
        super().__init__(client, va, size, size)
        self.name = name
        """The share's name."""
        self.handle = handle
        """This reader's handle of it."""
        self.read_only = read_only
        """Whether this reader may only read it."""
        self._closed = False

    def __repr__(self):
        state = " closed" if self._closed else ""
        return f"<gpumem.Share {self.name!r} {self.va:#x} size={self.size}{state}>"

    def view(self, offset=0, length=None):
        """A memoryview of the share where the library mapped it: read-only for a read-only reader. Valid until
        close() or the client's close."""
        if self._closed:
            raise ValueError(f"share {self.name!r} is closed")
        return self._view(offset, length, self.size, not self.read_only)

    def attributes(self):
        """The daemon's PointerAttributes of the share (gpumem.Error ESTALE once it was revoked)."""
        return self._client.pointer_attributes(self.va)

    def close(self):
        """Unmap it and free its handle (gm_share_close). Views are released first: BufferError while a buffer
        taken from one is still in use, and nothing is closed."""
        if self._closed:
            return
        self._views.release()
        self._client._call("gm_share_close", c_void_p(self.va))
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._client.closed:
            self.close()


class Export:
    """An fd gpumemd exported (Client.export): a dmabuf for device and VMM memory, the memfd of host and managed
    memory. ``size`` in bytes, ``read_only`` whether the fd was opened read-only. The caller owns the fd: it is
    closed by close(), at the end of a ``with`` block or when the object goes, unless detach() took it."""

    def __init__(self, fd, size):
        self._fd = fd
        self.size = size
        """The size of the memory in bytes."""
        self.read_only = (fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE) == os.O_RDONLY
        """True for a read-only export: it cannot be mapped writable, and importers get read access only."""
        self._close = weakref.finalize(self, os.close, fd)

    def __repr__(self):
        state = f"fd={self._fd}" if self._fd >= 0 else "closed"
        return f"<gpumem.Export {state} size={self.size}{' read-only' if self.read_only else ''}>"

    def fileno(self):
        """The fd (to pass with socket.send_fds, or to Client.import_fd)."""
        if self._fd < 0:
            raise ValueError("the export is closed")
        return self._fd

    @property
    def closed(self):
        """True once the fd was closed or detached."""
        return self._fd < 0

    def close(self):
        """Close the fd; the memory lives on while an import or a mapping uses it."""
        self._fd = -1
        self._close()

    def detach(self):
        """Hand the fd over to the caller, who closes it from now on."""
        fd = self.fileno()
        self._close.detach()
        self._fd = -1
        return fd

    def mmap(self):
        """An mmap.mmap of the whole fd, shared with every other mapping of the memory: writable unless the
        export is read-only. Supports the buffer protocol (memoryview(export.mmap()))."""
        prot = mmap.PROT_READ | (0 if self.read_only else mmap.PROT_WRITE)
        return mmap.mmap(self.fileno(), self.size, flags=mmap.MAP_SHARED, prot=prot)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
