"""ctypes declarations of libgpumem_client: the structs of gpumem-client.h, every prototype used, the loader."""
import ctypes
import os
import threading
from ctypes import (POINTER, Structure, c_bool, c_char, c_char_p, c_int, c_int32, c_size_t, c_uint, c_uint32,
                    c_uint64, c_ulonglong, c_void_p)

SONAME = "libgpumem_client.so.1"
"""The library's soname (libclient/meson.build: soversion 1)."""

ENV_LIBRARY = "GPUMEM_CLIENT_LIBRARY"
"""An environment variable naming the library file to load instead of the soname (a build tree's, say)."""

# The size gm_strerror's reason slots hold is 256 bytes; strerror text and ": " come on top of it.
ERRBUF_SIZE = 512


class gm_client_options(Structure):
    """struct gm_client_options of gpumem-client.h."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("socket_path", c_char_p),
        ("name", c_char_p),
        ("window_size", c_uint64),
        ("low_window", c_bool),
    ]


class gm_property(Structure):
    """struct gm_property of gpumem-client.h."""

    _fields_ = [("key", c_char_p), ("value", c_uint64)]


class gm_io_link(Structure):
    """struct gm_io_link of gpumem-client.h."""

    _fields_ = [
        ("type", c_uint32),
        ("node_from", c_uint32),
        ("node_to", c_uint32),
        ("weight", c_uint32),
        ("min_bandwidth", c_uint32),
        ("max_bandwidth", c_uint32),
    ]


class gm_topology_node(Structure):
    """struct gm_topology_node of gpumem-client.h."""

    _fields_ = [
        ("node_id", c_uint32),
        ("gpu_id", c_uint32),
        ("name", c_char_p),
        ("is_gpu", c_bool),
        ("cpu_cores", c_uint32),
        ("simd_count", c_uint32),
        ("local_mem_size", c_uint64),
        ("gfx_target_version", c_uint32),
        ("vendor_id", c_uint32),
        ("device_id", c_uint32),
        ("pci_domain", c_uint32),
        ("pci_location", c_uint32),
        ("drm_render_minor", c_uint32),
        ("hive_id", c_uint64),
        ("numa_node", c_int32),
        ("large_bar", c_bool),
        ("capability", c_uint32),
        ("system_mem_size", c_uint64),
        ("n_io_links", c_size_t),
        ("io_links", POINTER(gm_io_link)),
        ("n_properties", c_size_t),
        ("properties", POINTER(gm_property)),
    ]


class gm_topology(Structure):
    """struct gm_topology of gpumem-client.h."""

    _fields_ = [("generation_id", c_uint64), ("n_nodes", c_size_t), ("nodes", POINTER(gm_topology_node))]


class gm_topology_file(Structure):
    """struct gm_topology_file of gpumem-client.h."""

    # content is raw bytes of a known length: a void pointer, so that ctypes does not stop at a NUL
    _fields_ = [("path", c_char_p), ("content", c_void_p), ("len", c_size_t)]


class gm_tile_config(Structure):
    """struct gm_tile_config of gpumem-client.h."""

    _fields_ = [
        ("gb_addr_config", c_uint32),
        ("num_banks", c_uint32),
        ("num_ranks", c_uint32),
        ("n_tile", c_uint32),
        ("n_macro", c_uint32),
        ("tile", c_uint32 * 32),
        ("macro", c_uint32 * 16),
    ]


class gm_alloc_desc(Structure):
    """struct gm_alloc_desc of gpumem-client.h."""

    _fields_ = [
        ("kind", c_int),
        ("size", c_size_t),
        ("gpu_id", c_uint32),
        ("flags", c_uint),
        ("numa_node", c_int),
        ("alignment", c_size_t),
        ("fixed_addr", c_void_p),
        ("map_gpus", POINTER(c_uint32)),
        ("n_map_gpus", c_size_t),
    ]


class gm_pointer_attributes(Structure):
    """struct gm_pointer_attributes of gpumem-client.h."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("handle", c_uint64),
        ("kind", c_int),
        ("gpu_id", c_uint32),
        ("base", c_void_p),
        ("size", c_size_t),
        ("flags", c_uint),
        ("cpu_accessible", c_bool),
        ("n_mapped_gpus", c_size_t),
        ("mapped_gpus", c_uint32 * 64),
    ]


class gm_svm_attr(Structure):
    """struct gm_svm_attr of gpumem-client.h."""

    _fields_ = [("type", c_uint32), ("value", c_uint32)]


class gm_access_desc(Structure):
    """struct gm_access_desc of gpumem-client.h."""

    _fields_ = [("gpu_id", c_uint32), ("access", c_int)]


class gm_allocation_prop(Structure):
    """struct gm_allocation_prop of gpumem-client.h."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("kind", c_int),
        ("gpu_id", c_uint32),
        ("size", c_size_t),
        ("flags", c_uint),
    ]


class gm_status(Structure):
    """struct gm_status of gpumem-client.h."""

    _fields_ = [
        ("server_version", c_char_p),
        ("backend", c_char_p),
        ("preset", c_char_p),
        ("protocol_version", c_uint32),
        ("kfd_major", c_uint32),
        ("kfd_minor", c_uint32),
        ("uptime_usec", c_uint64),
        ("started_usec", c_uint64),
        ("pid", c_uint32),
        ("clients", c_uint32),
        ("gpus", c_uint32),
        ("allocations", c_uint64),
        ("bytes_device", c_uint64),
        ("bytes_host", c_uint64),
        ("bytes_managed", c_uint64),
        ("requests", c_uint64),
        ("protocol_errors", c_uint64),
        ("va_windows", c_uint32),
        ("has_model", c_bool),
        ("model_contexts", c_uint32),
        ("model_buffers", c_uint64),
        ("model_handles", c_uint64),
        ("model_imports", c_uint64),
        ("model_mappings", c_uint64),
        ("model_gem_handles", c_uint64),
        ("model_svm_ranges", c_uint64),
        ("model_system_bytes", c_uint64),
        ("model_vram_bytes", c_uint64),
        ("has_private_gpu_vm", c_bool),
        ("private_gpu_vm", c_bool),
    ]


class gm_gpu_usage(Structure):
    """struct gm_gpu_usage of gpumem-client.h."""

    _fields_ = [("gpu_id", c_uint32), ("vram_bytes", c_uint64)]


class gm_client_info(Structure):
    """struct gm_client_info of gpumem-client.h."""

    _fields_ = [
        ("client_id", c_uint64),
        ("pid", c_uint32),
        ("uid", c_uint32),
        ("gid", c_uint32),
        ("cgroup", c_char_p),
        ("container", c_char_p),
        ("name", c_char_p),
        ("class_name", c_char_p),
        ("connected_usec", c_uint64),
        ("host_bytes", c_uint64),
        ("managed_bytes", c_uint64),
        ("handles", c_uint32),
        ("fds", c_uint32),
        ("requests", c_uint64),
        ("admin", c_bool),
        ("n_usage", c_size_t),
        ("usage", POINTER(gm_gpu_usage)),
        ("pod", c_char_p),
    ]


class gm_alloc_info(Structure):
    """struct gm_alloc_info of gpumem-client.h."""

    _fields_ = [
        ("client_id", c_uint64),
        ("id", c_uint64),
        ("kind", c_int),
        ("size", c_uint64),
        ("gpu_id", c_uint32),
        ("va", c_uint64),
        ("n_mapped_gpus", c_size_t),
        ("mapped_gpus", c_uint32 * 64),
        ("exports", c_uint32),
    ]


class gm_quota(Structure):
    """struct gm_quota of gpumem-client.h."""

    _fields_ = [
        ("class_name", c_char_p),
        ("resource", c_int),
        ("gpu_id", c_uint32),
        ("limit", c_uint64),
        ("used", c_uint64),
    ]


class gm_share_info(Structure):
    """struct gm_share_info of gpumem-client.h."""

    _fields_ = [
        ("name", c_char * 129),
        ("owner_client_id", c_uint64),
        ("owner_class", c_char * 64),
        ("kind", c_int),
        ("gpu_id", c_uint32),
        ("size", c_uint64),
        ("ptr", c_void_p),
        ("read_only", c_int),
        ("persistent", c_int),
        ("readers", c_uint32),
        ("published_usec", c_uint64),
        ("opens", c_uint64),
    ]


STRUCTS = [gm_client_options, gm_property, gm_io_link, gm_topology_node, gm_topology, gm_topology_file,
           gm_tile_config, gm_alloc_desc, gm_pointer_attributes, gm_svm_attr, gm_access_desc, gm_allocation_prop,
           gm_status, gm_gpu_usage, gm_client_info, gm_alloc_info, gm_quota, gm_share_info]
"""Every struct declared here, for the test that compares their layout with the C compiler's."""

_P = POINTER
_client = c_void_p  # gm_client * is opaque
_handle = c_uint64  # gm_handle

# name: (restype, argtypes); every function of the library that this package calls
PROTOTYPES = {
    "gm_client_open_with": (c_int, [_P(gm_client_options), _P(c_void_p), _P(c_char), c_size_t]),
    "gm_client_close": (None, [_client]),
    "gm_strerror": (c_char_p, [_client, c_int, _P(c_char), c_size_t]),
    "gm_client_id": (c_uint64, [_client]),
    "gm_client_window": (None, [_client, _P(c_uint64), _P(c_uint64)]),
    "gm_client_server_version": (c_char_p, [_client]),
    "gm_client_backend": (c_char_p, [_client]),
    "gm_client_kfd_version": (None, [_client, _P(c_uint32), _P(c_uint32)]),
    "gm_client_protocol_version": (c_uint32, [_client]),
    "gm_ping": (c_int, [_client]),
    "gm_topology_get": (c_int, [_client, c_bool, _P(_P(gm_topology))]),
    "gm_topology_free": (None, [_P(gm_topology)]),
    "gm_topology_files": (c_int, [_client, _P(_P(gm_topology_file)), _P(c_size_t)]),
    "gm_topology_files_free": (None, [_P(gm_topology_file), c_size_t]),
    "gm_tile_config_get": (c_int, [_client, c_uint32, _P(gm_tile_config)]),
    "gm_malloc_desc": (c_int, [_client, _P(gm_alloc_desc), _P(c_void_p)]),
    "gm_mem_free": (c_int, [_client, c_void_p]),
    "gm_mem_map_gpus": (c_int, [_client, c_void_p, _P(c_uint32), c_size_t]),
    "gm_mem_unmap_gpus": (c_int, [_client, c_void_p, _P(c_uint32), c_size_t]),
    "gm_mem_get_info": (c_int, [_client, c_uint32, _P(c_size_t), _P(c_size_t)]),
    "gm_pointer_get_attributes": (c_int, [_client, c_void_p, _P(gm_pointer_attributes)]),
    "gm_mem_advise": (c_int, [_client, c_void_p, c_size_t, c_int, c_uint32]),
    "gm_mem_prefetch": (c_int, [_client, c_void_p, c_size_t, c_uint32]),
    "gm_svm_set_attributes": (c_int, [_client, c_void_p, c_size_t, _P(gm_svm_attr), c_size_t]),
    "gm_svm_get_attributes": (c_int, [_client, c_void_p, c_size_t, _P(gm_svm_attr), c_size_t]),
    "gm_mem_address_reserve": (c_int, [_client, c_size_t, c_size_t, c_void_p, c_ulonglong, _P(c_void_p)]),
    "gm_mem_address_free": (c_int, [_client, c_void_p, c_size_t]),
    "gm_mem_create": (c_int, [_client, c_size_t, c_uint32, c_uint, _P(_handle)]),
    "gm_mem_release": (c_int, [_client, _handle]),
    "gm_mem_map": (c_int, [_client, c_void_p, c_size_t, c_size_t, _handle]),
    "gm_mem_unmap": (c_int, [_client, c_void_p, c_size_t]),
    "gm_mem_set_access": (c_int, [_client, c_void_p, c_size_t, _P(gm_access_desc), c_size_t]),
    "gm_mem_get_access": (c_int, [_client, c_void_p, c_uint32, _P(c_int)]),
    "gm_mem_get_allocation_granularity": (c_int, [_client, c_uint32, c_int, _P(c_size_t)]),
    "gm_mem_retain_allocation_handle": (c_int, [_client, c_void_p, _P(_handle)]),
    "gm_mem_get_allocation_properties": (c_int, [_client, _handle, _P(gm_allocation_prop)]),
    "gm_mem_export_flags": (c_int, [_client, _handle, c_uint, _P(c_int), _P(c_size_t)]),
    "gm_mem_import": (c_int, [_client, c_int, c_uint32, _P(_handle), _P(c_size_t)]),
    "gm_share_publish": (c_int, [_client, _handle, c_char_p, c_uint, _P(gm_share_info)]),
    "gm_share_open": (c_int, [_client, c_char_p, c_uint, _P(c_uint32), c_size_t, _P(c_void_p), _P(c_size_t),
                              _P(_handle)]),
    "gm_share_close": (c_int, [_client, c_void_p]),
    "gm_share_revoke": (c_int, [_client, c_char_p]),
    # the array is freed with gm_free
    "gm_admin_shares": (c_int, [_client, _P(_P(gm_share_info)), _P(c_size_t)]),
    "gm_admin_status": (c_int, [_client, _P(_P(gm_status))]),
    "gm_status_free": (None, [_P(gm_status)]),
    "gm_admin_clients": (c_int, [_client, _P(_P(gm_client_info)), _P(c_size_t)]),
    "gm_client_info_free": (None, [_P(gm_client_info), c_size_t]),
    "gm_admin_disconnect": (c_int, [_client, c_uint64]),
    # the text is freed with gm_free: a void pointer keeps ctypes from copying it and losing the address
    "gm_admin_metrics": (c_int, [_client, _P(c_void_p)]),
    "gm_admin_set_log_level": (c_int, [_client, c_char_p]),
    "gm_admin_allocations": (c_int, [_client, c_uint64, c_uint, _P(c_uint64), _P(_P(gm_alloc_info)),
                                     _P(c_size_t)]),
    "gm_alloc_info_free": (None, [_P(gm_alloc_info), c_size_t]),
    "gm_admin_quota_get": (c_int, [_client, c_char_p, _P(_P(gm_quota)), _P(c_size_t)]),
    "gm_quota_free": (None, [_P(gm_quota), c_size_t]),
    "gm_admin_quota_set": (c_int, [_client, c_char_p, c_int, c_uint32, c_uint64, c_bool]),
    "gm_free": (None, [c_void_p]),
}

_lock = threading.Lock()
_loaded = None


def library_path():
    """The file or soname the package loads: $GPUMEM_CLIENT_LIBRARY when set, else the soname."""
    return os.environ.get(ENV_LIBRARY) or SONAME


def get():
    """The loaded library with every prototype declared; loaded on first use, once per process."""
    global _loaded
    with _lock:
        if _loaded is None:
            path = library_path()
            try:
                lib = ctypes.CDLL(path, use_errno=False)
            except OSError as e:
                raise OSError(f"cannot load libgpumem_client ({path}): {e}; "
                              f"install it, or name the file in ${ENV_LIBRARY}") from e
            for name, (restype, argtypes) in PROTOTYPES.items():
                try:
                    fn = getattr(lib, name)
                except AttributeError as e:
                    raise OSError(f"{path} has no {name}: this package needs libgpumem_client 1.3 or later") from e
                fn.restype = restype
                fn.argtypes = argtypes
            _loaded = lib
        return _loaded
