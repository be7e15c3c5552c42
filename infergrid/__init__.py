"""The InferGrid contract: the names, schemas and codecs every part agrees on.

Every part imports this package and none of the others, so anything two parts
must agree on lives here, as pure code that can be tested without a cluster.
"""

__version__ = "0.1.0"
