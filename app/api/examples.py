"""Request examples shown in the OpenAPI document."""

from __future__ import annotations

from typing import Any

DOMAIN: dict[str, Any] = {
    "attributes": [
        {"name": "age", "type": "integer", "low": 18, "high": 90},
        {"name": "sex", "type": "integer", "low": 0, "high": 1},
        {"name": "disease", "type": "categorical", "values": ["none", "flu", "covid"]},
    ]
}
GRR = {"mechanism": "grr", "attribute": "disease", "epsilon": 0.5}
BINARY_RR = {
    "mechanism": "binary_rr",
    "epsilon": 0.3,
    "predicate": {"attribute": "age", "op": ">=", "value": 65},
}
LINEAR = {
    "mechanism": "linear",
    "weights": {"age": 0.01},
    "intercept": -0.5,
    "range": [-0.5, 0.5],
    "truncate": True,
    "epsilon": 0.4,
}

REGISTER = {
    "finite": {
        "summary": "A finite object",
        "value": {
            "id": "patient-17",
            "domain": DOMAIN,
            "value": {"age": 34, "sex": 1, "disease": "flu"},
            "budget": {"epsilon": 2.0},
            "filter": "bayesian",
        },
    },
    "continuous": {
        "summary": "A continuous object",
        "value": {
            "id": "device-3",
            "domain": {
                "attributes": [
                    {"name": "x1", "type": "real", "low": -1, "high": 1},
                    {"name": "x2", "type": "real", "low": -1, "high": 1},
                ]
            },
            "value": {"x1": 0.2, "x2": -0.4},
            "budget": {"epsilon": 1.0},
        },
    },
}
QUERY = {
    "grr": {"summary": "Generalised randomised response", "value": {"query": GRR}},
    "binary_rr": {"summary": "Randomised response on a predicate", "value": {"query": BINARY_RR}},
    "linear": {"summary": "Truncated linear query", "value": {"query": LINEAR}},
}
LOSS = {
    "calculator": {
        "summary": "Loss of a history and a candidate",
        "value": {
            "domain": DOMAIN,
            "history": [{"query": BINARY_RR, "output": 1}, {"query": BINARY_RR, "output": 0}],
            "budget": 2.0,
            "candidate": GRR,
            "options": {"tolerance": 1e-4},
        },
    },
}
KEY = {
    "analyst": {
        "summary": "A key for an application",
        "value": {"role": "analyst", "label": "app"},
    },
    "viewer": {"summary": "A key for a dashboard", "value": {"role": "viewer"}},
}
PROJECT = {
    "study": {
        "summary": "A project that sees one study's objects, with a quota of 1.0 per object",
        "value": {
            "name": "flu-team",
            "scope": {"labels": {"study": "flu-2026"}},
            "quota": {"epsilon": 1.0},
        },
    },
}
PROJECT_PATCH = {
    "quota": {"summary": "A larger quota", "value": {"quota": {"epsilon": 2.0}}},
}

IMPORT = {
    "two": {
        "summary": "Two objects of a study",
        "value": {
            "objects": [
                {
                    "id": f"p-{i}",
                    "domain": DOMAIN,
                    "value": {"age": 30 + i, "sex": i % 2, "disease": "none"},
                    "budget": {"epsilon": 2.0},
                    "labels": {"study": "flu-2026", "site": "berlin"},
                }
                for i in (1, 2)
            ]
        },
    }
}

VERSION = {
    "new": {
        "summary": "A new value of the object",
        "value": {"value": {"age": 35, "sex": 1, "disease": "flu"}},
    }
}
VERSIONS = {
    "two": {
        "summary": "New values of two objects",
        "value": {
            "versions": [
                {"id": f"p-{i}", "value": {"age": 31 + i, "sex": i % 2, "disease": "flu"}}
                for i in (1, 2)
            ]
        },
    }
}

SURVEY = {
    "labels": {
        "summary": "A grr question to every object of a study",
        "value": {
            "name": "flu prevalence",
            "query": GRR,
            "cohort": {"labels": {"study": "flu-2026"}},
        },
    },
    "ids": {
        "summary": "A binary question to named objects",
        "value": {"name": "over 65", "query": BINARY_RR, "cohort": {"ids": ["p-1", "p-2"]}},
    },
}
