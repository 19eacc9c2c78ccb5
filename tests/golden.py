"""Writer of attograd's text golden files (read by tests/testing.h: load_golden).

Format: a first line "attograd-golden 1", then per tensor a line
"tensor NAME DTYPE NDIM D0 D1 ..." followed by one line of whitespace-separated values
(float64 as %.17g, float32 as %.9g: both round-trip exactly; int64 and bool as integers).
"""
import torch

_DT = {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64", torch.bool: "bool"}


def write_golden(path, tensors, formats=None):
    """tensors: dict name -> torch.Tensor (insertion order is kept). formats: optional dict name -> printf format
    for a float tensor whose values are known to round-trip in fewer digits (the caller checks it), to keep a file
    small; every other tensor is written as above."""
    with open(path, "w") as f:
        f.write("attograd-golden 1\n")
        for name, t in tensors.items():
            t = t.detach().contiguous().cpu()
            dt = _DT[t.dtype]
            f.write("tensor %s %s %d %s\n" % (name, dt, t.dim(), " ".join(str(s) for s in t.shape)))
            flat = t.reshape(-1).tolist()
            if formats and name in formats:
                f.write(" ".join(formats[name] % v for v in flat))
            elif dt == "float64":
                f.write(" ".join("%.17g" % v for v in flat))
            elif dt == "float32":
                f.write(" ".join("%.9g" % v for v in flat))
            else:
                f.write(" ".join(str(int(v)) for v in flat))
            f.write("\n")
