"""A small GGUF v3 writer and reader in pure Python (no numpy, no `gguf` package).

Layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv;
n_kv x {string key, u32 value type, value}; n_tensors x {string name, u32 n_dims,
u64 ne[n_dims] (innermost first), u32 ggml type, u64 offset}; padding to the
alignment (`general.alignment`, default 32); the data section. Tensor offsets are
relative to the data section and multiples of the alignment.

Shapes in this module's API are row-major (outermost first, as in torch); the file
stores `ne` reversed.
"""

import struct
import sys
from array import array

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
DEFAULT_ALIGNMENT = 32

# Metadata value types (on-disk numbering).
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)

_SCALAR_FMT = {
    UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
    FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d",
}

# Tensor types (ggml numbering).
GGML_F32 = 0
GGML_F16 = 1
_TYPE_SIZE = {GGML_F32: 4, GGML_F16: 2}
GGML_TYPE_NAMES = {GGML_F32: "F32", GGML_F16: "F16"}

# Token types of tokenizer.ggml.token_type (llama.cpp numbering).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


def _align(n, a):
    return (n + a - 1) // a * a


def _pack_string(s):
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _pack_value(vtype, value):
    if vtype == STRING:
        return _pack_string(value)
    if vtype == ARRAY:
        raise ValueError("nested arrays: use add_array")
    return struct.pack(_SCALAR_FMT[vtype], value)


def f32_bytes(values):
    """Little-endian f32 bytes of a flat sequence of numbers."""
    a = array("f", values)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def f16_bytes(values):
    return struct.pack("<%de" % len(values), *values)


class GGUFWriter:
    def __init__(self, alignment=DEFAULT_ALIGNMENT):
        self.alignment = alignment
        self.kv = []          # (key, type, packed value bytes)
        self.keys = set()
        self.tensors = []     # (name, shape row-major, ggml type, data bytes)
        self.names = set()
        if alignment != DEFAULT_ALIGNMENT:
            self.add_u32("general.alignment", alignment)

    def _add(self, key, vtype, packed):
        if key in self.keys:
            raise ValueError("duplicate GGUF key %r" % key)
        self.keys.add(key)
        self.kv.append((key, vtype, packed))

    def add_string(self, key, value):
        self._add(key, STRING, _pack_string(value))

    def add_u32(self, key, value):
        self._add(key, UINT32, struct.pack("<I", value))

    def add_i32(self, key, value):
        self._add(key, INT32, struct.pack("<i", value))

    def add_u64(self, key, value):
        self._add(key, UINT64, struct.pack("<Q", value))

    def add_f32(self, key, value):
        self._add(key, FLOAT32, struct.pack("<f", value))

    def add_f64(self, key, value):
        self._add(key, FLOAT64, struct.pack("<d", value))

    def add_bool(self, key, value):
        self._add(key, BOOL, struct.pack("<?", bool(value)))

    def add_scalar(self, key, vtype, value):
        self._add(key, vtype, _pack_value(vtype, value))

    def add_array(self, key, elem_type, values):
        if elem_type == ARRAY:
            raise ValueError("nested arrays are not supported")
        body = [struct.pack("<IQ", elem_type, len(values))]
        if elem_type == STRING:
            body.extend(_pack_string(v) for v in values)
        elif elem_type == FLOAT32:
            body.append(f32_bytes(values))
        else:
            fmt = _SCALAR_FMT[elem_type]
            body.append(struct.pack("<%d%s" % (len(values), fmt[1]), *values))
        self._add(key, ARRAY, b"".join(body))

    def add_tensor(self, name, shape, ggml_type, data):
        """shape: row-major (torch order); data: raw little-endian bytes."""
        if name in self.names:
            raise ValueError("duplicate tensor %r" % name)
        if ggml_type not in _TYPE_SIZE:
            raise ValueError("tensor type %r not supported by this writer" % ggml_type)
        if not 1 <= len(shape) <= 4:
            raise ValueError("tensor %r: %d dims" % (name, len(shape)))
        n = 1
        for d in shape:
            n *= int(d)
        if len(data) != n * _TYPE_SIZE[ggml_type]:
            raise ValueError("tensor %r: %d bytes for shape %r of type %d" % (name, len(data), shape, ggml_type))
        self.names.add(name)
        self.tensors.append((name, [int(d) for d in shape], ggml_type, bytes(data)))

    def add_tensor_f32(self, name, shape, values):
        self.add_tensor(name, shape, GGML_F32, f32_bytes(values))

    def to_bytes(self):
        out = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self.kv))]
        for key, vtype, packed in self.kv:
            out.append(_pack_string(key))
            out.append(struct.pack("<I", vtype))
            out.append(packed)
        offset = 0
        offsets = []
        for name, shape, gtype, data in self.tensors:
            offsets.append(offset)
            offset = _align(offset + len(data), self.alignment)
        for (name, shape, gtype, data), off in zip(self.tensors, offsets):
            ne = list(reversed(shape))
            out.append(_pack_string(name))
            out.append(struct.pack("<I", len(ne)))
            out.append(struct.pack("<%dQ" % len(ne), *ne))
            out.append(struct.pack("<IQ", gtype, off))
        head = b"".join(out)
        parts = [head, b"\0" * (_align(len(head), self.alignment) - len(head))]
        for name, shape, gtype, data in self.tensors:
            parts.append(data)
            parts.append(b"\0" * (_align(len(data), self.alignment) - len(data)))
        return b"".join(parts)

    def write(self, path):
        blob = self.to_bytes()
        with open(path, "wb") as f:
            f.write(blob)
        return len(blob)


class GGUFFile:
    """Parsed GGUF file: `kv` (key -> python value), `kv_types`, `tensors`
    (name -> dict(shape row-major, type, offset, nbytes)), `tensor_order`."""

    def __init__(self, path=None, blob=None):
        if blob is None:
            with open(path, "rb") as f:
                blob = f.read()
        self.blob = blob
        self.pos = 0
        if self._read(4) != GGUF_MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        (self.version,) = self._unpack("<I")
        if self.version not in (2, 3):
            raise ValueError("GGUF version %d not supported" % self.version)
        n_tensors, n_kv = self._unpack("<QQ")
        self.kv = {}
        self.kv_types = {}
        for _ in range(n_kv):
            key = self._string()
            (vtype,) = self._unpack("<I")
            if key in self.kv:
                raise ValueError("duplicate key %r" % key)
            self.kv[key] = self._value(vtype)
            self.kv_types[key] = vtype
        self.alignment = int(self.kv.get("general.alignment", DEFAULT_ALIGNMENT))
        self.tensors = {}
        self.tensor_order = []
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            ne = list(self._unpack("<%dQ" % n_dims))
            gtype, off = self._unpack("<IQ")
            if gtype not in _TYPE_SIZE:
                raise ValueError("tensor %r: type %d not supported by this reader" % (name, gtype))
            n = 1
            for d in ne:
                n *= d
            self.tensors[name] = {"shape": list(reversed(ne)), "type": gtype, "offset": off,
                                  "nbytes": n * _TYPE_SIZE[gtype], "n": n}
            self.tensor_order.append(name)
        self.data_start = _align(self.pos, self.alignment)
        for name, t in self.tensors.items():
            if t["offset"] % self.alignment:
                raise ValueError("tensor %r: offset %d not aligned" % (name, t["offset"]))
            if self.data_start + t["offset"] + t["nbytes"] > len(blob):
                raise ValueError("tensor %r: data past the end of the file" % name)

    def _read(self, n):
        if self.pos + n > len(self.blob):
            raise ValueError("truncated GGUF file at %d" % self.pos)
        b = self.blob[self.pos:self.pos + n]
        self.pos += n
        return b

    def _unpack(self, fmt):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self._read(size))

    def _string(self):
        (n,) = self._unpack("<Q")
        return self._read(n).decode("utf-8")

    def _value(self, vtype):
        if vtype == STRING:
            return self._string()
        if vtype == ARRAY:
            etype, n = self._unpack("<IQ")
            if etype == STRING:
                return [self._string() for _ in range(n)]
            if etype == ARRAY:
                return [self._value(ARRAY) for _ in range(n)]
            fmt = _SCALAR_FMT[etype]
            return list(self._unpack("<%d%s" % (n, fmt[1])))
        if vtype in _SCALAR_FMT:
            return self._unpack(_SCALAR_FMT[vtype])[0]
        raise ValueError("unknown GGUF value type %d" % vtype)

    def tensor_values(self, name):
        """Flat list of floats (row-major) of an F32/F16 tensor."""
        t = self.tensors[name]
        start = self.data_start + t["offset"]
        raw = self.blob[start:start + t["nbytes"]]
        if t["type"] == GGML_F32:
            a = array("f")
            a.frombytes(raw)
            if sys.byteorder != "little":
                a.byteswap()
            return a.tolist()
        return list(struct.unpack("<%de" % t["n"], raw))
