"""Checks Lockstep's safetensors files against the reference `safetensors` package.

  safetensors_python.py MODE FILE [MODE FILE ...]
    check FILE   verify a file Lockstep wrote
    write FILE   write a file for Lockstep to read

Both sides build the same tensors from the formulas in expected() (mirrored in
safetensors_python_test.cpp), each in its own language. Prints one line per pair, "ok" or
"FAIL: why"; exits 3 when numpy or safetensors cannot be imported. One process does all the
pairs because importing numpy dominates the run time.
"""
import sys

try:
    import numpy as np
    import safetensors
except ImportError as error:
    print(f"missing Python module: {error.name}")
    sys.exit(3)

METADATA = {"step": "1200", "note": "lockstep \u2192 python"}


def expected():
    """name -> (safetensors dtype, float32 or native numpy array)."""
    def idx(shape):
        return np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)

    return {
        "f32": ("F32", ((idx((2, 3)) - 3) * 0.25).astype(np.float32)),
        "f64": ("F64", (idx((4,)) - 3) / 3.0),
        "f16": ("F16", ((idx((3, 2)) - 3) * 0.5).astype(np.float16)),
        "bf16": ("BF16", ((idx((5,)) - 3) * 0.5).astype(np.float32)),  # exact in bf16
        "i32": ("I32", ((idx((2, 2)) - 3) * 100000).astype(np.int32)),
        "i64": ("I64", (idx((3,)) - 3) * 10**12),
        "u8": ("U8", ((idx((7,)) * 37) % 256).astype(np.uint8)),
        "scalar": ("F32", np.array(-1.5, dtype=np.float32)),
        "empty": ("F32", np.zeros((0, 4), dtype=np.float32)),
    }


def bf16_bits(values):
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


class Mismatch(Exception):
    pass


def fail(message):
    raise Mismatch(message)


def check(path):
    with open(path, "rb") as f:
        raw = f.read()
    # The package's own parser validates the header and layout and hands back raw bytes.
    parsed = dict(safetensors.deserialize(raw))
    with safetensors.safe_open(path, framework="numpy") as f:
        if f.metadata() != METADATA:
            fail(f"metadata {f.metadata()} != {METADATA}")
        arrays = {k: f.get_tensor(k) for k in f.keys() if parsed[k]["dtype"] != "BF16"}
    want = expected()
    if set(parsed) != set(want):
        fail(f"tensor names {sorted(parsed)} != {sorted(want)}")
    for name, (dtype, values) in want.items():
        info = parsed[name]
        if info["dtype"] != dtype or list(info["shape"]) != list(values.shape):
            fail(f"{name}: {info['dtype']} {info['shape']} != {dtype} {list(values.shape)}")
        if dtype == "BF16":
            got = np.frombuffer(bytes(info["data"]), dtype="<u2")
            if not np.array_equal(got, bf16_bits(values).reshape(-1)):
                fail(f"{name}: bf16 bits {got} != {bf16_bits(values)}")
            continue
        got = arrays[name]
        if got.dtype != values.dtype or not np.array_equal(got, values):
            fail(f"{name}: {got!r} != {values!r}")


def write(path):
    specs, keep = {}, []
    for name, (dtype, values) in expected().items():
        data = bf16_bits(values) if dtype == "BF16" else np.ascontiguousarray(values)
        keep.append(data)
        numpy_name = "bfloat16" if dtype == "BF16" else data.dtype.name
        specs[name] = safetensors.TensorSpec(dtype=numpy_name, shape=values.shape, data_ptr=data.ctypes.data,
                                             data_len=data.nbytes)
    safetensors.serialize_file(specs, path, metadata=METADATA)


if __name__ == "__main__":
    args = sys.argv[1:]
    for mode, path in zip(args[::2], args[1::2]):
        try:
            {"check": check, "write": write}[mode](path)
            print("ok")
        except Exception as error:  # report every pair, whatever went wrong
            print(f"FAIL: {type(error).__name__}: {error}".replace("\n", " "))
