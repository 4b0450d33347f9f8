"""Serving around the KV cache: techniques that move or skip KV work rather than compute it faster.

``kv_transfer`` (the KV connector: ``send_blocks`` / ``recv_blocks``) · ``disagg`` (prefill and
decode engines in two processes) · ``tiers`` (a CPU and a disk tier under the prefix cache) ·
``context_cache`` (caching a whole long context vs re-prefilling retrieved chunks) ·
``cacheblend`` (joining separately cached chunks, recomputing a fraction of tokens) ·
``router`` (round-robin vs prefix-affinity routing over engine replicas).
"""

from .._faces import lazy_face

_FACE = {                  # what the chapters use: imported on first use (labsupport._faces)
    "KVConnector": "kv_transfer",
}
__getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
