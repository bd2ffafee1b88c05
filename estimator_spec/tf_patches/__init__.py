"""Where the library reaches into TensorFlow's private behaviour.

Every patch of a TensorFlow class and every edit of a built graph lives in
this package, one module per concern. Each module says which TensorFlow
behaviour (of the pinned version) it works around, and a test in tests/
fails if that behaviour changes.
"""
