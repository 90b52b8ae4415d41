"""gpumem.Admin: a Client with the administrators' calls of libgpumem_client (status, clients, quotas, ...)."""
import ctypes
from ctypes import POINTER, byref, c_size_t, c_uint64, c_void_p

from . import _lib
from .client import Client
from .errors import int_arg, str_arg, u32_arg, u64_arg
from .records import AllocInfo, ClientInfo, Quota, ShareInfo, Status

__all__ = ["Admin"]

LOG_LEVELS = ("err", "warning", "notice", "info", "debug")
"""The levels set_log_level takes."""


class Admin(Client):
    """A connection to gpumemd for administrators: a Client (it takes the same arguments and can do all a Client
    does) with the administration calls. Whether the connection is an administrator's is the daemon's
    decision at connect (root, the daemon's uid, admin-groups, or a class with admin = yes); the calls of
    anyone else fail with gpumem.Error EACCES. Every C result is copied into plain records and freed with
    the library's own free function.
    """

    def status(self):
        """The daemon's status (gm_admin_status) as a Status."""
        s = POINTER(_lib.gm_status)()
        self._call("gm_admin_status", byref(s))
        try:
            return Status.from_c(s.contents)
        finally:
            self._lib.gm_status_free(s)

    def clients(self):
        """Every connected client (gm_admin_clients), as a list of ClientInfo."""
        infos = POINTER(_lib.gm_client_info)()
        n = c_size_t()
        self._call("gm_admin_clients", byref(infos), byref(n))
        try:
            return [ClientInfo.from_c(infos[i]) for i in range(n.value)]
        finally:
            self._lib.gm_client_info_free(infos, n.value)

    def allocations_page(self, client_id=0, limit=0, cursor=0):
        """One page of the objects client @client_id holds (0: every client), at most @limit (0: as many as
        one reply holds), from @cursor (0 to start) (gm_admin_allocations). Returns (list of AllocInfo,
        next cursor), the cursor 0 after the last page."""
        cur = c_uint64(u64_arg(cursor, "cursor"))
        arr = POINTER(_lib.gm_alloc_info)()
        n = c_size_t()
        self._call("gm_admin_allocations", u64_arg(client_id, "client_id"), u32_arg(limit, "limit"), byref(cur),
                   byref(arr), byref(n))
        try:
            return [AllocInfo.from_c(arr[i]) for i in range(n.value)], cur.value
        finally:
            self._lib.gm_alloc_info_free(arr, n.value)

    def allocations(self, client_id=0, limit=0):
        """Every object client @client_id holds (0: every client), all pages of @limit entries (0: as many
        as one reply holds) taken in turn, as a list of AllocInfo. A listing taken while clients change may
        skip or repeat entries."""
        out, cursor = [], 0
        while True:
            page, cursor = self.allocations_page(client_id, limit, cursor)
            out.extend(page)
            if cursor == 0:
                return out

    def quotas(self, class_name=None):
        """Every limit of class @class_name (None: of every class) with its usage (gm_admin_quota_get), as a
        list of Quota."""
        q = POINTER(_lib.gm_quota)()
        n = c_size_t()
        self._call("gm_admin_quota_get", str_arg(class_name, "class_name", allow_none=True), byref(q), byref(n))
        try:
            return [Quota.from_c(q[i]) for i in range(n.value)]
        finally:
            self._lib.gm_quota_free(q, n.value)

    def quota(self, class_name, resource, gpu=0):
        """The Quota of one @resource (a gpumem.Resource) of @class_name, class-wide or of GPU @gpu's VRAM; None
        when the daemon lists no such limit."""
        for q in self.quotas(class_name):
            if q.resource == resource and q.gpu_id == gpu:
                return q
        return None

    def set_quota(self, class_name, resource, limit, gpu=0, force=False):
        """Change one limit of a running class until the next reload (gm_admin_quota_set): @resource a
        gpumem.Resource, @limit a count or bytes (gpumem.UNLIMITED for none), @gpu a GPU for a per-GPU VRAM
        limit. Below what the class uses now: gpumem.Error EBUSY unless @force."""
        self._call("gm_admin_quota_set", str_arg(class_name, "class_name"), int_arg(resource, "resource"),
                   u32_arg(gpu, "gpu"), u64_arg(limit, "limit"), bool(force))

    def disconnect(self, client_id):
        """Disconnect client @client_id (gm_admin_disconnect); the daemon frees everything it held."""
        self._call("gm_admin_disconnect", u64_arg(client_id, "client_id"))

    def metrics(self):
        """The daemon's metrics in Prometheus text format (gm_admin_metrics), as a str."""
        text = c_void_p()
        self._call("gm_admin_metrics", byref(text))
        try:
            return ctypes.string_at(text.value).decode(errors="replace")
        finally:
            self._lib.gm_free(text)

    def shares(self):
        """Every named share (gm_admin_shares), as a list of ShareInfo."""
        arr = POINTER(_lib.gm_share_info)()
        n = c_size_t()
        self._call("gm_admin_shares", byref(arr), byref(n))
        try:
            return [ShareInfo.from_c(arr[i]) for i in range(n.value)]
        finally:
            self._lib.gm_free(arr)

    def set_log_level(self, level):
        """Change the daemon's log level (gm_admin_set_log_level): "err", "warning", "notice", "info" or
        "debug"."""
        self._call("gm_admin_set_log_level", str_arg(level, "level"))
