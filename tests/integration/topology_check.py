#!/usr/bin/env python3
"""Independent check of a serialized TopologyProto, for it_topology.

usage: topology_check.py FILE MESH TASKS PER BLOCK
  MESH  "4,4,1,2": [x, y, z, cores per chip]
  BLOCK "2,2,1":   chips a host owns in x, y, z

Computes what TensorFlow would hold for that slice and compares byte for
byte:
- device_coordinates[task][device] as a Cloud TPU slice places its devices:
  each host (task) owns a contiguous block of chips, the blocks tile the mesh
  x first, then y, then z; inside a host the device ordinals go core on chip
  first, then x, y, z (a v3-8's devices 0..7 are [0,0,0,0], [0,0,0,1],
  [1,0,0,0], [1,0,0,1], [0,1,0,0], ...);
- the bytes of Topology.serialized() (tensorflow/python/tpu/topology.py):
  a TopologyProto (tensorflow/core/protobuf/tpu/topology.proto, proto3) with
  mesh_shape = 1 (repeated int32, packed), num_tasks = 2, num_tpu_devices_per_task = 3,
  device_coordinates = 4 (repeated int32, packed, flattened [task, device, axis]),
  fields in number order and zero scalars left out, as protobuf serializes.
The file is also decoded with a hand-written wire-format reader (no protobuf
library) so that a difference is reported field by field. Prints OK or the
difference; exit status 0 only for OK."""
import sys


def varint(v):
    if v < 0:
        v += 1 << 64  # int32 negatives are 10-byte varints
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode(mesh, tasks, per, coords):
    out = bytearray()
    if mesh:
        body = b"".join(varint(v) for v in mesh)
        out += varint(1 << 3 | 2) + varint(len(body)) + body
    if tasks:
        out += varint(2 << 3 | 0) + varint(tasks)
    if per:
        out += varint(3 << 3 | 0) + varint(per)
    if coords:
        body = b"".join(varint(v) for v in coords)
        out += varint(4 << 3 | 2) + varint(len(body)) + body
    return bytes(out)


def read_varint(b, i):
    v = shift = 0
    while True:
        if i >= len(b) or shift > 63:
            raise ValueError("truncated varint at byte %d" % i)
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            if v >= 1 << 63:
                v -= 1 << 64
            return v, i


def decode(b):
    f = {1: [], 2: 0, 3: 0, 4: []}
    i = 0
    while i < len(b):
        key, i = read_varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(b, i)
            if num in (1, 4):
                f[num].append(v)
            else:
                f[num] = v
        elif wt == 2:
            n, i = read_varint(b, i)
            end = i + n
            if end > len(b):
                raise ValueError("field %d runs past the end" % num)
            if num in (1, 4):
                while i < end:
                    v, i = read_varint(b, i)
                    f[num].append(v)
            i = end
        else:
            raise ValueError("field %d has wire type %d" % (num, wt))
    return f


def expected_coords(mesh, tasks, per, block):
    bx, by, bz = block
    gx, gy = mesh[0] // bx, mesh[1] // by
    cpc = mesh[3]
    out = []
    for t in range(tasks):
        ox, oy, oz = (t % gx) * bx, (t // gx) % gy * by, t // (gx * gy) * bz
        for d in range(per):
            chip = d // cpc
            out += [ox + chip % bx, oy + chip // bx % by, oz + chip // (bx * by), d % cpc]
    return out


def main():
    path, mesh, tasks, per, block = sys.argv[1:6]
    mesh = [int(v) for v in mesh.split(",")]
    block = [int(v) for v in block.split(",")]
    tasks, per = int(tasks), int(per)
    got = open(path, "rb").read()
    coords = expected_coords(mesh, tasks, per, block)
    # every place of the mesh exactly once
    places = {tuple(coords[i:i + 4]) for i in range(0, len(coords), 4)}
    if len(places) != tasks * per or tasks * per != mesh[0] * mesh[1] * mesh[2] * mesh[3]:
        print("the expected layout does not fill the mesh once (a bad test argument)")
        return 1
    want = encode(mesh, tasks, per, coords)
    if got == want:
        print("OK %d bytes" % len(got))
        return 0
    print("bytes differ:\n got  %s\n want %s" % (got.hex(), want.hex()))
    try:
        f = decode(got)
    except ValueError as e:
        print("not a TopologyProto: %s" % e)
        return 1
    for num, name, w in ((1, "mesh_shape", mesh), (2, "num_tasks", tasks),
                         (3, "num_tpu_devices_per_task", per), (4, "device_coordinates", coords)):
        if f[num] != w:
            print("%s: got %s, want %s" % (name, f[num], w))
    return 1


sys.exit(main())
