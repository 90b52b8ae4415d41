"""The constants of gpumem-client.h (flags, kinds, advice, SVM attributes, access, resources) as Python enums."""
import enum

__all__ = [
    "MemFlag", "Kind", "Advice", "SvmAttr", "SvmFlag", "Access", "Resource",
    "LOCATION_CPU", "SVM_LOCATION_UNDEFINED", "UNLIMITED", "EXPORT_READ_ONLY", "SHARE_READ_ONLY", "SHARE_WRITE",
    "GRANULARITY_MINIMUM", "GRANULARITY_RECOMMENDED", "DEFAULT_SOCKET",
]

DEFAULT_SOCKET = "/run/gpumemd/gpumemd.sock"
"""The socket used when neither the socket argument nor $GPUMEM_SOCKET names one (GM_DEFAULT_SOCKET)."""

LOCATION_CPU = 0
"""A location that is system memory / the CPU rather than a GPU (GM_LOCATION_CPU)."""

SVM_LOCATION_UNDEFINED = 0xFFFFFFFF
"""No preferred or prefetch location, or sub-ranges that differ (GM_SVM_LOCATION_UNDEFINED)."""

UNLIMITED = 2**64 - 1
"""A quota limit that is no limit (GM_UNLIMITED)."""

EXPORT_READ_ONLY = 1
"""gm_mem_export_flags: the fd and every import of it may only read the memory (GM_EXPORT_READ_ONLY)."""
SHARE_READ_ONLY = 1
"""gm_share_publish: every reader only reads (GM_SHARE_READ_ONLY)."""
SHARE_WRITE = 1
"""gm_share_open: read-write (GM_SHARE_WRITE)."""

GRANULARITY_MINIMUM = 0
GRANULARITY_RECOMMENDED = 1


class MemFlag(enum.IntFlag):
    """Allocation flags of gm_malloc, gm_host_malloc, gm_malloc_managed and gm_mem_create (GM_MEM_*)."""

    NONE = 0
    HOST_VISIBLE = 1
    COHERENT = 2
    UNCACHED = 4
    EXECUTABLE = 8
    CONTIGUOUS = 16
    READ_ONLY = 32
    EXT_COHERENT = 64
    GTT = 128
    SVM_RANGE = 256


class Kind(enum.IntEnum):
    """Kinds of memory (GM_KIND_*); RESERVATION is the 0 the allocation listing gives a VMM VA reservation."""

    RESERVATION = 0
    DEVICE = 1
    HOST = 2
    MANAGED = 3
    VMM = 4
    IMPORT = 5
    SHARE = 6  # a named share this client opened (protocol 3)


class Advice(enum.IntEnum):
    """hipMemAdvise's advice values, as gm_mem_advise takes them (GM_ADVISE_*)."""

    SET_READ_MOSTLY = 1
    UNSET_READ_MOSTLY = 2
    SET_PREFERRED_LOCATION = 3
    UNSET_PREFERRED_LOCATION = 4
    SET_ACCESSED_BY = 5
    UNSET_ACCESSED_BY = 6
    SET_COARSE_GRAIN = 100
    UNSET_COARSE_GRAIN = 101


class SvmAttr(enum.IntEnum):
    """Raw KFD SVM attribute types (GM_SVM_ATTR_*)."""

    PREFERRED_LOC = 0
    PREFETCH_LOC = 1
    ACCESS = 2
    ACCESS_IN_PLACE = 3
    NO_ACCESS = 4
    SET_FLAGS = 5
    CLR_FLAGS = 6
    GRANULARITY = 7


class SvmFlag(enum.IntFlag):
    """Flags of the SET_FLAGS and CLR_FLAGS SVM attributes (GM_SVM_FLAG_*)."""

    NONE = 0
    HOST_ACCESS = 0x1
    COHERENT = 0x2
    HIVE_LOCAL = 0x4
    GPU_RO = 0x8
    GPU_EXEC = 0x10
    GPU_READ_MOSTLY = 0x20
    GPU_ALWAYS_MAPPED = 0x40
    EXT_COHERENT = 0x80


class Access(enum.IntEnum):
    """VMM access of a GPU or of this process to a mapping (GM_ACCESS_*)."""

    NONE = 0
    READ = 1
    READ_WRITE = 3


class Resource(enum.IntEnum):
    """What a policy class's limits apply to (GM_RESOURCE_*)."""

    VRAM = 1
    HOST = 2
    MANAGED = 3
    HANDLES = 4
    FDS = 5
    CONNECTIONS = 6
    INFLIGHT = 7
    WINDOWS = 8
    QUEUES = 9
    MAPPINGS = 10
    SHARES = 11


def as_enum(cls, value):
    """@value as a member of @cls when it is one, else the plain int (a newer daemon may send more)."""
    try:
        return cls(value)
    except ValueError:
        return value
