"""The client's version: the API version (OpenAPI ``info.version``) it was written for.

``tests/client/test_packaging.py`` checks it against the app's document, so a change of the
API's version fails the tests until the client follows it.
"""

__version__ = "0.1.0"
