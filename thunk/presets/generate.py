#!/usr/bin/env python3
# Generates the KFD model's topology presets (sysfs layout) under thunk/presets/<name>/; run after editing.
"""Write every preset tree next to this script.

The trees are committed; re-run `python3 thunk/presets/generate.py` after changing this file and commit
the result. Keys and their order follow what amdkfd writes to /sys/devices/virtual/kfd/kfd/topology;
values are plain decimals. Every file stays below 4096 bytes, the most libhsakmt reads from one file.
"""

import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# kfd_sysfs.h
CAP_WATCH_POINTS = 0x80
CAP_WATCH_BITS_2 = 2 << 8
CAP_DOORBELL_2_0 = 2 << 12
CAP_AQL_DOUBLE_MAP = 0x4000
CAP_MEM_EDC = 0x100000
CAP_RAS_EVENT = 0x200000
CAP_SRAM_EDC = 0x4000000
CAP_SVM = 0x8000000
CAP_DEBUG_FW = 0x20000000  # never set: the model does not implement RUNTIME_ENABLE

HEAP_SYSTEM, HEAP_FB_PUBLIC, HEAP_FB_PRIVATE = 0, 1, 2
CACHE_DATA, CACHE_INST, CACHE_CPU, CACHE_HSACU = 1, 2, 4, 8
LINK_HT, LINK_PCIE, LINK_XGMI = 1, 2, 11
LINK_ENABLED, LINK_NO_P2P = 1, 16

# Weights as amdkfd assigns them: PCIe 20, XGMI 15 per hop, CPU-CPU the SLIT distance.
W_PCIE, W_XGMI, W_NUMA_REMOTE = 20, 15, 32

GIB = 1 << 30
SIMD_ID_BASE = 0x80001000

NODE_KEYS_COMMON = [
    "cpu_cores_count", "simd_count", "mem_banks_count", "caches_count", "io_links_count", "p2p_links_count",
    "cpu_core_id_base", "simd_id_base", "max_waves_per_simd", "lds_size_in_kb", "gds_size_in_kb", "num_gws",
    "wave_front_size", "array_count", "simd_arrays_per_engine", "cu_per_simd_array", "simd_per_cu",
    "max_slots_scratch_cu", "gfx_target_version", "vendor_id", "device_id", "location_id", "domain",
    "drm_render_minor", "hive_id", "num_sdma_engines", "num_sdma_xgmi_engines", "num_sdma_queues_per_engine",
    "num_cp_queues",
]
# Written only for nodes with a GPU (dGPU or APU).
NODE_KEYS_GPU = [
    "max_engine_clk_fcompute", "local_mem_size", "fw_version", "capability", "debug_prop", "sdma_fw_version",
    "unique_id", "num_xcc",
]
NODE_KEYS_TAIL = ["max_engine_clk_ccompute"]

LINK_KEYS = ["type", "version_major", "version_minor", "node_from", "node_to", "weight", "min_latency",
             "max_latency", "min_bandwidth", "max_bandwidth", "recommended_transfer_size",
             "recommended_sdma_engine_id_mask", "flags"]
BANK_KEYS = ["heap_type", "size_in_bytes", "flags", "width", "mem_clk_max"]
CACHE_KEYS = ["processor_id_low", "level", "size", "cache_line_size", "cache_lines_per_tag", "association",
              "latency", "type"]


def ascii_le(text):
    """ACPI table ids are packed into the platform numbers little-endian, as the kernel copies them."""
    return int.from_bytes(text.encode("ascii"), "little")


# ASIC descriptions. simd_count = active CUs * simd_per_cu.
GFX908 = dict(name="arcturus", gfx=90008, device_id=0x738C, cus=120, simd_per_cu=4, wave=64, waves=8,
              lds=64, gds=0, gws=64, arrays=8, arrays_per_engine=1, cu_per_array=16, scratch_slots=32,
              sdma=2, sdma_xgmi=6, sdma_queues=8, cp_queues=24, fclk=1502, fw=65, sdma_fw=18, xcc=1,
              cap=CAP_WATCH_POINTS | CAP_WATCH_BITS_2 | CAP_DOORBELL_2_0 | CAP_AQL_DOUBLE_MAP | CAP_MEM_EDC
              | CAP_RAS_EVENT | CAP_SRAM_EDC | CAP_SVM,
              vram_width=4096, vram_clk=1200,
              caches=[(1, 16, 64, CACHE_DATA | CACHE_HSACU, 1), (1, 16, 64, CACHE_DATA | CACHE_HSACU, 3),
                      (1, 32, 64, CACHE_INST | CACHE_HSACU, 2), (2, 8192, 128, CACHE_DATA | CACHE_HSACU, 0)])
GFX942 = dict(name="ip discovery", gfx=90402, device_id=0x74A1, cus=304, simd_per_cu=4, wave=64, waves=8,
              lds=64, gds=0, gws=64, arrays=32, arrays_per_engine=1, cu_per_array=10, scratch_slots=32,
              sdma=2, sdma_xgmi=14, sdma_queues=8, cp_queues=24, fclk=2100, fw=177, sdma_fw=19, xcc=8,
              cap=CAP_WATCH_POINTS | CAP_WATCH_BITS_2 | CAP_DOORBELL_2_0 | CAP_AQL_DOUBLE_MAP | CAP_MEM_EDC
              | CAP_RAS_EVENT | CAP_SRAM_EDC | CAP_SVM,
              vram_width=8192, vram_clk=1300,
              caches=[(1, 32, 128, CACHE_DATA | CACHE_HSACU, 1), (1, 16, 64, CACHE_DATA | CACHE_HSACU, 2),
                      (1, 64, 128, CACHE_INST | CACHE_HSACU, 2), (2, 4096, 128, CACHE_DATA | CACHE_HSACU, 38),
                      (3, 262144, 64, CACHE_DATA | CACHE_HSACU, 0)])
GFX1030 = dict(name="sienna_cichlid", gfx=100300, device_id=0x73BF, cus=72, simd_per_cu=2, wave=32, waves=16,
               lds=64, gds=0, gws=64, arrays=8, arrays_per_engine=2, cu_per_array=10, scratch_slots=32,
               sdma=4, sdma_xgmi=0, sdma_queues=2, cp_queues=8, fclk=2250, fw=115, sdma_fw=83, xcc=1,
               cap=CAP_WATCH_POINTS | CAP_WATCH_BITS_2 | CAP_DOORBELL_2_0 | CAP_AQL_DOUBLE_MAP | CAP_SVM,
               vram_width=256, vram_clk=1000,
               caches=[(1, 16, 128, CACHE_DATA | CACHE_HSACU, 1), (1, 16, 64, CACHE_DATA | CACHE_HSACU, 2),
                       (1, 32, 64, CACHE_INST | CACHE_HSACU, 2), (2, 4096, 128, CACHE_DATA | CACHE_HSACU, 0),
                       (3, 131072, 64, CACHE_DATA | CACHE_HSACU, 0)])
GFX90C = dict(name="renoir", gfx=90012, device_id=0x1636, cus=8, simd_per_cu=4, wave=64, waves=10,
              lds=64, gds=0, gws=64, arrays=1, arrays_per_engine=1, cu_per_array=8, scratch_slots=32,
              sdma=1, sdma_xgmi=0, sdma_queues=2, cp_queues=24, fclk=2100, fw=470, sdma_fw=40, xcc=1,
              cap=CAP_WATCH_POINTS | CAP_WATCH_BITS_2 | CAP_DOORBELL_2_0 | CAP_AQL_DOUBLE_MAP | CAP_SVM,
              vram_width=0, vram_clk=0,
              caches=[(1, 16, 64, CACHE_DATA | CACHE_HSACU, 1), (1, 16, 64, CACHE_DATA | CACHE_HSACU, 2),
                      (1, 64, 64, CACHE_INST | CACHE_HSACU, 2), (2, 1024, 64, CACHE_DATA | CACHE_HSACU, 0)])

# (level, KiB, line, type) for one CPU core complex; one entry each, sharing given by the sibling map.
CPU_CACHES = [(1, 32, 64, CACHE_DATA | CACHE_CPU), (1, 32, 64, CACHE_INST | CACHE_CPU),
              (2, 1024, 64, CACHE_DATA | CACHE_INST | CACHE_CPU), (3, 32768, 64, CACHE_DATA | CACHE_INST | CACHE_CPU)]


class Node:
    def __init__(self):
        self.gpu_id = 0
        self.name = ""
        self.props = {}
        self.banks = []
        self.caches = []
        self.links = []
        self.p2p = []


def sibling_map(count, total):
    return ",".join("1" if i < count else "0" for i in range(total))


def cache_entry(proc_id, level, kib, line, ctype, assoc, siblings):
    d = dict(processor_id_low=proc_id, level=level, size=kib, cache_line_size=line, cache_lines_per_tag=1,
             association=assoc, latency=0, type=ctype)
    return d, siblings


def link(ltype, frm, to, weight, min_bw, max_bw, flags=LINK_ENABLED):
    return dict(type=ltype, version_major=0, version_minor=0, node_from=frm, node_to=to, weight=weight,
                min_latency=0, max_latency=0, min_bandwidth=min_bw, max_bandwidth=max_bw,
                recommended_transfer_size=0, recommended_sdma_engine_id_mask=0, flags=flags)


def cpu_node(cores, core_base, mem_bytes, clk=3700, with_props=True):
    n = Node()
    n.props = dict.fromkeys(NODE_KEYS_COMMON, 0)
    n.props.update(cpu_cores_count=cores, cpu_core_id_base=core_base, max_engine_clk_ccompute=clk)
    n.banks = [dict(heap_type=HEAP_SYSTEM, size_in_bytes=mem_bytes, flags=0, width=64, mem_clk_max=2400)]
    assoc = {1: 8, 2: 8, 3: 16}
    for level, kib, line, ctype in CPU_CACHES:
        share = 1 if level < 3 else min(cores, 8)
        n.caches.append(cache_entry(core_base, level, kib, line, ctype, assoc[level],
                                    sibling_map(share, min(cores, 64))))
    return n


def gpu_props(asic, simd_base, loc, minor, hive, unique, vram, cpu_cores=0):
    p = dict.fromkeys(NODE_KEYS_COMMON + NODE_KEYS_GPU, 0)
    p.update(cpu_cores_count=cpu_cores, simd_count=asic["cus"] * asic["simd_per_cu"], simd_id_base=simd_base,
             max_waves_per_simd=asic["waves"], lds_size_in_kb=asic["lds"], gds_size_in_kb=asic["gds"],
             num_gws=asic["gws"], wave_front_size=asic["wave"], array_count=asic["arrays"],
             simd_arrays_per_engine=asic["arrays_per_engine"], cu_per_simd_array=asic["cu_per_array"],
             simd_per_cu=asic["simd_per_cu"], max_slots_scratch_cu=asic["scratch_slots"],
             gfx_target_version=asic["gfx"], vendor_id=0x1002, device_id=asic["device_id"], location_id=loc,
             domain=0, drm_render_minor=minor, hive_id=hive, num_sdma_engines=asic["sdma"],
             num_sdma_xgmi_engines=asic["sdma_xgmi"], num_sdma_queues_per_engine=asic["sdma_queues"],
             num_cp_queues=asic["cp_queues"], max_engine_clk_fcompute=asic["fclk"], local_mem_size=vram,
             fw_version=asic["fw"], capability=asic["cap"], debug_prop=0, sdma_fw_version=asic["sdma_fw"],
             unique_id=unique, num_xcc=asic["xcc"], max_engine_clk_ccompute=3700)
    assert not p["capability"] & CAP_DEBUG_FW
    return p


def gpu_caches(asic, simd_base):
    cus = asic["cus"]
    out = []
    assoc = {1: 64, 2: 16, 3: 16}
    for level, kib, line, ctype, share in asic["caches"]:
        share = share or cus  # 0: shared by every CU
        out.append(cache_entry(simd_base, level, kib, line, ctype, assoc[level], sibling_map(share, share)))
    return out


def gpu_id_for(seed):
    """Distinct non-zero 16-bit ids that look like amdkfd's hashed gpu_ids."""
    v = (seed * 40503 + 0x5A17) & 0xFFFF
    return v or 1


def finish_counts(nodes):
    for n in nodes:
        n.props["mem_banks_count"] = len(n.banks)
        n.props["caches_count"] = len(n.caches)
        n.props["io_links_count"] = len(n.links)
        n.props["p2p_links_count"] = len(n.p2p)
        # Keep the kernel's key order.
        order = NODE_KEYS_COMMON + (NODE_KEYS_GPU if n.props["simd_count"] else []) + NODE_KEYS_TAIL
        n.props = {k: n.props[k] for k in order}


def add_dgpus(nodes, asic, cpu_of_gpu, vram, large_bar, hive=0, buses=None, pcie_bw=(312, 32000),
              p2p=False):
    """Append one GPU node per entry of cpu_of_gpu (its nearest CPU node), with links as amdkfd makes them."""
    simd_base = SIMD_ID_BASE
    first = len(nodes)
    for i, cpu in enumerate(cpu_of_gpu):
        idx = len(nodes)
        bus = buses[i] if buses else 0x03 + 0x20 * i
        g = Node()
        g.gpu_id = gpu_id_for(idx + 7 * i + 1)
        g.name = asic["name"]
        unique = (0x3F5A_0000_0000_0000 | (asic["device_id"] << 24) | (bus << 8) | idx) & (2**64 - 1)
        g.props = gpu_props(asic, simd_base, bus << 8, 128 + i, hive, unique, vram)
        g.banks = [dict(heap_type=HEAP_FB_PUBLIC if large_bar else HEAP_FB_PRIVATE, size_in_bytes=vram, flags=0,
                        width=asic["vram_width"], mem_clk_max=asic["vram_clk"])]
        g.caches = gpu_caches(asic, simd_base)
        g.links.append(link(LINK_PCIE, idx, cpu, W_PCIE, pcie_bw[0], pcie_bw[1]))
        c = nodes[cpu]
        c.links.append(link(LINK_PCIE, cpu, idx, W_PCIE, pcie_bw[0], pcie_bw[1],
                            LINK_ENABLED if large_bar else LINK_ENABLED | LINK_NO_P2P))
        simd_base += g.props["simd_count"]
        nodes.append(g)
    gpus = list(range(first, len(nodes)))
    for a in gpus:
        for b in gpus:
            if a == b:
                continue
            if hive:
                nodes[a].links.append(link(LINK_XGMI, a, b, W_XGMI, 50000, 50000))
            elif p2p and large_bar:
                # Indirect PCIe peer path: GPU -> CPU (-> CPU) -> GPU, weights summed.
                ca, cb = cpu_of_gpu[a - first], cpu_of_gpu[b - first]
                w = W_PCIE + W_PCIE + (W_NUMA_REMOTE if ca != cb else 0)
                nodes[a].p2p.append(link(LINK_PCIE, a, b, w, pcie_bw[0], pcie_bw[1]))


def link_cpus(nodes, cpus):
    for a in cpus:
        for b in cpus:
            if a != b:
                nodes[a].links.append(link(LINK_HT, a, b, W_NUMA_REMOTE, 0, 0))


def preset_mi300x():
    nodes = [cpu_node(96, 0, 768 * GIB), cpu_node(96, 96, 768 * GIB)]
    link_cpus(nodes, [0, 1])
    hive = 0x6D3A_51C2_9E04_B817
    buses = [0x05, 0x25, 0x45, 0x65, 0x85, 0xA5, 0xC5, 0xE5]
    add_dgpus(nodes, GFX942, [0, 0, 0, 0, 1, 1, 1, 1], 192 * GIB, True, hive=hive, buses=buses,
              pcie_bw=(312, 64000))
    return nodes


def preset_mi100():
    nodes = [cpu_node(32, 0, 256 * GIB), cpu_node(32, 32, 256 * GIB)]
    link_cpus(nodes, [0, 1])
    add_dgpus(nodes, GFX908, [0, 0, 1, 1], 32 * GIB, True, buses=[0x23, 0x43, 0x83, 0xC3], p2p=True)
    return nodes


def preset_workstation():
    nodes = [cpu_node(16, 0, 128 * GIB)]
    add_dgpus(nodes, GFX1030, [0, 0], 16 * GIB, False, buses=[0x0B, 0x0C])
    return nodes


def preset_gfx908():
    nodes = [cpu_node(16, 0, 64 * GIB)]
    add_dgpus(nodes, GFX908, [0], 32 * GIB, True, buses=[0x03])
    return nodes


def preset_apu():
    # One KFD node carries the CPU cores and the GPU; its memory is the system heap.
    n = cpu_node(8, 0, 32 * GIB)
    n.gpu_id = gpu_id_for(1)
    n.name = GFX90C["name"]
    cpu_props = n.props
    n.props = gpu_props(GFX90C, SIMD_ID_BASE, 0x05 << 8, 128, 0, 0x2A1B_3C4D_0000_0501, 0, cpu_cores=8)
    n.props["cpu_core_id_base"] = cpu_props["cpu_core_id_base"]
    n.caches += gpu_caches(GFX90C, SIMD_ID_BASE)
    return [n]


PRESETS = {
    "mi300x": preset_mi300x,
    "mi100": preset_mi100,
    "workstation": preset_workstation,
    "apu": preset_apu,
    "gfx908": preset_gfx908,
}


def write(path, text):
    assert len(text.encode()) < 4096, path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def kv(d, extra=None):
    lines = ["%s %d" % (k, v) for k, v in d.items()]
    if extra is not None:
        lines.append("sibling_map " + extra)
    return "\n".join(lines) + "\n"


def emit(name, nodes):
    root = os.path.join(HERE, name)
    if os.path.isdir(root):
        shutil.rmtree(root)
    finish_counts(nodes)
    ids = [n.gpu_id for n in nodes if n.gpu_id]
    assert len(ids) == len(set(ids)) and all(0 < i < 0x10000 for i in ids)
    write(os.path.join(root, "generation_id"), "1\n")
    write(os.path.join(root, "system_properties"),
          kv(dict(platform_oem=ascii_le("AMD   "), platform_id=ascii_le("AMD CRAT"), platform_rev=1)))
    for i, n in enumerate(nodes):
        d = os.path.join(root, "nodes", str(i))
        write(os.path.join(d, "gpu_id"), "%d\n" % n.gpu_id)
        write(os.path.join(d, "name"), n.name + "\n")
        write(os.path.join(d, "properties"), kv(n.props))
        for j, b in enumerate(n.banks):
            write(os.path.join(d, "mem_banks", str(j), "properties"), kv(b))
        for j, (c, sib) in enumerate(n.caches):
            write(os.path.join(d, "caches", str(j), "properties"), kv(c, sib))
        for j, l in enumerate(n.links):
            write(os.path.join(d, "io_links", str(j), "properties"), kv(l))
        for j, l in enumerate(n.p2p):
            write(os.path.join(d, "p2p_links", str(j), "properties"), kv(l))


def main(argv):
    names = argv[1:] or sorted(PRESETS)
    for name in names:
        emit(name, PRESETS[name]())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
