"""A step's fields on the host: the tracer's device->host copy, off the decode path.

record_step (the decode thread) gathers every device tensor of a step into one buffer and
starts one non-blocking copy (stage_device); the worker waits on the step's event and turns
the placeholders into numpy views of the landed buffer (unstage). host_view copies CPU
arrays an engine may reuse; as_numpy reads any field as numpy on the worker.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def host_view(x, copy: bool = True):
    """Host view of a field: CPU tensors and numpy arrays as numpy (copied unless `copy`
    is False), a started non-blocking copy for device tensors; Python lists pass through
    (the caller builds them per step)."""
    if isinstance(x, np.ndarray):
        return x.copy() if copy else x
    if x is None or isinstance(x, (list, tuple, int, float)):
        return x
    if hasattr(x, "numpy"):  # torch tensor
        if x.device.type != "cpu":
            return x.detach().to("cpu", non_blocking=True)
        try:
            a = x.numpy()
        except RuntimeError:  # requires grad
            a = x.detach().numpy()
        return a.copy() if copy else a
    return x


def as_numpy(x):
    """A field as numpy (or as given: lists, scalars, None). Tensors are read here, on the
    worker: CPU ones as views; a device tensor that was not staged (an engine mixing
    devices) is copied synchronously, on this thread only; dtypes numpy lacks (bfloat16)
    are widened to float32."""
    if x is None or isinstance(x, np.ndarray):
        return x
    if hasattr(x, "numpy"):
        try:
            return x.numpy()
        except (RuntimeError, TypeError):  # requires grad, not on the CPU, or no numpy dtype
            x = x.detach().cpu()
            try:
                return x.numpy()
            except TypeError:
                return x.float().numpy()
    return x


def on_device(x) -> bool:
    """A tensor off the CPU (Tensor.is_cpu: a flag read, no device object built)."""
    return getattr(x, "is_cpu", True) is False and hasattr(x, "numpy")


@dataclass
class Staged:
    """Where a device tensor's bytes sit in a step's staged host buffer."""
    offset: int
    nbytes: int
    dtype: np.dtype
    shape: tuple


_NP_DTYPES: dict = {}


def stage_device(fields: dict, on_device=on_device):
    """Gather every device tensor of a step into one uint8 buffer and start one copy.

    One concatenation and one non-blocking device->host copy per step instead of one per
    field, and no sync on the decode thread (the worker waits on an event). Returns
    (fields, host buffer or None): staged tensors are replaced by Staged placeholders
    that `unstage` turns into numpy views of the buffer once the copy landed. Nested
    dicts (sampling) are copied, never changed in place. Widest dtypes go first so every
    view is aligned.
    """
    import torch
    found = []   # (dict, key, tensor)

    def visit(d):
        for k, v in d.items():
            if isinstance(v, dict):
                d[k] = v = dict(v)
                visit(v)
            elif on_device(v):
                t = v.detach()
                if t.dtype in (torch.bfloat16, torch.float16):
                    t = t.float()   # numpy has no bfloat16; the schema stores float32 anyway
                found.append((d, k, t))
    visit(fields)
    if not found:
        return fields, None
    found.sort(key=lambda e: -e[2].element_size())
    flat, off = [], 0
    for d, k, t in found:
        dt = _NP_DTYPES.get(t.dtype)
        if dt is None:
            dt = _NP_DTYPES[t.dtype] = torch.empty(0, dtype=t.dtype).numpy().dtype
        nbytes = t.numel() * t.element_size()
        d[k] = Staged(off, nbytes, dt, tuple(t.shape))
        flat.append(t.contiguous().reshape(-1).view(torch.uint8))
        off += nbytes
    buf = torch.cat(flat)
    cuda = buf.device.type == "cuda"
    return fields, buf.to("cpu", non_blocking=cuda)


def unstage(fields: dict, host: np.ndarray) -> dict:
    """Resolve Staged placeholders into views of the landed host buffer (uint8)."""
    for k, v in fields.items():
        if isinstance(v, Staged):
            fields[k] = host[v.offset:v.offset + v.nbytes].view(v.dtype).reshape(v.shape)
        elif isinstance(v, dict):
            unstage(v, host)
    return fields
