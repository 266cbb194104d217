"""Use cases of the service: registering objects, dry-runs, submits, odometers, keys.

Service functions take keyword-only arguments and own their transactions; locking lives here
too (:mod:`app.services.locks`). Correctness never rests on a lock: an accepted query is recorded
and the object's version advanced in one transaction guarded by a compare-and-set on the
version.
"""
