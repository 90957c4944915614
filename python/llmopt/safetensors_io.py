"""A small safetensors reader and writer in pure Python (no numpy, no `safetensors`
package), and a Hugging Face checkpoint directory (config.json + model.safetensors, or
shards listed by model.safetensors.index.json).

Layout: u64 little-endian header length H; H bytes of JSON: {name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {str: str}}; then the data (offsets are
relative to the byte after the header). Shapes are row-major.
"""

import json
import math
import os
import struct
import sys
from array import array

DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2}
MAX_HEADER = 100 << 20


class SafetensorsError(ValueError):
    pass


def _f32_bytes(values):
    a = array("f", values)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def write_bytes(tensors, metadata=None):
    """tensors: list of (name, shape, flat values) written as F32, in order."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    off = 0
    for name, shape, values in tensors:
        if name in header:
            raise SafetensorsError("duplicate tensor %r" % name)
        if len(values) != math.prod(shape):
            raise SafetensorsError("tensor %r: %d values for shape %r" % (name, len(values), shape))
        b = _f32_bytes(values)
        header[name] = {"dtype": "F32", "shape": [int(d) for d in shape], "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


class SafetensorsFile:
    """Parsed safetensors file: `tensors` (name -> dict(dtype, shape, begin, end)),
    `metadata`, `order` (as listed)."""

    def __init__(self, path=None, blob=None):
        if blob is None:
            with open(path, "rb") as f:
                blob = f.read()
        self.path = path
        self.blob = blob
        where = path or "safetensors data"
        if len(blob) < 8:
            raise SafetensorsError("%s: truncated (no header length)" % where)
        (n,) = struct.unpack("<Q", blob[:8])
        if n > MAX_HEADER or 8 + n > len(blob):
            raise SafetensorsError("%s: header length %d past the end of the file (%d bytes)" % (where, n, len(blob)))
        try:
            header = json.loads(blob[8:8 + n].decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise SafetensorsError("%s: header is not JSON: %s" % (where, e))
        if not isinstance(header, dict):
            raise SafetensorsError("%s: header is not a JSON object" % where)
        self.metadata = header.pop("__metadata__", {}) or {}
        self.data_start = 8 + n
        size = len(blob) - self.data_start
        self.tensors = {}
        self.order = []
        for name, t in header.items():
            if not isinstance(t, dict) or t.get("dtype") not in DTYPE_SIZE:
                raise SafetensorsError("%s: tensor %r: dtype %r not read here (F32, F16, BF16)" % (
                    where, name, t.get("dtype") if isinstance(t, dict) else t))
            shape = t.get("shape")
            offs = t.get("data_offsets")
            if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                    or not isinstance(offs, list) or len(offs) != 2
                    or not all(isinstance(o, int) for o in offs)):
                raise SafetensorsError("%s: tensor %r: bad shape or data_offsets" % (where, name))
            b, e = offs
            if not 0 <= b <= e <= size or e - b != math.prod(shape) * DTYPE_SIZE[t["dtype"]]:
                raise SafetensorsError("%s: tensor %r: data_offsets %r do not fit shape %r %s in %d data bytes" % (
                    where, name, offs, shape, t["dtype"], size))
            self.tensors[name] = {"dtype": t["dtype"], "shape": list(shape), "begin": b, "end": e}
            self.order.append(name)

    def tensor_values(self, name):
        """Flat list of floats (row-major)."""
        t = self.tensors[name]
        raw = self.blob[self.data_start + t["begin"]:self.data_start + t["end"]]
        n = math.prod(t["shape"])
        if t["dtype"] == "F32":
            a = array("f")
            a.frombytes(raw)
            if sys.byteorder != "little":
                a.byteswap()
            return a.tolist()
        if t["dtype"] == "F16":
            return list(struct.unpack("<%de" % n, raw))
        # BF16: the high half of an f32
        hs = struct.unpack("<%dH" % n, raw)
        return list(struct.unpack("<%df" % n, struct.pack("<%dI" % n, *[h << 16 for h in hs])))


class HFCheckpoint:
    """A Hugging Face checkpoint directory: `config` (config.json) and `tensors`
    (name -> dict(shape, dtype, file)) over model.safetensors or its shards."""

    def __init__(self, path):
        self.path = path
        with open(os.path.join(path, "config.json")) as f:
            self.config = json.load(f)
        index = os.path.join(path, "model.safetensors.index.json")
        files = {}
        if os.path.exists(index):
            with open(index) as f:
                wm = json.load(f).get("weight_map", {})
            for fname in sorted(set(wm.values())):
                files[fname] = SafetensorsFile(os.path.join(path, fname))
            owner = {}
            for name, fname in wm.items():
                if name not in files[fname].tensors:
                    raise SafetensorsError("%s: index names %r in %s, which lacks it" % (path, name, fname))
                owner[name] = files[fname]
        else:
            st = SafetensorsFile(os.path.join(path, "model.safetensors"))
            owner = {name: st for name in st.order}
        self._owner = owner
        self.tensors = {n: dict(shape=f.tensors[n]["shape"], dtype=f.tensors[n]["dtype"]) for n, f in owner.items()}
        self.tensor_order = sorted(owner)

    def tensor_values(self, name):
        return self._owner[name].tensor_values(name)
