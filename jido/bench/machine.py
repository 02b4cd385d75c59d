"""Where a figure was measured: date, CPU model and count, OS and Python, for every saved result."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess


def cpu_model() -> str:
    """lscpu's "Model name" (e.g. "AMD EPYC"), else /proc/cpuinfo's, else the platform's processor."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, object]:
    return {"cpu_model": cpu_model(), "num_cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "hostname": platform.node()}


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds")
