"""gpumem: Python binding of libgpumem_client, the client library of gpumemd (the AMD GPU memory broker).

Connect with gpumem.Client (gpumem.Admin for administrators), allocate device, host and managed memory, map
VMM handles, share memory through fds, and reach CPU-visible memory through memoryviews::

    import gpumem

    with gpumem.Client(name="example") as c:
        gpu = c.gpus()[0].gpu_id
        with c.host_malloc(1 << 20, gpu) as buf:
            buf.view()[:5] = b"hello"

Every failed call raises gpumem.Error (an OSError: .errno, .strerror, and .reason, the daemon's explanation).
The library is loaded by its soname, libgpumem_client.so.1, or from the file $GPUMEM_CLIENT_LIBRARY names.
"""
from .admin import LOG_LEVELS, Admin
from .client import PAGE_SIZE, Allocation, Client, Export, Mapping, MemHandle, Reservation, Share
from .constants import (DEFAULT_SOCKET, EXPORT_READ_ONLY, GRANULARITY_MINIMUM, GRANULARITY_RECOMMENDED,
                        LOCATION_CPU, SHARE_READ_ONLY, SHARE_WRITE, SVM_LOCATION_UNDEFINED, UNLIMITED, Access, Advice,
                        Kind, MemFlag, Resource, SvmAttr, SvmFlag)
from .errors import Error
from .records import (AllocationProperties, AllocInfo, ClientInfo, GpuUsage, IoLink, MemInfo, PointerAttributes,
                      Quota, ShareInfo, Status, TileConfig, Topology, TopologyNode)

__version__ = "1.5.0"
"""The libgpumem_client version this package was written against."""

__all__ = [
    "Client", "Admin", "Error", "Allocation", "Reservation", "MemHandle", "Mapping", "Export", "Share",
    "MemFlag", "Kind", "Advice", "SvmAttr", "SvmFlag", "Access", "Resource",
    "LOCATION_CPU", "SVM_LOCATION_UNDEFINED", "UNLIMITED", "EXPORT_READ_ONLY", "SHARE_READ_ONLY", "SHARE_WRITE",
    "GRANULARITY_MINIMUM",
    "GRANULARITY_RECOMMENDED", "DEFAULT_SOCKET", "PAGE_SIZE", "LOG_LEVELS",
    "IoLink", "TopologyNode", "Topology", "TileConfig", "PointerAttributes", "AllocationProperties", "MemInfo",
    "Status", "GpuUsage", "ClientInfo", "AllocInfo", "Quota", "ShareInfo",
]
