"""The privacy engine: pure numpy/scipy math, no web, database or cache imports.

Domains (:mod:`~app.engine.domain`), mechanisms (:mod:`~app.engine.mechanisms`), the likelihood
state (:mod:`~app.engine.likelihood`), filters (:mod:`~app.engine.filters`), the per-object
accountant and odometer (:mod:`~app.engine.accountant`) and the stateless loss calculator
(:mod:`~app.engine.calculator`).
"""
