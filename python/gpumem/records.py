"""Plain Python records (dataclasses) of what libgpumem_client's queries and administration calls return."""
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from .constants import Kind, MemFlag, Resource, as_enum

__all__ = [
    "IoLink", "TopologyNode", "Topology", "TileConfig", "PointerAttributes", "AllocationProperties", "MemInfo",
    "Status", "GpuUsage", "ClientInfo", "AllocInfo", "Quota", "ShareInfo",
]


def _text(value):
    """A C string field as str ("" for NULL); bytes that are not UTF-8 are kept as escapes, not refused."""
    return value.decode(errors="backslashreplace") if value else ""


@dataclass(frozen=True)
class IoLink:
    """An IO link of a topology node (gm_io_link): type 2 PCIe, 11 XGMI, weight and bandwidth in MB/s."""

    type: int
    node_from: int
    node_to: int
    weight: int
    min_bandwidth: int
    max_bandwidth: int


@dataclass(frozen=True)
class TopologyNode:
    """A CPU or GPU node of the topology (gm_topology_node); ``gpu_id`` names the GPU in every memory call."""

    node_id: int
    gpu_id: int
    name: str
    is_gpu: bool
    cpu_cores: int
    simd_count: int
    local_mem_size: int
    gfx_target_version: int
    vendor_id: int
    device_id: int
    pci_domain: int
    pci_location: int
    drm_render_minor: int
    hive_id: int
    numa_node: int
    large_bar: bool
    capability: int
    system_mem_size: int
    io_links: Tuple[IoLink, ...] = ()
    properties: Dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_c(cls, n):
        """Copy a gm_topology_node, its links and its raw properties."""
        links = tuple(IoLink(k.type, k.node_from, k.node_to, k.weight, k.min_bandwidth, k.max_bandwidth)
                      for k in (n.io_links[i] for i in range(n.n_io_links)))
        props = {_text(p.key): p.value for p in (n.properties[i] for i in range(n.n_properties))}
        return cls(n.node_id, n.gpu_id, _text(n.name), bool(n.is_gpu), n.cpu_cores, n.simd_count,
                   n.local_mem_size, n.gfx_target_version, n.vendor_id, n.device_id, n.pci_domain, n.pci_location,
                   n.drm_render_minor, n.hive_id, n.numa_node, bool(n.large_bar), n.capability, n.system_mem_size,
                   links, props)


@dataclass(frozen=True)
class Topology:
    """The node topology as the daemon sees it (gm_topology)."""

    generation_id: int
    nodes: Tuple[TopologyNode, ...]

    @property
    def gpus(self):
        """The GPU nodes, in topology order (the n-th is HIP's device n)."""
        return tuple(n for n in self.nodes if n.is_gpu)


@dataclass(frozen=True)
class TileConfig:
    """A GPU's tiling configuration as KFD's GET_TILE_CONFIG reports it (gm_tile_config)."""

    gb_addr_config: int
    num_banks: int
    num_ranks: int
    tile: Tuple[int, ...]
    macro: Tuple[int, ...]


@dataclass(frozen=True)
class PointerAttributes:
    """What lies at an address (gm_pointer_attributes): the allocation or VMM mapping containing it."""

    handle: int
    kind: Kind
    gpu_id: int
    base: int
    size: int
    flags: MemFlag
    cpu_accessible: bool
    mapped_gpus: Tuple[int, ...]


@dataclass(frozen=True)
class AllocationProperties:
    """What a handle is (gm_allocation_prop): kind, owning GPU, size and flags."""

    kind: Kind
    gpu_id: int
    size: int
    flags: MemFlag


@dataclass(frozen=True)
class MemInfo:
    """Free and total VRAM of a GPU as this client's class allows it (gm_mem_get_info)."""

    free: int
    total: int


@dataclass(frozen=True)
class Status:
    """The daemon's status (gm_status); the model_* fields are meaningful only when ``has_model``."""

    server_version: str
    backend: str
    preset: str
    protocol_version: int
    kfd_major: int
    kfd_minor: int
    uptime_usec: int
    started_usec: int
    pid: int
    clients: int
    gpus: int
    allocations: int
    bytes_device: int
    bytes_host: int
    bytes_managed: int
    requests: int
    protocol_errors: int
    va_windows: int
    has_model: bool
    model_contexts: int
    model_buffers: int
    model_handles: int
    model_imports: int
    model_mappings: int
    model_gem_handles: int
    model_svm_ranges: int
    model_system_bytes: int
    model_vram_bytes: int
    private_gpu_vm: Optional[bool]

    @classmethod
    def from_c(cls, s):
        """Copy a gm_status."""
        return cls(_text(s.server_version), _text(s.backend), _text(s.preset), s.protocol_version, s.kfd_major,
                   s.kfd_minor, s.uptime_usec, s.started_usec, s.pid, s.clients, s.gpus, s.allocations,
                   s.bytes_device, s.bytes_host, s.bytes_managed, s.requests, s.protocol_errors, s.va_windows,
                   bool(s.has_model), s.model_contexts, s.model_buffers, s.model_handles, s.model_imports,
                   s.model_mappings, s.model_gem_handles, s.model_svm_ranges, s.model_system_bytes,
                   s.model_vram_bytes, bool(s.private_gpu_vm) if s.has_private_gpu_vm else None)


@dataclass(frozen=True)
class GpuUsage:
    """VRAM a client holds on one GPU (gm_gpu_usage)."""

    gpu_id: int
    vram_bytes: int


@dataclass(frozen=True)
class ClientInfo:
    """A connected client as administrators see it (gm_client_info)."""

    client_id: int
    pid: int
    uid: int
    gid: int
    cgroup: str
    container: str
    name: str
    class_name: str
    connected_usec: int
    host_bytes: int
    managed_bytes: int
    handles: int
    fds: int
    requests: int
    admin: bool
    usage: Tuple[GpuUsage, ...]
    pod: str

    @classmethod
    def from_c(cls, c):
        """Copy a gm_client_info."""
        usage = tuple(GpuUsage(u.gpu_id, u.vram_bytes) for u in (c.usage[i] for i in range(c.n_usage)))
        return cls(c.client_id, c.pid, c.uid, c.gid, _text(c.cgroup), _text(c.container), _text(c.name),
                   _text(c.class_name), c.connected_usec, c.host_bytes, c.managed_bytes, c.handles, c.fds,
                   c.requests, bool(c.admin), usage, _text(c.pod))


@dataclass(frozen=True)
class AllocInfo:
    """An object a client holds, as the administrators' listing gives it (gm_alloc_info)."""

    client_id: int
    id: int
    kind: Kind
    size: int
    gpu_id: int
    va: int
    mapped_gpus: Tuple[int, ...]
    exports: int

    @classmethod
    def from_c(cls, a):
        """Copy a gm_alloc_info."""
        n = min(a.n_mapped_gpus, len(a.mapped_gpus))
        return cls(a.client_id, a.id, as_enum(Kind, a.kind), a.size, a.gpu_id, a.va, tuple(a.mapped_gpus[:n]),
                   a.exports)


@dataclass(frozen=True)
class Quota:
    """One limit of a policy class with its usage (gm_quota); ``limit`` is gpumem.UNLIMITED when none."""

    class_name: str
    resource: Resource
    gpu_id: int
    limit: int
    used: int

    @classmethod
    def from_c(cls, q):
        """Copy a gm_quota."""
        return cls(_text(q.class_name), as_enum(Resource, q.resource), q.gpu_id, q.limit, q.used)


@dataclass(frozen=True)
class ShareInfo:
    """A named share (gm_share_info): ``va`` where every reader maps it, ``owner_client_id`` 0 once a
    persistent share's publisher has gone, ``owner_class`` the class that pays for it."""

    name: str
    owner_client_id: int
    owner_class: str
    kind: Kind
    gpu_id: int
    size: int
    va: int
    read_only: bool
    persistent: bool
    readers: int
    published_usec: int
    opens: int

    @classmethod
    def from_c(cls, s):
        """Copy a gm_share_info."""
        return cls(_text(s.name), s.owner_client_id, _text(s.owner_class), as_enum(Kind, s.kind), s.gpu_id, s.size,
                   s.ptr or 0, bool(s.read_only), bool(s.persistent), s.readers, s.published_usec, s.opens)
