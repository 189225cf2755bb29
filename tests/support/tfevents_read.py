#!/usr/bin/env python3
"""An independent reader of TensorBoard event files, for the tests.

Reads every events.out.tfevents.* file under the directories given and
prints one JSON object: per file its name's parts and its events. It shares
no code with the writer (client/src/profile/tfevents.c): its own CRC32C (bit by
bit, not a table), its own TFRecord framing and its own protobuf decoding
(varints, the four wire types, unknown fields skipped), from the formats as
TensorFlow defines them:

  - TFRecord (tensorflow/core/lib/io/record_writer.cc): uint64 length
    (little-endian), uint32 masked CRC32C of those 8 bytes, the data,
    uint32 masked CRC32C of the data; mask(c) = ((c >> 15) | (c << 17)) +
    0xa282ead8 (tensorflow/core/lib/hash/crc32c.h);
  - Event (tensorflow/core/util/event.proto): wall_time = 1 (double),
    step = 2 (int64), file_version = 3, summary = 5;
  - Summary (tensorflow/core/framework/summary.proto): value = 1; Value:
    tag = 1, simple_value = 2 (float), tensor = 8, metadata = 9;
    SummaryMetadata: plugin_data = 1 (plugin_name = 1, content = 2),
    data_class = 4;
  - TensorProto (tensor.proto): dtype = 1, tensor_shape = 2 (dim = 2),
    tensor_content = 4, float_val = 5.

Any framing or CRC error, a truncated record, or a field of the wrong wire
type is an error: exit 1 with the reason on stderr.

usage: tfevents_read.py DIR [DIR ...]
"""
import json
import os
import re
import struct
import sys

NAME = re.compile(r"^events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)\.v2$")
EMPTY = re.compile(r"^events\.out\.tfevents\.(\d{10})\.(.+)\.profile-empty$")


class Bad(Exception):
    pass


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = value = 0
    while True:
        if i >= len(buf):
            raise Bad("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise Bad("varint longer than 10 bytes")


def fields(buf):
    """(field number, wire type, value) of every field of a message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise Bad("field number 0")
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            if i + 8 > len(buf):
                raise Bad("truncated fixed64")
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(buf, i)
            if i + n > len(buf):
                raise Bad("truncated length-delimited field %d" % num)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            if i + 4 > len(buf):
                raise Bad("truncated fixed32")
            v, i = buf[i:i + 4], i + 4
        else:
            raise Bad("wire type %d" % wt)
        yield num, wt, v


def want(wt, expect, what):
    if wt != expect:
        raise Bad("%s has wire type %d, not %d" % (what, wt, expect))


def tensor(buf):
    t = {"dtype": 0, "dims": None, "content": None, "float_val": []}
    for num, wt, v in fields(buf):
        if num == 1:
            want(wt, 0, "TensorProto.dtype")
            t["dtype"] = v
        elif num == 2:
            want(wt, 2, "TensorProto.tensor_shape")
            t["dims"] = [0 for n, _, _ in fields(v) if n == 2]
        elif num == 4:
            want(wt, 2, "TensorProto.tensor_content")
            t["content"] = v
        elif num == 5:
            if wt == 2:
                t["float_val"] += [x[0] for x in struct.iter_unpack("<f", v)]
            else:
                want(wt, 5, "TensorProto.float_val")
                t["float_val"].append(struct.unpack("<f", v)[0])
    return t


def value(buf):
    out = {"tag": None, "simple_value": None, "tensor": None, "plugin_name": None, "data_class": 0}
    for num, wt, v in fields(buf):
        if num == 1:
            want(wt, 2, "Value.tag")
            out["tag"] = v.decode("utf-8")
        elif num == 2:
            want(wt, 5, "Value.simple_value")
            out["simple_value"] = struct.unpack("<f", v)[0]
        elif num == 8:
            want(wt, 2, "Value.tensor")
            t = tensor(v)
            if t["dtype"] != 1:
                raise Bad("tensor of dtype %d, not DT_FLOAT" % t["dtype"])
            if t["dims"] is None or t["dims"]:
                raise Bad("tensor is not a scalar (shape %r)" % t["dims"])
            if t["content"] is not None:
                if len(t["content"]) != 4:
                    raise Bad("a scalar float's tensor_content of %d bytes" % len(t["content"]))
                out["tensor"] = struct.unpack("<f", t["content"])[0]
            elif len(t["float_val"]) == 1:
                out["tensor"] = t["float_val"][0]
            else:
                raise Bad("a scalar tensor without its value")
        elif num == 9:
            want(wt, 2, "Value.metadata")
            for mn, mwt, mv in fields(v):
                if mn == 1:
                    want(mwt, 2, "SummaryMetadata.plugin_data")
                    for pn, pwt, pv in fields(mv):
                        if pn == 1:
                            want(pwt, 2, "PluginData.plugin_name")
                            out["plugin_name"] = pv.decode("utf-8")
                elif mn == 4:
                    want(mwt, 0, "SummaryMetadata.data_class")
                    out["data_class"] = mv
    return out


def event(buf):
    ev = {"wall_time": None, "step": 0, "file_version": None, "values": []}
    for num, wt, v in fields(buf):
        if num == 1:
            want(wt, 1, "Event.wall_time")
            ev["wall_time"] = struct.unpack("<d", v)[0]
        elif num == 2:
            want(wt, 0, "Event.step")
            ev["step"] = v - (1 << 64) if v >> 63 else v
        elif num == 3:
            want(wt, 2, "Event.file_version")
            ev["file_version"] = v.decode("utf-8")
        elif num == 5:
            want(wt, 2, "Event.summary")
            for sn, swt, sv in fields(v):
                if sn == 1:
                    want(swt, 2, "Summary.value")
                    ev["values"].append(value(sv))
    return ev


def records(data):
    i = 0
    while i < len(data):
        if i + 12 > len(data):
            raise Bad("truncated record header at byte %d" % i)
        head = data[i:i + 8]
        (n,) = struct.unpack("<Q", head)
        (hc,) = struct.unpack("<I", data[i + 8:i + 12])
        if hc != masked(head):
            raise Bad("length CRC mismatch at byte %d" % i)
        if i + 12 + n + 4 > len(data):
            raise Bad("truncated record at byte %d" % i)
        body = data[i + 12:i + 12 + n]
        (dc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
        if dc != masked(body):
            raise Bad("data CRC mismatch in the record at byte %d" % i)
        yield body
        i += 16 + n


def main(dirs):
    out = []
    for d in dirs:
        for name in sorted(os.listdir(d)):
            if "tfevents" not in name:
                continue
            m = NAME.match(name)
            empty = EMPTY.match(name)
            if not m and not empty:
                raise Bad("%s: not events.out.tfevents.SECONDS.HOST.PID.N.v2 or SECONDS.HOST.profile-empty" % name)
            with open(os.path.join(d, name), "rb") as f:
                data = f.read()
            try:
                evs = [event(r) for r in records(data)]
            except Bad as e:
                raise Bad("%s: %s" % (os.path.join(d, name), e))
            if empty:
                out.append({"dir": d, "name": name, "kind": "profile-empty", "seconds": int(empty.group(1)),
                            "host": empty.group(2), "events": evs})
            else:
                out.append({"dir": d, "name": name, "kind": "v2", "seconds": int(m.group(1)), "host": m.group(2),
                            "pid": int(m.group(3)), "uid": int(m.group(4)), "events": evs})
    json.dump({"files": out}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: tfevents_read.py DIR [DIR ...]")
    try:
        main(sys.argv[1:])
    except (Bad, OSError, UnicodeDecodeError) as e:
        sys.stderr.write("tfevents_read.py: %s\n" % e)
        sys.exit(1)
