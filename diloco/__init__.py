"""The method, pure: Decoupled DiLoCo with no Redis, no Django and no processes.

Config, model, data, fragments and codecs; the island's inner loop; merge, policy,
the synchronizer state and the wire protocol; accounting and chaos schedules; the
in-process cluster and the datacenter simulator. It needs torch, numpy and
safetensors only, so syncd, the island runtime (trainer), the web app and the
benchmarks all build on it, and it can be used and tested on its own.
"""
