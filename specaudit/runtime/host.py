"""The machine a run happens on: torch threads, the device check, host facts for run.json.

One device check for every command that takes --device (run, serve, calibrate, ab, demo):
a device this torch cannot use is one line and exit 2, never a torch traceback.
"""
from __future__ import annotations

import os
import platform
import socket
import sys

from specaudit.trace.safe_io import InputError


def set_torch_threads(threads: int) -> None:
    """Set torch's intra-op threads (process-wide), within [1, cores x 4]."""
    most = 4 * (os.cpu_count() or 1)
    if not isinstance(threads, int) or not 1 <= threads <= most:
        raise InputError(None, f"--threads must be between 1 and {most} (4 x this machine's cores), got {threads}")
    import torch
    torch.set_num_threads(threads)


def host_info(device: str) -> dict:
    import torch
    info = {"hostname": socket.gethostname(), "platform": platform.platform(),
            "python": sys.version.split()[0], "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def check_device(device: str, dtype: str = "float32") -> str:
    """Refuse a device this torch build cannot run on, or an unknown dtype; return the device.

    Accepts what torch.device parses and this process can really use: cpu; cuda[:i]
    with CUDA present and i below the device count; mps where the backend is there;
    xpu where torch.xpu reports one. 'meta' holds no data, so a run cannot decode on it.
    """
    import torch
    if not isinstance(device, str) or not device.strip():
        raise InputError(None, "--device is empty (use cpu, or cuda where torch has CUDA)")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise InputError(None, f"--device {device!r} is not a device torch knows (use cpu, or cuda[:N])") from None
    available = usable_devices()
    kind = dev.type
    ok = kind in available
    if ok and kind == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise InputError(None, f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if not ok:
        why = "holds no data, so nothing can be decoded on it" if kind == "meta" else "is not available to this torch"
        raise InputError(None, f"--device {device}: {kind} {why} (usable here: {', '.join(available)})")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise InputError(None, f"--dtype must be float32, bfloat16 or float16, not {dtype!r}")
    return device


def usable_devices() -> list[str]:
    """The device types this process can decode on, cpu first."""
    import torch
    out = ["cpu"]
    if torch.cuda.is_available():
        out.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        out.append("xpu")
    return out
