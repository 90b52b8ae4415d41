#!/usr/bin/env python3
"""Write the fuzzers' seed corpora (tests/fuzz/corpus/<fuzzer>/) from the presets and hand-made requests."""
import hashlib
import os
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.normpath(os.path.join(here, "..", ".."))


def put(name, data):
    d = os.path.join(here, "corpus", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
        f.write(data)


def varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, wire, payload):
    tag = varint(num << 3 | wire)
    if wire == 0:
        return tag + varint(payload)
    return tag + varint(len(payload)) + payload


def msg(op, body):
    return field(op, 2, body)


def header(body_len, request_id=1, n_fds=0, version=1, magic=0x4D454D47):
    return struct.pack("<IHHII", magic, version, n_fds, body_len, request_id)


# ---- frame: [n_fds received u8][packet]
hello = msg(1, field(1, 0, 1) + field(3, 2, b"seed"))
ping = msg(2, field(1, 0, 42))
for n_fds, pkt in [
    (0, header(len(hello)) + hello),
    (0, header(len(ping), 7) + ping),
    (1, header(0, 3, 1)),
    (0, header(5, 2)),
    (0, header(0xFFFFFFFF, 2)),
    (0, header(0, 2, 17)),
    (0, header(0, 2, 0, 2)),
    (0, header(0, 2, 0, 1, 0x12345678)),
    (0, b"GMEM"),
]:
    put("frame", bytes([n_fds]) + pkt)

# ---- request: [session][records]; see fuzz-request.c for the layout
def raw_body(body, n_fds=0, kinds=0):
    return bytes([0 | n_fds << 2 | kinds << 4]) + struct.pack("<H", len(body)) + body


def op(code, *fields, n_fds=0, kinds=0):
    return bytes([2 | n_fds << 2 | kinds << 4, code]) + bytes(fields)


seeds = [
    b"\x00" + raw_body(hello) + raw_body(ping),
    b"\x00" + raw_body(ping),  # not hello first
    b"\x01" + raw_body(msg(4, field(1, 0, 1))),  # topology with properties
    b"\x01" + raw_body(msg(100, b"")) + raw_body(msg(101, b"")) + raw_body(msg(106, b"")),
    b"\x03" + raw_body(msg(100, b"")),  # unprivileged admin op
    b"\x01" + raw_body(ping, 1, 0),  # an fd on an op that takes none
    b"\x01" + raw_body(msg(41, field(1, 0, 0) + field(2, 0, 0)), 1, 2),  # import a pipe
    b"\x01" + raw_body(msg(41, field(1, 0, 0)), 1, 4),  # import a directory
    b"\x01" + raw_body(msg(999, b"")),
    b"\x01" + raw_body(msg(12, b"") + msg(11, b"")),  # two ops
    b"\x01" + bytes([1]) + struct.pack("<H", 20) + header(4, 9) + b"\x12\x02\x08\x01",
    # structured: device alloc, map, export, import the export, free
    b"\x01" + op(1, 1, 2, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0) + op(4, 0, 2, 1, 2) + op(20, 0)
    + op(21, 0, 0, 0, n_fds=1, kinds=5) + op(3, 0) + op(3, 1),
    # host and managed memory, SVM attributes on the managed range
    b"\x01" + op(1, 2, 0, 3) + op(1, 3, 2, 1, 0, 1, 2) + op(22, 2, 1, 1, 0, 9, 1, 4, 0, 1, 0, 0, 2, 1)
    + op(23, 3, 0, 1, 0, 1, 0, 0, 0, 1, 0, 2) + op(24, 0, 1, 0, 0, 1, 0),
    # VMM: reserve, create, map, set access for a GPU and the CPU, get, retain, unmap, release, free
    b"\x01" + op(8, 2, 1, 0, 0, 0) + op(10, 2, 0, 0, 0) + op(13, 0, 0, 0, 2, 0, 1, 0)
    + op(16, 0, 0, 0, 2, 0, 2, 0, 0, 3, 1, 3) + op(18, 0, 0, 0, 0, 0) + op(19, 0, 0, 0)
    + op(15, 0, 0, 0, 2, 0) + op(12, 0) + op(9, 0, 0, 0, 2, 0),
    # sizes at the edges
    b"\x05" + op(1, 1, 5, 0, 0, 0) + op(1, 1, 4, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF)
    + op(8, 6) + op(10, 3, 1, 2, 3) + op(22, 2, 1, 2, 7, 7, 1, 7, 7),
]
for s in seeds:
    put("request", s)

# ---- topology: records [kind][a][b][len u16][content] from each preset
layout = {
    "system_properties": (0, 0, 0),
    "generation_id": (1, 0, 0),
}


def topo_seed(preset):
    base = os.path.join(root, "thunk", "presets", preset)
    out = b""
    for dirpath, _, files in sorted(os.walk(base)):
        for fn in sorted(files):
            rel = os.path.relpath(os.path.join(dirpath, fn), base)
            parts = rel.split("/")
            with open(os.path.join(dirpath, fn), "rb") as f:
                content = f.read()[:65535]
            if rel in layout:
                k, a, b = layout[rel]
            elif len(parts) == 3 and parts[0] == "nodes":
                k = {"properties": 2, "gpu_id": 3, "name": 4}.get(parts[2])
                if k is None:
                    continue
                a, b = int(parts[1]), 0
            elif len(parts) == 5 and parts[0] == "nodes" and parts[4] == "properties":
                k = {"mem_banks": 5, "caches": 6, "io_links": 7, "p2p_links": 8}.get(parts[2])
                if k is None:
                    continue
                a, b = int(parts[1]), int(parts[3])
            else:
                continue
            if a >= 70 or b >= 70:
                continue
            out += bytes([k, a, b]) + struct.pack("<H", len(content)) + content
    return out


for preset in ["apu", "workstation", "gfx908", "mi100"]:
    put("topology", topo_seed(preset))
put("topology", bytes([2, 0, 0]) + struct.pack("<H", 9) + b"garbage\n\n")

# ---- model ioctls: [kfd minor][fd sel][request sel][len][payload]...
def ioctl(fsel, rsel, payload=b""):
    return bytes([fsel, rsel, len(payload)]) + payload


GPU = 0  # the fuzzer substitutes nothing: gpu ids come from the payload
ioctl_seeds = [
    bytes([8]) + ioctl(0, 0) + ioctl(0, 11, struct.pack("<QI", 1, 8)) + ioctl(0, 21, b"\x00" * 16),
    bytes([8]) + ioctl(0, 12, struct.pack("<II", 0, 0)) + ioctl(0, 13, b"\x00" * 48) + ioctl(0, 14, b"\x00" * 8),
    bytes([8]) + ioctl(0, 19, struct.pack("<QQII", 1 << 40, 1 << 21, 0, 1) + struct.pack("<II", 2, 0)),
    bytes([8]) + ioctl(0xFF, 0) + ioctl(14, 24) + ioctl(0xFE, 0),
    bytes([1]) + ioctl(1, 25, b"\x00" * 16) + ioctl(1, 29, b"\x00" * 40) + ioctl(1, 28, b"\x00" * 16),
    bytes([8]) + ioctl(0, 0xC0, struct.pack("<I", 0xC0104B99)) + ioctl(15, 0),
    bytes([8]) + ioctl(0, 0xBE, b"\x00" * 13) + ioctl(0, 13, b"\x00" * 48) + ioctl(0, 0xBF),
]
for s in ioctl_seeds:
    put("model-ioctl", s)

# ---- engines: [queue type: 0 SDMA, 1 PM4, 2 AQL][ring size sel][ring bytes]; addresses from fuzz-engines.c
HOST = 0x510000000000
RW, RO, PAGE, VRAM = HOST + 0x10000, HOST + 0x30000, HOST + 0x8000, 0x200000000


def dw(*v):
    return struct.pack("<%dI" % len(v), *[x & 0xFFFFFFFF for x in v])


def lohi(a):
    return [a & 0xFFFFFFFF, a >> 32]


def p3(op, n):
    return (3 << 30) | (op << 8) | (n << 16)


engine_seeds = [
    # SDMA: NOP, copy host -> VRAM, fence, trap; a write into read-only memory
    bytes([0, 2]) + dw(0, 1, 0xFFF, 0, *lohi(RW), *lohi(VRAM), 5, *lohi(RW + 0x8000), 1, 6, 0),
    bytes([0, 1]) + dw(2, *lohi(RO), 1, 7, 8, 11 | 2 << 30, *lohi(RW), 0xA5, 60, 8 | 3 << 28 | 1 << 31,
                       *lohi(RW), 0, 0, 0xFFF << 16),
    # SDMA: an IB in the data area, an atomic and a timestamp
    bytes([0, 0]) + dw(4, *lohi(RW), 8, 0, 0, 10 | 0x2F << 25, *lohi(RW + 64), 1, 0, 0, 0, 0, 13 | 2 << 8,
                       *lohi(RW + 128)),
    # PM4: NOPs, WRITE_DATA, RELEASE_MEM with an interrupt, WAIT_REG_MEM, an IB
    bytes([1, 2]) + dw(p3(0x10, 0x3FFF), p3(0x37, 3), 5 << 8, *lohi(RW), 7, p3(0x49, 6), 0x514, 1 << 29 | 2 << 24,
                       *lohi(PAGE), 0, 0, 0, p3(0x3C, 5), 3 | 1 << 4, *lohi(RW), 7, 0xFF, 4,
                       p3(0x3F, 2), *lohi(RW), 4),
    bytes([1, 0]) + dw(p3(0x37, 3), 5 << 8, *lohi(VRAM + 0x10000), 1),
    # AQL: a barrier-AND on a signal in the data area, a dispatch, an unknown packet
    bytes([2, 1]) + struct.pack("<HH", 3, 0) + b"\0" * 4 + struct.pack("<5Q", RW, 0, 0, 0, 0) + b"\0" * 8
    + struct.pack("<Q", RW + 64)
    + struct.pack("<HH", 2, 0) + b"\0" * 28 + struct.pack("<QQ", RW, RW + 256) + b"\0" * 8 + struct.pack("<Q", 0)
    + struct.pack("<HH", 7, 0) + b"\0" * 60,
]
for s in engine_seeds:
    put("engines", s)
print("corpora written under", os.path.join(here, "corpus"), file=sys.stderr)
