"""Peak resident memory of this process, for the benchmarks' child processes."""

from __future__ import annotations

import resource


def peak_rss_mb() -> float:
    """This process's own peak RSS in MiB.

    ``VmHWM`` belongs to the process image: ``ru_maxrss`` of a child started with vfork (what
    ``subprocess`` uses on Linux) also counts the parent's RSS at the moment of ``exec``, so
    a big parent would inflate the child's figure.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
