"""Bound computations off the event loop.

:class:`~app.worker.pool.BoundWorker` runs the loss calculator (the expensive part for continuous
domains: certified branch-and-bound) in a process pool with a time limit per call, and caches
answers by a canonical hash of ``(domain, multiset of (query, output), candidate, budget,
options)`` (:mod:`app.worker.keys`) so identical histories are computed once. The cache is an
in-process LRU (:class:`~app.worker.cache.LRUCache`); any object with the same ``get``/``set``
methods (a Redis-backed cache in the service) can take its place.
"""
